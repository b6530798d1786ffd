"""The capacity a pass places demand on: a scratch copy of every usable replica's
hosts (`World`), and a second one of total capacity for `request_resources`.

Nodes that are no replica (the head) enter first, then replicas running, pending,
requested, oldest first, so demand lands on what exists before anything new. Hosts
not up yet carry the capacity and labels Ray will give them; hosts that joined Ray
moments ago offer their total (`health`).

The existing capacity is built on first use (`Scratch.world`): a pass with nothing to
place (most rounds of a quiet cluster) never builds a host of it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, eq, is_
from typing import cast

from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.policy.health import last_joined_s
from tpu_autoscaler.core.policy.resizing import offered_while_resizing
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import HostCapacity, KeptReplica, SlotReplica, fresh_hosts
from tpu_autoscaler.core.snapshot import Host, PolicyConfig, Replica, ReplicaState

FIXED_GROUP = ""
"""The group of a node that is no replica (the head): no group's ledger has it."""

_LAST_JOINED = "last joined"
"""`Replica.memo` key: when its newest host joined Ray (None: none has)."""
_UNKNOWN = object()
_LAST_BUILD = "last build"
"""`Replica.memo` key: the build that began with it (`_LastBuild`)."""

_STATE_ORDER = (ReplicaState.RUNNING, ReplicaState.PENDING, ReplicaState.REQUESTED)
_BY_AGE = attrgetter("created_at_s", "name")
_CREATED_AT_S = attrgetter("created_at_s")


def _in_world_order(usable: Sequence[Replica]) -> list[Replica]:
    """Running before pending before requested, oldest first (then by name): sorted
    by age with a key made in C, then split by state, which keeps that order (a key
    function per replica per pass was a sixth of the build at 1,024 slices).

    By creation time alone while no two replicas share one (the usual case: times
    are taken per replica): the sort then compares floats, not (time, name) tuples
    (40% of the sort at 1,024 slices); a tie sorts again by both."""
    by_age = sorted(usable, key=_CREATED_AT_S)
    ages = list(map(_CREATED_AT_S, by_age))
    if any(map(eq, ages, islice(ages, 1, None))):
        by_age.sort(key=_BY_AGE)
    in_order = [r for state in _STATE_ORDER for r in by_age if r.state is state]
    if len(in_order) != len(by_age):
        raise ValueError("a draining replica has no capacity to build")
    return in_order


