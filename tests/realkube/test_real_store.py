"""The simulated controllers' store on a real kube-apiserver (`controlplane/real_store.py`)
is honest: a write the server refuses raises its error and changes nothing, the cache
holds what the server answered, a bound pod's deletion keeps its `deletionTimestamp`
on the server until the kubelet's DELETE at the end of its grace period, and what
other writers do reaches the cache (and its watchers) at the next resync."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from tests.realkube.endpoints import NAME, pod, raycluster
from tpu_autoscaler.adapters.kube.api import Conflict, NotFound, Unavailable
from tpu_autoscaler.controlplane import gke_events
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.real_server import ServerCalls
from tpu_autoscaler.controlplane.real_store import (
    KUBELET_RETRY_S,
    RESYNC_PERIOD_S,
    ServerBackedStore,
)

pytestmark = pytest.mark.kube_real


class Heard:
    """A store watcher: (kind, name) of every change it is told of."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.changes.append((kind, obj["metadata"]["name"]))


def _store(admin: client.ApiClient, namespace: str) -> tuple[ServerBackedStore, Heard]:
    store = ServerBackedStore(EventQueue(start_s=time.time()), admin, namespace)
    heard = Heard()
    store.watchers.append(heard)
    return store, heard


def _version(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


def test_a_status_write_on_a_stale_version_is_refused_and_changes_nothing(
    admin: client.ApiClient, namespace: str
) -> None:
    store, heard = _store(admin, namespace)
    created = store.create_raycluster(raycluster(namespace))
    server = ServerCalls(admin, namespace)
    # Another writer (a person) annotates the RayCluster: the server's version moves.
    edit = [{"op": "add", "path": "/metadata/annotations", "value": {"edited": "yes"}}]
    edited = server.json_patch(server.raycluster_path(NAME), edit)
    assert _version(edited) != _version(created)
    status = {"readyWorkerReplicas": 0, "desiredWorkerReplicas": 0}
    with pytest.raises(Conflict, match="409"):
        store.update_raycluster_status(namespace, NAME, status, _version(created))
    assert store.server.answers[("PUT", "rayclusters/status", 409)] == 1
    assert "status" not in server.get(server.raycluster_path(NAME))
    assert _version(store.get_raycluster(namespace, NAME)) == _version(created)
    # The next resync brings the edit, told as a change beyond the status.
    heard.changes.clear()
    store.clock.run_until(store.clock.now_s + RESYNC_PERIOD_S)
    assert heard.changes == [("RayCluster", NAME)]
    cached = store.get_raycluster(namespace, NAME)
    assert _version(cached) == _version(edited)
    # On the version the cache now holds, the write lands and the cache holds the answer.
    heard.changes.clear()
    written = store.update_raycluster_status(namespace, NAME, status, _version(cached))
    assert written["status"] == status
    assert _version(server.get(server.raycluster_path(NAME))) == _version(written)
    assert _version(store.get_raycluster(namespace, NAME)) == _version(written)
    assert heard.changes == [("RayCluster/status", NAME)]


def test_a_bound_pod_stays_terminating_for_its_grace_period_an_unbound_one_goes_at_once(
    admin: client.ApiClient, namespace: str
) -> None:
    store, heard = _store(admin, namespace)
    server = ServerCalls(admin, namespace)
    for name in ("bound", "unbound"):
        store.create_pod(pod(namespace, name, {"app": "x"}))
    store.bind_pod(namespace, "bound", "node-1")
    assert server.get(server.pod_path("bound"))["spec"]["nodeName"] == "node-1"
    store.set_pod_phase(namespace, "bound", "Running")
    assert server.get(server.pod_path("bound"))["status"]["phase"] == "Running"

    assert store.delete_pod(namespace, "unbound")
    with pytest.raises(NotFound):
        server.get(server.pod_path("unbound"))
    assert store.pod(namespace, "unbound") is None

    heard.changes.clear()
    assert store.delete_pod(namespace, "bound")
    on_server = server.get(server.pod_path("bound"))
    assert on_server["metadata"]["deletionTimestamp"]
    assert on_server["metadata"]["deletionGracePeriodSeconds"] == 30
    cached = store.pod(namespace, "bound")
    assert cached is not None and cached["metadata"]["deletionTimestamp"]
    assert heard.changes == [("Pod", "bound")]
    assert not store.delete_pod(namespace, "bound")  # terminating already: no new call
    store.clock.run_until(store.clock.now_s + 29.0)
    assert server.get(server.pod_path("bound"))["metadata"]["deletionTimestamp"]
    store.clock.run_until(store.clock.now_s + 2.0)  # the grace period is over
    with pytest.raises(NotFound):
        server.get(server.pod_path("bound"))
    assert store.pod(namespace, "bound") is None
    assert store.server.answers[("DELETE", "pods", 200)] == 3  # two deletions, the kubelet's


def test_pods_deleted_by_another_writer_leave_the_cache_at_the_next_resync(
    admin: client.ApiClient, namespace: str
) -> None:
    store, heard = _store(admin, namespace)
    store.create_pod(pod(namespace, "gone", {"app": "x"}))
    ServerCalls(admin, namespace).delete(f"/api/v1/namespaces/{namespace}/pods/gone")
    assert store.pod(namespace, "gone") is not None  # the cache has not looked yet
    heard.changes.clear()
    store.clock.run_until(store.clock.now_s + RESYNC_PERIOD_S)
    assert store.pod(namespace, "gone") is None
    assert heard.changes == [("Pod", "gone")]


def test_a_repeated_event_is_counted_on_the_server_and_a_failed_pod_keeps_its_reason(
    admin: client.ApiClient, namespace: str
) -> None:
    """GKE's FailedScaleUp said twice: one Event on the server, counted twice (the
    recorder's PUT of the counted copy); the kubelet's node-shutdown status of a
    preempted pod as the server stores it."""
    store, _ = _store(admin, namespace)
    stored = store.create_pod(pod(namespace, "w-0", {"ray.io/cluster": NAME}))
    message = gke_events.failed_scale_up_message(gke_events.SCALE_UP_REASONS["stockout"])
    now_s = store.clock.now_s
    store.record_event(namespace, gke_events.failed_scale_up(stored, message, now_s))
    store.record_event(namespace, gke_events.failed_scale_up(stored, message, now_s + 300))
    (served,) = store.list_events(namespace, "involvedObject.kind=Pod")
    assert (served["reason"], served["count"], served["message"]) == ("FailedScaleUp", 2, message)
    assert served["lastTimestamp"] > served["firstTimestamp"]
    assert served["involvedObject"]["uid"] == stored["metadata"]["uid"]
    store.bind_pod(namespace, "w-0", "node-0")
    store.set_pod_phase(namespace, "w-0", "Running")
    store.set_pod_phase(
        namespace,
        "w-0",
        "Failed",
        gke_events.NODE_SHUTDOWN_REASON,
        gke_events.NODE_SHUTDOWN_MESSAGE,
    )
    got = client.CoreV1Api(admin).read_namespaced_pod_status("w-0", namespace)
    assert (got.status.phase, got.status.reason) == ("Failed", "Terminated")
    assert got.status.message == gke_events.NODE_SHUTDOWN_MESSAGE
    (ready,) = [c for c in got.status.conditions if c.type == "Ready"]
    assert ready.status == "False"


def _running_pod(store: ServerBackedStore, namespace: str, name: str) -> None:
    store.create_pod(pod(namespace, name, {"app": "x"}))
    store.bind_pod(namespace, name, "node-1")
    store.set_pod_phase(namespace, name, "Running")


@pytest.mark.parametrize("how", ["another writer", "an answer lost"])
def test_a_pod_terminating_on_the_server_is_removed_after_its_grace_whoever_deleted_it(
    admin: client.ApiClient, namespace: str, how: str
) -> None:
    """The kubelet stops a pod it sees terminating, whoever deleted it and however the
    operator's informer learnt of it: a person's graceful DELETE, or the operator's own
    whose answer never came back (`Unavailable`: applied or not, only a re-read tells).
    Without that the pod stays terminating on the server for good, and KubeRay's
    expectation of its deletion holds the group still."""
    store, _ = _store(admin, namespace)
    _running_pod(store, namespace, "w")
    server = ServerCalls(admin, namespace)
    if how == "another writer":
        server.delete(server.pod_path("w"))
    else:
        send = store.server.send

        def answer_lost(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            answer = send(method, path, *args, **kwargs)
            if method == "DELETE":
                raise Unavailable(f"{method} {path}: the connection dropped")
            return answer

        store.server.send = answer_lost  # type: ignore[method-assign]
        with pytest.raises(Unavailable):
            store.delete_pod(namespace, "w")
        store.server.send = send  # type: ignore[method-assign]
    assert server.get(server.pod_path("w"))["metadata"]["deletionGracePeriodSeconds"] == 30
    store.clock.run_until(store.clock.now_s + RESYNC_PERIOD_S)  # the informer sees it
    cached = store.pod(namespace, "w")
    assert cached is not None and cached["metadata"]["deletionTimestamp"]
    assert not store.delete_pod(namespace, "w")  # terminating already: the kubelet's now
    store.clock.run_until(store.clock.now_s + 29.0)
    assert server.get(server.pod_path("w"))["metadata"]["deletionTimestamp"]
    store.clock.run_until(store.clock.now_s + 1.0 + RESYNC_PERIOD_S)
    with pytest.raises(NotFound):
        server.get(server.pod_path("w"))
    assert store.pod(namespace, "w") is None
    assert store.kubelet_failures == []


def test_a_removal_the_server_refuses_is_reported_and_tried_again(
    admin: client.ApiClient, namespace: str
) -> None:
    """The kubelet's DELETE at the end of the grace period meets a server that does not
    answer (5xx, a dropped connection): the failure is recorded, the pod stays in the
    cache as it stays on the server, and the removal is tried again a second later,
    not lost with the event that failed (nor raised out of the event queue)."""
    store, _ = _store(admin, namespace)
    _running_pod(store, namespace, "w")
    assert store.delete_pod(namespace, "w")
    send = store.server.send
    refused: list[str] = []

    def unavailable(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if method == "DELETE" and len(refused) < 2:
            refused.append(path)
            raise Unavailable(f"{method} {path}: 503 ServiceUnavailable")
        return send(method, path, *args, **kwargs)

    store.server.send = unavailable  # type: ignore[method-assign]
    server = ServerCalls(admin, namespace)
    store.clock.run_until(store.clock.now_s + 30.0)
    assert len(refused) == 1
    assert len(store.kubelet_failures) == 1
    assert "503" in store.kubelet_failures[0] and "w" in store.kubelet_failures[0]
    assert store.pod(namespace, "w") is not None
    assert server.get(server.pod_path("w"))["metadata"]["deletionTimestamp"]
    store.clock.run_until(store.clock.now_s + KUBELET_RETRY_S)
    assert len(refused) == 2 and len(store.kubelet_failures) == 2
    store.clock.run_until(store.clock.now_s + KUBELET_RETRY_S)
    with pytest.raises(NotFound):
        server.get(server.pod_path("w"))
    assert store.pod(namespace, "w") is None


def test_the_kubelet_removes_only_the_pod_it_saw_terminating_not_one_made_since_under_its_name(
    admin: client.ApiClient, namespace: str
) -> None:
    """A pod removed at once by someone else and made again under its name before the
    grace period ends is a new pod (a new uid): the kubelet's DELETE, made on the uid
    it saw terminating, leaves it be."""
    store, _ = _store(admin, namespace)
    _running_pod(store, namespace, "w")
    assert store.delete_pod(namespace, "w")
    server = ServerCalls(admin, namespace)
    server.delete(server.pod_path("w"), grace_period_s=0)
    store.create_pod(pod(namespace, "w", {"app": "x"}))
    store.bind_pod(namespace, "w", "node-2")
    store.clock.run_until(store.clock.now_s + 31.0)
    again = server.get(server.pod_path("w"))
    assert again["spec"]["nodeName"] == "node-2" and not again["metadata"].get("deletionTimestamp")
    assert store.pod(namespace, "w") is not None
    assert store.kubelet_failures == []
