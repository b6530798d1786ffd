"""Which pods does KubeRay (v1.7.0) delete and create in one worker group, in what
order? `reconcilePods` and `reconcileMultiHostWorkerGroup` of its
`raycluster_controller.go`, with the scale expectations of
`expectations/scale_expectations.go`; `controlplane/kuberay.py` runs them group after
group, one reconcile at a time.

Per worker group, in KubeRay's order:
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

Each API call is a step: the group's reconcile yields the call's latency before making
it, so other clients read the cluster between the calls. A step that ends the
reconcile with an error raises `Requeue`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from tpu_autoscaler.controlplane import admitted_pod, kuberay_pod
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.kuberay_cache import ClusterPods, Pod, pod_name, terminated
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape

ReplicaCreated = Callable[[str, str, list[str]], None]
"""Called with (group, replica name, pod names) once the operator created a replica's
last pod (with the gate off: each pod alone)."""
PodsDeleted = Callable[[list[str], bool], None]
"""Called with (pod names, requested) when the operator starts deleting pods."""

RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""What Kubernetes' `rand.String` (generateName, KubeRay's replica names) draws from."""


class Requeue(Exception):
    """KubeRay's reconcile ends with this error; the status records it."""


class _Group(NamedTuple):
    """What one reconcile knows of a worker group."""

    spec: dict[str, Any]
    shape: SliceShape | None
    """None: a shape the webhook would not admit pods for (nothing is created)."""
    hosts: int
    pods: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.spec["groupName"])


