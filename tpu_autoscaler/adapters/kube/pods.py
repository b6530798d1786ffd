"""A RayCluster's worker pods, joined with Ray's nodes, into replicas (slices).

KubeRay >= 1.6 with RayMultiHostIndexing labels each pod with its replica name and
host index; the older GKE webhook labels `replicaIndex=<group>-<n>` and sets
`TPU_WORKER_ID`. A multi-host pod with neither cannot be tied to its slice: it is
kept in a replica marked unidentified, which the policy never removes. Replicas that
`replicas` counts but whose pods do not exist yet come back as REQUESTED."""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any, cast

from pydantic import Field, ValidationError

from tpu_autoscaler.adapters.kube.pod_size import pod_size
from tpu_autoscaler.adapters.ray.state import NodeDelta, RayNode, RayState
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.resize import IPPR_ANNOTATION
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import (
    Host,
    Remade,
    Replica,
    ReplicaState,
    requested_replicas,
)
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

    @cached_property
    def labelled_host_index(self) -> int | None:
        """The host's index in its slice as its labels or the webhook's env say (None:
        neither says; its replica places it by its place among its pods)."""
        for value in (self.metadata.labels.get(labels.KUBERAY_HOST_INDEX), self.tpu_worker_id):
            if value is not None and value.isdecimal():
                return int(value)
        return None

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


_PodChange = tuple[str, Pod | None, Pod | None]
"""A pod's name, its parse in the read before and in this one (None: not listed)."""


@dataclass(frozen=True)
class PodChanges:
    """How one read's pods differ from those of the read before it by the same reader
    (`Observer`): each pod, by name, whose parse is not the one listed then, with
    its parse then and now (None: not listed). Every other pod is listed as the
    very parse it was. `since` and `read` stand for the two reads, so a reader of
    the pods can tell whether it saw the read before (`ReplicaMemo`). `pods` is
    None if the changes are not known (the first read, or a list walked whose pods
    did not stay in their places): then every pod is to be looked at."""

    since: object
    read: object
    pods: tuple[_PodChange, ...] | None


@dataclass(frozen=True)
class Registrations:
    """When each registered host (by pod) was first seen in Ray, as the controller
    remembers it, and the time a host seen for the first time is given: what a
    replica's registered hosts carry in `Host.registered_at_s`. Read, never changed,
    while replicas are made."""

    first_seen_s: Mapping[str, float]
    now_s: float


def replicas_of(
    cluster: RayCluster,
    shapes: ClusterShapes,
    pods: Iterable[Pod],
    ray_nodes: Mapping[str, RayNode],
    now_s: float,
    memo: ReplicaMemo | None = None,
    registrations: Registrations | None = None,
    changes: PodChanges | None = None,
) -> tuple[Replica, ...]:
    """Every replica of every valid worker group, existing or only requested.
    `memo`: the replicas of the last read (`ReplicaMemo`), updated to this one's.
    `changes`: how `pods` differ from the pods of the read before (`Observer`): if
    that is the read the memo has, only the pods changed are looked at.
    `registrations`: the registered hosts' times (none: `registered_at_s` is None).
    A replica the memo keeps keeps the times it was made with: a host's time is set
    when it is first seen and stays while a replica holds it, and a kept replica's
    hosts are held and registered as when it was made (the same node objects)."""
    specs = {g.group_name: g for g in cluster.spec.worker_group_specs}
    listed = pods if isinstance(pods, list | tuple) else list(pods)
    name = cluster.metadata.name
    told: dict[object, list[_PodChange]] | None = None
    by_group: Mapping[str | None, _GroupListed]
    if memo is None:
        by_group = _worker_pods_by_group(name, listed)
    else:
        groups_read = memo.groups_read
        memo.groups_read = None  # until the groups are made
        held = tuple(shape.group for shape in shapes.shapes)
        by_group = memo.pods_by_group(name, listed, held, changes)
        if memo.group_changes is not None and memo.group_changes[0] is groups_read:
            told = memo.group_changes[1]
    replicas: list[Replica] = []
    groups: dict[str, _GroupMemo] = {}
    for shape in shapes.shapes:
        spec = specs[shape.group]
        group_pods = by_group.get(shape.group, [])
        doomed = set(spec.scale_strategy.workers_to_delete)
        previous = memo.groups.get(shape.group) if memo is not None else None
        delta = memo.node_delta if memo is not None else None
        made = _group_replicas(
            shape,
            group_pods,
            ray_nodes,
            doomed,
            now_s,
            previous,
            delta,
            registrations,
            None if told is None else told.get(shape.group, []),
        )
        groups[shape.group] = made
        existing = made.replicas
        replicas.extend(existing)
        alive = len(existing) - made.draining
        taken = made.partition.taken  # the replicas' names are the partition's keys
        replicas.extend(
            requested_replicas(shape.group, spec.effective_replicas - alive, taken, now_s)
        )
    if memo is not None:
        memo.groups = groups
        memo.groups_read = memo.read
    return tuple(replicas)


_NOT_WORKER = object()
_SECOND = operator.itemgetter(1)
_THIRD = operator.itemgetter(2)


def _group_of(cluster: str, pod: Pod) -> object:
    """The pod's group if it is a worker of `cluster`, else `_NOT_WORKER`."""
    pod_labels = pod.metadata.labels
    if (
        pod_labels.get(labels.KUBERAY_CLUSTER, cluster) == cluster
        and pod_labels.get(labels.KUBERAY_NODE_TYPE, "worker") == "worker"
    ):
        return pod_labels.get(labels.KUBERAY_GROUP)
    return _NOT_WORKER


def _worker_pods_by_group(cluster: str, pods: Iterable[Pod]) -> dict[str | None, list[Pod]]:
    """The cluster's worker pods by group, in the order listed: one walk of the pods."""
    by_group: dict[str | None, list[Pod]] = {}
    for pod in pods:
        pod_labels = pod.metadata.labels
        if (
            pod_labels.get(labels.KUBERAY_CLUSTER, cluster) == cluster
            and pod_labels.get(labels.KUBERAY_NODE_TYPE, "worker") == "worker"
        ):
            by_group.setdefault(pod_labels.get(labels.KUBERAY_GROUP), []).append(pod)
    return by_group


