"""How the simulated API server answers a request, as the Kubernetes API server answers
it: the REST paths it serves (a RayCluster's GET, POST and JSON and merge PATCH, its
status subresource, pods (`apiserver_pods`), watches (`apiserver_watch`), an Event's
POST, Events listed by field selector) against the `ObjectStore`, errors as `Status`
bodies with kube-apiserver's codes and `details`, and a patch applied to the stored
object, resourceVersion included, so that the version the patched object carries is
the precondition (409 when the object moved on, 422 when the patch removed it; a
failed `test` operation is 422)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

from tpu_autoscaler.adapters.kube.api import JSON_PATCH, Conflict, NotFound, Rejected
from tpu_autoscaler.controlplane import apiserver_pods
from tpu_autoscaler.controlplane.apiserver_replies import Reply, status_body
from tpu_autoscaler.controlplane.apiserver_watch import WatchLog
from tpu_autoscaler.controlplane.crd_errors import FieldError, GoLiteral, Invalid
from tpu_autoscaler.controlplane.json_patch import apply_operation
from tpu_autoscaler.controlplane.store import ObjectStore

MERGE_PATCH = "application/merge-patch+json"

_RAYCLUSTER = re.compile(r"/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters/([^/]+)(/status)?")
_RAYCLUSTERS = re.compile(r"/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters")
_PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods")
_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)")
_EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events")


def _raycluster_details(name: str) -> dict[str, Any]:
    """`details` of a NotFound or Conflict about a RayCluster (the qualified resource)."""
    return {"name": name, "group": "ray.io", "kind": "rayclusters"}


_OBJECT_META_STRINGS = {
    "name": "Name",
    "generateName": "GenerateName",
    "namespace": "Namespace",
    "selfLink": "SelfLink",
    "uid": "UID",
    "resourceVersion": "ResourceVersion",
}
"""The string fields of an ObjectMeta, by JSON name: the Go field each decodes into."""


def _undecodable_metadata(patched: dict[str, Any]) -> Reply | None:
    """kube-apiserver decodes a patched custom resource's metadata into an ObjectMeta;
    a string field holding another JSON type fails that decoding, and the patch is
    refused as 422 Invalid on the field `patch`, quoting the patched object and the
    decoder's error (observed on kube-apiserver 1.20.2, tests/realkube). The quoted
    error keeps json-iterator's words, not its byte offsets."""
    meta = patched["metadata"]
    for key, field in _OBJECT_META_STRINGS.items():
        value = meta.get(key)
        if value is None or isinstance(value, str):
            continue
        found = json.dumps(value)[0]
        quoted = json.dumps(json.dumps(patched, sort_keys=True, separators=(",", ":")))
        cause = (
            f'Invalid value: {quoted}: v1.ObjectMeta.{field}: ReadString: expects " or n, '
            f"but found {found}"
        )
        return Reply(
            422,
            status_body(
                422,
                f' "" is invalid: patch: {cause}',
                None,
                {"causes": [{"reason": "FieldValueInvalid", "message": cause, "field": "patch"}]},
            ),
        )
    return None


