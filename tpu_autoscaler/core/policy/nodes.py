"""Tasks and actors that need no TPU, served as Ray 2.60's scheduler serves them
(`ResourceDemandScheduler._try_schedule`): every shape at once, in Ray's order, on
what exists first; then node by node, each new node the group whose one new replica
would be best used by what is left (the expander's chain on Ray's score), packed with
whatever of the rest fits on it. A large request may so land on a node of its own
while a small one fills a small node, as in Ray.

TPU demand keeps the slice rules (`counts.py`): it is served before this, one shape
at a time, for the fewest chips."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpu_autoscaler.core.demand import (
    Bundle,
    ResourceDemand,
    copies_that_fit,
    pinned_slice,
    selector_matches,
)
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.policy import expander
from tpu_autoscaler.core.policy.counts import Copies, count_options
from tpu_autoscaler.core.policy.expander import Option, Rotation
from tpu_autoscaler.core.policy.ledger import GroupLedger, Ledger
from tpu_autoscaler.core.policy.outcome import Outcome, Reasons, skipped
from tpu_autoscaler.core.policy.resizing import Growth, Placed
from tpu_autoscaler.core.policy.utilization import GPU, Score, Scorer, label_rank
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import SlotHost
from tpu_autoscaler.core.units import Chips, Replicas

NOT_REPORTED = -1.0
"""A resource a node does not report as available (Ray leaves it out of the score)."""
SHOWN_SHAPES = 3
"""Request shapes named in a launch's reason; the rest are counted."""


def served_as_nodes(bundle: Bundle) -> bool:
    """Demand Ray's greedy decides: no TPU, no slice head, not pinned to a slice."""
    return (
        bundle.tpu <= 0 and bundle.head_resource is None and pinned_slice(bundle.selector) is None
    )


def ray_order(requests: Sequence[ResourceDemand]) -> list[ResourceDemand]:
    """Ray's order (`_sort_resource_request`, descending): most label constraints, most
    resources, largest sum, then by the resources themselves."""

    def key(request: ResourceDemand) -> tuple[int, int, float, list[tuple[str, float]]]:
        resources = request.bundle.resources
        return (
            len(request.bundle.selector),
            len(resources),
            sum(resources.values()),
            sorted(resources.items()),
        )

    return sorted(requests, key=key, reverse=True)


@dataclass(frozen=True, slots=True)
class _Packing:
    """One new replica of a group with what it would take of each request."""

    option: Option
    taken: tuple[int, ...]
    capped: tuple[bool, ...]
    """Per request: it took less than was left (the replica was full for it)."""


def serve_as_nodes(
    requests: Sequence[ResourceDemand],
    ledger: Ledger,
    copies: Copies,
    outcome: Outcome,
    world: World,
    scorer: Scorer,
    rotation: Rotation,
    growth: Growth | None = None,
) -> None:
    """Place `requests` on `world`, then on pods `growth` may grow in place, launching
    node by node for the rest; what no group can take goes to `outcome`."""
    ordered = ray_order(requests)
    left = [r.count for r in ordered]
    full = growth.full_hosts(ordered, world) if growth is not None else set()
    placed = _place_on_existing(ordered, left, world, scorer, outcome)
    if growth is not None and any(left):
        growth.serve(
            ordered,
            world,
            [host for host, _ in placed],
            full,
            lambda hosts: _place_on_existing(ordered, left, world, scorer, outcome, hosts),
        )
    while any(left):
        packings = [
            p
            for order, shape in _groups(ledger)
            for p in [
                _pack(
                    shape,
                    ordered,
                    left,
                    scorer,
                    order,
                    rotation,
                    ledger.groups[shape.group],
                )
            ]
            if p is not None
        ]
        choice = expander.choose([p.option for p in packings])
        if choice is None:
            _report(ordered, left, ledger, copies, outcome, scorer)
            return
        chosen = next(p for p in packings if p.option is choice.option)
        replicas = _in_a_row(chosen, packings, left, ledger, choice)
        wanted = [f"{n} x {r.bundle}" for r, n in zip(ordered, left, strict=True) if n]
        more = (
            f" and {len(wanted) - SHOWN_SHAPES} more shapes" if len(wanted) > SHOWN_SHAPES else ""
        )
        options = [p.option for p in packings]
        ledger.launch(
            chosen.option.group,
            replicas,
            f"{', '.join(wanted[:SHOWN_SHAPES])}{more}: "
            f"{expander.describe_options(options, choice)}",
        )
        rotation.chose(chosen.option.group)
        placed_any = False
        for index, request in enumerate(ordered):
            if left[index]:
                after = world.place_count(request.bundle, left[index])
                outcome.placed(left[index] - after)
                placed_any = placed_any or after < left[index]
                left[index] = after
        if not placed_any:  # cannot happen unless shapes lie; never loop forever
            group = chosen.option.group
            for request, n in zip(ordered, left, strict=True):
                if n:
                    reasons = Reasons((skipped(group, f"{group} launched but did not fit"),))
                    outcome.unmet(ResourceDemand(request.bundle, n, request.source), reasons, n)
            return


