"""What the autoscaler tells people and Ray: Kubernetes Events and log lines for each
decision and problem (each distinct problem once) and each change of a group's
capacity, Prometheus metrics per round, and the autoscaling state `ray status` shows,
reported to the GCS. All best effort: a
failure to tell never stops a round."""

from __future__ import annotations

import itertools
import logging
import operator
from collections import Counter as Tally
from collections.abc import Callable
from itertools import compress, repeat
from typing import Any, Protocol

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi
from tpu_autoscaler.adapters.ray.gcs import (
    GcsApi,
    GcsUnavailable,
    PendingHosts,
    StartingHost,
    autoscaling_state,
    starting_part,
)
from tpu_autoscaler.adapters.ray.state import RayState
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.capacity import CapacityStatus
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState
from tpu_autoscaler.shell import capacity, events
from tpu_autoscaler.shell.metrics import SLICE_STATES, AutoscalerMetrics
from tpu_autoscaler.shell.readiness import ReadinessWatch

log = logging.getLogger("tpu_autoscaler")

_STATE = operator.attrgetter("state")
_GROUP_AND_STATE = operator.attrgetter("group", "state")


class Ports(Protocol):
    """What a round talks to; read at each use, so a replaced one (a reconnect, a test
    double) is used everywhere at once."""

    kube: KubeApi
    gcs: GcsApi
    clock: Callable[[], float]
    metrics: AutoscalerMetrics


_HOSTS = operator.attrgetter("hosts")