@dataclass(frozen=True)
class _GroupPods:
    """A group's worker pods as listed at one read, in the order listed (by name),
    made at the first ask: `ReplicaMemo._told` hands each group the changes to its
    pods (`PodChanges`), from which its replicas are made again, so the group's
    whole list is read only by a fallback (a layout afresh, a pod listed twice) or
    by a later read not told its changes. Placing each change in a list thousands
    long (a bisection by name) was most of taking a read's changes in. Made by a
    walk of the very list the read listed, so it is the group's pods as
    `_worker_pods_by_group` finds them, whatever the changes were. A real API
    server's list tells no changes (a plain list, decoded afresh): its groups are
    laid out as before (`by_group_again`), never this way. Holds the read's list,
    so a group left unchanged for many reads keeps that read's pods alive (one
    list, shared by the groups made at the same read)."""

    cluster: str
    group: object
    listed: tuple[Pod, ...]
    count: int
    """How many of `listed` are the group's (known from the changes, without a walk)."""
    made: list[list[Pod]] = field(default_factory=list, compare=False)

    def __len__(self) -> int:
        return self.count

    @property
    def pods(self) -> list[Pod]:
        if not self.made:
            cluster, group = self.cluster, self.group
            self.made.append([p for p in self.listed if _group_of(cluster, p) == group])
        return self.made[0]


_GroupListed = list[Pod] | _GroupPods
"""A group's pods, or the means to list them at the first ask."""


def _pods_list(pods: _GroupListed) -> list[Pod]:
    return pods if isinstance(pods, list) else pods.pods


def _same_objects(before: Sequence[object], now: Sequence[object]) -> bool:
    """Whether two lists hold the very same objects in the same order (a walk in C)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


_POD_NAME = operator.attrgetter("name")
_HOSTS = operator.attrgetter("hosts")
_HOST_POD = operator.attrgetter("pod_name")
_STATE = operator.attrgetter("state")


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
    index = pod.labelled_host_index
    return fallback if index is None else index


@dataclass(frozen=True)
class _Partition:
    """A group's pods as replicas: what depends on the pods and the shape alone."""

    keys: tuple[str, ...]
    """Each replica's name, sorted."""
    identified: tuple[bool, ...]
    members: tuple[list[Pod], ...]
    """Each replica's pods, by name."""
    member_names: tuple[tuple[str, ...], ...]
    """Each replica's pods' names, as `members`."""
    timeless: tuple[bool, ...]
    """Whether a replica is made the same at any time (only a resizing group's hosts
    and a replica without creation times read the time): only those are reused."""
    names: tuple[str, ...]
    """Every member's pod name, replica after replica."""
    owner: tuple[int, ...]
    """The replica of each of `names`, by index."""
    spans: tuple[slice, ...]
    """Each replica's members' places in `names`."""
    index_of: dict[str, int]
    """Each key's index in `keys`."""
    taken: frozenset[str]
    """The replicas' names (`keys`) as a set: copied, not hashed again, by
    `requested_replicas` at every read. Like `index_of`, made once per layout (a
    member swapped for its new object keeps them)."""
    places_kept: list[dict[str, list[int]]] = field(default_factory=list, compare=False)
    """`places` once made, shared by the partitions of the same `names` (a member
    swapped for its new object keeps it, as `replace` hands the list on)."""
    place_of_kept: list[dict[str, int] | None] = field(default_factory=list, compare=False)
    """`place_of` once made, shared as `places_kept` is."""

    @property
    def places(self) -> dict[str, list[int]]:
        """Each pod name's places in `names`, made at the first ask for these names."""
        if not self.places_kept:
            places: dict[str, list[int]] = {}
            for at, name in enumerate(self.names):
                places.setdefault(name, []).append(at)
            self.places_kept.append(places)
        return self.places_kept[0]

    @property
    def place_of(self) -> dict[str, int] | None:
        """Each pod name's place in `names`, made in C at the first ask for these names;
        None if a name is there twice (a pod listed twice): then see `places`, made
        by a Python step a name."""
        if not self.place_of_kept:
            place_of = dict(zip(self.names, itertools.count()))
            self.place_of_kept.append(place_of if len(place_of) == len(self.names) else None)
        return self.place_of_kept[0]

    @cached_property
    def untimed(self) -> tuple[int, ...]:
        """The replicas not `timeless`, by index: made again at every read."""
        return tuple(itertools.compress(itertools.count(), map(operator.not_, self.timeless)))


def _laid_out(
    keys: tuple[str, ...],
    identified: tuple[bool, ...],
    members: tuple[list[Pod], ...],
    member_names: tuple[tuple[str, ...], ...],
    timeless: tuple[bool, ...],
    same_keys: _Partition | None = None,
) -> _Partition:
    """The partition of these replicas, its flat lists made in C; `same_keys`: a
    partition of the very same `keys`, whose look-ups by key are taken as they are."""
    sizes = list(map(len, members))
    ends = list(itertools.accumulate(sizes))
    return _Partition(
        keys,
        identified,
        members,
        member_names,
        timeless,
        tuple(itertools.chain.from_iterable(member_names)),
        tuple(itertools.chain.from_iterable(map(itertools.repeat, range(len(keys)), sizes))),
        tuple(map(slice, [0, *ends[:-1]], ends)),
        dict(zip(keys, itertools.count())) if same_keys is None else same_keys.index_of,
        frozenset(keys) if same_keys is None else same_keys.taken,
    )


