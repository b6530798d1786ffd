"""`cloud_resource_availabilities` (Ray 2.60: 0 for the node type whose allocation
timed out last, 1 for one that never failed): among groups that serve the demand
equally well, the one just stocked out is launched last, as Ray ranks it."""

from __future__ import annotations

from dataclasses import replace

from ray.autoscaler.v2.utils import ResourceRequestUtil

from tests.factories import cpu_group, tpu_group
from tests.ray_requests import launched, node_type, request
from tests.snapshots import shapes_for, slice_head_gang, snapshot
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.policy import plan


def _groups(result) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(x.group for x in result.launch)


def test_tasks_avoid_the_group_that_just_stocked_out() -> None:
    shapes = shapes_for(cpu_group("a", 0, 4), cpu_group("b", 0, 4))
    demand = Demand(resources=(ResourceDemand(Bundle({"CPU": 4.0}), 4),))
    # Equal groups alternate, as Ray's node type rotation has them.
    assert _groups(plan(snapshot(shapes, demand=demand))) == ["a", "b"]
    stocked_out = replace(snapshot(shapes, demand=demand), availability={"a": 0.0})
    assert _groups(plan(stocked_out)) == ["b"]
    # Past the exhaustive search's size: the greedy path ranks alike.
    many = Demand(resources=(ResourceDemand(Bundle({"CPU": 1.0}), 20),))
    assert _groups(plan(replace(snapshot(shapes, demand=many), availability={"a": 0.0}))) == ["b"]


def test_slices_avoid_the_group_that_just_stocked_out() -> None:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    slice_type = catalog.slice_type(v6e, "4x4")
    shapes = shapes_for(tpu_group("spot", slice_type), tpu_group("reserved", slice_type))
    demand = Demand(gangs=(slice_head_gang("v6e-16", 2),))
    # Equal slices: the RayCluster's first group (Ray's node type order).
    assert _groups(plan(snapshot(shapes, demand=demand))) == ["spot"]
    stocked_out = replace(snapshot(shapes, demand=demand), availability={"spot": 0.0})
    assert _groups(plan(stocked_out)) == ["reserved"]


def test_a_stocked_out_group_still_serves_what_only_it_can() -> None:
    shapes = shapes_for(cpu_group("a", 0, 4), cpu_group("b", 0, 4))
    a, b = shapes
    small = replace(b, resources_per_host={"CPU": 1.0})
    demand = Demand(resources=(ResourceDemand(Bundle({"CPU": 4.0}), 1),))
    assert _groups(plan(replace(snapshot((a, small), demand=demand), availability={"a": 0.0}))) == [
        "a"
    ]


def test_the_scheduler_reads_rays_availabilities() -> None:
    types = [node_type("type_a", {"CPU": 1}), node_type("type_b", {"CPU": 1})]
    tasks = [ResourceRequestUtil.make({"CPU": 1})]
    scheduler = SliceScheduler(cluster=None)
    assert launched(scheduler.schedule(request(types, tasks=tasks))) == {"type_a": 1}
    reply = scheduler.schedule(
        request(types, tasks=tasks, cloud_resource_availabilities={"type_a": 0.0, "type_b": 1.0})
    )
    assert launched(reply) == {"type_b": 1}