class GroupReconciler:
    """The worker groups' pods of one RayCluster, as KubeRay's reconcile treats them:
    what it deletes and creates, the deletions it still expects to see, and the
    replicas it is creating right now."""

    def __init__(
        self,
        store: ObjectStore,
        events: EventQueue,
        namespace: str,
        cluster: str,
        multi_host_indexing: bool,
        world: WorldModel,
        on_replica_created: ReplicaCreated | None,
        on_pods_deleted: PodsDeleted | None,
    ) -> None:
        self.store = store
        self.events = events
        self.namespace = namespace
        self.cluster = cluster
        self.multi_host_indexing = multi_host_indexing
        self.world = world
        self.on_replica_created = on_replica_created
        self.on_pods_deleted = on_pods_deleted
        self.replicas_created: dict[str, int] = defaultdict(int)
        self.creating: set[str] = set()
        """Replicas (or, gate off, pods) whose pods are being created right now."""
        self.deleting: set[str] = set()
        """Pods the operator is deleting right now, one call at a time: a replica's
        pods go one by one (a pending pod at once, a running one after its grace)."""
        self._expected_deletions: dict[str, set[str]] = defaultdict(set)
        """Per group, the pods it deleted and may still see listed (pruned of those
        no longer stored when the group is reconciled)."""
        self._expected_stored: dict[str, set[str]] = defaultdict(set)
        """Per group, those of its expected deletions stored now, kept from the
        store's notifications: a reconcile looked each one up (every pod of a
        scale-down, terminating for its grace period, on every pod change)."""
        self._expecting: dict[str, set[str]] = {}
        """The groups expecting each pod's deletion, by pod name."""
        self.cache = ClusterPods(store, namespace, cluster)
        """The cluster's pods as the operator's informer holds them."""
        self._pod_builder = kuberay_pod.WorkerPodBuilder()
        store.watchers.append(self._heard)

    def reconcile(self, spec: dict[str, Any], shape: SliceShape | None) -> Iterator[float]:
        """One worker group: skipped while its scale expectations are unmet; whole
        replicas with RayMultiHostIndexing on and numOfHosts > 1, else pod by pod."""
        if not self._expectations_met(spec["groupName"]):
            return
        if self.multi_host_indexing and hosts_per_replica(spec) > 1:
            yield from self._multi_host_group(spec, shape)
            return
        pods = self._pods(spec["groupName"])
        yield from self._pod_group(_Group(spec, shape, hosts_per_replica(spec), pods))

    def _pods(self, group: str) -> list[dict[str, Any]]:
        return self.store.list_pods(
            self.namespace, {labels.KUBERAY_CLUSTER: self.cluster, labels.KUBERAY_GROUP: group}
        )

    def _expectations_met(self, group: str) -> bool:
        """Whether none of the pods the group deleted is stored still; those no longer
        stored are expected no more (a pod made again under the name later is not)."""
        expected = self._expected_deletions[group]
        stored = self._expected_stored[group]
        if len(stored) != len(expected):
            for name in expected - stored:
                groups = self._expecting[name]
                groups.discard(group)
                if not groups:
                    del self._expecting[name]
            expected &= stored
        return not expected

    def _expect_deletion(self, group: str, name: str) -> None:
        """`group` deletes the stored pod `name` and will wait until it is gone."""
        self._expected_deletions[group].add(name)
        self._expected_stored[group].add(name)
        self._expecting.setdefault(name, set()).add(group)

    def _heard(self, kind: str, obj: dict[str, Any]) -> None:
        """A store notification: an expected pod's presence, read back from the store
        (another watcher may have written it again since)."""
        if kind != "Pod":
            return
        meta = obj["metadata"]
        groups = self._expecting.get(meta["name"])
        if not groups or meta.get("namespace") != self.namespace:
            return
        stored = self.store.pod(self.namespace, meta["name"]) is not None
        for group in groups:
            if stored:
                self._expected_stored[group].add(meta["name"])
            else:
                self._expected_stored[group].discard(meta["name"])

    def _multi_host_group(self, spec: dict[str, Any], shape: SliceShape | None) -> Iterator[float]:
        """Whole replicas, decided from the group's pods as they are when it starts
        (the cache's, read once: it moves on while the calls take time)."""
        name = str(spec["groupName"])
        hosts = hosts_per_replica(spec)
        pods = self.cache.group(name)
        short = pods.short_replicas(hosts)
        if short:
            yield from self._delete(name, pods.members(short[0]), requested=False)
            raise Requeue(f"cleaned up incomplete replica group {short[0]}, requeueing")
        # A Failed or Succeeded pod deletes its replica (one without the replica
        # label: the replica of an empty name, if there is one).
        unhealthy: list[list[Pod]] = []
        unhealthy_replicas: set[str] = set()
        deleted: set[str] = set()
        for dead in sorted(pods.terminated):
            if dead in deleted:
                continue
            replica = pods.terminated[dead]["metadata"]["labels"].get(
                labels.KUBERAY_REPLICA_NAME, ""
            )
            if replica in pods.replicas:
                unhealthy.append(pods.members(replica))
                unhealthy_replicas.add(replica)
                deleted |= {pod_name(p) for p in unhealthy[-1]}
        named = set(spec.get("scaleStrategy", {}).get("workersToDelete") or [])
        doomed_replicas = sorted(
            {
                pods.pods[named_pod]["metadata"]["labels"][labels.KUBERAY_REPLICA_NAME]
                for named_pod in named
                if named_pod in pods.pods
                and labels.KUBERAY_REPLICA_NAME in pods.pods[named_pod]["metadata"]["labels"]
            }
        )
        doomed = [p for replica in doomed_replicas for p in pods.members(replica)]
        to_create = desired_replicas(spec) - (len(pods.replicas) - len(unhealthy_replicas))
        used_indexes: set[int] = set()
        if to_create > 0 and not doomed and shape is not None:
            used_indexes = pods.replica_indexes(unhealthy_replicas)
        for members in unhealthy:
            yield from self._delete(name, members, requested=False)
        if doomed:
            yield from self._delete(name, doomed, requested=True)
            raise Requeue(f"deleted {len(doomed)} worker Pods based on ScaleStrategy, requeueing")
        if shape is None:
            return
        index = 0
        for _ in range(to_create):
            while index in used_indexes:
                index += 1
            used_indexes.add(index)
            replica = self._replica_name(name)
            self.creating.add(replica)
            created = []
            try:
                for host in range(hosts):
                    yield self.world.pod_create_latency_s
                    created.append(self._create_pod(shape, index, host, replica))
            finally:
                self.creating.discard(replica)
            self._created(name, replica, created)

    def _pod_group(self, group: _Group) -> Iterator[float]:
        unhealthy = [p for p in group.pods if terminated(p)]
        if unhealthy:
            yield from self._delete(group.name, unhealthy, requested=False)
            raise Requeue(f"delete {len(unhealthy)} unhealthy worker Pods")
        named = set(group.spec.get("scaleStrategy", {}).get("workersToDelete") or [])
        doomed = [p for p in group.pods if p["metadata"]["name"] in named]
        yield from self._delete(group.name, doomed, requested=True)
        gone = {p["metadata"]["name"] for p in doomed}
        remaining = [p for p in group.pods if p["metadata"]["name"] not in gone]
        missing = desired_replicas(group.spec) * group.hosts - len(remaining)
        shape = group.shape
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
                    for p in self._pods(group.name)
                    if p["metadata"]["labels"].get(labels.WEBHOOK_REPLICA_INDEX)
                    == pod["metadata"]["labels"].get(labels.WEBHOOK_REPLICA_INDEX)
                ]
                if len(members) < shape.hosts_per_replica:
                    continue  # GKE provisions a slice once all its pods exist
                self._created(group.name, name, [p["metadata"]["name"] for p in members])
            else:
                self._created(group.name, name, [name])

    # --- API calls -------------------------------------------------------------------

    def _create_pod(
        self, shape: SliceShape, replica_index: int, host: int, replica: str | None
    ) -> dict[str, Any]:
        """`createWorkerPodWithIndex`: the pod `buildWorkerPod` makes from the group's
        template, POSTed; the store's admission runs the TPU webhook on it. The name the
        API server makes of its generateName is drawn here, on the seeded random."""
        raycluster = self.store.raycluster(self.namespace, self.cluster)  # read-only
        group = next(
            (g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == shape.group),
            None,
        ) or admitted_pod.group_template(shape)
        pod = self._pod_builder.build(
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
        return self.store.store_pod(pod)  # handed over; the answer is read-only

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
        names = {str(p["metadata"]["name"]) for p in pods}
        self.deleting |= names
        try:
            for name in sorted(names):
                yield self.world.api_call_latency_s
                if self.store.pod(self.namespace, name) is None:
                    continue
                self._expect_deletion(group, name)
                self.store.delete_pod(self.namespace, name)
        finally:
            self.deleting -= names

    def _replica_name(self, group: str) -> str:
        """KubeRay's `GenerateRayWorkerReplicaGroupName`: no check that the name is free."""
        return f"{group}-{self._random5()}"

    def _random5(self) -> str:
        return "".join(self.events.random.choice(RANDOM_ALPHABET) for _ in range(5))


def hosts_per_replica(spec: dict[str, Any]) -> int:
    """A group's `numOfHosts` as KubeRay reads it: at least 1."""
    return max(1, int(spec.get("numOfHosts") or 1))


def desired_replicas(spec: dict[str, Any]) -> int:
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
