"""Behaviour of the slice policy pinned where mutation testing found the suite silent:
each test states what `plan` does, through `plan` only, so that it survives a rewrite
of the policy's internals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.snapshots import apply_plan, pending_replica, running_replica, snapshot, v6e_16_shapes
from tpu_autoscaler.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    selector_from_mapping,
)
from tpu_autoscaler.policy import plan
from tpu_autoscaler.snapshot import PolicyConfig

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


def test_request_resources_beyond_max_replicas_waits_and_says_why() -> None:
    (shape,) = v6e_16_shapes(max_replicas=1)
    up = running_replica(shape, 0)
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 6)
    result = plan(snapshot((shape,), [up], Demand(constraints=(constraint,))))
    assert result.launch == () and result.infeasible == ()
    (waiting,) = result.waiting
    assert waiting.demand == str(ClusterConstraint((Bundle({"TPU": 4.0}),) * 2))
    assert "tpu at maxReplicas 1" in waiting.reason
    assert (result.bundles_placed, result.bundles_unmet) == (4, 2)


def test_request_resources_no_group_can_serve_is_infeasible_and_named() -> None:
    (shape,) = v6e_16_shapes()
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 2 + (Bundle({"GPU": 1.0}),) * 3)
    result = plan(snapshot((shape,), [], Demand(constraints=(constraint,))))
    assert result.waiting == ()
    (infeasible,) = result.infeasible
    assert infeasible.demand == str(ClusterConstraint((Bundle({"GPU": 1.0}),) * 3))
    assert infeasible.reason.startswith("no group can ever serve it: ")
    assert (result.bundles_placed, result.bundles_unmet) == (2, 3)
