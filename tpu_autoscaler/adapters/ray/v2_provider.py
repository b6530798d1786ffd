"""Ray 2.60's autoscaler v2 cloud provider (`ICloudInstanceProvider`) over KubeRay,
in whole slices: a launch of N hosts of a multi-host TPU group is rounded up to
whole replicas, and terminating any pod removes every pod of its replica.

Ray's own `KubeRayProvider` floors host counts to replicas (a launch of fewer than
numOfHosts hosts does nothing) and names single pods in workersToDelete. Here every
change is one guarded JSON patch (`provider_cluster.KubeCluster`, shared with the v1
provider); anything that still fails comes back from `poll_errors`."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from ray.autoscaler.v2.instance_manager.node_provider import (
    CloudInstance,
    CloudInstanceProviderError,
    ICloudInstanceProvider,
    LaunchNodeError,
    TerminateNodeError,
)
from ray.core.generated.instance_manager_pb2 import NodeKind

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi
from tpu_autoscaler.adapters.kube.patches import effective_replicas
from tpu_autoscaler.adapters.ray.provider_cluster import (
    KIND_HEAD,
    KIND_WORKER,
    GroupChange,
    KubeCluster,
    KubeState,
    hosts_per_replica,
    pod_running,
    removal_changes,
    whole_replicas,
    why_not_removable,
)
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Replicas

log = logging.getLogger(__name__)


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
