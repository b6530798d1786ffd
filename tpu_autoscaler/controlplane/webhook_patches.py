"""What JSON patch does the GKE TPU webhook's `mutatePod` (`main.go` at ef658db)
answer for a TPU pod KubeRay creates? Its replica index and `TPU_WORKER_ID`, `TPU_NAME`,
multi-host DNS (`hostname`, `subdomain`, `TPU_WORKER_HOSTNAMES`, TPU7x
`TPU_PROCESS_ADDRESSES`/`PORT`), node-pool affinity, MegaScale variables and the device
plugin address, rule for rule. `controlplane/webhook.py` admits the pod with it."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final

from tpu_autoscaler.controlplane.webhook_hosts import (
    WebhookGoError,
    chips_requested,
    env_vars,
    go_atoi,
    hosts_from_topology,
    next_replica_index,
    next_worker_id,
    requests_tpus,
    slice_hosts,
    tpu_containers_of,
)
from tpu_autoscaler.core import labels

TPU_PROCESS_PORT_BASE: Final = 8471
"""`tpuProcessPortBase` (its comment says 8476; the constant is 8471)."""
MEGASCALE_PORT_BASE: Final = 8081
TPU7X_ACCELERATOR_PREFIX: Final = "tpu7x"
NODE_POOL_TOPOLOGY_KEY: Final = "cloud.google.com/gke-nodepool"
HEADLESS_SERVICE_SUFFIX: Final = "headless"
"""KubeRay's `utils.HeadlessServiceSuffix`: the service is `<cluster>-headless`."""


def headless_service_name(cluster: str) -> str:
    """`generateHeadlessServiceName`: KubeRay's `CheckName("<cluster>-headless")` (the
    last 50 characters; a leading digit or punctuation becomes `r`)."""
    name = f"{cluster}-{HEADLESS_SERVICE_SUFFIX}"
    if len(name) > 50:
        name = name[len(name) - 50 :]
    if name[0].isdigit():
        name = "r" + name[1:]
    if unicodedata.category(name[0]).startswith("P"):
        name = "r" + name[1:]
    return name


def worker_hostnames(num_hosts: int, group: str, cluster: str, replica_index: int) -> str:
    """`genDNSHostnames`: `TPU_WORKER_HOSTNAMES`."""
    service = headless_service_name(cluster)
    return ",".join(f"{group}-{replica_index}-{host}.{service}" for host in range(num_hosts))


def process_addresses(
    num_hosts: int, tpu_containers: int, group: str, cluster: str, replica_index: int
) -> str:
    """`getTPUProcessAddresses`: TPU7x `TPU_PROCESS_ADDRESSES`, one port per TPU
    container of each host."""
    service = headless_service_name(cluster)
    return ",".join(
        f"{group}-{replica_index}-{host}.{service}:{TPU_PROCESS_PORT_BASE + container}"
        for host in range(num_hosts)
        for container in range(tpu_containers)
    )


def _selector_term(key: str, operator: str, *values: str) -> dict[str, Any]:
    term: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        term["values"] = list(values)
    return term


def affinity(pod: Mapping[str, Any], replica_index: int, group: str) -> dict[str, Any]:
    """`injectAffinity`: a replica's pods together on one node pool, no other replica
    or cluster there; keyed on KubeRay's replica name when the pod has it."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    cluster = pod_labels.get(labels.KUBERAY_CLUSTER, "")
    if labels.KUBERAY_REPLICA_NAME in pod_labels and labels.KUBERAY_HOST_INDEX in pod_labels:
        key, value = labels.KUBERAY_REPLICA_NAME, pod_labels[labels.KUBERAY_REPLICA_NAME]
    else:
        key, value = labels.WEBHOOK_REPLICA_INDEX, f"{group}-{replica_index}"
    cluster_in = _selector_term(labels.KUBERAY_CLUSTER, "In", cluster)
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [_selector_term(key, "In", value), cluster_in]
                    },
                    "topologyKey": NODE_POOL_TOPOLOGY_KEY,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [_selector_term(key, "NotIn", value), cluster_in]
                    },
                    "topologyKey": NODE_POOL_TOPOLOGY_KEY,
                },
                {
                    "labelSelector": {
                        "matchExpressions": [
                            _selector_term(labels.KUBERAY_CLUSTER, "NotIn", cluster),
                            _selector_term(key, "Exists"),
                        ]
                    },
                    "topologyKey": NODE_POOL_TOPOLOGY_KEY,
                    "namespaceSelector": {
                        "matchExpressions": [
                            _selector_term("kubernetes.io/metadata.name", "NotIn", "kube-system")
                        ]
                    },
                },
            ]
        },
    }


class _EnvPatches:
    """`addEnvVarPatch` for one container: the first variable creates the list."""

    def __init__(self, patches: list[dict[str, Any]], index: int, container: Mapping[str, Any]):
        self.patches = patches
        self.path = f"/spec/containers/{index}/env"
        self.exists = len(container.get("env") or []) > 0

    def add(self, var: dict[str, Any]) -> None:
        if self.exists:
            self.patches.append({"op": "add", "path": f"{self.path}/-", "value": var})
        else:
            self.patches.append({"op": "add", "path": self.path, "value": [var]})
        self.exists = True


_UNSET: Final = ("", False)
"""`env_var`'s answer for a variable the container does not set."""