def _place_on_existing(
    ordered: Sequence[ResourceDemand],
    left: list[int],
    world: World,
    scorer: Scorer,
    outcome: Outcome,
    among: Sequence[SlotHost] | None = None,
) -> Placed:
    """Ray's first stage: the best existing node takes what of the rest fits on it,
    then the next best, each node once (of `among`, if given). Hosts alike (same
    labels, totals and free resources) are scored once, the earliest of them taking
    the work (Ray's `NodeStateCache`); a host that can take nothing now never can (it
    only fills). Returns the hosts that took work."""
    placed: Placed = []
    # Ties go to the earliest host of `among` (Ray's order of its candidates).
    order_of = None if among is None else {id(h): i for i, h in enumerate(among)}
    selected = sorted({c.key for r in ordered for c in r.bundle.selector})
    asked = {name for r in ordered for name in r.bundle.resources} | {GPU}
    alike: dict[tuple[object, ...], list[SlotHost]] = {}
    useless: set[tuple[object, ...]] = set()
    for host in world.hosts if among is None else among:
        key = _alike_key(host, selected, asked)
        if key in useless:
            continue
        hosts = alike.get(key)
        if hosts is None:
            # Alike hosts fit alike: whether one can take anything is asked once.
            if not any(host.fits(r.bundle.resources) for r in ordered):
                useless.add(key)
                continue
            hosts = alike[key] = []
        hosts.append(host)
    known: dict[tuple[object, ...], tuple[tuple[int, ...], _Packing, Score]] = {}
    """Per kind of host, its last evaluation and what was left then: still right
    while what is left changes none of what it took (`_unchanged`)."""
    while any(left) and alike:
        best: tuple[Score, int, tuple[object, ...], tuple[int, ...]] | None = None
        for key, hosts in list(alike.items()):
            host = hosts[0]
            cached = known.get(key)
            if cached is not None and _unchanged(cached[1], left, cached[0]):
                taken, score = cached[1].taken, cached[2]
            else:
                filled, rank, requested = _fill(host.labels, dict(host.free), ordered, left)
                taken = tuple(filled)
                if not any(taken):
                    del alike[key]
                    continue
                free = dict(host.free)
                for request, n in zip(ordered, taken, strict=True):
                    for name, amount in request.bundle.resources.items():
                        free[name] = free.get(name, 0.0) - amount * n
                # Scored with all the work placed on it this pass, as Ray scores it.
                score = scorer.hosts([(host.total, free)], rank, requested | host.asked)
                capped = tuple(n < wanted for n, wanted in zip(taken, left, strict=True))
                known[key] = (tuple(left), _Packing(_NO_OPTION, taken, capped), score)
            position = host.position if order_of is None else order_of[id(host)]
            if best is None or (score, -position) > (best[0], -best[1]):
                best = (score, position, key, taken)
        if best is None:
            return placed
        _, _, key, taken = best
        host = alike[key].pop(0)
        if not alike[key]:
            del alike[key]
        placed.append((host, taken))
        for index, (request, n) in enumerate(zip(ordered, taken, strict=True)):
            if n:
                world.take(host, request.bundle.resources, n)
                outcome.placed(n)
                left[index] -= n
    return placed


def _alike_key(host: SlotHost, selected: Sequence[str], asked: set[str]) -> tuple[object, ...]:
    """What the score and the fit of `host` depend on: the resources of the work placed
    on it this pass, the labels selectors read, the amounts of the resources asked for
    (and GPU) by name, the others' amounts only (a slice's own `{TPU_NAME}: 1` must not
    make each TPU host unique)."""
    free = host.free
    # In the order the host lists them: hosts built alike list them alike (and a
    # different order only costs a second evaluation, never a wrong one).
    return (
        host.asked,
        tuple(host.labels.get(k) for k in selected),
        tuple(
            (name, total, free.get(name, NOT_REPORTED))
            if name in asked
            else (total, free.get(name, NOT_REPORTED))
            for name, total in host.total.items()
        ),
    )


