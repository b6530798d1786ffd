"""The GKE TPU webhook's model (`controlplane/webhook*.py`), against what its Go code does: the
RayCluster check on create only, with the apiserver's status and message; the pod
mutation (indices, TPU_* variables, DNS, affinity), the single-host fallback; and the
chain the simulator and `controlplane/admitted_pod.py` share (KubeRay's pod, then the webhook)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import factories
from tpu_autoscaler.adapters.kube.api import NotFound
from tpu_autoscaler.controlplane import (
    admitted_pod,
    pod_defaults,
    webhook,
    webhook_hosts,
    webhook_patches,
)
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.webhook import WebhookDenied, WebhookFailed
from tpu_autoscaler.controlplane.world import IDEAL
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

CLUSTER = "c"


_slice = factories.slice_of


V6E_4X4 = _slice("v6e", "4x4", 4)
V6E_2X4_ONE_HOST = _slice("v6e", "2x4", 1)
TPU7X_2X2X2 = _slice("tpu7x", "2x2x2", 2)
DENIED = (
    'admission webhook "raycluster-kuberay-tpu-webhook.ray-system.svc" denied the request: '
    "Number of workers in worker group not equal to specified topology"
)


def _cluster(slice: SliceType, **group_fields: Any) -> dict[str, Any]:
    return factories.raycluster(factories.tpu_group("g", slice, **group_fields), name=CLUSTER)


# --- RayCluster validation: create only -------------------------------------------------


def test_a_create_with_hosts_the_topology_does_not_have_is_denied_with_400() -> None:
    store = ObjectStore()
    cluster = _cluster(V6E_4X4)
    cluster["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 3
    with pytest.raises(WebhookDenied) as raised:
        store.create_raycluster(cluster)
    assert str(raised.value) == DENIED
    assert raised.value.status == 400
    with pytest.raises(NotFound):
        store.get_raycluster("default", CLUSTER)


def test_an_update_to_3_hosts_on_a_4x4_is_stored_as_the_webhook_never_sees_it() -> None:
    store = ObjectStore()
    store.create_raycluster(_cluster(V6E_4X4))
    edit = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/numOfHosts", "value": 3}]
    stored = store.edit_raycluster("default", CLUSTER, edit)
    assert stored["spec"]["workerGroupSpecs"][0]["numOfHosts"] == 3
    # Later writes to the broken RayCluster (the autoscaler's) go through as well.
    scale = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]
    assert (
        store.patch_raycluster("default", CLUSTER, scale, None)["spec"]["workerGroupSpecs"][0][
            "replicas"
        ]
        == 1
    )
    assert webhook.denial(stored) == DENIED.split(": ", 1)[1]


@pytest.mark.parametrize("slice", factories.ALL_SLICE_TYPES, ids=str)
def test_the_webhook_agrees_with_the_catalog_on_every_slice_shape(slice: SliceType) -> None:
    assert webhook.denial(_cluster(slice)) is None
    wrong = _cluster(slice)
    wrong["spec"]["workerGroupSpecs"][0]["numOfHosts"] = slice.hosts + 1
    assert webhook.denial(wrong) == webhook.TOPOLOGY_MISMATCH


def test_hosts_come_from_chips_per_pod_not_the_topology_alone() -> None:
    one_vm = _cluster(V6E_2X4_ONE_HOST)  # 2x4 as one 8-chip VM
    assert webhook.denial(one_vm) is None
    one_vm["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    assert webhook.denial(one_vm) == webhook.TOPOLOGY_MISMATCH
    assert webhook_hosts.hosts_from_topology("2x4", 4) == 2
    assert webhook_hosts.hosts_from_topology("2x2", 8) == 1  # at least one host


def test_groups_without_tpus_pass_whatever_their_hosts() -> None:
    cluster = factories.raycluster(factories.cpu_group("cpu", numOfHosts=3), name=CLUSTER)
    assert webhook.denial(cluster) is None


@pytest.mark.parametrize(
    "break_group",
    [
        lambda g: g["template"]["spec"]["nodeSelector"].pop(labels.GKE_TPU_TOPOLOGY_SELECTOR),
        lambda g: g.update(numOfHosts=0),
        lambda g: g["template"]["spec"]["nodeSelector"].update(
            {labels.GKE_TPU_TOPOLOGY_SELECTOR: "4xfour"}
        ),
    ],
    ids=["no topology", "zero hosts", "unparsable topology"],
)
def test_an_error_inside_the_webhook_fails_the_create_closed_with_500(break_group: Any) -> None:
    cluster = _cluster(V6E_4X4)
    break_group(cluster["spec"]["workerGroupSpecs"][0])
    with pytest.raises(WebhookFailed) as raised:
        ObjectStore().create_raycluster(cluster)
    assert raised.value.status == 500
    assert str(raised.value) == (
        'Internal error occurred: failed calling webhook "raycluster-kuberay-tpu-webhook.'
        'ray-system.svc": failed to call webhook: Failed to validate RayCluster'
    )


def test_chips_are_the_request_else_the_limit_rounded_up() -> None:
    def container(requests: str | None, limits: str | None) -> dict[str, Any]:
        resources: dict[str, Any] = {}
        if requests is not None:
            resources["requests"] = {labels.GKE_TPU_RESOURCE: requests}
        if limits is not None:
            resources["limits"] = {labels.GKE_TPU_RESOURCE: limits}
        return {"name": "x", "resources": resources}

    assert webhook_hosts.chips_requested([container("4", "8")]) == 4
    assert webhook_hosts.chips_requested([container(None, "8")]) == 8
    assert webhook_hosts.chips_requested([container("1500m", None)]) == 2
    assert webhook_hosts.chips_requested([container("4", None), container("4", None)]) == 8
    assert not webhook_hosts.requests_tpus([container("0", "0")])


# --- pod mutation ---------------------------------------------------------------------


def _kuberay_pod(
    raycluster: dict[str, Any],
    replica_index: int,
    host_index: int = 0,
    replica_name: str = "g-abcde",
    multi_host_indexing: bool = True,
) -> dict[str, Any]:
    """A worker pod as KubeRay v1.7.0 POSTs it (`buildWorkerPod`, `labelPod`): before the
    webhook, so no name yet and no TPU variables."""
    group = raycluster["spec"]["workerGroupSpecs"][0]
    pod_labels = {
        "ray.io/is-ray-node": "yes",
        labels.KUBERAY_CLUSTER: CLUSTER,
        labels.KUBERAY_NODE_TYPE: "worker",
        labels.KUBERAY_GROUP: group["groupName"],
        "ray.io/identifier": f"{CLUSTER}-worker",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    if multi_host_indexing:
        pod_labels[labels.KUBERAY_REPLICA_INDEX] = str(replica_index)
        if group["numOfHosts"] > 1:
            pod_labels[labels.KUBERAY_REPLICA_NAME] = replica_name
            pod_labels[labels.KUBERAY_HOST_INDEX] = str(host_index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{CLUSTER}-g-worker-",
            "namespace": "default",
            "labels": pod_labels,
        },
        "spec": copy.deepcopy(group["template"]["spec"]),
    }


def _created(pod: dict[str, Any], existing: list[dict[str, Any]], name: str) -> dict[str, Any]:
    mutated = webhook.mutate_pod(pod, existing)
    mutated["metadata"]["name"] = name
    return mutated


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in pod["spec"]["containers"][0].get("env", [])
    }


def test_a_multi_host_pod_takes_kuberays_indices_and_the_slice_dns() -> None:
    raycluster = _cluster(V6E_4X4)
    pod = webhook.mutate_pod(_kuberay_pod(raycluster, 1, host_index=2), [])
    env = _env(pod)
    assert env[labels.ENV_TPU_NAME] == "g-1"
    assert env[labels.ENV_TPU_WORKER_ID] == "2"
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(f"g-1-{h}.c-headless" for h in range(4))
    assert env["TPU_DEVICE_PLUGIN_ADDR"] == "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"
    assert env["TPU_DEVICE_PLUGIN_HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("g-1-2", "c-headless")
    together = pod["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert together[0]["labelSelector"]["matchExpressions"][0] == {
        "key": labels.KUBERAY_REPLICA_NAME,
        "operator": "In",
        "values": ["g-abcde"],
    }
    assert labels.WEBHOOK_REPLICA_INDEX not in pod["metadata"]["labels"]


def test_tpu7x_gets_process_addresses_on_port_8471_beside_the_hostnames() -> None:
    raycluster = _cluster(TPU7X_2X2X2)
    env = _env(webhook.mutate_pod(_kuberay_pod(raycluster, 0, host_index=1), []))
    assert env["TPU_PROCESS_ADDRESSES"] == "g-0-0.c-headless:8471,g-0-1.c-headless:8471"
    assert env["TPU_PROCESS_PORT"] == "8471"
    assert env["TPU_WORKER_HOSTNAMES"] == "g-0-0.c-headless,g-0-1.c-headless"
    assert env[labels.ENV_TPU_WORKER_ID] == "1"


def test_variables_the_pod_sets_are_kept_and_placeholders_replaced() -> None:
    raycluster = _cluster(V6E_4X4)
    pod = _kuberay_pod(raycluster, 0, host_index=3)
    pod["spec"]["containers"][0]["env"] = [
        {"name": labels.ENV_TPU_NAME, "value": "mine"},
        {"name": "TPU_WORKER_HOSTNAMES", "value": "localhost"},
        {"name": labels.ENV_TPU_WORKER_ID, "value": "0"},
    ]
    env = webhook.mutate_pod(pod, [])["spec"]["containers"][0]["env"]
    values = [(e["name"], e.get("value")) for e in env]
    assert (labels.ENV_TPU_NAME, "mine") in values
    assert [v for k, v in values if k == labels.ENV_TPU_NAME] == ["mine"]
    assert ("TPU_WORKER_HOSTNAMES", "localhost") in values  # appended after, so it wins
    assert [v for k, v in values if k == "TPU_WORKER_HOSTNAMES"][-1].startswith("g-0-0.c-")
    # A default 0 on host 3 is a mistake the webhook corrects by appending the right id.
    assert [v for k, v in values if k == labels.ENV_TPU_WORKER_ID] == ["0", "3"]


def test_pods_outside_the_object_selector_or_without_tpus_are_not_touched() -> None:
    raycluster = _cluster(V6E_4X4)
    foreign = _kuberay_pod(raycluster, 0)
    foreign["metadata"]["labels"]["app.kubernetes.io/name"] = "other"
    assert webhook.mutate_pod(foreign, []) == foreign
    cpu = factories.raycluster(factories.cpu_group("g"), name=CLUSTER)
    cpu["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 1
    assert webhook.pod_patches(_kuberay_pod(cpu, 0), []) == []


def test_without_kuberay_indices_the_webhook_numbers_hosts_then_replicas() -> None:
    raycluster = _cluster(V6E_4X4)
    existing: list[dict[str, Any]] = []
    for serial in range(8):
        pod = _kuberay_pod(raycluster, 0, multi_host_indexing=False)
        existing.append(_created(pod, existing, f"p{serial}"))
    seen = [(p["metadata"]["labels"]["replicaIndex"], _env(p)["TPU_WORKER_ID"]) for p in existing]
    assert seen == [(f"g-{r}", str(h)) for r in range(2) for h in range(4)]
    # A terminating pod's place is given out again.
    existing[5]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    again = _created(_kuberay_pod(raycluster, 0, multi_host_indexing=False), existing, "p8")
    assert (again["metadata"]["labels"]["replicaIndex"], _env(again)["TPU_WORKER_ID"]) == (
        "g-1",
        "1",
    )


def test_single_host_pods_fall_back_to_the_webhooks_own_replica_count() -> None:
    raycluster = _cluster(V6E_2X4_ONE_HOST)
    first = _created(_kuberay_pod(raycluster, 0), [], "p0")
    second = _created(_kuberay_pod(raycluster, 1), [first], "p1")
    assert [(_env(p)["TPU_NAME"], _env(p)["TPU_WORKER_ID"]) for p in (first, second)] == [
        ("g-0", "0"),
        ("g-1", "0"),
    ]
    assert second["metadata"]["labels"]["replicaIndex"] == "g-1"
    assert "TPU_WORKER_HOSTNAMES" not in _env(second)  # one host: no DNS variables
    assert "hostname" not in second["spec"]


def test_single_host_fallback_reuses_a_taken_slice_name_after_a_deletion() -> None:
    """KubeRay recreates replica 0 while replica 1 lives; the webhook counts one replica
    and gives the new pod index 1 again: a second `g-1`, as worker 1 (no slice head)."""
    raycluster = _cluster(V6E_2X4_ONE_HOST)
    survivor = _created(_kuberay_pod(raycluster, 1), [], "p1")
    survivor["metadata"]["labels"]["replicaIndex"] = "g-1"
    recreated = _created(_kuberay_pod(raycluster, 0), [survivor], "p2")
    assert (_env(recreated)["TPU_NAME"], _env(recreated)["TPU_WORKER_ID"]) == ("g-1", "1")


def test_the_headless_service_name_is_kuberays_check_name() -> None:
    assert webhook_patches.headless_service_name("c") == "c-headless"
    # Over 50 characters: the last 50, a leading digit or punctuation made an `r`.
    assert webhook_patches.headless_service_name("xx1" + "y" * 40) == "r" + "y" * 40 + "-headless"
    assert webhook_patches.headless_service_name("aa-" + "b" * 40) == "r" + "b" * 40 + "-headless"
    assert webhook_patches.headless_service_name("aab" + "b" * 40) == "b" * 41 + "-headless"


# --- the chain: KubeRay's pod, the webhook at admission, and admitted_pod.py ------------


@pytest.mark.parametrize(
    ("slice", "replica_index", "host_index"),
    [(V6E_4X4, 1, 2), (V6E_2X4_ONE_HOST, 0, 0), (TPU7X_2X2X2, 0, 1)],
    ids=["v6e 4x4", "v6e 2x4", "tpu7x 2x2x2"],
)
def test_objects_worker_pod_is_kuberays_pod_as_the_webhook_admits_it(
    slice: SliceType, replica_index: int, host_index: int
) -> None:
    """No differences left: admitted_pod.py's pod carries the labels of KubeRay's POST
    (written out by hand above from `labelPod`) and exactly the webhook's mutation."""
    raycluster = _cluster(slice)
    shape = derive_shapes(parse_raycluster(raycluster, "test")).shapes[0]
    simulated = admitted_pod.worker_pod(
        CLUSTER,
        "default",
        shape,
        replica_index,
        host_index,
        "2026-01-01T00:00:00Z",
        replica="g-abcde",
        raycluster=raycluster,
    )
    admitted = webhook.mutate_pod(_kuberay_pod(raycluster, replica_index, host_index), [])
    assert simulated["metadata"]["labels"] == admitted["metadata"]["labels"]
    for field in ("hostname", "subdomain", "affinity", "nodeSelector"):
        assert simulated["spec"].get(field) == admitted["spec"].get(field)
    ours, theirs = _env(simulated), _env(admitted)
    assert {k: ours.get(k) for k in theirs} == theirs
    # What the pod has beyond the webhook's variables is KubeRay's, none of it GKE's.
    assert labels.ENV_TPU_ACCELERATOR_TYPE not in ours
    assert labels.ENV_TPU_TOPOLOGY not in ours


