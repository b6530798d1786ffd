"""Group choice as Ray 2.60 scores it (`core/policy/utilization.py`, the expander's
comparator chain) and the head's capacity, on our own snapshots; and the port
checked against Ray's own `SchedulingNode` and `ResourceDemandScheduler`, both run in
the test on generated inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray.autoscaler.v2.scheduler import (
    NodeTypeConfig,
    ResourceDemandScheduler,
    ResourceRequestSource,
    SchedulingNode,
    SchedulingNodeStatus,
    SchedulingRequest,
)
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.autoscaler.v2.utils import ResourceRequestUtil
from ray.core.generated import autoscaler_pb2
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind

from tests.factories import tpu_group
from tests.snapshots import shapes_for
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
)
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import MAX_PASSES, expander, plan
from tpu_autoscaler.core.policy.expander import Option
from tpu_autoscaler.core.policy.utilization import Score, score_hosts
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Host, PolicyConfig
from tpu_autoscaler.core.units import Chips, Hosts, Replicas


def node_type(
    name: str, resources: Mapping[str, float], max_replicas: int = 10, priority: int = 0
) -> SliceShape:
    """A group of one-host replicas (a Ray node type) with these resources."""
    return SliceShape(
        group=name,
        hosts_per_replica=Hosts(1),
        min_replicas=Replicas(0),
        max_replicas=Replicas(max_replicas),
        idle_timeout_s=60.0,
        upscaling_mode="Default",
        priority=priority,
        resources_per_host=dict(resources),
        group_labels={"ray.io/node-group": name},
    )


def tasks(resources: Mapping[str, float], count: int) -> ResourceDemand:
    return ResourceDemand(Bundle(dict(resources)), count)


def plan_for(
    shapes: tuple[SliceShape, ...],
    *requests: ResourceDemand,
    gangs: tuple[GangDemand, ...] = (),
    fixed: tuple[Host, ...] = (),
    constraints: tuple[ClusterConstraint, ...] = (),
    config: PolicyConfig | None = None,
) -> Plan:
    snapshot = ClusterSnapshot(
        shapes,
        (),
        Demand(tuple(requests), gangs, constraints),
        0.0,
        config=config or PolicyConfig(),
        fixed_hosts=fixed,
    )
    return plan(snapshot)


def launched(result: Plan) -> dict[str, int]:
    return {launch.group: launch.replicas for launch in result.launch}


AWS = (
    node_type("m4.large", {"CPU": 2}),
    node_type("m4.4xlarge", {"CPU": 16}, max_replicas=8),
    node_type("m4.16xlarge", {"CPU": 64}, max_replicas=4),
    node_type("p2.xlarge", {"CPU": 16, "GPU": 1}),
    node_type("p2.8xlarge", {"CPU": 32, "GPU": 8}, max_replicas=4),
)


# --- the chain, one comparator at a time -----------------------------------------------


def test_a_cpu_task_picks_the_small_cpu_group_not_a_gpu_or_a_large_one() -> None:
    shapes = (
        node_type("type_large", {"CPU": 10}),
        node_type("type_small", {"CPU": 5}),
        node_type("type_gpu", {"CPU": 2, "GPU": 2}),
    )
    result = plan_for(shapes, tasks({"CPU": 1}, 1))
    assert launched(result) == {"type_small": 1}
    # The GPU group went first (GPU conservation), the large one on utilization.
    assert "highest least utilization" in result.launch[0].reason


def test_gpu_conservation_decides_and_can_be_turned_off() -> None:
    shapes = (
        node_type("type_gpu", {"CPU": 1, "GPU": 2}),
        node_type("type_multi", {"CPU": 2, "XXX": 2}),
    )
    on = plan_for(shapes, tasks({"CPU": 1}, 1))
    assert launched(on) == {"type_multi": 1}
    assert "GPU nodes kept for GPU work" in on.launch[0].reason
    off = plan_for(shapes, tasks({"CPU": 1}, 1), config=PolicyConfig(conserve_gpu_nodes=False))
    # Without it, the GPU node is the fuller one: all its CPUs used.
    assert launched(off) == {"type_gpu": 1}
    assert "highest mean utilization" in off.launch[0].reason


def test_four_one_gpu_tasks_take_four_one_gpu_nodes_six_take_one_eight_gpu_node() -> None:
    four = plan_for(AWS, tasks({"GPU": 1}, 4))
    assert launched(four) == {"p2.xlarge": 4}
    # Scores tie (no CPU used on either): Ray's node type order decides, not names.
    assert "first in Ray's node type rotation" in four.launch[0].reason
    six = plan_for(AWS, tasks({"GPU": 1}, 6))
    assert launched(six) == {"p2.8xlarge": 1}


def test_ties_follow_the_raycluster_order_not_the_name_and_rotate() -> None:
    shapes = (node_type("zeta", {"CPU": 4}), node_type("alpha", {"CPU": 4}))
    assert launched(plan_for(shapes, tasks({"CPU": 1}, 2))) == {"zeta": 1}
    # Ray moves the type it chose to the end of its candidates: equal types alternate.
    assert launched(plan_for(shapes, tasks({"CPU": 1}, 12))) == {"zeta": 2, "alpha": 1}


def test_priority_decides_between_equal_scores() -> None:
    shapes = (node_type("zeta", {"CPU": 4}), node_type("alpha", {"CPU": 4}, priority=5))
    result = plan_for(shapes, tasks({"CPU": 1}, 2))
    assert launched(result) == {"alpha": 1}
    assert "higher priority" in result.launch[0].reason


def option(group: str, score: Score, chips: int = 0, replicas: int = 1, order: int = 0) -> Option:
    return Option(group, Replicas(replicas), Chips(chips), 0, group, order, lambda: score)


def test_the_chain_ranks_scores_element_by_element_in_rays_order() -> None:
    """Ray's tuple order: label, GPU, resource types, least, mean utilization; a
    later element decides only between equals on every earlier one."""
    label = option("label", Score(1, False, 1, 0.0, 0.0))
    gpu = option("gpu", Score(0, True, 1, 0.0, 0.0))
    types = option("types", Score(0, False, 2, 0.0, 0.0))
    least = option("least", Score(0, False, 1, 0.5, 0.5))
    mean = option("mean", Score(0, False, 1, 0.0, 9.0))
    last = option("last", Score(0, False, 1, 0.0, 0.0))
    everything = [last, mean, least, types, gpu, label]
    expected = [
        ("label", "label selector matched"),
        ("gpu", "GPU nodes kept for GPU work"),
        ("types", "most resource types used"),
        ("least", "highest least utilization"),
        ("mean", "highest mean utilization"),
    ]
    for group, comparator in expected:
        choice = expander.choose(everything)
        assert choice is not None
        assert (choice.option.group, choice.decided_by) == (group, comparator)
        everything = [o for o in everything if o.group != group]


def test_chips_and_slices_come_before_the_score() -> None:
    cheap = option("cheap", Score(0, False, 0, 0.0, 0.0), chips=8, replicas=2)
    dear = option("dear", Score(1, True, 9, 9.0, 9.0), chips=16, replicas=1)
    choice = expander.choose([dear, cheap])
    assert choice is not None and choice.option is cheap
    assert choice.decided_by == "fewest chips"
    # Only the comparators that ruled an option out are named in the reason.
    assert choice.narrowed_by == ("fewest chips",)
    alone = expander.choose([cheap])
    assert alone is not None and (alone.option, alone.decided_by) == (cheap, "only option")
    one = option("one", Score(0, False, 0, 0.0, 0.0), chips=16, replicas=1)
    two = option("two", Score(1, True, 9, 9.0, 9.0), chips=16, replicas=2)
    choice = expander.choose([two, one])
    assert choice is not None and (choice.option, choice.decided_by) == (one, "fewest slices")
    # Without chips, replicas do not count: Ray grows node by node.
    few = option("few", Score(0, True, 1, 0.0, 0.1), replicas=1)
    many = option("many", Score(0, True, 1, 0.0, 0.2), replicas=4)
    choice = expander.choose([few, many])
    assert choice is not None and choice.option is many


def test_scores_are_computed_only_when_a_comparator_needs_them() -> None:
    def never() -> Score:
        raise AssertionError("scored although chips decided")

    cheap = Option("cheap", Replicas(1), Chips(4), 0, "cheap", 0, never)
    dear = Option("dear", Replicas(1), Chips(8), 0, "dear", 1, never)
    choice = expander.choose([dear, cheap])
    assert choice is not None and choice.option is cheap


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        ([({"CPU": 64}, 1), ({"CPU": 1}, 1)], {"m4.16xlarge": 1, "m4.large": 1}),
        ([({"CPU": 64}, 1), ({"CPU": 9}, 2)], {"m4.16xlarge": 1, "m4.4xlarge": 2}),
        ([({"CPU": 16}, 5)], {"m4.16xlarge": 1, "m4.4xlarge": 1}),
        ([({"CPU": 1}, 100)], {"m4.16xlarge": 1, "m4.4xlarge": 2, "m4.large": 2}),
        ([({"GPU": 1}, 8), ({"CPU": 1}, 64)], {"m4.4xlarge": 2, "p2.8xlarge": 1}),
        ([({"GPU": 1}, 1), ({"CPU": 1}, 64)], {"m4.16xlarge": 1, "p2.xlarge": 1}),
    ],
)
def test_node_by_node_as_rays_greedy(
    demand: list[tuple[dict[str, float], int]], expected: dict[str, int]
) -> None:
    """Each new node is the best by score for what is left (Ray's expectations in its
    test_get_nodes_packing_heuristic)."""
    result = plan_for(AWS, *(tasks(r, n) for r, n in demand))
    assert launched(result) == expected


def test_gangs_are_scored_on_the_replicas_they_would_use() -> None:
    gpu_bundles = tuple(Bundle({"GPU": 1}) for _ in range(8))
    spread = GangDemand("pg-spread", gpu_bundles, GangStrategy.STRICT_SPREAD)
    assert launched(plan_for(AWS, gangs=(spread,))) == {"p2.xlarge": 8}
    pack = GangDemand("pg-pack", gpu_bundles, GangStrategy.PACK)
    assert launched(plan_for(AWS, gangs=(pack,))) == {"p2.8xlarge": 1}
    cpu = GangDemand("pg-cpu", (Bundle({"CPU": 2}), Bundle({"CPU": 2})), GangStrategy.PACK)
    shapes = (node_type("m4.large", {"CPU": 2}), node_type("p2.8xlarge", {"CPU": 32, "GPU": 8}))
    assert launched(plan_for(shapes, gangs=(cpu,))) == {"m4.large": 2}


# --- TPU slices keep their rules ---------------------------------------------------------


V6E = catalog.find_generation("v6e")
assert V6E is not None


def test_slices_are_still_chosen_by_fewest_chips_then_fewest_slices() -> None:
    big = catalog.slice_type(V6E, "4x4")
    small = catalog.slice_type(V6E, "2x4", chips_per_host=4)
    shapes = shapes_for(
        tpu_group("v6e-8", small, max_replicas=8), tpu_group("v6e-16", big, max_replicas=8)
    )
    # 16 chips either way: one 4-host slice beats two 2-host slices (small demand is
    # decided by the exhaustive search, larger by the expander: both agree).
    assert launched(plan_for(shapes, tasks({"TPU": 4}, 4))) == {"v6e-16": 1}
    result = plan_for(shapes, tasks({"TPU": 4}, 12))
    assert launched(result) == {"v6e-16": 3}
    assert "fewest slices" in result.launch[0].reason
    # 8 chips are enough for two: the smaller slice.
    assert launched(plan_for(shapes, tasks({"TPU": 4}, 2))) == {"v6e-8": 1}


def test_cpu_demand_never_takes_a_tpu_host_when_a_cpu_group_can() -> None:
    big = catalog.slice_type(V6E, "4x4")
    shapes = (*shapes_for(tpu_group("tpu", big)), node_type("cpu", {"CPU": 2}))
    result = plan_for(shapes, tasks({"CPU": 1}, 3))
    assert launched(result) == {"cpu": 2}


# --- the head's capacity -------------------------------------------------------------------


def head(cpu_free: float, cpu_total: float = 4.0) -> Host:
    return Host(
        "raycluster-head",
        0,
        node_id="head-node",
        labels={"ray.io/node-group": "headgroup"},
        total={"CPU": cpu_total, "memory": 1e9},
        available={"CPU": cpu_free, "memory": 1e9},
    )


def test_a_task_that_fits_on_the_heads_free_cpus_launches_nothing() -> None:
    shapes = (node_type("cpu", {"CPU": 2}),)
    result = plan_for(shapes, tasks({"CPU": 1}, 3), fixed=(head(cpu_free=3),))
    assert result.launch == ()
    assert result.bundles_placed == 3
    # One more than the head holds launches one worker, for the fourth.
    assert launched(plan_for(shapes, tasks({"CPU": 1}, 4), fixed=(head(cpu_free=3),))) == {"cpu": 1}


def test_request_resources_counts_the_heads_total() -> None:
    shapes = (node_type("cpu", {"CPU": 2}),)
    constraint = ClusterConstraint(tuple(Bundle({"CPU": 1}) for _ in range(4)))
    result = plan_for(shapes, fixed=(head(cpu_free=0),), constraints=(constraint,))
    assert result.launch == ()
    bigger = ClusterConstraint(tuple(Bundle({"CPU": 1}) for _ in range(6)))
    assert launched(plan_for(shapes, fixed=(head(cpu_free=0),), constraints=(bigger,))) == {
        "cpu": 1
    }


def test_the_head_is_never_removed_and_never_counted_as_a_replica() -> None:
    shapes = (node_type("cpu", {"CPU": 2}),)
    idle_head = replace(head(cpu_free=4), idle_s=10_000.0)
    result = plan_for(shapes, fixed=(idle_head,))
    assert result.terminate == () and result.launch == ()


# --- the port against Ray's own code ------------------------------------------------------

RESOURCE_NAMES = ("CPU", "GPU", "memory", "XXX")


@st.composite
def node_resources(draw: st.DrawFn) -> dict[str, float]:
    names = draw(st.lists(st.sampled_from(RESOURCE_NAMES), min_size=1, unique=True))
    return {n: float(draw(st.integers(1, 16))) for n in names}


@st.composite
def request_shapes(draw: st.DrawFn) -> dict[str, float]:
    names = draw(st.lists(st.sampled_from(RESOURCE_NAMES), min_size=1, max_size=2, unique=True))
    return {n: float(draw(st.integers(1, 8))) for n in names}


@settings(max_examples=300, deadline=None)
@given(node_resources(), st.lists(request_shapes(), min_size=1, max_size=6), st.booleans())
def test_score_equals_rays_scheduling_node(
    total: dict[str, float], requests: list[dict[str, float]], conserve: bool
) -> None:
    """One host's score equals Ray's `SchedulingNode` score after Ray packed the same
    requests in the same order."""
    import ray.autoscaler.v2.scheduler as ray_scheduler

    config = NodeTypeConfig(name="t", resources=total, min_worker_nodes=0, max_worker_nodes=1)
    node = SchedulingNode.from_node_config(config, SchedulingNodeStatus.TO_LAUNCH, NodeKind.WORKER)
    saved = ray_scheduler.AUTOSCALER_CONSERVE_GPU_NODES
    ray_scheduler.AUTOSCALER_CONSERVE_GPU_NODES = int(conserve)
    try:
        remaining, ray_score = node.try_schedule(
            [ResourceRequestUtil.make(r) for r in requests], ResourceRequestSource.PENDING_DEMAND
        )
    finally:
        ray_scheduler.AUTOSCALER_CONSERVE_GPU_NODES = saved
    free = dict(total)
    placed = 0
    for request in requests:
        if all(free.get(k, 0.0) >= v for k, v in request.items()):
            for k, v in request.items():
                free[k] -= v
            placed += 1
    assert placed == len(requests) - len(remaining)
    ours = score_hosts([(total, free)], 0, conserve)
    assert ours[:3] == tuple(ray_score[:3])
    assert ours[3:] == pytest.approx(tuple(ray_score[3:]))


KINDS = 3
NODE_TYPE_NAMES = ("small", "large", "gpu", "multi")


Case = tuple[
    dict[str, dict[str, float]],
    dict[str, int],
    list[tuple[dict[str, float], int]],
    dict[str, float],
    list[tuple[str, dict[str, float]]],
]
"""Node types, their maxima, task shapes with counts, the head's free resources, and
running workers (type, free resources)."""


@st.composite
def clusters_and_demand(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 4))
    types = {name: draw(node_resources()) for name in NODE_TYPE_NAMES[:count]}
    maxima = {name: draw(st.integers(1, 6)) for name in types}
    kinds = draw(st.integers(1, KINDS))
    demand = [(draw(request_shapes()), draw(st.integers(1, 12))) for _ in range(kinds)]
    head_free = {"CPU": float(draw(st.integers(0, 4)))}
    workers = []
    for name in draw(st.lists(st.sampled_from(sorted(types)), max_size=2)):
        if sum(1 for w, _ in workers if w == name) < maxima[name]:
            free = {k: float(draw(st.integers(0, int(v)))) for k, v in types[name].items()}
            workers.append((name, free))
    return types, maxima, demand, head_free, workers


def running(
    name: str, kind: int, node_type: str, total: dict[str, float], free: dict[str, float]
) -> AutoscalerInstance:
    node_id = f"{name:0>56}"
    im = Instance(
        instance_id=f"im-{name}",
        cloud_instance_id=name,
        instance_type=node_type,
        status=Instance.RAY_RUNNING,
        node_kind=kind,
        node_id=node_id,
    )
    node = autoscaler_pb2.NodeState(
        node_id=bytes.fromhex(node_id),
        instance_id=name,
        ray_node_type_name=node_type,
        status=autoscaler_pb2.NodeStatus.RUNNING,
    )
    node.total_resources.update(total)
    node.available_resources.update({k: v for k, v in free.items() if v > 0})
    return AutoscalerInstance(cloud_instance_id=name, ray_node=node, im_instance=im)


def ray_request(case: Case) -> SchedulingRequest:
    types, maxima, demand, head_free, workers = case
    configs = {
        name: NodeTypeConfig(
            name=name, resources=resources, min_worker_nodes=0, max_worker_nodes=maxima[name]
        )
        for name, resources in types.items()
    }
    # As Ray's KubeRay config lists the head group: never launched.
    configs["headgroup"] = NodeTypeConfig(
        name="headgroup", resources={"CPU": 4.0}, min_worker_nodes=0, max_worker_nodes=0
    )
    requests = [ResourceRequestUtil.make(r) for r, n in demand for _ in range(n)]
    instances = [running("a0", NodeKind.HEAD, "headgroup", {"CPU": 4.0}, head_free)]
    instances += [
        running(f"b{i}", NodeKind.WORKER, name, types[name], free)
        for i, (name, free) in enumerate(workers)
    ]
    return SchedulingRequest(
        resource_requests=ResourceRequestUtil.group_by_count(requests),
        node_type_configs=configs,
        current_instances=instances,
        disable_launch_config_check=True,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_and_demand())
def test_launches_equal_rays_on_clusters_without_slices(case: Case) -> None:
    """On node types without TPUs, with a head and running workers whose free
    resources count, our plan launches what Ray 2.60's scheduler launches, node type
    by node type, for tasks of up to KINDS shapes. Our plans are settled (planning
    again launches nothing more); Ray's greedy may pack its own pending nodes
    otherwise next round and launch more, so Ray runs round after round, its launches
    pending, until it launches nothing (at most as many rounds as our passes)."""
    request = ray_request(case)
    ours = by_type(SliceScheduler(cluster=None, clock=lambda: 0.0).schedule(request).to_launch)
    rays: dict[str, int] = {}
    for round_index in range(MAX_PASSES):
        launches = by_type(ResourceDemandScheduler().schedule(request).to_launch)
        if not launches:
            break
        for name, count in launches.items():
            rays[name] = rays.get(name, 0) + count
            request.current_instances.extend(
                pending(f"p{round_index}{name}{i}", name) for i in range(count)
            )
    assert ours == rays


def by_type(launches: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for launch in launches:  # type: ignore[attr-defined]
        counts[launch.instance_type] = counts.get(launch.instance_type, 0) + launch.count
    return counts


def pending(name: str, node_type: str) -> AutoscalerInstance:
    """An instance Ray asked for and has no Ray node yet."""
    im = Instance(
        instance_id=f"im-{name}",
        instance_type=node_type,
        status=Instance.REQUESTED,
        node_kind=NodeKind.WORKER,
    )
    return AutoscalerInstance(im_instance=im)
