"""The stock comparison (`baseline.ray_plan`): Ray 2.60's scheduler on the instances
its reconciler would hold, the head included, and Ray's KubeRay provider writing the
decision as it does (host counts floor-divided by numOfHosts, the max with observed
pods, nothing while deletions are pending, single pods named, no resourceVersion).
The upstream failures as `plan` shows them are in test_plan_cli.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2, instance_manager_pb2

from tpu_autoscaler.adapters.ray.baseline import HEAD_RESOURCE, ray_request
from tpu_autoscaler.adapters.ray.baseline import ray_plan as decide
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, build_snapshot
from tpu_autoscaler.shell.controller import UnguardedPlan
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import parse_workload
from tpu_autoscaler.testing import scenarios
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

ROOT = Path(__file__).parent.parent
GROUP = "tpu-v6e-group"
HOSTS = 4
"""numOfHosts of GROUP (v6e 4x4, four 4-chip hosts)."""
HEAD_POD = "tpu-v6e-16-head-x7k2p"


def v6e(max_replicas: int = 2) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text()
    )
    raw["spec"]["workerGroupSpecs"][0]["maxReplicas"] = max_replicas
    return raw


def cpu_and_tpu() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((ROOT / "examples/clusters/cpu-and-tpu.yaml").read_text())
    raw["spec"]["workerGroupSpecs"][0]["minReplicas"] = 0  # no CPU worker until asked for
    return raw


def with_head(builder: SnapshotBuilder, cpus: float, free_cpus: float) -> SnapshotBuilder:
    """The head raylet as the GCS reports it: in the head pod, `headgroup`, with the
    resource that marks Ray's head."""
    node = builder.state.node_states.add(
        node_id=bytes(27) + b"\x01",
        instance_id=HEAD_POD,
        ray_node_type_name="headgroup",
        status=autoscaler_pb2.NodeStatus.RUNNING,
    )
    node.total_resources.update({"CPU": cpus, HEAD_RESOURCE: 1.0})
    node.available_resources.update({"CPU": free_cpus, HEAD_RESOURCE: 1.0})
    return builder


def load(built: dict[str, Any]) -> LoadedSnapshot:
    return build_snapshot(built, "test")


def ray_plan(loaded: LoadedSnapshot) -> UnguardedPlan:
    plan = decide(loaded)
    assert isinstance(plan, UnguardedPlan)  # what makes the shell send it unguarded
    return plan


def group_ops(plan: UnguardedPlan, field: str) -> list[Any]:
    return [op["value"] for op in plan.operations if op["path"].endswith(field)]


# --- the head -----------------------------------------------------------------------------


@pytest.mark.parametrize("reported", [True, False], ids=["head-reported", "head-synthesized"])
def test_a_cpu_task_fits_on_a_head_with_free_cpus(reported: bool) -> None:
    builder = SnapshotBuilder(v6e()).tasks({"CPU": 1.0})
    if reported:
        with_head(builder, cpus=4.0, free_cpus=3.0)
    loaded = load(builder.build())
    plan = ray_plan(loaded)
    assert plan.launch == () and plan.waiting == () and plan.operations == ()
    (head,) = [
        i
        for i in ray_request(loaded).current_instances
        if i.im_instance.node_kind == instance_manager_pb2.NodeKind.HEAD
    ]
    assert head.im_instance.instance_type == "headgroup"
    assert head.im_instance.status == instance_manager_pb2.Instance.RAY_RUNNING
    # Without a GCS report, the head is what Ray's config reader makes of headGroupSpec.
    assert head.ray_node.total_resources["CPU"] == 4.0


def test_a_cpu_task_with_a_full_head_launches_a_cpu_worker() -> None:
    builder = with_head(SnapshotBuilder(cpu_and_tpu()).tasks({"CPU": 1.0}), cpus=2, free_cpus=0)
    plan = ray_plan(load(builder.build()))
    assert [(x.group, x.replicas) for x in plan.launch] == [("cpu-group", 1)]
    assert plan.operations == (
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
    )


def test_no_scaling_while_the_head_is_not_running() -> None:
    builder = with_head(SnapshotBuilder(v6e()).tasks({"TPU": 4.0}, count=4), 4, 4)
    builder.state.node_states[0].status = autoscaler_pb2.NodeStatus.DEAD
    plan = ray_plan(load(builder.build()))
    assert plan.launch == () and plan.operations == ()
    assert "head node is not running" in plan.waiting[0].reason


# --- the provider's arithmetic --------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(tasks=st.integers(min_value=1, max_value=2 * HOSTS))
def test_host_counts_are_floor_divided_by_num_of_hosts(tasks: int) -> None:
    """Ray asks one host per `{TPU: 4}` task; KubeRay's provider writes
    `hosts // numOfHosts` replicas, so a remainder (3 hosts of a 4-host group) is lost."""
    plan = ray_plan(load(SnapshotBuilder(v6e()).tasks({"TPU": 4.0}, count=tasks).build()))
    replicas = tasks // HOSTS
    assert sum(x.replicas for x in plan.launch) == replicas
    assert group_ops(plan, "/replicas") == ([replicas] if replicas else [])
    if not replicas:
        assert any(f"{tasks} host(s)" in u.demand for u in plan.waiting)


def test_the_max_with_observed_pods() -> None:
    """`replicas` lowered to 0 under a running, busy replica without naming its pods:
    Ray counts the 4 pods it sees, adds the 4 hosts it launches and writes 2, so
    KubeRay keeps the replica and creates one."""
    busy = {h: {"TPU": 4.0} for h in range(HOSTS)}
    builder = SnapshotBuilder(v6e()).replica(GROUP, 0, used=busy).tasks({"TPU": 4.0}, HOSTS)
    built = builder.build()
    built["raycluster"]["spec"]["workerGroupSpecs"][0]["replicas"] = 0
    plan = ray_plan(load(built))
    assert group_ops(plan, "/replicas") == [2]
    assert [(x.group, x.replicas) for x in plan.launch] == [(GROUP, 1)]


