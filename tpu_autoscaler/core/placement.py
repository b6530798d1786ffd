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

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.cursors import Candidates, Journal, Matches
from tpu_autoscaler.core.demand import (
    RESOURCE_EPSILON,
    Bundle,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    offered,
    selector_matches,
)
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import (
    NOTHING_ASKED,
    HostCapacity,
    KeptReplica,
    SlotHost,
    SlotReplica,
    fresh_hosts,
)


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
        self._matches = Matches()
        self._journal: Journal | None = None
        """While a gang is tried: what to restore if it does not fit."""
        self._head_cursor: dict[object, int] = {}
        """Per head bundle kind, the replicas before this index cannot take it."""
        self._untouched: list[int] = []
        """The indexes of the replicas whose hosts' TPUs were all free when added,
        ascending: the only ones a slice head may take in this world (free capacity
        only shrinks, a gang taken back restores what was, and a resize in place grows
        CPU and memory only), so `place_heads` passes the busy slices of a cluster at
        work without looking at each (most of them in a burst at 1,024 slices)."""
        self._fresh: dict[str, list[HostCapacity]] = {}
        self._every_replica: list[SlotReplica] = []
        """Every replica ever added, trials too: what `release` unlinks."""
        self._kept: list[KeptReplica] = []
        """Kept replicas taken (`add_kept`): what `release` frees for the next world."""
        self._asked_and_tpu: dict[frozenset[str], frozenset[str]] = {}
        """A host's `asked` with TPU added, by what it was (`_place_slice_head`)."""
        self._asked_union: dict[tuple[frozenset[str], frozenset[str]], frozenset[str]] = {}
        """`_asked_with`'s sets, by the pair."""

    # --- building ---------------------------------------------------------------

    def add_replica(self, replica: SlotReplica, hosts: Iterable[HostCapacity]) -> None:
        replica.index = len(self.replicas)
        self.replicas.append(replica)
        self._every_replica.append(replica)
        all_hosts = self.hosts
        first = len(all_hosts)
        added = [
            SlotHost(replica, index, host_labels, total, dict(free), first + index)
            for index, (host_labels, total, free) in enumerate(hosts)
        ]
        if _untouched(added):
            self._untouched.append(replica.index)
        replica.hosts += added
        all_hosts += added

    def add_kept(self, kept: KeptReplica) -> bool:
        """Add a kept replica as `add_replica` would add a new `SlotReplica` with
        `kept.capacity`: nothing claimed or used, its hosts' free resources, totals (a
        resize grows them) and asks as offered. False, adding nothing, while another
        world, or this one, holds it (the caller then adds a copy).

        A replica the last world used or claimed nothing of has its hosts as offered
        still (whatever changes a host marks its replica used, and a gang taken back
        restores both), so only its hosts' positions may need setting: a round changes
        few replicas, and a pass costs what it placed on, not every host (a sixth of a
        plan at 1,024 slices)."""
        if kept.owner is not None:
            return False
        kept.owner = self
        self._kept.append(kept)
        replica = kept.replica
        hosts = kept.hosts
        position = len(self.hosts)
        if kept.unset or replica.used or replica.claimed:
            kept.unset = False
            replica.used = replica.claimed = False
            for host, (_, total, free) in zip(hosts, kept.capacity, strict=True):
                host.position = position
                host.total = total
                host.free = dict(free)
                host.asked = NOTHING_ASKED
                position += 1
        elif hosts and hosts[0].position != position:
            for host in hosts:
                host.position = position
                position += 1
        replica.index = len(self.replicas)
        replica.hosts = hosts
        if kept.untouched:
            self._untouched.append(replica.index)
        self.replicas.append(replica)
        self._every_replica.append(replica)
        self.hosts += hosts
        return True

    def add_kept_run(self, run: Sequence[KeptReplica]) -> int:
        """`add_kept` of each of `run` in order until one is refused; how many were
        added. One call for the replicas a build knows the pieces of already."""
        add = self.add_kept
        added = 0
        for kept in run:
            if not add(kept):
                break
            added += 1
        return added

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

    @contextmanager
    def all_or_nothing(self) -> Iterator[Callable[[], None]]:
        """Placements made and replicas added in the block, taken back by calling
        the function it yields (`request_resources`: every bundle or none)."""
        mark = self.fork()
        journal = self._journal = Journal()

        def undo() -> None:
            self._rollback(journal)
            self.revert(mark)

        try:
            yield undo
        finally:
            self._journal = None

    def revert(self, mark: int) -> None:
        """Drop the replicas added after `mark` (`fork`'s): a trial that lost."""
        dropped = self.replicas[mark:]
        if not dropped:
            return
        first_position = dropped[0].hosts[0].position if dropped[0].hosts else len(self.hosts)
        dropped_hosts = self.hosts[first_position:]
        del self.replicas[mark:]
        del self.hosts[first_position:]
        del self._untouched[bisect_left(self._untouched, mark) :]
        for key, cursor in self._head_cursor.items():
            self._head_cursor[key] = min(cursor, mark)
        self._matches.forget_from(first_position, dropped_hosts)

    def release(self) -> None:
        """Unlink every replica from its hosts once the pass is over. A host and its
        replica point at each other; unlinked, they are freed as soon as the pass
        drops them, instead of by the cyclic collector, which `plan` pauses and
        which then has the whole world to scan (a sixth of a plan at 16,384 hosts)."""
        for replica in self._every_replica:
            replica.hosts = []
        self._every_replica = []
        self._untouched = []
        for kept in self._kept:
            kept.owner = None
        self._kept = []

    # --- matching ---------------------------------------------------------------

    def _advance(self, cands: Candidates, to: int) -> None:
        if to != cands.cursor:
            journal = self._journal
            if journal is not None and id(cands) not in journal.cursors:
                journal.cursors[id(cands)] = (cands, cands.cursor)
            cands.cursor = to

    def first_fit(self, bundle: Bundle, avoid: set[int] | None = None) -> SlotHost | None:
        """The first host that matches and has room, skipping positions in `avoid`."""
        cands = self._matches.of_bundle(bundle, self.hosts)
        positions = cands.positions
        hosts = self.hosts
        resources = bundle.resources
        i = full_upto = cands.cursor
        found = None
        if len(resources) == 1:
            # `SlotHost.fits` inlined for the usual bundle of one resource: a gang
            # that does not fit scans every host after its cursor (100,000 hosts
            # tried per plan at 16,384 hosts x 100,000 bundles).
            ((name, amount),) = resources.items()
            while i < len(positions):
                host = hosts[positions[i]]
                free = host.free
                have = free.get(name)
                if have is None:
                    have = offered(free, name)
                if have + RESOURCE_EPSILON < amount:
                    if full_upto == i:  # the cursor moves past full hosts only
                        full_upto = i + 1
                elif avoid is None or host.position not in avoid:
                    found = host
                    break
                i += 1
        else:
            while i < len(positions):
                host = hosts[positions[i]]
                if host.fits(resources):
                    if avoid is None or host.position not in avoid:
                        found = host
                        break
                elif full_upto == i:  # the cursor moves past full hosts only
                    full_upto = i + 1
                i += 1
        self._advance(cands, full_upto)
        return found

    def take(self, host: SlotHost, resources: Mapping[str, float], copies: int = 1) -> None:
        """Place `copies` of a bundle on `host`, chosen elsewhere (the exact search,
        Ray's best node)."""
        self._take(host, resources, copies)

    def _take(self, host: SlotHost, resources: Mapping[str, float], copies: int = 1) -> None:
        if self._journal is not None:
            self._journal.taken.append((host, dict(host.free), host.replica.used, host.asked))
        host.take(resources, copies)

    # --- placing ----------------------------------------------------------------

    def place_count(self, bundle: Bundle, count: int) -> int:
        """Place up to `count` copies of `bundle`; returns how many did not fit."""
        if bundle.head_resource is not None:
            while count and self._place_slice_head(bundle, avoid=set()):
                count -= 1
            return count
        cands = self._matches.of_bundle(bundle, self.hosts)
        positions = cands.positions
        hosts = self.hosts
        resources = bundle.resources
        i = cands.cursor
        # `copies_that_fit` inlined for the usual bundle of one resource: tasks that
        # do not fit scan every host after the cursor.
        name, amount = next(iter(resources.items())) if len(resources) == 1 else ("", 0.0)
        while count and i < len(positions):
            host = hosts[positions[i]]
            if amount > 0:
                have = host.free.get(name)
                if have is None:
                    have = offered(host.free, name)
                fit = min(math.inf, (have + RESOURCE_EPSILON) // amount)
                copies = min(count, 0 if fit == math.inf else int(fit))
            else:
                copies = min(count, host.copies_that_fit(resources))
            if copies:
                self._take(host, resources, copies)
                count -= copies
            if count:  # the host is full
                i += 1
        self._advance(cands, i)
        return count

    def place_gang(self, gang: GangDemand) -> bool:
        """Reserve every bundle of `gang` or none, following Ray's strategies."""
        return self._gang(gang, keep=True)

    def gang_fits(self, gang: GangDemand, on_fit: Callable[[], None] | None = None) -> bool:
        """Whether `gang` would fit now; changes nothing. `on_fit` runs while the gang
        is placed, before it is taken back (to look at the hosts it used)."""
        return self._gang(gang, keep=False, on_fit=on_fit)

    def _gang(self, gang: GangDemand, keep: bool, on_fit: Callable[[], None] | None = None) -> bool:
        if keep and len(gang.bundles) == 1:
            # One bundle is placed whole or not touched: nothing to undo.
            self._journal = None
            return self._try_gang(gang)
        journal = self._journal = Journal()
        try:
            placed = self._try_gang(gang)
            if placed and on_fit is not None:
                on_fit()
            if not (placed and keep):
                self._rollback(journal)
            return placed
        finally:
            self._journal = None

    def claim_pinned_slices(self, names: set[str]) -> None:
        """The slices pending work is pinned to by name are no slice head's to take.
        A stage two of `slice_placement_group` is pinned to the slice its head holds,
        so while that slice's hosts settle (offering their total: a head Ray placed
        looks free) another placement group's head would take it and leave the stage
        two, served after heads, nothing: reported as never servable. Work pinned to a
        slice by a user's selector would leave a head placed beside it no whole slice."""
        for replica in self.replicas:
            if replica.slice_name in names:
                replica.claimed = True

    def place_heads(self, head: Bundle, count: int) -> int:
        """Place up to `count` slice heads `head`, each a gang of its own (`place_gang`
        of each in turn), until one does not fit; returns how many fit. One call for
        a run of heads of one kind: a burst waits on a hundred of them every round.

        `_place_slice_head` of each, its loop resumed where the last head stopped
        (that head's slice is claimed now, so the next scan would pass it first)."""
        self._journal = None
        if count <= 0:
            return 0
        head_name = head.head_resource
        resources, selector, key = head.resources, head.selector, head.key
        asked_names = frozenset(n for n, amount in resources.items() if amount > 0)
        replicas = self.replicas
        tpu_name = labels.TPU_RESOURCE
        asked_and_tpu = self._asked_and_tpu
        # Replicas before `cursor` cannot take the bundle: claimed, or in use. Of the
        # rest, only those untouched when added may (`_untouched`): the scan steps
        # through those, and stops where it would have (`index`).
        start = index = self._head_cursor.get(key, 0)
        end = len(replicas)
        untouched = self._untouched
        candidate = bisect_left(untouched, start)
        candidates = len(untouched)
        placed = 0
        while placed < count:
            while candidate < candidates:
                index = untouched[candidate]
                replica = replicas[index]
                if replica.claimed:
                    candidate += 1
                    continue
                hosts = replica.hosts
                host0 = hosts[0] if hosts else None
                if (
                    host0 is not None
                    and head_name in host0.free
                    # `_untouched` of host 0 first: it rules out most busy slices.
                    and host0.free.get(tpu_name, 0.0) + RESOURCE_EPSILON
                    >= host0.total.get(tpu_name, 0.0)
                    and host0.fits(resources)
                    and (not selector or selector_matches(selector, host0.labels))
                    and _untouched(hosts)
                ):
                    break
                candidate += 1
            else:
                index = max(start, end)
                break
            # `_take` of the head on host 0, then of each host's TPUs, inlined.
            host0 = hosts[0]
            free = host0.free
            for name, amount in resources.items():
                have = free.get(name)
                free[name] = (offered(free, name) if have is None else have) - amount
            if not asked_names <= host0.asked:
                host0.asked = self._asked_with(host0.asked, asked_names)
            for host in hosts:
                free = host.free
                tpu = free.get(tpu_name, 0.0)
                if tpu > 0:
                    free[tpu_name] = tpu - tpu
                    asked = host.asked
                    if tpu_name not in asked:
                        # One set per distinct ask, not one per host (a slice's hosts).
                        grown = asked_and_tpu.get(asked)
                        if grown is None:
                            grown = asked_and_tpu[asked] = asked.union((tpu_name,))
                        host.asked = grown
            replica.claimed = True
            replica.used = True
            placed += 1
        if index != start:
            self._head_cursor[key] = index
        return placed

    def _asked_with(self, asked: frozenset[str], names: frozenset[str]) -> frozenset[str]:
        """`asked | names`, one set per distinct pair (a head asks the same of each
        slice it takes)."""
        grown = self._asked_union.get((asked, names))
        if grown is None:
            grown = self._asked_union[(asked, names)] = asked | names
        return grown

    def _try_gang(self, gang: GangDemand) -> bool:
        if gang.is_slice_head:
            used: set[int] = set()
            if len(gang.bundles) == 1:  # most heads: no generator
                return self._place_slice_head(gang.bundles[0], used)
            return all(self._place_slice_head(b, used) for b in gang.bundles)
        bundles = sorted(gang.bundles, key=Bundle.size, reverse=True)
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
        resources, selector = bundle.resources, bundle.selector
        replicas = self.replicas
        tpu_name = labels.TPU_RESOURCE
        # Replicas before `cursor` cannot take the bundle: claimed, or in use.
        start = cursor = self._head_cursor.get(bundle.key, 0)
        for index in range(start, len(replicas)):
            replica = replicas[index]
            hosts = replica.hosts
            host0 = hosts[0] if hosts else None
            eligible = (
                host0 is not None
                and not replica.claimed
                and head in host0.free
                # `_untouched` of host 0 first: it rules out most busy slices at once.
                and host0.free.get(tpu_name, 0.0) + RESOURCE_EPSILON
                >= host0.total.get(tpu_name, 0.0)
                and host0.fits(resources)
                and (not selector or selector_matches(selector, host0.labels))
                and _untouched(hosts)
            )
            if not eligible:
                if cursor == index:
                    cursor = index + 1
                continue
            assert host0 is not None
            if host0.position in avoid:
                continue
            break
        else:
            if cursor != start:
                self._head_cursor[bundle.key] = cursor
            return False
        if cursor != start:
            self._head_cursor[bundle.key] = cursor
        self._take(host0, resources)
        # `_take` of each host's TPUs, inlined: a head per wanted slice runs this.
        journal = self._journal
        for host in hosts:
            free = host.free
            tpu = free.get(tpu_name, 0.0)
            if tpu > 0:
                if journal is not None:
                    journal.taken.append((host, dict(free), replica.used, host.asked))
                free[tpu_name] = tpu - tpu
                asked = host.asked
                if tpu_name not in asked:
                    # One set per distinct ask, not one per host (a slice's hosts).
                    grown = self._asked_and_tpu.get(asked)
                    if grown is None:
                        grown = self._asked_and_tpu[asked] = asked.union((tpu_name,))
                    host.asked = grown
        replica.claimed = True
        replica.used = True
        if journal is not None:
            journal.claims.append(replica)
        avoid.add(host0.position)
        return True

    def _rollback(self, journal: Journal) -> None:
        """Undo the gang being tried; head cursors back to its first replica touched."""
        earliest = journal.undo(len(self.hosts))
        if earliest < len(self.hosts):
            replica_index = self.hosts[earliest].replica.index
            for key, cursor in self._head_cursor.items():
                self._head_cursor[key] = min(cursor, replica_index)


def _untouched(hosts: list[SlotHost]) -> bool:
    """`SlotHost.untouched` of every host (a slice head's hot loop)."""
    tpu_name = labels.TPU_RESOURCE
    for host in hosts:
        if host.free.get(tpu_name, 0.0) + RESOURCE_EPSILON < host.total.get(tpu_name, 0.0):
            return False
    return True
