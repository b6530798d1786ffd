"""Placement groups (gangs): every bundle or none, following Ray's strategies.

Gangs are served in kind order (slice heads, then the most constrained, then the
largest; gangs of one kind together), each placed on what exists or launched for:
the group that holds it with the fewest chips, or, for a gang whose bundles need
different groups, each group's share.

A PACK or SPREAD gang without TPUs is placed as Ray 2.60's autoscaler places it:
to Ray those strategies are no constraint (only the strict ones are), so its bundles
are served as tasks are (`nodes.py`: the best-used existing nodes, then node by
node), all of them or none."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import NamedTuple, cast

from tpu_autoscaler.core.demand import (
    Bundle,
    GangDemand,
    GangKind,
    GangStrategy,
    ResourceDemand,
    pinned_slice,
)
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.plan import GroupReason
from tpu_autoscaler.core.policy import expander
from tpu_autoscaler.core.policy.counts import Copies, count_options
from tpu_autoscaler.core.policy.expander import Option, Rotation
from tpu_autoscaler.core.policy.ledger import GroupLedger, Ledger
from tpu_autoscaler.core.policy.nodes import serve_as_nodes, served_as_nodes
from tpu_autoscaler.core.policy.outcome import (
    Outcome,
    Reasons,
    busy,
    dedupe,
    rejected,
    skipped,
)
from tpu_autoscaler.core.policy.resizing import Growth
from tpu_autoscaler.core.policy.utilization import Scorer
from tpu_autoscaler.core.slots import SlotReplica
from tpu_autoscaler.core.units import Chips, Replicas, TpuResource

_STRICTNESS = {
    GangStrategy.STRICT_SPREAD: 0,
    GangStrategy.STRICT_PACK: 1,
    GangStrategy.PACK: 2,
    GangStrategy.SPREAD: 2,
}

KindOrder = tuple[int, int, float, int, str]
"""(head first, strictness, -TpuResource, -bundles, text)"""


class GangKinds:
    """Gang kinds (strategy and bundles, not id) as small ints, with their order and
    text: shared by the passes of one plan, which see the same demand."""

    def __init__(self) -> None:
        self._ids: dict[GangKind, int] = {}
        self._of_gang: dict[int, int] = {}
        """Each gang's kind by the gang's identity. Comparing kinds compares every
        bundle's resources and selector: by value on every call, plans of 10,000
        gangs took 2-3x as long (bench_policy). A GangKinds lives for one plan, whose
        snapshot holds every gang, so no identity is reused meanwhile."""
        self._orders: dict[int, KindOrder] = {}
        self._texts: dict[int, str] = {}
        self._in_order: dict[int, tuple[tuple[GangDemand, ...], list[tuple[int, GangDemand]]]] = {}
        """The demand's gangs (a tuple every pass serves) in order, by identity."""
        self._ranked: dict[int, tuple[int, int]] = {}
        """Each gang of the first tuple ordered (the demand's) by identity: its place
        in that order, and its kind. What a pass defers is a part of that order, in
        order, and is served again as it is (`in_order`)."""

    def of(self, gang: GangDemand) -> int:
        kind = self._of_gang.get(id(gang))
        if kind is None:
            kind = self._of_gang[id(gang)] = self._ids.setdefault(gang.kind, len(self._ids))
        return kind

    def text(self, gang: GangDemand) -> str:
        kind = self.of(gang)
        text = self._texts.get(kind)
        if text is None:
            text = self._texts[kind] = gang.kind_text()
        return text

    def in_order(self, gangs: Sequence[GangDemand]) -> list[tuple[int, GangDemand]]:
        """Each gang with its kind, in kind order (`order`), then by id; a tuple of
        gangs is ordered once per plan (each pass serves the demand's own)."""
        known = self._in_order.get(id(gangs))
        if known is not None and known[0] is gangs:
            return known[1]
        in_place = self._already_in_order(gangs)
        if in_place is not None:
            return in_place
        # Bucketed by kind, then each bucket sorted by id alone: one sort of
        # (order, id, index) tuples compared long order tuples of equal kinds
        # (50 of 120 ms per plan at 16,384 hosts x 100,000 bundles).
        of_gang, ids = self._of_gang, self._ids  # `of`, inlined
        by_kind: dict[int, list[GangDemand]] = {}
        """Each kind's gangs in their input order."""
        for g in gangs:
            kind = of_gang.get(id(g))
            if kind is None:
                kind = of_gang[id(g)] = ids.setdefault(g.kind, len(ids))
            bucket = by_kind.get(kind)
            if bucket is None:
                bucket = by_kind[kind] = []
            bucket.append(g)
        by_order: dict[KindOrder, list[int]] = {}
        for kind, bucket in by_kind.items():
            by_order.setdefault(self.order(bucket[0], kind), []).append(kind)
        ordered: list[tuple[int, GangDemand]] = []
        for order in sorted(by_order):
            kinds = by_order[order]
            if len(kinds) == 1:
                # A stable sort by id keeps equal ids in their input order.
                kind = kinds[0]
                ordered.extend([(kind, g) for g in sorted(by_kind[kind], key=_gang_id)])
            else:  # kinds alike in order (rare): by id, then by input order
                index = {id(g): i for i, g in enumerate(gangs)}
                merged = sorted(
                    (g for kind in kinds for g in by_kind[kind]),
                    key=lambda g: (g.gang_id, index[id(g)]),
                )
                ordered.extend([(of_gang[id(g)], g) for g in merged])
        if isinstance(gangs, tuple):
            self._in_order[id(gangs)] = (gangs, ordered)
            if not self._ranked:
                self._ranked = {id(g): (rank, kind) for rank, (kind, g) in enumerate(ordered)}
        return ordered

    def _already_in_order(self, gangs: Sequence[GangDemand]) -> list[tuple[int, GangDemand]] | None:
        """`gangs` with their kinds if they are a part of the ranked order, in that
        order (gangs deferred, served again): sorting them would not move one. The
        order sorts by (kind order, id, index in the input), and in a part of it
        kept in order, a gang before another also has the smaller index. None if
        one is not ranked or out of order (16,000 deferred gangs took 15 ms to sort
        at 16,384 hosts x 100,000 bundles)."""
        if not self._ranked:
            return None
        entries = list(map(self._ranked.get, map(id, gangs)))
        if None in entries:
            return None
        ranks = cast(list[tuple[int, int]], entries)
        # Ranks are unique per gang: strictly increasing is sorted without repeats.
        if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
            return None
        return [(kind, g) for (_, kind), g in zip(ranks, gangs, strict=True)]

    def order(self, gang: GangDemand, kind: int) -> KindOrder:
        """Slice heads, then the most constrained gangs, then the largest, each kind
        together: soft gangs placed last can fill the gaps the strict ones leave.
        Largest by what the gang asks of Ray (`TpuResource`), not by chips: how many
        chips it takes depends on the group the expander picks later."""
        order = self._orders.get(kind)
        if order is None:
            tpu = TpuResource(sum(b.tpu for b in gang.bundles))
            head = 0 if gang.is_slice_head else 1
            order = (head, _STRICTNESS[gang.strategy], -tpu, -len(gang.bundles), self.text(gang))
            self._orders[kind] = order
        return order


