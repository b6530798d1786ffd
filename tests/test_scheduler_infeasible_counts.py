"""An infeasible request with a count goes back to Ray once per copy, as Ray 2.60's
scheduler reports it (it ungroups requests by count), so `ray status` counts them all."""

from __future__ import annotations

from ray.autoscaler.v2.utils import ResourceRequestUtil

from tests.factories import cpu_group
from tests.ray_requests import node_type, request
from tests.snapshots import shapes_for, snapshot
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.policy import plan


def test_two_copies_no_type_can_hold_are_reported_twice() -> None:
    gpu2 = ResourceRequestUtil.make({"GPU": 2})
    cpu = ResourceRequestUtil.make({"CPU": 1})
    scheduler = SliceScheduler(cluster=None)
    reply = scheduler.schedule(request([node_type("cpu", {"CPU": 4})], tasks=[gpu2, gpu2, cpu]))
    assert [dict(r.resources_bundle) for r in reply.infeasible_resource_requests] == [
        {"GPU": 2.0},
        {"GPU": 2.0},
    ]


def test_the_plan_says_how_many_copies_are_unserved() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 0, 4))
    demand = Demand(resources=(ResourceDemand(Bundle({"GPU": 1.0}), 3),))
    (unmet,) = plan(snapshot((shape,), demand=demand)).infeasible
    assert unmet.copies == 3
