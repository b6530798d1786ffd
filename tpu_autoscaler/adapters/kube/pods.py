"""A RayCluster's worker pods, joined with Ray's nodes, into replicas (slices).

KubeRay >= 1.6 with RayMultiHostIndexing labels each pod with its replica name and
host index; the older GKE webhook labels `replicaIndex=<group>-<n>` and sets
`TPU_WORKER_ID`. A multi-host pod with neither cannot be tied to its slice: it is
kept in a replica marked unidentified, which the policy never removes. Replicas that
`replicas` counts but whose pods do not exist yet come back as REQUESTED."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from pydantic import Field, ValidationError

from tpu_autoscaler.adapters.kube.pod_size import pod_size
from tpu_autoscaler.adapters.ray.state import RayNode
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState, requested_replicas
from tpu_autoscaler.manifest.loading import format_path
from tpu_autoscaler.manifest.model import (
    K8sModel,
    ObjectMeta,
    PodSpec,
    RayCluster,
    ResourceRequirements,
)
from tpu_autoscaler.manifest.shapes import ClusterShapes


class PodCondition(K8sModel):
    type: str
    status: str
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class ContainerStatus(K8sModel):
    name: str = ""
    resources: ResourceRequirements | None = None
    """What the kubelet has applied (Kubernetes >= 1.33 reports it)."""


class PodStatus(K8sModel):
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    """Why the pod failed, as the kubelet says (`Terminated`: its node shut down)."""
    conditions: list[PodCondition] = Field(default_factory=list)
    container_statuses: list[ContainerStatus] | None = None


class Pod(K8sModel):
    metadata: ObjectMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)

    # Cached: a parsed pod is kept for as long as its resourceVersion (`Observer`), and
    # every round reads these of every pod.
    @cached_property
    def name(self) -> str:
        return self.metadata.name

    @cached_property
    def created_s(self) -> float | None:
        return timestamp_s(self.metadata.creation_timestamp)

    @cached_property
    def tpu_name(self) -> str | None:
        """`TPU_NAME`, the slice the TPU webhook assigned the pod to."""
        return self.env(labels.ENV_TPU_NAME)

    @cached_property
    def tpu_worker_id(self) -> str | None:
        """`TPU_WORKER_ID`, the host's index in its slice as the TPU webhook set it."""
        return self.env(labels.ENV_TPU_WORKER_ID)

    def env(self, name: str) -> str | None:
        for container in self.spec.containers:
            value = container.env_value(name)
            if value is not None:
                return value
        return None

    @property
    def failed(self) -> bool:
        return self.status.phase in ("Failed", "Succeeded")

    @property
    def terminating(self) -> bool:
        return self.metadata.deletion_timestamp is not None


def parse_pods(items: Iterable[Mapping[str, Any]], source: str = "pods") -> list[Pod]:
    pods = []
    problems = []
    for index, item in enumerate(items):
        try:
            pods.append(Pod.model_validate(item))
        except ValidationError as exc:
            for err in exc.errors():
                where = format_path((index, *err["loc"]))
                problems.append(Problem(f"{source}{where}", str(err["msg"])))
    if problems:
        raise ManifestError(problems)
    return pods


def worker_pod_prefix(cluster: str, group: str) -> str:
    """KubeRay's `PodName(<cluster>-<group>, worker, true)`: the generateName of a
    group's worker pods, the prefix cut to 50 characters, lower-cased. What ties a pod
    that is gone (an Event still names it) to its group."""
    return f"{f'{cluster}-{group}'[:50]}-worker-".lower()


