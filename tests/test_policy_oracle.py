"""The policy against an exhaustive oracle on small single-group instances: the
fewest replicas (hence chips) with which every bundle of the demand fits."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import tpu_group
from tests.snapshots import shapes_for, snapshot
from tests.test_policy_properties import SMALL_SLICES
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.core.demand import (
    Bundle,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    selector_from_mapping,
)
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.shape import SliceShape

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
def test_single_group_plans_match_the_oracle(
    instance: tuple[SliceType, list[tuple[GangStrategy | None, list[float]]]],
) -> None:
    launched, best = _policy_and_oracle(*instance)
    assert launched == best, instance


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


def test_single_group_seeded_sample_matches_the_oracle() -> None:
    rng = random.Random(20261202)
    outcomes = [_policy_and_oracle(*_random_instance(rng)) for _ in range(500)]
    assert [launched - best for launched, best in outcomes] == [0] * len(outcomes)


# --- several groups ---------------------------------------------------------------


def _assignable(
    hosts: list[tuple[dict[str, str], dict[str, float]]],
    items: list[tuple[GangStrategy | None, list[Bundle]]],
) -> bool:
    flat = [(n, b) for n, (_, bundles) in enumerate(items) for b in bundles]
    used: dict[int, list[int]] = {}

    def go(i: int) -> bool:
        if i == len(flat):
            return True
        n, b = flat[i]
        strategy = items[n][0]
        mine = used.setdefault(n, [])
        for h, (host_labels, free) in enumerate(hosts):
            if not all(c.matches(host_labels) for c in b.selector):
                continue
            if any(free.get(k, 0.0) + 1e-9 < v for k, v in b.resources.items()):
                continue
            if strategy is GangStrategy.STRICT_SPREAD and h in mine:
                continue
            if strategy is GangStrategy.STRICT_PACK and mine and h != mine[0]:
                continue
            for k, v in b.resources.items():
                free[k] -= v
            mine.append(h)
            if go(i + 1):
                return True
            mine.pop()
            for k, v in b.resources.items():
                free[k] += v
        return False

    return go(0)


def multi_oracle_chips(
    shapes: list[SliceShape], items: list[tuple[GangStrategy | None, list[Bundle]]]
) -> int | None:
    """Fewest chips over replica counts per group (each up to its max) that hold every
    item; plain backtracking with no pruning but capacity."""
    best: int | None = None
    for counts in itertools.product(*(range(s.max_replicas + 1) for s in shapes)):
        chips = sum(k * s.chips_per_replica for k, s in zip(counts, shapes, strict=True))
        if best is not None and chips >= best:
            continue
        hosts = [
            (s.host_labels(i), dict(s.host_resources(i)))
            for k, s in zip(counts, shapes, strict=True)
            for _ in range(k)
            for i in range(s.hosts_per_replica)
        ]
        if _assignable(hosts, items):
            best = chips
    return best


def _random_multi(
    rng: random.Random,
) -> tuple[list[SliceShape], list[tuple[GangStrategy | None, list[Bundle]]]]:
    picks = rng.sample(SMALL_SLICES[:4], 2)
    shapes = list(shapes_for(*(tpu_group(f"g{i}", s, 0, 2) for i, s in enumerate(picks))))
    items: list[tuple[GangStrategy | None, list[Bundle]]] = []
    total = rng.randint(1, 6)
    while total > 0:
        shape = rng.choice(shapes)
        assert shape.tpu is not None
        pod_type = {"ray.io/tpu-pod-type": shape.tpu.pod_type}
        selector = selector_from_mapping(pod_type) if rng.random() < 0.5 else ()
        size = rng.choice(sorted({1.0, 2.0, shape.tpu_per_host}))
        strategy = rng.choice([None, GangStrategy.STRICT_SPREAD, GangStrategy.PACK])
        count = 1 if strategy is None else min(total, rng.randint(1, 3))
        items.append((strategy, [Bundle({"TPU": size}, selector)] * count))
        total -= count
    return shapes, items


def test_several_groups_stay_within_one_replica_of_the_oracle() -> None:
    rng = random.Random(7)
    feasible = exact_matches = 0
    for _ in range(150):
        shapes, items = _random_multi(rng)
        best = multi_oracle_chips(shapes, items)
        demand = Demand(
            tuple(ResourceDemand(b[0], 1) for s, b in items if s is None),
            tuple(
                GangDemand(f"g{n}", tuple(b), s) for n, (s, b) in enumerate(items) if s is not None
            ),
        )
        result = plan(snapshot(tuple(shapes), demand=demand))
        if best is None:
            assert result.bundles_unmet > 0
            continue
        feasible += 1
        assert result.bundles_unmet == 0
        chips = sum(result.launched(s.group) * s.chips_per_replica for s in shapes)
        assert best <= chips <= best + max(s.chips_per_replica for s in shapes), (
            items,
            result.launch,
        )
        exact_matches += chips == best
    print(f"several groups: {exact_matches} of {feasible} feasible instances exact")
