"""The policy against an exhaustive oracle on small single-group instances: the
fewest replicas (hence chips) with which every bundle of the demand fits."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import tpu_group
from tests.snapshots import shapes_for, snapshot
from tests.test_policy_properties import SMALL_SLICES
from tpu_autoscaler.catalog import SliceType
from tpu_autoscaler.demand import Bundle, Demand, GangDemand, GangStrategy, ResourceDemand
from tpu_autoscaler.policy import plan

MAX_BUNDLES = 10


def oracle_replicas(
    hosts_per_replica: int,
    tpu_per_host: float,
    items: list[tuple[GangStrategy | None, list[float]]],
) -> int:
    """Fewest replicas holding every item; an item is a gang (strategy, sizes) or a
    lone bundle (None, [size]). Exhaustive backtracking, empty hosts tried once."""
    flat: list[tuple[int, float, GangStrategy | None]] = []
    for item_id, (strategy, sizes) in enumerate(items):
        flat.extend((item_id, size, strategy) for size in sizes)
    flat.sort(key=lambda b: -b[1])

    def feasible(host_count: int) -> bool:
        free = [tpu_per_host] * host_count
        placed: dict[int, list[int]] = {}

        def go(i: int) -> bool:
            if i == len(flat):
                return True
            item_id, size, strategy = flat[i]
            mine = placed.setdefault(item_id, [])
            tried_empty = False
            for h in range(host_count):
                if free[h] + 1e-9 < size:
                    continue
                if strategy is GangStrategy.STRICT_SPREAD and h in mine:
                    continue
                if strategy is GangStrategy.STRICT_PACK and mine and h != mine[0]:
                    continue
                empty = free[h] == tpu_per_host
                if empty and tried_empty:
                    continue
                tried_empty = tried_empty or empty
                free[h] -= size
                mine.append(h)
                if go(i + 1):
                    return True
                mine.pop()
                free[h] += size
            return False

        return go(0)

    replicas = 0
    while not feasible(replicas * hosts_per_replica):
        replicas += 1
    return replicas


@st.composite
def instances(draw: st.DrawFn) -> tuple[SliceType, list[tuple[GangStrategy | None, list[float]]]]:
    s = draw(st.sampled_from(SMALL_SLICES))
    per_host = float(s.chips_per_host)
    sizes = st.sampled_from(
        sorted({1.0, 2.0, per_host} & {x for x in (1.0, 2.0, per_host) if x <= per_host})
    )
    items: list[tuple[GangStrategy | None, list[float]]] = []
    total = 0
    while total < MAX_BUNDLES and draw(st.booleans()):
        if draw(st.booleans()):
            strategy = draw(st.sampled_from(list(GangStrategy)))
            gang = draw(st.lists(sizes, min_size=1, max_size=min(4, MAX_BUNDLES - total)))
            if strategy is GangStrategy.STRICT_PACK and sum(gang) > per_host:
                gang = gang[:1]
            if strategy is GangStrategy.STRICT_SPREAD:
                gang = gang[: s.hosts * 4]
            items.append((strategy, gang))
            total += len(gang)
        else:
            items.append((None, [draw(sizes)]))
            total += 1
    return s, items


def _demand(items: list[tuple[GangStrategy | None, list[float]]]) -> Demand:
    resources = []
    gangs = []
    for i, (strategy, sizes) in enumerate(items):
        bundles = tuple(Bundle({"TPU": size}) for size in sizes)
        if strategy is None:
            resources.append(ResourceDemand(bundles[0], 1))
        else:
            gangs.append(GangDemand(f"g{i}", bundles, strategy))
    return Demand(tuple(resources), tuple(gangs))


def _policy_and_oracle(
    s: SliceType, items: list[tuple[GangStrategy | None, list[float]]]
) -> tuple[int, int]:
    (shape,) = shapes_for(tpu_group("tpu", s, 0, 40))
    result = plan(snapshot((shape,), demand=_demand(items)))
    assert result.bundles_unmet == 0
    return result.launched("tpu"), oracle_replicas(
        shape.hosts_per_replica, shape.tpu_per_host, items
    )


@settings(max_examples=300)
@given(instances())
def test_single_group_plans_stay_within_one_replica_of_the_oracle(
    instance: tuple[SliceType, list],
) -> None:  # type: ignore[type-arg]
    launched, best = _policy_and_oracle(*instance)
    assert best <= launched <= best + 1, instance


def _random_instance(
    rng: random.Random,
) -> tuple[SliceType, list[tuple[GangStrategy | None, list[float]]]]:
    s = rng.choice(SMALL_SLICES)
    per_host = float(s.chips_per_host)
    sizes = sorted({1.0, 2.0, per_host})
    items: list[tuple[GangStrategy | None, list[float]]] = []
    total = rng.randint(1, MAX_BUNDLES)
    while total > 0:
        if rng.random() < 0.5:
            strategy = rng.choice(list(GangStrategy))
            gang = [rng.choice(sizes) for _ in range(min(total, rng.randint(1, 4)))]
            if strategy is GangStrategy.STRICT_PACK and sum(gang) > per_host:
                gang = gang[:1]
            items.append((strategy, gang))
            total -= len(gang)
        else:
            items.append((None, [rng.choice(sizes)]))
            total -= 1
    return s, items


def test_exact_match_share_on_single_group_instances() -> None:
    """The share of seeded random instances on which the plan launches exactly the
    fewest replicas; the closing notes report it."""
    rng = random.Random(20261202)
    outcomes = [_policy_and_oracle(*_random_instance(rng)) for _ in range(500)]
    exact = sum(launched == best for launched, best in outcomes) / len(outcomes)
    assert all(best <= launched <= best + 1 for launched, best in outcomes)
    print(f"exact oracle matches: {exact:.1%} of {len(outcomes)}")
    assert exact >= 0.97
