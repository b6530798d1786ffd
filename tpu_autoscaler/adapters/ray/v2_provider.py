"""Ray 2.60's autoscaler v2 cloud provider (`ICloudInstanceProvider`) over KubeRay,
in whole slices: a launch of N hosts of a multi-host TPU group is rounded up to
whole replicas, and terminating any pod removes every pod of its replica.

Ray's own `KubeRayProvider` floors host counts to replicas (a launch of fewer than
numOfHosts hosts does nothing) and names single pods in workersToDelete. Here every
change is one JSON patch that sets `replicas` and `scaleStrategy.workersToDelete`
together, guarded by the resourceVersion it was computed from; a Conflict is re-read
and recomputed once, and anything that still fails comes back from `poll_errors`.

`KubeCluster` (reading the RayCluster and its pods as replicas, and applying such a
patch) is shared with the v1 provider (`ray_v1_provider.py`)."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.autoscaler.v2.instance_manager.node_provider import (
    CloudInstance,
    CloudInstanceProviderError,
    ICloudInstanceProvider,
    LaunchNodeError,
    TerminateNodeError,
)
from ray.core.generated.instance_manager_pb2 import NodeKind

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, JsonPatch, KubeApi
from tpu_autoscaler.adapters.kube.patches import effective_replicas, group_operations
from tpu_autoscaler.adapters.kube.pods import Pod, parse_pods, replicas_of
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Hosts, Replicas
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.model import RayCluster, WorkerGroupSpec
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

log = logging.getLogger(__name__)

KIND_HEAD = "head"
KIND_WORKER = "worker"


# --- the cluster as the providers read and change it ------------------------------------


@dataclass(frozen=True)
class KubeState:
    """The RayCluster and its live pods at one resourceVersion, pods grouped into replicas."""

    raw: dict[str, Any]
    cluster: RayCluster
    shapes: ClusterShapes
    pods: tuple[Pod, ...]
    """Head and worker pods of the cluster that are not being deleted."""
    raw_pods: Mapping[str, Mapping[str, Any]]
    replicas: tuple[Replica, ...]
    """Worker replicas with pods (REQUESTED ones, which have none, left out)."""
    _by_pod: dict[str, Replica] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_pod.update({h.pod_name: r for r in self.replicas for h in r.hosts})

    @property
    def resource_version(self) -> str | None:
        version: str | None = self.raw.get("metadata", {}).get("resourceVersion")
        return version

    def spec(self, group: str) -> WorkerGroupSpec | None:
        return next(
            (g for g in self.cluster.spec.worker_group_specs if g.group_name == group), None
        )

    def replica_of(self, pod_name: str) -> Replica | None:
        return self._by_pod.get(pod_name)

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods if p.name == name), None)

    def kind(self, pod: Pod) -> str:
        return pod.metadata.labels.get(labels.KUBERAY_NODE_TYPE, "")

    def alive_replicas(self, group: str) -> int:
        """Replicas with pods that nobody is removing: what the group has now."""
        return sum(
            1 for r in self.replicas if r.group == group and r.state is not ReplicaState.DRAINING
        )

    def pending_deletes(self, group: str) -> list[str]:
        """Pods named in the group's workersToDelete that still exist: the operator has
        not acted on them yet, so a new list must keep them."""
        spec = self.spec(group)
        if spec is None:
            return []
        alive = {p.name for p in self.pods}
        return [name for name in spec.scale_strategy.workers_to_delete if name in alive]

    def has_pending_deletes(self) -> bool:
        return any(self.pending_deletes(g.group_name) for g in self.cluster.spec.worker_group_specs)


@dataclass(frozen=True)
class GroupChange:
    """One group's new `replicas` and the pods newly named for deletion."""

    group: str
    replicas: Replicas
    delete: tuple[str, ...] = ()


def scale_patch(state: KubeState, changes: Iterable[GroupChange]) -> JsonPatch:
    """One JSON patch setting, for each changed group, `replicas` and the whole
    `workersToDelete` list together (`patches.group_operations`)."""
    operations: JsonPatch = []
    existing = {p.name for p in state.pods}
    for change in changes:
        if state.spec(change.group) is None:
            raise KeyError(change.group)
        operations += group_operations(
            state.cluster, change.group, change.replicas, change.delete, existing
        )
    return operations