@pytest.mark.parametrize(
    "slice", [V6E_4X4, V6E_2X4_ONE_HOST, TPU7X_2X2X2], ids=["v6e 4x4", "v6e 2x4", "tpu7x"]
)
def test_the_simulated_operators_pods_are_objects_worker_pods(slice: SliceType) -> None:
    """The store runs the webhook on every pod KubeRay creates, given the pods stored
    before it; admitted_pod.worker_pod, given the same, makes the same pods, so snapshots
    and the simulator agree."""
    store = ObjectStore()
    raycluster = _cluster(slice, replicas=2)
    stored_cluster = store.create_raycluster(raycluster)
    operator = KubeRayOperator(store, EventQueue(seed=3), "default", CLUSTER, world=IDEAL)
    operator.reconcile()
    pods = sorted(store.list_pods("default"), key=lambda p: int(p["metadata"]["resourceVersion"]))
    assert len(pods) == 2 * slice.hosts
    shape = derive_shapes(parse_raycluster(stored_cluster, "test")).shapes[0]
    for position, pod in enumerate(pods):
        pod_labels = pod["metadata"]["labels"]
        expected = admitted_pod.worker_pod(
            CLUSTER,
            "default",
            shape,
            int(pod_labels[labels.KUBERAY_REPLICA_INDEX]),
            int(pod_labels.get(labels.KUBERAY_HOST_INDEX, "0")),
            pod["metadata"]["creationTimestamp"],
            phase="Pending",
            name=pod["metadata"]["name"],
            replica=pod_labels.get(labels.KUBERAY_REPLICA_NAME),
            raycluster=stored_cluster,
            existing=pods[:position],
        )
        expected["metadata"]["resourceVersion"] = pod["metadata"]["resourceVersion"]
        expected["spec"]["terminationGracePeriodSeconds"] = 0  # the ideal world's grace
        # What the API server adds on create: system fields and the pod defaults.
        for field in ("uid", "managedFields"):
            expected["metadata"][field] = pod["metadata"][field]
        pod_defaults.default_pod(expected)
        assert pod == expected
    names = [_env(p)[labels.ENV_TPU_NAME] for p in pods]
    assert sorted(set(names)) == ["g-0", "g-1"]


