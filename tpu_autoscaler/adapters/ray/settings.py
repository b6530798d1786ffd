"""Ray's autoscaler settings that change how the policy ranks groups, read where Ray
reads them."""

from __future__ import annotations

import os

CONSERVE_GPU_NODES_ENV = "AUTOSCALER_CONSERVE_GPU_NODES"


def conserve_gpu_nodes_from_env() -> bool:
    """Ray's `AUTOSCALER_CONSERVE_GPU_NODES` (`ray.autoscaler._private.constants`:
    an integer, 1 unless set): rank GPU groups last for demand without GPUs."""
    return int(os.environ.get(CONSERVE_GPU_NODES_ENV, "1")) != 0


def conserve_gpu_nodes_of_ray() -> bool:
    """The value Ray's v2 scheduler uses now (its module's constant, read from the
    environment at import; tests may patch it)."""
    from ray.autoscaler.v2 import scheduler

    return bool(scheduler.AUTOSCALER_CONSERVE_GPU_NODES)