Planner = Callable[[KubeState], list[GroupChange]]


class KubeCluster:
    """One RayCluster over a `KubeApi`: reads it with its pods, and applies changes as
    one guarded patch."""

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def read(self) -> KubeState:
        raw = self.api.get_raycluster(self.namespace, self.name)
        cluster = parse_raycluster(raw, f"raycluster {self.namespace}/{self.name}")
        items = self.api.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name})
        # Kubernetes sets deletionTimestamp when it accepts a delete: such a pod is gone
        # for planning, as Ray's KubeRay providers treat it.
        live = [p for p in items if not p.get("metadata", {}).get("deletionTimestamp")]
        pods = parse_pods(live, f"pods of {self.namespace}/{self.name}")
        shapes = derive_shapes(cluster)
        replicas = tuple(
            r
            for r in replicas_of(cluster, shapes, pods, {}, time.time())
            if r.state is not ReplicaState.REQUESTED
        )
        return KubeState(
            raw=raw,
            cluster=cluster,
            shapes=shapes,
            pods=tuple(pods),
            raw_pods={p["metadata"]["name"]: p for p in live},
            replicas=replicas,
        )

    def apply(self, planner: Planner) -> tuple[KubeState, list[GroupChange]]:
        """Read, plan, patch guarded by the resourceVersion read. A Conflict means the
        cluster moved: re-read and re-plan once (the planner states changes relative to
        what it reads, so nothing is applied twice). Raises the ApiError that remains."""
        for attempt in (1, 2):
            state = self.read()
            changes = planner(state)
            operations = scale_patch(state, changes)
            if not operations:
                return state, changes
            try:
                self.api.patch_raycluster(
                    self.namespace, self.name, operations, state.resource_version
                )
            except Conflict:
                if attempt == 2:
                    raise
                log.info("RayCluster %s changed while scaling; re-reading", self.name)
                continue
            except ApiError as exc:
                if exc.transient and self._applied(changes):
                    return state, changes
                raise
            return state, changes
        raise AssertionError("unreachable")  # pragma: no cover

    def _applied(self, changes: list[GroupChange]) -> bool:
        """After a write that ended without an answer: whether the cluster already
        shows it, so that it is neither reported failed nor repeated."""
        try:
            state = self.read()
        except ApiError:
            return False
        for change in changes:
            spec = state.spec(change.group)
            if spec is None or spec.replicas != change.replicas:
                return False
            named = set(spec.scale_strategy.workers_to_delete)
            if not all(pod in named or state.pod(pod) is None for pod in change.delete):
                return False
        return True


def pod_running(pod: Mapping[str, Any]) -> bool:
    """Running as Ray's KubeRay providers judge it: the Ray container running, or
    (with no container statuses reported) the pod phase."""
    status = pod.get("status", {})
    containers = status.get("containerStatuses") or []
    if containers:
        return "running" in containers[0].get("state", {})
    return bool(status.get("phase") == "Running")


def whole_replicas(
    hosts: int, hosts_per_replica: int, group: str = "", asked_by: str = ""
) -> Replicas:
    """Hosts asked for, rounded up to whole replicas; a rounding is logged, since
    Ray asked for less than it gets."""
    wanted = Replicas(math.ceil(hosts / hosts_per_replica)) if hosts > 0 else Replicas(0)
    if hosts % hosts_per_replica:
        log.warning(
            "%s%d host(s) of %s rounded up to %d whole replica(s) of %d hosts (%d hosts); "
            "a slice is only usable whole",
            f"{asked_by}: " if asked_by else "",
            hosts,
            group,
            wanted,
            hosts_per_replica,
            wanted * hosts_per_replica,
        )
    return wanted


def hosts_per_replica(spec: WorkerGroupSpec) -> Hosts:
    return Hosts(spec.num_of_hosts)


