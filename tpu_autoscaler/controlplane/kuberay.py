"""When does the KubeRay operator (v1.7.0) reconcile a RayCluster, and what does one
reconcile do, step by step? Read from its `raycluster_controller.go`
(`rayClusterReconcile`, `calculateStatus`) and controller-runtime's requeues.

One reconcile runs at a time and takes time: every API call it makes is a step on the
event queue, so other clients (the autoscaler) read the cluster between them. It
treats the worker groups in the spec's order (`controlplane/kuberay_groups.py`: which
pods each group deletes and creates). A spec KubeRay's own validation refuses
(`controlplane/kuberay_validation.py`) gets a Warning Event and nothing else until it
changes. KubeRay clears `workersToDelete` in memory only and never writes it back. It
reads `numOfHosts` and the replica counts from the spec, never the TPU topology. After
the groups it computes the status (`controlplane/kuberay_status.py`) and, if the
counts or conditions changed, updates the status subresource guarded by the version it
read. A reconcile that ended in an error is retried after the controller's exponential
backoff (5 ms doubling); one that changed the status after 2 s; any other after
`requeue_s`. Reconciles are triggered by spec changes of the RayCluster (not status
writes) and by any change of its pods.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.kuberay_groups import (
    GroupReconciler,
    PodsDeleted,
    ReplicaCreated,
    Requeue,
)
from tpu_autoscaler.controlplane.kuberay_status import status_from_counts, worker_counts
from tpu_autoscaler.controlplane.kuberay_validation import InvalidRayCluster, reconcile_verdict
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import REALISTIC, WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell.events import cluster_event

STATUS_REQUEUE_S = 2.0
"""KubeRay's `DefaultRequeueDuration`, after a reconcile that changed the status."""
OPERATOR_COMPONENT = "raycluster-controller"
"""The Event source KubeRay's recorder reports."""
ERROR_BACKOFF_BASE_S = 0.005
ERROR_BACKOFF_CAP_S = 1000.0
"""controller-runtime's per-item exponential failure rate limiter."""


