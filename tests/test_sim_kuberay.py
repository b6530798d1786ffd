"""The simulated KubeRay operator checked against KubeRay v1.7.0's own rules
(`reconcileMultiHostWorkerGroup`, `reconcilePods`, scale expectations, status), and the
simulated API server's graceful deletion and JSON patches as kube-apiserver applies
them. Every test here fails on a kinder model than the real one."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.factories import cpu_group, raycluster, tpu_group
from tpu_autoscaler.adapters.kube.api import Conflict, Rejected
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.json_patch import apply_operation
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import DEFAULT_GRACE_S, ObjectStore
from tpu_autoscaler.controlplane.world import IDEAL, REALISTIC, WorldModel
from tpu_autoscaler.core import catalog, labels

NS = "default"
NAME = "kr"
GROUP = "slices"


def _v6e(topology: str) -> catalog.SliceType:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    return catalog.slice_type(v6e, topology)


class Operator:
    """The store and the operator on a virtual clock, the operator reconciling on
    every change as KubeRay's watches make it."""

    def __init__(
        self,
        topology: str = "4x4",
        world: WorldModel = REALISTIC,
        gate: bool = True,
        extra_groups: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.events = EventQueue(seed=7)
        self.store = ObjectStore(self.events)
        self.store.create_raycluster(
            raycluster(tpu_group(GROUP, _v6e(topology), 0, 4), *extra_groups, name=NAME)
        )
        self.deleted: list[tuple[list[str], bool]] = []
        self.operator = KubeRayOperator(
            self.store,
            self.events,
            NS,
            NAME,
            multi_host_indexing=gate,
            world=world,
            on_pods_deleted=lambda pods, asked: self.deleted.append((pods, asked)),
        )
        self.store.watchers.append(self.operator.on_store_change)
        self.operator.reconcile()
        self.run(1.0)

    def run(self, seconds: float) -> None:
        self.events.run_until(self.events.now_s + seconds)

    def patch(self, *operations: dict[str, Any]) -> None:
        self.store.patch_raycluster(NS, NAME, list(operations), None)

    def set_replicas(self, replicas: int, group_index: int = 0) -> None:
        self.patch(
            {"op": "replace", "path": f"/spec/workerGroupSpecs/{group_index}/replicas",
             "value": replicas}
        )  # fmt: skip

    def delete_named(self, pods: list[str]) -> None:
        self.patch(
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": pods},
            }
        )

    def pods(self, group: str = GROUP) -> list[dict[str, Any]]:
        return self.store.list_pods(NS, {labels.KUBERAY_GROUP: group})

    def replicas(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for pod in self.pods():
            key = pod["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME]
            found.setdefault(key, []).append(pod)
        return found

    def run_all(self) -> None:
        for pod in self.pods():
            if pod["status"]["phase"] == "Pending":
                self.store.set_pod_phase(NS, pod["metadata"]["name"], "Running")


def test_a_replica_is_created_one_pod_post_at_a_time_with_kuberay_names() -> None:
    cluster = Operator("16x16")  # 64 hosts
    cluster.set_replicas(1)
    cluster.run(10.5 * REALISTIC.pod_create_latency_s)
    assert len(cluster.pods()) == 10  # a listing catches the replica half made
    assert cluster.operator.creating
    cluster.run(64 * REALISTIC.pod_create_latency_s)
    pods = cluster.pods()
    assert len(pods) == 64 and not cluster.operator.creating
    (replica,) = {p["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME] for p in pods}
    assert re.fullmatch(rf"{GROUP}-[bcdfghjklmnpqrstvwxz2456789]{{5}}", replica)
    for pod in pods:
        assert re.fullmatch(
            rf"{NAME}-{GROUP}-worker-[bcdfghjklmnpqrstvwxz2456789]{{5}}", pod["metadata"]["name"]
        )
    hosts = sorted(int(p["metadata"]["labels"][labels.KUBERAY_HOST_INDEX]) for p in pods)
    assert hosts == list(range(64))
    assert not cluster.operator.errors  # the half-made replica was never purged


def _members(document: Any) -> set[int]:
    """The ids of the dicts and lists in `document`, itself included."""
    found: set[int] = set()
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict | list) and id(value) not in found:
            found.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)
    return found


def test_pods_the_operator_hands_the_store_share_nothing_another_object_holds() -> None:
    """The store keeps each pod KubeRay creates as it was handed over, uncopied
    (`ObjectStore.store_pod`): that is safe only while the operator builds each pod
    afresh, no dict or list of it shared with the stored RayCluster (its template) or
    with another pod."""
    cluster = Operator("4x4", extra_groups=(cpu_group("cpus", 0, 2),))
    cluster.set_replicas(2)
    cluster.patch({"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 2})
    cluster.run(60.0)
    pods = cluster.pods() + cluster.pods("cpus")
    assert len(pods) == 2 * 4 + 2
    seen = _members(cluster.store.raycluster(NS, NAME))
    for pod in pods:
        members = _members(pod)
        assert not members & seen, pod["metadata"]["name"]
        seen |= members


def test_new_replicas_take_the_lowest_free_index() -> None:
    cluster = Operator()
    cluster.set_replicas(3)
    cluster.run(1.0)
    cluster.run_all()
    by_index = {
        members[0]["metadata"]["labels"][labels.KUBERAY_REPLICA_INDEX]: name
        for name, members in cluster.replicas().items()
    }
    assert sorted(by_index) == ["0", "1", "2"]
    middle = [p["metadata"]["name"] for p in cluster.replicas()[by_index["1"]]]
    cluster.delete_named(middle[:1])
    cluster.set_replicas(2)
    cluster.run(DEFAULT_GRACE_S + 1.0)
    cluster.set_replicas(3)
    cluster.run(1.0)
    indexes = sorted(
        m[0]["metadata"]["labels"][labels.KUBERAY_REPLICA_INDEX]
        for m in cluster.replicas().values()
    )
    assert indexes == ["0", "1", "2"]
    assert by_index["1"] not in cluster.replicas()


def test_naming_one_pod_deletes_its_whole_replica_and_the_list_is_never_cleared() -> None:
    cluster = Operator()
    cluster.set_replicas(2)
    cluster.run(1.0)
    cluster.run_all()
    doomed, kept = cluster.replicas().values()
    named = doomed[0]["metadata"]["name"]
    cluster.delete_named([named])
    cluster.set_replicas(1)
    cluster.run(1.0)
    assert cluster.deleted == [(sorted(p["metadata"]["name"] for p in doomed), True)]
    # Deleted running pods stay listed, terminating, for their grace period.
    terminating = [p for p in cluster.pods() if p["metadata"].get("deletionTimestamp")]
    assert {p["metadata"]["name"] for p in terminating} == {p["metadata"]["name"] for p in doomed}
    cluster.run(DEFAULT_GRACE_S)
    assert list(cluster.replicas()) == [kept[0]["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME]]
    spec = cluster.store.get_raycluster(NS, NAME)["spec"]["workerGroupSpecs"][0]
    assert spec["scaleStrategy"]["workersToDelete"] == [named]


def test_with_the_gate_off_only_the_named_pod_goes() -> None:
    cluster = Operator(gate=False)
    cluster.set_replicas(1)
    cluster.run(1.0)
    cluster.run_all()
    pods = cluster.pods()
    assert len(pods) == 4
    assert all(labels.KUBERAY_REPLICA_NAME not in p["metadata"]["labels"] for p in pods)
    assert {p["metadata"]["labels"][labels.WEBHOOK_REPLICA_INDEX] for p in pods} == {f"{GROUP}-0"}
    cluster.delete_named([pods[0]["metadata"]["name"]])
    cluster.set_replicas(0)
    cluster.run(DEFAULT_GRACE_S + 1.0)
    assert len(cluster.pods()) == 3  # a partial slice: nothing is atomic without the gate


def test_scale_expectations_hold_creation_until_deleted_pods_are_gone() -> None:
    cluster = Operator()
    cluster.set_replicas(1)
    cluster.run(1.0)
    cluster.run_all()
    (old,) = cluster.replicas().values()
    cluster.delete_named([old[0]["metadata"]["name"]])  # replicas stays 1: a replacement
    cluster.run(1.0)
    assert len(cluster.pods()) == 4  # only the old, terminating ones
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods())
    cluster.run(DEFAULT_GRACE_S)
    (new,) = cluster.replicas().values()
    assert not {p["metadata"]["name"] for p in new} & {p["metadata"]["name"] for p in old}


def test_an_incomplete_replica_is_deleted_whole_in_a_later_reconcile() -> None:
    cluster = Operator()
    cluster.set_replicas(1)
    cluster.run(1.0)
    cluster.run_all()
    (old,) = cluster.replicas().values()
    # Someone deletes one pod by hand; it was Failed already, so it goes at once.
    victim = old[0]["metadata"]["name"]
    cluster.store.set_pod_phase(NS, victim, "Failed")
    cluster.run(DEFAULT_GRACE_S + 2.0)
    names = {p["metadata"]["name"] for p in cluster.pods()}
    assert not names & {p["metadata"]["name"] for p in old}  # the rest went too
    assert len(cluster.pods()) == 4  # and a replacement was created
    assert any(not asked for _, asked in cluster.deleted)


def test_a_replica_missing_a_pod_is_purged_and_replaced() -> None:
    cluster = Operator()
    cluster.set_replicas(1)
    cluster.run(1.0)
    (old,) = cluster.replicas().values()
    cluster.store.delete_pod(NS, old[0]["metadata"]["name"])  # unbound: gone at once
    cluster.run(DEFAULT_GRACE_S + 2.0)
    assert any("incomplete replica group" in e for e in cluster.operator.errors)
    (new,) = cluster.replicas().values()
    assert len(new) == 4
    assert not {p["metadata"]["name"] for p in new} & {p["metadata"]["name"] for p in old}


def test_single_host_groups_create_and_delete_single_pods() -> None:
    cluster = Operator("2x4")  # one 8-chip host per replica
    cluster.set_replicas(3)
    cluster.run(1.0)
    pods = cluster.pods()
    assert len(pods) == 3
    assert all(labels.KUBERAY_REPLICA_NAME not in p["metadata"]["labels"] for p in pods)
    indexes = sorted(int(p["metadata"]["labels"][labels.KUBERAY_REPLICA_INDEX]) for p in pods)
    assert indexes == [0, 1, 2]
    cluster.delete_named([pods[1]["metadata"]["name"]])
    cluster.set_replicas(2)
    cluster.run(1.0)
    assert len(cluster.pods()) == 2  # unbound: gone at once, the other two untouched


def test_status_moves_the_resource_version_but_does_not_trigger_a_reconcile() -> None:
    cluster = Operator()
    before = cluster.store.get_raycluster(NS, NAME)
    cluster.set_replicas(1)
    cluster.run(1.0)
    cluster.run_all()
    cluster.run(1.0)
    after = cluster.store.get_raycluster(NS, NAME)
    assert after["status"]["desiredWorkerReplicas"] == 4
    assert after["status"]["availableWorkerReplicas"] == 4
    # Generation counts spec changes only; the status writes moved the version.
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    reconciles = cluster.operator.reconciles
    version = after["metadata"]["resourceVersion"]
    status = {**after["status"], "readyWorkerReplicas": 99}
    cluster.store.update_raycluster_status(NS, NAME, status, version)
    cluster.run(0.5)
    assert cluster.operator.reconciles == reconciles
    with pytest.raises(Conflict):
        cluster.store.update_raycluster_status(NS, NAME, status, version)


def test_a_spec_kuberay_refuses_gets_an_event_and_no_pods() -> None:
    cluster = Operator(extra_groups=(cpu_group("cpus", 0, 2),))
    # The CRD does not order min and max; KubeRay's own validation does.
    cluster.patch(
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/minReplicas", "value": 3},
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 3},
    )
    cluster.run(1.0)
    assert cluster.pods("cpus") == []
    cluster.operator.reconcile()  # again: the same refusal is not recorded twice
    (event,) = [e for e in cluster.store.events if e["reason"] == "InvalidRayClusterSpec"]
    assert event["type"] == "Warning" and "cpus" in event["message"]
    assert event["source"] == {"component": "raycluster-controller"}
    assert event["action"] == "Validate" and event["involvedObject"]["name"] == NAME
    assert any("cpus" in e for e in cluster.operator.errors)
    cluster.patch({"op": "replace", "path": "/spec/workerGroupSpecs/1/maxReplicas", "value": 3})
    cluster.run(1.0)
    assert len(cluster.pods("cpus")) == 3


def test_the_ideal_world_creates_atomically_and_deletes_at_once() -> None:
    cluster = Operator(world=IDEAL)
    cluster.set_replicas(1)
    cluster.run(0.0)
    assert len(cluster.pods()) == 4  # all at the instant of the patch
    cluster.run_all()
    cluster.delete_named([cluster.pods()[0]["metadata"]["name"]])
    cluster.set_replicas(0)
    cluster.run(0.1)
    assert cluster.pods() == []


# --- the API server ---------------------------------------------------------------------


def test_deletion_is_graceful_for_bound_pods_only() -> None:
    events = EventQueue()
    store = ObjectStore(events)
    for name in ("bound", "unbound"):
        store.create_pod(
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Pending"},
            }
        )
    store.set_pod_phase(NS, "bound", "Running")
    assert store.delete_pod(NS, "bound") and store.delete_pod(NS, "unbound")
    assert store.pod(NS, "unbound") is None
    assert store.pod(NS, "bound")["metadata"]["deletionTimestamp"]  # type: ignore[index]
    assert not store.delete_pod(NS, "bound")  # deleting again changes nothing
    events.run_until(DEFAULT_GRACE_S - 0.1)
    assert store.pod(NS, "bound") is not None
    events.run_until(DEFAULT_GRACE_S + 0.1)
    assert store.pod(NS, "bound") is None


def test_a_pod_removed_keeps_the_deletion_timestamp_its_deletes_gave_it() -> None:
    """The removal from storage (its watch event's version) keeps the timestamp the
    DELETEs set, as etcd's delete keeps the object's last version: at the end of the
    grace period, or, for a deletion cut short to no grace, the grace period's start
    (the timestamp moves back by the grace taken off), not the removal's time."""
    events = EventQueue(start_s=100.0)
    store = ObjectStore(events)
    heard: list[dict[str, Any]] = []
    store.watchers.append(lambda kind, obj: heard.append(obj))
    for name in ("waits", "cut-short"):
        store.create_pod(
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {"containers": [{"name": "c"}], "terminationGracePeriodSeconds": 30},
                "status": {"phase": "Pending"},
            }
        )
        store.set_pod_phase(NS, name, "Running")
    events.run_until(110.0)
    store.delete_pod(NS, "waits")
    store.delete_pod(NS, "cut-short")
    events.run_until(120.0)
    store.delete_pod(NS, "cut-short", grace_s=0)
    assert store.pod(NS, "cut-short") is None
    assert heard[-1]["metadata"]["deletionTimestamp"] == rfc3339(110.0)
    events.run_until(140.5)
    assert store.pod(NS, "waits") is None
    assert heard[-1]["metadata"]["deletionTimestamp"] == rfc3339(140.0)


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        ({"op": "add", "path": "/spec/missing/x", "value": 1}, "doc is missing path"),
        ({"op": "remove", "path": "/spec/absent"}, "doc is missing key"),
        ({"op": "replace", "path": "/spec/items/5", "value": 1}, "doc is missing key"),
        ({"op": "add", "path": "/spec/items/3", "value": 1}, "index out of range"),
    ],
)
def test_json_patches_that_do_not_apply_are_refused(
    operation: dict[str, Any], message: str
) -> None:
    with pytest.raises(Rejected, match=message):
        apply_operation({"spec": {"items": [1, 2]}}, operation)


