"""Reading a live cluster: the RayCluster, its pods and the Events about pods through
any `KubeApi` (in production `adapters.kube.client.KubernetesApi`), and Ray's `ClusterResourceState`
through Ray's own GCS client. Read-only; the autoscaler's writes live with the
provider."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi
from tpu_autoscaler.adapters.kube.capacity_events import POD_EVENTS
from tpu_autoscaler.core import labels


def read_ray_state(gcs_address: str) -> dict[str, Any]:
    """`ClusterResourceState` from the GCS at `gcs_address`, as protobuf JSON."""
    from google.protobuf.json_format import MessageToDict

    # Ray's own GCS client and call, as its autoscaler uses them.
    from ray.autoscaler.v2.sdk import GcsClient, get_cluster_resource_state

    state = get_cluster_resource_state(GcsClient(address=gcs_address))
    result: dict[str, Any] = MessageToDict(state, preserving_proto_field_name=True)
    return result


def take_snapshot(
    api: KubeApi, name: str, namespace: str, gcs_address: str | None
) -> dict[str, Any]:
    """Everything `plan` needs, read now. The time is the one edge that reads a clock.
    Of the namespace's Events about pods, those about this cluster's pods are kept;
    Events that cannot be listed (a Role without `list` on `events`) are left out: the
    snapshot then carries no capacity signals, as the autoscaler would run."""
    snapshot: dict[str, Any] = {
        "now": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "raycluster": api.get_raycluster(namespace, name),
        "pods": api.list_pods(namespace, {labels.KUBERAY_CLUSTER: name}),
        "ray_state": read_ray_state(gcs_address) if gcs_address else {},
    }
    mine = {p.get("metadata", {}).get("name") for p in snapshot["pods"]}
    with contextlib.suppress(ApiError):
        snapshot["events"] = [
            e
            for e in api.list_events(namespace, POD_EVENTS)
            if (e.get("involvedObject") or {}).get("name") in mine
        ]
    return snapshot