def _name_clashes(snapshot: ClusterSnapshot) -> set[tuple[str, str]]:
    """Replica names KubeRay gave two slices: it draws `<group>-` + 5 random characters
    and never checks the name is free (about n^2/28.7M for n live replicas of a group),
    and a name is one replica to it, so removing or losing either slice removes both.
    The operator should know why two slices come and go together."""
    clashes: set[tuple[str, str]] = set()
    fewest_hosts = min((s.hosts_per_replica for s in snapshot.shapes), default=0)
    # Every round asks, and a clash lasts as long as its slices: the replicas larger
    # than any slice are found in C, and only they are looked at.
    larger = map(fewest_hosts.__lt__, map(len, map(_HOSTS, snapshot.replicas)))
    shapes = {s.group: s for s in snapshot.shapes}
    for replica in itertools.compress(snapshot.replicas, larger):
        shape = shapes.get(replica.group)
        if shape is None or len(replica.hosts) <= shape.hosts_per_replica:
            continue
        slices = -(-len(replica.hosts) // shape.hosts_per_replica)
        clashes.add(
            (
                events.REPLICA_NAME_CLASH,
                f"worker group {replica.group!r}: KubeRay gave the replica name "
                f"{replica.name!r} to {slices} slices ({len(replica.hosts)} pods for "
                f"{shape.hosts_per_replica}-host slices), so removing either removes "
                "all of them; they are kept and removed as one replica",
            )
        )
    return clashes


class Announcer:
    def __init__(self, ports: Ports, namespace: str, where: str) -> None:
        self.ports = ports
        self.namespace = namespace
        self.where = where
        self.announced_infeasible: set[str] = set()
        self.announced_problems: set[tuple[str, str]] = set()
        self.announced_capacity: dict[str, CapacityStatus] = {}
        self.measured_groups: set[str] = set()
        self.readiness = ReadinessWatch()
        self.unreadable: dict[str, str] = {}
        """Why each source of capacity signals could not be read, while it cannot."""
        self.state_version = 0
        self.starting: dict[int, tuple[Replica, str, bytes]] = {}
        """The hosts `report` last listed as starting, by pending replica (by `id`, each
        held so its `id` is not reused), with the capacity note they carry, as the
        part of the reported message that lists them (`starting_part`). A replica
        is frozen and what is listed of it comes from it and the note alone, so the same
        replica with the same note lists the same hosts; one changed in any way is a
        new object. Only the last report's replicas are kept; none (a restart) costs
        making them again."""

    def problems(self, raw: dict[str, Any], loaded: LoadedSnapshot) -> None:
        """Invalid groups and groups whose replicas cannot be told apart: said once
        per distinct problem, in a log line and an Event; the group is left alone."""
        problems = {(events.INVALID_GROUP, str(p)) for p in loaded.shapes.errors}
        unidentified = sorted({r.group for r in loaded.snapshot.replicas if not r.identified})
        for group in unidentified:
            problems.add(
                (
                    events.UNIDENTIFIED,
                    f"worker group {group!r}: its pods carry neither "
                    "ray.io/worker-group-replica-name nor the TPU webhook's replicaIndex "
                    "(KubeRay < 1.6 or the feature gate off), so which pods form a slice is "
                    "unknown: its replicas are never removed; scale-up continues in whole "
                    "replicas",
                )
            )
        problems |= _name_clashes(loaded.snapshot)
        self.ports.metrics.invalid_groups.set(len({p.group for p in loaded.shapes.errors}))
        for reason, message in sorted(problems - self.announced_problems):
            log.warning(message, extra={"reason": reason, "cluster": self.where})
            self.event(raw, reason, message, "Warning")
        self.announced_problems = problems

    def decisions(self, raw: dict[str, Any], loaded: LoadedSnapshot, decided: Plan) -> None:
        shapes = {s.group: s for s in loaded.snapshot.shapes}
        for launch in decided.launch:
            hosts = shapes[launch.group].hosts_per_replica if launch.group in shapes else 0
            message = (
                f"launching {launch.replicas} replica(s) of {launch.group} "
                f"({hosts} hosts each): {launch.reason}"
            )
            log.info(message, extra={"group": launch.group, "replicas": launch.replicas})
            self.ports.metrics.launched.labels(launch.group).inc(launch.replicas)
            self.event(raw, events.LAUNCH, message, "Normal")
        for removal in decided.terminate:
            message = (
                f"removing replica {removal.replica} of {removal.group} "
                f"(pods {', '.join(removal.pods)}): {removal.reason}"
            )
            log.info(message, extra={"group": removal.group, "replica": removal.replica})
            self.ports.metrics.removed.labels(removal.group, removal.cause.value).inc()
            self.event(raw, events.REMOVE, message, "Normal")
        infeasible = {u.demand: u.reason for u in decided.infeasible}
        for demand in sorted(set(infeasible) - self.announced_infeasible):
            message = f"{demand}: {infeasible[demand]}"
            log.warning(message, extra={"reason": events.INFEASIBLE})
            self.event(raw, events.INFEASIBLE, message, "Warning")
        self.announced_infeasible = set(infeasible)

    def signals_read(self, api: str, operation: str, error: Exception | None) -> None:
        """A source of capacity signals that could not be read (Events not listable,
        the GCS's dead nodes) costs the round those signals only: counted each round,
        logged when the reason is new."""
        if error is None:
            self.unreadable.pop(operation, None)
            return
        self.ports.metrics.api_errors.labels(api, operation).inc()
        if str(error) != self.unreadable.get(operation):
            log.warning(
                f"cannot {operation.replace('_', ' ')}, so no capacity signals from it: {error}",
                extra={"reason": events.SIGNALS_UNREADABLE, "cluster": self.where},
            )
        self.unreadable[operation] = str(error)

    def capacity(self, raw: dict[str, Any], loaded: LoadedSnapshot, decided: Plan) -> None:
        """An Event for each group whose capacity status changed since the last one
        announced, and every group's gauges."""
        groups = [s.group for s in loaded.snapshot.shapes]
        now = capacity.by_group(decided.capacity, groups)
        for change in capacity.changes(self.announced_capacity, now):
            kind: events.EventType = "Warning" if change.warning else "Normal"
            log.log(
                logging.WARNING if change.warning else logging.INFO,
                change.message,
                extra={"reason": change.reason, "group": change.group},
            )
            self.event(raw, change.reason, change.message, kind)
        self.announced_capacity = {g: c.status for g, c in now.items()}
        metrics = self.ports.metrics
        for gone in self.measured_groups - set(now):  # groups gone from the spec
            for status in CapacityStatus:
                metrics.group_capacity.remove(gone, str(status))
            metrics.group_capacity_since.remove(gone)
            metrics.group_capacity_until.remove(gone)
        self.measured_groups = set(now)
        for group, state in now.items():
            for status in CapacityStatus:
                metrics.group_capacity.labels(group, str(status)).set(
                    1.0 if state.status is status else 0.0
                )
            metrics.group_capacity_since.labels(group).set(state.since_s or 0.0)
            metrics.group_capacity_until.labels(group).set(state.until_s or 0.0)

    def failure(self, raw: dict[str, Any], exc: Exception) -> None:
        self.event(raw, events.APPLY_FAILED, f"could not apply the plan: {exc}", "Warning")

    def came_up(self, raw: dict[str, Any], snapshot: ClusterSnapshot) -> None:
        """Each replica that came up whole since the last round: an Event carrying its
        times (`readiness`), a log line, and its time in the histogram."""
        for up in self.readiness.came_up(snapshot):
            message = up.message()
            log.info(message, extra={"group": up.group, "replica": up.replica})
            self.ports.metrics.replica_up_seconds.labels(up.group).observe(up.up_s)
            self.event(raw, events.REPLICA_UP, message, "Normal", up.annotations())

    def event(
        self,
        raw: dict[str, Any],
        reason: str,
        message: str,
        kind: events.EventType,
        annotations: dict[str, str] | None = None,
    ) -> None:
        try:
            self.ports.kube.create_event(
                self.namespace,
                events.cluster_event(raw, reason, message, kind, self.ports.clock(), annotations),
            )
        except ApiError as exc:
            self.ports.metrics.api_errors.labels("kubernetes", "create_event").inc()
            log.warning("could not record event", extra={"detail": str(exc)})

    def measure(self, loaded: LoadedSnapshot, decided: Plan) -> None:
        metrics = self.ports.metrics
        counts = Tally(map(_GROUP_AND_STATE, loaded.snapshot.replicas))  # counted in C
        metrics.slices.clear()
        for shape in loaded.snapshot.shapes:
            for state in SLICE_STATES:
                count = counts[(shape.group, ReplicaState(state))]
                metrics.slices.labels(shape.group, state).set(count)
        metrics.pending_bundles.set(decided.bundles_unmet)
        metrics.infeasible.set(len(decided.infeasible))

    def report(self, ray: RayState, after: ClusterSnapshot, decided: Plan) -> None:
        """`ray status` shows what Ray's own autoscaler would: launches asked for,
        hosts starting, demand no group can serve."""
        shapes = {s.group: s for s in after.shapes}
        short = {
            c.group: f"; {capacity.describe(c)}"
            for c in decided.capacity
            if c.status is not CapacityStatus.AVAILABLE
        }
        requested: Tally[str] = Tally()
        asked_at: dict[str, float] = {}
        starting: list[bytes] = []
        listed = self.starting
        now_listed: dict[int, tuple[Replica, str, bytes]] = {}
        replicas = after.replicas
        # Running replicas are listed nowhere here, and most are: passed over in C.
        not_running = map(operator.is_not, map(_STATE, replicas), repeat(ReplicaState.RUNNING))
        for replica in compress(replicas, not_running):
            shape = shapes.get(replica.group)
            if shape is None:
                continue
            if replica.state is ReplicaState.REQUESTED:
                requested[replica.group] += shape.hosts_per_replica
                asked_at[replica.group] = min(
                    asked_at.get(replica.group, replica.created_at_s), replica.created_at_s
                )
            elif replica.state is ReplicaState.PENDING:
                note = short.get(replica.group, "")
                previous = listed.get(id(replica))
                if previous is not None and previous[0] is replica and previous[1] == note:
                    part = previous[2]
                else:
                    details = f"slice {replica.slice_name or replica.name}: waiting for its hosts"
                    part = starting_part(
                        StartingHost(replica.group, h.pod_name, details + note)
                        for h in replica.hosts
                        if not h.registered
                    )
                now_listed[id(replica)] = (replica, note, part)
                starting.append(part)
        self.starting = now_listed
        self.state_version = max(self.state_version + 1, int(self.ports.clock() * 1000))
        state = autoscaling_state(
            ray,
            self.state_version,
            [PendingHosts(g, n, asked_at[g]) for g, n in sorted(requested.items())],
            (),
            decided.infeasible_refs(),
            capacity.failed_launches(
                decided.capacity,
                {g: s.hosts_per_replica for g, s in shapes.items()},
                self.ports.clock(),
            ),
        )
        # The starting hosts follow as serialized parts, each made once while its
        # replica waits (`starting_part`): read as the state's own pending instances.
        try:
            self.ports.gcs.report_autoscaling_state(state.SerializeToString() + b"".join(starting))
        except GcsUnavailable as exc:
            self.ports.metrics.api_errors.labels("gcs", "report").inc()
            log.warning("could not report autoscaling state", extra={"detail": str(exc)})
