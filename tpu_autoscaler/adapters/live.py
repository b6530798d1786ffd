"""Reading a live cluster: the RayCluster and its pods through the official
Kubernetes client (in-cluster config, else kubeconfig), and Ray's
`ClusterResourceState` through Ray's own GCS client. Read-only; the autoscaler's
writes live with the provider."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from tpu_autoscaler import labels

RAYCLUSTER_GROUP = "ray.io"
RAYCLUSTER_VERSION = "v1"
RAYCLUSTER_PLURAL = "rayclusters"


def kubernetes_api(host: str | None = None) -> client.ApiClient:
    """An API client: `host` (tests, proxies) if given, else in-cluster, else kubeconfig."""
    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def read_raycluster(api: client.ApiClient, name: str, namespace: str) -> dict[str, Any]:
    objects = client.CustomObjectsApi(api)
    raycluster: dict[str, Any] = objects.get_namespaced_custom_object(
        RAYCLUSTER_GROUP, RAYCLUSTER_VERSION, namespace, RAYCLUSTER_PLURAL, name
    )
    return raycluster


def read_pods(api: client.ApiClient, name: str, namespace: str) -> list[dict[str, Any]]:
    """The cluster's pods as the API serves them (camelCase JSON), not as client models."""
    core = client.CoreV1Api(api)
    response = core.list_namespaced_pod(
        namespace, label_selector=f"{labels.KUBERAY_CLUSTER}={name}", _preload_content=False
    )
    body: dict[str, Any] = json.loads(response.data)
    items: list[dict[str, Any]] = body.get("items") or []
    return items


def read_ray_state(gcs_address: str) -> dict[str, Any]:
    """`ClusterResourceState` from the GCS at `gcs_address`, as protobuf JSON."""
    from google.protobuf.json_format import MessageToDict

    # Ray's own GCS client and call, as its autoscaler uses them.
    from ray.autoscaler.v2.sdk import GcsClient, get_cluster_resource_state

    state = get_cluster_resource_state(GcsClient(address=gcs_address))
    result: dict[str, Any] = MessageToDict(state, preserving_proto_field_name=True)
    return result


def take_snapshot(
    api: client.ApiClient, name: str, namespace: str, gcs_address: str | None
) -> dict[str, Any]:
    """Everything `plan` needs, read now. The time is the one edge that reads a clock."""
    return {
        "now": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "raycluster": read_raycluster(api, name, namespace),
        "pods": read_pods(api, name, namespace),
        "ray_state": read_ray_state(gcs_address) if gcs_address else {},
    }
