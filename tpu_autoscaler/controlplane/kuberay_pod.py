"""A worker pod as KubeRay v1.7.0 POSTs it, before any admission webhook sees it:
`buildWorkerPod` in `raycluster_controller.go`, with `DefaultWorkerPodTemplate`,
`BuildPod`, `labelPod` and `setContainerEnvVars` from `common/pod.go` and the name
helpers of `utils/util.go`.

What is modelled: the metadata (generateName, namespace, labels, annotations, owner),
the pod spec copied from the group's template (its containers, node selector and
`terminationGracePeriodSeconds` as written), the `wait-gcs-ready` init container,
`restartPolicy: Never` under autoscaler v2, the metrics port, and the Ray container's
environment as KubeRay appends it (`RAY_CLOUD_INSTANCE_ID` and `RAY_NODE_TYPE_NAME`
as `fieldRef`s the kubelet resolves, not literal values). Left out, because nothing
here reads them: the generated `ray start` command (and `KUBERAY_GEN_RAY_START_CMD`),
probes, the `/dev/shm` volume, TLS, token auth, GCS fault tolerance and the history
server's collector."""

from __future__ import annotations

import pickle
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from tpu_autoscaler.adapters.kube.pods import worker_pod_prefix
from tpu_autoscaler.controlplane.json_copy import json_copy
from tpu_autoscaler.core import labels

RAY_NODE_LABEL: Final = "ray.io/is-ray-node"
RAY_IDENTIFIER_LABEL: Final = "ray.io/identifier"
APP_NAME_LABEL: Final = "app.kubernetes.io/name"
CREATED_BY_LABEL: Final = "app.kubernetes.io/created-by"
APPLICATION_NAME: Final = "kuberay"
COMPONENT_NAME: Final = "kuberay-operator"
DEFAULT_GCS_PORT: Final = "6379"
DEFAULT_METRICS_PORT: Final = 8080
CLUSTER_DOMAIN: Final = "cluster.local"
"""`DefaultDomainName`; the operator's `CLUSTER_DOMAIN` variable would change it."""
WAIT_GCS_READY: Final = "wait-gcs-ready"
PROTECTED_LABELS: Final = frozenset(
    {labels.KUBERAY_NODE_TYPE, labels.KUBERAY_GROUP, labels.KUBERAY_CLUSTER}
)
"""Labels a template cannot override (`labelPod`)."""


def check_label(value: str) -> str:
    """`CheckLabel`: the last 63 characters; a leading punctuation mark becomes `r`."""
    if len(value) > 63:
        value = value[len(value) - 63 :]
    if value and unicodedata.category(value[0]).startswith("P"):
        value = "r" + value[1:]
    return value


def head_service_fqdn(raycluster: Mapping[str, Any]) -> str:
    """`GenerateFQDNServiceName`: `<cluster>-head-svc.<namespace>.svc.cluster.local`,
    or the head service's own name when the head group names one."""
    meta = raycluster["metadata"]
    head = (raycluster.get("spec") or {}).get("headGroupSpec") or {}
    service = ((head.get("headService") or {}).get("metadata") or {}).get("name") or (
        f"{meta['name']}-head-svc"
    )
    return f"{service}.{meta.get('namespace', 'default')}.svc.{CLUSTER_DOMAIN}"


def head_port(raycluster: Mapping[str, Any]) -> str:
    """`GetHeadPort`: the head's `port` start parameter, else the GCS default."""
    head = (raycluster.get("spec") or {}).get("headGroupSpec") or {}
    return str((head.get("rayStartParams") or {}).get("port", DEFAULT_GCS_PORT))


def autoscaler_v2(raycluster: Mapping[str, Any]) -> bool:
    """`IsAutoscalingEnabled && IsAutoscalingV2Enabled`."""
    spec = raycluster.get("spec") or {}
    options = spec.get("autoscalerOptions") or {}
    return bool(spec.get("enableInTreeAutoscaling")) and options.get("version") == "v2"