def test_replace_of_a_missing_member_sets_it_as_json_patch_v4_does() -> None:
    document: dict[str, Any] = {"spec": {}}
    apply_operation(
        document, {"op": "replace", "path": "/spec/scaleStrategy", "value": {"workersToDelete": []}}
    )
    assert document == {"spec": {"scaleStrategy": {"workersToDelete": []}}}


def test_a_failed_single_host_pod_is_deleted_then_replaced_in_the_next_reconcile() -> None:
    cluster = Operator("2x4")
    cluster.set_replicas(2)
    cluster.run(1.0)
    cluster.run_all()
    failed = cluster.pods()[0]["metadata"]["name"]
    cluster.store.set_pod_phase(NS, failed, "Failed")
    cluster.run(1.0)
    assert ([failed], False) in cluster.deleted
    assert "delete 1 unhealthy worker Pods" in cluster.operator.errors
    names = {p["metadata"]["name"] for p in cluster.pods()}
    assert len(names) == 2 and failed not in names


def test_with_the_gate_off_pods_are_created_one_by_one_without_indexes() -> None:
    cluster = Operator(gate=False)
    cluster.set_replicas(2)
    cluster.run(4.5 * REALISTIC.pod_create_latency_s)
    assert len(cluster.pods()) == 4  # half of the 8, no replica made atomically
    cluster.run(1.0)
    pods = cluster.pods()
    assert len(pods) == 8
    for pod in pods:
        assert labels.KUBERAY_REPLICA_INDEX not in pod["metadata"]["labels"]
    slots = sorted(p["metadata"]["labels"][labels.WEBHOOK_REPLICA_INDEX] for p in pods)
    assert slots == [f"{GROUP}-0"] * 4 + [f"{GROUP}-1"] * 4  # the webhook numbers them
