"""What a local cluster looks like now, and what changed since the last look: the
worker pods from the object store and their Ray nodes from the GCS, read into an
`Observation` every `OBSERVE_EVERY_S`; the scaling events between two observations
(`timeline.changes`) kept in order and passed on as they happen."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.adapters.ray.state import from_message, infeasible_texts
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.local.processes import pod_environment
from tpu_autoscaler.local.timeline import (
    HostView,
    Observation,
    RayNodeEnd,
    ReplicaView,
    ScalingEvent,
    changes,
)

OBSERVE_EVERY_S = 0.5


@dataclass(eq=False)
class Observer:
    """The cluster's timeline: observations of its pods and Ray nodes, and the scaling
    events between them (`history`), each also handed to `on_event`."""

    store: ObjectStore
    lock: threading.RLock
    operator: KubeRayOperator
    namespace: str
    name: str
    started_s: float
    on_event: Callable[[ScalingEvent], None]
    gcs: Any = None
    """The head's `GcsClient`, once it answers."""
    history: list[ScalingEvent] = field(default_factory=list)
    _observed: Observation = field(default_factory=lambda: Observation(0.0), init=False)
    _next_observation_s: float = field(default=0.0, init=False)
    _emitting: threading.Lock = field(default_factory=threading.Lock, init=False)

    def tick(self, now: float) -> None:
        """Observe, if `OBSERVE_EVERY_S` has passed since the last tick that did."""
        if now >= self._next_observation_s:
            self._next_observation_s = now + OBSERVE_EVERY_S
            self.observe()

    def observe(self) -> Observation:
        ray_nodes, infeasible, ends = self._read_gcs()
        with self.lock:
            pods = self.store.list_pods(
                self.namespace,
                {labels.KUBERAY_CLUSTER: self.name, labels.KUBERAY_NODE_TYPE: "worker"},
            )
            replicas: dict[str, list[HostView]] = {}
            groups: dict[str, tuple[str, str]] = {}
            deleting = self.operator.deleting
            for pod in pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp") or meta["name"] in deleting:
                    # Deleted: removed for the timeline, terminating for its grace. KubeRay
                    # deletes a replica's pods one call at a time: all of them are gone
                    # from the first call on, as a look between two calls would see a
                    # replica of fewer hosts removed.
                    continue
                key = meta["labels"].get(labels.KUBERAY_REPLICA_NAME) or meta["name"]
                if key in self.operator.creating:
                    continue  # KubeRay is still POSTing its pods: launched once all exist
                env = pod_environment(pod)
                slice_name = env.get(labels.ENV_TPU_NAME, key)
                groups[key] = (meta["labels"][labels.KUBERAY_GROUP], slice_name)
                replicas.setdefault(key, []).append(
                    HostView(
                        meta["name"],
                        int(env.get(labels.ENV_TPU_WORKER_ID, "0")),
                        pod["status"]["phase"],
                        ray_nodes.get(meta["name"]),
                    )
                )
        if ray_nodes is _UNKNOWN:
            return self._observed
        observation = Observation(
            time.time() - self.started_s,
            {
                key: ReplicaView(groups[key][0], groups[key][1], tuple(hosts))
                for key, hosts in replicas.items()
            },
            frozenset(infeasible),
            ends,
        )
        for event in changes(self._observed, observation):
            self.emit(event)
        self._observed = observation
        return observation

    def _read_gcs(self) -> tuple[dict[str, str], list[str], dict[str, RayNodeEnd]]:
        from ray.core.generated import autoscaler_pb2

        try:
            raw = self.gcs.get_cluster_status(timeout_s=5)
            infos = self.gcs.get_all_node_info(timeout=5)
        except Exception:
            return _UNKNOWN, [], {}
        reply = autoscaler_pb2.GetClusterStatusReply()
        reply.ParseFromString(raw)
        state = from_message(reply.cluster_resource_state)
        statuses = {pod: node.status for pod, node in state.node_for_pod().items()}
        return statuses, infeasible_texts(reply.autoscaling_state), _ray_node_ends(infos)

    def emit(self, event: ScalingEvent) -> None:
        """From the timeline's thread and the world's (the kubelet's failures, the
        autoscaler's restarts): one line at a time."""
        with self._emitting:
            self.history.append(event)
            self.on_event(event)


def _ray_node_ends(infos: Mapping[Any, Any]) -> dict[str, RayNodeEnd]:
    """TPU hosts whose Ray node drains or has died, from `GcsNodeInfo` messages."""
    from ray.core.generated import common_pb2, gcs_pb2

    ends: dict[str, RayNodeEnd] = {}
    for info in infos.values():
        slice_name = info.labels.get(labels.RAY_TPU_SLICE_NAME)
        if not slice_name:
            continue
        if info.state == gcs_pb2.GcsNodeInfo.DEAD:
            how = common_pb2.NodeDeathInfo.Reason.Name(info.death_info.reason)
        elif info.state_snapshot.state == gcs_pb2.NodeSnapshot.DRAINING:
            how = "DRAINING"
        else:
            continue
        worker_id = int(info.labels.get(labels.RAY_TPU_WORKER_ID, "0"))
        ends[info.node_id.hex()] = RayNodeEnd(slice_name, worker_id, how)
    return ends


_UNKNOWN: dict[str, str] = {}
"""The GCS did not answer: nothing observed this time."""
