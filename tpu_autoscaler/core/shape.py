"""What one replica of a worker group is: `hosts_per_replica` hosts that live and die
together, their Ray resources and labels, and the group's scaling bounds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tpu_autoscaler.core.capacity import DEFAULT_SCARCITY, ScarcitySettings
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.core.problems import Problem
from tpu_autoscaler.core.resize import ResizeBounds
from tpu_autoscaler.core.units import Chips, Hosts, Replicas, TpuResource

NO_TPU = TpuResource(0.0)

UpscalingMode = Literal["Default", "Aggressive", "Conservative"]


@dataclass(frozen=True, slots=True)
class SliceShape:
    """One replica of a worker group: `hosts_per_replica` pods that live and die together."""

    group: str
    hosts_per_replica: Hosts
    min_replicas: Replicas
    max_replicas: Replicas
    idle_timeout_s: float
    upscaling_mode: UpscalingMode
    priority: int
    resources_per_host: Mapping[str, float]
    """Ray resources every host has: CPU, memory, TPU, GPU, custom, accelerator type."""
    group_labels: Mapping[str, str]
    """Ray labels every host has: the group's own, `ray.io/node-group`, the static TPU ones."""
    tpu: SliceType | None = None
    tpu_per_host: TpuResource = NO_TPU
    """The Ray `TPU` resource per host: chips, or devices with RAY_TPU_RESOURCE_PER_CHIP."""
    tpu_resource_per_chip: int = 1
    warnings: tuple[Problem, ...] = field(default=())
    scarcity: ScarcitySettings = DEFAULT_SCARCITY
    """Warm slices, cost and queued provisioning (the group's annotations)."""
    resize: ResizeBounds | None = None
    """How far a pod may grow in place (the RayCluster's `ray.io/ippr`); None: never.
    Single-host groups without TPUs only."""

    @property
    def chips_per_host(self) -> Chips:
        return self.tpu.chips_per_host if self.tpu else Chips(0)

    @property
    def chips_per_replica(self) -> Chips:
        return Chips(self.chips_per_host * self.hosts_per_replica)

    @property
    def head_resource(self) -> str | None:
        return self.tpu.head_resource if self.tpu else None

    def host_labels(self, host_index: int, slice_name: str | None = None) -> dict[str, str]:
        """Labels of host `host_index` of a replica; the TPU ones as Ray derives them."""
        host = dict(self.group_labels)
        if self.tpu is not None:
            host.update(self.tpu.host_labels(host_index, slice_name))
        return host

    def host_resources(self, host_index: int, slice_name: str | None = None) -> dict[str, float]:
        """Resources of host `host_index`; the head resource on host 0 only."""
        resources = dict(self.resources_per_host)
        if self.tpu is not None:
            resources.update(self.tpu.host_extra_resources(host_index, slice_name))
        return resources

    def launch_resources(self, host_index: int, slice_name: str | None = None) -> dict[str, float]:
        """What Ray's scheduler counts host `host_index` of a replica not up yet for:
        its resources, grown to the resize maximum if the group resizes in place."""
        resources = self.host_resources(host_index, slice_name)
        return self.resize.raised(resources) if self.resize is not None else resources
