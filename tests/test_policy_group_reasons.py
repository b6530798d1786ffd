"""Each group's verdict on demand no group launched for travels with the decision as
data (skipped: a limit stands in the way now; rejected: never), as cluster-autoscaler's
scale-up status reports skipped and rejected node groups."""

from __future__ import annotations

from tests.factories import cpu_group, tpu_group
from tests.snapshots import running_replica, shapes_for, snapshot
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    selector_from_mapping,
)
from tpu_autoscaler.core.plan import GroupReason, GroupVerdict
from tpu_autoscaler.core.policy import plan

V6E_4X4 = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]
V6E_2X4 = catalog.slice_type(catalog.find_generation("v6e"), "2x4")  # type: ignore[arg-type]


def _verdicts(groups: tuple[GroupReason, ...]) -> dict[str, GroupVerdict]:
    return {g.group: g.verdict for g in groups}


def test_a_full_group_is_skipped_and_a_group_that_cannot_hold_it_rejected() -> None:
    shapes = shapes_for(tpu_group("big", V6E_4X4, max_replicas=1), cpu_group("cpu"))
    big = next(s for s in shapes if s.group == "big")
    busy = running_replica(big, 0, used={h: {"TPU": 4} for h in range(4)})
    result = plan(
        snapshot(shapes, [busy], Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 1),)))
    )
    assert result.launch == ()
    (waiting,) = result.waiting
    assert _verdicts(waiting.groups) == {"big": GroupVerdict.SKIPPED, "cpu": GroupVerdict.REJECTED}
    skipped = next(g for g in waiting.groups if g.group == "big")
    assert skipped.message in waiting.reason and "maxReplicas 1" in skipped.message
    rejected = next(g for g in waiting.groups if g.group == "cpu")
    assert rejected.message not in waiting.reason  # the reason tells what waits on


def test_infeasible_demand_names_every_group_rejected() -> None:
    shapes = shapes_for(tpu_group("small", V6E_2X4), tpu_group("big", V6E_4X4), cpu_group("cpu"))
    pinned = selector_from_mapping({"ray.io/tpu-pod-type": "v5p-32"})
    result = plan(
        snapshot(
            shapes, demand=Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}, pinned), 1),))
        )
    )
    (infeasible,) = result.infeasible
    assert _verdicts(infeasible.groups) == dict.fromkeys(
        ("small", "big", "cpu"), GroupVerdict.REJECTED
    )
    for group in infeasible.groups:
        assert group.group in group.message and group.message in infeasible.reason


def test_a_gang_too_big_for_max_replicas_is_rejected_and_one_held_by_a_limit_skipped() -> None:
    shapes = shapes_for(tpu_group("big", V6E_4X4, max_replicas=1))
    gang = GangDemand("pg", (Bundle({"TPU": 4.0}),) * 8, GangStrategy.STRICT_SPREAD)
    (never,) = plan(snapshot(shapes, demand=Demand(gangs=(gang,)))).infeasible
    assert [(g.group, g.verdict) for g in never.groups] == [("big", GroupVerdict.REJECTED)]
    shapes = shapes_for(tpu_group("big", V6E_4X4, max_replicas=2))
    (big,) = shapes
    busy = running_replica(big, 0, used={h: {"TPU": 4} for h in range(4)})
    (later,) = plan(snapshot(shapes, [busy], Demand(gangs=(gang,)))).waiting
    assert [(g.group, g.verdict) for g in later.groups] == [("big", GroupVerdict.SKIPPED)]


def test_plan_json_carries_the_verdicts() -> None:
    shapes = shapes_for(cpu_group("cpu"))
    result = plan(
        snapshot(shapes, demand=Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 1),)))
    )
    (entry,) = result.to_json()["infeasible"]
    assert entry["groups"] == [
        {"group": "cpu", "verdict": "rejected", "message": entry["groups"][0]["message"]}
    ]
    assert "cpu" in entry["groups"][0]["message"]
