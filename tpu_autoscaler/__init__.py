"""Slice-aware autoscaling for Ray on KubeRay TPU clusters."""

__version__ = "0.1.0"
