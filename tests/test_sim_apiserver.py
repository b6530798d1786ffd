"""The simulated API server's routes (`controlplane.apiserver_routes`) where they were
made to answer as kube-apiserver 1.20 does (tests/realkube/test_sim_vs_real.py checks
the same against a real one where its binaries exist): patches applied to the stored
object with its resourceVersion, merge patches, copy and move, `details` in error
bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch

from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.apiserver_routes import MERGE_PATCH, Reply, Routes
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore

CLUSTER = Path(__file__).parent.parent / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
NS, NAME = "default", "tpu-v6e-16"
PATH = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{NAME}"
JSON_PATCH = "application/json-patch+json"
JSON = "application/json"
REPLICAS = "/spec/workerGroupSpecs/0/replicas"


def _routes() -> Routes:
    store = ObjectStore()
    store.create_raycluster(yaml.safe_load(CLUSTER.read_text()))
    return Routes(store)


def _patch(routes: Routes, patch: Any, content_type: str = JSON_PATCH, path: str = PATH) -> Reply:
    return routes.route("PATCH", path, {}, content_type, json.dumps(patch).encode())


def _version(routes: Routes) -> str:
    version: str = routes.store.get_raycluster(NS, NAME)["metadata"]["resourceVersion"]
    return version


def _guard(version: str) -> dict[str, Any]:
    return {"op": "replace", "path": "/metadata/resourceVersion", "value": version}


def test_a_patch_that_empties_or_removes_the_version_is_422() -> None:
    routes = _routes()
    version = _version(routes)
    scale = {"op": "replace", "path": REPLICAS, "value": 1}
    for guard in (_guard(""), {"op": "remove", "path": "/metadata/resourceVersion"}):
        reply = _patch(routes, [guard, scale])
        assert (reply.code, reply.body["reason"]) == (422, "Invalid")
        assert reply.body["message"] == (
            f'rayclusters.ray.io "{NAME}" is invalid: metadata.resourceVersion: '
            "Invalid value: 0x0: must be specified for an update"
        )
        assert reply.body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 0x0: must be specified for an update",
                "field": "metadata.resourceVersion",
            }
        ]
    assert _version(routes) == version


def test_a_patch_without_a_version_is_guarded_by_the_one_it_was_applied_to() -> None:
    routes = _routes()
    reply = _patch(routes, [{"op": "replace", "path": REPLICAS, "value": 1}])
    assert reply.code == 200
    assert reply.body["spec"]["workerGroupSpecs"][0]["replicas"] == 1


def test_a_merge_patch_applies_and_its_version_is_a_precondition() -> None:
    routes = _routes()
    merge = {"metadata": {"resourceVersion": _version(routes)}, "spec": {"rayVersion": "2.61.0"}}
    first = _patch(routes, merge, MERGE_PATCH)
    assert first.code == 200
    assert first.body["spec"]["rayVersion"] == "2.61.0"
    stale = _patch(routes, merge, MERGE_PATCH)
    assert (stale.code, stale.body["reason"]) == (409, "Conflict")
    removed = _patch(routes, {"metadata": {"resourceVersion": None}}, MERGE_PATCH)
    assert (removed.code, removed.body["reason"]) == (422, "Invalid")
    unguarded = _patch(routes, {"spec": {"rayVersion": "2.62.0"}}, MERGE_PATCH)
    assert unguarded.code == 200
    assert _patch(routes, [], "application/strategic-merge-patch+json").code == 415


def test_copy_and_move_apply() -> None:
    routes = _routes()
    reply = _patch(
        routes,
        [
            {"op": "copy", "from": "/spec/workerGroupSpecs/0", "path": "/spec/workerGroupSpecs/-"},
            {"op": "replace", "path": "/spec/workerGroupSpecs/1/groupName", "value": "second"},
            {
                "op": "move",
                "from": "/spec/workerGroupSpecs/1/maxReplicas",
                "path": "/spec/workerGroupSpecs/1/minReplicas",
            },
        ],
    )
    assert reply.code == 200, reply
    second = reply.body["spec"]["workerGroupSpecs"][1]
    assert (second["groupName"], second["minReplicas"]) == ("second", 2)
    missing = _patch(routes, [{"op": "copy", "from": "/spec/nowhere", "path": "/spec/x"}])
    assert (missing.code, missing.body["reason"]) == (422, "Invalid")


def test_error_bodies_carry_details() -> None:
    routes = _routes()
    version = _version(routes)
    invalid = [{"op": "replace", "path": "/spec/autoscalerOptions/upscalingMode", "value": "x"}]
    reply = _patch(routes, invalid)
    assert reply.body["details"] == {
        "name": NAME,
        "group": "ray.io",
        "kind": "RayCluster",
        "causes": [
            {
                "reason": "FieldValueNotSupported",
                "message": 'Unsupported value: "x": supported values: "Default", "Aggressive", '
                '"Conservative"',
                "field": "spec.autoscalerOptions.upscalingMode",
            }
        ],
    }
    stale = _patch(routes, [_guard(str(int(version) - 1))])
    assert stale.body["details"] == {"name": NAME, "group": "ray.io", "kind": "rayclusters"}
    missing = routes.route("GET", PATH.replace(NAME, "nope"), {}, "", b"")
    assert missing.body["details"] == {"name": "nope", "group": "ray.io", "kind": "rayclusters"}


def test_a_stored_object_has_a_uid_a_creation_time_and_managed_fields() -> None:
    routes = _routes()
    meta = routes.route("GET", PATH, {}, "", b"").body["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["managedFields"][0]["fieldsV1"]["f:spec"]
    patched = _patch(
        routes,
        [
            {"op": "replace", "path": "/metadata/uid", "value": ""},
            {
                "op": "replace",
                "path": "/metadata/creationTimestamp",
                "value": "2000-01-01T00:00:00Z",
            },
            {"op": "replace", "path": REPLICAS, "value": 1},
        ],
    )
    assert patched.code == 200
    for field in ("uid", "creationTimestamp", "managedFields"):
        assert patched.body["metadata"][field] == meta[field]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS}}
    stored = routes.store.create_pod({**pod, "spec": {}, "status": {}})
    assert stored["metadata"]["uid"] not in ("", meta["uid"])
    # The same in every run: uids are named, not random.
    assert _routes().route("GET", PATH, {}, "", b"").body["metadata"]["uid"] == meta["uid"]


def test_the_status_subresource_is_served() -> None:
    routes = _routes()
    heard: list[str] = []
    routes.store.watchers.append(lambda kind, obj: heard.append(kind))
    version = _version(routes)
    status_path = PATH + "/status"
    write = [
        _guard(version),
        {"op": "add", "path": "/status", "value": {"state": "ready", "unknown": 1}},
        {"op": "replace", "path": REPLICAS, "value": 1},  # the main resource: ignored
    ]
    reply = _patch(routes, write, path=status_path)
    assert reply.code == 200, reply
    assert reply.body["status"] == {"state": "ready"}  # pruned
    assert reply.body["metadata"]["generation"] == 1
    assert reply.body["spec"]["workerGroupSpecs"][0]["replicas"] == 0
    assert heard == ["RayCluster/status"]
    assert routes.route("GET", status_path, {}, "", b"").body["status"] == {"state": "ready"}
    stale = _patch(routes, write, path=status_path)
    assert (stale.code, stale.body["reason"]) == (409, "Conflict")
    current = routes.store.get_raycluster(NS, NAME)
    current["status"] = {"state": "suspended"}
    put = routes.route("PUT", status_path, {}, "application/json", json.dumps(current).encode())
    assert (put.code, put.body["status"]) == (200, {"state": "suspended"})
    bad = routes.store.get_raycluster(NS, NAME)
    bad["status"] = {"state": 3}
    refused = routes.route("PUT", status_path, {}, "application/json", json.dumps(bad).encode())
    assert (refused.code, refused.body["reason"]) == (422, "Invalid")


def test_pods_are_listed_by_set_based_selectors() -> None:
    routes = _routes()
    for name, labels in {"w": {"t": "worker", "g": "a", "n": "3"}, "h": {"t": "head"}}.items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}}
        pod["metadata"]["labels"] = labels
        routes.store.create_pod({**pod, "spec": {}, "status": {}})

    def listed(selector: str) -> Any:
        reply = routes.route(
            "GET", f"/api/v1/namespaces/{NS}/pods", {"labelSelector": [selector]}, "", b""
        )
        if reply.code != 200:
            return reply.code
        return [p["metadata"]["name"] for p in reply.body["items"]]

    assert listed("t!=head") == ["w"]
    assert listed("t in (head,worker)") == ["h", "w"]
    assert listed("t notin (head)") == ["w"]
    assert listed("g") == ["w"]
    assert listed("!g") == ["h"]
    assert listed("n>2,t=worker") == ["w"]
    assert listed("n<2") == []
    assert listed("t=head,t=worker") == []
    assert listed("t==head") == ["h"]
    assert listed("") == ["h", "w"]
    assert listed("t=") == []  # the empty value
    for malformed in ("a in b", "=x", "t in (a", "t,", "!", "t notin", "a b", "t>x", "-a=b"):
        assert listed(malformed) == 400, malformed


def test_objects_are_created_over_http() -> None:
    routes = Routes(ObjectStore())
    cluster = yaml.safe_load(CLUSTER.read_text())
    collection = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters"
    body = json.dumps(cluster).encode()
    created = routes.route("POST", collection, {}, "application/json", body)
    assert created.code == 201, created
    assert created.body["metadata"]["generation"] == 1
    again = routes.route("POST", collection, {}, "application/json", body)
    assert (again.code, again.body["reason"]) == (409, "AlreadyExists")
    assert again.body["details"] == {"name": NAME, "group": "ray.io", "kind": "rayclusters"}
    pods = f"/api/v1/namespaces/{NS}/pods"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    pod["spec"]["containers"] = [{"name": "main", "image": "busybox:1.36"}]
    made = routes.route("POST", pods, {}, "application/json", json.dumps(pod).encode())
    assert (made.code, made.body["metadata"]["namespace"]) == (201, NS)
    elsewhere = {**pod, "metadata": {"name": "q", "namespace": "other"}}
    wrong = routes.route("POST", pods, {}, "application/json", json.dumps(elsewhere).encode())
    assert wrong.code == 400


def test_a_created_pod_shares_nothing_with_the_callers_pod_or_the_answer() -> None:
    """`create_pod` stores a copy of the caller's pod and answers a copy of what it
    stored: changing either changes nothing stored (the simulated operator's
    `store_pod` hands its pods over instead; kube-apiserver decodes each request)."""
    store = ObjectStore()
    env = [{"name": "A", "value": "1"}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": NS, "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "a", "image": "busybox", "env": env}]},
    }
    answer = store.create_pod(pod)
    stored = json.loads(json.dumps(store.pod(NS, "p")))
    env.append({"name": "B", "value": "2"})
    pod["metadata"]["labels"]["app"] = "b"
    answer["spec"]["containers"][0]["env"].append({"name": "C", "value": "3"})
    answer["metadata"]["labels"]["app"] = "c"
    assert store.pod(NS, "p") == stored
    assert stored["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_a_created_pod_is_defaulted_and_pending() -> None:
    store = ObjectStore()
    containers = [
        {"name": "a", "image": "busybox", "ports": [{"containerPort": 80}]},
        {"name": "b", "image": "busybox:1.36", "resources": {"limits": {"cpu": "1"}}},
    ]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS}}
    stored = store.create_pod({**pod, "spec": {"containers": containers}})
    spec = stored["spec"]
    assert stored["status"] == {"phase": "Pending", "qosClass": "Burstable"}
    assert (spec["restartPolicy"], spec["dnsPolicy"]) == ("Always", "ClusterFirst")
    assert (spec["terminationGracePeriodSeconds"], spec["schedulerName"]) == (
        30,
        "default-scheduler",
    )
    first, second = spec["containers"]
    assert (first["imagePullPolicy"], second["imagePullPolicy"]) == ("Always", "IfNotPresent")
    assert first["terminationMessagePath"] == "/dev/termination-log"
    assert first["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert second["resources"]["requests"] == {"cpu": "1"}
    assert [(t["key"], t["tolerationSeconds"]) for t in spec["tolerations"]] == [
        ("node.kubernetes.io/not-ready", 300),
        ("node.kubernetes.io/unreachable", 300),
    ]
    # The simulated kubelet's shortcut: a pod created Running keeps its status.
    running = {**pod, "metadata": {"name": "r", "namespace": NS}, "spec": {}}
    assert store.create_pod({**running, "status": {"phase": "Running"}})["status"] == {
        "phase": "Running",
        "qosClass": "BestEffort",
    }


def test_a_taken_event_name_is_409_or_with_a_generate_name_a_server_timeout() -> None:
    routes = _routes()
    events = f"/api/v1/namespaces/{NS}/events"
    event = {"metadata": {"name": "e"}, "reason": "Launch", "message": "m"}
    post = json.dumps(event).encode()
    assert routes.route("POST", events, {}, "application/json", post).code == 201
    again = routes.route("POST", events, {}, "application/json", post)
    assert (again.code, again.body["reason"]) == (409, "AlreadyExists")
    both = json.dumps({**event, "metadata": {"name": "e", "generateName": "e-"}}).encode()
    timeout = routes.route("POST", events, {}, "application/json", both)
    assert (timeout.code, timeout.body["reason"]) == (500, "ServerTimeout")


def test_a_created_pod_with_empty_labels_stores_none() -> None:
    """Go's ObjectMeta omits an empty labels or annotations map (`omitempty`)."""
    routes = Routes(ObjectStore())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}}}
    pod["metadata"]["annotations"] = {}
    pod["spec"] = {"containers": [{"name": "main", "image": "busybox"}]}
    pods = f"/api/v1/namespaces/{NS}/pods"
    made = routes.route("POST", pods, {}, "application/json", json.dumps(pod).encode())
    assert made.code == 201
    assert not {"labels", "annotations"} & set(made.body["metadata"])


