"""The simulated API server applies KubeRay v1.7.0's RayCluster CRD as kube-apiserver
does: schema rejections with its status and message (in the store and over HTTP),
defaults, pruning, the status subresource, list-map uniqueness, the CEL rules; and
what the schema lets through (min > max) reported the way KubeRay reports it."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import factories
from tpu_autoscaler.adapters.kube import patches
from tpu_autoscaler.adapters.kube.api import JSON_PATCH, NotFound, Rejected
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy, kubernetes_api
from tpu_autoscaler.controlplane import crd, crd_decode, crd_rules, kuberay_validation
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.manifest.loading import parse_raycluster

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "clusters").glob("*.yaml"))
NAME = "c"
GROUP0 = "spec.workerGroupSpecs[0]"


def _cluster(**group_fields: Any) -> dict[str, Any]:
    group = factories.tpu_group("g", factories.ALL_SLICE_TYPES[0], **group_fields)
    return factories.raycluster(group, name=NAME)


def _example(path: Path) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return next(d for d in documents if d.get("kind") == "RayCluster")


def _stored(cluster: dict[str, Any] | None = None) -> ObjectStore:
    store = ObjectStore()
    store.create_raycluster(cluster or _cluster())
    return store


def _patch(store: ObjectStore, *operations: dict[str, Any]) -> dict[str, Any]:
    return store.patch_raycluster("default", NAME, list(operations), None)


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def _invalid(*errors: str) -> str:
    joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return f'RayCluster.ray.io "{NAME}" is invalid: {joined}'


# --- rejections: exact messages ---------------------------------------------------------

REJECTED_PATCHES: list[tuple[str, dict[str, Any], str]] = [
    (
        "replicas as a string",
        _replace("/spec/workerGroupSpecs/0/replicas", "two"),
        _invalid(
            f'{GROUP0}.replicas: Invalid value: "string": {GROUP0}.replicas in body must be '
            'of type integer: "string"'
        ),
    ),
    (
        "replicas as a fraction",
        _replace("/spec/workerGroupSpecs/0/replicas", 1.5),
        _invalid(
            f'{GROUP0}.replicas: Invalid value: "float64": {GROUP0}.replicas in body must be '
            'of type int32: "float64"',
            '<nil>: Invalid value: "": Checked value must be of type integer with format int32 '
            f"in {GROUP0}.replicas",
        ),
    ),
    (
        "replicas beyond int32",
        _replace("/spec/workerGroupSpecs/0/replicas", 2**31),
        _invalid(
            '<nil>: Invalid value: "": Checked value must be of type integer with format int32 '
            f"in {GROUP0}.replicas"
        ),
    ),
    (
        "workersToDelete not a list",
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/scaleStrategy",
            "value": {"workersToDelete": "c-g-worker-abcde"},
        },
        _invalid(
            f'{GROUP0}.scaleStrategy.workersToDelete: Invalid value: "string": '
            f'{GROUP0}.scaleStrategy.workersToDelete in body must be of type array: "string"'
        ),
    ),
    (
        "workersToDelete naming a pod by number",
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/scaleStrategy",
            "value": {"workersToDelete": [7]},
        },
        _invalid(
            f'{GROUP0}.scaleStrategy.workersToDelete[0]: Invalid value: "integer": '
            f"{GROUP0}.scaleStrategy.workersToDelete[0] in body must be of type string: "
            '"integer"'
        ),
    ),
    (
        "an unknown upscalingMode",
        {"op": "add", "path": "/spec/autoscalerOptions/upscalingMode", "value": "Fast"},
        _invalid(
            'spec.autoscalerOptions.upscalingMode: Unsupported value: "Fast": supported '
            'values: "Default", "Aggressive", "Conservative"'
        ),
    ),
    (
        "an unknown autoscaler version",
        {"op": "add", "path": "/spec/autoscalerOptions/version", "value": "v3"},
        _invalid(
            'spec.autoscalerOptions.version: Unsupported value: "v3": supported values: "v1", "v2"'
        ),
    ),
    (
        "a group without a name",
        {"op": "remove", "path": "/spec/workerGroupSpecs/0/groupName"},
        _invalid(f"{GROUP0}.groupName: Required value"),
    ),
    (
        "idleTimeoutSeconds as a string",
        _replace("/spec/autoscalerOptions", {"idleTimeoutSeconds": "60s"}),
        _invalid(
            'spec.autoscalerOptions.idleTimeoutSeconds: Invalid value: "string": '
            "spec.autoscalerOptions.idleTimeoutSeconds in body must be of type integer: "
            '"string"'
        ),
    ),
    (
        "a TPU quantity that is no quantity",
        _replace(
            "/spec/workerGroupSpecs/0/template/spec/containers/0/resources/limits/google.com~1tpu",
            "4 chips",
        ),
        _invalid(
            f"{GROUP0}.template.spec.containers[0].resources.limits.google.com/tpu: Invalid "
            f'value: "4 chips": {GROUP0}.template.spec.containers[0].resources.limits.'
            "google.com/tpu in body should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))"
            "(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$'"
        ),
    ),
    (
        "two containers of one name",
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/template/spec/containers/-",
            "value": {"name": "ray-worker", "image": "busybox"},
        },
        _invalid(f'{GROUP0}.template.spec.containers[1]: Duplicate value: {{"name":"ray-worker"}}'),
    ),
    (
        "a managedBy no controller answers to",
        {"op": "add", "path": "/spec/managedBy", "value": "me"},
        _invalid(
            'spec.managedBy: Invalid value: "me": the managedBy field value must be either '
            "'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"
        ),
    ),
    (
        "no head group",
        {"op": "remove", "path": "/spec/headGroupSpec"},
        _invalid("spec.headGroupSpec: Required value"),
    ),
]


@pytest.mark.parametrize(
    ("operation", "message"),
    [(op, message) for _, op, message in REJECTED_PATCHES],
    ids=[name for name, _, _ in REJECTED_PATCHES],
)
def test_a_patch_the_schema_forbids_is_rejected_with_the_apiservers_message(
    operation: dict[str, Any], message: str
) -> None:
    store = _stored()
    before = store.get_raycluster("default", NAME)
    with pytest.raises(Rejected) as raised:
        _patch(store, operation)
    assert str(raised.value) == message
    assert raised.value.status == 422
    assert store.get_raycluster("default", NAME) == before


def test_a_create_the_schema_forbids_is_rejected() -> None:
    cluster = _cluster()
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    store = ObjectStore()
    with pytest.raises(Rejected, match=r'replicas in body must be of type integer: "string"'):
        store.create_raycluster(cluster)
    with pytest.raises(NotFound):
        store.get_raycluster("default", NAME)


def test_several_errors_are_listed_in_brackets() -> None:
    store = _stored()
    with pytest.raises(Rejected) as raised:
        _patch(
            store,
            _replace("/spec/workerGroupSpecs/0/replicas", "two"),
            {"op": "add", "path": "/spec/autoscalerOptions/upscalingMode", "value": "Fast"},
        )
    assert str(raised.value) == _invalid(
        'spec.autoscalerOptions.upscalingMode: Unsupported value: "Fast": supported values: '
        '"Default", "Aggressive", "Conservative"',
        f'{GROUP0}.replicas: Invalid value: "string": {GROUP0}.replicas in body must be of '
        'type integer: "string"',
    )


def test_an_int_or_string_quantity_of_another_type_fails_both_alternatives() -> None:
    store = _stored()
    path = f"{GROUP0}.template.spec.containers[0].resources.limits.google.com/tpu"
    with pytest.raises(Rejected) as raised:
        _patch(
            store,
            _replace(
                "/spec/workerGroupSpecs/0/template/spec/containers/0/resources/limits/"
                "google.com~1tpu",
                True,
            ),
        )
    assert str(raised.value) == _invalid(
        f'{path}: Invalid value: "boolean": {path} in body must be of type integer,string: '
        '"boolean"',
        f'<nil>: Invalid value: "": "{path}" must validate at least one schema (anyOf)',
        f'{path}: Invalid value: "boolean": {path} in body must be of type integer: "boolean"',
    )


def test_whole_numbers_written_as_floats_and_quantities_as_numbers_are_accepted() -> None:
    store = _stored()
    stored = _patch(
        store,
        _replace("/spec/workerGroupSpecs/0/replicas", 2.0),
        _replace(
            "/spec/workerGroupSpecs/0/template/spec/containers/0/resources/limits/google.com~1tpu",
            4,
        ),
    )
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 2


# --- over HTTP ------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(_stored()) as running:
        yield running


def test_a_rejection_over_http_is_422_invalid_with_the_message(server: ApiServer) -> None:
    _, operation, message = REJECTED_PATCHES[0]
    request = urllib.request.Request(
        f"{server.url}/apis/ray.io/v1/namespaces/default/rayclusters/{NAME}",
        data=json.dumps([operation]).encode(),
        headers={"Content-Type": JSON_PATCH},
        method="PATCH",
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert raised.value.code == 422
    body = json.loads(raised.value.read())
    assert (body["kind"], body["status"], body["reason"], body["code"]) == (
        "Status",
        "Failure",
        "Invalid",
        422,
    )
    assert body["message"] == message


def test_the_production_client_raises_rejected_with_the_servers_words(server: ApiServer) -> None:
    api = KubernetesApi(
        kubernetes_api(server.url),
        RetryPolicy(attempts=2, base_s=0.0, cap_s=0.0),
        5.0,
        sleep=lambda _s: None,
        random=Random(0),
    )
    _, operation, message = REJECTED_PATCHES[3]
    version = server.store.get_raycluster("default", NAME)["metadata"]["resourceVersion"]
    with pytest.raises(Rejected) as raised:
        api.patch_raycluster("default", NAME, [operation], version)
    assert raised.value.status == 422
    assert message in str(raised.value)


# --- what is stored: defaults, pruning, status -------------------------------------------


def test_defaults_are_applied_as_the_schema_declares_them() -> None:
    cluster = _cluster()
    group = cluster["spec"]["workerGroupSpecs"][0]
    for field in ("replicas", "minReplicas", "maxReplicas", "numOfHosts"):
        del group[field]
    group["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8471}]
    group["idleTimeoutSeconds"] = None  # not nullable, no default: dropped
    stored = ObjectStore().create_raycluster(cluster)
    stored_group = stored["spec"]["workerGroupSpecs"][0]
    assert {k: stored_group[k] for k in ("replicas", "minReplicas", "maxReplicas")} == {
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": 2**31 - 1,
    }
    assert stored_group["numOfHosts"] == 1
    assert stored_group["priority"] == 0
    assert "idleTimeoutSeconds" not in stored_group
    assert stored_group["template"]["spec"]["containers"][0]["ports"] == [
        {"containerPort": 8471, "protocol": "TCP"}
    ]


def test_a_null_with_a_default_is_defaulted() -> None:
    store = _stored(_cluster(replicas=2))
    stored = _patch(store, _replace("/spec/workerGroupSpecs/0/replicas", None))
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 0


def test_unknown_fields_are_pruned_not_rejected() -> None:
    cluster = _cluster()
    cluster["metadata"]["colour"] = "blue"
    cluster["spec"]["autoscalerOptions"]["upscalingSpeed"] = 2
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["slicesPerReplica"] = 1
    group["template"]["metadata"] = {"labels": {"team": "tpu"}, "creationTimestamp": None}
    group["template"]["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] = "4"
    assert crd_decode.decode(cluster).unknown_fields == (
        "metadata.colour",
        "spec.autoscalerOptions.upscalingSpeed",
        f"{GROUP0}.slicesPerReplica",
        f"{GROUP0}.template.metadata.creationTimestamp",
    )
    stored = ObjectStore().create_raycluster(cluster)
    stored_group = stored["spec"]["workerGroupSpecs"][0]
    assert "colour" not in stored["metadata"]
    assert "upscalingSpeed" not in stored["spec"]["autoscalerOptions"]
    assert "slicesPerReplica" not in stored_group
    assert stored_group["template"]["metadata"] == {"labels": {"team": "tpu"}}
    limits = stored_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["google.com/tpu"] == "4"  # additionalProperties: kept


def test_a_patch_adding_an_unknown_field_is_stored_without_it() -> None:
    store = _stored()
    version = store.get_raycluster("default", NAME)["metadata"]["resourceVersion"]
    stored = _patch(store, {"op": "add", "path": "/spec/workerGroupSpecs/0/weight", "value": 3})
    assert "weight" not in stored["spec"]["workerGroupSpecs"][0]
    # Nothing is left to store once pruned: kube-apiserver keeps the version.
    assert stored["metadata"]["resourceVersion"] == version


def test_a_write_decoded_in_place_leaves_the_stored_versions_and_the_callers_objects() -> None:
    """The store decodes its own copy of a write in place: the version stored before,
    which readers hold, and what the caller passed stay as they were, though the
    write was pruned and defaulted."""
    cluster = _cluster()
    cluster["spec"]["workerGroupSpecs"][0]["slicesPerReplica"] = 1
    caller_cluster = copy.deepcopy(cluster)
    store = _stored(cluster)
    assert cluster == caller_cluster
    before = store.raycluster("default", NAME)
    as_read = copy.deepcopy(before)
    operations = [
        {"op": "add", "path": "/spec/workerGroupSpecs/0/weight", "value": {"of": 3}},
        _replace("/spec/workerGroupSpecs/0/replicas", None),
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/template/spec/nodeSelector/x",
            "value": "y",
        },
    ]
    as_sent = copy.deepcopy(operations)
    stored = store.patch_raycluster("default", NAME, operations, None)
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 0
    assert "weight" not in stored["spec"]["workerGroupSpecs"][0]
    assert before == as_read and operations == as_sent
    assert store.raycluster("default", NAME) is not before


def test_a_write_that_changes_nothing_keeps_the_version_and_tells_no_watcher() -> None:
    store = _stored()
    heard: list[str] = []
    store.watchers.append(lambda kind, obj: heard.append(kind))
    current = store.get_raycluster("default", NAME)
    version = current["metadata"]["resourceVersion"]
    replicas = current["spec"]["workerGroupSpecs"][0]["replicas"]
    same = [_replace("/spec/workerGroupSpecs/0/replicas", replicas)]
    assert store.patch_raycluster("default", NAME, same, version) == current
    assert store.patch_raycluster("default", NAME, same, None) == current
    status = store.update_raycluster_status("default", NAME, {"state": "ready"}, version)
    assert heard == ["RayCluster/status"]
    again = store.update_raycluster_status(
        "default", NAME, {"state": "ready"}, status["metadata"]["resourceVersion"]
    )
    assert again == status
    assert heard == ["RayCluster/status"]


def test_the_status_subresource_keeps_status_out_of_creates_and_patches() -> None:
    cluster = _cluster()
    cluster["status"] = {"state": "ready"}
    store = ObjectStore()
    assert "status" not in store.create_raycluster(cluster)
    current = store.get_raycluster("default", NAME)
    store.update_raycluster_status(
        "default", NAME, {"state": "suspended"}, current["metadata"]["resourceVersion"]
    )
    stored = _patch(
        store,
        {"op": "add", "path": "/status", "value": {"state": "ready"}},
        _replace("/spec/workerGroupSpecs/0/replicas", 1),
    )
    assert stored["status"] == {"state": "suspended"}
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 1


# --- CEL rules ---------------------------------------------------------------------------


def test_every_cel_rule_of_the_crd_is_modelled() -> None:
    assert [(path, rule) for path, rule, _ in crd_rules.cel_rules()] == [
        ("spec.gcsFaultToleranceOptions.backend", "self == oldSelf"),
        ("spec.managedBy", "self == oldSelf"),
        ("spec.managedBy", "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']"),
    ]
    assert crd_rules.unmodelled_rules() == []


def test_managed_by_is_settable_on_create_and_immutable_after() -> None:
    cluster = _cluster()
    cluster["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    store = _stored(cluster)
    with pytest.raises(Rejected) as raised:
        _patch(store, _replace("/spec/managedBy", "ray.io/kuberay-operator"))
    assert str(raised.value) == _invalid(
        'spec.managedBy: Invalid value: "ray.io/kuberay-operator": the managedBy field is immutable'
    )


def test_the_gcs_backend_is_immutable_once_set() -> None:
    store = _stored()
    _patch(store, {"op": "add", "path": "/spec/gcsFaultToleranceOptions", "value": {}})
    backend = "/spec/gcsFaultToleranceOptions/backend"
    _patch(store, {"op": "add", "path": backend, "value": "redis"})  # absent before: allowed
    with pytest.raises(Rejected, match=r"gcsFaultToleranceOptions\.backend is immutable"):
        _patch(store, _replace(backend, "rocksdb"))


# --- what must be accepted -------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_cluster_is_accepted_unchanged_but_for_defaults(path: Path) -> None:
    cluster = _example(path)
    assert crd_decode.decode(cluster).unknown_fields == ()
    stored = ObjectStore().create_raycluster(cluster)
    assert _without_defaults(stored["spec"], cluster["spec"]) == cluster["spec"]


def _without_defaults(stored: Any, original: Any) -> Any:
    """`stored` restricted to the keys `original` has."""
    if isinstance(stored, dict) and isinstance(original, dict):
        return {k: _without_defaults(stored[k], original[k]) for k in original if k in stored}
    if isinstance(stored, list) and isinstance(original, list):
        return [_without_defaults(s, o) for s, o in zip(stored, original, strict=True)]
    return stored


@settings(max_examples=30, deadline=None)
@given(factories.valid_clusters())
def test_every_valid_factory_cluster_is_accepted(cluster: dict[str, Any]) -> None:
    assert crd_decode.decode(cluster).unknown_fields == ()
    crd.admit(cluster)


@settings(max_examples=40, deadline=None)
@given(
    replicas=st.integers(0, 2**31 - 1),
    doomed=st.lists(st.from_regex(r"c-g-worker-[a-z0-9]{5}", fullmatch=True), max_size=8),
)
def test_every_scale_patch_the_autoscaler_writes_is_accepted(
    replicas: int, doomed: list[str]
) -> None:
    store = _stored(_cluster(replicas=1))
    current = store.get_raycluster("default", NAME)
    raycluster = parse_raycluster(current, "test")
    operations = patches.group_operations(raycluster, "g", replicas, doomed)
    version = current["metadata"]["resourceVersion"]
    stored = store.patch_raycluster("default", NAME, operations, version)
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == replicas


# --- KubeRay's own validation: reported, not rejected ---------------------------------------


def _verdict_after(mutate: Callable[[dict[str, Any]], None]) -> Any:
    store = _stored()
    cluster = copy.deepcopy(store.get_raycluster("default", NAME))
    mutate(cluster)
    # The API server takes it: KubeRay finds the problem when it reconciles.
    operations = [_replace("/spec", cluster["spec"])]
    stored = _patch(store, *operations)
    return kuberay_validation.reconcile_verdict(stored)


def test_min_above_max_is_stored_and_reported_as_kuberay_reports_it() -> None:
    def min_above_max(cluster: dict[str, Any]) -> None:
        cluster["spec"]["workerGroupSpecs"][0].update(minReplicas=3, maxReplicas=1)

    verdict = _verdict_after(min_above_max)
    assert verdict == kuberay_validation.InvalidRayCluster(
        reason="InvalidRayClusterSpec",
        error="worker group g has minReplicas 3 greater than maxReplicas 1",
        message="The RayCluster spec is invalid default/c: worker group g has minReplicas 3 "
        "greater than maxReplicas 1",
    )
    assert (verdict.type, verdict.action) == ("Warning", "Validate")


def test_min_equal_to_max_is_fine_for_kuberay() -> None:
    def min_at_max(cluster: dict[str, Any]) -> None:
        cluster["spec"]["workerGroupSpecs"][0].update(minReplicas=2, maxReplicas=2)

    assert _verdict_after(min_at_max) is None


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("minReplicas", -1, "worker group g has negative minReplicas -1"),
        ("maxReplicas", -1, "worker group g has negative maxReplicas -1"),
        (
            "idleTimeoutSeconds",
            -5,
            "worker group g: idleTimeoutSeconds must be non-negative, got -5",
        ),
        (
            "idleTimeoutSeconds",
            30,
            "worker group g: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. "
            "Please set .spec.autoscalerOptions.version to 'v2' (or set "
            "RAY_enable_autoscaler_v2 environment variable to 'true' in the head pod if "
            "using KubeRay < 1.4.0)",
        ),
        (
            "priority",
            1,
            "worker group g: priority is set, but RayVersion was not specified. Ray version "
            "2.56.0 or later is required",
        ),
    ],
)
def test_kuberay_group_rules(field: str, value: int, error: str) -> None:
    def set_field(cluster: dict[str, Any]) -> None:
        cluster["spec"]["autoscalerOptions"].pop("version", None)  # autoscaler v1
        cluster["spec"].pop("rayVersion", None)  # the priority case: no rayVersion given
        cluster["spec"]["workerGroupSpecs"][0][field] = value

    verdict = _verdict_after(set_field)
    assert verdict is not None and verdict.error == error


def test_a_group_idle_timeout_is_fine_with_autoscaler_v2() -> None:
    def v2_with_timeout(cluster: dict[str, Any]) -> None:
        cluster["spec"]["autoscalerOptions"]["version"] = "v2"
        cluster["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 30

    assert _verdict_after(v2_with_timeout) is None


def test_a_priority_needs_ray_2_56_and_autoscaler_v2() -> None:
    def old_ray(cluster: dict[str, Any]) -> None:
        cluster["spec"].update(rayVersion="2.55.1")
        cluster["spec"]["workerGroupSpecs"][0]["priority"] = 2

    def v1(cluster: dict[str, Any]) -> None:
        cluster["spec"]["autoscalerOptions"].pop("version", None)
        cluster["spec"].update(rayVersion="2.60.0")
        cluster["spec"]["workerGroupSpecs"][0]["priority"] = 2

    def v2(cluster: dict[str, Any]) -> None:
        v1(cluster)
        cluster["spec"]["autoscalerOptions"]["version"] = "v2"

    old = _verdict_after(old_ray)
    assert old is not None
    assert old.error.endswith("minimum Ray version is 2.56.0, got 2.55.1")
    without_v2 = _verdict_after(v1)
    assert without_v2 is not None
    assert without_v2.error.endswith("Priority is only supported with autoscaler v2 enabled")
    assert _verdict_after(v2) is None


def test_a_name_kuberay_cannot_use_is_reported_as_metadata() -> None:
    cluster = factories.raycluster(name="a" * 54)
    verdict = kuberay_validation.reconcile_verdict(crd.admit(cluster))
    assert verdict is not None
    assert (verdict.reason, verdict.error) == (
        "InvalidRayClusterMetadata",
        "RayCluster name should be no more than 53 characters",
    )
    digits = kuberay_validation.metadata_error(factories.raycluster(name="1abc"))
    assert digits is not None and digits.startswith(
        "RayCluster name should be a valid DNS1035 label: [a DNS-1035 label must consist"
    )


def test_kuberays_optional_webhook_rejects_duplicate_group_names() -> None:
    group = factories.tpu_group("g", factories.ALL_SLICE_TYPES[0])
    cluster = factories.raycluster(group, copy.deepcopy(group), name=NAME)
    crd.admit(cluster)  # the schema lets it through
    error = kuberay_validation.webhook_error(cluster)
    assert error is not None
    assert error.startswith('RayCluster.ray.io "c" is invalid: spec.workerGroupSpecs[1]: ')
    assert error.endswith(": worker group names must be unique")
    assert kuberay_validation.webhook_error(_cluster()) is None
