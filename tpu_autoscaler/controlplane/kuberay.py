"""The KubeRay operator (v1.7.0) as it treats worker groups, read from its
`raycluster_controller.go` (`reconcilePods`, `reconcileMultiHostWorkerGroup`,
`calculateStatus`) and `expectations/scale_expectations.go`.

One reconcile runs at a time and takes time: every API call it makes is a step on the
event queue, so other clients (the autoscaler) read the cluster between them. Per
worker group, in KubeRay's order:
- the group is skipped while its scale expectations are unmet (a pod it deleted is
  still listed, terminating);
- with RayMultiHostIndexing on and numOfHosts > 1: a replica with fewer pods than
  numOfHosts (terminating ones count) is deleted whole and the reconcile ends with an
  error (requeue); a replica with a Failed or Succeeded pod is deleted whole; a pod
  named in `workersToDelete` deletes its whole replica and the reconcile ends with an
  error; then `replicas - valid replicas` new replicas are created, lowest free
  replica index first, one pod POST at a time, named `<group>-<5 random>` and
  `<cluster>-<group>-worker-<5 random>`;
- otherwise (single-host groups, or the gate off): Failed pods are deleted (and the
  reconcile ends), named pods are deleted one by one, and `replicas x numOfHosts -
  pods` new pods are created one at a time: with the gate off nothing is atomic.
A spec KubeRay's own validation refuses (`controlplane/kuberay_validation.py`) gets a Warning
Event and nothing else until it changes. KubeRay clears `workersToDelete` in memory
only and never writes it back. It reads
`numOfHosts` and the replica counts from the spec, never the TPU topology. After the
groups it computes the status and, if the counts or conditions changed, updates the
status subresource guarded by the version it read. A reconcile that ended in an error
is retried after the controller's exponential backoff (5 ms doubling); one that
changed the status after 2 s; any other after `requeue_s`. Reconciles are triggered
by spec changes of the RayCluster (not status writes) and by any change of its pods.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError
from tpu_autoscaler.controlplane import admitted_pod as objects
from tpu_autoscaler.controlplane import kuberay_pod
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.kuberay_validation import InvalidRayCluster, reconcile_verdict
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import REALISTIC, WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell.events import cluster_event

ReplicaCreated = Callable[[str, str, list[str]], None]
"""Called with (group, replica name, pod names) once the operator created a replica's
last pod (with the gate off: each pod alone)."""

RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""What Kubernetes' `rand.String` (generateName, KubeRay's replica names) draws from."""
STATUS_REQUEUE_S = 2.0
"""KubeRay's `DefaultRequeueDuration`, after a reconcile that changed the status."""
OPERATOR_COMPONENT = "raycluster-controller"
"""The Event source KubeRay's recorder reports."""
ERROR_BACKOFF_BASE_S = 0.005
ERROR_BACKOFF_CAP_S = 1000.0
"""controller-runtime's per-item exponential failure rate limiter."""


class _Requeue(Exception):
    """KubeRay's reconcile ends with this error; the status records it."""


