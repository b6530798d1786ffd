"""How the differential test (test_differential.py) sends a generated step to one
server, and what it keeps of the answers: each answer normalised as it is compared
(`differential.normalise`), the versions seen in order, each object's newest version
(the "current" guard); and the closing watch, read up to the ADDED event of an object
created after the sequence."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from tests.realkube.differential import Versions, allowed, normalise, watch_until
from tests.realkube.differential_steps import (
    KEYS,
    LAST,
    SPEC_CHANGES,
    STATUSES,
    VALUES,
    Guard,
    Selector,
)
from tests.realkube.endpoints import JSON, JSON_PATCH, Endpoint, pod, raycluster


@dataclass
class Side:
    """A server under test and what the test has seen on it."""

    endpoint: Endpoint
    versions: Versions = field(default_factory=Versions)
    newest: dict[str, str] = field(default_factory=dict)
    """Each object's newest resourceVersion seen ("kind/name")."""
    answers: list[Any] = field(default_factory=list)

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        answer = self.endpoint.request(method, path, body, content_type, query)
        self._remember(answer.body)
        self.answers.append(allowed(normalise((answer.status, answer.body), self.versions)))
        return answer.body

    def _remember(self, body: Any) -> None:
        objects = body.get("items", [body]) if isinstance(body, dict) else []
        for obj in objects:
            meta = obj.get("metadata") or {}
            if obj.get("kind") in ("Pod", "RayCluster") and "resourceVersion" in meta:
                self.newest[f"{obj['kind']}/{meta['name']}"] = meta["resourceVersion"]

    def guard(self, guard: Guard, key: str) -> str | None:
        kind, index = guard
        if kind == "current":
            return self.newest.get(key, "1")
        if kind == "seen":
            seen = self.versions.seen
            return seen[index % len(seen)] if seen else "1"
        return "" if kind == "empty" else None

    def pods(self) -> str:
        return self.endpoint.pods_path()

    def clusters(self) -> str:
        return f"/apis/ray.io/v1/namespaces/{self.endpoint.namespace}/rayclusters"


def run(side: Side, step: tuple[Any, ...]) -> None:
    verb, name, *rest = step
    namespace = side.endpoint.namespace
    if verb == "create_cluster":
        obj = raycluster(namespace)
        obj["metadata"]["name"] = name
        side.send("POST", side.clusters(), obj)
    elif verb == "create_pod":
        pod_labels, bound, grace = rest
        obj = pod(namespace, name, pod_labels, "node-1" if bound else None)
        if grace is not None:
            obj["spec"]["terminationGracePeriodSeconds"] = grace
        side.send("POST", side.pods(), obj)
    elif verb == "get_cluster":
        side.send("GET", f"{side.clusters()}/{name}")
    elif verb == "get_pod":
        side.send("GET", f"{side.pods()}/{name}")
    elif verb == "list_pods":
        side.send("GET", side.pods(), query=[] if name is None else [("labelSelector", name.text)])
    elif verb == "patch":
        content_type, change, guard = rest
        path, value = SPEC_CHANGES[change]
        version = side.guard(guard, f"RayCluster/{name}")
        body = _patch(content_type, path, value, version)
        side.send("PATCH", f"{side.clusters()}/{name}", body, content_type)
    elif verb == "status":
        how, status, guard = rest
        version = side.guard(guard, f"RayCluster/{name}")
        target = f"{side.clusters()}/{name}/status"
        if how == "PUT":
            obj = side.send("GET", target)
            if obj.get("kind") != "RayCluster":  # not found: a RayCluster all the same
                obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}}
            obj["status"] = copy.deepcopy(STATUSES[status])
            _set_version(obj, version)
            side.send("PUT", target, obj)
        else:
            body = _patch(how, "/status", STATUSES[status], version)
            side.send("PATCH", target, body, how)
    elif verb == "delete_pod":
        grace, guard = rest
        options: dict[str, Any] = {}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        version = side.guard(guard, f"Pod/{name}")
        if version is not None:
            options["preconditions"] = {"resourceVersion": version}
        side.send("DELETE", f"{side.pods()}/{name}", options)


def _patch(content_type: str, path: str, value: Any, version: str | None) -> Any:
    if content_type == JSON_PATCH:
        operations = [{"op": "add", "path": path, "value": value}]
        if version is not None:
            guard = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
            operations.insert(0, guard)
        return operations
    body: dict[str, Any] = {}
    target: Any = body
    *parents, last = path.strip("/").split("/")
    for part in parents:
        if part == "workerGroupSpecs":
            # A merge patch replaces a list whole: the example's groups, one changed.
            target = target.setdefault(part, raycluster("")["spec"][part])
        else:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    target[last] = value
    if version is not None:
        body.setdefault("metadata", {})["resourceVersion"] = version
    return body


def _set_version(obj: dict[str, Any], version: str | None) -> None:
    if version is None:
        obj["metadata"].pop("resourceVersion", None)
    else:
        obj["metadata"]["resourceVersion"] = version


def watch(side: Side, resource: str, since: int, selector: Selector | None) -> None:
    """After the sequence: a watch from the `since`-th version seen, read up to the ADDED
    event of an object created last (made to match `selector`)."""
    namespace = side.endpoint.namespace
    seen = side.versions.seen
    query = [("resourceVersion", seen[min(since, len(seen) - 1)] if seen else "0")]
    if resource == "pods":
        last_labels = _matching(selector)
        if last_labels is None:
            selector = None
        if selector is not None:
            query.append(("labelSelector", selector.text))
        side.send("POST", side.pods(), pod(namespace, LAST, last_labels or {}))
        path, kind = side.pods(), "Pod"
    else:
        obj = raycluster(namespace)
        obj["metadata"]["name"] = LAST
        side.send("POST", side.clusters(), obj)
        path, kind = side.clusters(), "RayCluster"
    events = watch_until(side.endpoint.api_client, path, query, (kind, LAST))
    side.answers.append(allowed(normalise(events, side.versions)))


def _matching(selector: Selector | None) -> dict[str, str] | None:
    """The first labels (over the keys and values steps use) that `selector` selects,
    None if none do."""
    options = [(None, *VALUES)] * (len(KEYS) + 1)
    for values in itertools.product(*options):
        candidate = {k: v for k, v in zip((*KEYS, "gone"), values, strict=True) if v is not None}
        if selector is None or selector.selects(candidate):
            return candidate
    return None