def timestamp_s(value: str | None) -> float | None:
    """RFC 3339 (`2026-12-02T13:15:48Z`) to seconds since the epoch."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def replicas_of(
    cluster: RayCluster,
    shapes: ClusterShapes,
    pods: Iterable[Pod],
    ray_nodes: Mapping[str, RayNode],
    now_s: float,
    memo: ReplicaMemo | None = None,
) -> tuple[Replica, ...]:
    """Every replica of every valid worker group, existing or only requested.
    `memo`: the replicas of the last read (`ReplicaMemo`), updated to this one's."""
    specs = {g.group_name: g for g in cluster.spec.worker_group_specs}
    # The cluster's worker pods by group, in the order listed: one walk of the pods.
    by_group: dict[str | None, list[Pod]] = {}
    name = cluster.metadata.name
    for pod in pods:
        pod_labels = pod.metadata.labels
        if (
            pod_labels.get(labels.KUBERAY_CLUSTER, name) == name
            and pod_labels.get(labels.KUBERAY_NODE_TYPE, "worker") == "worker"
        ):
            by_group.setdefault(pod_labels.get(labels.KUBERAY_GROUP), []).append(pod)
    replicas: list[Replica] = []
    made: dict[tuple[str, str], tuple[SliceShape, tuple[object, ...], Replica]] = {}
    for shape in shapes.shapes:
        spec = specs[shape.group]
        group_pods = by_group.get(shape.group, [])
        doomed = set(spec.scale_strategy.workers_to_delete)
        existing = _group_replicas(shape, group_pods, ray_nodes, doomed, now_s, memo, made)
        replicas.extend(existing)
        alive = sum(r.state is not ReplicaState.DRAINING for r in existing)
        replicas.extend(
            requested_replicas(
                shape.group, spec.effective_replicas - alive, {r.name for r in existing}, now_s
            )
        )
    if memo is not None:
        memo.made = made
    return tuple(replicas)


_POD_NAME = operator.attrgetter("name")


def _replica_key(shape: SliceShape, pod: Pod) -> tuple[str, bool]:
    """The replica a pod belongs to, and whether that is known for certain."""
    if shape.hosts_per_replica == 1:
        return pod.name, True
    name = pod.metadata.labels.get(labels.KUBERAY_REPLICA_NAME)
    if name:
        return name, True
    index = pod.metadata.labels.get(labels.WEBHOOK_REPLICA_INDEX)
    if index:
        return index, True
    return f"unidentified:{pod.name}", False


def _host_index(pod: Pod, fallback: int) -> int:
    for value in (
        pod.metadata.labels.get(labels.KUBERAY_HOST_INDEX),
        pod.tpu_worker_id,
    ):
        if value is not None and value.isdecimal():
            return int(value)
    return fallback


@dataclass
class ReplicaMemo:
    """The replicas the last read made, each with what it was made from. A replica
    whose pods (parsed once per resourceVersion), Ray nodes (parsed once per message)
    and removal marks are the very objects it was made from is that replica again:
    most replicas of a large cluster do not change from one round to the next, and
    making every one anew was much of reading it. Holds only the last read's; losing
    it costs making them again."""

    made: dict[tuple[str, str], tuple[SliceShape, tuple[object, ...], Replica]] = field(
        default_factory=dict
    )


def _group_replicas(
    shape: SliceShape,
    pods: list[Pod],
    ray_nodes: Mapping[str, RayNode],
    doomed: set[str],
    now_s: float,
    memo: ReplicaMemo | None = None,
    made: dict[tuple[str, str], tuple[SliceShape, tuple[object, ...], Replica]] | None = None,
) -> list[Replica]:
    """`memo`: the replicas of the last read, reused where made from the same
    objects; `made`: where this read's are recorded for the next."""
    by_key: dict[str, list[Pod]] = {}
    identified: dict[str, bool] = {}
    single_host = shape.hosts_per_replica == 1
    for pod in sorted(pods, key=_POD_NAME):
        # `_replica_key`, its usual cases inline (a walk of every pod every round).
        key = pod.name if single_host else pod.metadata.labels.get(labels.KUBERAY_REPLICA_NAME)
        if key:
            known = True
        else:
            key, known = _replica_key(shape, pod)
        by_key.setdefault(key, []).append(pod)
        identified[key] = known
    replicas = []
    for key, members in sorted(by_key.items()):
        # What the replica is made of besides the shape and the time (which only a
        # resizing group's hosts and a replica without creation times read).
        names = [p.name for p in members]
        nodes = list(map(ray_nodes.get, names))
        inputs: tuple[object, ...] = (
            identified[key],
            *members,
            *nodes,
            *map(doomed.__contains__, names),
        )
        timeless = shape.resize is None and any(p.created_s is not None for p in members)
        previous = memo.made.get((shape.group, key)) if memo is not None and timeless else None
        if (
            previous is not None
            and previous[0] == shape
            and len(previous[1]) == len(inputs)
            and all(map(operator.is_, previous[1], inputs))
        ):
            replica = previous[2]
        else:
            replica = _replica(shape, key, identified[key], members, nodes, doomed, now_s)
        if made is not None and timeless:
            made[(shape.group, key)] = (shape, inputs, replica)
        replicas.append(replica)
    return replicas


