"""Small TPU demand (at most `exact.MAX_BUNDLES` bundles on at most `exact.MAX_HOSTS`
hosts, some asking for TPUs) served with the fewest chips: launch counts per group
are tried cheapest first, each by an exhaustive assignment of the bundles to hosts
(`exact.py`)."""

from __future__ import annotations

import itertools

from tpu_autoscaler.core import exact
from tpu_autoscaler.core.demand import Bundle, Demand, GangStrategy, pinned_slice
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.policy.counts import Copies
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.outcome import Outcome

MAX_VECTORS = 256
"""Launch-count combinations tried at most; more and the greedy path serves."""
_STRICT = (GangStrategy.STRICT_PACK, GangStrategy.STRICT_SPREAD)

LaunchVector = tuple[tuple[str, int], ...]
"""Replicas to launch per group."""


def serve_exactly(
    demand: Demand, ledger: Ledger, copies: Copies, outcome: Outcome, world: World
) -> bool:
    """Serve all of `demand` with the cheapest launches that hold it; False (nothing
    changed) when it is not small, or cannot be served whole within the limits."""
    if len(world.hosts) > exact.MAX_HOSTS or _too_many_bundles(demand):
        return False  # before listing the items: demand may be 100,000 bundles
    items = [
        exact.Item(g.bundles, g.strategy if g.strategy in _STRICT else None) for g in demand.gangs
    ] + [
        exact.Item((r.bundle,))
        for r in demand.resources
        for _ in range(min(r.count, exact.MAX_BUNDLES + 1))
    ]
    bundles = [b for item in items for b in item.bundles]
    if not bundles or len(bundles) > exact.MAX_BUNDLES or len(world.hosts) > exact.MAX_HOSTS:
        return False
    # Slice heads, pinned bundles and fallbacks have rules of their own elsewhere.
    if any(b.head_resource or b.fallbacks or pinned_slice(b.selector) is not None for b in bundles):
        return False
    if not any(b.tpu > 0 for b in bundles):
        # Demand without TPUs costs no chips whichever groups serve it: Ray's greedy
        # node-by-node choice (the expander's chain) decides it, as Ray would.
        return False
    budget = exact.Budget()
    for vector in _launch_vectors(ledger, copies, bundles):
        additions = [(ledger.groups[group].shape, count) for group, count in vector]
        with world.trial(additions):
            try:
                found = len(world.hosts) <= exact.MAX_HOSTS and exact.assign(
                    world.hosts, items, budget
                )
            except exact.SearchTooLong:
                return False
        if not found:
            continue
        wanted = "; ".join([str(r) for r in demand.resources] + [str(g) for g in demand.gangs])
        for group, count in vector:
            if count:
                ledger.launch(
                    group,
                    count,
                    f"{wanted}: {count} x {group}, the fewest chips (exhaustive search)",
                )
        assignment = exact.assign(world.hosts, items)
        assert assignment is not None  # the same search on the same hosts
        for bundle, host in assignment:
            world.take(host, bundle.resources)
        outcome.placed(len(bundles))
        return True
    return False


def _too_many_bundles(demand: Demand) -> bool:
    """More than `exact.MAX_BUNDLES` bundles, counted only as far as that."""
    bundles = 0
    for gang in demand.gangs:
        bundles += len(gang.bundles)
        if bundles > exact.MAX_BUNDLES:
            return True
    for request in demand.resources:
        bundles += request.count
        if bundles > exact.MAX_BUNDLES:
            return True
    return False


def _launch_vectors(ledger: Ledger, copies: Copies, bundles: list[Bundle]) -> list[LaunchVector]:
    """Launch counts per group to try, cheapest first (chips, replicas, churn,
    priority, cost, cloud availability)."""
    ranges = []
    for state in ledger.groups.values():
        if any(copies(state.shape, b) for b in bundles):
            top = min(state.limit(ledger.now_s)[0], len(bundles))
            ranges.append([(state.shape.group, k) for k in range(top + 1)])
    vectors: list[LaunchVector] = [()] if not ranges else list(itertools.product(*ranges))
    if len(vectors) > MAX_VECTORS:
        return []

    def cost(
        vector: LaunchVector,
    ) -> tuple[int, int, int, int, int, float, float, tuple[str, ...]]:
        chips = sum(k * ledger.groups[g].shape.chips_per_replica for g, k in vector)
        priority = sum(k * ledger.groups[g].shape.priority for g, k in vector)
        churning = sum(k for g, k in vector if ledger.groups[g].churning)
        prices = [(k, ledger.groups[g].shape.scarcity.cost) for g, k in vector]
        unpriced = sum(k for k, price in prices if price is None)
        price = sum(k * price for k, price in prices if price is not None)
        unavailable = sum(k * (1.0 - ledger.groups[g].availability) for g, k in vector)
        # The expander's chain: churn, priority, cost (unknown last), availability.
        return (
            chips,
            sum(k for _, k in vector),
            churning,
            -priority,
            unpriced,
            price,
            unavailable,
            tuple(g for g, k in vector if k),
        )

    return sorted(vectors, key=cost)
