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
settling, a group's launch backoff ending, a pending replica's provisioning, joining
or creation timeout, a gang's arrival bound, a stockout hold or a churn window. A
round is quiet, and the next ones may be skipped, only when its snapshot has none
of those it cannot date: every replica running on live, registered hosts, no pending
demand, no capacity signals, no backoff that may still run, nothing being drained or
owed a removal; the idle and settling deadlines it can date bound the skipping.

Only our policy's rounds are skipped (Ray's own autoscaler keeps timers of its own),
only on the simulated API server, and a skipped round writes nothing, so the run's
decisions and measurements are those of a run that plans every round
(`tests/test_sim_quiet.py` runs both and compares them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import ClusterSnapshot, ReplicaState

SAFETY_MARGIN_S = 1.0
"""How far before a dated deadline skipping stops: the GCS reports idle time in whole
milliseconds, and a round's reads take simulated time."""


def quiet_until_s(snapshot: ClusterSnapshot, plan: Plan) -> float | None:
    """The snapshot time before which a plan made from this snapshot, with only time
    moved on, stays `plan`, which did nothing; None if the round was not quiet."""
    if plan.launch or plan.terminate:
        return None
    if snapshot.demand.resources or snapshot.demand.gangs or snapshot.demand.constraints:
        return None
    if snapshot.capacity_signals:
        return None
    config = snapshot.config
    now_s = snapshot.now_s
    worst_backoff_s = config.backoff_cap_s * (1.0 + config.backoff_jitter)
    if any(f.last_failure_s + worst_backoff_s >= now_s for f in snapshot.launch_failures.values()):
        return None
    timeouts_s = {shape.group: shape.idle_timeout_s for shape in snapshot.shapes}
    deadlines_s = [float("inf")]
    for replica in snapshot.replicas:
        timeout_s = timeouts_s.get(replica.group)
        if timeout_s is None or not replica.identified or replica.outdated:
            return None
        if replica.state is ReplicaState.DRAINING:
            continue  # no capacity, no health check: nothing about it waits on time
        if replica.state is not ReplicaState.RUNNING or not replica.hosts:
            return None
        for host in replica.hosts:
            if not host.registered or host.registered_at_s is None:
                return None
            deadlines_s.append(host.registered_at_s + config.registration_settle_s)
        # The policy compares a replica's idle time (its least idle host's) with the
        # timeout; below it, its rank among idle replicas does not change with time.
        idle_s = min(host.idle_s for host in replica.hosts)
        if idle_s > 0:
            deadlines_s.append(now_s + timeout_s - idle_s)
    return min(d for d in deadlines_s if d >= now_s)  # those passed have had their say


Fingerprint = tuple[int, tuple[object, ...]]


@dataclass
class QuietRounds:
    """Decides, round by round, whether the autoscaler's round may be left out.
    `fingerprint`: what the autoscaler would read, without the passing of time (taken
    only around rounds that follow a quiet-looking one: it costs a walk of every
    node, and a round after a busy one is seldom quiet)."""

    fingerprint: Callable[[], Fingerprint]
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
            if now_s < skip_before_s and self._before == read:
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
