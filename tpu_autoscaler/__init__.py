"""Slice-aware autoscaling for Ray on KubeRay TPU clusters."""

import logging

__version__ = "0.1.0"

# A library is silent unless its user configures logging (`run` does).
logging.getLogger(__name__).addHandler(logging.NullHandler())