def worker_labels(
    cluster: str,
    group_spec: Mapping[str, Any],
    replica_name: str | None,
    replica_index: int,
    host_index: int,
    multi_host_indexing: bool,
) -> dict[str, str]:
    """`labelPod` over the template's labels merged with the group's `labels` (which
    win), then the RayMultiHostIndexing labels: the replica index on every pod, the
    replica name and host index only when numOfHosts > 1."""
    group = group_spec["groupName"]
    merged = {
        **(((group_spec.get("template") or {}).get("metadata") or {}).get("labels") or {}),
        **(group_spec.get("labels") or {}),
    }
    pod_labels = {
        RAY_NODE_LABEL: "yes",
        labels.KUBERAY_CLUSTER: cluster,
        labels.KUBERAY_NODE_TYPE: "worker",
        labels.KUBERAY_GROUP: group,
        RAY_IDENTIFIER_LABEL: check_label(f"{cluster}-worker"),
        APP_NAME_LABEL: APPLICATION_NAME,
        CREATED_BY_LABEL: COMPONENT_NAME,
    }
    pod_labels |= {k: str(v) for k, v in merged.items() if k not in PROTECTED_LABELS}
    if multi_host_indexing:
        pod_labels[labels.KUBERAY_REPLICA_INDEX] = str(replica_index)
        if int(group_spec.get("numOfHosts") or 1) > 1:
            pod_labels[labels.KUBERAY_REPLICA_NAME] = replica_name or ""
            pod_labels[labels.KUBERAY_HOST_INDEX] = str(host_index)
    return pod_labels


def _has_env(env: list[dict[str, Any]], name: str) -> bool:
    return any(var.get("name") == name for var in env)