def _named_for_deletion(terminating: bool) -> dict[str, Any]:
    """A replica whose idle host 0 Ray named earlier, the rest busy, and four hosts of
    demand: the named host is not capacity any more."""
    busy = {h: {"TPU": 4.0} for h in range(1, HOSTS)}
    builder = SnapshotBuilder(v6e()).replica(GROUP, 0, used=busy).tasks({"TPU": 4.0}, HOSTS)
    built = builder.build()
    named = built["pods"]["items"][0]
    group = built["raycluster"]["spec"]["workerGroupSpecs"][0]
    group["replicas"] = 0
    group["scaleStrategy"] = {"workersToDelete": [named["metadata"]["name"]]}
    if terminating:
        named["metadata"]["deletionTimestamp"] = built["now"]
    return built


def test_a_pending_deletion_blocks_a_scale_up() -> None:
    plan = ray_plan(load(_named_for_deletion(terminating=False)))
    assert plan.launch == () and plan.operations == ()
    (refused,) = plan.waiting
    assert refused.demand == f"launch of {HOSTS} host(s) of {GROUP}"
    assert "Waiting for them to be deleted" in refused.reason


def test_a_deletion_under_way_no_longer_blocks_and_its_name_is_cleared() -> None:
    """A pod with a deletionTimestamp is not listed by Ray's provider: the deletion is
    done for Ray, which launches and clears the group's `workersToDelete`."""
    plan = ray_plan(load(_named_for_deletion(terminating=True)))
    assert sum(x.replicas for x in plan.launch) == 1
    assert group_ops(plan, "/scaleStrategy") == [{"workersToDelete": []}]


@pytest.mark.parametrize("pods", [0, 2], ids=["no-pods-yet", "half-created"])
def test_a_replica_on_its_way_holds_the_demand(pods: int) -> None:
    """Ray asked for these hosts and holds them REQUESTED until their pods appear; were
    they missing, Ray would ask again and its provider write a second replica."""
    builder = SnapshotBuilder(v6e()).tasks({"TPU": 4.0}, HOSTS)
    if pods:
        builder.replica(GROUP, 0, age_s=1.0, running=False, pods=pods)
    built = builder.build()
    built["raycluster"]["spec"]["workerGroupSpecs"][0]["replicas"] = 1
    plan = ray_plan(load(built))
    assert plan.launch == () and plan.operations == () and plan.waiting == ()


def test_an_idle_host_of_a_busy_slice_takes_the_whole_replica() -> None:
    """Upstream failure 1 as Ray writes it: the three idle pods named singly and
    `replicas` (4 - 3) // 4 = 0; KubeRay then deletes all four pods, the busy one too."""
    loaded = load(scenarios.busy_slice_with_idle_hosts())
    plan = ray_plan(loaded)
    (replica,) = loaded.snapshot.replicas
    busy = [h.pod_name for h in replica.hosts if h.available != h.total]
    idle = [h.pod_name for h in replica.hosts if h.pod_name not in busy]
    (removal,) = plan.terminate
    assert removal.pods == tuple(h.pod_name for h in replica.hosts)
    assert group_ops(plan, "/replicas") == [0]
    (named,) = group_ops(plan, "/scaleStrategy")
    assert sorted(named["workersToDelete"]) == sorted(idle) and len(busy) == 1
    assert plan.launch == ()


def test_two_replicas_named_and_one_recreated() -> None:
    """One idle host in each of two busy replicas of three: Ray writes (12 - 2) // 4 = 2
    replicas while naming pods of two, which KubeRay deletes whole; it then creates one."""
    builder = SnapshotBuilder(v6e(max_replicas=3))
    for index in range(3):
        idle = [120.0 if (index < 2 and h == 0) else 0.0 for h in range(HOSTS)]
        busy = {h: {"TPU": 4.0} for h in range(HOSTS) if idle[h] == 0.0}
        builder.replica(GROUP, index, used=busy, idle_s=idle)
    plan = ray_plan(load(builder.build()))
    assert len(plan.terminate) == 2
    assert group_ops(plan, "/replicas") == [2]
    assert [(x.group, x.replicas) for x in plan.launch] == [(GROUP, 1)]


# --- applied as Ray applies it ---------------------------------------------------------------


@pytest.mark.parametrize(("policy", "guarded"), [("ray", False), ("slice", True)])
def test_stock_patches_are_unguarded_and_ours_guarded(policy: str, guarded: bool) -> None:
    sim = SimulatedCluster(v6e(), policy=policy, seed=1)  # type: ignore[arg-type]
    versions: list[str | None] = []
    patch = sim.store.patch_raycluster

    def recording(
        namespace: str, name: str, operations: list[dict[str, Any]], resource_version: str | None
    ) -> dict[str, Any]:
        versions.append(resource_version)
        return patch(namespace, name, copy.deepcopy(operations), resource_version)

    sim.store.patch_raycluster = recording  # type: ignore[method-assign]
    work = [{"at": 0, "duration": 60, "count": HOSTS, "task": {"resources": {"TPU": 4}}}]
    sim.load(parse_workload({"items": work}, "test"))
    sim.events.run_until(30)
    assert versions and all((v is not None) == guarded for v in versions)
    group = sim.store.get_raycluster(sim.namespace, sim.name)["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 1
