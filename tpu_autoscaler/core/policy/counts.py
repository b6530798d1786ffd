"""Demand counted in copies of one bundle (tasks, actors, `request_resources`):
placed first fit, and what does not fit launches the best group's replicas until it
does or no group may grow. A TPU group's option launches what the whole count needs
(slices are chosen by their total chips); a group without TPUs grows as Ray grows
node types, one node at a time, each the best by Ray's score for what is left."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tpu_autoscaler.core.demand import Bundle
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.plan import GroupReason
from tpu_autoscaler.core.policy import expander
from tpu_autoscaler.core.policy.expander import Choice, Option, Rotation
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.outcome import Outcome, Reasons, rejected, skipped
from tpu_autoscaler.core.policy.utilization import Score, Scorer
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Chips, Replicas


class Copies:
    """How many copies of a bundle one empty replica of a group holds, remembered per
    group and bundle kind for the plan."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, object], int] = {}

    def __call__(self, shape: SliceShape, bundle: Bundle) -> int:
        key = (shape.group, bundle.key)
        copies = self._known.get(key)
        if copies is None:
            copies = self._known[key] = expander.copies_per_replica(shape, bundle)
        return copies


def count_options(
    ledger: Ledger,
    copies: Copies,
    bundle: Bundle,
    count: int,
    scorer: Scorer,
    rotation: Rotation | None = None,
) -> tuple[list[Option], Reasons]:
    """Every group that could hold `count` copies of `bundle` now, as an option; why
    the others cannot."""
    options: list[Option] = []
    holds: list[int] = []
    """Copies each option's replicas hold: fewer than `count` if its limit caps it."""
    sizes: list[tuple[int, Chips]] = []
    blocked: list[GroupReason] = []
    never: list[GroupReason] = []
    for order, state in enumerate(ledger.groups.values()):
        shape = state.shape
        per_replica = copies(shape, bundle)
        if per_replica == 0:
            never.append(rejected(shape.group, expander.why_not(shape, bundle)))
            continue
        if shape.max_replicas == 0:
            never.append(rejected(shape.group, f"{shape.group} has maxReplicas 0"))
            continue
        limit, why = state.limit(ledger.now_s)
        if limit == 0:
            blocked.append(skipped(shape.group, why or shape.group))
            continue
        replicas = Replicas(min(math.ceil(count / per_replica), limit))
        holds.append(min(count, replicas * per_replica))
        sizes.append((per_replica, shape.chips_per_replica))
        options.append(
            Option(
                shape.group,
                replicas,
                Chips(replicas * shape.chips_per_replica),
                shape.priority,
                f"{replicas} x {shape.group} ({per_replica} per replica)",
                order,
                _first_replica_score(scorer, shape, bundle, min(count, per_replica)),
                rotation.last_chosen(shape.group) if rotation is not None else -1,
                availability=state.availability,
                cost=shape.scarcity.cost,
                churning=state.churning,
            )
        )
    return _compared_for_the_same_work(options, holds, sizes), Reasons(tuple(blocked), tuple(never))


def _compared_for_the_same_work(
    options: list[Option], holds: list[int], sizes: list[tuple[int, Chips]]
) -> list[Option]:
    """When a group's limit leaves it room for only part of the count, every option is
    ranked by what it needs for the copies the least of them holds: otherwise a group
    with one replica of room looks cheapest for doing less, and wins on chips before
    churn, priority or cost are asked (found by the fallback machine: a churning spot
    with room for one slice took it from a steadier group with room for all). Each
    option still launches what it needs for the whole count, as before."""
    if not holds or min(holds) == max(holds):
        return options
    common = min(holds)
    compared = []
    for option, (per_replica, chips_per_replica) in zip(options, sizes, strict=True):
        replicas = Replicas(math.ceil(common / per_replica))
        compared.append(
            replace(
                option,
                compared_replicas=replicas,
                compared_chips=Chips(replicas * chips_per_replica),
            )
        )
    return compared


def serve_count(
    ledger: Ledger,
    copies: Copies,
    outcome: Outcome,
    world: World,
    bundle: Bundle,
    count: int,
    scorer: Scorer,
    rotation: Rotation,
    reason: Callable[[int, list[Option], Choice], str],
    unmet: Callable[[int], object],
) -> None:
    """Place `count` copies of `bundle` on `world`, launching for the rest; what
    cannot be launched for goes to `outcome` as `unmet(copies left)`. A launch's
    reason is `reason(copies left, options, chosen)`."""
    remaining = world.place_count(bundle, count)
    outcome.placed(count - remaining)
    while remaining:
        options, reasons = count_options(ledger, copies, bundle, remaining, scorer, rotation)
        choice = expander.choose(options)
        if choice is None:
            outcome.unmet(unmet(remaining), reasons, remaining)
            return
        chosen = choice.option
        ledger.launch(
            chosen.group,
            _launch_now(choice, options, ledger, copies, bundle, remaining),
            reason(remaining, options, choice),
        )
        rotation.chose(chosen.group)
        after = world.place_count(bundle, remaining)
        outcome.placed(remaining - after)
        if after == remaining:  # cannot happen unless shapes lie; never loop forever
            outcome.unmet(
                unmet(remaining),
                Reasons((skipped(chosen.group, f"{chosen.group} launched but did not fit"),)),
                remaining,
            )
            return
        remaining = after


def _first_replica_score(
    scorer: Scorer, shape: SliceShape, bundle: Bundle, copies: int
) -> Callable[[], Score]:
    return lambda: scorer.copies(shape, bundle, copies)


def _launch_now(
    choice: Choice,
    options: list[Option],
    ledger: Ledger,
    copies: Copies,
    bundle: Bundle,
    count: int,
) -> int:
    """Replicas of the chosen group to launch in this step. A TPU group launches what
    the count needs (its option was ranked by those chips). A group without TPUs
    launches node by node as Ray does, but as many at once as Ray's greedy loop would
    pick in a row: while every group would still be scored on full replicas (at least
    the largest option's copies left), every score and so the choice stay the same;
    unless only Ray's rotation decided, which moves on with every node."""
    chosen = choice.option
    if chosen.chips:
        return chosen.replicas
    per_chosen = copies(ledger.groups[chosen.group].shape, bundle)
    largest = max(copies(ledger.groups[o.group].shape, bundle) for o in options)
    if choice.decided_by == expander.CHAIN[-1].name:
        return 1
    in_a_row = 1 + max(0, (count - largest) // per_chosen)
    return min(in_a_row, chosen.replicas)
