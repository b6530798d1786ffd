"""A `Resize` as Kubernetes requests: the JSON patch for the pod's `resize` subresource
and the `ray.io/ippr-status` annotation, written as Ray 2.60's `KubeRayIPPRProvider`
writes them (`_make_ippr_patch`, `_patch_ippr_status`), so either autoscaler can pick
up a resize the other started.

The first container's CPU and memory are set to the target; where a limit is set the
limit becomes the target and the request keeps its distance below it (the QoS class
must not change in place), else only the request is set."""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.adapters.kube.api import JsonPatch
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.core.resize import CPU, IPPR_STATUS_ANNOTATION, MEMORY

_PATH = "/spec/containers/0/resources"


def resize_operations(pod: Pod, to: Mapping[str, float]) -> JsonPatch:
    """The patch that resizes `pod` to `to` (Ray's `CPU` in cores, `memory` in bytes)."""
    container = pod.spec.containers[0]
    applied = next(
        (s.resources for s in pod.status.container_statuses or () if s.name == container.name),
        None,
    )
    requests = dict(
        applied.requests if applied and applied.requests else container.resources.requests
    )
    limits = dict(applied.limits if applied and applied.limits else container.resources.limits)
    operations: JsonPatch = []
    for name, ray_name in (("cpu", CPU), ("memory", MEMORY)):
        target: float | int = float(to[ray_name]) if name == "cpu" else int(to[ray_name])
        if limits.get(name):
            gap = parse_quantity(limits[name]) - parse_quantity(requests.get(name, limits[name]))
            request = type(target)(Decimal(str(target)) - gap)
            operations.append(_replace(f"{_PATH}/limits/{name}", target))
            operations.append(_replace(f"{_PATH}/requests/{name}", request))
        else:
            operations.append(_replace(f"{_PATH}/requests/{name}", target))
    return operations


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def ippr_status(
    raylet_id: str | None,
    resizing_at_s: int | None,
    recorded: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The pod annotation recording a resize sent at `resizing_at_s` (None: its raylet
    was told), keeping what an earlier record says of caps and failures."""
    before = dict(recorded or {})
    status = {
        "raylet-id": raylet_id,
        "resizing-at": resizing_at_s,
        "suggested-max-cpu": before.get("suggested-max-cpu"),
        "suggested-max-memory": before.get("suggested-max-memory"),
        "last-failed-at": before.get("last-failed-at"),
        "last-failed-reason": before.get("last-failed-reason"),
    }
    return {IPPR_STATUS_ANNOTATION: json.dumps(status)}
