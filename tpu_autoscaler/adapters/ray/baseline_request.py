"""What Ray 2.60's v2 reconciler would hold for a snapshot, for the stock comparison
(`baseline.py`): the `SchedulingRequest` its `ResourceDemandScheduler` is given, and
what the reconciler needs to act on the reply.

The request holds what the reconciler's instance manager would: the head (Ray's
`headgroup` node type, RAY_RUNNING with its GCS node state), and per pod RAY_RUNNING
(a live Ray node), ALLOCATED (no Ray node yet) or nothing (deleted, named in
`workersToDelete`, draining, stopped); REQUESTED for hosts of a replica whose pods
KubeRay has not created yet. Ray's memory of earlier launches still unanswered
(REQUESTED instances without pods) is not kept between rounds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray.autoscaler._private.kuberay.autoscaling_config import (
    _HEAD_GROUP_NAME,
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
from ray.autoscaler.v2.scheduler import SchedulingRequest
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.autoscaler.v2.utils import is_head_node
from ray.core.generated import autoscaler_pb2, instance_manager_pb2

from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.adapters.ray.baseline_ippr import ippr_view
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.snapshot import Replica, ReplicaState

_Instance = instance_manager_pb2.Instance
_NodeKind = instance_manager_pb2.NodeKind
_NodeStatus = autoscaler_pb2.NodeStatus
HEAD_RESOURCE = "node:__internal_head__"
"""What marks Ray's head node in its resources (`ray.autoscaler.v2.utils.is_head_node`)."""


@dataclass(frozen=True)
class Held:
    """What Ray's reconciler holds for a snapshot."""

    config: AutoscalingConfig
    request: SchedulingRequest
    cloud_ids: Mapping[str, str]
    """Instance id to pod name, for instances that have a pod."""
    stopped: tuple[str, ...]
    """Pods whose Ray node died: the reconciler terminates them (RAY_STOPPED)."""
    head_running: bool
    """Ray's reconciler scales nothing until its head instance is RAY_RUNNING."""


def reconciler_view(loaded: LoadedSnapshot) -> Held:
    """The instances, request and config Ray's v2 reconciler would hold for `loaded`."""
    config = AutoscalingConfig(
        _derive_autoscaling_config_from_ray_cr(raycluster_as_served(loaded)), skip_content_hash=True
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
    # Ray's reconciler passes them for its KubeRay provider only, as here.
    request.ippr_specs, request.ippr_statuses = ippr_view(raycluster_as_served(loaded), loaded.pods)
    cloud_ids = {
        i.im_instance.instance_id: i.cloud_instance_id for i in workers if i.cloud_instance_id
    }
    running = head.status in (_NodeStatus.RUNNING, _NodeStatus.IDLE)
    return Held(config, request, cloud_ids, tuple(stopped), running)


def raycluster_as_served(loaded: LoadedSnapshot) -> dict[str, Any]:
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