class KubeRayOperator:
    def __init__(
        self,
        store: ObjectStore,
        events: EventQueue,
        namespace: str,
        name: str,
        multi_host_indexing: bool = True,
        on_replica_created: ReplicaCreated | None = None,
        on_pods_deleted: Callable[[list[str], bool], None] | None = None,
        world: WorldModel = REALISTIC,
    ) -> None:
        self.store = store
        self.events = events
        self.namespace = namespace
        self.name = name
        self.multi_host_indexing = multi_host_indexing
        self.on_replica_created = on_replica_created
        self.on_pods_deleted = on_pods_deleted
        self.world = world
        self.replicas_created: dict[str, int] = defaultdict(int)
        self.creating: set[str] = set()
        """Replicas (or, gate off, pods) whose pods are being created right now."""
        self.reconciles = 0
        self.errors: deque[str] = deque(maxlen=1000)
        """The latest reconcile errors, as KubeRay logs them."""
        self._expected_deletions: dict[str, set[str]] = defaultdict(set)
        self._running = False
        self._again = False
        self._scheduled_at: float | None = None
        self._failures = 0
        self._invalid_reported: str | None = None
        self._shapes_of: tuple[int | None, dict[str, SliceShape]] | None = None

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
        raycluster = self.store.get_raycluster(self.namespace, self.name)
        invalid = reconcile_verdict(raycluster)
        if invalid is not None:
            self._refuse(raycluster, invalid)
            return
        self._invalid_reported = None
        read_version = raycluster["metadata"]["resourceVersion"]
        shapes = self._shapes(raycluster)
        error: str | None = None
        try:
            for spec in raycluster["spec"].get("workerGroupSpecs", []):
                group = spec["groupName"]
                if not self._expectations_met(group):
                    continue
                pods = self._group_pods(group)
                hosts = max(1, int(spec.get("numOfHosts") or 1))
                if self.multi_host_indexing and hosts > 1:
                    yield from self._multi_host_group(spec, shapes.get(group), hosts, pods)
                else:
                    yield from self._pod_group(spec, shapes.get(group), hosts, pods)
        except _Requeue as exc:
            error = str(exc)
        except ApiError as exc:
            error = f"{type(exc).__name__}: {exc}"
        status_changed = False
        if self.world.status_writes:
            status = self._status(raycluster, error)
            if status != raycluster.get("status"):
                status_changed = True
                yield self.world.api_call_latency_s
                try:
                    self.store.update_raycluster_status(
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

    def _shapes(self, raycluster: dict[str, Any]) -> dict[str, SliceShape]:
        """The groups' shapes, derived again only when the spec changed (a reconcile
        runs on every pod change; the spec's generation moves only with the spec)."""
        generation = raycluster["metadata"].get("generation")
        if self._shapes_of is None or self._shapes_of[0] != generation or generation is None:
            derived = derive_shapes(parse_raycluster(raycluster, "operator")).shapes
            self._shapes_of = (generation, {s.group: s for s in derived})
        return self._shapes_of[1]

    def _group_pods(self, group: str) -> list[dict[str, Any]]:
        return self.store.list_pods(
            self.namespace, {labels.KUBERAY_CLUSTER: self.name, labels.KUBERAY_GROUP: group}
        )

    def _expectations_met(self, group: str) -> bool:
        expected = self._expected_deletions[group]
        expected -= {n for n in expected if self.store.pod(self.namespace, n) is None}
        return not expected

    def _multi_host_group(
        self,
        spec: dict[str, Any],
        shape: SliceShape | None,
        hosts: int,
        pods: list[dict[str, Any]],
    ) -> Iterator[float]:
        group = spec["groupName"]
        replicas: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            replica = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
            if replica is not None:
                replicas[replica].append(pod)
        for replica, members in sorted(replicas.items()):
            if len(members) < hosts:
                yield from self._delete(group, members, requested=False)
                raise _Requeue(f"cleaned up incomplete replica group {replica}, requeueing")
        deleted: set[str] = set()
        for pod in pods:
            if pod["metadata"]["name"] in deleted or not _terminated(pod):
                continue
            doomed_replica = replicas.get(
                pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME, "")
            )
            if doomed_replica:
                members = doomed_replica
                yield from self._delete(group, members, requested=False)
                deleted |= {p["metadata"]["name"] for p in members}
        named = set(spec.get("scaleStrategy", {}).get("workersToDelete") or [])
        doomed = [
            p
            for members in replicas.values()
            if any(p["metadata"]["name"] in named for p in members)
            for p in members
        ]
        if doomed:
            yield from self._delete(group, doomed, requested=True)
            raise _Requeue(f"deleted {len(doomed)} worker Pods based on ScaleStrategy, requeueing")
        valid = {
            replica: members
            for replica, members in replicas.items()
            if not any(p["metadata"]["name"] in deleted for p in members)
        }
        used_indexes = {
            int(members[0]["metadata"]["labels"].get(labels.KUBERAY_REPLICA_INDEX, -1))
            for members in valid.values()
        }
        to_create = _desired_replicas(spec) - len(valid)
        if shape is None:
            return  # a shape the webhook would not admit pods for
        index = 0
        for _ in range(to_create):
            while index in used_indexes:
                index += 1
            used_indexes.add(index)
            replica = f"{group}-{self._random5()}"
            self.creating.add(replica)
            created = []
            try:
                for host in range(hosts):
                    yield self.world.pod_create_latency_s
                    created.append(self._create_pod(shape, index, host, replica))
            finally:
                self.creating.discard(replica)
            self._created(group, replica, created)

    def _pod_group(
        self,
        spec: dict[str, Any],
        shape: SliceShape | None,
        hosts: int,
        pods: list[dict[str, Any]],
    ) -> Iterator[float]:
        group = spec["groupName"]
        unhealthy = [p for p in pods if _terminated(p)]
        if unhealthy:
            yield from self._delete(group, unhealthy, requested=False)
            raise _Requeue(f"delete {len(unhealthy)} unhealthy worker Pods")
        named = set(spec.get("scaleStrategy", {}).get("workersToDelete") or [])
        doomed = [p for p in pods if p["metadata"]["name"] in named]
        yield from self._delete(group, doomed, requested=True)
        gone = {p["metadata"]["name"] for p in doomed}
        remaining = [p for p in pods if p["metadata"]["name"] not in gone]
        missing = _desired_replicas(spec) * hosts - len(remaining)
        if shape is None:
            return
        used_indexes = {
            int(p["metadata"]["labels"][labels.KUBERAY_REPLICA_INDEX])
            for p in remaining
            if labels.KUBERAY_REPLICA_INDEX in p["metadata"]["labels"]
        }
        index = 0
        for _ in range(missing):
            # `createWorkerPodWithIndex` with the gate on; with it off `createWorkerPod`,
            # which sets no index at all (the webhook then numbers the pod itself).
            while self.multi_host_indexing and index in used_indexes:
                index += 1
            used_indexes.add(index)
            yield self.world.pod_create_latency_s
            pod = self._create_pod(shape, index if self.multi_host_indexing else 0, 0, None)
            name = pod["metadata"]["name"]
            if not self.multi_host_indexing and shape.hosts_per_replica > 1:
                members = [
                    p
                    for p in self._group_pods(group)
                    if p["metadata"]["labels"].get(labels.WEBHOOK_REPLICA_INDEX)
                    == pod["metadata"]["labels"].get(labels.WEBHOOK_REPLICA_INDEX)
                ]
                if len(members) < shape.hosts_per_replica:
                    continue  # GKE provisions a slice once all its pods exist
                self._created(group, name, [p["metadata"]["name"] for p in members])
            else:
                self._created(group, name, [name])

    # --- API calls -------------------------------------------------------------------

    def _create_pod(
        self, shape: SliceShape, replica_index: int, host: int, replica: str | None
    ) -> dict[str, Any]:
        """`createWorkerPodWithIndex`: the pod `buildWorkerPod` makes from the group's
        template, POSTed; the store's admission runs the TPU webhook on it. The name the
        API server makes of its generateName is drawn here, on the seeded random."""
        raycluster = self.store.get_raycluster(self.namespace, self.name)
        group = next(
            (g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == shape.group),
            None,
        ) or objects.group_template(shape)
        pod = kuberay_pod.build_worker_pod(
            raycluster, group, replica, replica_index, host, self.multi_host_indexing
        )
        while True:
            name = f"{pod['metadata']['generateName']}{self._random5()}"
            if self.store.pod(self.namespace, name) is None:
                break
        pod["metadata"]["name"] = name
        pod["metadata"]["creationTimestamp"] = rfc3339(self.events.now_s)
        pod["status"] = {"phase": "Pending"}
        # The API server's default when the group's template sets none.
        pod["spec"].setdefault("terminationGracePeriodSeconds", int(self.world.deletion_grace_s))
        return self.store.create_pod(pod)

    def _created(self, group: str, replica: str, pods: list[dict[str, Any]] | list[str]) -> None:
        names = [p if isinstance(p, str) else p["metadata"]["name"] for p in pods]
        self.replicas_created[group] += 1
        if self.on_replica_created is not None:
            self.on_replica_created(group, replica, names)

    def _delete(self, group: str, pods: list[dict[str, Any]], requested: bool) -> Iterator[float]:
        """Delete pods one call at a time. Those whose deletion this starts are
        reported first (`requested`: named in workersToDelete, else unhealthy or
        incomplete), while they are still stored: their containers get SIGTERM now."""
        starting = sorted(
            p["metadata"]["name"]
            for p in pods
            if self.store.pod(self.namespace, p["metadata"]["name"]) is not None
            and not p["metadata"].get("deletionTimestamp")
        )
        if starting and self.on_pods_deleted is not None:
            self.on_pods_deleted(starting, requested)
        for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
            name = pod["metadata"]["name"]
            yield self.world.api_call_latency_s
            if self.store.pod(self.namespace, name) is None:
                continue
            self._expected_deletions[group].add(name)
            self.store.delete_pod(self.namespace, name)

    def _random5(self) -> str:
        return "".join(self.events.random.choice(RANDOM_ALPHABET) for _ in range(5))

    # --- status ------------------------------------------------------------------------

    def _status(self, raycluster: dict[str, Any], error: str | None) -> dict[str, Any]:
        """The counts KubeRay's `calculateStatus` writes (pods, not replicas)."""
        workers = [
            p
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name})
            if p["metadata"]["labels"].get(labels.KUBERAY_NODE_TYPE) == "worker"
        ]
        running = [p for p in workers if p["status"]["phase"] == "Running"]
        groups = raycluster["spec"].get("workerGroupSpecs", [])
        hosts = [max(1, int(g.get("numOfHosts") or 1)) for g in groups]
        status: dict[str, Any] = dict(raycluster.get("status") or {})
        status.update(
            readyWorkerReplicas=len(
                [p for p in running if not p["metadata"].get("deletionTimestamp")]
            ),
            availableWorkerReplicas=len(running),
            desiredWorkerReplicas=sum(
                _desired_replicas(g) * h for g, h in zip(groups, hosts, strict=True)
            ),
            minWorkerReplicas=sum(
                int(g.get("minReplicas") or 0) * h for g, h in zip(groups, hosts, strict=True)
            ),
            maxWorkerReplicas=sum(
                int(g.get("maxReplicas") or 0) * h for g, h in zip(groups, hosts, strict=True)
            ),
        )
        conditions = [c for c in status.get("conditions", []) if c["type"] != "ReplicaFailure"]
        if error is not None:
            previous = next(
                (c for c in status.get("conditions", []) if c["type"] == "ReplicaFailure"), None
            )
            conditions.append(
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedReconcile",
                    "message": error,
                    # meta.SetStatusCondition keeps the time while the status stays True.
                    "lastTransitionTime": previous["lastTransitionTime"]
                    if previous is not None
                    else rfc3339(self.events.now_s),
                }
            )
        status["conditions"] = conditions
        return status


def _desired_replicas(spec: dict[str, Any]) -> int:
    """KubeRay's `GetWorkerGroupDesiredReplicas` in replicas: min, then max."""
    minimum = int(spec.get("minReplicas") or 0)
    maximum = spec.get("maxReplicas")
    replicas = spec.get("replicas")
    if spec.get("suspend"):
        return 0
    if replicas is None or int(replicas) < minimum:
        return minimum
    if maximum is not None and int(replicas) > int(maximum):
        return int(maximum)
    return int(replicas)


def _terminated(pod: dict[str, Any]) -> bool:
    """KubeRay's `shouldDeletePod` for a worker: Failed or Succeeded."""
    return pod["status"]["phase"] in ("Failed", "Succeeded")
