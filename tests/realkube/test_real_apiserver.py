"""What a real kube-apiserver (1.20.2, KubeRay v1.7.0's CRDs) does with the requests the
autoscaler and KubeRay make, through the official client and the project's own
(`KubernetesApi`): optimistic concurrency, the CRD's validation and pruning, the status
subresource, label selectors and graceful pod deletion."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.realkube.endpoints import (
    GROUP,
    MERGE_PATCH,
    NAME,
    call,
    names,
    pod,
    raycluster,
    walk_keys,
)
from tpu_autoscaler.adapters.kube.api import Conflict, Rejected
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy
from tpu_autoscaler.controlplane import kube120

pytestmark = pytest.mark.kube_real

RAY = ("ray.io", "v1")
REPLICAS = "/spec/workerGroupSpecs/0/replicas"


def _objects(admin: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(admin)


def _create(admin: client.ApiClient, namespace: str, obj: dict[str, Any] | None = None) -> Any:
    body = obj if obj is not None else raycluster(namespace)
    return _objects(admin).create_namespaced_custom_object(*RAY, namespace, "rayclusters", body)


def _get(admin: client.ApiClient, namespace: str, name: str = NAME) -> Any:
    return _objects(admin).get_namespaced_custom_object(*RAY, namespace, "rayclusters", name)


def _kube_api(admin: client.ApiClient) -> KubernetesApi:
    return KubernetesApi(admin, RetryPolicy(attempts=1), 30.0)


def _scale(replicas: int) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": REPLICAS, "value": replicas}]


def _error(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call()
    body: dict[str, Any] = json.loads(caught.value.body)
    return int(caught.value.status), body


# --- the server and its CRDs -------------------------------------------------------------


def test_the_server_is_kubernetes_1_20_with_kuberays_crds(admin: client.ApiClient) -> None:
    version = client.VersionApi(admin).get_code()
    assert (version.major, version.minor) == ("1", "20")
    extensions = client.ApiextensionsV1Api(admin)
    for kind in kube120.CRD_FILES:
        shipped, _ = kube120.for_kube_1_20(kube120.kuberay_crd(kind))
        served = extensions.read_custom_resource_definition(shipped["metadata"]["name"])
        assert [v.name for v in served.spec.versions] == ["v1", "v1alpha1"]
        assert served.spec.versions[0].subresources.status is not None


def test_kuberays_crd_as_shipped_is_refused_and_the_edits_are_what_it_takes(
    admin: client.ApiClient,
) -> None:
    """The two edits of `kube120.for_kube_1_20` are needed (the original is refused,
    for those fields) and enough (the edited one is accepted: the fixture installed it)."""
    original = kube120.kuberay_crd("RayCluster")
    original["metadata"]["name"] = "rayclusters.shipped.ray.io"
    original["spec"]["group"] = "shipped.ray.io"
    status, body = _error(
        lambda: client.ApiextensionsV1Api(admin).create_custom_resource_definition(original)
    )
    assert (status, body["reason"]) == (422, "Invalid")
    causes = body["details"]["causes"]
    assert len(causes) == 146
    assert {(c["field"].rsplit(".", 1)[1], c["message"]) for c in causes} == {
        ("default", 'Invalid value: "null":  in body must be of type string: "null"')
    }
    _, edits = kube120.for_kube_1_20(kube120.kuberay_crd("RayCluster"))
    assert (len(edits.defaults_dropped), len(edits.keys_required)) == (146, 4)


def test_an_image_pull_secret_needs_a_name_on_1_20(admin: client.ApiClient, namespace: str) -> None:
    """The price of edit 2: a current server would name the entry ""."""
    obj = raycluster(namespace)
    obj["spec"]["workerGroupSpecs"][0]["template"]["spec"]["imagePullSecrets"] = [{}]
    status, body = _error(lambda: _create(admin, namespace, obj))
    assert (status, body["reason"]) == (422, "Invalid")
    assert [c["field"] for c in body["details"]["causes"]] == [
        "spec.workerGroupSpecs.template.spec.imagePullSecrets.name"
    ]


# --- optimistic concurrency -------------------------------------------------------------


def test_a_guarded_json_patch_at_a_stale_version_is_409_and_changes_nothing(
    admin: client.ApiClient, namespace: str
) -> None:
    created = _create(admin, namespace)
    stale = created["metadata"]["resourceVersion"]
    api = _kube_api(admin)
    moved = api.patch_raycluster(namespace, NAME, _scale(1), stale)
    assert moved["metadata"]["resourceVersion"] != stale
    with pytest.raises(Conflict, match="the object has been modified"):
        api.patch_raycluster(namespace, NAME, _scale(2), stale)
    stored = _get(admin, namespace)
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    assert stored["metadata"]["resourceVersion"] == moved["metadata"]["resourceVersion"]


def test_a_guarded_json_patch_at_the_current_version_applies_once(
    admin: client.ApiClient, namespace: str
) -> None:
    created = _create(admin, namespace)
    version = created["metadata"]["resourceVersion"]
    patched = _kube_api(admin).patch_raycluster(namespace, NAME, _scale(2), version)
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert patched["metadata"]["generation"] == created["metadata"]["generation"] + 1
    assert int(patched["metadata"]["resourceVersion"]) > int(version)


def test_a_replace_or_merge_patch_at_a_stale_version_is_409(
    admin: client.ApiClient, namespace: str
) -> None:
    created = _create(admin, namespace)
    objects = _objects(admin)
    _kube_api(admin).patch_raycluster(namespace, NAME, _scale(1), None)
    created["spec"]["workerGroupSpecs"][0]["replicas"] = 2
    status, body = _error(
        lambda: objects.replace_namespaced_custom_object(
            *RAY, namespace, "rayclusters", NAME, created
        )
    )
    assert (status, body["reason"]) == (409, "Conflict")
    merge = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"rayVersion": "2.61.0"},
    }
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/{NAME}"
    answer = call(admin, "PATCH", path, merge, MERGE_PATCH)
    assert (answer.status, answer.reason) == (409, "Conflict")
    stored = _get(admin, namespace)
    assert (stored["spec"]["workerGroupSpecs"][0]["replicas"], stored["spec"]["rayVersion"]) == (
        1,
        "2.60.0",
    )


def test_a_json_patch_that_empties_the_resource_version_is_422_for_a_custom_resource(
    admin: client.ApiClient, namespace: str
) -> None:
    """Custom resources allow no unconditional update: a patch that leaves the version
    empty is refused (it is not taken as "no precondition")."""
    _create(admin, namespace)
    with pytest.raises(Rejected, match="must be specified for an update"):
        _kube_api(admin).patch_raycluster(namespace, NAME, _scale(1), "")


# --- validation and pruning -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "field", "cause"),
    [
        (REPLICAS, "two", "spec.workerGroupSpecs.replicas", "FieldValueInvalid"),
        (
            "/spec/autoscalerOptions/upscalingMode",
            "Sideways",
            "spec.autoscalerOptions.upscalingMode",
            "FieldValueNotSupported",
        ),
    ],
)
def test_a_value_the_schema_forbids_is_422_on_patch_and_on_create(
    admin: client.ApiClient, namespace: str, path: str, value: Any, field: str, cause: str
) -> None:
    obj = raycluster(namespace)
    _create(admin, namespace, obj)
    with pytest.raises(Rejected, match=field.replace(".", r"\.")):
        _kube_api(admin).patch_raycluster(
            namespace, NAME, [{"op": "replace", "path": path, "value": value}], None
        )
    invalid = raycluster(namespace)
    invalid["metadata"]["name"] = "invalid"
    target = invalid
    *parents, last = [int(p) if p.isdigit() else p for p in path.strip("/").split("/")]
    for part in parents:
        target = target[part]
    target[last] = value
    status, body = _error(lambda: _create(admin, namespace, invalid))
    assert (status, body["reason"]) == (422, "Invalid")
    assert [(c["field"], c["reason"]) for c in body["details"]["causes"]] == [(field, cause)]


def test_unknown_fields_are_pruned_on_create_and_on_patch(
    admin: client.ApiClient, namespace: str
) -> None:
    obj = raycluster(namespace)
    obj["spec"]["unknownTop"] = 1
    obj["spec"]["workerGroupSpecs"][0]["unknownGroup"] = {"a": 1}
    obj["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["unknownC"] = "x"
    obj["status"] = {"unknownStatus": True}
    created = _create(admin, namespace, obj)
    assert not {"unknownTop", "unknownGroup", "unknownC", "unknownStatus"} & set(walk_keys(created))
    patched = _kube_api(admin).patch_raycluster(
        namespace, NAME, [{"op": "add", "path": "/spec/unknownLater", "value": "x"}], None
    )
    assert "unknownLater" not in patched["spec"]
    # Nothing left to store: the write is a no-op, the version does not move.
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


# --- the status subresource -------------------------------------------------------------


def test_the_main_resource_ignores_status_and_the_status_subresource_ignores_spec(
    admin: client.ApiClient, namespace: str
) -> None:
    objects = _objects(admin)
    created = _create(admin, namespace)
    generation = created["metadata"]["generation"]

    with_status = dict(created, status={"state": "ready", "readyWorkerReplicas": 4})
    written = objects.replace_namespaced_custom_object(
        *RAY, namespace, "rayclusters", NAME, with_status
    )
    assert "status" not in written
    assert written["metadata"]["generation"] == generation

    status_write = dict(written, status={"state": "ready", "readyWorkerReplicas": 4})
    status_write["spec"] = dict(written["spec"], rayVersion="9.9.9")
    after_status = objects.replace_namespaced_custom_object_status(
        *RAY, namespace, "rayclusters", NAME, status_write
    )
    assert after_status["status"] == {"state": "ready", "readyWorkerReplicas": 4}
    assert after_status["spec"]["rayVersion"] == "2.60.0"
    assert after_status["metadata"]["generation"] == generation
    assert after_status["metadata"]["resourceVersion"] != written["metadata"]["resourceVersion"]

    # A spec write keeps the status; a status write's version guards the next spec write.
    spec_write = _kube_api(admin).patch_raycluster(
        namespace,
        NAME,
        _scale(1),
        after_status["metadata"]["resourceVersion"],
    )
    assert spec_write["status"] == after_status["status"]
    assert spec_write["metadata"]["generation"] == generation + 1
    with pytest.raises(Conflict):
        _kube_api(admin).patch_raycluster(
            namespace,
            NAME,
            _scale(2),
            written["metadata"]["resourceVersion"],
        )


def test_a_status_write_conflicts_with_a_spec_write_since(
    admin: client.ApiClient, namespace: str
) -> None:
    """KubeRay's status writes carry the version it read: a spec write in between (the
    autoscaler's) makes them 409, and the reverse, as the shell's guard expects."""
    objects = _objects(admin)
    read = _create(admin, namespace)
    _kube_api(admin).patch_raycluster(namespace, NAME, _scale(1), None)
    status, body = _error(
        lambda: objects.replace_namespaced_custom_object_status(
            *RAY, namespace, "rayclusters", NAME, dict(read, status={"state": "ready"})
        )
    )
    assert (status, body["reason"]) == (409, "Conflict")


def test_a_patch_testing_the_generation_lands_past_status_writes_and_not_past_a_spec_write(
    admin: client.ApiClient, namespace: str
) -> None:
    """The guard's re-send after a status-write conflict (`adapters/kube/guarded.py`):
    a JSON patch whose first operation tests `/metadata/generation`, sent without a
    resourceVersion. A status write leaves the generation, so it lands; a spec write
    (another copy of the same patch included) moves it, and the server answers 422,
    which the project's client raises as Rejected, changing nothing."""
    objects = _objects(admin)
    read = _create(admin, namespace)
    generation = read["metadata"]["generation"]
    objects.replace_namespaced_custom_object_status(
        *RAY, namespace, "rayclusters", NAME, dict(read, status={"state": "ready"})
    )
    same_spec = {"op": "test", "path": "/metadata/generation", "value": generation}
    landed = _kube_api(admin).patch_raycluster(namespace, NAME, [same_spec, *_scale(1)], None)
    assert landed["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    assert landed["metadata"]["generation"] == generation + 1
    with pytest.raises(Rejected):
        _kube_api(admin).patch_raycluster(namespace, NAME, [same_spec, *_scale(2)], None)
    after = _get(admin, namespace)
    assert after["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    assert after["metadata"]["resourceVersion"] == landed["metadata"]["resourceVersion"]


# --- label selectors --------------------------------------------------------------------


def test_pods_are_listed_by_label_selector(admin: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(admin)
    labels = {
        "a0": {"ray.io/cluster": NAME, "ray.io/group": GROUP, "ray.io/node-type": "worker"},
        "a1": {"ray.io/cluster": NAME, "ray.io/group": GROUP, "ray.io/node-type": "worker"},
        "head": {"ray.io/cluster": NAME, "ray.io/node-type": "head"},
        "other": {"ray.io/cluster": "other", "ray.io/group": GROUP},
    }
    for name, pod_labels in labels.items():
        core.create_namespaced_pod(namespace, pod(namespace, name, pod_labels))

    def listed(selector: str) -> list[str]:
        return names(
            [
                {"metadata": {"name": p.metadata.name}}
                for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            ]
        )

    assert listed(f"ray.io/cluster={NAME},ray.io/group={GROUP}") == ["a0", "a1"]
    assert listed(f"ray.io/cluster=={NAME}") == ["a0", "a1", "head"]
    assert listed(f"ray.io/cluster!={NAME}") == ["other"]
    assert listed("ray.io/node-type in (head,worker)") == ["a0", "a1", "head"]
    assert listed("ray.io/node-type notin (head)") == ["a0", "a1", "other"]
    assert listed("ray.io/group") == ["a0", "a1", "other"]
    assert listed("!ray.io/group") == ["head"]
    assert listed("ray.io/cluster=nobody") == []
    # The project's client: equality selectors, as the shell uses them.
    by_project = _kube_api(admin).list_pods(
        namespace, {"ray.io/cluster": NAME, "ray.io/node-type": "worker"}
    )
    assert names(by_project) == ["a0", "a1"]
    status, body = _error(lambda: core.list_namespaced_pod(namespace, label_selector="a in b"))
    assert (status, body["reason"]) == (400, "BadRequest")


# --- graceful deletion ------------------------------------------------------------------


def _exists(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_an_unbound_pod_goes_at_once_and_a_bound_one_stays_for_its_grace_period(
    admin: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(admin)
    core.create_namespaced_pod(namespace, pod(namespace, "unbound", {"k": "v"}))
    core.create_namespaced_pod(namespace, pod(namespace, "bound", {"k": "v"}, node="node-1"))
    core.create_namespaced_pod(namespace, pod(namespace, "late", {"k": "v"}))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "late"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-2"},
    }
    # The generated method fails to decode the Binding's answer (a Status); the call works.
    core.create_namespaced_pod_binding("late", namespace, binding, _preload_content=False)
    assert core.read_namespaced_pod("late", namespace).spec.node_name == "node-2"

    core.delete_namespaced_pod("unbound", namespace)
    assert _exists(core, namespace, "unbound") is None

    for name in ("bound", "late"):
        core.delete_namespaced_pod(name, namespace)
        kept = _exists(core, namespace, name)
        assert kept is not None, name
        assert kept.metadata.deletion_timestamp is not None
        assert kept.metadata.deletion_grace_period_seconds == 30
        listed = core.list_namespaced_pod(namespace, label_selector="k=v").items
        assert name in {p.metadata.name for p in listed}

    # A shorter grace period shortens it; zero removes the pod at once.
    core.delete_namespaced_pod("late", namespace, grace_period_seconds=5)
    assert core.read_namespaced_pod("late", namespace).metadata.deletion_grace_period_seconds == 5
    core.delete_namespaced_pod("bound", namespace, grace_period_seconds=0)
    assert _exists(core, namespace, "bound") is None


def test_a_pods_own_termination_grace_period_is_its_deletion_grace_period(
    admin: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(admin)
    body = pod(namespace, "p", {}, node="node-1")
    body["spec"]["terminationGracePeriodSeconds"] = 7
    core.create_namespaced_pod(namespace, body)
    core.delete_namespaced_pod("p", namespace)
    assert core.read_namespaced_pod("p", namespace).metadata.deletion_grace_period_seconds == 7