def test_listed_pods_carry_no_kind() -> None:
    """The items of a typed list have no apiVersion or kind (the list carries them)."""
    routes = Routes(ObjectStore())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    pod["spec"] = {"containers": [{"name": "main", "image": "busybox"}]}
    pods = f"/api/v1/namespaces/{NS}/pods"
    routes.route("POST", pods, {}, "application/json", json.dumps(pod).encode())
    [item] = routes.route("GET", pods, {}, "", b"").body["items"]
    assert not {"apiVersion", "kind"} & set(item)
    assert routes.store.pod(NS, "p")["kind"] == "Pod"  # type: ignore[index]


def test_a_status_put_to_a_missing_raycluster_is_404_before_its_version_is_checked() -> None:
    """kube-apiserver reads the stored object before it checks the update's version."""
    routes = Routes(ObjectStore())
    missing = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "gone"}}
    path = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/gone/status"
    answer = routes.route("PUT", path, {}, "application/json", json.dumps(missing).encode())
    assert (answer.code, answer.body["reason"]) == (404, "NotFound")


def test_a_name_taken_by_a_terminating_pod_is_already_exists_being_deleted() -> None:
    routes = Routes(ObjectStore(EventQueue()))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    pod["spec"] = {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "n"}
    pods = f"/api/v1/namespaces/{NS}/pods"
    body = json.dumps(pod).encode()
    assert routes.route("POST", pods, {}, "application/json", body).code == 201
    assert routes.route("DELETE", f"{pods}/p", {}, "", b"").code == 200
    again = routes.route("POST", pods, {}, "application/json", body)
    assert (again.code, again.body["reason"]) == (409, "AlreadyExists")
    assert again.body["message"] == 'object is being deleted: pods "p" already exists'