def _partition(shape: SliceShape, pods: list[Pod]) -> _Partition:
    by_key: dict[str, list[Pod]] = {}
    identified: dict[str, bool] = {}
    single_host = shape.hosts_per_replica == 1
    for at in sorted(range(len(pods)), key=list(map(_POD_NAME, pods)).__getitem__):
        pod = pods[at]
        # `_replica_key`, its usual cases inline (a walk of every pod of a group laid
        # out anew).
        key = pod.name if single_host else pod.metadata.labels.get(labels.KUBERAY_REPLICA_NAME)
        if key:
            known = True
        else:
            key, known = _replica_key(shape, pod)
        by_key.setdefault(key, []).append(pod)
        identified[key] = known
    keys = tuple(sorted(by_key))
    members = tuple(by_key[key] for key in keys)
    return _laid_out(
        keys,
        tuple(identified[key] for key in keys),
        members,
        tuple(tuple(map(_POD_NAME, pods)) for pods in members),
        tuple(_timeless(shape, pods) for pods in members),
    )


def _timeless(shape: SliceShape, members: list[Pod]) -> bool:
    return shape.resize is None and any(p.created_s is not None for p in members)


def _partition_again(
    shape: SliceShape,
    previous: _GroupMemo,
    group_pods: _GroupListed,
    changes: Sequence[_PodChange] | None = None,
) -> tuple[_Partition, set[int] | None]:
    """`_partition` of the group's pods after some came or went, and the replicas
    (by index) pods came to or went from; None if laid out afresh. A Python step for
    the pods that came or went and the replicas they are of, the rest in C. The same
    partition as laid out afresh (`_partition`): a pod's replica is read from its
    labels, fixed for a pod object, so a replica none of whose pods came or went has
    the same members; one whose did is laid out as `_partition` lays it out (its
    pods by name, identified as its last pod says). `changes`: the pods that came
    and went, if told (`ReplicaMemo._told`); else found by walking both lists."""
    last = previous.partition
    gone: Iterable[Pod]
    if changes is None:
        pods = _pods_list(group_pods)
        previous_pods = _pods_list(previous.pods)
        listed = set(map(id, pods))
        before = set(map(id, previous_pods))
        gone = itertools.compress(
            previous_pods, map(operator.not_, map(listed.__contains__, map(id, previous_pods)))
        )
        came = list(
            itertools.compress(pods, map(operator.not_, map(before.__contains__, map(id, pods))))
        )
        staying: Callable[[Pod], bool] = lambda pod: id(pod) in listed  # noqa: E731
    else:
        gone = [before for _, before, _ in changes if before is not None]
        came = [after for _, _, after in changes if after is not None]
        left = set(map(id, gone))
        staying = lambda pod: id(pod) not in left  # noqa: E731
    if 2 * len(came) > len(group_pods) or not last.keys or last.place_of is None:
        # A name twice in the last layout (a pod listed twice): its members are in
        # the order listed, which may have changed since, so all is laid out afresh.
        return _partition(shape, _pods_list(group_pods)), None
    changed: dict[str, list[Pod]] = {}
    for pod in gone:
        key = _replica_key(shape, pod)[0]
        if key not in changed:
            changed[key] = list(filter(staying, last.members[last.index_of[key]]))
    for pod in came:
        key = _replica_key(shape, pod)[0]
        if key not in changed:
            kept = last.index_of.get(key)
            changed[key] = [] if kept is None else list(last.members[kept])
        changed[key].append(pod)
    place: dict[int, int] | None = None
    for group in changed.values():
        # By name, then as listed: as `_partition` orders them (the places looked up
        # only if a name is there twice, a pod listed twice).
        group.sort(key=_POD_NAME)
        if len(set(map(_POD_NAME, group))) < len(group):
            if place is None:
                place = dict(zip(map(id, _pods_list(group_pods)), itertools.count()))
            at = place
            group.sort(key=lambda pod: (pod.name, at[id(pod)]))
    emptied = {key for key, group in changed.items() if not group}
    same_keys: _Partition | None = None
    if emptied or any(key not in last.index_of for key in changed):
        keys = tuple(sorted((set(last.keys) | set(changed)) - emptied))
        index_of = dict(zip(keys, itertools.count()))
    else:
        keys, index_of, same_keys = last.keys, last.index_of, last
    # Every replica as it was laid out last (in C), then those changed put in place
    # (a replica new here takes the first one's place until then).
    ats = list(map(last.index_of.get, keys, itertools.repeat(0)))
    identified = list(map(last.identified.__getitem__, ats))
    members = list(map(last.members.__getitem__, ats))
    member_names = list(map(last.member_names.__getitem__, ats))
    timeless = list(map(last.timeless.__getitem__, ats))
    remade: set[int] = set()
    for key, group in changed.items():
        if not group:
            continue
        index = index_of[key]
        remade.add(index)
        identified[index] = _replica_key(shape, group[-1])[1]
        members[index] = group
        member_names[index] = tuple(map(_POD_NAME, group))
        timeless[index] = _timeless(shape, group)
    partition = _laid_out(
        keys, tuple(identified), tuple(members), tuple(member_names), tuple(timeless), same_keys
    )
    return partition, remade