def test_mutate_pod_leaves_its_pod_and_mutate_own_pod_patches_it_alike() -> None:
    """`mutate_pod` answers a copy; `mutate_own_pod`, for a pod its caller hands over,
    patches that pod itself into the same pod, and its patch values, stored uncopied,
    are no other pod's."""
    raycluster = _cluster(V6E_4X4)
    posted = _kuberay_pod(raycluster, 1, host_index=2)
    before = copy.deepcopy(posted)
    mutated = webhook.mutate_pod(posted, [])
    assert posted == before and mutated != before
    owned = copy.deepcopy(posted)
    assert webhook.mutate_own_pod(owned, []) is owned
    assert owned == mutated
    again = webhook.mutate_own_pod(copy.deepcopy(posted), [])
    env, other = owned["spec"]["containers"][0]["env"], again["spec"]["containers"][0]["env"]
    assert env == other and not any(a is b for a, b in zip(env, other, strict=True))
    assert owned["spec"]["affinity"] is not again["spec"]["affinity"]


def test_the_env_read_in_one_walk_answers_as_each_variable_looked_up() -> None:
    """`env_vars` stands for `env_var` asked name by name: the first occurrence that
    counts as set wins (an empty value does not count, a `valueFrom` does, with no
    value), whatever follows under that name."""
    from tpu_autoscaler.controlplane.webhook_hosts import env_var, env_vars

    container = {
        "env": [
            {"name": "EMPTY_THEN_SET", "value": ""},
            {"name": "EMPTY_THEN_SET", "value": "later"},
            {"name": "FIRST_WINS", "value": "first"},
            {"name": "FIRST_WINS", "value": "second"},
            {"name": "FROM_THEN_VALUE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
            {"name": "FROM_THEN_VALUE", "value": "shadowed"},
            {"name": "NEVER_SET", "value": ""},
            {"name": "NUMBER", "value": 7},
            {"value": "no name"},
        ]
    }
    names = ["EMPTY_THEN_SET", "FIRST_WINS", "FROM_THEN_VALUE", "NEVER_SET", "NUMBER", "ABSENT"]
    found = env_vars(container)
    assert [found.get(n, ("", False)) for n in names] == [env_var(container, n) for n in names]
    assert found["EMPTY_THEN_SET"] == ("later", True) and "NEVER_SET" not in found
    assert env_vars({}) == {}
