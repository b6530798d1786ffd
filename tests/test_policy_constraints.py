"""`request_resources` is all or nothing, as Ray 2.60 treats a cluster resource
constraint: served whole, or nothing is launched or kept for it, with the reason."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import cpu_group
from tests.snapshots import running_replica, shapes_for, snapshot, v6e_16_shapes
from tpu_autoscaler.core.demand import Bundle, ClusterConstraint, Demand
from tpu_autoscaler.core.plan import GroupVerdict
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.snapshot import LaunchFailures
from tpu_autoscaler.core.units import Replicas

CPU = Bundle({"CPU": 1.0})
GPU2 = Bundle({"GPU": 2.0})


def _cpu_and_gpu():  # type: ignore[no-untyped-def]
    cpu, gpu = shapes_for(cpu_group("cpu", 1, 5), cpu_group("gpu", 0, 1))
    gpu = replace(gpu, resources_per_host={"CPU": 1.0, "GPU": 2.0}, max_replicas=Replicas(1))
    return replace(cpu, resources_per_host={"CPU": 1.0}), gpu


def test_a_constraint_the_limits_cannot_hold_whole_launches_nothing_for_it() -> None:
    cpu, gpu = _cpu_and_gpu()
    constraint = ClusterConstraint((CPU, CPU, GPU2, GPU2))
    result = plan(snapshot((cpu, gpu), demand=Demand(constraints=(constraint,))))
    # Only minReplicas: not the GPU node a part of the constraint would have used.
    assert [(x.group, x.replicas) for x in result.launch] == [("cpu", 1)]
    (unmet,) = result.infeasible
    assert unmet.demand == str(constraint)
    assert unmet.reason.endswith(
        "(request_resources is all or nothing: 1 of 4 bundles cannot be served, "
        "so nothing is launched or kept for it)"
    )
    assert "gpu at maxReplicas 1" in unmet.reason
    # The group a limit holds at its max can never hold more total capacity.
    assert dict((g.group, g.verdict) for g in unmet.groups)["gpu"] is GroupVerdict.REJECTED
    assert (result.bundles_placed, result.bundles_unmet) == (0, 4)


def test_a_constraint_served_whole_launches_for_all_of_it() -> None:
    cpu, gpu = _cpu_and_gpu()
    constraint = ClusterConstraint((CPU, CPU, GPU2))
    result = plan(snapshot((cpu, gpu), demand=Demand(constraints=(constraint,))))
    assert sorted((x.group, x.replicas) for x in result.launch) == [("cpu", 1), ("gpu", 1)]
    assert result.infeasible == () and result.waiting == ()


def test_an_unserved_constraint_keeps_no_idle_replica() -> None:
    (shape,) = v6e_16_shapes(max_replicas=1, idle_timeout_s=30)
    idle = running_replica(shape, 0, idle_s=100)
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 8)  # two slices; max 1
    result = plan(snapshot((shape,), [idle], Demand(constraints=(constraint,))))
    assert [t.replica for t in result.terminate] == [idle.name]
    assert len(result.infeasible) == 1 and result.launch == ()


def test_a_constraint_held_back_by_backoff_waits() -> None:
    (shape,) = v6e_16_shapes(max_replicas=4)
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 8)
    failures = {"tpu": LaunchFailures(1, 990.0)}
    result = plan(
        snapshot((shape,), demand=Demand(constraints=(constraint,)), launch_failures=failures)
    )
    (waiting,) = result.waiting
    assert "backs off" in waiting.reason and "all or nothing" in waiting.reason
    assert result.launch == () and result.infeasible == ()


@settings(max_examples=200, deadline=None)
@given(
    cpus=st.integers(0, 6),
    gpus=st.integers(0, 4),
    gpu_max=st.integers(0, 3),
    running=st.integers(0, 2),
)
def test_every_bundle_of_a_constraint_is_placed_or_none_is(
    cpus: int, gpus: int, gpu_max: int, running: int
) -> None:
    cpu, gpu = _cpu_and_gpu()
    gpu = replace(gpu, max_replicas=Replicas(gpu_max))
    constraint = ClusterConstraint((CPU,) * cpus + (GPU2,) * gpus)
    replicas = [running_replica(gpu, i, idle_s=100.0) for i in range(min(running, gpu_max))]
    result = plan(snapshot((cpu, gpu), replicas, Demand(constraints=(constraint,))))
    assert (result.bundles_placed, result.bundles_unmet) in ((cpus + gpus, 0), (0, cpus + gpus))
    if result.bundles_unmet:
        assert all("request_resources" not in x.reason for x in result.launch)
        assert [t.replica for t in result.terminate] == [r.name for r in replicas]