def _repartition(
    shape: SliceShape,
    previous: _GroupMemo,
    group_pods: _GroupListed,
    changes: Sequence[_PodChange] | None = None,
) -> tuple[_Partition, set[int] | None]:
    """The group's partition, and the replicas (by index in it) whose pods changed
    since `previous` (None: laid out afresh). While the same pods are listed under
    the same names, a pod changed (a new object: a new resourceVersion) takes the
    old one's place if it belongs to the same replica, a Python step for the changed
    pods only; a pod that came, went or moved to another replica lays the replicas
    out again, those it was or is of anew (`_partition_again`). `changes`: the
    group's pods changed since `previous` was made, if told (`ReplicaMemo._told`):
    then no list is walked to find them."""
    last = previous.partition
    replaced: Iterable[tuple[Pod, Pod]]
    if changes is None:
        pods, previous_pods = _pods_list(group_pods), _pods_list(previous.pods)
        if _same_objects(previous_pods, pods):
            return last, set()
        if len(pods) != len(previous_pods):
            return _partition_again(shape, previous, pods)
        places = itertools.compress(itertools.count(), map(operator.is_not, pods, previous_pods))
        replaced = ((pods[at], previous_pods[at]) for at in places)
    elif not changes:
        return last, set()
    elif any(before is None or after is None for _, before, after in changes):
        return _partition_again(shape, previous, group_pods, changes)
    else:
        replaced = [(cast(Pod, after), cast(Pod, before)) for _, before, after in changes]
    replaced = list(replaced)
    befores = set(map(id, map(operator.itemgetter(1), replaced)))
    if any(id(pod) in befores for pod, _ in replaced):
        # A pod listed before, at another place: a reorder, not a new version. Taken
        # one place at a time, a pod listed twice swapped with its twin would take
        # back the place it gave (the second pair undoing the first).
        return _partition_again(shape, previous, group_pods, changes)
    members = list(last.members)
    remade: set[int] = set()
    for pod, before in replaced:
        if pod.name != before.name:
            return _partition_again(shape, previous, group_pods, changes)
        index = last.index_of[_replica_key(shape, before)[0]]
        if _replica_key(shape, pod) != (last.keys[index], last.identified[index]):
            return _partition_again(shape, previous, group_pods, changes)
        if index not in remade:
            members[index] = list(members[index])
            remade.add(index)
        place = next(i for i, member in enumerate(members[index]) if member is before)
        members[index][place] = pod
    timeless = list(last.timeless)
    for index in remade:
        timeless[index] = _timeless(shape, members[index])
    return replace(last, members=tuple(members), timeless=tuple(timeless)), remade


@dataclass(frozen=True)
class _GroupMemo:
    """One group's replicas as one read made them, and what from: the shape, the
    group's pods as listed, their partition into replicas, and each member's Ray node
    and removal mark (in the partition's order)."""

    shape: SliceShape
    pods: _GroupListed
    partition: _Partition
    nodes: list[RayNode | None]
    doomed: list[bool]
    replicas: list[Replica]
    draining: int
    """How many of `replicas` are DRAINING."""
    ray_nodes: Mapping[str, RayNode]
    """The mapping `nodes` were looked up in."""
    idled: tuple[tuple[Replica, Replica], ...] = ()
    """The replicas of this read that are one of the read before with some hosts'
    idle times alone changed (`_idled_again`), each with that one."""


