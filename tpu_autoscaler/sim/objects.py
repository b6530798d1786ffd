"""Pods as KubeRay (>= 1.6, RayMultiHostIndexing) and the GKE TPU webhook create
them, and the Ray node each one becomes, in the shapes the adapters read: pod dicts
as the Kubernetes API returns them, `NodeState` protobufs as the GCS reports them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ray.core.generated import autoscaler_pb2, common_pb2

from tpu_autoscaler import labels
from tpu_autoscaler.shapes import SliceShape
from tpu_autoscaler.sim.selectors import parse_selector


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
) -> dict[str, Any]:
    """A worker pod as stored once the webhook admitted it. `name` and `replica`
    (KubeRay's random names) default to deterministic ones; without
    `multi_host_indexing` (the KubeRay feature gate off) KubeRay sets no replica
    labels and only the webhook's `replicaIndex` ties a pod to its slice."""
    name = name or pod_name(cluster, shape.group, replica_index, host_index, serial)
    pod_labels = {
        labels.KUBERAY_CLUSTER: cluster,
        labels.KUBERAY_GROUP: shape.group,
        labels.KUBERAY_NODE_TYPE: "worker",
    }
    env = [
        {"name": labels.ENV_CLOUD_INSTANCE_ID, "value": name},
        {"name": labels.ENV_NODE_TYPE_NAME, "value": shape.group},
    ]
    if multi_host_indexing:
        pod_labels[labels.KUBERAY_REPLICA_INDEX] = str(replica_index)
        if shape.hosts_per_replica > 1:
            pod_labels[labels.KUBERAY_REPLICA_NAME] = replica or replica_name(
                shape.group, replica_index, serial
            )
            pod_labels[labels.KUBERAY_HOST_INDEX] = str(host_index)
    if shape.tpu is not None:
        tpu_name = slice_name(shape.group, replica_index)
        hostnames = ",".join(
            f"{shape.group}-{replica_index}-{i}.{cluster}-headless-worker-svc"
            for i in range(shape.hosts_per_replica)
        )
        env += [
            {"name": labels.ENV_TPU_NAME, "value": tpu_name},
            {"name": labels.ENV_TPU_WORKER_ID, "value": str(host_index)},
            {"name": labels.ENV_TPU_ACCELERATOR_TYPE, "value": shape.tpu.gke_accelerator_type},
            {"name": labels.ENV_TPU_TOPOLOGY, "value": shape.tpu.topology},
        ]
        if shape.tpu.generation.name == "tpu7x":
            # The webhook gives TPU7x process addresses instead of worker hostnames.
            port = 8476
            addresses = ",".join(f"{host}:{port}" for host in hostnames.split(","))
            env += [
                {"name": "TPU_PROCESS_ADDRESSES", "value": addresses},
                {"name": "TPU_PROCESS_PORT", "value": str(port)},
            ]
        else:
            env.append({"name": "TPU_WORKER_HOSTNAMES", "value": hostnames})
        pod_labels[labels.WEBHOOK_REPLICA_INDEX] = tpu_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pod_labels,
            "creationTimestamp": created,
        },
        "spec": {"containers": [{"name": "ray-worker", "env": env}]},
        "status": {"phase": phase},
    }


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
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    name = env.get(labels.ENV_TPU_NAME)
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