def _replica(
    shape: SliceShape,
    key: str,
    identified: bool,
    members: list[Pod],
    nodes: list[RayNode | None],
    doomed: set[str],
    now_s: float,
) -> Replica:
    hosts = []
    for fallback, (pod, node) in enumerate(zip(members, nodes, strict=True)):
        hosts.append(
            Host(
                pod_name=pod.name,
                host_index=_host_index(pod, fallback),
                node_id=node.node_id if node else None,
                labels=node.labels if node else {},
                total=node.total if node else {},
                available=node.available if node else {},
                idle_s=node.idle_s if node else 0.0,
                dead=pod.failed or (node is not None and node.dead),
                size=pod_size(pod, shape.resize, now_s) if shape.resize else None,
            )
        )
    hosts.sort(key=lambda h: h.host_index)
    slices = _slices_under_one_name(members)
    # KubeRay 1.7 names a replica `<group>-` + 5 random characters and never checks
    # for a clash: two slices under one name are one replica to it (removing either
    # deletes both), so they are one here too, whole when each slice is whole, and
    # timed from the newer slice's launch, lest a late launch of the newer one take
    # the older (and its work) past the provisioning timeout.
    created = [p.created_s for p in slices[-1] if p.created_s is not None]
    if any(p.name in doomed or p.terminating for p in members):
        state = ReplicaState.DRAINING
    elif (
        all(len(pods) == shape.hosts_per_replica for pods in slices)
        and all(h.registered for h in hosts)
        and all(p.status.phase == "Running" for p in members)
    ):
        state = ReplicaState.RUNNING
    else:
        state = ReplicaState.PENDING
    slice_name = next((p.tpu_name for p in members if p.tpu_name), None)
    if slice_name is None:
        slice_name = next(
            (
                h.labels.get(labels.RAY_TPU_SLICE_NAME)
                for h in hosts
                if h.labels.get(labels.RAY_TPU_SLICE_NAME)
            ),
            None,
        )
    return Replica(
        group=shape.group,
        name=key,
        state=state,
        hosts=tuple(hosts),
        created_at_s=min(created, default=now_s),
        last_pod_created_at_s=max(created, default=None),
        slice_name=slice_name if shape.tpu else None,
        identified=identified,
    )


def _slices_under_one_name(members: list[Pod]) -> list[list[Pod]]:
    """The pods of one replica name by KubeRay's replica index, oldest slice first: one
    list, unless KubeRay gave a new replica a name it had already given (its index
    differs: KubeRay picks the lowest index no replica holds)."""
    by_index: dict[str, list[Pod]] = {}
    for pod in members:
        by_index.setdefault(pod.metadata.labels.get(labels.KUBERAY_REPLICA_INDEX, ""), []).append(
            pod
        )
    if len(by_index) == 1:
        return [members]
    return sorted(
        by_index.values(),
        key=lambda pods: min((p.created_s for p in pods if p.created_s is not None), default=0.0),
    )


def fixed_hosts(
    cluster: RayCluster,
    pods: Iterable[Pod],
    ray_nodes: Mapping[str, RayNode],
    replicas: Iterable[Replica],
) -> tuple[Host, ...]:
    """The cluster's live Ray nodes that are no replica's host: the head, and workers
    of groups left out of the shapes. Ray's scheduler packs demand on every node it
    has an instance for (one per pod), head included; so does the policy."""
    held = {h.pod_name for r in replicas for h in r.hosts}
    found = []
    for pod in pods:
        node = ray_nodes.get(pod.name)
        if (
            pod.name in held
            or pod.terminating
            or pod.failed
            or node is None
            or node.status not in ("RUNNING", "IDLE")
            or pod.metadata.labels.get(labels.KUBERAY_CLUSTER, cluster.metadata.name)
            != cluster.metadata.name
        ):
            continue
        found.append(node.as_fixed_host(pod.name))
    return tuple(found)
