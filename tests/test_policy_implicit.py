"""`node:__internal_implicit_resource_*`: Ray gives every node one unit of each such
resource without reporting it (`_fits` in Ray 2.60's resource_demand_scheduler reads
a missing one as 1.0), so demand for it fits any host, once per unit."""

from __future__ import annotations

import ray._raylet

from tests.factories import cpu_group
from tests.snapshots import running_replica, shapes_for, snapshot
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.policy import plan

IMPLICIT = labels.IMPLICIT_RESOURCE_PREFIX + "a"


def test_prefix_is_rays() -> None:
    assert labels.IMPLICIT_RESOURCE_PREFIX == ray._raylet.IMPLICIT_RESOURCE_PREFIX


def _demand(*items: tuple[dict[str, float], int]) -> Demand:
    return Demand(resources=tuple(ResourceDemand(Bundle(r), n) for r, n in items))


def test_implicit_demand_launches_a_node_instead_of_being_infeasible() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 0, 10))
    result = plan(snapshot((shape,), demand=_demand(({IMPLICIT: 1.0}, 1))))
    assert [(x.group, x.replicas) for x in result.launch] == [("cpu", 1)]
    assert result.infeasible == ()


def test_implicit_demand_fits_an_existing_node_once_per_unit() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 0, 10))
    node = running_replica(shape, 0)
    fits = plan(snapshot((shape,), [node], _demand(({IMPLICIT: 1.0}, 1), ({"CPU": 1.0}, 1))))
    assert fits.launch == () and fits.infeasible == () and fits.bundles_placed == 2
    halves = plan(snapshot((shape,), [node], _demand(({IMPLICIT: 0.5}, 2))))
    assert halves.launch == ()
    # One unit per node: a second whole unit needs a second node.
    two = plan(snapshot((shape,), [node], _demand(({IMPLICIT: 1.0}, 2))))
    assert [(x.group, x.replicas) for x in two.launch] == [("cpu", 1)]


def test_more_than_one_unit_is_infeasible_and_says_one_is_offered() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 0, 10))
    result = plan(snapshot((shape,), demand=_demand(({IMPLICIT: 2.0}, 1))))
    (unmet,) = result.infeasible
    assert result.launch == ()
    assert f"{IMPLICIT}: 1, the bundle needs 2" in unmet.reason
