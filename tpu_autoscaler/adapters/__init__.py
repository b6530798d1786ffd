"""Edges: turn Kubernetes objects and Ray GCS state into the core model, and plans into changes."""