_gang_id = attrgetter("gang_id")


class Settled(NamedTuple):
    """Placed on capacity that exists, or reported infeasible: nothing launched."""


SETTLED = Settled()


@dataclass(frozen=True, slots=True)
class Launched:
    """Placed after launching `replicas` of one group for it."""

    group: str
    replicas: Replicas
    reason: str


class Deferred(NamedTuple):
    """No capacity now; deferred in `Outcome` with these reasons."""

    reasons: Reasons


GangResult = Settled | Launched | Deferred


class GangServer:
    def __init__(
        self,
        ledger: Ledger,
        copies: Copies,
        outcome: Outcome,
        kinds: GangKinds,
        world: World,
        slice_names: set[str],
        scorer: Scorer,
        growth: Growth | None = None,
    ) -> None:
        self.ledger = ledger
        self.growth = growth
        self.scorer = scorer
        self.copies = copies
        self.outcome = outcome
        self.kinds = kinds
        self.world = world
        self.slice_names = slice_names
        self._hopeless: dict[int, tuple[int, Reasons]] = {}
        """Gang kinds that found no option, and the launch count then: capacity only
        shrinks between launches, so an identical gang cannot fare better until one."""
        self._traits: dict[int, tuple[bool, bool]] = {}
        """Per gang kind: whether its first bundle names slices, whether Ray's greedy
        serves it (`_served_as_nodes`); looked up once, not per gang."""

    def serve_all(self, gangs: Sequence[GangDemand]) -> None:
        """Gangs in order, each kind in one run (see `_serve_run`); slices any of them
        is pinned to claimed first (`World.claim_pinned_slices`: the gangs of a kind
        ask the same selectors, so the first of each run tells its slices)."""
        ordered = self.kinds.in_order(gangs)
        runs = [[g for _, g in run] for _, run in groupby(ordered, key=itemgetter(0))]
        pinned: set[str] = set()
        for run in runs:
            if run[0].bundles:
                pinned |= pinned_slice(run[0].bundles[0].selector) or frozenset()
        if pinned:
            self.world.claim_pinned_slices(pinned)
        for run in runs:
            self._serve_run(run)

    def _serve_run(self, run: Sequence[GangDemand]) -> None:
        """Gangs of one kind. Once one needs a launch, the rest grow in one step: as
        many more launches as the gangs the first launch held leave unserved, within
        the group's limits. Once one can be neither placed nor launched for, neither
        can the rest (capacity only shrinks between launches): they wait with it."""
        i = 0
        heads = self._placeable_heads(run)
        while i < len(run):
            if heads:
                # `serve` of each head that fits what exists, in one call.
                placed = self.world.place_heads(run[i].bundles[0], len(run) - i)
                self.outcome.placed(placed)
                i += placed
                if i == len(run):
                    return
            launches = self.ledger.launch_calls
            result = self.serve(run[i])
            i += 1
            if isinstance(result, Deferred) and self.ledger.launch_calls == launches:
                self._defer_rest(run[i:], result.reasons)
                return
            if not isinstance(result, Launched):
                continue
            held = 1
            while i < len(run) and self.world.place_gang(run[i]):
                self.outcome.placed(len(run[i].bundles))
                held += 1
                i += 1
            batches = min(
                math.ceil((len(run) - i) / held),
                self.ledger.limit(result.group)[0] // result.replicas,
            )
            if batches > 0:
                # Later gangs may share what is left over: launch for all of them at
                # once, then take back what they did not use.
                batch = self.ledger.launch(
                    result.group,
                    batches * result.replicas,
                    result.reason,
                    times=batches,
                    gangs=(result.replicas,),
                )
                while i < len(run):
                    launches = self.ledger.launch_calls
                    later = self.serve(run[i])
                    i += 1
                    if isinstance(later, Deferred) and self.ledger.launch_calls == launches:
                        self._defer_rest(run[i:], later.reasons)
                        i = len(run)
                self.ledger.withdraw(result.group, batch, result.reason, result.replicas)

    def _placeable_heads(self, run: Sequence[GangDemand]) -> bool:
        """Whether `serve` of a gang of the run (one kind) only places it when it fits
        what exists: single slice heads, pinned to no slice and not served as Ray's
        greedy serves nodes (`serve`'s traits)."""
        gang = run[0]
        if not (gang.is_slice_head and len(gang.bundles) == 1):
            return False
        kind = self.kinds.of(gang)
        traits = self._traits.get(kind)
        if traits is None:
            traits = self._traits[kind] = self._traits_of(gang)
        return traits == (False, False)

    @staticmethod
    def _traits_of(gang: GangDemand) -> tuple[bool, bool]:
        pinned = bool(gang.bundles) and pinned_slice(gang.bundles[0].selector) is not None
        return (pinned, _served_as_nodes(gang))

    def _defer_rest(self, rest: Sequence[GangDemand], reasons: Reasons) -> None:
        self.outcome.defer_gangs(rest, reasons)

    def serve(self, gang: GangDemand) -> GangResult:
        """Place `gang`, launching for it if need be."""
        size = len(gang.bundles)
        kind = self.kinds.of(gang)
        traits = self._traits.get(kind)
        if traits is None:
            traits = self._traits[kind] = self._traits_of(gang)
        pinned, as_nodes = traits
        if pinned and self.outcome.pinned_to_missing_slice(
            gang.bundles[0], gang, size, self.slice_names
        ):
            return SETTLED
        if as_nodes:
            return self._serve_as_nodes(gang)
        if self.world.place_gang(gang):
            self.outcome.placed(size)
            return SETTLED
        known = self._hopeless.get(kind)
        if known is not None and known[0] == self.ledger.launch_calls:
            self.outcome.unmet(gang, known[1], size)
            return Deferred(known[1])
        if pinned:
            waits = self._waits_for_busy_slices(gang)
            if waits is not None:
                reasons = Reasons(blocked=(waits,))
                self._hopeless[kind] = (self.ledger.launch_calls, reasons)
                self.outcome.unmet(gang, reasons, size)
                return Deferred(reasons)
        options: list[Option] = []
        blocked: list[GroupReason] = []
        never: list[GroupReason] = []
        for order, state in enumerate(self.ledger.groups.values()):
            shape = state.shape
            servable = [b for b in gang.bundles if self.copies(shape, b)]
            if not servable:
                continue
            if len(servable) < size and not all(
                self.copies(shape, b) or self._fits_existing(b) for b in gang.bundles
            ):
                continue
            # Search as if the group were empty, to tell "never" from "not now".
            ceiling = min(shape.max_replicas, size)
            needed = self._replicas_for_gang(gang, state, ceiling)
            if needed is None:
                never.append(
                    rejected(
                        shape.group,
                        f"{shape.group} cannot hold it with {ceiling} new replica(s) "
                        f"(maxReplicas {shape.max_replicas})",
                    )
                )
                continue
            limit, why = state.limit(self.ledger.now_s)
            if needed > limit:
                blocked.append(skipped(shape.group, why or shape.group))
                continue
            options.append(
                Option(
                    shape.group,
                    needed,
                    Chips(needed * shape.chips_per_replica),
                    shape.priority,
                    f"{needed} x {shape.group}",
                    order,
                    self.scorer.gang(self.world, gang, shape, needed),
                    availability=state.availability,
                    cost=shape.scarcity.cost,
                    churning=state.churning,
                )
            )
        choice = expander.choose(options)
        if choice is not None:
            chosen = choice.option
            reason = f"placement group ({self.kinds.text(gang)}): " + expander.describe_options(
                options, choice
            )
            self.ledger.launch(chosen.group, chosen.replicas, reason, gangs=(chosen.replicas,))
            if self.world.place_gang(gang):
                self.outcome.placed(size)
                return Launched(chosen.group, chosen.replicas, reason)
        elif not blocked and self._serve_across_groups(gang):
            self.outcome.placed(size)
            return SETTLED
        if not blocked and not never:
            never = [
                rejected(s.shape.group, expander.why_not(s.shape, b))
                for s in self.ledger.groups.values()
                for b in gang.bundles[:1]
            ]
        reasons = Reasons(tuple(blocked), tuple(never))
        self._hopeless[kind] = (self.ledger.launch_calls, reasons)
        self.outcome.unmet(gang, reasons, size)
        return Deferred(reasons)

    def _serve_as_nodes(self, gang: GangDemand) -> GangResult:
        """A PACK or SPREAD gang without TPUs, as Ray's `_try_schedule` serves its
        bundles (one call per gang, so a rotation of its own): kept only whole."""
        counts: dict[Bundle, int] = {}
        for bundle in gang.bundles:
            counts[bundle] = counts.get(bundle, 0) + 1
        requests = [ResourceDemand(b, n, gang.source) for b, n in counts.items()]
        trial = Outcome()
        ledger_mark = self.ledger.mark()
        capacity = self.ledger.scratch.capacity_world
        capacity_mark = capacity.fork()
        growth_mark = self.growth.mark() if self.growth is not None else 0
        with self.world.all_or_nothing() as undo:
            serve_as_nodes(
                requests,
                self.ledger,
                self.copies,
                trial,
                self.world,
                self.scorer,
                Rotation(),
                self.growth,
            )
            left = trial.take_deferred()
            if not left:
                self.outcome.placed(len(gang.bundles))
                return SETTLED
            undo()
            if self.growth is not None:
                self.growth.rollback(growth_mark)
        capacity.revert(capacity_mark)
        self.ledger.restore(ledger_mark)
        reasons = Reasons(
            tuple(dedupe([r for d in left for r in d.reasons.blocked])),
            tuple(dedupe([r for d in left for r in d.reasons.never])),
        )
        self.outcome.unmet(gang, reasons, len(gang.bundles))
        return Deferred(reasons)

    def _serve_across_groups(self, gang: GangDemand) -> bool:
        """A gang whose bundles need different groups (say a CPU driver bundle beside
        TPU workers): launch, per group, what its own bundles need; keep it only if
        the whole gang then fits."""
        wanted: dict[str, list[Bundle]] = {}
        for bundle in gang.bundles:
            if self._fits_existing(bundle):
                continue
            options, _ = count_options(self.ledger, self.copies, bundle, 1, self.scorer)
            chosen = expander.best_option(options)
            if chosen is None:
                return False
            wanted.setdefault(chosen.group, []).append(bundle)
        # Grow every group's share in step until the gang fits or a limit is hit.
        launches = dict.fromkeys(wanted, 1)
        while True:
            if any(count > self.ledger.limit(group)[0] for group, count in launches.items()):
                return False
            additions = [(self.ledger.groups[g].shape, count) for g, count in launches.items()]
            with self.world.trial(additions):
                fits = self.world.gang_fits(gang)
            if fits:
                break
            growable = [g for g, count in launches.items() if count < len(wanted[g])]
            if not growable:
                return False
            for group in growable:
                launches[group] += 1
        for group, count in launches.items():
            self.ledger.launch(
                group,
                count,
                f"placement group ({self.kinds.text(gang)}): {count} x {group} for its bundles",
            )
        return self.world.place_gang(gang)

    def _waits_for_busy_slices(self, gang: GangDemand) -> GroupReason | None:
        """Why `gang`, pinned by name to slices that exist and placed on none of them
        now, waits: it fits them once their work ends (the `slice_placement_group`
        stage two whose slice ran other work first). None if it fits them never; no
        new slice can serve it either way (a new slice has another name)."""
        names = pinned_slice(gang.bundles[0].selector) or frozenset()
        pinned_to = [r for r in self.world.replicas if r.slice_name in names]
        if not pinned_to:
            return None
        idle = World()
        for replica in pinned_to:
            idle.add_replica(
                SlotReplica(replica.group, replica.name, new=False, slice_name=replica.slice_name),
                [(host.labels, host.total, host.total) for host in replica.hosts],
            )
        if not idle.gang_fits(gang):
            return None
        slices = ", ".join(sorted({cast(str, r.slice_name) for r in pinned_to}))
        hosts = sum(len(r.hosts) for r in pinned_to)
        return busy(
            pinned_to[0].group,
            f"waits for slice {slices} of {pinned_to[0].group}: its {hosts} hosts hold "
            "the placement group once their work ends, busy now",
        )

    def _fits_existing(self, bundle: Bundle) -> bool:
        return self.world.first_fit(bundle) is not None

    def _replicas_for_gang(
        self, gang: GangDemand, state: GroupLedger, bound: int
    ) -> Replicas | None:
        """Fewest new replicas of the group with which the gang fits, up to `bound`."""
        if bound <= 0:
            return None

        def fits_with(k: int) -> bool:
            with self.world.trial([(state.shape, k)]):
                return self.world.gang_fits(gang)

        low, high = 0, 1
        while not fits_with(high):
            if high >= bound:
                return None
            low, high = high, min(bound, high * 2)
        while high - low > 1:
            mid = (low + high) // 2
            if fits_with(mid):
                high = mid
            else:
                low = mid
        return Replicas(high)


def _served_as_nodes(gang: GangDemand) -> bool:
    """A gang Ray's greedy decides bundle by bundle: PACK or SPREAD, no TPU, no slice
    head, no bundle pinned to a slice, no fallbacks."""
    return gang.strategy in (GangStrategy.PACK, GangStrategy.SPREAD) and all(
        served_as_nodes(b) and not b.fallbacks for b in gang.bundles
    )
