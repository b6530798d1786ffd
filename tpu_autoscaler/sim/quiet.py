"""Autoscaler rounds the simulator leaves out because they could only repeat the last
one: nothing the autoscaler reads has changed since a round that planned nothing,
and no deadline of the policy has passed since.

A round's plan depends on what it reads (the RayCluster, its pods, the GCS's state),
on the autoscaler's memory and on the time. The simulator knows without reading
whether the first changed: the object store's resourceVersion counts every write,
and what the simulated GCS's state is made of, idle durations aside
(`SimRay.state_key`), changes exactly when a node, its use or status, or the demand
does.
The memory changes only in rounds that do something. Time alone moves a plan only
across a deadline: a host idle past its group's idle timeout, a host's registration
settling, a group's launch backoff ending, a stockout hold or a churn window closing,
a pending replica's provisioning, joining or creation timeout, a gang's arrival
bound, a resize's timeout. A round is quiet, and the next ones may be skipped, only
when its snapshot has none of those it cannot date: every replica whole and running
on live, registered hosts (or draining), none resizing, no pending demand, nothing
being drained or owed a removal. The deadlines it can date bound the skipping: idle
timeouts and settling from the hosts, and every capacity state's end (backoff,
stockout hold, churn) as the policy's own `health`, `capacity` and `churn` derive
it from the capacity signals and the failed launches. And a round's calls take time,
during which the world moves on: a round is left out only if no action that may change
the world is due before its reads would end (`EventQueue.changes_by`).

Only our policy's rounds are skipped (Ray's own autoscaler keeps timers of its own),
only on the simulated API server, and a skipped round writes nothing, so the run's
decisions and measurements are those of a run that plans every round
(`tests/test_sim_quiet.py` runs both and compares them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import health
from tpu_autoscaler.core.policy.capacity import group_capacities
from tpu_autoscaler.core.policy.churn import churning_groups
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState

SAFETY_MARGIN_S = 1.0
"""How far before a dated deadline skipping stops: the GCS reports idle time in whole
milliseconds, and a round's reads take simulated time."""


def round_calls_s(world: WorldModel) -> float:
    """What a quiet round's calls take: the RayCluster, its pods and the Events about
    them from the API server; the GCS's state, its dead nodes and the report to it."""
    return 3 * world.autoscaler_call_latency_s + 3 * world.gcs_call_latency_s


def quiet_until_s(snapshot: ClusterSnapshot, plan: Plan) -> float | None:
    """The snapshot time before which a plan made from this snapshot, with only time
    moved on, stays `plan`, which did nothing; None if the round was not quiet."""
    if not may_be_quiet(snapshot, plan):
        return None
    now_s = snapshot.now_s
    deadlines_s = [float("inf")]
    deadlines_s += _capacity_deadlines_s(snapshot)
    for replica in snapshot.replicas:
        replica_deadlines_s = _replica_deadlines_s(snapshot, replica)
        if replica_deadlines_s is None:
            return None
        deadlines_s += replica_deadlines_s
    return min(d for d in deadlines_s if d >= now_s)  # those passed have had their say


def may_be_quiet(snapshot: ClusterSnapshot, plan: Plan) -> bool:
    """What `quiet_until_s` checks first, at no cost: a plan that does nothing, and no
    pending demand. (False: the round was not quiet, whatever else holds.)"""
    if plan.launch or plan.terminate or plan.resize:
        return False
    demand = snapshot.demand
    return not (demand.resources or demand.gangs or demand.constraints)