def mutation_patches(
    pod: Mapping[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    containers = spec.get("containers")
    if containers is None:
        raise WebhookGoError("Container path not specified")
    if not requests_tpus(containers):
        return []
    meta = pod.get("metadata") or {}
    pod_labels = meta.get("labels") or {}
    cluster = pod_labels.get(labels.KUBERAY_CLUSTER, "")
    if cluster == "":
        raise WebhookGoError("Ray Pod created by KubeRay missing RayCluster label")
    group = pod_labels.get(labels.KUBERAY_GROUP, "")
    if group == "":
        raise WebhookGoError("Ray Pod created by KubeRay missing Group label")
    namespace = meta.get("namespace", "")
    node_selector = spec.get("nodeSelector") or {}
    topology = node_selector.get(labels.GKE_TPU_TOPOLOGY_SELECTOR, "")
    if topology == "":
        raise WebhookGoError("Ray Pod created by KubeRay missing TPU topology nodeSelector")
    try:
        num_hosts = hosts_from_topology(topology, chips_requested(containers))
    except WebhookGoError:
        num_hosts = 0  # the Go code ignores this error
    accelerator = node_selector.get(labels.GKE_TPU_ACCELERATOR_SELECTOR)
    is_tpu7x = accelerator is not None and accelerator.startswith(TPU7X_ACCELERATOR_PREFIX)
    tpu_container_count = len(tpu_containers_of(pod))

    patches: list[dict[str, Any]] = []
    replica_label = pod_labels.get(labels.KUBERAY_REPLICA_INDEX)
    host_label = pod_labels.get(labels.KUBERAY_HOST_INDEX)
    if replica_label is not None and host_label is not None:
        replica_index = go_atoi(replica_label)
        worker_id = go_atoi(host_label)
    else:
        hosts_by_replica = slice_hosts(cluster, group, namespace, existing_pods)
        replica_index = next_replica_index(hosts_by_replica, num_hosts)
        worker_id = next_worker_id(hosts_by_replica, replica_index)
        patches.append(
            {
                "op": "add",
                "path": f"/metadata/labels/{labels.WEBHOOK_REPLICA_INDEX}",
                "value": f"{group}-{replica_index}",
            }
        )
    service = headless_service_name(cluster)
    if num_hosts > 1:
        hostname = f"{group}-{replica_index}-{worker_id}"
        patches.append({"op": "add", "path": "/spec/hostname", "value": hostname})
        patches.append({"op": "add", "path": "/spec/subdomain", "value": service})
        patches.append(
            {"op": "add", "path": "/spec/affinity", "value": affinity(pod, replica_index, group)}
        )

    tpu_index = 0
    for index, container in enumerate(containers):
        if not requests_tpus([container]):
            continue
        env = _EnvPatches(patches, index, container)
        found = env_vars(container)  # its env as it is: the patches apply after
        final_worker_id = worker_id * tpu_container_count + tpu_index if is_tpu7x else worker_id
        if found.get("MEGASCALE_NUM_SLICES", _UNSET)[1]:
            if found.get("MEGASCALE_SLICE_ID", _UNSET)[0] == "":
                env.add({"name": "MEGASCALE_SLICE_ID", "value": str(replica_index)})
            if found.get("MEGASCALE_COORDINATOR_ADDRESS", _UNSET)[0] == "":
                coordinator = f"{group}-0-0.{service}"
                if is_tpu7x:
                    coordinator = f"{coordinator}:{MEGASCALE_PORT_BASE}"
                env.add({"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator})
            port = MEGASCALE_PORT_BASE + (tpu_index if is_tpu7x else 0)
            if found.get("MEGASCALE_PORT", _UNSET)[0] == "":
                env.add({"name": "MEGASCALE_PORT", "value": str(port)})
        if num_hosts > 1:
            if found.get("TPU_WORKER_HOSTNAMES", _UNSET)[0] in ("", "localhost"):
                hostnames = worker_hostnames(num_hosts, group, cluster, replica_index)
                env.add({"name": "TPU_WORKER_HOSTNAMES", "value": hostnames})
            if is_tpu7x:
                current = found.get("TPU_PROCESS_ADDRESSES", _UNSET)[0]
                if current == "" or "localhost" in current:
                    addresses = process_addresses(
                        num_hosts, tpu_container_count, group, cluster, replica_index
                    )
                    env.add({"name": "TPU_PROCESS_ADDRESSES", "value": addresses})
                if found.get("TPU_PROCESS_PORT", _UNSET)[0] == "":
                    process_port = str(TPU_PROCESS_PORT_BASE + tpu_index)
                    env.add({"name": "TPU_PROCESS_PORT", "value": process_port})
        current_id = found.get(labels.ENV_TPU_WORKER_ID, _UNSET)[0]
        is_default = current_id == str(tpu_index)
        if current_id == "" or (is_default and current_id != str(final_worker_id)):
            env.add({"name": labels.ENV_TPU_WORKER_ID, "value": str(final_worker_id)})
        if found.get(labels.ENV_TPU_NAME, _UNSET)[0] == "":
            env.add({"name": labels.ENV_TPU_NAME, "value": f"{group}-{replica_index}"})
        if not found.get("TPU_DEVICE_PLUGIN_HOST_IP", _UNSET)[1]:
            env.add(
                {
                    "name": "TPU_DEVICE_PLUGIN_HOST_IP",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                }
            )
        if found.get("TPU_DEVICE_PLUGIN_ADDR", _UNSET)[0] == "":
            env.add(
                {"name": "TPU_DEVICE_PLUGIN_ADDR", "value": "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"}
            )
        tpu_index += 1
    return patches
