"""What the stock autoscaler does with the same snapshot: Ray 2.60's autoscaler v2
(`ResourceDemandScheduler` on the instances its reconciler would hold) and then Ray's
own `KubeRayProvider` writing its decision into the RayCluster.

This is the side-by-side reference for `plan --policy ray`, the simulator and the
benchmarks. Ray's code runs as installed; only the glue is ours:

- The request holds what the reconciler's instance manager would: the head (Ray's
  `headgroup` node type, RAY_RUNNING with its GCS node state), and per pod RAY_RUNNING
  (a live Ray node), ALLOCATED (no Ray node yet) or nothing (deleted, named in
  `workersToDelete`, draining, stopped); REQUESTED for hosts of a replica whose pods
  KubeRay has not created yet.
- Launches are rate-limited by the reconciler's own `_compute_to_launch` (upscaling
  speed, at most `AUTOSCALER_MAX_CONCURRENT_LAUNCHES` hosts in flight), then handed to
  `KubeRayProvider.terminate` and `.launch` over the snapshot held in memory, in the
  reconciler's order. The provider's arithmetic is therefore Ray's as written: host
  counts floor-divided by numOfHosts, the max with observed pods, nothing done while
  any group's `workersToDelete` names a pod still listed, single pods named.
- The resulting plan brings the provider's patch (`UnguardedPlan`): the shell sends it
  without a resourceVersion precondition, as Ray does.

Its quirks are Ray's: per-host idle termination, `TPU-*-head` on every host, launches
of fewer than numOfHosts hosts dropped, one named pod removing its whole replica in
KubeRay >= 1.6. Two simplifications: an idle host Ray would drain first is named at
once (Ray drains it, then names it a round or two later), and Ray's memory of earlier
launches still unanswered (REQUESTED instances without pods) is not kept between
rounds."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ray.autoscaler._private.kuberay.autoscaling_config import (
    _HEAD_GROUP_NAME,
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler._private.kuberay.node_provider import IKubernetesHttpApiClient
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.cloud_provider import (
    KubeRayProvider,
)
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
from ray.autoscaler.v2.instance_manager.node_provider import LaunchNodeError
from ray.autoscaler.v2.instance_manager.reconciler import Reconciler
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.autoscaler.v2.utils import is_head_node
from ray.core.generated import autoscaler_pb2, instance_manager_pb2

from tpu_autoscaler.adapters.kube.patches import effective_replicas
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane.store import apply_operation
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.plan import Launch, Plan, Terminate, Unmet
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Replicas
from tpu_autoscaler.shell.controller import UnguardedPlan

_Instance = instance_manager_pb2.Instance
_NodeKind = instance_manager_pb2.NodeKind
_NodeStatus = autoscaler_pb2.NodeStatus
HEAD_RESOURCE = "node:__internal_head__"
"""What marks Ray's head node in its resources (`ray.autoscaler.v2.utils.is_head_node`)."""


def ray_plan(loaded: LoadedSnapshot) -> Plan:
    """The plan Ray 2.60 with KubeRay would carry out on `loaded`: an `UnguardedPlan`
    that brings the patch Ray's provider writes."""
    held = _reconciler_view(loaded)
    reply = ResourceDemandScheduler(event_logger=None).schedule(held.request)
    return _as_kuberay_plan(loaded, held, reply)


def ray_request(loaded: LoadedSnapshot) -> SchedulingRequest:
    """The `SchedulingRequest` Ray's v2 reconciler would build for this snapshot."""
    return _reconciler_view(loaded).request


@dataclass(frozen=True)
class _Held:
    """What Ray's reconciler holds for a snapshot."""

    config: AutoscalingConfig
    request: SchedulingRequest
    cloud_ids: Mapping[str, str]
    """Instance id to pod name, for instances that have a pod."""
    stopped: tuple[str, ...]
    """Pods whose Ray node died: the reconciler terminates them (RAY_STOPPED)."""
    head_running: bool
    """Ray's reconciler scales nothing until its head instance is RAY_RUNNING."""


