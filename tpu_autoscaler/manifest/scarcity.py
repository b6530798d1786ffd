"""A worker group's scarcity settings, read from its pod template's annotations
(`tpu-autoscaler.dev/warm-replicas`, `.../cost`, `.../queued-provisioning`). KubeRay
copies template annotations onto the pods and reads none of these, so they change
nothing for KubeRay or the stock autoscaler."""

from __future__ import annotations

import math

from tpu_autoscaler.core.capacity import (
    ANNOTATION_PREFIX,
    COST_ANNOTATION,
    DEFAULT_SCARCITY,
    QUEUED_PROVISIONING_ANNOTATION,
    WARM_REPLICAS_ANNOTATION,
    ScarcitySettings,
)
from tpu_autoscaler.core.units import Replicas
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import WorkerGroupSpec

_KNOWN = (WARM_REPLICAS_ANNOTATION, COST_ANNOTATION, QUEUED_PROVISIONING_ANNOTATION)


def read_scarcity(spec: WorkerGroupSpec, found: GroupProblems) -> ScarcitySettings:
    annotations = spec.template.metadata.annotations
    path = "template.metadata.annotations"
    for key in annotations:
        if key.startswith(ANNOTATION_PREFIX) and key not in _KNOWN:
            found.warn(f"{path}[{key}]", f"is not a setting; known: {', '.join(_KNOWN)}")
    if not any(key in annotations for key in _KNOWN):
        return DEFAULT_SCARCITY

    warm = 0
    raw = annotations.get(WARM_REPLICAS_ANNOTATION)
    if raw is not None:
        if not raw.strip().isdigit():
            found.error(
                f"{path}[{WARM_REPLICAS_ANNOTATION}]",
                f'is {raw!r}; give a whole number of slices, e.g. "1"',
            )
        else:
            warm = int(raw)
            if warm > spec.max_replicas:
                found.error(
                    f"{path}[{WARM_REPLICAS_ANNOTATION}]",
                    f"is {warm}, above maxReplicas {spec.max_replicas}; "
                    f"give at most {spec.max_replicas}",
                )

    cost: float | None = None
    raw = annotations.get(COST_ANNOTATION)
    if raw is not None:
        try:
            cost = float(raw)
        except ValueError:
            cost = None
        if cost is None or not math.isfinite(cost) or cost < 0:
            found.error(
                f"{path}[{COST_ANNOTATION}]",
                f'is {raw!r}; give the relative cost of one chip-hour, a number >= 0, e.g. "1.5"',
            )
            cost = None

    queued = False
    raw = annotations.get(QUEUED_PROVISIONING_ANNOTATION)
    if raw is not None:
        if raw not in ("true", "false"):
            found.error(
                f"{path}[{QUEUED_PROVISIONING_ANNOTATION}]", f'is {raw!r}; give "true" or "false"'
            )
        queued = raw == "true"

    return ScarcitySettings(warm_replicas=Replicas(warm), cost=cost, queued_provisioning=queued)
