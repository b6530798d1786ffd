"""Tasks and actors with label selector fallbacks (Ray 2.60's `fallback_strategy`:
the request lists several selectors, and a host matching any of them may take it).

Existing capacity first, under each selector in order (Ray scores a node matching an
earlier selector higher); what is left launches for the earliest selector some group
can launch for now, else waits on the earliest one a limit holds back; infeasible
only if no group can ever serve any of them."""

from __future__ import annotations

from tpu_autoscaler.core.demand import Bundle
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.plan import GroupReason
from tpu_autoscaler.core.policy.counts import Copies, count_options
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.outcome import Outcome, Reasons, dedupe
from tpu_autoscaler.core.policy.utilization import Scorer


def serve_existing(bundle: Bundle, count: int, world: World, outcome: Outcome) -> int:
    """Place up to `count` copies on existing capacity, selector by selector; how many."""
    left = count
    for variant in bundle.variants():
        left = world.place_count(variant, left)
        if not left:
            break
    outcome.placed(count - left)
    return count - left


def variant_to_launch(
    bundle: Bundle, count: int, ledger: Ledger, copies: Copies, scorer: Scorer
) -> Bundle | None:
    """The bundle under the earliest selector a group can launch for now, else under
    the earliest one only a limit holds back; None if no group ever can."""
    blocked = None
    for variant in bundle.variants():
        options, reasons = count_options(ledger, copies, variant, count, scorer)
        if options:
            return variant
        if reasons.blocked and blocked is None:
            blocked = variant
    return blocked


def reasons(bundle: Bundle, count: int, ledger: Ledger, copies: Copies, scorer: Scorer) -> Reasons:
    """Every group's reason under every selector."""
    never: list[GroupReason] = []
    for variant in bundle.variants():
        never += count_options(ledger, copies, variant, count, scorer)[1].never
    return Reasons((), tuple(dedupe(never)))
