"""Pods as KubeRay (>= 1.6, RayMultiHostIndexing) builds them and the GKE TPU webhook
admits them, and the Ray node each one becomes, in the shapes the adapters read: pod dicts
as the Kubernetes API returns them, `NodeState` protobufs as the GCS reports them."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ray.core.generated import autoscaler_pb2, common_pb2

from tpu_autoscaler.controlplane import gke, kuberay_pod, webhook
from tpu_autoscaler.controlplane.selectors import parse_selector
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape


def pod_name(cluster: str, group: str, replica_index: int, host_index: int, serial: int = 0) -> str:
    """KubeRay's `<cluster>-<group>-worker-<5 chars>`, deterministic here; `serial`
    tells apart pods that reuse a replica index after a deletion."""
    key = f"{cluster}/{group}/{replica_index}/{host_index}/{serial}"
    # KubeRay retries a clashing random suffix; a longer hash avoids clashes here.
    return f"{cluster}-{group}-worker-{_suffix(key, serial)}"


def replica_name(group: str, replica_index: int, serial: int = 0) -> str:
    """KubeRay's unique `<group>-<5 chars>` replica name, deterministic here."""
    key = f"{group}/{replica_index}/{serial}"
    return f"{group}-{_suffix(key, serial)}"


def _suffix(key: str, serial: int) -> str:
    """Five characters, as KubeRay's, for fixed scenarios; ten once a simulator creates
    thousands of pods, so that names never clash."""
    return hashlib.sha1(key.encode()).hexdigest()[: 5 if serial == 0 else 10]


def slice_name(group: str, replica_index: int) -> str:
    """The webhook's `TPU_NAME`: `<group>-<replica index>`."""
    return f"{group}-{replica_index}"


def group_template(shape: SliceShape) -> dict[str, Any]:
    """A worker group spec for `shape` when no RayCluster is at hand: a Ray container
    requesting the host's chips and the node selector the TPU webhook reads."""
    container: dict[str, Any] = {"name": "ray-worker", "image": "rayproject/ray:2.60.0"}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if shape.tpu is not None:
        chips = {labels.GKE_TPU_RESOURCE: str(shape.chips_per_host)}
        container["resources"] = {"limits": dict(chips), "requests": dict(chips)}
        pod_spec["nodeSelector"] = {
            labels.GKE_TPU_ACCELERATOR_SELECTOR: shape.tpu.generation.gke_accelerators[0],
            labels.GKE_TPU_TOPOLOGY_SELECTOR: shape.tpu.topology,
        }
    return {
        "groupName": shape.group,
        "numOfHosts": int(shape.hosts_per_replica),
        "template": {"spec": pod_spec},
    }


