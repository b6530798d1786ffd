"""The pods of one RayCluster as the simulated KubeRay operator's informer cache
holds them, kept up to date from the object store's notifications instead of listed
and regrouped on every reconcile.

KubeRay reconciles on every change of any of the cluster's pods, and each reconcile
walked every pod of each group (its replicas, its Failed pods, the indexes in use)
and of the cluster (the status counts): a run's cost grew with the square of its
pods, and at 1,024 slices that walk was the larger part of a run. What a reconcile
reads is kept here instead, changed one pod at a time as the store tells of it:

- per worker group, its pods by replica (the `ray.io/worker-group-replica-name`
  label, fixed once a pod is stored), how many each replica has, and its Failed
  or Succeeded pods;
- the cluster's worker pods that are Running, and those of them not being deleted.

A reconcile reads it once, at its start, as it read its list before: what it
decides from is the cluster as it was then, whatever changes while its calls take
time (`controlplane/kuberay_groups.py`)."""

from __future__ import annotations

from typing import Any

from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels

Pod = dict[str, Any]
"""A stored pod, read only (the store never changes one in place)."""


def pod_name(pod: Pod) -> str:
    return str(pod["metadata"]["name"])


def _phase(pod: Pod) -> str | None:
    phase: str | None = (pod.get("status") or {}).get("phase")
    return phase


def terminated(pod: Pod) -> bool:
    """KubeRay's `shouldDeletePod` for a worker: Failed or Succeeded."""
    return _phase(pod) in ("Failed", "Succeeded")


