"""The operator's pod cache (`controlplane/kuberay_cache.py`) answers what KubeRay
reads from its listed pods: here, the replica index of each replica, which KubeRay
takes from the replica's first pod by name, kept as pods come and go."""

from __future__ import annotations

from typing import Any

from tpu_autoscaler.controlplane.kuberay_cache import GroupPods
from tpu_autoscaler.core import labels


def _pod(name: str, replica: str, index: str | None) -> dict[str, Any]:
    pod_labels = {labels.KUBERAY_REPLICA_NAME: replica}
    if index is not None:
        pod_labels[labels.KUBERAY_REPLICA_INDEX] = index
    return {"metadata": {"name": name, "labels": pod_labels}, "status": {"phase": "Running"}}


def _walked(pods: GroupPods, left_out: set[str]) -> set[int]:
    """What the reconcile read before the cache kept it: each replica's sorted pods."""
    return {
        int(pods.members(r)[0]["metadata"]["labels"].get(labels.KUBERAY_REPLICA_INDEX, -1))
        for r in pods.replicas
        if r not in left_out
    }


def test_a_replica_index_is_its_first_pods_as_pods_come_and_go() -> None:
    pods = GroupPods()
    second, first = _pod("w-b", "r1", "7"), _pod("w-a", "r1", "0")
    pods.add(second)
    assert pods.replica_indexes(set()) == {7}
    pods.add(first)  # a pod first by name, added later, speaks for its replica
    pods.add(_pod("w-c", "r2", None))  # no index label: -1
    assert pods.replica_indexes(set()) == {0, -1} == _walked(pods, set())
    pods.remove(first)  # the next by name speaks for it now
    assert pods.replica_indexes(set()) == {7, -1} == _walked(pods, set())
    assert pods.replica_indexes({"r2"}) == {7} == _walked(pods, {"r2"})
    pods.remove(second)
    assert pods.replica_indexes(set()) == {-1} == _walked(pods, set())
    assert pods.first_of == {"r2": "w-c"}
