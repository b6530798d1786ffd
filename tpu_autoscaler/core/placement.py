"""Which demand fits where: a mutable scratch copy of the cluster's free capacity,
private to one planning pass, on which bundles are placed first-fit.

Hosts are ordered running, pending, requested, then replicas this pass adds, so
demand lands on capacity that exists before anything is launched. For each distinct
bundle the pass remembers which hosts match its selector and a cursor past the
prefix that cannot fit it: free capacity only shrinks during a pass (a gang that
fails is rolled back exactly), so placement is linear in hosts per bundle kind,
not per bundle.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import (
    RESOURCE_EPSILON,
    Bundle,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    copies_that_fit,
    selector_matches,
)
from tpu_autoscaler.core.shape import SliceShape

HostCapacity = tuple[Mapping[str, str], Mapping[str, float], Mapping[str, float]]
"""A host's labels, total resources and free resources."""


class SlotReplica:
    """A replica as the pass sees it: existing, or added by this pass (`new`)."""

    __slots__ = ("claimed", "group", "hosts", "index", "name", "new", "slice_name", "used")

    def __init__(self, group: str, name: str, new: bool, slice_name: str | None) -> None:
        self.group = group
        self.name = name
        self.new = new
        self.slice_name = slice_name
        self.hosts: list[SlotHost] = []
        self.index = -1
        """Its place in the world's replica order."""
        self.used = False
        """Some demand was placed on it this pass: it must stay."""
        self.claimed = False
        """Reserved by a slice head bundle (stage one of slice_placement_group): its
        TPUs are held for the per-host gang that follows."""


class SlotHost:
    __slots__ = ("free", "index", "labels", "position", "replica", "total")

    def __init__(
        self,
        replica: SlotReplica,
        index: int,
        host_labels: Mapping[str, str],
        total: Mapping[str, float],
        free: dict[str, float],
    ) -> None:
        self.replica = replica
        self.index = index
        self.labels = host_labels
        self.total = total
        self.free = free
        self.position = -1

    @property
    def untouched(self) -> bool:
        """Nothing uses its TPUs: a slice gang could still take it."""
        tpu = self.total.get(labels.TPU_RESOURCE, 0.0)
        return self.free.get(labels.TPU_RESOURCE, 0.0) + RESOURCE_EPSILON >= tpu

    def fits(self, resources: Mapping[str, float]) -> bool:
        free = self.free
        for name, amount in resources.items():
            if free.get(name, 0.0) + RESOURCE_EPSILON < amount:
                return False
        return True

    def copies_that_fit(self, resources: Mapping[str, float]) -> int:
        return copies_that_fit(self.free, resources)

    def take(self, resources: Mapping[str, float], copies: int = 1) -> None:
        free = self.free
        for name, amount in resources.items():
            free[name] = free.get(name, 0.0) - amount * copies
        self.replica.used = True


@dataclass(slots=True)
class _Candidates:
    """Hosts matching one bundle kind's selector, and the cursor past those that are full."""

    positions: list[int] = field(default_factory=list)
    scanned_upto: int = 0
    cursor: int = 0


def merged_bundle(bundles: Iterable[Bundle]) -> Bundle:
    """All bundles on one host (STRICT_PACK): resources summed, selectors combined."""
    resources: dict[str, float] = {}
    selector: list[LabelConstraint] = []
    for bundle in bundles:
        for name, amount in bundle.resources.items():
            resources[name] = resources.get(name, 0.0) + amount
        selector.extend(c for c in bundle.selector if c not in selector)
    return Bundle(resources, tuple(selector))


