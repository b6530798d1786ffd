"""Ray 2.60 `SchedulingRequest`s built as Ray's own scheduler tests build them (node
type configs, autoscaler instances, demand messages), for our `SliceScheduler`."""

from __future__ import annotations

from typing import Any

from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
from ray.autoscaler.v2.scheduler import SchedulingReply, SchedulingRequest
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.autoscaler.v2.utils import ResourceRequestUtil
from ray.core.generated import autoscaler_pb2
from ray.core.generated.autoscaler_pb2 import ClusterResourceConstraint, NodeState
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind


def node_type(
    name: str, resources: dict[str, float], min_nodes: int = 0, max_nodes: int = 10
) -> NodeTypeConfig:
    return NodeTypeConfig(
        name=name, resources=resources, min_worker_nodes=min_nodes, max_worker_nodes=max_nodes
    )


def running(
    instance_id: str,
    type_name: str,
    total: dict[str, float],
    available: dict[str, float] | None = None,
    idle_ms: int = 0,
    kind: int = NodeKind.WORKER,
) -> AutoscalerInstance:
    """A RAY_RUNNING instance; IDLE in Ray when nothing of it is used."""
    available = dict(total) if available is None else available
    node_id = f"r{instance_id}"
    idle = available == total
    node = NodeState(
        node_id=node_id.encode(),
        instance_id=f"pod-{instance_id}",
        ray_node_type_name=type_name,
        total_resources=total,
        available_resources=available,
        idle_duration_ms=idle_ms if idle else 0,
        status=autoscaler_pb2.NodeStatus.IDLE if idle else autoscaler_pb2.NodeStatus.RUNNING,
    )
    im = Instance(
        instance_id=instance_id,
        cloud_instance_id=f"pod-{instance_id}",
        instance_type=type_name,
        status=Instance.RAY_RUNNING,
        node_kind=kind,
        node_id=node_id,
    )
    return AutoscalerInstance(cloud_instance_id=f"pod-{instance_id}", ray_node=node, im_instance=im)


def pending(
    instance_id: str, type_name: str, status: int = Instance.ALLOCATED
) -> AutoscalerInstance:
    im = Instance(instance_id=instance_id, instance_type=type_name, status=status)
    return AutoscalerInstance(im_instance=im)


def request(
    types: list[NodeTypeConfig],
    instances: list[AutoscalerInstance] | None = None,
    tasks: list[Any] | None = None,
    constraint: list[Any] | None = None,
    **extra: Any,
) -> SchedulingRequest:
    """`tasks` and `constraint`: `ResourceRequest`s, one per copy (grouped as the GCS does)."""
    constraints = []
    if constraint:
        constraints = [
            ClusterResourceConstraint(
                resource_requests=ResourceRequestUtil.group_by_count(constraint)
            )
        ]
    return SchedulingRequest(
        node_type_configs={t.name: t for t in types},
        resource_requests=ResourceRequestUtil.group_by_count(tasks or []),
        cluster_resource_constraints=constraints,
        current_instances=instances or [],
        **{"disable_launch_config_check": True, **extra},
    )


def launched(reply: SchedulingReply) -> dict[str, int]:
    return {r.instance_type: r.count for r in reply.to_launch}


def terminated(reply: SchedulingReply) -> list[tuple[str, int]]:
    return sorted((r.instance_id, r.cause) for r in reply.to_terminate)
