"""A pod's CPU and memory and its in-place resize state, read as Ray 2.60's
`KubeRayIPPRProvider` reads them (`_get_ippr_status_from_pod`): what the spec of its
first container asks for, what the kubelet applied (its container status; the spec
until it reports), the resize conditions, and the `ray.io/ippr-status` annotation
Ray's provider (and ours) keeps on the pod. A quantity is the limit if set, else the
request, as Ray takes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.core.resize import IPPR_STATUS_ANNOTATION, PodSize, ResizeBounds

if TYPE_CHECKING:
    from tpu_autoscaler.adapters.kube.pods import Pod

RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")


def pod_size(pod: Pod, bounds: ResizeBounds, now_s: float) -> PodSize | None:
    """None if the pod has no container or its quantities do not parse (Ray would
    raise; the pod is then simply not grown)."""
    if not pod.spec.containers:
        return None
    container = pod.spec.containers[0]
    spec_requests, spec_limits = container.resources.requests, container.resources.limits
    applied = next(
        (s.resources for s in pod.status.container_statuses or () if s.name == container.name),
        None,
    )
    status_requests = applied.requests if applied and applied.requests else spec_requests
    status_limits = applied.limits if applied and applied.limits else spec_limits
    try:
        desired_cpu = _value(spec_requests, spec_limits, "cpu")
        desired_memory = _value(spec_requests, spec_limits, "memory")
        cpu = _value(status_requests, status_limits, "cpu")
        memory = _value(status_requests, status_limits, "memory")
    except (ValueError, ArithmeticError, TypeError):
        return None
    recorded = _recorded(pod.metadata.annotations.get(IPPR_STATUS_ANNOTATION))
    resizing_at = _number(recorded.get("resizing-at"))
    errored = False
    under_way = False
    for condition in pod.status.conditions:
        if condition.type in RESIZE_CONDITIONS and condition.status == "True":
            under_way = True
            errored = condition.type == "PodResizeInProgress" and condition.reason == "Error"
            break
    synced_pending = (
        recorded.get("raylet-id") is not None
        and resizing_at is not None
        and not under_way
        and (cpu, memory)
        == (
            desired_cpu,
            desired_memory,
        )
    )
    timed_out = (
        resizing_at is not None and not synced_pending and resizing_at + bounds.timeout_s < now_s
    )
    return PodSize(
        cpu=float(cpu),
        memory_bytes=float(memory),
        desired_cpu=float(desired_cpu),
        desired_memory_bytes=float(desired_memory),
        resizing=resizing_at is not None or under_way,
        failed=recorded.get("last-failed-at") is not None or errored or timed_out,
        cap_cpu=_number(recorded.get("suggested-max-cpu")),
        cap_memory_bytes=_number(recorded.get("suggested-max-memory")),
    )


def _value(requests: Mapping[str, Any], limits: Mapping[str, Any], name: str) -> Decimal:
    raw = limits.get(name) or requests.get(name)
    if raw is None:
        raise ValueError(f"no {name}")
    parsed: Decimal = parse_quantity(raw)
    return parsed


def _recorded(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
