"""One interface to the two API servers the `kube_real` tests compare: the simulator's
(`controlplane.apiserver`, over its `ObjectStore`) and a real kube-apiserver. Requests
go through the official client (`ApiClient.call_api`) as raw JSON, so a test sees the
status code and body each server sends; objects are seeded the way each can take them
(the store directly, or POST)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

import yaml
from kubernetes import client

from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.store import ObjectStore

CLUSTER = Path(__file__).parents[2] / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
NAME, GROUP = "tpu-v6e-16", "tpu-v6e-group"
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
NO_RETRY = RetryPolicy(attempts=1)


def raycluster(namespace: str) -> dict[str, Any]:
    """The example v6e 4x4 RayCluster (valid for the schema and the TPU webhook)."""
    obj: dict[str, Any] = yaml.safe_load(CLUSTER.read_text())
    obj["metadata"]["namespace"] = namespace
    return obj


def pod(namespace: str, name: str, labels: dict[str, str], node: str | None = None) -> Any:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) else None

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else ""


def call(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = JSON,
    query: list[tuple[str, str]] | None = None,
) -> Answer:
    """One request, its answer whatever the status (no exception, no retry)."""
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    request = api_client.param_serialize(
        method=method,
        resource_path=path,
        header_params=headers,
        query_params=query or [],
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request, _request_timeout=30.0)
    data = response.read()
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data.decode(errors="replace")
    return Answer(response.status, parsed)


class Endpoint:
    """A server under test, with one namespace for the test."""

    kind: str
    namespace: str
    api_client: client.ApiClient

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        query: list[tuple[str, str]] | None = None,
    ) -> Answer:
        return call(self.api_client, method, path, body, content_type, query)

    def raycluster_path(self, name: str = NAME) -> str:
        return f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters/{name}"

    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def events_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/events"

    def kube_api(self) -> KubernetesApi:
        """The project's client on this server, without retries."""
        return KubernetesApi(self.api_client, NO_RETRY, 30.0, sleep=_no_sleep, random=Random(0))

    def seed_raycluster(self, obj: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def seed_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class Simulated(Endpoint):
    kind = "simulated"

    def __init__(self, namespace: str, store: ObjectStore | None = None) -> None:
        self.namespace = namespace
        self.store = store if store is not None else ObjectStore()
        self.server = ApiServer(self.store).start()
        configuration = client.Configuration()
        configuration.host = self.server.url
        configuration.retries = False
        self.api_client = client.ApiClient(configuration)

    def seed_raycluster(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.create_raycluster(copy.deepcopy(obj))

    def seed_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.create_pod(copy.deepcopy(obj))

    def close(self) -> None:
        self.api_client.close()
        self.server.stop()


class Real(Endpoint):
    kind = "real"

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace

    def seed_raycluster(self, obj: dict[str, Any]) -> dict[str, Any]:
        path = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters"
        return _created(self.request("POST", path, obj))

    def seed_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        return _created(self.request("POST", self.pods_path(), obj))


def _created(answer: Answer) -> dict[str, Any]:
    assert answer.status == 201, answer
    created: dict[str, Any] = answer.body
    return created


def _no_sleep(seconds: float) -> None:
    del seconds


def spec_of(obj: dict[str, Any]) -> Any:
    return obj.get("spec")


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in items)


def walk_keys(value: Any) -> Iterator[str]:
    """Every mapping key anywhere in `value`."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from walk_keys(child)
    elif isinstance(value, list):
        for child in value:
            yield from walk_keys(child)