class GroupPods:
    """One worker group's pods: by replica, and those Failed or Succeeded."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        """Every pod of the group by name, those without a replica label included."""
        self.replicas: dict[str, dict[str, Pod]] = {}
        """The pods of each replica (by its replica name label) by pod name."""
        self.replicas_of_size: dict[int, set[str]] = {}
        """The replicas that have so many pods: a replica short of its hosts is found
        without a walk of every replica."""
        self.terminated: dict[str, Pod] = {}
        """Pods Failed or Succeeded (KubeRay's `shouldDeletePod`), by name."""
        self.first_of: dict[str, str] = {}
        """Each replica's first pod by name, whose replica index label stands for the
        replica's (`replica_indexes`): a reconcile that creates replicas read every
        replica's sorted pods for it."""

    def add(self, pod: Pod) -> None:
        name = pod_name(pod)
        self.pods[name] = pod
        if terminated(pod):
            self.terminated[name] = pod
        replica = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
        if replica is not None:
            members = self.replicas.setdefault(replica, {})
            self._resized(replica, len(members), len(members) + 1)
            members[name] = pod
            first = self.first_of.get(replica)
            if first is None or name < first:
                self.first_of[replica] = name

    def replace(self, pod: Pod) -> None:
        """`pod`, a new version of a pod held under the same replica, in place of the
        one held: its replica keeps its members, size and first pod."""
        name = pod_name(pod)
        self.pods[name] = pod
        if terminated(pod):
            self.terminated[name] = pod
        else:
            self.terminated.pop(name, None)
        replica = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
        if replica is not None:
            self.replicas[replica][name] = pod

    def remove(self, pod: Pod) -> None:
        name = pod_name(pod)
        del self.pods[name]
        self.terminated.pop(name, None)
        replica = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
        if replica is not None:
            members = self.replicas[replica]
            del members[name]
            self._resized(replica, len(members) + 1, len(members))
            if not members:
                del self.replicas[replica]
                del self.first_of[replica]
            elif self.first_of[replica] == name:
                self.first_of[replica] = min(members)

    def _resized(self, replica: str, before: int, after: int) -> None:
        if before:
            sized = self.replicas_of_size[before]
            sized.discard(replica)
            if not sized:
                del self.replicas_of_size[before]
        if after:
            self.replicas_of_size.setdefault(after, set()).add(replica)

    def members(self, replica: str) -> list[Pod]:
        """The replica's pods now, by name (a list of its own: the cache moves on)."""
        pods = self.replicas.get(replica, {})
        return [pods[name] for name in sorted(pods)]

    def replica_indexes(self, left_out: set[str]) -> set[int]:
        """The replica index of each replica but those `left_out`: the
        `ray.io/worker-group-replica-index` label of its first pod by name, -1 if it
        has none (a label that is not a number raises ValueError, as KubeRay's
        reconcile read it)."""
        replicas = self.replicas
        return {
            int(
                replicas[replica][first]["metadata"]["labels"].get(labels.KUBERAY_REPLICA_INDEX, -1)
            )
            for replica, first in self.first_of.items()
            if replica not in left_out
        }

    def short_replicas(self, hosts: int) -> list[str]:
        """The replicas with fewer pods than `hosts`, by name."""
        return sorted(
            replica
            for size, replicas in self.replicas_of_size.items()
            if size < hosts
            for replica in replicas
        )


class ClusterPods:
    """The pods of RayCluster `cluster` in `namespace` of `store`, by worker group, and
    the counts its status is made of; kept up to date by listening to `store`."""

    def __init__(self, store: ObjectStore, namespace: str, cluster: str) -> None:
        self.store = store
        self.namespace = namespace
        self.cluster = cluster
        self.groups: dict[str, GroupPods] = {}
        self.running_workers = 0
        """Worker pods Running, those being deleted included (`availableWorkerReplicas`)."""
        self.ready_workers = 0
        """Worker pods Running and not being deleted (`readyWorkerReplicas`)."""
        self._held: dict[str, Pod] = {}
        """The version of each pod counted here, by name."""
        for pod in store.list_pods(namespace, {labels.KUBERAY_CLUSTER: cluster}):
            self._add(pod)
        store.watchers.append(self.heard)

    def group(self, name: str) -> GroupPods:
        return self.groups.get(name) or GroupPods()

    def heard(self, kind: str, obj: dict[str, Any]) -> None:
        """A store notification: the pod's stored version (or its absence, once
        removed) replaces the one counted. Read back from the store, not taken from
        the notification: a watcher that writes while hearing of a change makes the
        ones after it hear the newer version first."""
        if kind != "Pod":
            return
        meta = obj["metadata"]
        if meta.get("namespace") != self.namespace:
            return
        if (meta.get("labels") or {}).get(labels.KUBERAY_CLUSTER) != self.cluster:
            return
        name = str(meta["name"])
        stored = self.store.pod(self.namespace, name)
        held = self._held.get(name)
        if held is stored:
            return
        if held is not None and stored is not None and _same_place(held, stored):
            # A write to the pod (its phase, node, deletion): most of what is heard.
            self._replace(held, stored)
            return
        if held is not None:
            self._remove(held)
        if stored is not None:
            self._add(stored)

    def _add(self, pod: Pod) -> None:
        self._held[pod_name(pod)] = pod
        pod_labels = pod["metadata"].get("labels") or {}
        group = pod_labels.get(labels.KUBERAY_GROUP)
        if group is not None:
            self.groups.setdefault(group, GroupPods()).add(pod)
        self._count(pod, 1)

    def _replace(self, held: Pod, pod: Pod) -> None:
        """`pod` counted in place of `held`, its older version in the same group and
        replica: what `_remove` then `_add` leave, without taking the replica apart."""
        self._held[pod_name(pod)] = pod
        group = pod["metadata"]["labels"].get(labels.KUBERAY_GROUP)
        if group is not None:
            self.groups[group].replace(pod)
        self._count(held, -1)
        self._count(pod, 1)

    def _remove(self, pod: Pod) -> None:
        del self._held[pod_name(pod)]
        group = (pod["metadata"].get("labels") or {}).get(labels.KUBERAY_GROUP)
        if group is not None:
            pods = self.groups[group]
            pods.remove(pod)
            if not pods.pods:
                del self.groups[group]
        self._count(pod, -1)

    def _count(self, pod: Pod, sign: int) -> None:
        if (
            pod["metadata"]["labels"].get(labels.KUBERAY_NODE_TYPE) == "worker"
            and _phase(pod) == "Running"
        ):
            self.running_workers += sign
            if not pod["metadata"].get("deletionTimestamp"):
                self.ready_workers += sign


def _same_place(held: Pod, pod: Pod) -> bool:
    """Whether two versions of a pod are held in the same group and replica (a pod's
    labels are fixed once stored, but a store mirroring a real server could see
    them relabelled): the same labels object, or equal group and replica labels."""
    held_labels = held["metadata"].get("labels") or {}
    pod_labels = pod["metadata"].get("labels") or {}
    return held_labels is pod_labels or (
        held_labels.get(labels.KUBERAY_GROUP) == pod_labels.get(labels.KUBERAY_GROUP)
        and held_labels.get(labels.KUBERAY_REPLICA_NAME)
        == pod_labels.get(labels.KUBERAY_REPLICA_NAME)
    )