def _pod_routes(*bound: str, unbound: tuple[str, ...] = ()) -> tuple[Routes, str]:
    """Routes over a store whose clock never moves (no kubelet finishes a deletion)."""
    routes = Routes(ObjectStore(EventQueue()))
    pods = f"/api/v1/namespaces/{NS}/pods"
    for name in (*bound, *unbound):
        pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"}
        pod["metadata"] = {"name": name, "labels": {"bound": str(name in bound).lower()}}
        pod["spec"] = {"containers": [{"name": "main", "image": "busybox"}]}
        if name in bound:
            pod["spec"]["nodeName"] = "node-1"
        assert routes.route("POST", pods, {}, JSON, json.dumps(pod).encode()).code == 201
    return routes, pods


def _delete(routes: Routes, pods: str, name: str, options: dict[str, Any]) -> Reply:
    reply = routes.route("DELETE", f"{pods}/{name}", {}, JSON, json.dumps(options).encode())
    assert isinstance(reply, Reply)
    return reply


def test_an_unbound_pod_is_deleted_at_once_in_two_writes() -> None:
    """1.20 writes the deletionTimestamp (grace 0), answers that, then deletes: two
    versions, a MODIFIED and a DELETED event."""
    routes, pods = _pod_routes(unbound=("u",))
    created = routes.store.version
    gone = _delete(routes, pods, "u", {"gracePeriodSeconds": 30})
    assert gone.code == 200
    assert gone.body["metadata"]["deletionGracePeriodSeconds"] == 0
    assert gone.body["metadata"]["resourceVersion"] == str(created + 1)
    assert routes.store.version == created + 2
    assert routes.route("GET", f"{pods}/u", {}, "", b"").code == 404
    again = _delete(routes, pods, "u", {})
    assert (again.code, again.body["details"]) == (404, {"name": "u", "kind": "pods"})


