"""Pods and GCS state into replicas and demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tpu_autoscaler.adapters.kube.pods import parse_pods, replicas_of
from tpu_autoscaler.adapters.ray.state import parse_ray_state
from tpu_autoscaler.adapters.snapshot_file import build_snapshot
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import GangStrategy
from tpu_autoscaler.core.snapshot import ReplicaState
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).parent.parent / "examples" / "clusters"


def v6e_builder() -> SnapshotBuilder:
    return SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))


def test_pods_and_nodes_become_whole_replicas() -> None:
    data = (
        v6e_builder()
        .replica("tpu-v6e-group", 0, used={1: {"TPU": 4.0}}, idle_s=[50, 0, 50, 50])
        .replica("tpu-v6e-group", 1, running=False, age_s=30)
        .build()
    )
    loaded = build_snapshot(data, "test")
    by_state = {r.state: r for r in loaded.snapshot.replicas}
    first, second = by_state[ReplicaState.RUNNING], by_state[ReplicaState.PENDING]
    assert [h.host_index for h in first.hosts] == [0, 1, 2, 3]
    assert first.slice_name == "tpu-v6e-group-0"
    assert first.hosts[1].available.get("TPU", 0) == 0 and first.hosts[0].idle_s == 50
    assert first.hosts[0].labels[labels.RAY_TPU_WORKER_ID] == "0"
    assert second.created_at_s == loaded.snapshot.now_s - 30


def test_requested_replicas_and_draining() -> None:
    data = v6e_builder().replica("tpu-v6e-group", 0).build()
    spec = data["raycluster"]["spec"]["workerGroupSpecs"][0]
    spec["replicas"] = 2
    spec["scaleStrategy"] = {"workersToDelete": [data["pods"]["items"][0]["metadata"]["name"]]}
    replicas = build_snapshot(data, "test").snapshot.replicas
    states = sorted(r.state.value for r in replicas)
    # The named pod's replica drains; two more are wanted and do not exist yet.
    assert states == ["draining", "requested", "requested"]


def test_pods_without_replica_identity_are_marked() -> None:
    data = v6e_builder().replica("tpu-v6e-group", 0).build()
    for pod in data["pods"]["items"]:
        pod["metadata"]["labels"].pop(labels.KUBERAY_REPLICA_NAME)
        # The webhook labels `replicaIndex` only where KubeRay's indices are missing.
        assert labels.WEBHOOK_REPLICA_INDEX not in pod["metadata"]["labels"]
    replicas = build_snapshot(data, "test").snapshot.replicas
    assert len(replicas) == 4 and not any(r.identified for r in replicas)


def test_webhook_replica_index_is_a_fallback() -> None:
    # KubeRay's gate off: no replica labels, so the webhook numbers the pods itself.
    data = v6e_builder().replica("tpu-v6e-group", 0, multi_host_indexing=False).build()
    for pod in data["pods"]["items"]:
        assert labels.KUBERAY_REPLICA_NAME not in pod["metadata"]["labels"]
        assert pod["metadata"]["labels"][labels.WEBHOOK_REPLICA_INDEX] == "tpu-v6e-group-0"
    (replica,) = build_snapshot(data, "test").snapshot.replicas
    assert replica.identified and len(replica.hosts) == 4
    assert sorted(h.host_index for h in replica.hosts) == [0, 1, 2, 3]  # from TPU_WORKER_ID


def test_other_clusters_pods_are_ignored() -> None:
    data = v6e_builder().replica("tpu-v6e-group", 0).build()
    for pod in data["pods"]["items"]:
        pod["metadata"]["labels"][labels.KUBERAY_CLUSTER] = "someone-else"
    loaded = build_snapshot(data, "test")
    pods = parse_pods(data["pods"]["items"])
    (replica,) = replicas_of(loaded.cluster, loaded.shapes, pods, {}, 0.0)
    # spec.replicas is 1 and none of the pods are ours: one replica is still to come.
    assert replica.state is ReplicaState.REQUESTED and replica.hosts == ()


def test_gang_strategies_and_selectors_from_the_gcs() -> None:
    b = v6e_builder()
    b.placement_group(
        "pg1", [{"TPU": 4.0}] * 2, "STRICT_SPREAD", [{"ray.io/tpu-pod-type": "v6e-16"}] * 2
    )
    b.placement_group("pg2", [{"CPU": 1.0}] * 2, "STRICT_PACK")
    b.placement_group("pg3", [{"CPU": 1.0}], "SPREAD")
    b.tasks({"TPU": 1.0}, 3, {"ray.io/tpu-pod-type": "v6e-16"})
    b.request_resources([{"TPU": 4.0}, {"TPU": 4.0}])
    state: dict[str, Any] = b.build()["ray_state"]
    demand = parse_ray_state(state).demand
    assert [g.strategy for g in demand.gangs] == [
        GangStrategy.STRICT_SPREAD,
        GangStrategy.STRICT_PACK,
        GangStrategy.SPREAD,
    ]
    assert [g.gang_id for g in demand.gangs] == ["pg1", "pg2", "pg3"]
    assert str(demand.gangs[0].bundles[0].selector[0]) == "ray.io/tpu-pod-type=v6e-16"
    (tasks,) = demand.resources
    assert tasks.count == 3
    (constraint,) = demand.constraints
    assert len(constraint.bundles) == 2


def test_a_variable_set_twice_reads_as_the_container_sees_it_the_last_one() -> None:
    """The TPU webhook appends `TPU_WORKER_ID` after a template's own, and the kubelet
    lets the later one win: a host index read from the first would be wrong."""
    (pod,) = parse_pods(
        [
            {
                "metadata": {"name": "p", "labels": {}},
                "spec": {
                    "containers": [
                        {
                            "name": "ray-worker",
                            "env": [
                                {"name": labels.ENV_TPU_WORKER_ID, "value": "0"},
                                {"name": labels.ENV_TPU_WORKER_ID, "value": "2"},
                            ],
                        }
                    ]
                },
            }
        ]
    )
    assert pod.env(labels.ENV_TPU_WORKER_ID) == "2"
