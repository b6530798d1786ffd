"""Ray's v1 autoscaler node provider (`NodeProvider`) over KubeRay, in whole slices.

Selected in an autoscaling config as

    provider:
      type: external
      module: tpu_autoscaler.adapters.ray.v1_provider.SliceNodeProvider
      namespace: default
      cluster_name: my-raycluster      # else the config's cluster_name
      kube_host: http://127.0.0.1:8001 # optional
      kube_api: pkg.module.factory     # optional: provider_config -> KubeApi
      # as KubeRay's generated config sets them (see below):
      disable_node_updaters: true
      foreground_node_launch: true

It follows the contract of Ray's `KubeRayNodeProvider` (a `BatchingNodeProvider`):
one read of the RayCluster and its pods per autoscaler update
(`non_terminated_nodes`), `create_node`/`terminate_node` only collect, and
`post_process` submits everything as one patch. That batching needs Ray to call
`create_node` in its update thread (`foreground_node_launch: true`) and never to
SSH into pods (`disable_node_updaters: true`), as KubeRay's generated config says.

Unlike `KubeRayNodeProvider`, which writes Ray's host counts into `replicas`, host
counts are rounded up to whole replicas, and terminating one host names every pod
of its replica, so no partial slice is ever left."""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, cast

from ray.autoscaler._private.loader import load_function_or_class
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_UNMANAGED,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    STATUS_UPDATE_FAILED,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_REPLICA_INDEX,
    TAG_RAY_USER_NODE_TYPE,
)

from tpu_autoscaler.adapters.kube.api import KubeApi
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

KubeApiFactory = Callable[[Mapping[str, Any]], KubeApi]


def default_kube_api(provider_config: Mapping[str, Any]) -> KubeApi:
    """The production client (`adapters.kube.client.KubernetesApi` over
    `kubernetes_api(kube_host)`), imported here, not at module load: tests never need it."""
    try:
        module = importlib.import_module("tpu_autoscaler.adapters.kube.client")
    except ImportError:
        module = importlib.import_module("tpu_autoscaler.adapters.live")
    api = module.kubernetes_api(provider_config.get("kube_host"))
    wrapper = getattr(module, "KubernetesApi", None)
    if wrapper is not None:
        api = wrapper(api)
    if not all(hasattr(api, m) for m in ("get_raycluster", "list_pods", "patch_raycluster")):
        raise TypeError(
            f"{module.__name__} gives a {type(api).__name__}, not a KubeApi; "
            "set provider.kube_api to a factory that returns one"
        )
    return cast(KubeApi, api)