class World:
    """Free capacity of every usable host, and the placements made on it so far."""

    def __init__(self) -> None:
        self.hosts: list[SlotHost] = []
        self.replicas: list[SlotReplica] = []
        self._candidates: dict[object, _Candidates] = {}
        # While a gang is tried: what to restore if it does not fit.
        self._undo: list[tuple[SlotHost, Mapping[str, float], bool]] | None = None
        self._cursor_undo: dict[int, tuple[_Candidates, int]] | None = None
        self._claim_undo: list[SlotReplica] | None = None
        self._head_cursor: dict[object, int] = {}
        """Per head bundle kind, the replicas before this index cannot take it."""
        self._fresh: dict[str, list[HostCapacity]] = {}

    # --- building ---------------------------------------------------------------

    def add_replica(self, replica: SlotReplica, hosts: Iterable[HostCapacity]) -> None:
        replica.index = len(self.replicas)
        self.replicas.append(replica)
        for index, (host_labels, total, free) in enumerate(hosts):
            host = SlotHost(replica, index, host_labels, total, dict(free))
            host.position = len(self.hosts)
            replica.hosts.append(host)
            self.hosts.append(host)

    def fresh(self, shape: SliceShape) -> list[HostCapacity]:
        """The hosts of an unnamed replica of `shape` not up yet, built once per group
        (read-only: `add_replica` copies what it changes)."""
        hosts = self._fresh.get(shape.group)
        if hosts is None:
            hosts = self._fresh[shape.group] = fresh_hosts(shape)
        return hosts

    def add_new_replica(self, shape: SliceShape, name: str) -> SlotReplica:
        replica = SlotReplica(shape.group, name, new=True, slice_name=None)
        self.add_replica(replica, self.fresh(shape))
        return replica

    def fork(self) -> int:
        """A mark to `revert` to: replicas added after it are a trial."""
        return len(self.replicas)

    @contextmanager
    def trial(self, additions: Iterable[tuple[SliceShape, int]]) -> Iterator[None]:
        """Capacity as if `additions` (shape, replicas) were launched, for the block
        only: the replicas are taken out after it, with whatever was placed on them
        (cluster-autoscaler's Fork/Revert; a launch through the ledger commits)."""
        mark = self.fork()
        for shape, count in additions:
            for index in range(count):
                self.add_new_replica(shape, f"{shape.group}+trial{index}")
        try:
            yield
        finally:
            self.revert(mark)

    def revert(self, mark: int) -> None:
        """Drop the replicas added after `mark` (`fork`'s): a trial that lost."""
        dropped = self.replicas[mark:]
        if not dropped:
            return
        first_position = dropped[0].hosts[0].position if dropped[0].hosts else len(self.hosts)
        del self.replicas[mark:]
        del self.hosts[first_position:]
        for key, cursor in self._head_cursor.items():
            self._head_cursor[key] = min(cursor, mark)
        for cands in self._candidates.values():
            if cands.scanned_upto > first_position:
                while cands.positions and cands.positions[-1] >= first_position:
                    cands.positions.pop()
                cands.scanned_upto = first_position
                cands.cursor = min(cands.cursor, len(cands.positions))

    # --- matching ---------------------------------------------------------------

    def _matching(self, selector: LabelSelector) -> _Candidates:
        cands = self._candidates.get(selector)
        if cands is None:
            cands = _Candidates()
            self._candidates[selector] = cands
        if cands.scanned_upto < len(self.hosts):
            for host in self.hosts[cands.scanned_upto :]:
                if selector_matches(selector, host.labels):
                    cands.positions.append(host.position)
            cands.scanned_upto = len(self.hosts)
        return cands

    def _cursor_key(self, bundle: Bundle) -> _Candidates:
        """Per bundle kind cursor state, sharing the selector's host list."""
        key = bundle.key
        cands = self._candidates.get(key)
        base = self._matching(bundle.selector)
        if cands is None:
            cands = _Candidates(positions=base.positions, scanned_upto=base.scanned_upto)
            self._candidates[key] = cands
        else:
            cands.positions = base.positions
            cands.scanned_upto = base.scanned_upto
        return cands

    def _advance(self, cands: _Candidates, to: int) -> None:
        if to != cands.cursor:
            if self._cursor_undo is not None and id(cands) not in self._cursor_undo:
                self._cursor_undo[id(cands)] = (cands, cands.cursor)
            cands.cursor = to

    def first_fit(self, bundle: Bundle, avoid: set[int] | None = None) -> SlotHost | None:
        """The first host that matches and has room, skipping positions in `avoid`."""
        cands = self._cursor_key(bundle)
        positions = cands.positions
        hosts = self.hosts
        i = cands.cursor
        prefix_full = True
        while i < len(positions):
            host = hosts[positions[i]]
            if host.fits(bundle.resources):
                if avoid is None or host.position not in avoid:
                    return host
                prefix_full = False
            elif prefix_full:
                self._advance(cands, i + 1)
            i += 1
        return None

    def take(self, host: SlotHost, resources: Mapping[str, float]) -> None:
        """Place one bundle on `host`, chosen elsewhere (the exact search)."""
        self._take(host, resources)

    def _take(self, host: SlotHost, resources: Mapping[str, float], copies: int = 1) -> None:
        if self._undo is not None:
            self._undo.append((host, dict(host.free), host.replica.used))
        host.take(resources, copies)

    # --- placing ----------------------------------------------------------------

    def place_count(self, bundle: Bundle, count: int) -> int:
        """Place up to `count` copies of `bundle`; returns how many did not fit."""
        if bundle.head_resource is not None:
            while count and self._place_slice_head(bundle, avoid=set()):
                count -= 1
            return count
        cands = self._cursor_key(bundle)
        positions = cands.positions
        hosts = self.hosts
        i = cands.cursor
        while count and i < len(positions):
            host = hosts[positions[i]]
            copies = min(count, host.copies_that_fit(bundle.resources))
            if copies:
                self._take(host, bundle.resources, copies)
                count -= copies
            if count:
                i += 1
                self._advance(cands, i)
        return count

    def place_gang(self, gang: GangDemand) -> bool:
        """Reserve every bundle of `gang` or none, following Ray's strategies."""
        return self._gang(gang, keep=True)

    def gang_fits(self, gang: GangDemand) -> bool:
        """Whether `gang` would fit now; changes nothing."""
        return self._gang(gang, keep=False)

    def _gang(self, gang: GangDemand, keep: bool) -> bool:
        self._undo, self._cursor_undo, self._claim_undo = [], {}, []
        try:
            placed = self._try_gang(gang)
            if not (placed and keep):
                self._rollback()
            return placed
        finally:
            self._undo = self._cursor_undo = self._claim_undo = None

    def _try_gang(self, gang: GangDemand) -> bool:
        if gang.is_slice_head:
            used: set[int] = set()
            return all(self._place_slice_head(b, used) for b in gang.bundles)
        bundles = sorted(gang.bundles, key=_bundle_size, reverse=True)
        if gang.strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
            host = self.first_fit(merged_bundle(bundles))
            if host is not None:
                for b in bundles:
                    self._take(host, b.resources)
                return True
            if gang.strategy is GangStrategy.STRICT_PACK:
                return False
        # SPREAD is a preference in Ray, not a rule: for how much capacity a gang
        # needs it counts like PACK. Only STRICT_SPREAD needs distinct hosts.
        distinct = gang.strategy is GangStrategy.STRICT_SPREAD
        used = set()
        for b in bundles:
            host = self.first_fit(b, used if distinct else None)
            if host is None:
                return False
            used.add(host.position)
            self._take(host, b.resources)
        return True

    def _place_slice_head(self, bundle: Bundle, avoid: set[int]) -> bool:
        """A head bundle takes a whole unclaimed slice whose hosts are all free, so the
        per-host gang that slice_placement_group asks for next fits there."""
        head = bundle.head_resource
        start = self._head_cursor.get(bundle.key, 0)
        prefix_ineligible = True
        for index in range(start, len(self.replicas)):
            replica = self.replicas[index]
            host0 = replica.hosts[0] if replica.hosts else None
            eligible = (
                host0 is not None
                and not replica.claimed
                and head in host0.free
                and host0.fits(bundle.resources)
                and selector_matches(bundle.selector, host0.labels)
                and all(h.untouched for h in replica.hosts)
            )
            if not eligible:
                if prefix_ineligible:
                    self._head_cursor[bundle.key] = index + 1
                continue
            assert host0 is not None
            if host0.position in avoid:
                prefix_ineligible = False
                continue
            self._take(host0, bundle.resources)
            for host in replica.hosts:
                tpu = host.free.get(labels.TPU_RESOURCE, 0.0)
                if tpu > 0:
                    self._take(host, {labels.TPU_RESOURCE: tpu})
            replica.claimed = True
            replica.used = True
            if self._claim_undo is not None:
                self._claim_undo.append(replica)
            avoid.add(host0.position)
            return True
        return False

    def _rollback(self) -> None:
        """Undo the gang being tried: resources and claims exactly; cursors back to
        before the first host it touched (hosts that were full before stay skipped)."""
        assert (
            self._undo is not None
            and self._cursor_undo is not None
            and self._claim_undo is not None
        )
        earliest = len(self.hosts)
        while self._undo:
            host, free, used = self._undo.pop()
            host.free = dict(free)
            host.replica.used = used
            earliest = min(earliest, host.position)
        while self._claim_undo:
            self._claim_undo.pop().claimed = False
        for cands, first in self._cursor_undo.values():
            cands.cursor = max(first, min(cands.cursor, bisect_left(cands.positions, earliest)))
        if earliest < len(self.hosts):
            replica_index = self.hosts[earliest].replica.index
            for key, cursor in self._head_cursor.items():
                self._head_cursor[key] = min(cursor, replica_index)


def _bundle_size(bundle: Bundle) -> tuple[float, float, float]:
    r = bundle.resources
    return (r.get(labels.TPU_RESOURCE, 0.0), r.get("GPU", 0.0), r.get("CPU", 0.0))


def fresh_hosts(shape: SliceShape, slice_name: str | None = None) -> list[HostCapacity]:
    """The hosts of a replica not up yet: full capacity, the labels Ray will give them."""
    hosts: list[HostCapacity] = []
    for i in range(shape.hosts_per_replica):
        total = shape.host_resources(i, slice_name)
        hosts.append((shape.host_labels(i, slice_name), total, total))
    return hosts
