"""How many replicas each group has and may still launch, and the launches of one
pass: maxReplicas, the cluster's max worker hosts, a group stocked out or backing off
(`capacity.py`) and the upscaling mode as limits; a launch adds replicas to the scratch
capacity and a withdrawal takes back those nothing was placed on; minReplicas
topped up."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpu_autoscaler.core.capacity import GroupCapacity
from tpu_autoscaler.core.plan import Launch
from tpu_autoscaler.core.policy.scratch import Scratch
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import SlotReplica
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Hosts, Replicas

if TYPE_CHECKING:
    from tpu_autoscaler.core.policy.roster import Roster

NONE = Replicas(0)


@dataclass
class WorkerBudget:
    """The cluster-wide max worker hosts (Ray's `max_workers`) and the hosts that
    count toward it: every replica not removed this pass, and the pass's launches."""

    max_hosts: Hosts | None = None
    hosts: int = 0

    def replicas_left(self, shape: SliceShape) -> Replicas | None:
        """Whole replicas of `shape` that still fit; None without a cluster-wide max."""
        if self.max_hosts is None:
            return None
        return Replicas(max(0, (self.max_hosts - self.hosts) // shape.hosts_per_replica))


@dataclass
class GroupLedger:
    shape: SliceShape
    existing: Replicas = NONE
    """Replicas that count toward maxReplicas: all but those removed this pass."""
    healthy: Replicas = NONE
    """Replicas that count toward minReplicas: existing and not draining."""
    running: Replicas = NONE
    in_flight: Replicas = NONE
    """Requested or pending: launched earlier, not up yet."""
    new: Replicas = NONE
    launch_reasons: Counter[str] = field(default_factory=Counter)
    gang_replicas: dict[str, tuple[Replicas, ...]] = field(default_factory=dict)
    """Reasons of launches for gangs of several replicas, and the replicas each gang
    of one launch for the reason needs at once (a reason names the demand and the
    group's count for it, so the same each time)."""
    backoff_until: float | None = None
    budget: WorkerBudget = field(default_factory=WorkerBudget)
    """Shared by every group of the ledger."""
    availability: float = 1.0
    """How likely a launch is to be allocated (`ClusterSnapshot.availability`)."""
    churning: bool = False
    """Its slices keep getting preempted soon after they arrive (`churn.py`): new
    demand prefers a steadier group."""
    capacity: GroupCapacity | None = None
    """Stocked out or backing off (`policy/capacity.py`): no new launch until it ends."""

    @property
    def headroom(self) -> Replicas:
        return Replicas(max(0, self.shape.max_replicas - self.existing - self.new))

    def rate_limit(self) -> Replicas | None:
        """Conservative mode: replicas in flight (earlier and new) at most as many as
        running ones, at least one, so a slow provisioner is not flooded."""
        if self.shape.upscaling_mode != "Conservative":
            return None
        return Replicas(max(0, max(1, self.running) - self.in_flight - self.new))

    def grows_later(self, now_s: float) -> bool:
        """A limit that lifts by itself holds it back: backoff, conservative upscaling."""
        backing_off = self.backoff_until is not None and self.backoff_until > now_s
        return backing_off or self.rate_limit() is not None

    def limit(self, now_s: float) -> tuple[Replicas, str | None]:
        """How many more replicas the group may launch now, and why not more."""
        group = self.shape.group
        if self.capacity is not None and (self.capacity.until_s or now_s + 1) > now_s:
            return Replicas(0), f"{group} {self.capacity.reason}; waiting on capacity"
        if self.backoff_until is not None and self.backoff_until > now_s:
            return Replicas(0), (
                f"{group} backs off after provisioning timeouts until "
                f"t={self.backoff_until:.0f}s; waiting on capacity"
            )
        limit, why = self.headroom, f"{group} at maxReplicas {self.shape.max_replicas}"
        cluster = self.budget.replicas_left(self.shape)
        if cluster is not None and cluster < limit:
            limit, why = (
                cluster,
                f"the cluster is at its max of {self.budget.max_hosts} worker hosts",
            )
        rate = self.rate_limit()
        if rate is not None and rate < limit:
            limit, why = (
                rate,
                f"{group} upscales Conservatively (at most {max(1, self.running)} new per round)",
            )
        return limit, why


@dataclass(frozen=True, slots=True)
class LedgerMark:
    launches: Mapping[str, tuple[Replicas, Counter[str]]]
    budget_hosts: int


class Ledger:
    def __init__(
        self,
        shapes: Iterable[SliceShape],
        now_s: float,
        scratch: Scratch,
        backoff_until: Mapping[str, float],
        max_worker_hosts: Hosts | None = None,
        availability: Mapping[str, float] | None = None,
        churning: Collection[str] = (),
        capacity: Mapping[str, GroupCapacity] | None = None,
    ) -> None:
        self.budget = WorkerBudget(max_worker_hosts)
        known = availability or {}
        self.groups = {
            s.group: GroupLedger(s, budget=self.budget, availability=known.get(s.group, 1.0))
            for s in shapes
        }
        for group in churning:
            self.groups[group].churning = True
        for group, until in backoff_until.items():
            self.groups[group].backoff_until = until
        for group, state in (capacity or {}).items():
            self.groups[group].capacity = state
            if state.until_s is not None:
                # Lifts by itself, as a backoff does (`grows_later`).
                previous = self.groups[group].backoff_until or state.until_s
                self.groups[group].backoff_until = max(previous, state.until_s)
        self.now_s = now_s
        self.scratch = scratch
        self.launch_calls = 0
        """Launches so far: capacity only grows with one, so what failed to fit since
        the last one fails again."""
        self._new_names = itertools.count()

    def count(
        self, replicas: Iterable[Replica], removed: set[str], roster: Roster | None = None
    ) -> list[Replica]:
        """Count the replicas that stay; the usable ones (not draining). `roster`:
        that of `replicas`, if the caller has it: with nothing removed, its counts."""
        if roster is not None and not removed:
            return self._count_roster(roster)
        usable = []
        tallies: dict[str, list[int]] = {}
        """Per group: existing, healthy, running, in flight (counted in plain ints and
        added once: a call per replica per count was a third of the count)."""
        groups = self.groups
        draining, running = ReplicaState.DRAINING, ReplicaState.RUNNING
        requested, pending = ReplicaState.REQUESTED, ReplicaState.PENDING
        for replica in replicas:
            tally = tallies.get(replica.group)
            if tally is None:
                if replica.group not in groups:
                    continue
                tally = tallies[replica.group] = [0, 0, 0, 0]
            if replica.name in removed:
                continue
            tally[0] += 1
            state = replica.state
            if state is draining:
                continue
            tally[1] += 1
            if state is running:
                tally[2] += 1
            elif state is requested or state is pending:
                tally[3] += 1
            usable.append(replica)
        for group, (existing, healthy, running_count, in_flight) in tallies.items():
            ledger = groups[group]
            ledger.existing = Replicas(ledger.existing + existing)
            ledger.healthy = Replicas(ledger.healthy + healthy)
            ledger.running = Replicas(ledger.running + running_count)
            ledger.in_flight = Replicas(ledger.in_flight + in_flight)
            self.budget.hosts += existing * ledger.shape.hosts_per_replica
        return usable

    def _count_roster(self, roster: Roster) -> list[Replica]:
        """`count` with nothing removed, from the roster's counts (the same groups in
        the same order: those of the ledger the replicas name)."""
        groups = self.groups
        for group, count in roster.counts.items():
            ledger = groups.get(group)
            if ledger is None:
                continue
            ledger.existing = Replicas(ledger.existing + count.total)
            ledger.healthy = Replicas(ledger.healthy + count.not_draining)
            ledger.running = Replicas(ledger.running + count.running)
            ledger.in_flight = Replicas(ledger.in_flight + count.in_flight)
            self.budget.hosts += count.total * ledger.shape.hosts_per_replica
        return list(roster.live)

    def limit(self, group: str) -> tuple[Replicas, str | None]:
        return self.groups[group].limit(self.now_s)

    def mark(self) -> LedgerMark:
        """The launches so far, to `restore` if what they were for is given up."""
        return LedgerMark(
            {g: (s.new, Counter(s.launch_reasons)) for g, s in self.groups.items()},
            self.budget.hosts,
        )

    def restore(self, mark: LedgerMark) -> None:
        """Launches back to `mark` (their replicas are the caller's to take back)."""
        for group, (new, reasons) in mark.launches.items():
            self.groups[group].new = new
            self.groups[group].launch_reasons = Counter(reasons)
        self.budget.hosts = mark.budget_hosts

    def launch(
        self, group: str, count: int, reason: str, times: int = 1, gangs: tuple[int, ...] = ()
    ) -> list[SlotReplica]:
        """Launch `count` replicas of `group` for `reason` (`times` demand items);
        `gangs`: of each item's `count // times` replicas, those needed all at once
        (`Launch.gangs`)."""
        state = self.groups[group]
        if any(size > 1 for size in gangs):
            state.gang_replicas[reason] = tuple(Replicas(n) for n in gangs if n > 1)
        added = []
        for _ in range(count):
            added += self.scratch.add_new(state.shape, f"{group}+new{next(self._new_names)}")
        state.new = Replicas(state.new + count)
        self.budget.hosts += count * state.shape.hosts_per_replica
        self.launch_calls += 1
        state.launch_reasons[reason] += times
        return added

    def withdraw(
        self, group: str, replicas: list[SlotReplica], reason: str, per_batch: int
    ) -> None:
        """Take back launches nothing was placed on: they keep no capacity."""
        unused = {r.name for r in replicas} - {r.name for r in replicas if r.used}
        if not unused:
            return
        for replica in replicas:
            if replica.name in unused:
                for host in replica.hosts:
                    host.free = {}
        state = self.groups[group]
        state.new = Replicas(state.new - len(unused))
        self.budget.hosts -= len(unused) * state.shape.hosts_per_replica
        state.launch_reasons[reason] -= len(unused) // per_batch
        state.launch_reasons += Counter()  # drops reasons counted down to zero

    def top_up_min_replicas(self) -> None:
        for state in self.groups.values():
            if state.capacity is not None:
                continue  # stocked out or backing off: no launch, not even for minReplicas
            missing = state.shape.min_replicas - state.healthy
            cluster = state.budget.replicas_left(state.shape)
            room = state.headroom if cluster is None else min(state.headroom, cluster)
            if missing > 0 and room > 0:
                self.launch(
                    state.shape.group,
                    min(missing, room),
                    f"minReplicas {state.shape.min_replicas}, has {state.healthy}",
                )

    def launches(self) -> tuple[Launch, ...]:
        return tuple(
            Launch(g.shape.group, g.new, _count_reasons(g.launch_reasons), _gangs(g))
            for g in self.groups.values()
            if g.new
        )


def _gangs(state: GroupLedger) -> tuple[Replicas, ...]:
    """The gangs among the group's launches, as many as its replicas hold whole (a
    batch partly taken back may leave a reason counted for replicas no longer new)."""
    gangs: list[Replicas] = []
    left = state.new
    for reason, n in state.launch_reasons.items():
        for size in state.gang_replicas.get(reason, ()) * n:
            if size <= left:
                gangs.append(size)
                left = Replicas(left - size)
    return tuple(gangs)


def _count_reasons(reasons: Counter[str]) -> str:
    return "; ".join(f"{n} x {reason}" if n > 1 else reason for reason, n in reasons.items())