def _reconciler_view(loaded: LoadedSnapshot) -> _Held:
    config = AutoscalingConfig(
        _derive_autoscaling_config_from_ray_cr(_raycluster(loaded)), skip_content_hash=True
    )
    state = loaded.ray.message or autoscaler_pb2.ClusterResourceState()
    head = _head_node(loaded, state, config)
    instances = [_head_instance(head)]
    workers, stopped = _worker_instances(loaded, _nodes_by_pod(state))
    instances += workers
    request = SchedulingRequest(
        node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=list(state.pending_resource_requests),
        gang_resource_requests=list(state.pending_gang_resource_requests),
        cluster_resource_constraints=list(state.cluster_resource_constraints),
        current_instances=instances,
        idle_timeout_s=config.get_idle_timeout_s(),
        pending_idle_timeout_s=config.get_pending_idle_timeout_s(),
        disable_launch_config_check=config.disable_launch_config_check(),
    )
    cloud_ids = {
        i.im_instance.instance_id: i.cloud_instance_id for i in workers if i.cloud_instance_id
    }
    running = head.status in (_NodeStatus.RUNNING, _NodeStatus.IDLE)
    return _Held(config, request, cloud_ids, tuple(stopped), running)


def _raycluster(loaded: LoadedSnapshot) -> dict[str, Any]:
    """The RayCluster as the API server serves it (`replicas` defaulted to 0 by the CRD)."""
    raw = loaded.cluster.model_dump(by_alias=True, exclude_none=True)
    for group in raw["spec"].get("workerGroupSpecs", []):
        group.setdefault("replicas", 0)
    return raw


def _nodes_by_pod(state: Any) -> dict[str, Any]:
    """The GCS node of each pod (`instance_id` is the pod name), the live one if the
    pod's raylet restarted."""
    found: dict[str, Any] = {}
    for node in state.node_states:
        previous = found.get(node.instance_id)
        if node.instance_id and (previous is None or previous.status == _NodeStatus.DEAD):
            found[node.instance_id] = node
    return found


def _head_node(loaded: LoadedSnapshot, state: Any, config: AutoscalingConfig) -> Any:
    """The head's GCS node state. The GCS runs on the head, so a live cluster always
    reports it; a snapshot built by hand may not, and then it is the node Ray's config
    reader describes for `headgroup` (resources and labels from `headGroupSpec`), idle,
    in the head pod if one is listed."""
    reported = next((n for n in state.node_states if is_head_node(n)), None)
    if reported is not None:
        return reported
    head_pod = next(
        (p for p in loaded.pods if p.metadata.labels.get(labels.KUBERAY_NODE_TYPE) == "head"),
        None,
    )
    head_type = config.get_node_type_configs()[_HEAD_GROUP_NAME]
    resources = {**head_type.resources, HEAD_RESOURCE: 1.0}
    return autoscaler_pb2.NodeState(
        node_id=b"head",
        instance_id=head_pod.name if head_pod else f"{loaded.cluster.metadata.name}-head",
        ray_node_type_name=_HEAD_GROUP_NAME,
        total_resources=resources,
        available_resources=resources,
        labels=head_type.labels,
        status=_NodeStatus.IDLE,
    )


def _head_instance(head: Any) -> AutoscalerInstance:
    running = head.status in (_NodeStatus.RUNNING, _NodeStatus.IDLE)
    im = _Instance(
        instance_id=head.instance_id,
        cloud_instance_id=head.instance_id,
        instance_type=head.ray_node_type_name or _HEAD_GROUP_NAME,
        status=_Instance.RAY_RUNNING if running else _Instance.RAY_STOPPED,
        node_kind=_NodeKind.HEAD,
        node_id=head.node_id.hex(),
    )
    return AutoscalerInstance(
        cloud_instance_id=head.instance_id, ray_node=head if running else None, im_instance=im
    )