def test_a_bound_pod_terminates_for_its_grace_period_which_may_only_shorten() -> None:
    routes, pods = _pod_routes("b")
    first = _delete(routes, pods, "b", {"gracePeriodSeconds": 20}).body["metadata"]
    assert first["deletionGracePeriodSeconds"] == 20
    longer = _delete(routes, pods, "b", {"gracePeriodSeconds": 25}).body["metadata"]
    assert longer == first  # nothing written
    shorter = _delete(routes, pods, "b", {"gracePeriodSeconds": 5}).body["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 5
    assert int(shorter["resourceVersion"]) > int(first["resourceVersion"])
    stored = routes.route("GET", f"{pods}/b", {}, "", b"")
    assert isinstance(stored, Reply) and stored.body["metadata"] == shorter
    assert _delete(routes, pods, "b", {"gracePeriodSeconds": 0}).code == 200
    assert routes.store.pod(NS, "b") is None


def test_a_delete_with_a_stale_precondition_is_409_naming_both_versions() -> None:
    routes, pods = _pod_routes("b")
    version = routes.store.version
    stale = _delete(routes, pods, "b", {"preconditions": {"resourceVersion": "1x"}})
    assert (stale.code, stale.body["details"]) == (409, {"name": "b", "kind": "Pod"})
    assert stale.body["message"] == (
        'Operation cannot be fulfilled on Pod "b": the ResourceVersion in the precondition '
        f"(1x) does not match the ResourceVersion in record ({version}). The object might "
        "have been modified"
    )
    current = {"preconditions": {"resourceVersion": str(version)}}
    assert _delete(routes, pods, "b", current).code == 200


def _watch(routes: Routes, path: str, **query: str) -> list[tuple[str, str, str]]:
    """The events a watch delivers before its (zero) timeout: (type, name, version)."""
    asked = {"watch": ["1"], "timeoutSeconds": ["0"], **{k: [v] for k, v in query.items()}}
    events = routes.route("GET", path, asked, "", b"")
    assert not isinstance(events, Reply), events
    return [
        (
            e["type"],
            e["object"]["metadata"].get("name"),
            e["object"]["metadata"].get("resourceVersion"),
        )
        for e in events
    ]


def test_a_watch_delivers_the_events_after_its_version() -> None:
    routes, pods = _pod_routes("b", unbound=("u",))
    start = str(routes.store.version)
    _delete(routes, pods, "u", {})
    _delete(routes, pods, "b", {"gracePeriodSeconds": 20})
    version = int(start)
    assert _watch(routes, pods, resourceVersion=start) == [
        ("MODIFIED", "u", str(version + 1)),
        ("DELETED", "u", str(version + 2)),
        ("MODIFIED", "b", str(version + 3)),
    ]
    assert _watch(routes, pods, resourceVersion=start, labelSelector="bound=true") == [
        ("MODIFIED", "b", str(version + 3))
    ]
    assert _watch(routes, pods, resourceVersion="0") == [("ADDED", "b", str(version + 3))]


def test_a_watch_from_before_the_record_is_expired() -> None:
    store = ObjectStore()
    for name in ("a", "b"):
        store.create_pod({"metadata": {"name": name, "namespace": NS}, "spec": {}, "status": {}})
    routes = Routes(store)  # records from here on, at version 2
    pods = f"/api/v1/namespaces/{NS}/pods"
    assert _watch(routes, pods, resourceVersion="0") == [("ADDED", "a", "1"), ("ADDED", "b", "2")]
    assert _watch(routes, pods, resourceVersion="2") == []
    asked = {"watch": ["1"], "resourceVersion": ["1"], "timeoutSeconds": ["0"]}
    [expired] = routes.route("GET", pods, asked, "", b"")  # type: ignore[misc]
    assert expired["type"] == "ERROR"
    assert (expired["object"]["code"], expired["object"]["reason"]) == (410, "Expired")


def test_a_watch_is_streamed_over_http_to_the_official_client() -> None:
    store = ObjectStore(EventQueue())
    with ApiServer(store) as server:
        configuration = client.Configuration()
        configuration.host = server.url
        with client.ApiClient(configuration) as api_client:
            core = client.CoreV1Api(api_client)
            since = str(store.version)
            for name in ("a", "b"):
                pod = {"metadata": {"name": name, "namespace": NS}, "status": {}}
                pod["spec"] = {"containers": [{"name": "main", "image": "busybox"}]}
                with server.lock:
                    store.create_pod(pod)
            heard = []
            stream = watch.Watch()
            for event in stream.stream(
                core.list_namespaced_pod, NS, resource_version=since, timeout_seconds=30
            ):
                heard.append((event["type"], event["object"].metadata.name))
                if len(heard) == 2:
                    stream.stop()
    assert heard == [("ADDED", "a"), ("ADDED", "b")]


def test_a_pod_list_is_read_at_the_newest_version_whatever_it_lists() -> None:
    """etcd's revision is global: a RayCluster write after the last pod moves it too."""
    routes, pods = _pod_routes("b")
    status = {"status": {"state": "ready"}}
    cluster = yaml.safe_load(CLUSTER.read_text())
    routes.store.create_raycluster(cluster)
    assert _patch(routes, status, MERGE_PATCH, f"{PATH}/status").code == 200
    listed = routes.route("GET", pods, {}, "", b"")
    assert isinstance(listed, Reply)
    assert listed.body["metadata"]["resourceVersion"] == str(routes.store.version)
    assert int(listed.body["items"][0]["metadata"]["resourceVersion"]) < routes.store.version
