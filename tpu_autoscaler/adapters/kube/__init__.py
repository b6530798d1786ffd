"""Kubernetes at the edge: the API as the autoscaler uses it, the official client
behind it, pods read into replicas and hosts, and plans written as JSON patches."""
