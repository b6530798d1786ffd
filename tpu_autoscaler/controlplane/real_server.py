"""How do the simulated controllers talk to a real kube-apiserver? One request at a
time through the official client (`ApiClient.call_api`, raw JSON, so the server's
objects arrive as it serves them), each answer either the object it returned or the
error it meant: 404 `NotFound`, 409 `Conflict`, 400/422 `Rejected`, 429/5xx
`Unavailable` (the same errors the simulated store raises, so the operator handles
both alike). Never retried and never swallowed: what the server said is what the
controller meets, and every answer is counted by request and status code.

`controlplane/real_store.py` uses it to write the controllers' changes through and to
read the server back into their cache."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from kubernetes import client

from tpu_autoscaler.adapters.kube.api import (
    JSON_PATCH,
    ApiError,
    Conflict,
    NotFound,
    Rejected,
    Unavailable,
)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
RAYCLUSTERS = "/apis/ray.io/v1/namespaces/{namespace}/rayclusters"
PODS = "/api/v1/namespaces/{namespace}/pods"
EVENTS = "/api/v1/namespaces/{namespace}/events"
TIMEOUT_S = 30.0


class ServerCalls:
    """Requests to one namespace of the API server behind `api_client`. `answers`
    counts every answer by (method, what, status code), `what` being the resource
    path with the namespace and object names left out (`pods/status`, `rayclusters`)."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.answers: Counter[tuple[str, str, int]] = Counter()

    # --- paths -------------------------------------------------------------------------

    def raycluster_path(self, name: str = "", subresource: str = "") -> str:
        return _join(RAYCLUSTERS.format(namespace=self.namespace), name, subresource)

    def pod_path(self, name: str = "", subresource: str = "") -> str:
        return _join(PODS.format(namespace=self.namespace), name, subresource)

    def events_path(self) -> str:
        return EVENTS.format(namespace=self.namespace)

    # --- requests ------------------------------------------------------------------------

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        """The object (or list, or Status) the server answered with, for a 2xx; the
        error the status code means otherwise, with the server's message."""
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            query_params=query or [],
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=TIMEOUT_S)
        data = response.read()
        self.answers[(method, self._what(path), response.status)] += 1
        try:
            answer: dict[str, Any] = json.loads(data) if data else {}
        except ValueError:
            answer = {"message": data.decode(errors="replace")}
        if 200 <= response.status <= 299:
            return answer
        raise error_of(response.status, f"{method} {path}", answer)

    def get(self, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        return self.send("GET", path, query=query)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.send("POST", path, body)

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.send("PUT", path, body)

    def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        return self.send("PATCH", path, operations, JSON_PATCH)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.send("PATCH", path, patch, MERGE_PATCH)

    def delete(
        self, path: str, grace_period_s: int | None = None, uid: str | None = None
    ) -> dict[str, Any]:
        """DELETE with the object's own grace period, or `grace_period_s` (0: at once,
        as the kubelet deletes a pod whose containers have stopped); `uid`: only that
        object (409 if the name is another's now), as the kubelet's delete is."""
        options: dict[str, Any] = {}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        return self.send("DELETE", path, options or None)

    def conflicts(self) -> int:
        """409s answered so far, to any request."""
        return sum(n for (_, _, status), n in self.answers.items() if status == 409)

    def _what(self, path: str) -> str:
        """`rayclusters`, `rayclusters/status`, `pods`, `pods/binding`, `events`..."""
        parts = path.split("/namespaces/", 1)[-1].split("/")[1:]
        return "/".join([parts[0], *parts[2:]]) if parts else path


def error_of(status: int, what: str, answer: dict[str, Any]) -> ApiError:
    """The error a refused request means, carrying the server's reason and message."""
    detail = f"{what}: {status} {answer.get('reason', '')}: {answer.get('message', '')}"
    error: ApiError
    if status == 404:
        error = NotFound(detail)
    elif status == 409:
        error = Conflict(detail)
    elif status in (400, 422):
        error = Rejected(detail)
    elif status == 429 or status >= 500:
        error = Unavailable(detail)
    else:
        error = ApiError(detail)
    error.status = status
    return error


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)