def admitted_pod(
    posted: Mapping[str, Any],
    name: str,
    created: str,
    existing: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """What the API server stores for a pod KubeRay POSTs: named (from its
    generateName), stamped, mutated by the TPU webhook given the pods it lists, Pending."""
    pod = copy.deepcopy(dict(posted))
    pod["metadata"] = {"name": name, **pod["metadata"], "creationTimestamp": created}
    pod = webhook.mutate_pod(pod, existing)
    pod["status"] = {"phase": "Pending"}
    return pod


def worker_pod(
    cluster: str,
    namespace: str,
    shape: SliceShape,
    replica_index: int,
    host_index: int,
    created: str,
    phase: str = "Running",
    serial: int = 0,
    name: str | None = None,
    replica: str | None = None,
    multi_host_indexing: bool = True,
    raycluster: Mapping[str, Any] | None = None,
    existing: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A worker pod as stored, made by the same chain as in the simulator: KubeRay's
    `buildWorkerPod` (`controlplane/kuberay_pod.py`) from the group in `raycluster` (or one
    made for `shape`), then the TPU webhook's mutation given the pods it already lists
    (`existing`: the single-host and gate-off index fallback counts them). A Running pod
    is bound to a node. `name` and `replica` (KubeRay's random names) default to
    deterministic ones; without `multi_host_indexing` (the KubeRay feature gate off)
    KubeRay sets no replica labels and only the webhook's `replicaIndex` ties a pod to
    its slice. GKE's `TPU_ACCELERATOR_TYPE` and `TPU_TOPOLOGY` are not in the pod:
    `controlplane/gke.py` adds them to the container's environment."""
    if raycluster is None:
        raycluster = {"metadata": {"name": cluster, "namespace": namespace}, "spec": {}}
        group = group_template(shape)
    else:
        group = next(
            g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == shape.group
        )
    multi_host = shape.hosts_per_replica > 1
    posted = kuberay_pod.build_worker_pod(
        raycluster,
        group,
        (replica or replica_name(shape.group, replica_index, serial)) if multi_host else None,
        replica_index,
        host_index,
        multi_host_indexing,
    )
    name = name or pod_name(cluster, shape.group, replica_index, host_index, serial)
    pod = admitted_pod(posted, name, created, existing)
    pod["status"]["phase"] = phase
    if phase == "Running":
        pod["spec"]["nodeName"] = f"node-of-{name}"
    return pod


def node_state(
    pod: Mapping[str, Any],
    shape: SliceShape,
    host_index: int,
    used: Mapping[str, float] | None = None,
    idle_s: float = 0.0,
    dead: bool = False,
) -> Any:
    """The `NodeState` the GCS reports for the raylet in `pod`
    (`GcsAutoscalerStateManager::GetNodeStates`): a dead node with its ids and status
    only; a live one IDLE only with an idle duration of at least 1 ms (the raylet
    rounds up), with the `ray.io/node-id` label every raylet adds."""
    name = gke.spec_environment(pod).get(labels.ENV_TPU_NAME)
    node = autoscaler_pb2.NodeState()
    node.node_id = hashlib.sha1(pod["metadata"]["name"].encode()).digest()[:28]
    node.instance_id = pod["metadata"]["name"]
    node.ray_node_type_name = shape.group
    node.node_ip_address = "10.0.0.1"
    if dead:
        node.status = autoscaler_pb2.NodeStatus.DEAD
        return node
    total = shape.host_resources(host_index, name)
    available = dict(total)
    for key, amount in (used or {}).items():
        available[key] = available.get(key, 0.0) - amount
    for key, value in total.items():
        node.total_resources[key] = value
    for key, value in available.items():
        if value > 0:
            node.available_resources[key] = value
    for key, label in shape.host_labels(host_index, name).items():
        node.labels[key] = label
    node.labels[RAY_NODE_ID] = node.node_id.hex()
    if any(amount > 0 for amount in (used or {}).values()):
        node.status = autoscaler_pb2.NodeStatus.RUNNING
    else:
        node.status = autoscaler_pb2.NodeStatus.IDLE
        node.idle_duration_ms = max(1, int(idle_s * 1000))
    return node


RAY_NODE_ID = "ray.io/node-id"
"""The label every raylet adds (`kLabelKeyNodeID`): the node id in hex."""


_OPERATORS = {
    "in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN"),
    "not_in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_NOT_IN"),
}


def fill_request(
    request: Any, resources: Mapping[str, float], selector: Mapping[str, str] | None
) -> None:
    """A `ResourceRequest`'s resources and label selector. `selector` is in Ray's dict
    syntax (`v`, `!v`, `in(a,b)`, `!in(a,b)`); it becomes one `LabelSelector` of
    IN / NOT_IN constraints, as the GCS turns a task's or bundle's selector into one
    (`LabelSelector::ToProto`)."""
    for key, value in resources.items():
        request.resources_bundle[key] = value
    if selector:
        constraints = request.label_selectors.add()
        for constraint in parse_selector(selector):
            c = constraints.label_constraints.add()
            c.label_key = constraint.key
            c.operator = _OPERATORS[constraint.operator]
            c.label_values.extend(sorted(constraint.values))


def add_task_demand(
    state: Any,
    resources: Mapping[str, float],
    count: int,
    selector: Mapping[str, str] | None = None,
) -> None:
    """Pending tasks or actors as the GCS reports them (`ResourceRequestByCount`)."""
    request = state.pending_resource_requests.add()
    request.count = count
    fill_request(request.request, resources, selector)


def add_gang_demand(
    state: Any,
    pg_id: str,
    bundles: list[Mapping[str, float]],
    strategy: str,
    selectors: list[Mapping[str, str]] | None = None,
) -> None:
    """A pending placement group as `GcsAutoscalerStateManager::GetPendingGangResourceRequests`
    reports it: details `<id>:<strategy>|PENDING`; each bundle in `bundle_selectors` with
    its label selector, and in the legacy `requests` with its resources only; strict
    strategies as (anti-)affinity on a per-group label in both."""
    gang = state.pending_gang_resource_requests.add()
    gang.details = f"{pg_id}:{strategy}|PENDING"
    chosen = gang.bundle_selectors.add()
    for bundle, selector in zip(bundles, selectors or [{}] * len(bundles), strict=True):
        legacy = gang.requests.add()
        fill_request(legacy, bundle, None)
        current = chosen.resource_requests.add()
        fill_request(current, bundle, selector)
        for target in (legacy, current):
            if strategy == "STRICT_SPREAD":
                target.placement_constraints.add().anti_affinity.label_name = f"_PG_{pg_id}"
            elif strategy == "STRICT_PACK":
                target.placement_constraints.add().affinity.label_name = f"_PG_{pg_id}"
