"""In-place pod resize through Ray's scheduler interface (`scheduler.SliceScheduler`):
the `ippr_specs` and `ippr_statuses` Ray's reconciler puts in a `SchedulingRequest`
for its KubeRay provider become resize bounds on the shapes (single-host groups
without TPUs only: TPU slices never resize) and each pod's `PodSize`; the plan's
resizes go back as Ray's queued `IPPRStatus`es (`SchedulingReply.to_ippr`), which
Ray's provider then carries out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tpu_autoscaler.core.plan import Resize
from tpu_autoscaler.core.resize import CPU, MEMORY, PodSize, ResizeBounds
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import Host, Replica


def with_ippr_bounds(shapes: Iterable[SliceShape], specs: Any) -> tuple[SliceShape, ...]:
    """`shapes`, those of Ray's IPPR groups with their bounds (unless they have some
    already, read from the RayCluster)."""
    groups: Mapping[str, Any] = specs.groups if specs is not None else {}
    return tuple(
        replace(
            shape,
            resize=ResizeBounds(
                float(groups[shape.group].max_cpu),
                float(groups[shape.group].max_memory),
                float(groups[shape.group].resize_timeout),
            ),
        )
        if shape.group in groups
        and shape.resize is None
        and shape.tpu is None
        and shape.hosts_per_replica == 1
        else shape
        for shape in shapes
    )


def pod_size(status: Any) -> PodSize:
    """Ray's `IPPRStatus` of a pod as its `PodSize`."""
    return PodSize(
        cpu=float(status.current_cpu),
        memory_bytes=float(status.current_memory),
        desired_cpu=float(status.desired_cpu),
        desired_memory_bytes=float(status.desired_memory),
        resizing=not (status.is_k8s_resize_finished() and status.is_raylet_synced()),
        failed=status.last_failed_at is not None,
        cap_cpu=status.suggested_max_cpu,
        cap_memory_bytes=status.suggested_max_memory,
    )


def with_pod_sizes(
    replicas: Sequence[Replica], shapes: Mapping[str, SliceShape], statuses: Any
) -> list[Replica]:
    """Each host of a resizable group with its pod's size, where not read already."""
    by_pod: Mapping[str, Any] = statuses or {}

    def sized(host: Host) -> Host:
        status = by_pod.get(host.pod_name)
        return replace(host, size=pod_size(status)) if host.size is None and status else host

    return [
        replace(r, hosts=tuple(sized(h) for h in r.hosts))
        if (shape := shapes.get(r.group)) is not None and shape.resize is not None
        else r
        for r in replicas
    ]


def queued_resizes(
    resizes: Iterable[Resize], statuses: Mapping[str, Any], hosts: Mapping[str, Host]
) -> list[Any]:
    """Ray's statuses of the pods to resize, queued to the plan's target (as its
    scheduler queues them), those with a raylet only (Ray sends no other)."""
    queued = []
    for resize in resizes:
        status = statuses.get(resize.pod)
        host = hosts.get(resize.pod)
        if status is None:
            continue
        if host is not None and host.node_id:
            status.raylet_id = host.node_id
        status.queue_resize_request(
            desired_cpu=float(resize.resources_to[CPU]),
            desired_memory=int(resize.resources_to[MEMORY]),
        )
        if status.has_resize_request_to_send():
            queued.append(status)
    return queued
