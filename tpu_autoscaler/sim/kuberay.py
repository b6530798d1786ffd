"""The KubeRay operator (>= 1.6) as it treats worker groups, with the TPU webhook's
pod mutations folded into pod creation.

With RayMultiHostIndexing on: a replica is `numOfHosts` pods sharing a replica name;
naming any of its pods in `workersToDelete` deletes the whole replica and clears the
list; a replica with a missing or failed pod is deleted whole; `replicas - existing`
new replicas are created. With the gate off, only named pods are deleted and nothing
is atomic (what older KubeRay does), so that mode can be tested too."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tpu_autoscaler import labels
from tpu_autoscaler.manifest import parse_raycluster
from tpu_autoscaler.shapes import derive_shapes
from tpu_autoscaler.sim import objects
from tpu_autoscaler.sim.clock import EventQueue
from tpu_autoscaler.sim.kube import ObjectStore

ReplicaCreated = Callable[[str, str, list[str]], None]
"""Called with (group, replica name, pod names) when the operator creates a replica."""


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
    ) -> None:
        self.store = store
        self.events = events
        self.namespace = namespace
        self.name = name
        self.multi_host_indexing = multi_host_indexing
        self.on_replica_created = on_replica_created
        self.on_pods_deleted = on_pods_deleted
        self._serials = itertools.count(1)
        self._reconciling = False
        self.replicas_created: dict[str, int] = defaultdict(int)

    def on_store_change(self, kind: str, obj: dict[str, Any]) -> None:
        """A store watcher: reconcile soon after the RayCluster changes or a pod fails."""
        if kind == "RayCluster" or (kind == "Pod" and obj["status"]["phase"] == "Failed"):
            self.events.after(0.0, self.reconcile)

    def reconcile(self) -> None:
        if self._reconciling:
            return
        self._reconciling = True
        try:
            self._reconcile()
        finally:
            self._reconciling = False

    def _reconcile(self) -> None:
        raycluster = self.store.get_raycluster(self.namespace, self.name)
        shapes = derive_shapes(parse_raycluster(raycluster, "operator"))
        created = self.events.now_s
        for index, spec in enumerate(raycluster["spec"].get("workerGroupSpecs", [])):
            shape = shapes.shape(spec["groupName"])
            if shape is None:
                continue
            pods = self.store.list_pods(
                self.namespace,
                {labels.KUBERAY_CLUSTER: self.name, labels.KUBERAY_GROUP: shape.group},
            )
            replicas = self._replicas(pods, shape.hosts_per_replica)
            doomed = set(spec.get("scaleStrategy", {}).get("workersToDelete") or [])
            requested: list[str] = []
            unhealthy: list[str] = []
            for _, members in sorted(replicas.items()):
                names = {p["metadata"]["name"] for p in members}
                failed = any(p["status"]["phase"] in ("Failed", "Succeeded") for p in members)
                incomplete = self.multi_host_indexing and len(members) < shape.hosts_per_replica
                if self.multi_host_indexing and (failed or incomplete):
                    unhealthy += sorted(names)
                elif self.multi_host_indexing and names & doomed:
                    requested += sorted(names)
                elif not self.multi_host_indexing:
                    requested += sorted(names & doomed)
                    unhealthy += sorted(
                        p["metadata"]["name"] for p in members if p["status"]["phase"] == "Failed"
                    )
            for doomed_pods, asked in ((requested, True), (unhealthy, False)):
                for name in doomed_pods:
                    if self.store.pod(self.namespace, name) is not None:
                        self.store.delete_pod(self.namespace, name)
                if doomed_pods and self.on_pods_deleted is not None:
                    self.on_pods_deleted(doomed_pods, asked)
            if doomed:
                path = f"/spec/workerGroupSpecs/{index}/scaleStrategy"
                self.store.patch_raycluster(
                    self.namespace,
                    self.name,
                    [{"op": "add", "path": path, "value": {"workersToDelete": []}}],
                    None,
                )
            remaining = self._replicas(
                self.store.list_pods(
                    self.namespace,
                    {labels.KUBERAY_CLUSTER: self.name, labels.KUBERAY_GROUP: shape.group},
                ),
                shape.hosts_per_replica,
            )
            desired = min(
                max(int(spec.get("replicas") or 0), shape.min_replicas), shape.max_replicas
            )
            used_indexes = {
                int(p["metadata"]["labels"][labels.KUBERAY_REPLICA_INDEX])
                for members in remaining.values()
                for p in members
            }
            replica_indexes = (i for i in itertools.count() if i not in used_indexes)
            existing = len(remaining)
            if not self.multi_host_indexing:
                pod_count = sum(len(members) for members in remaining.values())
                existing = -(-pod_count // shape.hosts_per_replica)
            for _ in range(desired - existing):
                replica_index = next(replica_indexes)
                serial = next(self._serials)
                new_pods = [
                    objects.worker_pod(
                        self.name,
                        self.namespace,
                        shape,
                        replica_index,
                        host,
                        rfc3339(created),
                        "Pending",
                        serial,
                    )
                    for host in range(shape.hosts_per_replica)
                ]
                for new_pod in new_pods:
                    self.store.create_pod(new_pod)
                self.replicas_created[shape.group] += 1
                if self.on_replica_created is not None:
                    key = (
                        new_pods[0]["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
                        or new_pods[0]["metadata"]["name"]
                    )
                    self.on_replica_created(
                        shape.group, key, [p["metadata"]["name"] for p in new_pods]
                    )

    def _replicas(self, pods: list[dict[str, Any]], hosts: int) -> dict[str, list[dict[str, Any]]]:
        """Pods by replica; with the gate off every pod stands alone."""
        replicas: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            key = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME)
            if key is None or hosts == 1 or not self.multi_host_indexing:
                key = pod["metadata"]["name"]
            replicas[key].append(pod)
        return replicas


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