class Scratch:
    def __init__(self, constrained: bool) -> None:
        self._world = World()
        self._capacity_world = World()
        self.constrained = constrained
        self.slice_names: set[str] = set()
        """Slices that exist (by `TPU_NAME`): what a pinned bundle can name."""
        self._shapes_compared: dict[tuple[int, int], bool] = {}
        self._unbuilt: list[_Existing | _Fixed] | None = []
        """Existing capacity added but not built yet, in order; None once the world is
        built (`world`): what is added after that is built at once."""

    @property
    def world(self) -> World:
        """The capacity demand is placed on, existing capacity built on first use."""
        self._build_unbuilt()
        return self._world

    @property
    def capacity_world(self) -> World:
        """Total capacity, for `request_resources`; built only when there are any."""
        self._build_unbuilt()
        return self._capacity_world

    def _build_unbuilt(self) -> None:
        if self._unbuilt is not None:
            unbuilt, self._unbuilt = self._unbuilt, None
            for existing in unbuilt:
                self._build(existing)

    def _build(self, existing: _Existing | _Fixed) -> None:
        if isinstance(existing, _Fixed):
            self._add_fixed(existing.hosts)
        else:
            self._add_existing(existing.replicas, existing.shapes, existing.config, existing.now_s)

    def _add(self, existing: _Existing | _Fixed) -> None:
        if self._unbuilt is None:
            self._build(existing)
        else:
            self._unbuilt.append(existing)

    def add_fixed(self, hosts: Sequence[Host]) -> None:
        """Nodes that are no replica (the head): capacity that exists, first in line.
        Each is a replica of its own that no group owns, so nothing removes it."""
        if hosts:
            self._add(_Fixed(hosts))

    def _add_fixed(self, hosts: Sequence[Host]) -> None:
        for host in hosts:
            offered = [(host.labels, host.total, host.available)]
            self._world.add_replica(SlotReplica(FIXED_GROUP, host.pod_name, False, None), offered)
            if self.constrained:
                capacity = [(host.labels, host.total, host.total)]
                self._capacity_world.add_replica(
                    SlotReplica(FIXED_GROUP, host.pod_name, False, None), capacity
                )

    def add_existing(
        self,
        usable: Iterable[Replica],
        shapes: dict[str, SliceShape],
        config: PolicyConfig,
        now_s: float,
    ) -> None:
        """`usable` replicas: their slices exist from now on, their hosts are built
        with the world."""
        usable = list(usable)
        self.slice_names.update([r.slice_name for r in usable if r.slice_name])
        if usable:
            self._add(_Existing(usable, shapes, config, now_s))

    def _add_existing(
        self,
        usable: Sequence[Replica],
        shapes: dict[str, SliceShape],
        config: PolicyConfig,
        now_s: float,
    ) -> None:
        """Running before pending before requested, oldest first. The replicas the
        last build began with, in the same order, take the pieces it used (`_LastBuild`);
        the rest are looked up one by one."""
        world = self._world
        settle_s = config.registration_settle_s
        compared = self._shapes_compared
        in_order = _in_world_order(usable)
        if not in_order:
            return
        reused = self._reused_prefix(in_order, shapes, settle_s, now_s)
        reused = reused[: world.add_kept_run(reused)]
        # What this build took, for the next (`_LastBuild`): each replica's pieces, and
        # how far the next may take them without looking (settled, kept, taken).
        taken: list[KeptReplica] = list(reused)
        recording = True
        capacities = [kept.capacity for kept in reused]
        for replica in in_order[len(reused) :]:
            shape = shapes[replica.group]
            # `_offered_kept`'s usual answer, inlined (every replica of every build):
            # kept on the replica for this shape, none of its hosts joined lately.
            memo = replica.memo
            joined_at_s = memo.get(_LAST_JOINED, _UNKNOWN)
            offered = (
                memo.get(True)
                if joined_at_s is None
                or (isinstance(joined_at_s, float) and now_s - joined_at_s >= settle_s)
                else None
            )
            if not isinstance(offered, _Offered) or (
                offered.shape is not shape
                # `_same_shape`, inlined: adapters build the shapes anew each round.
                and not compared.get((id(offered.shape), id(shape)))
                and not self._same_shape(offered.shape, shape)
            ):
                offered = self._offered_kept(replica, shape, config, now_s)
            hosts = offered.hosts
            capacities.append(hosts)
            kept = offered.kept
            if kept is None or not world.add_kept(kept):
                if kept is not None and kept.owner is world:
                    # The same replica twice in one world: a copy of its own.
                    world.add_replica(self._slot_replica(replica), hosts)
                    kept = None
                else:
                    # Built once; a world that was never released holds the pieces
                    # before: it keeps them, the replica keeps new ones.
                    kept = offered.kept = KeptReplica(self._slot_replica(replica), hosts)
                    world.add_kept(kept)
            if recording:
                # Settled: `_offered_kept` answers by whether it is, from memo[True].
                if kept is None or offered is not memo.get(True):
                    recording = False
                else:
                    taken.append(kept)
        in_order[0].memo[_LAST_BUILD] = _LastBuild(
            in_order[1 : len(taken)], taken, now_s, settle_s, shapes
        )
        if self.constrained:
            for replica, hosts in zip(in_order, capacities, strict=True):
                capacity = [(labels, total, total) for labels, total, _ in hosts]
                self._capacity_world.add_replica(
                    SlotReplica(replica.group, replica.name, False, replica.slice_name), capacity
                )

    def _reused_prefix(
        self,
        in_order: list[Replica],
        shapes: dict[str, SliceShape],
        settle_s: float,
        now_s: float,
    ) -> list[KeptReplica]:
        """The pieces the last build that began with `in_order[0]` took for the
        replicas `in_order` begins with still (the same objects, in the same places),
        as far as they are still what `_offered_kept` would give: each replica's were
        worked out from the replica alone, its shape and whether it was settled; the
        shapes are equal, and those replicas were settled then and stay so (time
        does not go back). The world's own checks (`add_kept`) hold as for any."""
        last = in_order[0].memo.get(_LAST_BUILD)
        if not (isinstance(last, _LastBuild) and last.settle_s == settle_s and last.now_s <= now_s):
            return []
        for group, shape in last.shapes.items():
            current = shapes.get(group)
            if current is None or not (current is shape or self._same_shape(shape, current)):
                return []
        rest, kept = last.rest, last.kept
        # The first replica differing from the last build's, found in C.
        same = list(map(is_, in_order[1 : len(kept)], rest))
        upto = 1 + same.index(False) if False in same else min(len(kept), len(in_order))
        return kept[:upto]

    @staticmethod
    def _slot_replica(replica: Replica) -> SlotReplica:
        return SlotReplica(replica.group, replica.name, False, replica.slice_name)

    def _offered_kept(
        self, replica: Replica, shape: SliceShape, config: PolicyConfig, now_s: float
    ) -> _Offered:
        """What each host of `replica` offers (read-only: `World.add_replica` copies what
        it changes), and the scratch pieces built from it once (`KeptReplica`). It
        depends on the replica, its shape and whether it is settling only, so it is
        worked out once per replica and kept on it (`Replica.memo`) while its shape
        stays the same."""
        memo = replica.memo
        joined_at_s = memo.get(_LAST_JOINED, _UNKNOWN)
        if joined_at_s is _UNKNOWN:
            joined_at_s = memo[_LAST_JOINED] = last_joined_s(replica)
        # `health.settling`, on the kept time the newest host joined.
        settled = (
            joined_at_s is None or now_s - cast(float, joined_at_s) >= config.registration_settle_s
        )
        known = memo.get(settled)
        if isinstance(known, _Offered) and (
            known.shape is shape or self._same_shape(known.shape, shape)
        ):
            return known
        offered = memo[settled] = _Offered(shape, self._offered(replica, shape, settled))
        return offered

    def _same_shape(self, kept: SliceShape, shape: SliceShape) -> bool:
        """`kept == shape`, compared once per pair of objects (adapters build the shapes
        anew each round)."""
        key = (id(kept), id(shape))
        same = self._shapes_compared.get(key)
        if same is None:
            same = self._shapes_compared[key] = kept == shape
        return same

    def _offered(self, replica: Replica, shape: SliceShape, settled: bool) -> list[HostCapacity]:
        # `Host.registered`, inlined: this runs for every host of every replica.
        real = {h.host_index: h for h in replica.hosts if h.node_id is not None and not h.dead}
        if not real:  # nothing up yet (a requested replica): every host synthesized
            return list(self._synthesized(replica, shape))

        def offered(host: Host) -> HostCapacity:
            capacity = (host.labels, host.total, host.available if settled else host.total)
            return offered_while_resizing(host, shape, capacity)

        if len(real) == shape.hosts_per_replica:
            if shape.resize is None:  # `offered` without a call per host: nothing resizes
                return [
                    (h.labels, h.total, h.available if settled else h.total)
                    for _, h in sorted(real.items())
                ]
            return [offered(h) for _, h in sorted(real.items())]
        synthesized = self._synthesized(replica, shape)
        return [offered(real[i]) if i in real else host for i, host in enumerate(synthesized)]

    def _synthesized(self, replica: Replica, shape: SliceShape) -> list[HostCapacity]:
        """Hosts not up yet count at full capacity with the labels Ray will give them."""
        if replica.slice_name is not None:
            return fresh_hosts(shape, replica.slice_name)
        return self._world.fresh(shape)

    def add_new(self, shape: SliceShape, name: str) -> list[SlotReplica]:
        """A replica this pass launches, in every world it keeps."""
        added = [self.world.add_new_replica(shape, name)]
        if self.constrained:
            added.append(self._capacity_world.add_new_replica(shape, name))
        return added

    def release(self) -> None:
        """The pass is over: its worlds' hosts and replicas may go (`World.release`)."""
        self._unbuilt = None
        self._world.release()
        self._capacity_world.release()

    def new_replicas(self) -> list[SlotReplica]:
        """The replicas this pass launched (withdrawn ones too); builds nothing."""
        return [r for r in self._world.replicas if r.new]

    def used(self) -> set[str]:
        """Replicas some demand was placed on this pass: none of them may go. Capacity
        not built yet had nothing placed on it."""
        used = {r.name for r in self._world.replicas if r.used}
        used |= {r.name for r in self._capacity_world.replicas if r.used}
        return used