@dataclass
class ReplicaMemo:
    """The replicas the last read made, each with what it was made from. A replica
    whose pods (parsed once per resourceVersion: `Observer`), Ray nodes (parsed once
    per message: `NodeMemory`) and removal marks are the very objects it was made
    from is that replica again: most replicas of a large cluster do not change from
    one round to the next, and making every one anew was much of reading it.

    Safe against a real API server and GCS as against the simulator: the objects are
    compared by identity, never by name, and the parsers hand out a new object for
    every new resourceVersion or node message (an object is never changed once
    parsed), so a changed pod or node is a new object and its replica is made again;
    a reader that parses everything afresh only loses the reuse. The memo holds the
    objects it compares, so an `id` is never recycled under it. Holds only the last
    read's; losing it costs making them again.

    Each step is skipped while its inputs are the same objects: the walk of the pods
    by group while the listed pods are (`listed`), a group's partition into replicas
    while its pods are, and each replica while its members' nodes and marks are (the
    nodes of the whole group looked up and compared in C, not replica by replica).
    Where they are not, only what changed is worked: the pods new in their places
    (`_patched`), the replicas pods came to or went from (`_partition_again`: the
    others keep their replicas, found by name), the hosts whose nodes changed in
    their idle time alone (`_idled_again`: the rest of their replica kept), and the
    nodes of the pods whose node changed (`NodeDelta`: in a layout as before, only
    those are looked up). What is
    kept of a pod (its group, whether it failed, its replica) is read from its labels
    and status, which never change in a pod object, so an object seen before needs
    no second look."""

    cluster: str | None = None
    listed: Sequence[Pod] = ()
    by_group: dict[str | None, _GroupListed] = field(default_factory=dict)
    """Each group's pods, in the order listed; a group told its changes (`_told`)
    lists them at the first ask (`_GroupPods`)."""
    group_of: dict[int, tuple[Pod, object, bool]] = field(default_factory=dict)
    """Each listed pod's group (`_NOT_WORKER` for a pod that is not a worker of the
    cluster) and whether it failed (phase Failed), by `id` (the entry holds the pod)."""
    groups_listed: list[object] = field(default_factory=list)
    """The group of each listed pod, in the order listed (as in `group_of`)."""
    failed_listed: list[bool] = field(default_factory=list)
    """Whether each listed pod failed, in the order listed."""
    slots: dict[object, dict[int, int]] = field(default_factory=dict)
    """Each group's pods' places in `by_group`, by their places in `listed`."""
    changed_groups: set[object] | None = None
    """The groups of the pods new in their places in `listed`, if `by_group_again`
    only put them in place (`_patched`); None if it laid the pods out again."""
    failed: list[Pod] = field(default_factory=list)
    """The listed pods whose phase is Failed, in the order listed: the only ones that
    can tell of a preempted host (`capacity_events.preemption_signals`)."""
    held: tuple[str, ...] = ()
    """The shapes' groups as the last read had them."""
    unheld: list[Pod] = field(default_factory=list)
    """The listed pods of none of `held`, in the order listed: the pods that are no
    replica's host (`fixed_hosts`)."""
    groups: dict[str, _GroupMemo] = field(default_factory=dict)
    ray_nodes: tuple[RayNode, ...] = ()
    """The Ray nodes of the last read, and each pod's node among them (`node_for_pod`)."""
    node_for_pod: dict[str, RayNode] = field(default_factory=dict)
    node_delta: NodeDelta | None = None
    """How `node_for_pod` was brought up from the mapping before it; None if it was
    made afresh."""
    read: object = None
    """The read (`PodChanges.read`) `listed` is, if told; None if not known."""
    in_name_order: bool = False
    """Whether `listed` is in the order of the pods' names (as the API server lists
    them), so that each of `by_group`, `failed` and `unheld` is too and a pod is
    placed in them by its name (`_told`)."""
    positional: bool = True
    """Whether `groups_listed`, `failed_listed` and `slots` are `listed`'s (`_told`
    keeps the lists by name alone; the next walk lays them out again)."""
    group_changes: tuple[object, dict[object, list[_PodChange]]] | None = None
    """The read the last `pods_by_group` was told changes since, and those changes
    by group (each pod in the group it was of and the one it is of); None if it was
    not told."""
    groups_read: object = None
    """The read (`read`) `groups` were made at, None if not known: a group is told its
    changes only if its replicas were made at the read they are changes since."""

    shapes_kept: tuple[object, tuple[str, str, str | None], ClusterShapes] | None = None
    """The shapes the last read derived, with the cluster's spec (the parsed model
    itself) and what of its metadata they read (`shapes_of`)."""

    def shapes_of(
        self, cluster: RayCluster, derive: Callable[[RayCluster], ClusterShapes]
    ) -> ClusterShapes:
        """`derive(cluster)` (`derive_shapes`), or the last read's shapes if derived
        from the very same spec object and equal metadata: shapes are made from the
        spec, the name, the namespace and the resize annotation alone, and a parsed
        model is never changed. The spec is compared by identity: the `Observer`
        hands on its parse of a spec listed the same (`Observer.cluster_spec`,
        compared in full by content, as a real API server's every get decodes a
        new object); any other spec (a new parse) derives anew."""
        meta = cluster.metadata
        key = (meta.name, meta.namespace, meta.annotations.get(IPPR_ANNOTATION))
        kept = self.shapes_kept
        if kept is not None and kept[0] is cluster.spec and kept[1] == key:
            return kept[2]
        shapes = derive(cluster)
        self.shapes_kept = (cluster.spec, key, shapes)
        return shapes

    def nodes_by_pod(self, state: RayState) -> Mapping[str, RayNode]:
        """`state.node_for_pod()` (read-only), with how it differs from the last read's
        (`node_delta`): none if the nodes are the last read's, else the state's own
        account of the pods whose node changed since the state before it
        (`RayState.delta`, `NodeMemory`) if that state's mapping is the one this memo
        last had. Otherwise None: every pod's node is looked up."""
        nodes, before = state.nodes, self.node_for_pod
        if nodes is self.ray_nodes:
            self.node_delta = NodeDelta(before, before, frozenset())
            return before
        found = state.node_for_pod()
        delta = state.delta
        self.node_delta = delta if delta is not None and delta.before is before else None
        self.ray_nodes, self.node_for_pod = nodes, found
        return found

    def pods_by_group(
        self,
        cluster: str,
        listed: Sequence[Pod],
        held: tuple[str, ...],
        changes: PodChanges | None = None,
    ) -> dict[str | None, _GroupListed]:
        """The cluster's worker pods by group (`_worker_pods_by_group`), the memo
        brought up to `listed` (and `held`, the shapes' groups) as one step.
        `changes`: how `listed` differs from the read before; if that is the read
        the memo has, only the pods changed are placed (`_told`)."""
        self.group_changes = None
        since = self.read
        self.read = None if changes is None else changes.read
        if (
            changes is not None
            and changes.pods is not None
            and since is not None
            and changes.since is since
            and cluster == self.cluster
            and held == self.held
            and self.in_name_order
            and len(listed) == len(self.listed) + _count_change(changes.pods)
        ):
            told = self._told(changes.pods, tuple(listed))
            if told is not None:
                self.by_group, self.failed, self.unheld, by_change = told
                self.listed = tuple(listed)
                self.group_changes = (since, by_change)
                return self.by_group
        if (
            cluster == self.cluster
            and _same_objects(self.listed, listed)
            and (held == self.held or self.positional)
        ):
            # Other groups held are found by place (`_unheld`): not after `_told`.
            if held != self.held:
                self.unheld, self.held = self._unheld(listed, held), held
            return self.by_group
        by_group = self.by_group_again(cluster, listed)
        touched = self.changed_groups
        if held != self.held or touched is None or not touched <= set(held):
            self.unheld = self._unheld(listed, held)
        self.cluster, self.listed, self.by_group, self.held = cluster, tuple(listed), by_group, held
        return by_group

    def _told(
        self, changes: Sequence[_PodChange], listed: tuple[Pod, ...]
    ) -> (
        tuple[dict[str | None, _GroupListed], list[Pod], list[Pod], dict[object, list[_PodChange]]]
        | None
    ):
        """`by_group` with each group a pod of which changed listed from `listed` at the
        first ask (`_GroupPods`), `failed` and `unheld` (short lists) with each changed
        pod let go from where it was and placed where it is, by its name (they are in
        name order, as listed); and the changes by group. A Python step for each
        change, none for the other pods. None if a pod told of is not where its name
        places it in those (the memo is not of the read the changes are since): then
        all is walked."""
        cluster = cast(str, self.cluster)
        held = set(self.held)
        failed, unheld = _NameOrdered(self.failed), _NameOrdered(self.unheld)
        by_change: dict[object, list[_PodChange]] = {}
        counts: dict[object, int] = {}
        """How many more pods each group has than in the read before."""
        for change in changes:
            name, before, after = change
            was = _NOT_WORKER if before is None else _group_of(cluster, before)
            now = _NOT_WORKER if after is None else _group_of(cluster, after)
            if before is not None and after is not None and was == now:
                # A pod written (the most of changes): its new version in its place.
                if was is not _NOT_WORKER:
                    counts.setdefault(was, 0)
                    by_change.setdefault(was, []).append(change)
                if (was not in held and not unheld.replace(name, before, after)) or (
                    not failed.replace(name, before, after, _failed)
                ):
                    return None
                continue
            if before is not None and (
                not failed.drop(name, before, before.status.phase == "Failed")
                or not unheld.drop(name, before, was not in held)
            ):
                return None
            if after is not None:
                failed.put(name, after, after.status.phase == "Failed")
                unheld.put(name, after, now not in held)
            if before is not None and was is not _NOT_WORKER:
                counts[was] = counts.get(was, 0) - 1
                by_change.setdefault(was, []).append((name, before, None))
            if after is not None and now is not _NOT_WORKER:
                counts[now] = counts.get(now, 0) + 1
                by_change.setdefault(now, []).append((name, None, after))
        by_group = dict(self.by_group)
        for group, more in counts.items():
            key = cast(str | None, group)
            kept = by_group.get(key)
            count = (0 if kept is None else len(kept)) + more
            if count < 0:
                return None
            by_group[key] = _GroupPods(cluster, group, listed, count)
        self.positional = False
        return by_group, failed.pods, unheld.pods, by_change

    def _unheld(self, listed: Sequence[Pod], held: tuple[str, ...]) -> list[Pod]:
        """The listed pods of none of `held`: every pod of a shape's group is a host
        of one of its replicas, so these are the pods no replica holds."""
        chosen = map(operator.not_, map(set(held).__contains__, self.groups_listed))
        return list(itertools.compress(listed, chosen))

    def by_group_again(self, cluster: str, listed: Sequence[Pod]) -> dict[str | None, _GroupListed]:
        """`_worker_pods_by_group`, a Python step only for the pods not listed last
        time (a pod's group is read from its labels, which a pod object keeps): while
        as many pods are listed as last time and each new object is of the group of
        the one in its place, only those places change (`_patched`); otherwise laid
        out again, in C but for the new objects."""
        if cluster == self.cluster and len(listed) == len(self.listed) and self.positional:
            patched = self._patched(listed)
            if patched is not None:
                self.in_name_order = False  # not known: a pod may be of another name
                return patched
        self.positional = True
        names = list(map(_POD_NAME, listed))
        self.in_name_order = all(map(operator.lt, names, itertools.islice(names, 1, None)))
        if cluster != self.cluster:
            self.group_of = {}
        found = list(map(self.group_of.get, map(id, listed), itertools.repeat(None)))
        for at in itertools.compress(
            itertools.count(), map(operator.is_, found, itertools.repeat(None))
        ):
            pod = listed[at]
            found[at] = (pod, _group_of(cluster, pod), pod.status.phase == "Failed")
        entries = cast(list[tuple[Pod, object, bool]], found)
        self.group_of = dict(zip(map(id, listed), entries, strict=True))
        self.groups_listed = groups = list(map(_SECOND, entries))
        self.failed_listed = list(map(_THIRD, entries))
        self.failed = list(itertools.compress(listed, self.failed_listed))
        self.slots = {}
        self.changed_groups = None
        by_group: dict[str | None, _GroupListed] = {}
        for group in dict.fromkeys(groups):
            if group is not _NOT_WORKER:
                chosen = map(operator.eq, groups, itertools.repeat(group))
                places = list(itertools.compress(itertools.count(), chosen))
                by_group[cast(str | None, group)] = list(map(listed.__getitem__, places))
                self.slots[group] = dict(zip(places, itertools.count()))
        return by_group

    def _patched(self, listed: Sequence[Pod]) -> dict[str | None, _GroupListed] | None:
        """The last read's pods by group with the objects new in their places put in,
        or None if one is of another group than the pod it replaces."""
        by_group = dict(self.by_group)
        touched: set[object] = set()
        failed = False
        failed_listed = list(self.failed_listed)
        for at in itertools.compress(itertools.count(), map(operator.is_not, listed, self.listed)):
            pod = listed[at]
            entry = self.group_of.get(id(pod))
            if entry is None:
                # Held by the entry, so no other object takes its `id` while here.
                entry = (pod, _group_of(cast(str, self.cluster), pod), pod.status.phase == "Failed")
                self.group_of[id(pod)] = entry
                # The pod it replaces is let go (listed elsewhere too, it is given
                # its entry again there, read from the pod object as ever).
                self.group_of.pop(id(self.listed[at]), None)
            group = entry[1]
            if group != self.groups_listed[at]:
                return None
            failed = failed or entry[2] or failed_listed[at]
            failed_listed[at] = entry[2]
            if group is not _NOT_WORKER:
                key = cast(str | None, group)
                if group not in touched:
                    by_group[key] = list(_pods_list(by_group[key]))
                cast(list[Pod], by_group[key])[self.slots[group][at]] = pod
            touched.add(group)
        if len(self.group_of) > 2 * len(listed):
            return None  # laid out again, which prunes the pods gone
        if failed:
            self.failed_listed = failed_listed
            self.failed = list(itertools.compress(listed, failed_listed))
        self.changed_groups = touched
        return by_group

    @property
    def made(self) -> list[Replica]:
        """The replicas the last read made (requested ones aside)."""
        return [r for group in self.groups.values() for r in group.replicas]

    def idled(self) -> dict[int, tuple[Replica, Replica]]:
        """The replicas the last read made as one of the read before with some hosts'
        idle times alone changed (the same pods, nodes but for their idle time, and
        marks), by `id`, each with that one: what is known of them without a look."""
        return {id(new): (new, old) for group in self.groups.values() for new, old in group.idled}


