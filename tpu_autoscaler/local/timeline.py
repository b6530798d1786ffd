"""What a person watching a local cluster wants to see: one line per scaling event
(a slice launched, ready in Ray, drained, removed, a host failed, demand nothing can
serve), whichever autoscaler made it. Pure: two observations in, lines out; the
cluster module takes the observations from the object store and the GCS."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

RAY_GONE = "DEAD"
BUSY = "RUNNING"
"""Ray's `NodeStatus` names: RUNNING is a node with work, IDLE one without."""


@dataclass(frozen=True, slots=True)
class HostView:
    pod: str
    worker_id: int
    phase: str
    """The pod's phase: Pending, Running, Failed."""
    ray_status: str | None
    """Its Ray node's `NodeStatus` (RUNNING, IDLE, DRAINING, DEAD), None before it registers."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica of a worker group: a TPU slice and its hosts."""

    group: str
    slice_name: str
    hosts: tuple[HostView, ...]

    @property
    def ready(self) -> bool:
        return bool(self.hosts) and all(h.ray_status not in (None, RAY_GONE) for h in self.hosts)

    @property
    def busy_hosts(self) -> int:
        return sum(h.ray_status == BUSY for h in self.hosts)


@dataclass(frozen=True, slots=True)
class RayNodeEnd:
    """A TPU host's Ray node draining or gone, as the GCS tells it (its labels name the
    slice, so the end is known after the pod has gone too)."""

    slice_name: str
    worker_id: int
    how: str
    """DRAINING, or the GCS's death reason: AUTOSCALER_DRAIN_IDLE, ..._PREEMPTED, ..."""


DRAIN_ENDS = frozenset({"DRAINING", "AUTOSCALER_DRAIN_IDLE", "AUTOSCALER_DRAIN_PREEMPTED"})


@dataclass(frozen=True, slots=True)
class Observation:
    t_s: float
    """Seconds since the local cluster started."""
    replicas: Mapping[str, ReplicaView] = field(default_factory=dict)
    """By replica name (KubeRay's `ray.io/worker-group-replica-name`)."""
    infeasible: frozenset[str] = frozenset()
    """Demand the autoscaler reported to the GCS as infeasible."""
    ray_ends: Mapping[str, RayNodeEnd] = field(default_factory=dict)
    """By Ray node id: TPU hosts draining or dead."""


@dataclass(frozen=True, slots=True)
class ScalingEvent:
    t_s: float
    kind: str
    """launch, ready, drain, removal, failed, lost, infeasible."""
    subject: str
    """The slice (its TPU_NAME), or the demand."""
    detail: str

    def __str__(self) -> str:
        return f"[{self.t_s:7.1f}s] {self.kind:<10} {self.subject}  {self.detail}"


def _hosts(hosts: tuple[HostView, ...]) -> str:
    return " ".join(f"{h.worker_id}:{h.pod}" for h in sorted(hosts, key=lambda h: h.worker_id))


def changes(before: Observation, after: Observation) -> list[ScalingEvent]:
    """The scaling events between two observations, in a stable order."""
    found: list[ScalingEvent] = []
    now = after.t_s
    for key, replica in sorted(after.replicas.items()):
        previous = before.replicas.get(key)
        if previous is None:
            found.append(
                ScalingEvent(
                    now,
                    "launch",
                    replica.slice_name,
                    f"{replica.group}: {len(replica.hosts)} hosts {_hosts(replica.hosts)}",
                )
            )
        if replica.ready and (previous is None or not previous.ready):
            found.append(
                ScalingEvent(
                    now,
                    "ready",
                    replica.slice_name,
                    f"{len(replica.hosts)}/{len(replica.hosts)} hosts registered in Ray",
                )
            )
        was = {h.pod: h for h in previous.hosts} if previous else {}
        failed = tuple(
            h
            for h in replica.hosts
            if h.phase == "Failed" and (h.pod not in was or was[h.pod].phase != "Failed")
        )
        if failed:
            found.append(ScalingEvent(now, "failed", replica.slice_name, f"hosts {_hosts(failed)}"))
        # KubeRay's own deletions take a replica out whole (the observer hides all its
        # pods from the first call on): a host gone from a replica that stays is a pod
        # someone else deleted, and the replica is incomplete from then on.
        now_pods = {h.pod for h in replica.hosts}
        lost = tuple(h for h in was.values() if h.pod not in now_pods)
        if lost:
            busy = sum(h.ray_status == BUSY for h in lost)
            found.append(
                ScalingEvent(
                    now,
                    "lost",
                    replica.slice_name,
                    f"hosts {_hosts(lost)}: pod deleted, {len(replica.hosts)} of "
                    f"{len(replica.hosts) + len(lost)} hosts left"
                    + (f", {busy} of them busy in Ray" if busy else ""),
                )
            )
    drained: dict[tuple[str, str], list[int]] = {}
    for node_id, end in after.ray_ends.items():
        earlier = before.ray_ends.get(node_id)
        if end.how in DRAIN_ENDS and (earlier is None or earlier.how not in DRAIN_ENDS):
            drained.setdefault((end.slice_name, end.how), []).append(end.worker_id)
    for (slice_name, how), workers in sorted(drained.items()):
        hosts = ",".join(str(w) for w in sorted(workers))
        found.append(ScalingEvent(now, "drain", slice_name, f"hosts {hosts}: {how}"))
    for key, replica in sorted(before.replicas.items()):
        if key not in after.replicas:
            busy = replica.busy_hosts
            found.append(
                ScalingEvent(
                    now,
                    "removal",
                    replica.slice_name,
                    f"{len(replica.hosts)} hosts deleted"
                    + (f", {busy} of them busy in Ray" if busy else ", all idle or drained"),
                )
            )
    for demand in sorted(after.infeasible - before.infeasible):
        found.append(ScalingEvent(now, "infeasible", demand, "no worker group can serve it"))
    return found
