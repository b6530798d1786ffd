"""What a watch on the simulated API server delivers, as kube-apiserver 1.20's watch
cache delivers it: every change the store makes to a pod or a RayCluster is an event
(ADDED, MODIFIED, DELETED) carrying the object at its new resourceVersion; a watch from
a version gets the events after it that its namespace and label selector admit, then
the live ones until its timeout; a watch from "0" or no version starts with an ADDED
for each stored object; one from a version the record no longer reaches gets an ERROR
event, 410 Expired, as the watch cache answers."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tpu_autoscaler.controlplane import label_selectors
from tpu_autoscaler.controlplane.apiserver_replies import Reply, error, status_body
from tpu_autoscaler.controlplane.store import ObjectStore

CAPACITY = 1000
"""Events kept (the watch cache's window): a watch from further back is expired."""

DEFAULT_TIMEOUT_S = 1800.0
"""A watch without `timeoutSeconds` ends after this long (kube-apiserver's
--min-request-timeout; it picks a random time up to twice that)."""

RESOURCES = {"Pod": "pods", "RayCluster": "rayclusters", "RayCluster/status": "rayclusters"}


@dataclass(frozen=True)
class Event:
    version: int
    type: str
    resource: str
    obj: dict[str, Any]
    """The stored object itself: the store never changes one in place."""


class WatchLog:
    """The events of `store` from now on (its watcher), the newest `CAPACITY` kept; the
    caller holds the store's lock when the store changes and when opening a watch."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._events: list[Event] = []
        self._dropped = 0
        """Events no longer kept; `_events[i]` is event number `_dropped + i`."""
        self._floor = store.version
        """The newest version whose events are not all kept: a watch starts after it."""
        self._known = {("pods", *key) for key in store.pod_keys()}
        self._known |= {("rayclusters", *key) for key in store.raycluster_keys()}
        self._changed = threading.Condition()
        self._closed = False
        store.watchers.append(self._heard)

    def _heard(self, kind: str, obj: dict[str, Any]) -> None:
        resource = RESOURCES.get(kind)
        if resource is None:
            return
        meta = obj["metadata"]
        key = (resource, meta["namespace"], meta["name"])
        if resource == "pods" and self.store.pod(meta["namespace"], meta["name"]) is not obj:
            kind_of_change = "DELETED"
            self._known.discard(key)
        elif key in self._known:
            kind_of_change = "MODIFIED"
        else:
            kind_of_change = "ADDED"
            self._known.add(key)
        event = Event(int(meta["resourceVersion"]), kind_of_change, resource, obj)
        with self._changed:
            self._events.append(event)
            if len(self._events) > CAPACITY:
                self._floor = self._events.pop(0).version
                self._dropped += 1
            self._changed.notify_all()

    def close(self) -> None:
        """End every watch, for good (the server stops; a stopped one is not restarted)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def open(
        self, resource: str, namespace: str, query: dict[str, list[str]]
    ) -> Reply | Iterator[dict[str, Any]]:
        """A watch of `resource` in `namespace` as `query` asks (`resourceVersion`,
        `labelSelector`, `timeoutSeconds`): its events, one by one as they come."""
        try:
            requirements = label_selectors.parse(query.get("labelSelector", [""])[0])
            timeout_s = float(query.get("timeoutSeconds", [DEFAULT_TIMEOUT_S])[0])
            since = query.get("resourceVersion", [""])[0]
            version = int(since) if since not in ("", "0") else None
        except ValueError as exc:
            return error(400, str(exc))

        def admits(event: Event) -> bool:
            meta = event.obj["metadata"]
            return (
                event.resource == resource
                and meta.get("namespace") == namespace
                and all(r.matches(meta.get("labels") or {}) for r in requirements)
            )

        with self._changed:
            position = self._dropped + len(self._events)
            if version is None:
                first = [Event(0, "ADDED", resource, o) for o in self._stored(resource, namespace)]
            elif version < self._floor:
                message = f"too old resource version: {version} ({self._floor})"
                expired = status_body(410, message, "Expired")
                return iter([{"type": "ERROR", "object": expired}])
            else:
                after = (i for i, e in enumerate(self._events) if e.version > version)
                position = self._dropped + next(after, len(self._events))
                first = []
        return self._stream([e for e in first if admits(e)], position, admits, timeout_s)

    def _news_after(self, position: int) -> bool:
        return self._closed or self._dropped + len(self._events) > position

    def _stored(self, resource: str, namespace: str) -> list[dict[str, Any]]:
        if resource == "pods":
            return self.store.select_pods(namespace, lambda labels: True)
        return self.store.list_rayclusters(namespace)

    def _stream(
        self,
        first: list[Event],
        position: int,
        admits: Callable[[Event], bool],
        timeout_s: float,
    ) -> Iterator[dict[str, Any]]:
        for event in first:
            yield {"type": event.type, "object": event.obj}
        deadline = time.monotonic() + timeout_s
        while True:
            with self._changed:
                self._changed.wait_for(
                    functools.partial(self._news_after, position),
                    max(0.0, deadline - time.monotonic()),
                )
                if self._closed:
                    return
                start = max(0, position - self._dropped)
                fresh = self._events[start:]
                position = self._dropped + len(self._events)
            for event in fresh:
                if admits(event):
                    yield {"type": event.type, "object": event.obj}
            if time.monotonic() >= deadline:
                return  # what came before the deadline is delivered, then the watch ends