# --- the v2 provider -------------------------------------------------------------------


class SliceCloudInstanceProvider(ICloudInstanceProvider):  # type: ignore[misc]
    """Ray's `ICloudInstanceProvider` for a KubeRay cluster, whole replicas only.

    Cloud instance ids are pod names; node types are worker group names. Calls are
    synchronous (the interface allows asynchronous ones): by the time `launch` or
    `terminate` returns, the RayCluster is patched or the failure is queued."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        cluster_name: str,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cluster = KubeCluster(api, namespace, cluster_name)
        self._clock_ns = clock_ns
        self._done_requests: set[str] = set()
        self._errors: list[CloudInstanceProviderError] = []
        # Replicas a launch asked for that have no pods yet, oldest first per group:
        # new replicas are attributed to them in that order.
        self._unclaimed: dict[str, list[tuple[str, int]]] = defaultdict(list)
        self._request_of_replica: dict[str, str] = {}
        self._seen_replicas: set[str] = set()

    # --- ICloudInstanceProvider ------------------------------------------------------

    def get_non_terminated(self) -> dict[str, CloudInstance]:
        state = self._observe(self.cluster.read())
        instances: dict[str, CloudInstance] = {}
        for pod in state.pods:
            kind = state.kind(pod)
            if kind not in (KIND_HEAD, KIND_WORKER):
                continue  # e.g. KubeRay's redis-cleanup pod: not a Ray node
            replica = state.replica_of(pod.name)
            instances[pod.name] = CloudInstance(
                cloud_instance_id=pod.name,
                node_type=pod.metadata.labels.get(labels.KUBERAY_GROUP, ""),
                node_kind=NodeKind.HEAD if kind == KIND_HEAD else NodeKind.WORKER,
                is_running=pod_running(state.raw_pods[pod.name]),
                request_id=self._request_of_replica.get(replica.name) if replica else None,
            )
        return instances

    def launch(self, shape: dict[str, int], request_id: str) -> None:
        if request_id in self._done_requests:
            return  # idempotent: this request was carried out already
        granted: dict[str, int] = {}
        refused: dict[str, tuple[int, str]] = {}

        def planner(state: KubeState) -> list[GroupChange]:
            self._observe(state)
            granted.clear()
            refused.clear()
            changes = []
            for group, hosts in sorted(shape.items()):
                if hosts <= 0:
                    continue
                spec = state.spec(group)
                if spec is None or state.shapes.shape(group) is None:
                    why = "no such worker group" if spec is None else "invalid worker group"
                    refused[group] = (hosts, why)
                    continue
                per_replica = hosts_per_replica(spec)
                wanted = whole_replicas(hosts, per_replica, group, f"launch {request_id}")
                base = max(effective_replicas(state.cluster, group), state.alive_replicas(group))
                allowed = max(0, min(wanted, spec.max_replicas - base))
                if allowed < wanted:
                    missing = hosts - allowed * per_replica
                    refused[group] = (missing, f"capped by maxReplicas {spec.max_replicas}")
                if allowed:
                    granted[group] = allowed
                    changes.append(GroupChange(group, Replicas(base + allowed)))
            return changes

        try:
            self.cluster.apply(planner)
        except ApiError as exc:
            for group, hosts in sorted(shape.items()):
                self._launch_error(group, hosts, request_id, f"patch failed: {exc}", exc)
            return
        self._done_requests.add(request_id)
        for group, replicas in granted.items():
            self._unclaimed[group].append((request_id, replicas))
        for group, (hosts, why) in sorted(refused.items()):
            self._launch_error(group, hosts, request_id, why)

    def terminate(self, ids: list[str], request_id: str) -> None:
        if request_id in self._done_requests:
            return
        refused: dict[str, str] = {}

        def planner(state: KubeState) -> list[GroupChange]:
            self._observe(state)
            refused.clear()
            doomed: dict[str, Replica] = {}
            for pod_name in ids:
                reason = why_not_removable(state, pod_name)
                if reason is not None:
                    if reason:
                        refused[pod_name] = reason
                    continue
                replica = state.replica_of(pod_name)
                assert replica is not None
                if replica.state is ReplicaState.DRAINING:
                    continue  # already being removed
                doomed[replica.name] = replica
            return removal_changes(state, doomed.values(), base_on_spec=True)

        try:
            _, changes = self.cluster.apply(planner)
        except ApiError as exc:
            for pod_name in ids:
                self._terminate_error(pod_name, request_id, f"patch failed: {exc}", exc)
            return
        self._done_requests.add(request_id)
        for change in changes:
            extra = sorted(set(change.delete) - set(ids))
            if extra:
                log.info(
                    "terminate %s: also removing %s, the rest of their replicas",
                    request_id,
                    ", ".join(extra),
                )
        for pod_name, why in sorted(refused.items()):
            self._terminate_error(pod_name, request_id, why)

    def poll_errors(self) -> list[CloudInstanceProviderError]:
        errors, self._errors = self._errors, []
        return errors

    # --- private ----------------------------------------------------------------------

    def _observe(self, state: KubeState) -> KubeState:
        """Attribute replicas not seen before to the oldest launch still owed them."""
        for replica in sorted(state.replicas, key=lambda r: (r.created_at_s, r.name)):
            if replica.name in self._seen_replicas:
                continue
            self._seen_replicas.add(replica.name)
            queue = self._unclaimed.get(replica.group)
            if queue:
                request_id, left = queue[0]
                self._request_of_replica[replica.name] = request_id
                if left > 1:
                    queue[0] = (request_id, left - 1)
                else:
                    queue.pop(0)
        return state

    def _launch_error(
        self,
        node_type: str,
        count: int,
        request_id: str,
        details: str,
        cause: Exception | None = None,
    ) -> None:
        log.warning("launch %s of %d %s failed: %s", request_id, count, node_type, details)
        self._errors.append(
            LaunchNodeError(node_type, count, request_id, self._clock_ns(), details, cause)
        )

    def _terminate_error(
        self, pod_name: str, request_id: str, details: str, cause: Exception | None = None
    ) -> None:
        log.warning("terminate %s of %s failed: %s", request_id, pod_name, details)
        self._errors.append(
            TerminateNodeError(pod_name, request_id, self._clock_ns(), details, cause)
        )


def why_not_removable(state: KubeState, pod_name: str) -> str | None:
    """None if the pod's replica can be removed whole; "" if there is nothing to do
    (the pod is gone); else why it cannot be removed without leaving a partial slice."""
    pod = state.pod(pod_name)
    if pod is None:
        return ""
    if state.kind(pod) == KIND_HEAD:
        return "the head pod is not removed by the autoscaler"
    replica = state.replica_of(pod_name)
    if replica is None:
        group = pod.metadata.labels.get(labels.KUBERAY_GROUP, "")
        problems = "; ".join(str(p) for p in state.shapes.errors if p.group == group)
        return f"worker group {group!r} is not valid, so its replicas are unknown: {problems}"
    if not replica.identified:
        return (
            f"pod carries no {labels.KUBERAY_REPLICA_NAME} label (KubeRay < 1.6 or "
            "RayMultiHostIndexing off): its slice is unknown, and removing it alone would "
            "leave a partial slice"
        )
    return None


def removal_changes(
    state: KubeState, replicas: Iterable[Replica], base_on_spec: bool
) -> list[GroupChange]:
    """Remove these replicas whole. `replicas` drops by one per replica from the
    group's current count: the spec's (raised to what exists) for v2, which tracks its
    own launches; what exists for v1, which counts hosts it sees."""
    by_group: dict[str, list[Replica]] = defaultdict(list)
    for replica in replicas:
        by_group[replica.group].append(replica)
    changes = []
    for group, removed in sorted(by_group.items()):
        alive = state.alive_replicas(group)
        base = max(effective_replicas(state.cluster, group), alive) if base_on_spec else alive
        pods = tuple(h.pod_name for r in sorted(removed, key=lambda r: r.name) for h in r.hosts)
        changes.append(GroupChange(group, Replicas(max(0, base - len(removed))), pods))
    return changes