def _field_ref(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def ray_container_env(existing: list[dict[str, Any]], fqdn: str, port: str) -> list[dict[str, Any]]:
    """`setContainerEnvVars` for a worker: the template's variables, then KubeRay's,
    the optional ones only where the template does not set them."""
    env = json_copy(existing)
    env += [
        {"name": "FQ_RAY_IP", "value": fqdn},
        {"name": "RAY_IP", "value": fqdn.split(".")[0]},
        _field_ref("RAY_CLUSTER_NAME", f"metadata.labels['{labels.KUBERAY_CLUSTER}']"),
        _field_ref("RAY_CLUSTER_NAMESPACE", "metadata.namespace"),
        _field_ref(labels.ENV_CLOUD_INSTANCE_ID, "metadata.name"),
        _field_ref(labels.ENV_NODE_TYPE_NAME, f"metadata.labels['{labels.KUBERAY_GROUP}']"),
    ]
    for name, value in (
        ("RAY_PORT", port),
        ("RAY_ADDRESS", f"{fqdn}:{port}"),
        ("RAY_USAGE_STATS_KUBERAY_IN_USE", "1"),
        ("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1"),
    ):
        if not _has_env(env, name):
            env.append({"name": name, "value": value})
    return env


def build_worker_pod(
    raycluster: Mapping[str, Any],
    group_spec: Mapping[str, Any],
    replica_name: str | None,
    replica_index: int,
    host_index: int,
    multi_host_indexing: bool = True,
) -> dict[str, Any]:
    """The pod `buildWorkerPod` returns for host `host_index` of replica `replica_index`
    (`replica_name`: KubeRay's `<group>-<5 random>`, for multi-host groups). It has a
    generateName and no name: the API server names it."""
    meta = raycluster["metadata"]
    cluster = meta["name"]
    template = json_copy(dict(group_spec.get("template") or {}))
    spec: dict[str, Any] = template.get("spec") or {}
    fqdn = head_service_fqdn(raycluster)
    port = head_port(raycluster)
    containers = spec.setdefault("containers", [{}])
    ray = containers[0]
    if spec.get("initContainers") is None:
        spec["initContainers"] = []
    spec["initContainers"].append(
        {
            "name": WAIT_GCS_READY,
            **{k: ray[k] for k in ("image", "imagePullPolicy") if ray.get(k)},
            "env": json_copy(ray.get("env") or []),
            "resources": {
                "limits": {"cpu": "200m", "memory": "256Mi"},
                "requests": {"cpu": "200m", "memory": "256Mi"},
            },
        }
    )
    for init in spec["initContainers"]:
        init["env"] = (init.get("env") or []) + [
            {"name": "FQ_RAY_IP", "value": fqdn},
            {"name": "RAY_IP", "value": fqdn.split(".")[0]},
        ]
    ports = ray.setdefault("ports", [])
    if not any(p.get("name") == "metrics" for p in ports):
        ports.append({"name": "metrics", "containerPort": DEFAULT_METRICS_PORT})
    if autoscaler_v2(raycluster):
        spec["restartPolicy"] = "Never"
    ray["env"] = ray_container_env(ray.get("env") or [], fqdn, port)
    pod_meta: dict[str, Any] = {
        "generateName": worker_pod_prefix(cluster, group_spec["groupName"]),
        "namespace": meta.get("namespace", "default"),
        "labels": worker_labels(
            cluster, group_spec, replica_name, replica_index, host_index, multi_host_indexing
        ),
        "ownerReferences": [
            {
                "apiVersion": raycluster.get("apiVersion", "ray.io/v1"),
                "kind": "RayCluster",
                "name": cluster,
                **({"uid": meta["uid"]} if meta.get("uid") else {}),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    annotations = (template.get("metadata") or {}).get("annotations")
    if annotations:
        pod_meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


class WorkerPodBuilder:
    """`build_worker_pod` for one operator, which builds thousands of pods from one
    group's template: all of a pod but its labels is the same for every pod of the
    group while the RayCluster's spec and identity stay, so it is built once and
    copied (the labels are each pod's own). Stored objects are never changed in
    place: the spec and group read are held, and the same objects mean the same
    values."""

    def __init__(self) -> None:
        self._built: tuple[tuple[object, ...], dict[str, Any], bytes | None] | None = None
        """What it was built from, the pod but its labels, and that pod pickled if it
        is plain JSON (a pod is some 170 members: unpickling copies them in C, where
        `json_copy` walked them in Python)."""

    def build(
        self,
        raycluster: Mapping[str, Any],
        group_spec: Mapping[str, Any],
        replica_name: str | None,
        replica_index: int,
        host_index: int,
        multi_host_indexing: bool = True,
    ) -> dict[str, Any]:
        meta = raycluster["metadata"]
        # What `build_worker_pod` reads but the labels' arguments: the spec and the
        # group (as objects), the cluster's name, namespace and uid, its apiVersion.
        read = (
            raycluster.get("spec"),
            group_spec,
            meta["name"],
            meta.get("namespace", "default"),
            meta.get("uid"),
            raycluster.get("apiVersion", "ray.io/v1"),
        )
        built = self._built
        if (
            built is None
            or built[0][0] is not read[0]
            or built[0][1] is not read[1]
            or built[0][2:] != read[2:]
        ):
            whole = build_worker_pod(raycluster, group_spec, replica_name, replica_index, 0)
            whole["metadata"].pop("labels")
            pickled = pickle.dumps(whole, pickle.HIGHEST_PROTOCOL) if _plain_json(whole) else None
            built = self._built = (read, whole, pickled)
        # The same copy: pickle keeps a member reachable by two paths one member.
        pod: dict[str, Any] = json_copy(built[1]) if built[2] is None else pickle.loads(built[2])
        built_meta = pod["metadata"]
        pod["metadata"] = {
            "generateName": built_meta.pop("generateName"),
            "namespace": built_meta.pop("namespace"),
            "labels": worker_labels(
                meta["name"], group_spec, replica_name, replica_index, host_index,
                multi_host_indexing,
            ),
            **built_meta,
        }  # fmt: skip
        return pod


def _plain_json(value: Any) -> bool:
    """Whether `value` is made of dicts (with string keys), lists, strings, numbers,
    booleans and None only: what a pickle copies as `json_copy` copies it."""
    kind = type(value)
    if kind is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    if kind is list:
        return all(_plain_json(v) for v in value)
    return kind in (str, int, float, bool, type(None))