class Routes:
    """The API's paths over `store`; the caller holds whatever lock guards the store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._names = 0
        self.watches = WatchLog(store)

    def route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        content_type: str,
        body: bytes,
    ) -> Reply | Iterator[dict[str, Any]]:
        """The reply, or for a watch its events as they come (to be read without the
        store's lock)."""
        try:
            if match := _RAYCLUSTER.fullmatch(path):
                namespace, name, status = match.groups()
                try:
                    if method == "GET":
                        return Reply(200, self.store.get_raycluster(namespace, name))
                    if method == "PATCH":
                        return self._patch_raycluster(
                            namespace, name, content_type, body, status=bool(status)
                        )
                    if method == "PUT" and status:
                        return self._put_status(namespace, name, body)
                except NotFound:
                    message = f'rayclusters.ray.io "{name}" not found'
                    return Reply(404, status_body(404, message, None, _raycluster_details(name)))
            elif match := _RAYCLUSTERS.fullmatch(path):
                if method == "GET" and _watching(query):
                    return self.watches.open("rayclusters", match.group(1), query)
                if method == "POST":
                    return self._create(match.group(1), body, "rayclusters.ray.io")
            elif match := _PODS.fullmatch(path):
                if method == "GET" and _watching(query):
                    return self.watches.open("pods", match.group(1), query)
                if method == "GET":
                    selector = query.get("labelSelector", [""])[0]
                    return apiserver_pods.list_pods(self.store, match.group(1), selector)
                if method == "POST":
                    return self._create(match.group(1), body, "pods")
            elif match := _POD.fullmatch(path):
                namespace, name = match.groups()
                if method == "GET":
                    return apiserver_pods.get_pod(self.store, namespace, name)
                if method == "DELETE":
                    return apiserver_pods.delete_pod(self.store, namespace, name, query, body)
            elif match := _EVENTS.fullmatch(path):
                if method == "POST":
                    return self._create_event(match.group(1), body)
                if method == "GET":
                    return self._list_events(match.group(1), query)
            else:
                message = "the server could not find the requested resource"
                return Reply(404, status_body(404, message))
        except Invalid as exc:
            return Reply(422, status_body(422, str(exc), None, exc.details()))
        except Rejected as exc:
            return Reply(422, status_body(422, str(exc)))
        return Reply(405, status_body(405, f"{method} is not supported on {path}"))

    def _patch_raycluster(
        self, namespace: str, name: str, content_type: str, body: bytes, status: bool = False
    ) -> Reply:
        """The patch applied to the stored object, its resourceVersion included, as
        kube-apiserver's patcher applies it: the version the patched object carries is
        the precondition (another is a 409, none at all a 422: a custom resource allows
        no unconditional update); a patch that leaves it alone is guarded by the
        version it was applied to."""
        media_type = content_type.split(";")[0].strip()
        if media_type not in (JSON_PATCH, MERGE_PATCH):
            message = (
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}"
            )
            return Reply(415, status_body(415, message))
        try:
            patch = json.loads(body)
        except ValueError as exc:
            return Reply(400, status_body(400, f"invalid JSON patch: {exc}"))
        current = self.store.get_raycluster(namespace, name)
        if media_type == MERGE_PATCH:
            patched = merge_patch(current, patch)
        else:
            if not isinstance(patch, list) or not all(isinstance(o, dict) for o in patch):
                return Reply(400, status_body(400, "a JSON patch is a list of operations"))
            patched = copy.deepcopy(current)
            try:
                for operation in patch:
                    apply_operation(patched, operation)
            except (Rejected, Conflict) as exc:
                # A failed `test` too: 422, not 409 (the version has not been compared).
                return Reply(422, status_body(422, str(exc), None, {}))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                message = f"the JSON patch does not apply: {exc!r}"
                return Reply(422, status_body(422, message, None, {}))
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            return Reply(422, status_body(422, "the patched object has no metadata", None, {}))
        undecodable = _undecodable_metadata(patched)
        if undecodable is not None:
            return undecodable
        return self._update(namespace, name, patched, status)

    def _put_status(self, namespace: str, name: str, body: bytes) -> Reply:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            return Reply(400, status_body(400, f"invalid JSON: {exc}"))
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            return Reply(400, status_body(400, "a RayCluster is a JSON object"))
        obj.setdefault("metadata", {})
        return self._update(namespace, name, obj, status=True)

    def _update(self, namespace: str, name: str, patched: dict[str, Any], status: bool) -> Reply:
        """Store `patched` (the main resource, or with `status` only its status) if the
        resourceVersion it carries is the stored one."""
        self.store.get_raycluster(namespace, name)  # 404 first, as GuaranteedUpdate reads it
        version = patched["metadata"].get("resourceVersion")
        if not version:
            raise Invalid(
                name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        "Invalid value",
                        GoLiteral("0x0"),
                        "must be specified for an update",
                    )
                ],
                group="ray.io",
                kind="rayclusters",
            )
        try:
            if status:
                return Reply(200, self.store.replace_raycluster_status(namespace, name, patched))
            return Reply(200, self.store.update_raycluster(namespace, name, patched))
        except Conflict:
            return Reply(409, status_body(409, _conflict(name), None, _raycluster_details(name)))

    def _create(self, namespace: str, body: bytes, resource: str) -> Reply:
        """POST of a RayCluster or a Pod: stored as the store creates it (admitted,
        defaulted), 201; a taken name is 409 AlreadyExists."""
        try:
            obj = json.loads(body)
        except ValueError as exc:
            return Reply(400, status_body(400, f"invalid JSON: {exc}"))
        if not isinstance(obj, dict) or not isinstance(obj.setdefault("metadata", {}), dict):
            return Reply(400, status_body(400, "the object is not a JSON object"))
        meta = obj["metadata"]
        if meta.setdefault("namespace", namespace) != namespace:
            message = "the namespace of the object does not match the namespace of the request"
            return Reply(400, status_body(400, message))
        name = str(meta.get("name") or "")
        kind, _, group = resource.partition(".")
        details: dict[str, Any] = {"name": name, "group": group, "kind": kind}
        if not group:
            del details["group"]
        try:
            if group:
                created = self.store.create_raycluster(obj)
            else:
                if not name:
                    return Reply(422, status_body(422, "metadata.name: Required value"))
                created = self.store.create_pod(obj)
        except Conflict:
            message = f'{resource} "{name}" already exists'
            taken = self.store.pod(namespace, name) if not group else None
            if taken is not None and taken["metadata"].get("deletionTimestamp"):
                message = f"object is being deleted: {message}"  # storage's own words
            return Reply(409, status_body(409, message, "AlreadyExists", details))
        return Reply(201, created)

    def _create_event(self, namespace: str, body: bytes) -> Reply:
        try:
            event = json.loads(body)
        except ValueError as exc:
            return Reply(400, status_body(400, f"invalid JSON: {exc}"))
        if not isinstance(event, dict):
            return Reply(400, status_body(400, "an Event is a JSON object"))
        meta = event.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            message = "the namespace of the object does not match the namespace of the request"
            return Reply(400, status_body(400, message))
        generated = bool(meta.get("generateName"))
        if not meta.get("name"):
            if not generated:
                return Reply(422, status_body(422, "metadata.name: Required value"))
            self._names += 1
            meta["name"] = f"{meta['generateName']}{self._names:05d}"
        taken = any(
            e["metadata"].get("name") == meta["name"] and e["metadata"]["namespace"] == namespace
            for e in self.store.events
        )
        if taken and generated:
            # rest.CheckGeneratedNameError: with a generateName, a taken name is a
            # ServerTimeout ("try again"), whether the name was generated or given.
            message = (
                "The POST operation against Event could not be completed at this time, "
                "please try again."
            )
            details = {"name": "POST", "kind": "Event"}
            return Reply(500, status_body(500, message, "ServerTimeout", details))
        if taken:
            message = f'events "{meta["name"]}" already exists'
            details = {"name": meta["name"], "kind": "events"}
            return Reply(409, status_body(409, message, "AlreadyExists", details))
        self.store.create_event(namespace, event)
        return Reply(201, self.store.events[-1])

    def _list_events(self, namespace: str, query: dict[str, list[str]]) -> Reply:
        try:
            items = self.store.list_events(namespace, query.get("fieldSelector", [""])[0])
        except ValueError as exc:
            return Reply(400, status_body(400, str(exc)))
        items = [{k: v for k, v in e.items() if k not in ("apiVersion", "kind")} for e in items]
        meta = {"resourceVersion": str(self.store.version)}
        return Reply(
            200, {"apiVersion": "v1", "kind": "EventList", "metadata": meta, "items": items}
        )


def _watching(query: dict[str, list[str]]) -> bool:
    return query.get("watch", [""])[0] in ("1", "true")


def _conflict(name: str) -> str:
    return (
        f'Operation cannot be fulfilled on rayclusters.ray.io "{name}": the object '
        "has been modified; please apply your changes to the latest version and try again"
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (evanphx/json-patch's MergePatch): objects merge
    member by member, a null removes a member, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
