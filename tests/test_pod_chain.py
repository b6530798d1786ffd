"""A worker pod from KubeRay's build to the process Ray starts in: KubeRay v1.7.0's
`buildWorkerPod` (`controlplane/kuberay_pod.py`), the store's admission (the TPU webhook), and
what the container sees on its GKE TPU node (`controlplane/gke.py`: the device plugin's
variables beneath the pod's own, resolved as the kubelet resolves them)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import factories
from tpu_autoscaler.controlplane import admitted_pod, gke, kuberay_pod
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.local.processes import pod_environment
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

CLUSTER = "c"


_slice = factories.slice_of


V6E_4X4 = _slice("v6e", "4x4", 4)
V6E_2X4_ONE_HOST = _slice("v6e", "2x4", 1)


def _raycluster(slice: SliceType = V6E_4X4, **group_fields: Any) -> dict[str, Any]:
    return factories.raycluster(factories.tpu_group("g", slice, **group_fields), name=CLUSTER)


def _built(raycluster: dict[str, Any], host_index: int = 1) -> dict[str, Any]:
    group = raycluster["spec"]["workerGroupSpecs"][0]
    return kuberay_pod.build_worker_pod(raycluster, group, "g-abcde", 2, host_index)


def _env_entries(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def _running(raycluster: dict[str, Any], replica_index: int = 0, host: int = 0) -> dict[str, Any]:
    shape = derive_shapes(parse_raycluster(raycluster, "test")).shapes[0]
    return admitted_pod.worker_pod(
        CLUSTER, "default", shape, replica_index, host, "2026-01-01T00:00:00Z",
        raycluster=raycluster,
    )  # fmt: skip


# --- KubeRay's pod ----------------------------------------------------------------------


def test_the_operators_builder_copies_what_build_worker_pod_builds() -> None:
    """The builder the simulated operator uses builds a group's pod once per spec and
    copies it: each pod equals the one built anew, members in the same order, its
    own (writing one changes no other), and a new spec or gate is built anew."""
    builder = kuberay_pod.WorkerPodBuilder()
    base = _raycluster()
    one_host = _raycluster(V6E_2X4_ONE_HOST)
    edited = copy.deepcopy(_raycluster())
    edited["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = "x:1"
    head = {**edited["spec"]["headGroupSpec"], "rayStartParams": {"port": "6380"}}
    port = {**edited, "spec": {**edited["spec"], "headGroupSpec": head}}
    pods = []
    for raycluster, replica, index, host, gate in [
        (base, "g-abcde", 2, 1, True),
        (base, "g-fghjk", 3, 0, True),
        (one_host, None, 1, 0, True),
        (one_host, None, 1, 0, False),
        (edited, "g-abcde", 2, 3, True),
        # The same group in a new spec (a write shares what it left): the head's port.
        (port, "g-abcde", 2, 3, True),
    ]:
        group = raycluster["spec"]["workerGroupSpecs"][0]
        pod = builder.build(raycluster, group, replica, index, host, gate)
        anew = kuberay_pod.build_worker_pod(raycluster, group, replica, index, host, gate)
        assert pod == anew and repr(pod) == repr(anew)
        pods.append(pod)
    pods[0]["spec"]["containers"][0]["env"].append({"name": "X"})
    assert pods[1]["spec"] == _built(base)["spec"]
    assert pods[-2]["spec"]["containers"][0]["image"] == "x:1"
    assert _env_entries(pods[-1])["RAY_PORT"]["value"] == "6380"
    assert _env_entries(pods[-2])["RAY_PORT"]["value"] == "6379"


def test_kuberay_names_the_pod_by_the_api_server_and_its_instance_by_field_refs() -> None:
    pod = _built(_raycluster())
    assert "name" not in pod["metadata"]
    assert pod["metadata"]["generateName"] == "c-g-worker-"
    env = _env_entries(pod)
    # Not literal values: the kubelet resolves them once the API server named the pod.
    assert env[labels.ENV_CLOUD_INSTANCE_ID]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert env[labels.ENV_NODE_TYPE_NAME]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}
    }
    assert env["RAY_ADDRESS"]["value"] == "c-head-svc.default.svc.cluster.local:6379"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("RayCluster", CLUSTER, True)


def test_kuberay_labels_the_pod_and_the_template_cannot_move_it_to_another_group() -> None:
    raycluster = _raycluster()
    group = raycluster["spec"]["workerGroupSpecs"][0]
    group["template"]["metadata"] = {
        "labels": {labels.KUBERAY_GROUP: "elsewhere", "team": "template", "tier": "t"}
    }
    group["labels"] = {"team": "group"}
    pod_labels = _built(raycluster, host_index=3)["metadata"]["labels"]
    assert pod_labels == {
        "ray.io/is-ray-node": "yes",
        labels.KUBERAY_CLUSTER: CLUSTER,
        labels.KUBERAY_NODE_TYPE: "worker",
        labels.KUBERAY_GROUP: "g",
        "ray.io/identifier": "c-worker",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "team": "group",  # the group's `labels` win over the template's
        "tier": "t",
        labels.KUBERAY_REPLICA_INDEX: "2",
        labels.KUBERAY_REPLICA_NAME: "g-abcde",
        labels.KUBERAY_HOST_INDEX: "3",
    }


def test_single_host_groups_get_only_the_replica_index_and_the_gate_off_none() -> None:
    one_host = _raycluster(V6E_2X4_ONE_HOST)
    group = one_host["spec"]["workerGroupSpecs"][0]
    single = kuberay_pod.build_worker_pod(one_host, group, None, 1, 0)["metadata"]["labels"]
    assert single[labels.KUBERAY_REPLICA_INDEX] == "1"
    assert labels.KUBERAY_HOST_INDEX not in single and labels.KUBERAY_REPLICA_NAME not in single
    gate_off = kuberay_pod.build_worker_pod(
        _raycluster(), _raycluster()["spec"]["workerGroupSpecs"][0], "g-x", 1, 2, False
    )["metadata"]["labels"]
    assert not {
        labels.KUBERAY_REPLICA_INDEX,
        labels.KUBERAY_REPLICA_NAME,
        labels.KUBERAY_HOST_INDEX,
    } & set(gate_off)


def test_restart_policy_never_only_under_autoscaler_v2() -> None:
    raycluster = _raycluster()
    raycluster["spec"]["enableInTreeAutoscaling"] = False
    raycluster["spec"]["autoscalerOptions"] = {"version": "v2"}
    assert "restartPolicy" not in _built(raycluster)["spec"]
    raycluster["spec"]["enableInTreeAutoscaling"] = True
    raycluster["spec"]["autoscalerOptions"] = {"version": "v1"}
    assert "restartPolicy" not in _built(raycluster)["spec"]
    raycluster["spec"]["autoscalerOptions"] = {"version": "v2"}
    assert _built(raycluster)["spec"]["restartPolicy"] == "Never"


def test_the_container_and_grace_come_from_the_template_and_its_env_comes_first() -> None:
    raycluster = _raycluster()
    template = raycluster["spec"]["workerGroupSpecs"][0]["template"]
    template["spec"]["terminationGracePeriodSeconds"] = 120
    template["spec"]["containers"][0]["env"] = [
        {"name": "MINE", "value": "1"},
        {"name": "RAY_ADDRESS", "value": "mine:1"},
    ]
    pod = _built(raycluster)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    ray = pod["spec"]["containers"][0]
    assert ray["resources"] == template["spec"]["containers"][0]["resources"]
    names = [e["name"] for e in ray["env"]]
    assert names[:2] == ["MINE", "RAY_ADDRESS"]
    assert names.count("RAY_ADDRESS") == 1  # KubeRay adds it only where it is missing
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["wait-gcs-ready"]
    # The template itself is left as it was.
    assert len(template["spec"]["containers"][0]["env"]) == 2


# --- admission ----------------------------------------------------------------------------


def test_the_store_runs_the_webhook_on_create_with_the_pods_it_holds() -> None:
    store = ObjectStore()
    raycluster = _raycluster(V6E_2X4_ONE_HOST)
    group = raycluster["spec"]["workerGroupSpecs"][0]
    for serial, replica_index in enumerate((0, 1)):
        pod = kuberay_pod.build_worker_pod(raycluster, group, None, replica_index, 0)
        pod["metadata"]["name"] = f"p{serial}"
        store.create_pod(pod)
    stored = [store.pod("default", f"p{i}") for i in range(2)]
    # Single-host: the webhook numbers replicas by counting what is stored.
    assert [gke.spec_environment(p)[labels.ENV_TPU_NAME] for p in stored if p] == ["g-0", "g-1"]


# --- on the node --------------------------------------------------------------------------


@pytest.mark.parametrize("slice", factories.ALL_SLICE_TYPES, ids=str)
def test_the_device_plugin_gives_every_slice_the_type_and_topology_ray_reads(
    slice: SliceType,
) -> None:
    """`gke_accelerator_type` is pinned to what Ray 2.60 parses in test_catalog_ray."""
    pod = _running(_raycluster(slice))
    assert labels.ENV_TPU_ACCELERATOR_TYPE not in gke.spec_environment(pod)
    env = gke.container_environment(pod)
    assert env[labels.ENV_TPU_ACCELERATOR_TYPE] == slice.gke_accelerator_type
    assert env[labels.ENV_TPU_TOPOLOGY] == slice.topology
    single_host = slice.hosts == 1 and slice.generation.name != "tpu7x"
    assert (env.get("TPU_WORKER_HOSTNAMES") == "localhost") == single_host


def test_the_pods_own_variables_win_over_the_device_plugins() -> None:
    """The recreated single-host pod the webhook calls worker 1 (its index bug) runs as
    worker 1, though the plugin says 0 for every single-host VM."""
    raycluster = _raycluster(V6E_2X4_ONE_HOST)
    shape = derive_shapes(parse_raycluster(raycluster, "test")).shapes[0]
    survivor = admitted_pod.worker_pod(
        CLUSTER, "default", shape, 1, 0, "t", name="p1", raycluster=raycluster
    )
    survivor["metadata"]["labels"]["replicaIndex"] = "g-1"
    recreated = admitted_pod.worker_pod(
        CLUSTER, "default", shape, 0, 0, "t", name="p2", raycluster=raycluster,
        existing=[survivor],
    )  # fmt: skip
    plugin = gke.device_plugin_environment("tpu-v6e-slice", "2x4", 8, 8)
    assert plugin[labels.ENV_TPU_WORKER_ID] == "0"
    env = gke.container_environment(recreated)
    assert (env[labels.ENV_TPU_NAME], env[labels.ENV_TPU_WORKER_ID]) == ("g-1", "1")


def test_the_kubelet_resolves_field_refs_and_references_to_earlier_variables() -> None:
    pod = _running(_raycluster())
    pod = copy.deepcopy(pod)
    pod["status"]["hostIP"] = "10.1.2.3"
    pod["spec"]["containers"][0]["env"] += [
        {"name": "LATER", "value": "$(TPU_NAME)/$(NOT_SET)/$$(TPU_NAME)"},
    ]
    env = gke.container_environment(pod)
    assert env[labels.ENV_CLOUD_INSTANCE_ID] == pod["metadata"]["name"]
    assert env[labels.ENV_NODE_TYPE_NAME] == "g"
    assert env["RAY_CLUSTER_NAMESPACE"] == "default"
    assert env["TPU_DEVICE_PLUGIN_ADDR"] == "10.1.2.3:2112"
    assert env["LATER"] == "g-0/$(NOT_SET)/$(TPU_NAME)"


def test_device_plugin_bounds_for_a_multi_host_slice() -> None:
    env = gke.device_plugin_environment("tpu-v5p-slice", "4x4x4", 4, 4)
    assert env[labels.ENV_TPU_ACCELERATOR_TYPE] == "v5p-128"
    assert (env["TPU_HOST_BOUNDS"], env["TPU_CHIPS_PER_HOST_BOUNDS"]) == ("2,2,4", "2,2,1")
    assert env["TPU_TOPOLOGY_WRAP"] == "true,true,true"
    assert labels.ENV_TPU_WORKER_ID not in env
    assert (
        gke.device_plugin_environment("tpu-v6e-slice", "16x16", 4, 4)["TPU_TOPOLOGY_WRAP"]
        == "true,true,false"
    )
    with pytest.raises(gke.DevicePluginError):
        gke.device_plugin_environment("tpu-v5-lite-device", "2x2", 4, 4)


def test_each_host_gets_the_device_plugins_variables_of_its_own() -> None:
    """The variables are made once per kind of node; each answer is the caller's own
    to change, and a kind the plugin refuses is refused on every ask."""
    first = gke.device_plugin_environment("tpu-v5p-slice", "4x4x4", 4, 4)
    first[labels.ENV_TPU_TOPOLOGY] = "changed by the caller"
    del first["TPU_HOST_BOUNDS"]
    again = gke.device_plugin_environment("tpu-v5p-slice", "4x4x4", 4, 4)
    assert (again[labels.ENV_TPU_TOPOLOGY], again["TPU_HOST_BOUNDS"]) == ("4x4x4", "2,2,4")
    for _ in range(2):
        with pytest.raises(gke.DevicePluginError):
            gke.device_plugin_environment("tpu-v6e-slice", "2x4", 3, 3)


def test_local_mode_starts_ray_with_the_containers_environment_but_the_local_gcs() -> None:
    pod = _running(_raycluster())
    env = pod_environment(pod)
    assert env[labels.ENV_TPU_ACCELERATOR_TYPE] == "v6e-16"
    assert env[labels.ENV_CLOUD_INSTANCE_ID] == pod["metadata"]["name"]
    # KubeRay's RAY_ADDRESS names the Kubernetes head service and would override
    # `ray start --address`.
    assert "RAY_ADDRESS" not in env
    assert gke.container_environment(pod)["RAY_ADDRESS"].startswith("c-head-svc.")