def _fill(
    host_labels: Mapping[str, str],
    free: dict[str, float],
    ordered: Sequence[ResourceDemand],
    left: Sequence[int],
) -> tuple[list[int], int, set[str]]:
    """What of what is left one host with `free` takes, in Ray's order (`free` is
    used up); the label element and the resources the taken requests ask for."""
    taken = []
    rank = 0
    requested: set[str] = set()
    for request, wanted in zip(ordered, left, strict=True):
        n = 0
        if wanted and selector_matches(request.bundle.selector, host_labels):
            n = min(wanted, copies_that_fit(free, request.bundle.resources))
            for name, amount in request.bundle.resources.items():
                free[name] = free.get(name, 0.0) - amount * n
        taken.append(n)
        if n:
            rank = max(rank, label_rank(request.bundle))
            requested.update(request.bundle.resources)
    return taken, rank, requested


_NO_OPTION = Option("", Replicas(0), Chips(0), 0, "")
"""The option slot of an existing host's packing (it launches nothing)."""


def _groups(ledger: Ledger) -> list[tuple[int, SliceShape]]:
    return [
        (order, state.shape)
        for order, state in enumerate(ledger.groups.values())
        if state.limit(ledger.now_s)[0] > 0
    ]


def _pack(
    shape: SliceShape,
    ordered: Sequence[ResourceDemand],
    left: Sequence[int],
    scorer: Scorer,
    order: int,
    rotation: Rotation,
    state: GroupLedger,
) -> _Packing | None:
    """What one empty replica of `shape` takes of what is left, in Ray's order, first
    fit host by host; None if nothing."""
    hosts = [
        (shape.host_labels(i), shape.launch_resources(i), shape.launch_resources(i))
        for i in range(shape.hosts_per_replica)
    ]
    taken = []
    capped = []
    rank = 0
    for request, wanted in zip(ordered, left, strict=True):
        got = 0
        for labels, _, free in hosts:
            if got == wanted:
                break
            if not selector_matches(request.bundle.selector, labels):
                continue
            fits = copies_that_fit(free, request.bundle.resources)
            n = min(fits, wanted - got)
            for name, amount in request.bundle.resources.items():
                free[name] = free.get(name, 0.0) - amount * n
            got += n
        taken.append(got)
        capped.append(got < wanted)
        if got:
            rank = max(rank, label_rank(request.bundle))
    if not any(taken):
        return None
    score = scorer.hosts(((total, free) for _, total, free in hosts), rank)
    option = Option(
        shape.group,
        Replicas(1),
        Chips(shape.chips_per_replica),
        shape.priority,
        f"1 x {shape.group} ({sum(taken)} on it)",
        order,
        lambda: score,
        rotation.last_chosen(shape.group),
        availability=state.availability,
        cost=shape.scarcity.cost,
        churning=state.churning,
    )
    return _Packing(option, tuple(taken), tuple(capped))


def _in_a_row(
    chosen: _Packing,
    packings: Sequence[_Packing],
    left: Sequence[int],
    ledger: Ledger,
    choice: expander.Choice,
) -> int:
    """Replicas of the chosen group Ray's loop would pick one after another: while
    what is left changes no group's packing (each still fills up on every shape it
    took from), every score and so the choice stay the same; unless only Ray's
    rotation decided, which moves on with every node."""
    if choice.decided_by == expander.CHAIN[-1].name:
        return 1
    limit = ledger.limit(chosen.option.group)[0]
    rest = list(left)
    replicas = 1
    while replicas < limit:
        rest = [n - t for n, t in zip(rest, chosen.taken, strict=True)]
        if not all(_unchanged(p, rest, left) for p in packings):
            break
        replicas += 1
    return replicas


def _unchanged(packing: _Packing, rest: Sequence[int], left: Sequence[int]) -> bool:
    return all(
        now == before or (capped and now >= taken)
        for now, before, taken, capped in zip(
            rest, left, packing.taken, packing.capped, strict=True
        )
    )


def _report(
    ordered: Sequence[ResourceDemand],
    left: Sequence[int],
    ledger: Ledger,
    copies: Copies,
    outcome: Outcome,
    scorer: Scorer,
) -> None:
    """No group can take any of what is left: each shape with every group's reason."""
    for request, n in zip(ordered, left, strict=True):
        if n:
            _, reasons = count_options(ledger, copies, request.bundle, n, scorer)
            outcome.unmet(ResourceDemand(request.bundle, n, request.source), reasons, n)
