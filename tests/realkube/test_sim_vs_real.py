"""The same requests against the simulator's API server (`controlplane.apiserver`) and a
real kube-apiserver 1.20.2 with KubeRay's CRDs: each test runs on both and asserts what
both answer. The real runs are `kube_real` (skipped without the binaries).

Where the two differ, the test asserts the real server's answer and is marked
`xfail(strict=True)` on the simulated one, with the difference as its reason: it
turns into a failure (XPASS) once the simulator is fixed, so the mark can go. Where
the simulator follows current Kubernetes and 1.20 does not, the real run is the
expected failure instead."""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.realkube.endpoints import (
    GROUP,
    JSON_PATCH,
    MERGE_PATCH,
    NAME,
    Endpoint,
    Real,
    Simulated,
    names,
    pod,
    raycluster,
    walk_keys,
)
from tpu_autoscaler.adapters.kube.api import Conflict, Rejected
from tpu_autoscaler.controlplane import gke_events
from tpu_autoscaler.shell import events

REPLICAS = "/spec/workerGroupSpecs/0/replicas"
CONFLICT = (
    f'Operation cannot be fulfilled on rayclusters.ray.io "{NAME}": the object has been '
    "modified; please apply your changes to the latest version and try again"
)

SIMULATED = "simulated"
REAL = pytest.param("real", marks=pytest.mark.kube_real)


def differs_on_simulated(reason: str) -> list[Any]:
    """Both servers, the simulated one an expected failure for `reason`."""
    return [pytest.param(SIMULATED, marks=pytest.mark.xfail(strict=True, reason=reason)), REAL]


def differs_on_real(reason: str) -> list[Any]:
    mark = [pytest.mark.kube_real, pytest.mark.xfail(strict=True, reason=reason)]
    return [SIMULATED, pytest.param("real", marks=mark)]


BOTH = [SIMULATED, REAL]


