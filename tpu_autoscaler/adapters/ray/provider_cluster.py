"""The RayCluster as Ray's provider wrappers (v1 `NodeProvider`, v2
`ICloudInstanceProvider`, the v2 scheduler) read and change it: pods grouped into
whole replicas, changes stated per group (new `replicas`, pods newly named for
deletion) and applied as one JSON patch that sets `replicas` and
`scaleStrategy.workersToDelete` together, guarded by the resourceVersion read and
carried through conflicts as the controller's are (`adapters/kube/guarded.py`)."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, JsonPatch, KubeApi
from tpu_autoscaler.adapters.kube.guarded import GuardedApply, Proposal
from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.kube.patches import effective_replicas, group_operations
from tpu_autoscaler.adapters.kube.pods import Pod, replicas_of
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Hosts, Replicas
from tpu_autoscaler.manifest.model import RayCluster, WorkerGroupSpec
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

log = logging.getLogger(__name__)

KIND_HEAD = "head"
KIND_WORKER = "worker"


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
    """One RayCluster over a `KubeApi`: reads it with its pods (`observe.Observer`), and
    applies changes as one guarded patch (`guarded.GuardedApply`, as the controller does)."""

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self._observer = Observer(namespace, name)

    def read(self) -> KubeState:
        observed = self._observer.read(self.api)
        # Kubernetes sets deletionTimestamp when it accepts a delete: such a pod is gone
        # for planning, as Ray's KubeRay providers treat it.
        live = [
            (raw, pod)
            for raw, pod in zip(observed.raw_pods, observed.pods, strict=True)
            if not raw.get("metadata", {}).get("deletionTimestamp")
        ]
        pods = [pod for _, pod in live]
        shapes = derive_shapes(observed.cluster)
        replicas = tuple(
            r
            for r in replicas_of(observed.cluster, shapes, pods, {}, time.time())
            if r.state is not ReplicaState.REQUESTED
        )
        return KubeState(
            raw=observed.raw,
            cluster=observed.cluster,
            shapes=shapes,
            pods=tuple(pods),
            raw_pods={raw["metadata"]["name"]: raw for raw, _ in live},
            replicas=replicas,
        )

    def apply(self, planner: Planner) -> tuple[KubeState, list[GroupChange]]:
        """Read, plan, patch guarded by the resourceVersion read, through conflicts as
        `GuardedApply` does (the planner states changes relative to what it reads, so
        nothing is applied twice). A write that ended without an answer but shows in
        the cluster counts as done. Raises the ApiError that remains."""

        decided: tuple[KubeState, list[GroupChange]] | None = None

        def propose() -> Proposal[tuple[KubeState, list[GroupChange]]]:
            nonlocal decided
            state = self.read()
            decided = (state, planner(state))
            return Proposal(state.raw, decided, scale_patch(state, decided[1]))

        applier = GuardedApply(self.api, self.namespace, self.name, self._conflicted)
        try:
            return applier.apply(propose).decision
        except Conflict:
            raise
        except ApiError as exc:
            if exc.transient and decided is not None and self._applied(decided[1]):
                return decided
            raise

    def _conflicted(self) -> None:
        log.info("RayCluster %s changed while scaling; re-reading", self.name)

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
