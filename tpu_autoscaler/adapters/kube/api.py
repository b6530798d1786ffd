"""The Kubernetes API as the autoscaler uses it: read its RayCluster, its pods and the
Events about pods, patch the RayCluster, record Events. The production client (`client.py`) and the
simulator's object store both provide it, and both raise the errors below, so the
shell handles a conflict or an outage the same way in tests and in production."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

JsonPatch = list[dict[str, Any]]
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
"""The media type of an RFC 6902 patch, as requests carry it."""


class ApiError(Exception):
    """A request the API server refused or never answered; `status` as HTTP has it."""

    status = 500
    transient = False
    """Worth retrying unchanged: a 5xx, a timeout, a dropped connection."""


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """The object changed since the resourceVersion the writer read: re-read, re-plan."""

    status = 409


class Rejected(ApiError):
    """Admission or validation refused the object (the TPU webhook, the schema)."""

    status = 422


class Unavailable(ApiError):
    """5xx, timeout or dropped connection, still so after the client's retries. A
    write that ends so may or may not have been applied: only a re-read tells."""

    status = 503
    transient = True


class PodList(list[dict[str, Any]]):
    """A pod list that can tell which pods changed since an earlier list of the same
    selection from the same server: what a watch started at the earlier list's
    resourceVersion would have delivered, each pod's name in the order its changes
    came and whether it is listed after that change (created or written: True;
    deleted: False). `log` is the server's record of that selection's changes,
    shared by the lists it hands out, and `at` how much of it this list has seen.
    The simulated store gives these (`ObjectStore.list_pods`); a client decoding
    every answer afresh gives a plain list, and its readers walk every pod."""

    __slots__ = ("at", "log")

    def __init__(self, pods: Iterable[dict[str, Any]], log: list[tuple[str, bool]], at: int):
        super().__init__(pods)
        self.log = log
        self.at = at

    def changed_since(self, before: object) -> list[tuple[str, bool]] | None:
        """The changes from `before` to this list, or None if `before` is no earlier
        list of the same record (another selection, or the server began a new record:
        then every pod is to be looked at)."""
        if not isinstance(before, PodList) or before.log is not self.log or before.at > self.at:
            return None
        return self.log[before.at : self.at]


class KubeApi(Protocol):
    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]: ...

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The pods `selector` selects, by name. A listed pod is never changed in place
        afterwards (a changed pod is listed as a new object): the readers keep what
        they made of a pod by the object (`Observer`). A client decoding every answer
        afresh keeps this; so does the simulated store (`ObjectStore._writable_pod`).
        The list may be a `PodList`, which also tells what changed since an earlier
        one."""
        ...

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        """Apply an RFC 6902 patch, all or nothing, only if the object is still at
        `resource_version` (None: unconditionally); Conflict otherwise."""
        ...

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        """Record a core/v1 Event (as built by `tpu_autoscaler.shell.events`)."""
        ...

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The namespace's core/v1 Events that `field_selector` selects
        (`involvedObject.kind=Pod`), as the API serves them."""
        ...

    def resize_pod(self, namespace: str, name: str, operations: JsonPatch) -> dict[str, Any]:
        """Apply a JSON patch to the pod's `resize` subresource (in-place resize of
        its containers' resources). NotFound where the server has no such subresource
        (Kubernetes < 1.33) as for a missing pod."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into the pod's (a JSON merge patch)."""
        ...