def _count_change(changes: Sequence[_PodChange]) -> int:
    """How many more pods are listed after `changes` than before."""
    return sum((after is not None) - (before is not None) for _, before, after in changes)


def _unplace(pods: list[Pod], name: str, pod: Pod) -> bool:
    """`pod` taken out of `pods` (in name order); False if it is not where its name
    places it."""
    at = bisect.bisect_left(pods, name, key=_POD_NAME)
    if at < len(pods) and pods[at] is pod:
        del pods[at]
        return True
    return False


def _replace(pods: list[Pod], name: str, before: Pod, after: Pod) -> bool:
    """`before` replaced by `after` (of the same name) in `pods` (in name order);
    False if `before` is not where its name places it."""
    at = bisect.bisect_left(pods, name, key=_POD_NAME)
    if at < len(pods) and pods[at] is before:
        pods[at] = after
        return True
    return False


def _failed(pod: Pod) -> bool:
    return pod.status.phase == "Failed"


def _place(pods: list[Pod], name: str, pod: Pod) -> None:
    """`pod` put into `pods` (in name order, names unique) where its name goes."""
    pods.insert(bisect.bisect_left(pods, name, key=_POD_NAME), pod)


@dataclass
class _NameOrdered:
    """A list of pods in name order, copied at its first change."""

    pods: list[Pod]
    copied: bool = False

    def drop(self, name: str, pod: Pod, held: bool) -> bool:
        """`pod` taken out if `held` (it is one of the list's); False if not found."""
        if not held:
            return True
        if not self.copied:
            self.pods, self.copied = list(self.pods), True
        return _unplace(self.pods, name, pod)

    def put(self, name: str, pod: Pod, held: bool) -> None:
        if held:
            if not self.copied:
                self.pods, self.copied = list(self.pods), True
            _place(self.pods, name, pod)

    def replace(
        self, name: str, before: Pod, after: Pod, held: Callable[[Pod], bool] | None = None
    ) -> bool:
        """`before` (held, or if `held` says so) replaced by `after` (if `held` says
        so, else held); False if `before` is not found."""
        was = True if held is None else held(before)
        now = True if held is None else held(after)
        if not was and not now:
            return True
        if not self.copied:
            self.pods, self.copied = list(self.pods), True
        if was and now:
            return _replace(self.pods, name, before, after)
        if was:
            return _unplace(self.pods, name, before)
        _place(self.pods, name, after)
        return True


