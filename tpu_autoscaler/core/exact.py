"""Whether a small demand fits on given hosts, by exhaustive search.

First fit decides most plans, and on a few small instances it needs one replica more
than the optimum (bin packing is hard; order matters). When the pending demand has
at most `MAX_BUNDLES` bundles the policy asks this module instead, for each candidate
number of new replicas in cost order, so small plans launch the fewest chips.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpu_autoscaler.core.demand import (
    RESOURCE_EPSILON,
    Bundle,
    GangStrategy,
    offered,
    selector_matches,
)
from tpu_autoscaler.core.slots import SlotHost

MAX_BUNDLES = 10
MAX_HOSTS = 64
MAX_STEPS = 20_000
"""Placements tried per plan pass, over all searches; past it the answer is unknown
and first fit decides. Counted, not timed, so plans stay deterministic."""


class Budget:
    def __init__(self, steps: int = MAX_STEPS) -> None:
        self.steps_left = steps


class SearchTooLong(Exception):
    """The search would take more than MAX_STEPS placements."""


@dataclass(frozen=True, slots=True)
class Item:
    """A gang (with its strategy) or one task's bundle (strategy None)."""

    bundles: tuple[Bundle, ...]
    strategy: GangStrategy | None = None


def assign(
    hosts: Sequence[SlotHost], items: Sequence[Item], budget: Budget | None = None
) -> list[tuple[int, Bundle, SlotHost]] | None:
    """An assignment of every bundle to a host that matches its selector and has room,
    STRICT_SPREAD bundles of one item on distinct hosts and STRICT_PACK ones on one,
    as (the bundle's index in `items`, bundle, host); None if there is none;
    SearchTooLong if that takes over MAX_STEPS placements. Hosts' capacity is not
    changed."""
    flat: list[tuple[int, Bundle]] = [(i, b) for i, item in enumerate(items) for b in item.bundles]
    flat.sort(key=lambda ib: -sum(ib[1].resources.values()))
    free = [dict(h.free) for h in hosts]
    fresh = [h.free == h.total and h.replica.new for h in hosts]
    candidates = [
        [j for j, h in enumerate(hosts) if selector_matches(b.selector, h.labels)] for _, b in flat
    ]
    placed_on: dict[int, list[int]] = {}
    chosen: list[int] = []
    budget = budget or Budget()

    def fits(j: int, bundle: Bundle) -> bool:
        room = free[j]
        return all(offered(room, k) + RESOURCE_EPSILON >= v for k, v in bundle.resources.items())

    def search(position: int) -> bool:
        if position == len(flat):
            return True
        budget.steps_left -= 1
        if budget.steps_left < 0:
            raise SearchTooLong
        item_index, bundle = flat[position]
        strategy = items[item_index].strategy
        mine = placed_on.setdefault(item_index, [])
        seen_fresh: set[tuple[int, ...]] = set()
        for j in candidates[position]:
            if strategy is GangStrategy.STRICT_SPREAD and j in mine:
                continue
            if strategy is GangStrategy.STRICT_PACK and mine and j != mine[0]:
                continue
            if not fits(j, bundle):
                continue
            if fresh[j] and free[j] == hosts[j].total:
                # Untouched new hosts of one kind are interchangeable: try one of each.
                signature = (id(hosts[j].labels), hosts[j].index)
                if signature in seen_fresh:
                    continue
                seen_fresh.add(signature)
            for k, v in bundle.resources.items():
                free[j][k] = offered(free[j], k) - v
            mine.append(j)
            chosen.append(j)
            if search(position + 1):
                return True
            chosen.pop()
            mine.pop()
            for k, v in bundle.resources.items():
                free[j][k] += v
        return False

    if not search(0):
        return None
    return [(i, bundle, hosts[j]) for (i, bundle), j in zip(flat, chosen, strict=True)]