class SliceNodeProvider(NodeProvider):  # type: ignore[misc]
    """Whole-replica `NodeProvider` for one KubeRay RayCluster. Node ids are pod names,
    node types worker group names (the head's is its group label, `headgroup`)."""

    def __init__(
        self,
        provider_config: dict[str, Any],
        cluster_name: str,
        kube_api: KubeApi | None = None,
    ) -> None:
        super().__init__(provider_config, cluster_name)
        name = provider_config.get("cluster_name") or cluster_name
        if kube_api is None:
            factory_path = provider_config.get("kube_api")
            factory: KubeApiFactory = (
                load_function_or_class(factory_path) if factory_path else default_kube_api
            )
            kube_api = factory(provider_config)
        self.cluster = KubeCluster(kube_api, provider_config["namespace"], name)
        self._state: KubeState | None = None
        self._launch_hosts: Counter[str] = Counter()
        self._doomed: dict[str, Replica] = {}

    @classmethod
    def from_kube_api(
        cls, kube_api: KubeApi, namespace: str, cluster_name: str
    ) -> SliceNodeProvider:
        return cls({"namespace": namespace, "cluster_name": cluster_name}, cluster_name, kube_api)

    # --- reads: one per autoscaler update ---------------------------------------------

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        """Every head and worker pod not being deleted. Called first in each update:
        reads the cluster and starts a new batch of changes."""
        self._state = self.cluster.read()
        self._launch_hosts.clear()
        self._doomed.clear()
        return [
            pod.name
            for pod in self._state.pods
            if self._state.kind(pod) in (KIND_HEAD, KIND_WORKER)
            and tag_filters.items() <= self.node_tags(pod.name).items()
        ]

    def node_tags(self, node_id: str) -> dict[str, str]:
        state = self._current()
        pod = state.pod(node_id)
        if pod is None:
            return {TAG_RAY_NODE_KIND: NODE_KIND_UNMANAGED}
        kind = state.kind(pod)
        tags = {
            TAG_RAY_NODE_KIND: NODE_KIND_HEAD if kind == KIND_HEAD else NODE_KIND_WORKER,
            TAG_RAY_USER_NODE_TYPE: pod.metadata.labels.get(labels.KUBERAY_GROUP, ""),
            TAG_RAY_NODE_STATUS: self._status(node_id),
        }
        replica = state.replica_of(node_id)
        if replica is not None and len(replica.hosts) > 1 and replica.identified:
            tags[TAG_RAY_REPLICA_INDEX] = replica.name
        return tags

    def is_running(self, node_id: str) -> bool:
        raw = self._current().raw_pods.get(node_id)
        return raw is not None and pod_running(raw)

    def is_terminated(self, node_id: str) -> bool:
        return self._current().pod(node_id) is None

    def internal_ip(self, node_id: str) -> str:
        raw = self._current().raw_pods.get(node_id, {})
        ip: str = raw.get("status", {}).get("podIP") or "IP not yet assigned"
        return ip

    def external_ip(self, node_id: str) -> str:
        return self.internal_ip(node_id)

    def safe_to_scale(self) -> bool:
        """Not while the operator has yet to delete pods named in workersToDelete: until
        it has, those pods still count as nodes and a new plan would count them twice."""
        pending = self._current().has_pending_deletes()
        if pending:
            log.info("waiting for KubeRay to delete the pods named in workersToDelete")
        return not pending

    # --- changes: collected, then one patch in post_process ----------------------------

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, Any] | None:
        """Ask for `count` more hosts of the group; rounded up to whole replicas once the
        update's requests are summed (Ray may split one launch into batches)."""
        self._launch_hosts[tags[TAG_RAY_USER_NODE_TYPE]] += count
        return None

    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        """Remove the whole replica `node_id` belongs to (a pod alone never goes)."""
        state = self._current()
        reason = why_not_removable(state, node_id)
        if reason is not None:
            if reason:
                log.error("not terminating %s: %s", node_id, reason)
            return None
        replica = state.replica_of(node_id)
        assert replica is not None
        if replica.state is ReplicaState.DRAINING or replica.name in self._doomed:
            return None
        others = [h.pod_name for h in replica.hosts if h.pod_name != node_id]
        if others:
            log.info(
                "terminating %s removes its replica %s whole: also %s",
                node_id,
                replica.name,
                ", ".join(others),
            )
        self._doomed[replica.name] = replica
        return None

    def post_process(self) -> None:
        """Submit the update's launches and terminations as one guarded patch. A
        failure is raised, for Ray's autoscaler to count and log, never dropped."""
        if not self._launch_hosts and not self._doomed:
            return
        launch = dict(self._launch_hosts)
        doomed = set(self._doomed)
        self._launch_hosts.clear()
        self._doomed.clear()

        def planner(state: KubeState) -> list[GroupChange]:
            still = [
                r
                for r in state.replicas
                if r.name in doomed and r.state is not ReplicaState.DRAINING
            ]
            by_group = {c.group: c for c in removal_changes(state, still, base_on_spec=False)}
            for group, hosts in sorted(launch.items()):
                spec = state.spec(group)
                if spec is None:
                    log.error("cannot launch %d host(s) of unknown group %s", hosts, group)
                    continue
                per_replica = hosts_per_replica(spec)
                wanted = whole_replicas(hosts, per_replica, group, "create_node")
                # Absolute, as Ray's v1 contract has it: what exists now plus what Ray
                # asked for, so asking again before the pods appear changes nothing.
                change = by_group.get(
                    group, GroupChange(group, Replicas(state.alive_replicas(group)))
                )
                target = change.replicas + wanted
                if target > spec.max_replicas:
                    log.warning(
                        "%s: %d replica(s) wanted, capped at maxReplicas %d",
                        group,
                        target,
                        spec.max_replicas,
                    )
                    target = max(change.replicas, spec.max_replicas)
                by_group[group] = GroupChange(group, Replicas(target), change.delete)
            return list(by_group.values())

        self.cluster.apply(planner)

    # --- private --------------------------------------------------------------------------

    def _current(self) -> KubeState:
        if self._state is None:
            self._state = self.cluster.read()
        return self._state

    def _status(self, node_id: str) -> str:
        """Ray's node status tag, as KubeRay's provider derives it from the pod."""
        raw = self._current().raw_pods[node_id]
        if pod_running(raw):
            return str(STATUS_UP_TO_DATE)
        if raw.get("status", {}).get("phase") in ("Failed", "Succeeded"):
            return str(STATUS_UPDATE_FAILED)
        return "pending"