def _group_replicas(
    shape: SliceShape,
    pods: _GroupListed,
    ray_nodes: Mapping[str, RayNode],
    doomed: set[str],
    now_s: float,
    previous: _GroupMemo | None = None,
    node_delta: NodeDelta | None = None,
    registrations: Registrations | None = None,
    changes: Sequence[_PodChange] | None = None,
) -> _GroupMemo:
    """The group's replicas; `previous`: the last read's, reused where made from the
    same objects. `node_delta`: a mapping `ray_nodes` differs from only in the nodes
    of these pods (`ReplicaMemo.nodes_by_pod`). `changes`: the group's pods changed
    since `previous` was made, if told (`ReplicaMemo._told`)."""
    same_shape = previous is not None and (previous.shape is shape or previous.shape == shape)
    remade: set[int] | None = None  # None: no replica is known to be as it was
    if previous is not None and same_shape:
        partition, remade = _repartition(shape, previous, pods, changes)
    else:
        partition = _partition(shape, _pods_list(pods))
    names = partition.names
    moved: Iterable[int] | None = None  # places whose node is not the last read's
    if (
        previous is not None
        and node_delta is not None
        and node_delta.now is ray_nodes
        and node_delta.before is previous.ray_nodes
        and names is previous.partition.names
    ):
        # Only the pods whose node changed are looked up (a look-up of every pod's
        # name, a string compared in full, was most of a round's work here).
        nodes = list(previous.nodes)
        place_of = previous.partition.place_of
        places: Mapping[str, Sequence[int]] = (
            previous.partition.places
            if place_of is None
            else {name: (place_of[name],) for name in node_delta.pods if name in place_of}
        )
        moved = []
        for name in node_delta.pods:
            for at in places.get(name, ()):
                nodes[at] = node = ray_nodes.get(name)
                if node is not previous.nodes[at]:
                    moved.append(at)
    else:
        nodes = list(map(ray_nodes.get, names))
    # Mostly none is marked for removal: then no name is looked up.
    marks = list(map(doomed.__contains__, names)) if doomed else [False] * len(names)

    def made(index: int) -> Replica:
        return _replica(
            shape,
            partition.keys[index],
            partition.identified[index],
            partition.members[index],
            nodes[partition.spans[index]],
            doomed,
            now_s,
            registrations,
        )

    if previous is not None and remade is not None:
        # Every replica none of whose pods came, went or changed is made again only
        # if a member's node or mark is not the same (the changed nodes found in C),
        # or it reads the time; the others are the last read's, put in place in C.
        # One whose nodes changed in their idle time alone (most changes of a large
        # cluster's nodes: every idle node's, every read) is the last read's with
        # those hosts' idle times.
        # The last read's replicas, nodes and marks in this layout's places: as they
        # were where the replicas or pods are in the same places; else by key and by
        # pod name (a replica not in `remade` has the very pods it had, and a pod's
        # node and mark are its name's).
        last = previous.partition
        before_replicas: Sequence[Replica | None] = previous.replicas
        if partition.keys is not last.keys:
            by_key = dict(zip(last.keys, previous.replicas, strict=True))
            before_replicas = list(map(by_key.get, partition.keys))
        before_nodes: Sequence[RayNode | None] = previous.nodes
        before_marks: Sequence[bool | None] = previous.doomed
        if names is not last.names:
            last_place_of = last.place_of
            if last_place_of is not None:
                # Each name's place in the last layout (-1: not in it, read as None
                # at the end of the lists), one map of the names for both.
                ats = list(map(last_place_of.get, names, itertools.repeat(-1)))
                before_nodes = list(map([*previous.nodes, None].__getitem__, ats))
                before_marks = list(map([*previous.doomed, None].__getitem__, ats))
            else:
                nodes_of = dict(zip(last.names, previous.nodes, strict=True))
                before_nodes = list(map(nodes_of.get, names))
                before_marks = list(
                    map(dict(zip(last.names, previous.doomed, strict=True)).get, names)
                )
        changed = set(remade)
        if marks != before_marks:
            pairs = zip(partition.owner, marks, before_marks, strict=True)
            changed.update(owner for owner, mark, last_mark in pairs if mark != last_mark)
        changed.update(partition.untimed)
        idled: dict[int, dict[str, float]] = {}
        if moved is None or before_nodes is not previous.nodes:
            moved = itertools.compress(itertools.count(), map(operator.is_not, nodes, before_nodes))
        for at in moved:
            owner = partition.owner[at]
            if owner in changed:
                continue
            node, before = nodes[at], before_nodes[at]
            if node is not None and before is not None and _idled_only(before, node):
                idled.setdefault(owner, {})[names[at]] = node.idle_s
            else:
                changed.add(owner)
                idled.pop(owner, None)
        replicas = cast(list[Replica], list(before_replicas))
        for index in changed:
            replicas[index] = made(index)
        idled_from: list[tuple[Replica, Replica]] = []
        for index, idle_s in idled.items():
            was = replicas[index]
            replicas[index] = _idled_again(was, idle_s)
            idled_from.append((replicas[index], was))
        if before_replicas is previous.replicas:
            draining = previous.draining + sum(
                (replicas[index].state is ReplicaState.DRAINING)
                - (previous.replicas[index].state is ReplicaState.DRAINING)
                for index in changed
            )
        else:
            draining = list(map(_STATE, replicas)).count(ReplicaState.DRAINING)
        return _GroupMemo(
            shape, pods, partition, nodes, marks, replicas, draining, ray_nodes, tuple(idled_from)
        )
    reusable: Callable[[int], Replica | None]
    if previous is None or not same_shape:
        reusable = _none
    else:
        reusable = _by_key(previous, partition, nodes, marks)
    replicas = []
    for index in range(len(partition.keys)):
        kept = reusable(index) if partition.timeless[index] else None
        replicas.append(made(index) if kept is None else kept)
    draining = list(map(_STATE, replicas)).count(ReplicaState.DRAINING)
    return _GroupMemo(shape, pods, partition, nodes, marks, replicas, draining, ray_nodes)