def _capacity_deadlines_s(snapshot: ClusterSnapshot) -> list[float]:
    """When each group's capacity state, as the policy derives it from the signals
    and the failed launches, next changes with time alone: a backoff or a stockout
    hold ends, a churn window closes, a signal dated ahead of the snapshot starts
    counting. (States with no end change only with what is read.)"""
    shapes = {shape.group: shape for shape in snapshot.shapes}
    backoff_until = health.check(snapshot, shapes).backoff_until
    states = group_capacities(snapshot, backoff_until)
    churning = churning_groups(snapshot.capacity_signals, shapes, snapshot.config, snapshot.now_s)
    deadlines_s = list(backoff_until.values())
    deadlines_s += [s.until_s for s in (*states.values(), *churning.values()) if s.until_s]
    deadlines_s += [signal.at_s for signal in snapshot.capacity_signals]
    return deadlines_s


def _replica_deadlines_s(snapshot: ClusterSnapshot, replica: Replica) -> list[float] | None:
    """When time alone next changes what the policy makes of `replica`: its idle
    timeout, its hosts' registration settling; None if it waits on a deadline not
    dated here (pending, being created or joining, missing hosts, resizing)."""
    shape = snapshot.shape(replica.group)
    if shape is None or not replica.identified or replica.outdated:
        return None
    if replica.state is ReplicaState.DRAINING:
        return []  # no capacity, no health check: nothing about it waits on time
    if replica.state is not ReplicaState.RUNNING or len(replica.hosts) != shape.hosts_per_replica:
        return None
    deadlines_s = []
    for host in replica.hosts:
        if not host.registered or host.registered_at_s is None:
            return None
        if host.size is not None and host.size.resizing:
            return None
        deadlines_s.append(host.registered_at_s + snapshot.config.registration_settle_s)
    # The policy compares a replica's idle time (its least idle host's) with the
    # timeout; below it, its rank among idle replicas does not change with time.
    idle_s = min(host.idle_s for host in replica.hosts)
    if idle_s > 0:
        deadlines_s.append(snapshot.now_s + shape.idle_timeout_s - idle_s)
    return deadlines_s


Fingerprint = tuple[int, tuple[object, ...]]


@dataclass
class QuietRounds:
    """Decides, round by round, whether the autoscaler's round may be left out.
    `fingerprint`: what the autoscaler would read, without the passing of time (taken
    only around rounds that follow a quiet-looking one: it costs a walk of every
    node, and a round after a busy one is seldom quiet)."""

    fingerprint: Callable[[], Fingerprint]
    changes_while_read: Callable[[float], bool]
    """Whether the world may change while a round due at that time reads it (a round's
    calls take time: one skipped must not miss what it would have read)."""
    enabled: bool = True
    skipped: int = 0
    _quiet: tuple[Fingerprint, float] | None = None
    """What the last quiet round read, and the time before which a round is skipped
    if it would read the same."""
    _before: Fingerprint | None = None
    _looked_quiet = False
    """The last round's plan and snapshot were quiet, whatever changed while it ran."""

    def skip(self, now_s: float) -> bool:
        """Whether the round due at `now_s` would only repeat the last quiet one."""
        self._before = None
        if not self.enabled or not (self._quiet or self._looked_quiet):
            return False
        self._before = self.fingerprint()
        if self._quiet is not None:
            read, skip_before_s = self._quiet
            if (
                now_s < skip_before_s
                and self._before == read
                and not self.changes_while_read(now_s)
            ):
                self.skipped += 1
                return True
            self._quiet = None
        return False

    def ran(self, began_s: float, snapshot: ClusterSnapshot | None, plan: Plan | None) -> None:
        """A round that began at `began_s` has ended; it planned `plan` from `snapshot`
        (None: it failed). Quiet only if nothing it reads changed while it ran."""
        self._quiet = None
        until_s = None if snapshot is None or plan is None else quiet_until_s(snapshot, plan)
        self._looked_quiet = until_s is not None
        if until_s is None or snapshot is None or self._before is None:
            return
        if self.fingerprint() == self._before:
            # A skipped round would read at its start plus what this one took to
            # read: the same offset from `began_s` as this snapshot's time.
            skip_before_s = began_s + (until_s - snapshot.now_s) - SAFETY_MARGIN_S
            self._quiet = (self._before, skip_before_s)