def _endpoint(kind: str, request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    if kind == SIMULATED:
        simulated = Simulated(f"sim-{secrets.token_hex(3)}")
        try:
            yield simulated
        finally:
            simulated.close()
        return
    admin: client.ApiClient = request.getfixturevalue("admin")
    yield Real(admin, request.getfixturevalue("namespace"))


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    yield from _endpoint(request.param, request)


def _scale(replicas: int, version: str | None = None) -> list[dict[str, Any]]:
    guard = [] if version is None else [_guard(version)]
    return [*guard, {"op": "replace", "path": REPLICAS, "value": replicas}]


def _guard(version: str) -> dict[str, Any]:
    return {"op": "replace", "path": "/metadata/resourceVersion", "value": version}


def _version(obj: dict[str, Any]) -> str:
    version: str = obj["metadata"]["resourceVersion"]
    return version


# --- agreed ----------------------------------------------------------------------------


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_get_answers_the_stored_raycluster(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    answer = server.request("GET", server.raycluster_path())
    assert answer.status == 200
    assert (answer.body["apiVersion"], answer.body["kind"]) == ("ray.io/v1", "RayCluster")
    assert answer.body["spec"] == seeded["spec"]
    assert answer.body["metadata"]["generation"] == 1
    assert "status" not in answer.body
    assert server.kube_api().get_raycluster(server.namespace, NAME) == answer.body


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_get_of_a_missing_raycluster_is_404(server: Endpoint) -> None:
    answer = server.request("GET", server.raycluster_path("nope"))
    assert (answer.status, answer.reason) == (404, "NotFound")
    assert answer.message == 'rayclusters.ray.io "nope" not found'


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_guarded_json_patch_at_a_stale_version_is_409(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    moved = server.request("PATCH", server.raycluster_path(), _scale(1), JSON_PATCH)
    assert moved.status == 200
    answer = server.request(
        "PATCH", server.raycluster_path(), _scale(2, _version(seeded)), JSON_PATCH
    )
    assert (answer.status, answer.reason, answer.message) == (409, "Conflict", CONFLICT)
    with pytest.raises(Conflict):
        server.kube_api().patch_raycluster(server.namespace, NAME, _scale(2), _version(seeded))
    stored = server.request("GET", server.raycluster_path()).body
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    assert _version(stored) == _version(moved.body)


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_guarded_json_patch_at_the_current_version_applies(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    patched = server.kube_api().patch_raycluster(
        server.namespace, NAME, _scale(2), _version(seeded)
    )
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert patched["metadata"]["generation"] == 2
    assert int(_version(patched)) > int(_version(seeded))


@pytest.mark.parametrize("server", BOTH, indirect=True)
@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (REPLICAS, "two", 'must be of type integer: "string"'),
        ("/spec/enableInTreeAutoscaling", "yes", 'must be of type boolean: "string"'),
        (
            "/spec/autoscalerOptions/upscalingMode",
            "Sideways",
            'spec.autoscalerOptions.upscalingMode: Unsupported value: "Sideways": '
            'supported values: "Default", "Aggressive", "Conservative"',
        ),
        (
            "/spec/autoscalerOptions/version",
            "v3",
            'spec.autoscalerOptions.version: Unsupported value: "v3": supported values: "v1", "v2"',
        ),
    ],
)
def test_a_value_the_schema_forbids_is_422_and_changes_nothing(
    server: Endpoint, path: str, value: Any, message: str
) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    operations = [{"op": "replace", "path": path, "value": value}]
    answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
    assert (answer.status, answer.reason) == (422, "Invalid")
    assert answer.message.startswith(f'RayCluster.ray.io "{NAME}" is invalid: ')
    assert message in answer.message
    assert _version(server.request("GET", server.raycluster_path()).body) == _version(seeded)


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_unknown_fields_in_a_patch_are_pruned(server: Endpoint) -> None:
    server.seed_raycluster(raycluster(server.namespace))
    operations = [
        {"op": "add", "path": "/spec/unknownTop", "value": 1},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/unknownGroup", "value": {"a": 1}},
        {"op": "replace", "path": REPLICAS, "value": 1},
    ]
    answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
    assert answer.status == 200
    assert not {"unknownTop", "unknownGroup"} & set(walk_keys(answer.body))
    assert answer.body["spec"]["workerGroupSpecs"][0]["replicas"] == 1


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_status_in_a_main_resource_patch_is_dropped(server: Endpoint) -> None:
    server.seed_raycluster(raycluster(server.namespace))
    operations = [
        {"op": "add", "path": "/status", "value": {"state": "ready"}},
        {"op": "replace", "path": REPLICAS, "value": 1},
    ]
    answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
    assert answer.status == 200
    assert "status" not in answer.body


@pytest.mark.parametrize("server", BOTH, indirect=True)
@pytest.mark.parametrize(
    "operation",
    [
        {"op": "test", "path": REPLICAS, "value": 7},
        {"op": "replace", "path": "/spec/nowhere/replicas", "value": 1},
        {"op": "remove", "path": "/spec/workerGroupSpecs/3"},
    ],
    ids=["failed-test", "missing-parent", "missing-index"],
)
def test_a_json_patch_that_does_not_apply_is_422(
    server: Endpoint, operation: dict[str, Any]
) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    answer = server.request("PATCH", server.raycluster_path(), [operation], JSON_PATCH)
    assert (answer.status, answer.reason) == (422, "Invalid")
    assert _version(server.request("GET", server.raycluster_path()).body) == _version(seeded)


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_pods_are_listed_by_equality_selectors(server: Endpoint) -> None:
    worker = {"ray.io/cluster": NAME, "ray.io/group": GROUP, "ray.io/node-type": "worker"}
    seeds = {
        "a0": worker,
        "a1": worker,
        "head": {"ray.io/cluster": NAME, "ray.io/node-type": "head"},
        "other": {"ray.io/cluster": "other", "ray.io/group": GROUP},
    }
    for name, labels in seeds.items():
        server.seed_pod(pod(server.namespace, name, labels))

    def listed(selector: str | None) -> list[str]:
        query = [("labelSelector", selector)] if selector is not None else []
        answer = server.request("GET", server.pods_path(), query=query)
        assert answer.status == 200, answer
        assert (answer.body["apiVersion"], answer.body["kind"]) == ("v1", "PodList")
        assert answer.body["metadata"]["resourceVersion"].isdigit()
        return names(answer.body["items"])

    assert listed(None) == ["a0", "a1", "head", "other"]
    assert listed(f"ray.io/cluster={NAME},ray.io/group={GROUP}") == ["a0", "a1"]
    assert listed(f"ray.io/cluster=={NAME}") == ["a0", "a1", "head"]
    assert listed("ray.io/cluster=nobody") == []
    by_project = server.kube_api().list_pods(server.namespace, {"ray.io/node-type": "worker"})
    assert names(by_project) == ["a0", "a1"]


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_an_event_is_created_once_by_name(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    event = events.cluster_event(seeded, events.LAUNCH, "launch 1 replica", "Normal", 1e9)
    # Named by the client, as KubernetesApi.create_event names it (no generateName).
    del event["metadata"]["generateName"]
    event["metadata"]["name"] = f"{NAME}.launch"
    first = server.request("POST", server.events_path(), event)
    assert first.status == 201
    assert (first.body["reason"], first.body["involvedObject"]["name"]) == (events.LAUNCH, NAME)
    again = server.request("POST", server.events_path(), event)
    assert (again.status, again.reason) == (409, "AlreadyExists")
    assert again.message == f'events "{NAME}.launch" already exists'
    unnamed = events.cluster_event(seeded, events.REMOVE, "remove 1 replica", "Normal", 1e9)
    server.kube_api().create_event(server.namespace, unnamed)


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_events_are_listed_by_field_selector(server: Endpoint) -> None:
    """The capacity signals' read: the Events about pods (cluster-autoscaler's
    FailedScaleUp), not those about the RayCluster."""
    seeded = server.seed_raycluster(raycluster(server.namespace))
    stored = server.seed_pod(pod(server.namespace, "a0", {"ray.io/cluster": NAME}))
    on_cluster = events.cluster_event(seeded, events.LAUNCH, "launch 1 replica", "Normal", 1e9)
    server.kube_api().create_event(server.namespace, on_cluster)
    message = gke_events.failed_scale_up_message(gke_events.SCALE_UP_REASONS["quota"])
    on_pod = gke_events.failed_scale_up(stored, message, 1e9)
    assert server.request("POST", server.events_path(), on_pod).status == 201
    answer = server.request(
        "GET", server.events_path(), query=[("fieldSelector", "involvedObject.kind=Pod")]
    )
    assert answer.status == 200, answer
    assert (answer.body["apiVersion"], answer.body["kind"]) == ("v1", "EventList")
    assert answer.body["metadata"]["resourceVersion"].isdigit()
    (listed,) = answer.body["items"]
    assert (listed["reason"], listed["message"], listed["count"]) == ("FailedScaleUp", message, 1)
    assert listed["involvedObject"]["uid"] == stored["metadata"]["uid"]
    by_project = server.kube_api().list_events(server.namespace, "involvedObject.kind=Pod")
    assert [e["metadata"]["name"] for e in by_project] == [on_pod["metadata"]["name"]]
    everything = server.kube_api().list_events(server.namespace)
    assert sorted(e["reason"] for e in everything) == sorted(["FailedScaleUp", events.LAUNCH])


# --- differences -------------------------------------------------------------------------


@pytest.mark.parametrize("server", BOTH, indirect=True)
@pytest.mark.parametrize(
    "guard",
    [_guard(""), {"op": "remove", "path": "/metadata/resourceVersion"}],
    ids=["empty", "removed"],
)
def test_a_json_patch_that_empties_the_version_is_422(
    server: Endpoint, guard: dict[str, Any]
) -> None:
    server.seed_raycluster(raycluster(server.namespace))
    answer = server.request("PATCH", server.raycluster_path(), [guard, *_scale(1)], JSON_PATCH)
    assert (answer.status, answer.reason) == (422, "Invalid")
    assert "metadata.resourceVersion" in answer.message
    assert "must be specified for an update" in answer.message


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_patch_that_changes_nothing_keeps_the_version(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    for operations in (
        [{"op": "add", "path": "/spec/unknownTop", "value": 1}],
        _scale(0),
        _scale(0, _version(seeded)),
    ):
        answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
        assert answer.status == 200
        assert _version(answer.body) == _version(seeded), operations


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_merge_patch_applies_and_is_guarded_by_its_version(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    merge = {
        "metadata": {"resourceVersion": _version(seeded)},
        "spec": {"rayVersion": "2.61.0"},
    }
    first = server.request("PATCH", server.raycluster_path(), merge, MERGE_PATCH)
    assert first.status == 200
    assert first.body["spec"]["rayVersion"] == "2.61.0"
    stale = server.request("PATCH", server.raycluster_path(), merge, MERGE_PATCH)
    assert (stale.status, stale.reason, stale.message) == (409, "Conflict", CONFLICT)


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_pods_are_listed_by_set_based_selectors(server: Endpoint) -> None:
    server.seed_pod(pod(server.namespace, "w", {"ray.io/node-type": "worker", "g": "a"}))
    server.seed_pod(pod(server.namespace, "h", {"ray.io/node-type": "head"}))
    for selector, expected in [
        ("ray.io/node-type!=head", ["w"]),
        ("ray.io/node-type in (head,worker)", ["h", "w"]),
        ("ray.io/node-type notin (head)", ["w"]),
        ("g", ["w"]),
        ("!g", ["h"]),
    ]:
        answer = server.request("GET", server.pods_path(), query=[("labelSelector", selector)])
        assert answer.status == 200, (selector, answer)
        assert names(answer.body["items"]) == expected, selector


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_the_status_subresource_is_served(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    path = server.raycluster_path() + "/status"
    write = {"op": "add", "path": "/status", "value": {"state": "ready"}}
    answer = server.request("PATCH", path, [_guard(_version(seeded)), write], JSON_PATCH)
    assert answer.status == 200, answer
    assert answer.body["status"] == {"state": "ready"}
    assert answer.body["metadata"]["generation"] == 1
    assert server.request("GET", path).body["status"] == {"state": "ready"}


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_error_bodies_carry_details(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    invalid = [{"op": "replace", "path": "/spec/autoscalerOptions/upscalingMode", "value": "x"}]
    answer = server.request("PATCH", server.raycluster_path(), invalid, JSON_PATCH)
    assert answer.body["details"]["causes"] == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "x": supported values: "Default", "Aggressive", '
            '"Conservative"',
            "field": "spec.autoscalerOptions.upscalingMode",
        }
    ]
    assert answer.body["details"]["name"] == NAME
    stale = server.request(
        "PATCH", server.raycluster_path(), _scale(1, str(int(_version(seeded)) - 1)), JSON_PATCH
    )
    assert stale.body["details"] == {"name": NAME, "group": "ray.io", "kind": "rayclusters"}


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_objects_are_created_over_http(server: Endpoint) -> None:
    rayclusters = f"/apis/ray.io/v1/namespaces/{server.namespace}/rayclusters"
    answer = server.request("POST", rayclusters, raycluster(server.namespace))
    assert answer.status == 201, answer
    created = server.request("POST", server.pods_path(), pod(server.namespace, "p", {}))
    assert created.status == 201, created


@pytest.mark.parametrize(
    "server",
    differs_on_real(
        "KubeRay's CEL rules (x-kubernetes-validations, e.g. spec.managedBy's allowed "
        "values): Kubernetes 1.20 ignores them, the simulator enforces them as 1.25+ does"
    ),
    indirect=True,
)
def test_a_cel_rule_is_enforced(server: Endpoint) -> None:
    obj = raycluster(server.namespace)
    obj["spec"]["managedBy"] = "someone-else"
    if isinstance(server, Simulated):
        with pytest.raises(Rejected, match="managedBy"):
            server.seed_raycluster(obj)
        return
    rayclusters = f"/apis/ray.io/v1/namespaces/{server.namespace}/rayclusters"
    answer = server.request("POST", rayclusters, obj)
    assert (answer.status, answer.reason) == (422, "Invalid"), answer.status


@pytest.mark.parametrize(
    "server",
    differs_on_real(
        "a non-integer number for an integer field with format int32: Kubernetes 1.20 strips "
        "integer formats from CRD schemas (StripUnsupportedFormatsPostProcess) and says once "
        "'must be of type integer: \"number\"'; current Kubernetes keeps int32/int64 on "
        "integers (StripUnsupportedFormatsPostProcessorForVersion) and it says 'must be "
        "of type int32: \"float64\"' plus the format's range error, as the simulator does"
    ),
    indirect=True,
)
def test_a_fraction_for_an_integer_is_a_format_error(server: Endpoint) -> None:
    server.seed_raycluster(raycluster(server.namespace))
    operations = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/numOfHosts", "value": 1.5}]
    answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
    assert (answer.status, answer.reason) == (422, "Invalid")
    assert 'must be of type int32: "float64"' in answer.message
    assert "Checked value must be of type integer with format int32" in answer.message


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_taken_name_with_a_generate_name_is_a_server_timeout(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    event = events.cluster_event(seeded, events.LAUNCH, "launch 1 replica", "Normal", 1e9)
    event["metadata"]["name"] = f"{NAME}.both"
    assert server.request("POST", server.events_path(), event).status == 201
    again = server.request("POST", server.events_path(), event)
    assert (again.status, again.reason) == (500, "ServerTimeout")


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_stored_object_has_a_uid_and_a_creation_time(server: Endpoint) -> None:
    seeded = server.seed_raycluster(raycluster(server.namespace))
    meta = server.request("GET", server.raycluster_path()).body["metadata"]
    assert meta["uid"] == seeded["metadata"]["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["managedFields"]


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_a_created_pod_is_defaulted_and_pending(server: Endpoint) -> None:
    server.seed_pod(pod(server.namespace, "p", {"k": "v"}))
    [listed] = server.request("GET", server.pods_path()).body["items"]
    assert listed["status"]["phase"] == "Pending"
    assert listed["status"]["qosClass"] == "BestEffort"
    spec = listed["spec"]
    assert (spec["restartPolicy"], spec["dnsPolicy"]) == ("Always", "ClusterFirst")
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["containers"][0]["imagePullPolicy"] == "Always"
    assert {t["key"] for t in spec["tolerations"]} == {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }


@pytest.mark.parametrize("server", BOTH, indirect=True)
def test_copy_and_move_operations_apply(server: Endpoint) -> None:
    server.seed_raycluster(raycluster(server.namespace))
    operations = [
        {"op": "copy", "from": "/spec/workerGroupSpecs/0", "path": "/spec/workerGroupSpecs/-"},
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/groupName", "value": "second"},
        {
            "op": "move",
            "from": "/spec/workerGroupSpecs/1/maxReplicas",
            "path": "/spec/workerGroupSpecs/1/minReplicas",
        },
    ]
    answer = server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
    assert answer.status == 200, answer
    second = answer.body["spec"]["workerGroupSpecs"][1]
    assert (second["groupName"], second["minReplicas"]) == ("second", 2)


# --- side by side ------------------------------------------------------------------------

WORKERS = "/spec/workerGroupSpecs"
SECOND_GROUP = {**raycluster("any")["spec"]["workerGroupSpecs"][0], "groupName": "second"}
SEQUENCE: list[list[dict[str, Any]]] = [
    _scale(1),
    # Ray's stock provider replaces a scaleStrategy that manifests usually omit.
    [{"op": "replace", "path": f"{WORKERS}/0/scaleStrategy", "value": {"workersToDelete": ["a"]}}],
    [{"op": "add", "path": f"{WORKERS}/0/scaleStrategy/workersToDelete/-", "value": "b"}],
    [{"op": "replace", "path": "/spec/autoscalerOptions/idleTimeoutSeconds", "value": 120}],
    [{"op": "add", "path": f"{WORKERS}/-", "value": SECOND_GROUP}],
    [
        {
            "op": "add",
            "path": f"{WORKERS}/1/template/spec/containers/0/ports",
            "value": [{"containerPort": 8080, "name": "metrics"}],
        }
    ],
    [{"op": "replace", "path": f"{WORKERS}/1/replicas", "value": "two"}],
    [{"op": "add", "path": f"{WORKERS}/1/template/spec/containers/0/ports/-", "value": {}}],
    [{"op": "test", "path": f"{WORKERS}/0/replicas", "value": 1}, *_scale(0)],
    [{"op": "remove", "path": f"{WORKERS}/1"}],
    [{"op": "remove", "path": f"{WORKERS}/0/scaleStrategy/workersToDelete"}],
    [{"op": "replace", "path": f"{WORKERS}/0/groupName", "value": None}],
]


def _comparable(obj: Any) -> Any:
    """A stored object as both servers should have it: ids, versions and times aside
    (and managedFields, which only the real server keeps)."""
    if not isinstance(obj, dict) or "metadata" not in obj:
        return obj
    kept = copy.deepcopy(obj)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace"):
        kept["metadata"].pop(key, None)
    return kept


@pytest.mark.kube_real
def test_both_servers_answer_a_sequence_of_patches_alike(
    admin: client.ApiClient, namespace: str
) -> None:
    """The same JSON patches, one after another, on both servers: the same status codes
    and reasons, and the same stored RayCluster after each (ids, versions, times aside)."""
    simulated, real = Simulated(namespace), Real(admin, namespace)
    try:
        seeded = [server.seed_raycluster(raycluster(namespace)) for server in (simulated, real)]
        assert _comparable(seeded[0]) == _comparable(seeded[1])
        for operations in SEQUENCE:
            sim_answer, real_answer = (
                server.request("PATCH", server.raycluster_path(), operations, JSON_PATCH)
                for server in (simulated, real)
            )
            assert (sim_answer.status, sim_answer.reason) == (
                real_answer.status,
                real_answer.reason,
            ), operations
            stored = [
                server.request("GET", server.raycluster_path()).body for server in (simulated, real)
            ]
            assert _comparable(stored[0]) == _comparable(stored[1]), operations
    finally:
        simulated.close()