def _worker_instances(
    loaded: LoadedSnapshot, nodes: Mapping[str, Any]
) -> tuple[list[AutoscalerInstance], list[str]]:
    snapshot = loaded.snapshot
    pods = {p.name: p for p in loaded.pods}
    named = {
        pod
        for g in loaded.cluster.spec.worker_group_specs
        for pod in g.scale_strategy.workers_to_delete
    }
    instances: list[AutoscalerInstance] = []
    stopped: list[str] = []
    for replica in snapshot.replicas:
        shape = snapshot.shape(replica.group)
        if shape is None:
            continue
        for host in replica.hosts:
            pod = pods.get(host.pod_name)
            if pod is None or pod.terminating or pod.name in named:
                continue  # TERMINATED (not listed) or TERMINATING (Ray named it)
            instance = _pod_instance(replica.group, pod, nodes.get(pod.name))
            if instance is None:
                stopped.append(pod.name)
            elif instance.im_instance.status != _Instance.RAY_STOPPING:
                instances.append(instance)
        for index in range(_hosts_on_their_way(loaded, replica, shape.hosts_per_replica)):
            im = _Instance(
                instance_id=f"{replica.name}-requested-{index}",
                instance_type=replica.group,
                status=_Instance.REQUESTED,
                node_kind=_NodeKind.WORKER,
            )
            instances.append(AutoscalerInstance(im_instance=im))
    return instances, stopped


def _pod_instance(group: str, pod: Pod, node: Any) -> AutoscalerInstance | None:
    """A listed worker pod as the instance manager holds it; None once its Ray node
    stopped (RAY_STOPPED, which the reconciler terminates)."""
    if node is not None and node.status == _NodeStatus.DEAD:
        return None
    im = _Instance(
        instance_id=pod.name,
        cloud_instance_id=pod.name,
        instance_type=group,
        status=_Instance.ALLOCATED,
        node_kind=_NodeKind.WORKER,
    )
    if node is None:
        return AutoscalerInstance(cloud_instance_id=pod.name, im_instance=im)
    im.node_id = node.node_id.hex()
    im.status = (
        _Instance.RAY_STOPPING if node.status == _NodeStatus.DRAINING else _Instance.RAY_RUNNING
    )
    return AutoscalerInstance(cloud_instance_id=pod.name, ray_node=node, im_instance=im)


def _hosts_on_their_way(loaded: LoadedSnapshot, replica: Replica, hosts: int) -> int:
    """Hosts Ray asked for whose pods KubeRay has not created yet: REQUESTED until
    a pod appears. A replica missing pods long after its newest one lost them."""
    if replica.state is ReplicaState.REQUESTED:
        return hosts
    if replica.state is ReplicaState.DRAINING or replica.last_pod_created_at_s is None:
        return 0
    snapshot = loaded.snapshot
    if snapshot.now_s - replica.last_pod_created_at_s > snapshot.config.creation_timeout_s:
        return 0
    return max(0, hosts - len(replica.hosts))


# --- Ray's provider on the snapshot ----------------------------------------------------


