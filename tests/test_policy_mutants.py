"""Behaviour of the slice policy pinned where mutation testing found the suite silent:
each test states what `plan` does, through `plan` only, so that it survives a rewrite
of the policy's internals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.factories import cpu_group, tpu_group
from tests.snapshots import (
    apply_plan,
    pending_replica,
    running_replica,
    shapes_for,
    snapshot,
    v6e_16_shapes,
)
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    selector_from_mapping,
)
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import PolicyConfig

ANY_HOST = selector_from_mapping({})


def _tpu_gangs(count: int, bundles: int, strategy: GangStrategy) -> tuple[GangDemand, ...]:
    bundle = Bundle({"TPU": 4.0}, ANY_HOST)
    return tuple(GangDemand(f"pg-{i}", (bundle,) * bundles, strategy) for i in range(count))


# --- gangs of one kind launch only what they fill ----------------------------------------


@pytest.mark.parametrize(
    ("gangs", "bundles", "tasks", "replicas"),
    [(4, 3, 0, 3), (4, 3, 4, 4), (4, 5, 0, 5), (4, 5, 3, 6)],
)
def test_identical_gangs_spanning_slices_launch_only_the_replicas_they_fill(
    gangs: int, bundles: int, tasks: int, replicas: int
) -> None:
    """PACK gangs of 4-chip bundles, too many for the exhaustive search, served as one
    run of a kind: soft gangs may span slices, so as many 4-host slices launch as the
    gangs' hosts fill, and single tasks after them get capacity of their own (none is
    left over on slices launched for the gangs and not counted as launched)."""
    (shape,) = v6e_16_shapes(max_replicas=10)
    demand = Demand(
        gangs=_tpu_gangs(gangs, bundles, GangStrategy.PACK),
        resources=(ResourceDemand(Bundle({"TPU": 4.0}, ANY_HOST), tasks),) if tasks else (),
    )
    result = plan(snapshot((shape,), [], demand))
    (launch,) = result.launch
    assert launch.replicas == replicas == math.ceil((gangs * bundles + tasks) / 4)
    gang_reasons = [r for r in launch.reason.split("; ") if "placement group" in r]
    assert len(gang_reasons) == 1
    assert gang_reasons[0].startswith(f"3 x placement group (PACK: {bundles} x {{TPU: 4}})")
    assert result.infeasible == () and result.waiting == ()
    assert result.bundles_placed == gangs * bundles + tasks and result.bundles_unmet == 0
    assert plan(apply_plan(snapshot((shape,), [], demand), result)).launch == ()


# --- a replica KubeRay is still creating --------------------------------------------------


def test_a_replica_missing_pods_is_broken_once_its_newest_pod_is_creation_timeout_old() -> None:
    (shape,) = v6e_16_shapes()
    config = PolicyConfig()
    now = 1000.0
    partial = pending_replica(shape, 0, created_at_s=now - 100.0)
    partial = replace(partial, hosts=partial.hosts[:3])

    def removed(newest_pod_age_s: float) -> bool:
        replica = replace(partial, last_pod_created_at_s=now - newest_pod_age_s)
        result = plan(replace(snapshot((shape,), [replica], now_s=now), config=config))
        return [t.replica for t in result.terminate] == [replica.name]

    assert not removed(config.creation_timeout_s - 0.5)  # KubeRay still adding pods
    assert removed(config.creation_timeout_s)  # exactly the timeout: given up on
    assert removed(config.creation_timeout_s + 0.5)


# --- request_resources --------------------------------------------------------------------


def test_request_resources_counts_every_bundle_it_places_on_capacity_it_launches() -> None:
    """Six 4-chip bundles, one slice already up: four land on it, two on a slice
    launched for them; all six are placed, none is unmet."""
    (shape,) = v6e_16_shapes(max_replicas=4)
    up = running_replica(shape, 0, used={h: {"TPU": 4} for h in range(4)})  # busy: no matter
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 6)
    result = plan(snapshot((shape,), [up], Demand(constraints=(constraint,))))
    (launch,) = result.launch
    assert launch.replicas == 1
    assert (result.bundles_placed, result.bundles_unmet) == (6, 0)
    assert result.infeasible == () and result.waiting == ()


def test_request_resources_beyond_max_replicas_is_infeasible_whole_and_says_why() -> None:
    """All or nothing (Ray's cluster resource constraint): six bundles where the
    group's max holds four are not served in part; total capacity within maxReplicas
    can never hold them, so the whole constraint is infeasible, as in Ray."""
    (shape,) = v6e_16_shapes(max_replicas=1)
    up = running_replica(shape, 0)
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 6)
    result = plan(snapshot((shape,), [up], Demand(constraints=(constraint,))))
    assert result.launch == () and result.waiting == ()
    (infeasible,) = result.infeasible
    assert infeasible.demand == str(constraint)
    assert "tpu at maxReplicas 1" in infeasible.reason
    assert "2 of 6 bundles cannot be served" in infeasible.reason
    assert (result.bundles_placed, result.bundles_unmet) == (0, 6)


def test_request_resources_no_group_can_serve_is_infeasible_and_named() -> None:
    (shape,) = v6e_16_shapes()
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 2 + (Bundle({"GPU": 1.0}),) * 3)
    result = plan(snapshot((shape,), [], Demand(constraints=(constraint,))))
    assert result.waiting == () and result.launch == ()
    (infeasible,) = result.infeasible
    assert infeasible.demand == str(constraint)
    assert infeasible.reason.startswith("no group can ever serve it: ")
    assert "tpu hosts have GPU: 0" in infeasible.reason
    assert (result.bundles_placed, result.bundles_unmet) == (0, 5)


# --- a gang across groups -------------------------------------------------------------------


def _driver_and_workers_shapes(cpu_max: int = 1) -> tuple[SliceShape, ...]:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    return shapes_for(
        cpu_group("cpu", 0, cpu_max, labels={"example.com/pool": "cpu"}),
        tpu_group("tpu", catalog.slice_type(v6e, "4x4"), 0, 3),
    )


@pytest.mark.parametrize("driver_host_up", [False, True])
def test_a_gang_of_a_driver_and_tpu_workers_launches_each_group_what_its_bundles_need(
    driver_host_up: bool,
) -> None:
    """A PACK gang of a CPU driver bundle that only the CPU group can serve and twelve
    4-chip worker bundles: no one group holds it all, so each group launches what its
    own bundles need, within maxReplicas (one CPU node, three 4-host slices); a
    driver bundle that fits a CPU node already up launches no CPU node."""
    shapes = _driver_and_workers_shapes()
    cpu, _ = shapes
    driver = Bundle({"CPU": 1.0}, selector_from_mapping({"example.com/pool": "cpu"}))
    gang = GangDemand("pg-job", (driver,) + (Bundle({"TPU": 4.0}, ANY_HOST),) * 12)
    replicas = [running_replica(cpu, 0)] if driver_host_up else []
    result = plan(snapshot(shapes, replicas, Demand(gangs=(gang,))))
    launched = {launch.group: launch.replicas for launch in result.launch}
    assert launched == ({"tpu": 3} if driver_host_up else {"cpu": 1, "tpu": 3})
    if not driver_host_up:
        reasons = {launch.group: launch.reason for launch in result.launch}
        kind = "PACK: 1 x {CPU: 1} if example.com/pool=cpu, 12 x {TPU: 4}"
        assert reasons == {
            "cpu": f"placement group ({kind}): 1 x cpu for its bundles",
            "tpu": f"placement group ({kind}): 3 x tpu for its bundles",
        }
    assert result.infeasible == () and result.waiting == ()
    assert (result.bundles_placed, result.bundles_unmet) == (13, 0)
    assert plan(apply_plan(snapshot(shapes, replicas, Demand(gangs=(gang,))), result)).launch == ()


def test_a_gang_across_groups_beyond_a_group_s_max_replicas_waits() -> None:
    shapes = _driver_and_workers_shapes()
    driver = Bundle({"CPU": 1.0}, selector_from_mapping({"example.com/pool": "cpu"}))
    gang = GangDemand("pg-job", (driver,) + (Bundle({"TPU": 4.0}, ANY_HOST),) * 13)
    result = plan(snapshot(shapes, [], Demand(gangs=(gang,))))
    assert result.launch == ()
    assert result.bundles_unmet == 14 and len(result.waiting + result.infeasible) == 1


def test_a_gang_across_groups_uses_a_node_up_for_what_fits_and_launches_the_rest() -> None:
    """A small driver bundle fits the CPU node already up (4 of its 8 CPUs taken); a
    big one does not, nor does any TPU worker: one CPU node and three slices launch."""
    shapes = _driver_and_workers_shapes(cpu_max=2)
    cpu, _ = shapes
    pool = selector_from_mapping({"example.com/pool": "cpu"})
    small, big = Bundle({"CPU": 1.0}, pool), Bundle({"CPU": 6.0}, pool)
    gang = GangDemand("pg-job", (small, big) + (Bundle({"TPU": 4.0}, ANY_HOST),) * 12)
    up = running_replica(cpu, 0, used={0: {"CPU": 4.0}})
    result = plan(snapshot(shapes, [up], Demand(gangs=(gang,))))
    assert {launch.group: launch.replicas for launch in result.launch} == {"cpu": 1, "tpu": 3}
    assert (result.bundles_placed, result.bundles_unmet) == (14, 0)


def test_a_strict_pack_gang_whose_bundles_need_two_groups_is_never_placed() -> None:
    """STRICT_PACK puts every bundle on one host, which no group can offer when a
    bundle needs the CPU group and the others TPU hosts: reported, nothing launched."""
    shapes = _driver_and_workers_shapes(cpu_max=2)
    driver = Bundle({"CPU": 1.0}, selector_from_mapping({"example.com/pool": "cpu"}))
    workers = (Bundle({"TPU": 1.0}, ANY_HOST),) * 2
    gang = GangDemand("pg-job", (driver, *workers), GangStrategy.STRICT_PACK)
    result = plan(snapshot(shapes, [], Demand(gangs=(gang,))))
    assert result.launch == ()
    assert (result.bundles_placed, result.bundles_unmet) == (0, 3)
    assert len(result.infeasible + result.waiting) == 1


def test_a_gang_across_groups_grows_each_group_one_replica_at_a_time() -> None:
    """Sixteen 2-chip workers fill two 4-host slices (eight per slice): two launch,
    not three, beside the driver's CPU node."""
    shapes = _driver_and_workers_shapes()
    driver = Bundle({"CPU": 1.0}, selector_from_mapping({"example.com/pool": "cpu"}))
    gang = GangDemand("pg-job", (driver,) + (Bundle({"TPU": 2.0}, ANY_HOST),) * 16)
    result = plan(snapshot(shapes, [], Demand(gangs=(gang,))))
    assert {launch.group: launch.replicas for launch in result.launch} == {"cpu": 1, "tpu": 2}
    assert (result.bundles_placed, result.bundles_unmet) == (17, 0)


def test_demand_blocked_in_every_group_waits_with_each_group_s_reason() -> None:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    shapes = shapes_for(
        tpu_group("slices", catalog.slice_type(v6e, "4x4"), 0, 1),
        tpu_group("singles", catalog.slice_type(v6e, "2x4", 8), 0, 1),
    )
    busy = [
        running_replica(shape, 0, used={h: {"TPU": 4.0} for h in range(shape.hosts_per_replica)})
        for shape in shapes
    ]
    busy[1] = running_replica(shapes[1], 0, used={0: {"TPU": 8.0}})
    result = plan(
        snapshot(shapes, busy, Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 1),)))
    )
    assert result.launch == () and result.infeasible == ()
    (waiting,) = result.waiting
    assert waiting.reason == "slices at maxReplicas 1; singles at maxReplicas 1"


def test_a_gang_across_groups_takes_each_bundle_s_cheapest_group_for_one_copy() -> None:
    """Eleven 4-chip workers beside a CPU driver: a 4-chip host holds one, an 8-chip
    host two. Each bundle goes to the group cheapest for it alone (4 chips, not 8), so
    eleven 4-chip hosts launch."""
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    shapes = shapes_for(
        cpu_group("cpu", 0, 1, labels={"example.com/pool": "cpu"}),
        tpu_group("small", catalog.slice_type(v6e, "2x2"), 0, 12),
        tpu_group("large", catalog.slice_type(v6e, "2x4", 8), 0, 12),
    )
    driver = Bundle({"CPU": 1.0}, selector_from_mapping({"example.com/pool": "cpu"}))
    gang = GangDemand("pg-job", (driver,) + (Bundle({"TPU": 4.0}, ANY_HOST),) * 11)
    result = plan(snapshot(shapes, [], Demand(gangs=(gang,))))
    assert {launch.group: launch.replicas for launch in result.launch} == {"cpu": 1, "small": 11}
    assert (result.bundles_placed, result.bundles_unmet) == (12, 0)
