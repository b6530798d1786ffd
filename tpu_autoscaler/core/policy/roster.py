"""The replicas of one pass's snapshot sorted once into what each rule of the pass
looks at: the health check only at replicas not known sound, idle removal only at
running ones with an idle host, the limits only at outdated ones and at groups that
may be above their max, the ledger at counts per group and state.

Each of those rules walked every replica of the snapshot on its own (about six walks
per pass, each about as costly as this one, at 1,024 slices); every rule still
decides on exactly the replicas it did, in the same order: a replica the roster
leaves out of a list is one the rule would have skipped at once (`health.check`,
`idle.idle_removals`, `limits.limit_removals`, `Ledger.count`,
`gang_arrival.incomplete_gangs`). Made from the snapshot alone, for one pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tpu_autoscaler.core.policy.health import SOUND_HOSTS
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import Replica, ReplicaState


class GroupCount:
    """A group's replicas by state, those removed this pass included."""

    __slots__ = ("draining", "in_flight", "running")

    def __init__(self) -> None:
        self.running = 0
        self.in_flight = 0
        """Requested or pending."""
        self.draining = 0

    @property
    def total(self) -> int:
        return self.running + self.in_flight + self.draining

    @property
    def not_draining(self) -> int:
        return self.running + self.in_flight


class Roster:
    def __init__(self, replicas: Sequence[Replica], shapes: Mapping[str, SliceShape]) -> None:
        self.counts: dict[str, GroupCount] = {}
        """Per group of `shapes`, in the order the snapshot first lists one of it."""
        self.unsound: list[Replica] = []
        """Replicas of `shapes`' groups not known sound (`health.check`): every one
        the check does not skip at once."""
        self.pending: list[Replica] = []
        """PENDING replicas of `shapes`' groups."""
        self.idle: list[Replica] = []
        """RUNNING replicas of `shapes`' groups idle longer than the least idle
        timeout of any group (0 at most): every one idle removal may take."""
        self.outdated: list[Replica] = []
        """Outdated replicas of `shapes`' groups."""
        self.live: list[Replica] = []
        """Replicas of `shapes`' groups not draining: those the ledger calls usable
        while nothing is removed."""
        least_timeout_s = min([0.0, *(s.idle_timeout_s for s in shapes.values())])
        counts = self.counts
        unsound, idle, live = self.unsound, self.idle, self.live
        running, draining, pending = (
            ReplicaState.RUNNING,
            ReplicaState.DRAINING,
            ReplicaState.PENDING,
        )
        expected: dict[str, int] = {g: s.hosts_per_replica for g, s in shapes.items()}
        for replica in replicas:
            group = replica.group
            count = counts.get(group)
            if count is None:
                if group not in expected:
                    continue
                count = counts[group] = GroupCount()
            state = replica.state
            memo = replica.memo
            sound = memo.get(SOUND_HOSTS)
            # `health.check`'s first test: a sound replica is skipped whatever the time.
            if not (isinstance(sound, int) and sound >= expected[group]):
                unsound.append(replica)
            if state is running:
                count.running += 1
                live.append(replica)
                if replica.least_idle_s > least_timeout_s:
                    idle.append(replica)
            elif state is draining:
                count.draining += 1
            else:
                count.in_flight += 1
                live.append(replica)
                if state is pending:
                    self.pending.append(replica)
            if replica.outdated:
                self.outdated.append(replica)