class _SnapshotKube(IKubernetesHttpApiClient):  # type: ignore[misc]
    """The snapshot's RayCluster and pods as `KubeRayProvider` reads them over HTTP;
    its patches applied in memory, unconditionally (Ray sends no precondition), and
    kept in order."""

    def __init__(self, raycluster: dict[str, Any], pods: Iterable[Pod]) -> None:
        self.raycluster = raycluster
        self.pods = [p.model_dump(by_alias=True, exclude_none=True) for p in pods]
        self.patches: list[list[dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any]:
        if path.startswith("rayclusters/"):
            return copy.deepcopy(self.raycluster)
        if path.startswith("pods?"):
            return {"metadata": {"resourceVersion": "0"}, "items": copy.deepcopy(self.pods)}
        if path.startswith("pods/"):
            return {"metadata": {"resourceVersion": "0"}}
        raise NotImplementedError(path)

    def patch(
        self,
        path: str,
        payload: list[dict[str, Any]] | dict[str, Any],
        content_type: str = "application/json-patch+json",
    ) -> dict[str, Any]:
        if not path.startswith("rayclusters/") or not isinstance(payload, list):
            raise NotImplementedError(f"{content_type} {path}")
        for operation in payload:
            apply_operation(self.raycluster, operation)
        self.patches.append(copy.deepcopy(payload))
        return copy.deepcopy(self.raycluster)

    def delete(self, path: str) -> dict[str, Any]:
        raise NotImplementedError(path)


def _launch_shape(held: _Held, reply: Any) -> dict[str, int]:
    """Hosts per node type the reconciler hands the provider this round: the
    scheduler's launches, cut by `_compute_to_launch` to the upscaling speed and the
    cap on hosts in flight."""
    instances = [i.im_instance for i in held.request.current_instances]
    queued = [
        _Instance(instance_id=f"queued-{n}", instance_type=r.instance_type, status=_Instance.QUEUED)
        for r in reply.to_launch
        for n in range(r.count)
    ]
    launching = Reconciler._compute_to_launch(
        queued,
        [i for i in instances if i.status == _Instance.REQUESTED],
        [i for i in instances if i.status == _Instance.RAY_RUNNING],
        held.config.get_upscaling_speed(),
        held.config.get_max_concurrent_launches(),
    )
    return {group: len(chosen) for group, chosen in launching.items() if chosen}


def _as_kuberay_plan(loaded: LoadedSnapshot, held: _Held, reply: Any) -> UnguardedPlan:
    infeasible = tuple(_infeasible(reply))
    if not held.head_running:
        why = "Ray: the head node is not running; Ray's reconciler scales nothing until it is"
        return UnguardedPlan(infeasible=infeasible, waiting=(Unmet("any scaling", why),))
    raw = _raycluster(loaded)
    kube = _SnapshotKube(copy.deepcopy(raw), loaded.pods)
    provider = KubeRayProvider(
        loaded.cluster.metadata.name,
        {"namespace": loaded.cluster.metadata.namespace},
        gcs_client=None,
        k8s_api_client=kube,
    )
    causes: dict[str, str] = {}
    for termination in reply.to_terminate:
        pod = held.cloud_ids.get(termination.instance_id)
        if pod is not None:
            causes[pod] = instance_manager_pb2.TerminationRequest.Cause.Name(termination.cause)
    shape = _launch_shape(held, reply)
    # What the provider would log is in the plan (`waiting`), so its log is kept quiet.
    provider_log = logging.getLogger(KubeRayProvider.__module__)
    level = provider_log.level
    provider_log.setLevel(logging.CRITICAL + 1)
    try:
        # The reconciler's order: the scheduler's terminations, the stopped Ray
        # nodes', then launches; each call reads the RayCluster the previous one wrote.
        if causes:
            provider.terminate(list(causes), "terminate")
        if held.stopped:
            causes.update(dict.fromkeys(held.stopped, "RAY_STOPPED"))
            provider.terminate(list(held.stopped), "terminate-stopped")
        if shape:
            provider.launch(shape, "launch")
    finally:
        provider_log.setLevel(level)
    errors = provider.poll_errors()
    waiting = [Unmet(_error_subject(e), f"Ray: {e}") for e in errors]
    launches, terminates = _changes(loaded, raw, kube.raycluster, causes, shape)
    refused = {e.node_type for e in errors if isinstance(e, LaunchNodeError)}
    waiting += _dropped(loaded, {g: n for g, n in shape.items() if g not in refused}, launches)
    return UnguardedPlan(
        tuple(launches),
        tuple(terminates),
        infeasible,
        tuple(dict.fromkeys(waiting)),
        operations=tuple(op for patch in kube.patches for op in patch),
    )


def _error_subject(error: Any) -> str:
    if isinstance(error, LaunchNodeError):
        return f"launch of {error.count} host(s) of {error.node_type}"
    return f"termination of {error.cloud_instance_id}"


def _changes(
    loaded: LoadedSnapshot,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    causes: Mapping[str, str],
    shape: Mapping[str, int],
) -> tuple[list[Launch], list[Terminate]]:
    """What KubeRay (>= 1.6) does with the provider's writes, as whole replicas: a
    replica any pod of which is newly named is deleted whole; new replicas are the
    written `replicas` beyond those the group keeps."""
    snapshot = loaded.snapshot
    launches: list[Launch] = []
    terminates: list[Terminate] = []
    groups = zip(before["spec"]["workerGroupSpecs"], after["spec"]["workerGroupSpecs"], strict=True)
    for old, new in groups:
        group = new["groupName"]
        listed = set(_names(old))
        doomed = [p for p in _names(new) if p not in listed]
        removed = [
            r
            for r in snapshot.replicas
            if r.group == group and any(h.pod_name in doomed for h in r.hosts)
        ]
        for replica in removed:
            terminates.append(
                _removal(replica, [p for p in doomed if p in _pods_of(replica)], causes)
            )
        # KubeRay creates `replicas` minus the replicas it has; the snapshot already
        # counts those it owes (`replicas` above the pods) as requested.
        alive = sum(
            r.group == group and r.state not in (ReplicaState.REQUESTED, ReplicaState.DRAINING)
            for r in snapshot.replicas
        )
        kept = max(effective_replicas(loaded.cluster, group), alive) - len(removed)
        new_replicas = int(new.get("replicas", 0)) - kept
        if new_replicas <= 0:
            continue
        hosts = shape.get(group, 0)
        if removed:
            reason = (
                f"Ray's provider wrote replicas {old.get('replicas', 0)} -> {new['replicas']} "
                f"while naming pods of {len(removed)} replica(s), which KubeRay deletes whole: "
                f"it creates {new_replicas} new"
            )
        else:
            reason = (
                f"Ray asked for {hosts} host(s); KubeRay's provider floor-divides by "
                f"numOfHosts: replicas {old.get('replicas', 0)} -> {new['replicas']}"
            )
        launches.append(Launch(group, Replicas(new_replicas), reason))
    return launches, terminates


def _names(group: Mapping[str, Any]) -> Sequence[str]:
    names: Sequence[str] = group.get("scaleStrategy", {}).get("workersToDelete") or []
    return names


def _pods_of(replica: Replica) -> set[str]:
    return {h.pod_name for h in replica.hosts}


def _removal(replica: Replica, named: Sequence[str], causes: Mapping[str, str]) -> Terminate:
    busy = [h.pod_name for h in replica.hosts if h.available != h.total]
    said = ", ".join(f"{pod} ({causes.get(pod, 'named')})" for pod in named)
    why = f"Ray terminated {said}; KubeRay deletes the whole replica"
    if busy:
        why += f", busy hosts included: {', '.join(busy)}"
    return Terminate(replica.group, replica.name, tuple(h.pod_name for h in replica.hosts), why)


def _dropped(
    loaded: LoadedSnapshot, shape: Mapping[str, int], launches: Sequence[Launch]
) -> list[Unmet]:
    """Hosts Ray asked for that became no replica (fewer than numOfHosts)."""
    launched = {launch.group for launch in launches}
    dropped = []
    for group, hosts in sorted(shape.items()):
        found = loaded.snapshot.shape(group)
        if found is not None and group not in launched:
            dropped.append(
                Unmet(
                    f"{hosts} host(s) of {group}",
                    f"Ray: KubeRay's provider floor-divides {hosts} host(s) by numOfHosts "
                    f"{found.hosts_per_replica}: no new replica",
                )
            )
    return dropped


def _infeasible(reply: Any) -> Iterable[Unmet]:
    for request in reply.infeasible_resource_requests:
        yield Unmet(_request_text(request), "Ray: infeasible")
    for gang in reply.infeasible_gang_resource_requests:
        yield Unmet(gang.details or "placement group", "Ray: infeasible")
    for _ in reply.infeasible_cluster_resource_constraints:
        yield Unmet("request_resources", "Ray: infeasible")


def _request_text(request: Any) -> str:
    resources = ", ".join(f"{k}: {v:g}" for k, v in sorted(request.resources_bundle.items()))
    return f"{{{resources}}}"