@dataclass(frozen=True, slots=True)
class _LastBuild:
    """`Replica.memo` of the first replica of a build (`_add_existing`): the replicas
    after it and the pieces the build took for each, as far as they were settled and
    kept; when, and under which settling time and shapes.

    Right against a real API server and GCS: the next build takes a replica's pieces
    from it only for the very objects, in the very places, and a replica object is
    the same only while nothing of it changed (the adapters keep an unchanged pod's
    and node's parse by resourceVersion and bytes); objects decoded anew are never
    the same, and the next build then looks every replica up (`_reused_prefix`)."""

    rest: list[Replica]
    kept: list[KeptReplica]
    now_s: float
    settle_s: float
    shapes: dict[str, SliceShape]


@dataclass(frozen=True, slots=True)
class _Existing:
    """Replicas `Scratch.add_existing` took, for `Scratch.world` to build."""

    replicas: Sequence[Replica]
    shapes: dict[str, SliceShape]
    config: PolicyConfig
    now_s: float


@dataclass(frozen=True, slots=True)
class _Fixed:
    """Nodes `Scratch.add_fixed` took, for `Scratch.world` to build."""

    hosts: Sequence[Host]


class _Offered:
    """`Replica.memo`, by whether the replica is settled: what its hosts offer, for
    replicas of `shape`, and the scratch pieces built from that once the world is
    built (`KeptReplica`)."""

    __slots__ = ("hosts", "kept", "shape")

    def __init__(self, shape: SliceShape, hosts: list[HostCapacity]) -> None:
        self.shape = shape
        self.hosts = hosts
        self.kept: KeptReplica | None = None
