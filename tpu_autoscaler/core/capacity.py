"""Scarce capacity, as the policy sees it: what the cluster said about a group's
capacity (signals read from Kubernetes Events, node pools, preemptions and launches
that timed out), the state of each group the policy derives from them (available,
stocked out since T, backing off until T, churning until T), and the per-group
settings that say how to live with scarcity (warm slices, cost, queued provisioning).

Adapters turn Events and the GCS into `CapacitySignal`s; the policy turns signals and
launch history into `GroupCapacity`, carried in the plan for `plan`, `ray status`,
Events and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tpu_autoscaler.core.units import Replicas

NO_WARM_REPLICAS = Replicas(0)


class CapacityProblem(StrEnum):
    """What a signal says went wrong with a group's capacity."""

    STOCKOUT = "stockout"
    """GKE/cluster-autoscaler: no capacity of the shape (GCE out of resources, no
    capacity in the zone)."""
    QUOTA = "quota"
    """GKE/cluster-autoscaler: a quota is exhausted (chips, VMs, IPs)."""
    NODE_POOL_FAILED = "node_pool_failed"
    """The node pool behind the group failed to come up (error state, failed
    operation), for a reason other than the two above."""
    PREEMPTED = "preempted"
    """A host of the group was preempted (spot) or its node went away under it."""
    TIMED_OUT = "timed_out"
    """A launch did not come up within its bound (the provisioning timeout, or the
    all-or-nothing bound of a gang of slices)."""


@dataclass(frozen=True, slots=True)
class CapacitySignal:
    """One thing the cluster said about a group's capacity, at one instant."""

    group: str
    problem: CapacityProblem
    at_s: float
    """When it was said (the Event's last timestamp, the preemption's time)."""
    message: str
    """What it said, quoted as people read it (the Event's message)."""
    source: str = ""
    """Where it was read: `Event FailedScaleUp on pod NAME`, `node pool NAME`, ..."""

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "problem": str(self.problem),
            "at_s": self.at_s,
            "message": self.message,
            "source": self.source,
        }


class CapacityStatus(StrEnum):
    """A group's capacity now, as the policy acts on it."""

    AVAILABLE = "available"
    STOCKED_OUT = "stocked_out"
    """Recent signals say launches would not be served: new demand goes elsewhere."""
    BACKING_OFF = "backing_off"
    """Launches failed; no new launch until `until_s`."""
    CHURNING = "churning"
    """Its slices keep getting preempted soon after they arrive: new demand prefers a
    steadier group until `until_s`."""


@dataclass(frozen=True, slots=True)
class GroupCapacity:
    """One group's capacity state in a plan, with the reason as people read it."""

    group: str
    status: CapacityStatus
    since_s: float | None = None
    until_s: float | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "status": str(self.status),
            "since_s": self.since_s,
            "until_s": self.until_s,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ScarcitySettings:
    """Per-group settings for scarce capacity, read from the group's pod template
    annotations (`ANNOTATION_PREFIX` + `warm-replicas`, `cost`, `queued-provisioning`)."""

    warm_replicas: Replicas = NO_WARM_REPLICAS
    """Idle slices kept ready beyond demand, bounded by maxReplicas, never removed by
    idle timeout below this count."""
    cost: float | None = None
    """Relative cost of one chip-hour of this group (spot cheaper than on-demand):
    among groups of equal priority, the cheaper serves new demand first. None: unknown,
    ranked after every group with a cost."""
    queued_provisioning: bool = False
    """Obtain each slice's capacity through a GKE ProvisioningRequest
    (`queued-provisioning.gke.io`) before raising `replicas`."""


DEFAULT_SCARCITY = ScarcitySettings()

ANNOTATION_PREFIX = "tpu-autoscaler.dev/"
WARM_REPLICAS_ANNOTATION = ANNOTATION_PREFIX + "warm-replicas"
COST_ANNOTATION = ANNOTATION_PREFIX + "cost"
QUEUED_PROVISIONING_ANNOTATION = ANNOTATION_PREFIX + "queued-provisioning"