def _idled_only(before: RayNode, node: RayNode) -> bool:
    """Whether a host made from `node` differs from one made from `before` in its idle
    time alone: what a host takes of its node but that is the very same. The objects
    are compared, not their contents, so a node parsed afresh (a real GCS's reply,
    any change but the idle time) is not taken for unchanged; the same pod's node
    (`instance_id`) by its looking up."""
    return (
        node.node_id == before.node_id
        and node.status == before.status
        and node.labels is before.labels
        and node.total is before.total
        and node.available is before.available
    )


def _idled_again(replica: Replica, idle_s: Mapping[str, float]) -> Replica:
    """`replica` (made from the same pods and marks) with the hosts of `idle_s` idle
    that long: what `_replica` makes when only those nodes' idle times changed (a
    host's idle time decides nothing else of its replica)."""
    hosts = tuple(
        host if host.pod_name not in idle_s else _HOST_IDLE(host, idle_s[host.pod_name])
        for host in replica.hosts
    )
    remade: Replica = _REPLICA_HOSTS(replica, hosts)
    return remade


_HOST_IDLE = Remade(Host, "idle_s")
_REPLICA_HOSTS = Remade(Replica, "hosts")


def _none(index: int) -> Replica | None:
    return None


def _by_key(
    previous: _GroupMemo, partition: _Partition, nodes: list[RayNode | None], marks: list[bool]
) -> Callable[[int], Replica | None]:
    """After the group's pods changed: a replica of the last read under the same name,
    if made from the very same pods, nodes and marks (and equally identified); or
    with its hosts' new idle times if some nodes changed in that alone."""
    last = previous.partition

    def reusable(index: int) -> Replica | None:
        at = last.index_of.get(partition.keys[index])
        if (
            at is None
            or not last.timeless[at]
            or last.identified[at] != partition.identified[index]
        ):
            return None
        span, last_span = partition.spans[index], last.spans[at]
        if not (
            _same_objects(last.members[at], partition.members[index])
            and previous.doomed[last_span] == marks[span]
        ):
            return None
        before, now = previous.nodes[last_span], nodes[span]
        if _same_objects(before, now):
            return previous.replicas[at]
        idle_s: dict[str, float] = {}
        for name, last_node, node in zip(partition.names[span], before, now, strict=True):
            if node is last_node:
                continue
            if node is None or last_node is None or not _idled_only(last_node, node):
                return None
            idle_s[name] = node.idle_s
        return _idled_again(previous.replicas[at], idle_s)

    return reusable


def _replica(
    shape: SliceShape,
    key: str,
    identified: bool,
    members: list[Pod],
    nodes: list[RayNode | None],
    doomed: set[str],
    now_s: float,
    registrations: Registrations | None = None,
) -> Replica:
    hosts = []
    for fallback, (pod, node) in enumerate(zip(members, nodes, strict=True)):
        dead = pod.failed or (node is not None and node.dead)
        registered_at_s = None
        if registrations is not None and node is not None and not dead:
            # `Host.registered`: a node (every RayNode has an id) and not dead.
            registered_at_s = registrations.first_seen_s.get(pod.name, registrations.now_s)
        hosts.append(
            Host(
                pod_name=pod.name,
                host_index=_host_index(pod, fallback),
                node_id=node.node_id if node else None,
                labels=node.labels if node else {},
                total=node.total if node else {},
                available=node.available if node else {},
                idle_s=node.idle_s if node else 0.0,
                dead=dead,
                registered_at_s=registered_at_s,
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
    pods: Sequence[Pod],
    ray_nodes: Mapping[str, RayNode],
    replicas: Iterable[Replica],
) -> tuple[Host, ...]:
    """The cluster's live Ray nodes that are no replica's host: the head, and workers
    of groups left out of the shapes. Ray's scheduler packs demand on every node it
    has an instance for (one per pod), head included; so does the policy."""
    held = set(map(_HOST_POD, itertools.chain.from_iterable(map(_HOSTS, replicas))))
    found = []
    # The replicas' hosts left out in C (`map`): a Python step for the others only.
    names = list(map(_POD_NAME, pods))
    free = map(operator.not_, map(held.__contains__, names))
    for index in itertools.compress(itertools.count(), free):
        pod = pods[index]
        node = ray_nodes.get(names[index])
        if (
            pod.terminating
            or pod.failed
            or node is None
            or node.status not in ("RUNNING", "IDLE")
            or pod.metadata.labels.get(labels.KUBERAY_CLUSTER, cluster.metadata.name)
            != cluster.metadata.name
        ):
            continue
        found.append(node.as_fixed_host(pod.name))
    return tuple(found)