class KubeRayOperator:
    """The operator of one RayCluster: what queues a reconcile, one reconcile at a
    time as steps on the event queue, the status it writes and when it requeues."""

    def __init__(
        self,
        store: ObjectStore,
        events: EventQueue,
        namespace: str,
        name: str,
        multi_host_indexing: bool = True,
        on_replica_created: ReplicaCreated | None = None,
        on_pods_deleted: PodsDeleted | None = None,
        world: WorldModel = REALISTIC,
    ) -> None:
        self.store = store
        self.events = events
        self.namespace = namespace
        self.name = name
        self.world = world
        self.groups = GroupReconciler(
            store,
            events,
            namespace,
            name,
            multi_host_indexing,
            world,
            on_replica_created,
            on_pods_deleted,
        )
        self.reconciles = 0
        self.errors: deque[str] = deque(maxlen=1000)
        """The latest reconcile errors, as KubeRay logs them."""
        self._running = False
        self._again = False
        self._scheduled_at: float | None = None
        self._failures = 0
        self._invalid_reported: str | None = None
        self._shapes_of: tuple[int | None, dict[str, SliceShape]] | None = None
        self._verdict_of: tuple[tuple[object, ...], InvalidRayCluster | None] | None = None
        self._counts_of: tuple[dict[str, Any], tuple[int, int, int]] | None = None

    @property
    def creating(self) -> set[str]:
        """Replicas (or, gate off, pods) whose pods are being created right now."""
        return self.groups.creating

    @property
    def deleting(self) -> set[str]:
        """Pods being deleted right now, one call at a time."""
        return self.groups.deleting

    # --- triggers -------------------------------------------------------------------

    def on_store_change(self, kind: str, obj: dict[str, Any]) -> None:
        """A store watcher: spec changes of the RayCluster and any change of a pod of
        this cluster queue a reconcile (KubeRay's predicates); status writes do not."""
        if kind == "RayCluster" or (
            kind == "Pod" and obj["metadata"].get("labels", {}).get(labels.KUBERAY_CLUSTER)
        ):
            self.request(0.0)

    def request(self, delay_s: float) -> None:
        """Queue a reconcile in `delay_s` (an earlier queued one absorbs it)."""
        if self._running:
            self._again = True
            return
        at_s = self.events.now_s + delay_s
        if self._scheduled_at is not None and self._scheduled_at <= at_s + 1e-9:
            return
        self._scheduled_at = at_s
        self.events.at(at_s, lambda: self._start(at_s))

    def reconcile(self) -> None:
        """Reconcile now (a test's or a caller's nudge); with an ideal world it has
        finished on return."""
        if self._running:
            self._again = True
            return
        self._start(None)

    def _start(self, scheduled_at: float | None) -> None:
        if scheduled_at is not None:
            if self._scheduled_at != scheduled_at:
                return  # superseded by an earlier one
            self._scheduled_at = None
        if self._running:
            self._again = True
            return
        self._running = True
        self.reconciles += 1
        self._advance(self._reconcile())

    def _advance(self, steps: Iterator[float]) -> None:
        """Run the reconcile's steps until one waits on an API call's latency."""
        while True:
            try:
                delay_s = next(steps)
            except StopIteration:
                return
            if delay_s > 0:
                self.events.after(delay_s, lambda: self._advance(steps))
                return

    def _finish(self, error: str | None, status_changed: bool) -> None:
        self._running = False
        if error is not None:
            self.errors.append(error)
            self._failures += 1
        else:
            self._failures = 0
        if self._again:
            self._again = False
            self.request(0.0)
        elif error is not None:
            self.request(min(ERROR_BACKOFF_CAP_S, ERROR_BACKOFF_BASE_S * 2 ** (self._failures - 1)))
        elif status_changed:
            self.request(STATUS_REQUEUE_S)
        elif self.world.requeue_s > 0:
            self.request(self.world.requeue_s)

    # --- one reconcile -----------------------------------------------------------------

    def _reconcile(self) -> Iterator[float]:
        # The stored version, read-only: a write stores a new one, so this one stays
        # what the reconcile read while its calls take time.
        raycluster = self.store.raycluster(self.namespace, self.name)
        invalid = self._verdict(raycluster)
        if invalid is not None:
            self._refuse(raycluster, invalid)
            return
        self._invalid_reported = None
        read_version = raycluster["metadata"]["resourceVersion"]
        shapes = self._shapes(raycluster)
        error: str | None = None
        try:
            for spec in raycluster["spec"].get("workerGroupSpecs", []):
                yield from self.groups.reconcile(spec, shapes.get(spec["groupName"]))
        except Requeue as exc:
            error = str(exc)
        except ApiError as exc:
            error = f"{type(exc).__name__}: {exc}"
        status_changed = False
        if self.world.status_writes:
            pods = self.groups.cache
            status = status_from_counts(
                raycluster,
                pods.ready_workers,
                pods.running_workers,
                error,
                self.events.now_s,
                self._worker_counts(raycluster["spec"]),
            )
            if status != raycluster.get("status"):
                status_changed = True
                yield self.world.api_call_latency_s
                try:
                    self.store.write_raycluster_status(
                        self.namespace, self.name, status, read_version
                    )
                except ApiError as exc:
                    error = error or f"Error updating status: {exc}"
        self._finish(error, status_changed)

    def _refuse(self, raycluster: dict[str, Any], invalid: InvalidRayCluster) -> None:
        """KubeRay's answer to a spec its own validation refuses: a Warning Event, no
        pod touched, no status written, no requeue (the next change reconciles)."""
        if invalid.message != self._invalid_reported:
            event = cluster_event(
                raycluster, invalid.reason, invalid.message, "Warning", self.events.now_s
            )
            event["source"] = {"component": OPERATOR_COMPONENT}
            event["reportingComponent"] = OPERATOR_COMPONENT
            event["action"] = invalid.action
            self.store.create_event(self.namespace, event)
            self._invalid_reported = invalid.message
        self.errors.append(invalid.message)
        self._running = False
        if self._again:
            self._again = False
            self.request(0.0)

    def _verdict(self, raycluster: dict[str, Any]) -> InvalidRayCluster | None:
        """`reconcile_verdict`, made again only when what it reads changed: the spec,
        the name, namespace and annotations. Stored objects are never changed in place
        (a write stores a new version, sharing the parts it left), so the same objects
        hold the same values; they are held here, so their ids are not reused. A
        reconcile runs on every pod change and a status write keeps the spec: checking
        it all again each time was most of a reconcile."""
        meta = raycluster.get("metadata") or {}
        read = (raycluster.get("spec"), meta.get("annotations"))
        named = (meta.get("name", ""), meta.get("namespace", ""))
        known = self._verdict_of
        if (
            known is not None
            and all(a is b for a, b in zip(known[0][:2], read, strict=True))
            and known[0][2:] == named
        ):
            return known[1]
        verdict = reconcile_verdict(raycluster)
        self._verdict_of = ((*read, *named), verdict)
        return verdict

    def _worker_counts(self, spec: dict[str, Any]) -> tuple[int, int, int]:
        """`worker_counts` of `spec`, counted again only for another spec object (a
        status write keeps the spec; stored objects are never changed in place)."""
        if self._counts_of is None or self._counts_of[0] is not spec:
            self._counts_of = (spec, worker_counts(spec))
        return self._counts_of[1]

    def _shapes(self, raycluster: dict[str, Any]) -> dict[str, SliceShape]:
        """The groups' shapes, derived again only when the spec changed (a reconcile
        runs on every pod change; the spec's generation moves only with the spec)."""
        generation = raycluster["metadata"].get("generation")
        if self._shapes_of is None or self._shapes_of[0] != generation or generation is None:
            derived = derive_shapes(parse_raycluster(raycluster, "operator")).shapes
            self._shapes_of = (generation, {s.group: s for s in derived})
        return self._shapes_of[1]
