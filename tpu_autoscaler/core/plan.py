"""What the policy decided: whole replicas to launch and to remove, and demand it
could not serve, each with the reason that travels with it to logs and events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tpu_autoscaler.core.capacity import GroupCapacity
from tpu_autoscaler.core.demand import DemandRef
from tpu_autoscaler.core.units import Replicas


@dataclass(frozen=True, slots=True)
class Launch:
    group: str
    replicas: Replicas
    reason: str
    gangs: tuple[Replicas, ...] = ()
    """Of `replicas`, those launched together for one all-or-nothing gang, one entry
    per gang of two or more (a placement group that needs several slices at once):
    each is of no use without the rest of its entry, so capacity obtained for them
    is obtained for the entry whole (queued provisioning: one ProvisioningRequest).
    The replicas beyond their sum are of use one by one."""


class RemovalCause(StrEnum):
    UNHEALTHY = "unhealthy"
    """A host dead, missing or drained: the slice is unusable."""
    PROVISIONING_TIMEOUT = "provisioning_timeout"
    """Not up in time: counts toward the group's backoff."""
    IDLE = "idle"
    """Every host idle past the timeout: each must accept a drain first."""
    MAX_REPLICAS = "max_replicas"
    """Its group has more replicas than maxReplicas (lowered, or 0)."""
    MAX_WORKERS = "max_workers"
    """The cluster has more worker hosts than its cluster-wide max."""
    OUTDATED = "outdated"
    """Launched from a configuration its group no longer has (Ray's launch config)."""
    GANG_INCOMPLETE = "gang_incomplete"
    """Arrived for an all-or-nothing gang whose other slices did not come within the
    gang arrival bound: given back idle instead of held; each host must accept a drain
    first, as for IDLE."""


@dataclass(frozen=True, slots=True)
class Terminate:
    group: str
    replica: str
    pods: tuple[str, ...]
    reason: str
    cause: RemovalCause = RemovalCause.UNHEALTHY

    @property
    def provisioning_timeout(self) -> bool:
        return self.cause is RemovalCause.PROVISIONING_TIMEOUT

    @property
    def idle(self) -> bool:
        """Every host idle: each must accept a drain first."""
        return self.cause in (RemovalCause.IDLE, RemovalCause.GANG_INCOMPLETE)


@dataclass(frozen=True, slots=True)
class Resize:
    """Grow one running pod in place (Kubernetes' `pods/resize`), as Ray 2.60 does for
    a group of its `ray.io/ippr` annotation: to the group's maximum CPU and memory."""

    group: str
    replica: str
    pod: str
    resources_from: Mapping[str, float]
    """CPU and memory (bytes) the pod has now."""
    resources_to: Mapping[str, float]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "replica": self.replica,
            "pod": self.pod,
            "from": dict(self.resources_from),
            "to": dict(self.resources_to),
            "reason": self.reason,
        }

    def render_text(self) -> str:
        def size(resources: Mapping[str, float]) -> str:
            return ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(resources.items()))

        return (
            f"resize {self.group}/{self.pod} from {size(self.resources_from)} "
            f"to {size(self.resources_to)}: {self.reason}"
        )


def _amount(name: str, value: float) -> str:
    if name == "memory":
        for unit, size in (("Gi", 2**30), ("G", 10**9), ("Mi", 2**20), ("M", 10**6)):
            if value >= size and value % size == 0:
                return f"{value / size:g}{unit}"
    return f"{value:g}"


class GroupVerdict(StrEnum):
    """What a group made of a demand item no group launched for (cluster-autoscaler's
    scale-up status has the same two: skipped and rejected node groups)."""

    SKIPPED = "skipped"
    """It could hold the item, but a limit stands in the way now: maxReplicas,
    provisioning backoff, the upscaling mode."""
    REJECTED = "rejected"
    """No replica of it can ever hold the item: labels, resources, size, maxReplicas 0."""
    BUSY = "busy"
    """The item is pinned by name to a replica of it that holds it once its work ends
    (a `slice_placement_group` stage two whose slice is busy): it waits for that."""


@dataclass(frozen=True, slots=True)
class GroupReason:
    group: str
    verdict: GroupVerdict
    message: str
    """The reason as people read it, the group named in it."""

    def to_json(self) -> dict[str, str]:
        return {"group": self.group, "verdict": str(self.verdict), "message": self.message}


@dataclass(frozen=True, slots=True)
class Unmet:
    """Demand not served by this plan; `infeasible` never can be, `waiting` may later."""

    demand: str
    reason: str
    refs: tuple[DemandRef, ...] = ()
    """The requests of Ray's report it stands for (several: alike gangs on one line)."""
    groups: tuple[GroupReason, ...] = ()
    """Each group's verdict on it, in the order the reason tells them."""
    copies: int = 1
    """Copies of its one task or actor request left unserved: Ray reports an
    infeasible request once per copy (`ray status` counts them)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "demand": self.demand,
            "reason": self.reason,
            "groups": [g.to_json() for g in self.groups],
        }


@dataclass(frozen=True, slots=True)
class Plan:
    launch: tuple[Launch, ...] = ()
    terminate: tuple[Terminate, ...] = ()
    infeasible: tuple[Unmet, ...] = ()
    waiting: tuple[Unmet, ...] = ()
    bundles_placed: int = 0
    """Demand bundles that fit on existing, pending or launched capacity."""
    bundles_unmet: int = 0
    """Demand bundles listed under `infeasible` or `waiting`."""
    capacity: tuple[GroupCapacity, ...] = ()
    """Groups whose capacity is not plainly available (stocked out, backing off,
    churning), each with since/until and its reason; available groups are omitted."""
    resize: tuple[Resize, ...] = ()
    """Running pods grown in place for demand (groups of Ray's `ray.io/ippr`)."""

    def infeasible_refs(self) -> tuple[tuple[DemandRef, int], ...]:
        """Each request of Ray's report no group can ever serve, with how many copies
        of it to report."""
        return tuple((ref, u.copies) for u in self.infeasible for ref in u.refs)

    def launched(self, group: str) -> int:
        return sum(launch.replicas for launch in self.launch if launch.group == group)

    def to_json(self) -> dict[str, Any]:
        return {
            "launch": [
                {
                    "group": x.group,
                    "replicas": x.replicas,
                    "reason": x.reason,
                    "gangs": list(x.gangs),
                }
                for x in self.launch
            ],
            "terminate": [
                {"group": x.group, "replica": x.replica, "pods": list(x.pods), "reason": x.reason}
                for x in self.terminate
            ],
            "infeasible": [x.to_json() for x in self.infeasible],
            "waiting": [x.to_json() for x in self.waiting],
            "bundles_placed": self.bundles_placed,
            "bundles_unmet": self.bundles_unmet,
            "capacity": [c.to_json() for c in self.capacity],
            "resize": [x.to_json() for x in self.resize],
        }

    def render_text(self) -> str:
        lines = [f"launch {x.replicas} x {x.group}: {x.reason}" for x in self.launch]
        lines += [x.render_text() for x in self.resize]
        lines += [
            f"terminate {x.group}/{x.replica} ({len(x.pods)} pods): {x.reason}"
            for x in self.terminate
        ]
        lines += [f"infeasible {x.demand}: {x.reason}" for x in self.infeasible]
        lines += [f"waiting {x.demand}: {x.reason}" for x in self.waiting]
        lines += [f"capacity {c.group}: {c.status}: {c.reason}" for c in self.capacity]
        return "\n".join(lines) if lines else "nothing to do"
