"""The GKE TPU webhook (`github.com/ai-on-gke/kuberay-tpu-webhook`, `main.go` at
ef658db, May 2026), rule for rule, as pure functions: its own reading of a
RayCluster and a pod, not ours (nothing here calls `tpu_autoscaler.manifest.shapes`), so the
simulator gets a second opinion on every TPU shape.

Two webhooks, as `deployments/*-webhook-cfg.yaml` register them:
- validating, RayCluster **CREATE only** (`validateRayCluster`): a TPU worker group
  whose `numOfHosts` differs from topology chips / chips per pod is denied; an
  update is never seen, so a later edit to 3 hosts on a 4x4 is stored.
- mutating, Pod CREATE of pods labelled `app.kubernetes.io/name: kuberay`
  (`mutatePod`): a pod requesting `google.com/tpu` gets its replica index and
  `TPU_WORKER_ID` (from KubeRay's `ray.io/worker-group-replica-index` and
  `ray.io/replica-host-index` labels when both are set, else from the webhook's own
  bookkeeping over the pods it has seen: `getReplicaIndex`, `getNextWorkerID`, and
  the legacy `replicaIndex` label), `TPU_NAME`, multi-host DNS (`hostname`,
  `subdomain`, `TPU_WORKER_HOSTNAMES`, TPU7x `TPU_PROCESS_ADDRESSES`/`PORT`),
  node-pool affinity, MegaScale variables and the device plugin address.

How kube-apiserver reports the webhook's answers (k8s.io/apiserver
`webhook/errors.ToStatusErr` and the dispatchers): a denial is HTTP 400,
`admission webhook "<name>" denied the request: <message>`; an error inside the
webhook (it answers HTTP 403) fails the write closed with HTTP 500,
`Internal error occurred: failed calling webhook "<name>": failed to call webhook:
<the webhook's text>`."""

from __future__ import annotations

import copy
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.adapters.kube.api import ApiError, Rejected
from tpu_autoscaler.core import labels

VALIDATING_WEBHOOK: Final = "raycluster-kuberay-tpu-webhook.ray-system.svc"
MUTATING_WEBHOOK: Final = "kuberay-tpu-webhook.ray-system.svc"

TPU_PROCESS_PORT_BASE: Final = 8471
"""`tpuProcessPortBase` (its comment says 8476; the constant is 8471)."""
MEGASCALE_PORT_BASE: Final = 8081
TPU7X_ACCELERATOR_PREFIX: Final = "tpu7x"
NODE_POOL_TOPOLOGY_KEY: Final = "cloud.google.com/gke-nodepool"
HEADLESS_SERVICE_SUFFIX: Final = "headless"
"""KubeRay's `utils.HeadlessServiceSuffix`: the service is `<cluster>-headless`."""

KUBERAY_APP_NAME_LABEL: Final = "app.kubernetes.io/name"
KUBERAY_CREATED_BY_LABEL: Final = "app.kubernetes.io/created-by"
WATCHED_POD_LABELS: Final = {
    labels.KUBERAY_NODE_TYPE: "worker",
    KUBERAY_CREATED_BY_LABEL: "kuberay-operator",
}
"""The webhook's pod informer lists only these pods (`tweakListOptionsFunc`)."""
MUTATED_POD_LABELS: Final = {KUBERAY_APP_NAME_LABEL: "kuberay"}
"""The mutating webhook's `objectSelector`: other pods never reach it."""

TOPOLOGY_MISMATCH: Final = "Number of workers in worker group not equal to specified topology"


class WebhookDenied(Rejected):
    """The webhook answered `allowed: false`."""

    status = 400

    def __init__(self, webhook: str, message: str) -> None:
        super().__init__(f'admission webhook "{webhook}" denied the request: {message}')


class WebhookFailed(ApiError):
    """The webhook answered with an HTTP error; the write fails closed."""

    status = 500

    def __init__(self, webhook: str, answer: str) -> None:
        super().__init__(
            f'Internal error occurred: failed calling webhook "{webhook}": '
            f"failed to call webhook: {answer}"
        )


class _WebhookError(Exception):
    """An error inside the webhook's Go code (it logs it and answers 403)."""


