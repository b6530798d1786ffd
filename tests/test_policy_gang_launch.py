"""`Launch.gangs`: which of a plan's new replicas one all-or-nothing gang needs at
once, so capacity can be asked for them whole (queued provisioning: one
ProvisioningRequest per gang, `adapters/kube/queued_steps.py`). Named whichever path
launches the gang: the exhaustive search for small demand, a gang served alone, and
a run of alike gangs launched in one batch; never for replicas of use one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.snapshots import running_replica, snapshot, v6e_16_shapes
from tpu_autoscaler.core import exact
from tpu_autoscaler.core.demand import Bundle, Demand, GangDemand, GangStrategy, ResourceDemand
from tpu_autoscaler.core.demand import selector_from_mapping as selector
from tpu_autoscaler.core.plan import Launch, Plan
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.units import Replicas

HOSTS = 4
PINNED = Bundle({"TPU": 4.0}, selector({"ray.io/tpu-pod-type": "v6e-16"}))


def slices_gang(slices: int, gang_id: str = "pg") -> GangDemand:
    """One bundle per host of `slices` v6e 4x4 slices, on distinct hosts."""
    return GangDemand(gang_id, (PINNED,) * (slices * HOSTS), GangStrategy.STRICT_SPREAD)


def the_launch(result: Plan) -> Launch:
    (launched,) = result.launch
    return launched


def test_a_small_two_slice_gang_is_named_one_gang_by_the_exhaustive_search() -> None:
    assert 2 * HOSTS <= exact.MAX_BUNDLES  # served by `exact_search`
    (shape,) = v6e_16_shapes(max_replicas=4)
    result = plan(snapshot((shape,), [], Demand(gangs=(slices_gang(2),))))
    launched = the_launch(result)
    assert launched.replicas == 2 and launched.gangs == (2,)
    assert result.to_json()["launch"][0]["gangs"] == [2]  # what `plan --output json` shows


def test_a_larger_gang_is_named_one_gang_when_served_alone() -> None:
    assert 3 * HOSTS > exact.MAX_BUNDLES  # served by `gangs.py`
    (shape,) = v6e_16_shapes(max_replicas=4)
    launched = the_launch(plan(snapshot((shape,), [], Demand(gangs=(slices_gang(3),)))))
    assert launched.replicas == 3 and launched.gangs == (3,)


def test_alike_gangs_launched_in_one_batch_are_one_gang_each() -> None:
    (shape,) = v6e_16_shapes(max_replicas=6)
    gangs = tuple(slices_gang(2, f"pg-{i}") for i in range(3))
    launched = the_launch(plan(snapshot((shape,), [], Demand(gangs=gangs))))
    assert launched.replicas == 6 and launched.gangs == (2, 2, 2)


def test_one_slice_gangs_and_tasks_are_no_gang() -> None:
    (shape,) = v6e_16_shapes(max_replicas=4)
    demand = Demand(
        gangs=(slices_gang(1, "a"), slices_gang(1, "b")),
        resources=(ResourceDemand(Bundle({"TPU": 4.0}), 4),),
    )
    launched = the_launch(plan(snapshot((shape,), [], demand)))
    assert launched.replicas == 3 and launched.gangs == ()


def test_only_the_new_replicas_a_gang_needs_are_its_gang() -> None:
    """Half of a two-slice gang fits on an idle running slice: it needs one new
    slice, which arrives alone as well as with anything."""
    (shape,) = v6e_16_shapes(max_replicas=4)
    idle = running_replica(shape, 0, idle_s=5.0)
    launched = the_launch(plan(snapshot((shape,), [idle], Demand(gangs=(slices_gang(2),)))))
    assert launched.replicas == 1 and launched.gangs == ()


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    tasks=st.integers(0, 6),
    running=st.integers(0, 2),
)
def test_gangs_never_name_more_replicas_than_launched(
    sizes: list[int], tasks: int, running: int
) -> None:
    """Whatever the demand: every named gang has two or more replicas, they sum to at
    most the launch, and a plan for gangs of k >= 2 slices alone on an empty
    cluster names each of them."""
    (shape,) = v6e_16_shapes(max_replicas=12)
    gangs = tuple(slices_gang(k, f"pg-{i}") for i, k in enumerate(sizes))
    resources = (ResourceDemand(Bundle({"TPU": 4.0}), tasks),) if tasks else ()
    replicas = [running_replica(shape, i, idle_s=5.0) for i in range(running)]
    result = plan(snapshot((shape,), replicas, Demand(gangs=gangs, resources=resources)))
    for launched in result.launch:
        assert all(size >= 2 for size in launched.gangs)
        assert sum(launched.gangs) <= launched.replicas
    if not tasks and not running:
        named = sorted(size for launched in result.launch for size in launched.gangs)
        assert named == sorted(Replicas(k) for k in sizes if k >= 2)
