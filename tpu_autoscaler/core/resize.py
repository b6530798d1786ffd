"""In-place pod resize (IPPR), as Ray 2.60's autoscaler v2 models it for KubeRay: a
group named in the RayCluster's `ray.io/ippr` annotation may grow a pod's CPU and
memory up to the group's maximum without a new pod (Kubernetes' `pods/resize`).

`ResizeBounds` is the group's part of the annotation (Ray's `IPPRGroupSpec`);
`PodSize` is one pod's CPU and memory as Kubernetes holds them (Ray's `IPPRStatus`,
read from the pod's spec, status, resize conditions and `ray.io/ippr-status`).
Ray's scheduler counts a pod it may grow at its maximum once the nodes at their
current size are full, and a node it launches for such a group at its maximum too
(`ResourceDemandScheduler._try_schedule`). Only single-host groups without TPUs
resize: a TPU host's chips are fixed by its node, and a slice's hosts must stay
alike, so a TPU group with bounds is refused when the manifest is read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CPU = "CPU"
MEMORY = "memory"
"""The two Ray resources a resize changes (Ray's `memory` is in bytes)."""

IPPR_ANNOTATION = "ray.io/ippr"
"""The RayCluster annotation Ray reads the resizable groups from (JSON)."""
IPPR_STATUS_ANNOTATION = "ray.io/ippr-status"
"""The pod annotation Ray's provider keeps a resize's progress in (JSON)."""


@dataclass(frozen=True, slots=True)
class ResizeBounds:
    """How far a pod of a group may grow in place (Ray's `IPPRGroupSpec`)."""

    max_cpu: float
    max_memory_bytes: float
    timeout_s: float
    """How long a resize may take before Ray reverts it and stops resizing that pod."""

    def raised(self, resources: Mapping[str, float]) -> dict[str, float]:
        """`resources` with CPU and memory at the maximum (never below what they are):
        a node Ray launches for the group, counted as it will be once resized
        (`_to_launch_node_with_ippr_caps`)."""
        grown = dict(resources)
        grown[CPU] = max(self.max_cpu, resources.get(CPU, 0.0))
        grown[MEMORY] = max(self.max_memory_bytes, resources.get(MEMORY, 0.0))
        return grown


@dataclass(frozen=True, slots=True)
class PodSize:
    """A pod's CPU and memory as Kubernetes holds them now, and its resize state."""

    cpu: float
    """What the pod has (its container status; the spec before the kubelet reports)."""
    memory_bytes: float
    desired_cpu: float
    """What its spec asks for: differs from `cpu` while a resize is being applied."""
    desired_memory_bytes: float
    resizing: bool = False
    """A resize was sent and its raylet has not been told yet (`resizing-at` set), or
    the kubelet has not finished one (a `PodResizePending` or `PodResizeInProgress`
    condition)."""
    failed: bool = False
    """A resize failed or timed out before (`last-failed-at`): Ray never resizes the
    pod again."""
    cap_cpu: float | None = None
    """A lower maximum the kubelet's last refusal suggested (`suggested-max-cpu`)."""
    cap_memory_bytes: float | None = None

    def max_cpu(self, bounds: ResizeBounds) -> float:
        return self.cap_cpu if self.cap_cpu is not None else bounds.max_cpu

    def max_memory_bytes(self, bounds: ResizeBounds) -> float:
        return (
            self.cap_memory_bytes if self.cap_memory_bytes is not None else bounds.max_memory_bytes
        )

    def can_grow(self, bounds: ResizeBounds) -> bool:
        """Ray's `IPPRStatus.can_resize_up`: no resize under way, none failed, and
        below the maximum in CPU or memory."""
        return (
            not self.failed
            and not self.resizing
            and (
                self.cpu < self.max_cpu(bounds) or self.memory_bytes < self.max_memory_bytes(bounds)
            )
        )

    def grown(self, bounds: ResizeBounds) -> dict[str, float]:
        """The CPU and memory a resize asks for: always the maximum (Ray does not size
        a resize to the demand)."""
        return {CPU: self.max_cpu(bounds), MEMORY: self.max_memory_bytes(bounds)}

    def now(self) -> dict[str, float]:
        return {CPU: self.cpu, MEMORY: self.memory_bytes}