# --- reading containers and topologies ---------------------------------------------------


def _quantity(resources: Mapping[str, Any] | None, kind: str) -> Decimal:
    value = ((resources or {}).get(kind) or {}).get(labels.GKE_TPU_RESOURCE)
    return Decimal(0) if value is None else Decimal(parse_quantity(value))


def requests_tpus(containers: Iterable[Mapping[str, Any]]) -> bool:
    """`containerRequestingTPUs`: a non-zero `google.com/tpu` limit or request."""
    return any(
        _quantity(c.get("resources"), kind) != 0
        for c in containers
        for kind in ("limits", "requests")
    )


def chips_requested(containers: Iterable[Mapping[str, Any]]) -> int:
    """`getNumTPUChipsRequested`: per container the request, else the limit, rounded up
    as `Quantity.Value()` rounds; summed over the pod."""
    total = 0
    for container in containers:
        resources = container.get("resources")
        chips = _quantity(resources, "requests") or _quantity(resources, "limits")
        total += math.ceil(chips) if chips > 0 else math.floor(chips)
    return total


def _go_atoi(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise _WebhookError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def hosts_from_topology(topology: str, chips_per_host: int) -> int:
    """`getNumTPUHostsFromTopology`: chips of the topology integer-divided by chips per
    host, at least 1."""
    if topology == "":
        raise _WebhookError("TPU topology not specified")
    chips = 1
    for dimension in topology.split("x"):
        chips *= _go_atoi(dimension)
    if chips_per_host == 0:
        raise _WebhookError("runtime error: integer divide by zero")
    quotient = abs(chips) // abs(chips_per_host)  # Go's int32 division truncates toward 0
    return max(quotient if (chips < 0) == (chips_per_host < 0) else -quotient, 1)


# --- RayCluster validation ------------------------------------------------------------


def _workers_match_topology(group: Mapping[str, Any]) -> bool:
    """`checkWorkersMatchTopology`."""
    num_hosts = int(group.get("numOfHosts") or 0)
    if num_hosts == 0:
        raise _WebhookError("workerGroupSpec NumOfHosts not set")
    pod_spec = (group.get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or []
    if not containers:
        raise _WebhookError("Container path not specified")
    if requests_tpus(containers):
        topology = (pod_spec.get("nodeSelector") or {}).get(labels.GKE_TPU_TOPOLOGY_SELECTOR, "")
        if topology == "":
            raise _WebhookError("TPU topology not specified")
        chips_per_host = chips_requested(containers)
        if chips_per_host == 0:
            raise _WebhookError("Container does not set TPU limits")
        if hosts_from_topology(topology, chips_per_host) != num_hosts:
            return False
    return True


def denial(raycluster: Mapping[str, Any]) -> str | None:
    """`validateRayCluster`: the message of a denied RayCluster CREATE, None if allowed.
    Groups whose containers request no TPUs pass; an error inside the webhook raises
    `WebhookFailed`."""
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    for group in groups:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        if containers and not requests_tpus(containers):
            continue
        try:
            matches = _workers_match_topology(group)
        except _WebhookError:
            raise WebhookFailed(VALIDATING_WEBHOOK, "Failed to validate RayCluster") from None
        if not matches:
            return TOPOLOGY_MISMATCH
    return None


def admit_raycluster_create(raycluster: Mapping[str, Any]) -> None:
    """The validating webhook on a RayCluster CREATE: `WebhookDenied` (400) or
    `WebhookFailed` (500) as kube-apiserver reports them. Updates never reach it."""
    message = denial(raycluster)
    if message is not None:
        raise WebhookDenied(VALIDATING_WEBHOOK, message)


# --- pod mutation ----------------------------------------------------------------------


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


def _env(container: Mapping[str, Any], name: str) -> tuple[str, bool]:
    """`getEnvironmentVariable`: (value, set), where a `valueFrom` counts as set with an
    empty value and an empty `value` does not count."""
    for var in container.get("env") or []:
        if var.get("name") == name:
            if var.get("value"):
                return str(var["value"]), True
            if var.get("valueFrom") is not None:
                return "", True
    return "", False


def _tpu_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if requests_tpus([c])]


def slice_hosts(
    cluster: str, group: str, namespace: str, existing_pods: Iterable[Mapping[str, Any]]
) -> dict[int, list[int]]:
    """`getSliceToTPUHosts`: replica index -> host indices of the group's pods the webhook
    has labelled (`replicaIndex`), terminating ones left out, as its informer lists them."""
    found: dict[int, list[int]] = {}
    for pod in existing_pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        watched = {
            **WATCHED_POD_LABELS,
            labels.KUBERAY_CLUSTER: cluster,
            labels.KUBERAY_GROUP: group,
        }
        if meta.get("namespace") != namespace or any(
            pod_labels.get(k) != v for k, v in watched.items()
        ):
            continue
        if meta.get("deletionTimestamp"):
            continue
        if not requests_tpus((pod.get("spec") or {}).get("containers") or []):
            return found  # the Go code stops at the first pod without TPUs
        replica_label = pod_labels.get(labels.WEBHOOK_REPLICA_INDEX, "")
        if replica_label == "":
            continue
        try:
            replica = _go_atoi(replica_label.split("-")[-1])
        except _WebhookError:
            replica = 0
        tpu_containers = _tpu_containers(pod)
        for container in tpu_containers:
            worker_id, _ = _env(container, labels.ENV_TPU_WORKER_ID)
            if worker_id == "":
                raise _WebhookError("existing TPU worker missing TPU_WORKER_ID")
            try:
                host = _go_atoi(worker_id) // len(tpu_containers)
            except _WebhookError:
                continue
            found.setdefault(replica, []).append(host)
            break
    return found


def next_replica_index(hosts_by_replica: Mapping[int, Sequence[int]], num_hosts: int) -> int:
    """`getReplicaIndex`: the lowest replica still short of hosts, else the number of
    replicas seen (not the lowest free index: with replicas 1 and 2 left, a new
    single-host pod joins index 2 again)."""
    short = [r for r, hosts in hosts_by_replica.items() if len(hosts) < num_hosts]
    return min(short) if short else len(hosts_by_replica)


def next_worker_id(hosts_by_replica: Mapping[int, Sequence[int]], replica_index: int) -> int:
    """`getNextWorkerID`: the lowest host index not yet taken in the replica."""
    worker_id = 0
    last = 0
    for position, host in enumerate(sorted(hosts_by_replica.get(replica_index, []))):
        if position == 0:
            last = host
        elif host == last:
            raise _WebhookError("Identical TPU_WORKER_ID assigned to multiple TPU workers in slice")
        if host != worker_id:
            break
        last = host
        worker_id += 1
    return worker_id


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


def pod_patches(
    pod: Mapping[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`mutatePod`: the JSON patch the webhook answers for a pod CREATE, given the pods
    its informer lists (`existing_pods`; it filters them as the informer does). Raises
    `WebhookFailed` where the Go code returns an error."""
    try:
        return _pod_patches(pod, list(existing_pods))
    except _WebhookError:
        raise WebhookFailed(MUTATING_WEBHOOK, "Failed to mutate Pod") from None


def _pod_patches(
    pod: Mapping[str, Any], existing_pods: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    containers = spec.get("containers")
    if containers is None:
        raise _WebhookError("Container path not specified")
    if not requests_tpus(containers):
        return []
    meta = pod.get("metadata") or {}
    pod_labels = meta.get("labels") or {}
    cluster = pod_labels.get(labels.KUBERAY_CLUSTER, "")
    if cluster == "":
        raise _WebhookError("Ray Pod created by KubeRay missing RayCluster label")
    group = pod_labels.get(labels.KUBERAY_GROUP, "")
    if group == "":
        raise _WebhookError("Ray Pod created by KubeRay missing Group label")
    namespace = meta.get("namespace", "")
    node_selector = spec.get("nodeSelector") or {}
    topology = node_selector.get(labels.GKE_TPU_TOPOLOGY_SELECTOR, "")
    if topology == "":
        raise _WebhookError("Ray Pod created by KubeRay missing TPU topology nodeSelector")
    try:
        num_hosts = hosts_from_topology(topology, chips_requested(containers))
    except _WebhookError:
        num_hosts = 0  # the Go code ignores this error
    accelerator = node_selector.get(labels.GKE_TPU_ACCELERATOR_SELECTOR)
    is_tpu7x = accelerator is not None and accelerator.startswith(TPU7X_ACCELERATOR_PREFIX)
    tpu_container_count = len(_tpu_containers(pod))

    patches: list[dict[str, Any]] = []
    replica_label = pod_labels.get(labels.KUBERAY_REPLICA_INDEX)
    host_label = pod_labels.get(labels.KUBERAY_HOST_INDEX)
    if replica_label is not None and host_label is not None:
        replica_index = _go_atoi(replica_label)
        worker_id = _go_atoi(host_label)
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
        final_worker_id = worker_id * tpu_container_count + tpu_index if is_tpu7x else worker_id
        if _env(container, "MEGASCALE_NUM_SLICES")[1]:
            if _env(container, "MEGASCALE_SLICE_ID")[0] == "":
                env.add({"name": "MEGASCALE_SLICE_ID", "value": str(replica_index)})
            if _env(container, "MEGASCALE_COORDINATOR_ADDRESS")[0] == "":
                coordinator = f"{group}-0-0.{service}"
                if is_tpu7x:
                    coordinator = f"{coordinator}:{MEGASCALE_PORT_BASE}"
                env.add({"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator})
            port = MEGASCALE_PORT_BASE + (tpu_index if is_tpu7x else 0)
            if _env(container, "MEGASCALE_PORT")[0] == "":
                env.add({"name": "MEGASCALE_PORT", "value": str(port)})
        if num_hosts > 1:
            if _env(container, "TPU_WORKER_HOSTNAMES")[0] in ("", "localhost"):
                hostnames = worker_hostnames(num_hosts, group, cluster, replica_index)
                env.add({"name": "TPU_WORKER_HOSTNAMES", "value": hostnames})
            if is_tpu7x:
                current = _env(container, "TPU_PROCESS_ADDRESSES")[0]
                if current == "" or "localhost" in current:
                    addresses = process_addresses(
                        num_hosts, tpu_container_count, group, cluster, replica_index
                    )
                    env.add({"name": "TPU_PROCESS_ADDRESSES", "value": addresses})
                if _env(container, "TPU_PROCESS_PORT")[0] == "":
                    process_port = str(TPU_PROCESS_PORT_BASE + tpu_index)
                    env.add({"name": "TPU_PROCESS_PORT", "value": process_port})
        current_id = _env(container, labels.ENV_TPU_WORKER_ID)[0]
        is_default = current_id == str(tpu_index)
        if current_id == "" or (is_default and current_id != str(final_worker_id)):
            env.add({"name": labels.ENV_TPU_WORKER_ID, "value": str(final_worker_id)})
        if _env(container, labels.ENV_TPU_NAME)[0] == "":
            env.add({"name": labels.ENV_TPU_NAME, "value": f"{group}-{replica_index}"})
        if not _env(container, "TPU_DEVICE_PLUGIN_HOST_IP")[1]:
            env.add(
                {
                    "name": "TPU_DEVICE_PLUGIN_HOST_IP",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                }
            )
        if _env(container, "TPU_DEVICE_PLUGIN_ADDR")[0] == "":
            env.add(
                {"name": "TPU_DEVICE_PLUGIN_ADDR", "value": "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"}
            )
        tpu_index += 1
    return patches


def mutate_pod(
    pod: Mapping[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """The pod as stored after the mutating webhook, as the webhook sees a pod admission
    request: the pod KubeRay POSTs (no RayCluster; only its labels, node selector and
    containers) and the pods of its informer. A pod outside the webhook's
    `objectSelector` is returned unchanged."""
    # Imported here: kube.py admits RayClusters through this module.
    from tpu_autoscaler.controlplane.store import apply_operation

    mutated = copy.deepcopy(dict(pod))
    pod_labels = (mutated.get("metadata") or {}).get("labels") or {}
    if any(pod_labels.get(k) != v for k, v in MUTATED_POD_LABELS.items()):
        return mutated
    for operation in pod_patches(pod, existing_pods):
        apply_operation(mutated, operation)
    return mutated
