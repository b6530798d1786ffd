"""Quantities that upstream code mixes up: slices (replicas), hosts and chips.

A RayCluster counts replicas (slices), Ray's autoscaler counts hosts (nodes), GKE
counts chips. Distinct types make mypy reject `replicas = hosts` by accident.
Arithmetic on them yields a plain `int`; wrap the result again to state its unit.
"""

from typing import NewType

Replicas = NewType("Replicas", int)
"""Whole slices of one worker group (`workerGroupSpecs[i].replicas`)."""

Hosts = NewType("Hosts", int)
"""TPU VMs; one host is one pod and one Ray node."""

Chips = NewType("Chips", int)
"""Physical TPU chips (`google.com/tpu`)."""

TpuResource = NewType("TpuResource", float)
"""Ray's `TPU` resource, what bundles ask for and hosts advertise: one per chip, or
one per logical device with RAY_TPU_RESOURCE_PER_CHIP (2 per TPU7x chip). Compared
with other `TpuResource` amounts only, never with `Chips`."""

TensorCores = NewType("TensorCores", int)
"""What v4, v5p and TPU7x pod types count (`v5p-16` is 8 chips)."""
