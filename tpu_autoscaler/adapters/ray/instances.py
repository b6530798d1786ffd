"""Which replicas Ray's autoscaler instances make, and what an instance is: head or
worker, its node type, its status, the pod (or instance id) it names. Without pods
to read, replicas come from the instances themselves: running hosts by their
`ray.io/tpu-slice-name` label, a single host not yet running Ray as a pending
replica of its own, hosts of a multi-host slice not yet running Ray as whole
requested replicas (which the policy neither counts short nor removes)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ray.autoscaler.v2.instance_manager.common import InstanceUtil
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind

from tpu_autoscaler.adapters.ray.state import RayNode
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState, requested_replicas

_STOPPING = frozenset({Instance.RAY_STOP_REQUESTED})
NOT_YET_LAUNCHED = frozenset({Instance.QUEUED})
"""Instances the reconciler has queued and not yet handed to the provider."""


def is_head(instance: Any) -> bool:
    return instance.im_instance is not None and instance.im_instance.node_kind == NodeKind.HEAD


def is_worker(instance: Any) -> bool:
    im = instance.im_instance
    if im is None:
        return False  # not managed by Ray's instance manager: Ray skips it too
    return bool(im.node_kind != NodeKind.HEAD and InstanceUtil.is_ray_running_reachable(im.status))


def is_running_ray(instance: Any) -> bool:
    """Ray runs on it now (head or worker): its node's free capacity is real."""
    im = instance.im_instance
    return im is not None and im.status == Instance.RAY_RUNNING


def instance_type(instance: Any) -> str:
    return str(instance.im_instance.instance_type)


def instance_status(instance: Any) -> int:
    return int(instance.im_instance.status)


def host_name(instance: Any) -> str:
    """The pod name once there is one; the instance manager's id before that."""
    return str(instance.cloud_instance_id or instance.im_instance.cloud_instance_id) or (
        f"instance:{instance.im_instance.instance_id}"
    )


def requested_as_replicas(
    shapes: Mapping[str, SliceShape], instances: Iterable[Any], taken: set[str], now_s: float
) -> list[Replica]:
    """Hosts asked for and not yet tied to a slice, as whole requested replicas."""
    hosts: dict[str, int] = defaultdict(int)
    for instance in instances:
        hosts[instance_type(instance)] += 1
    replicas = []
    for group, count in sorted(hosts.items()):
        added = requested_replicas(
            group, math.ceil(count / shapes[group].hosts_per_replica), taken, now_s
        )
        taken |= {r.name for r in added}
        replicas += added
    return replicas


def replicas_from_instances(
    shapes: Mapping[str, SliceShape],
    instances: list[Any],
    nodes: Mapping[str, RayNode],
    now_s: float,
) -> list[Replica]:
    """Replicas from Ray's instances alone: a running host names its slice
    (`ray.io/tpu-slice-name`); the others cannot be tied to one yet."""
    by_slice: dict[tuple[str, str], list[tuple[Any, RayNode]]] = defaultdict(list)
    untied: list[Any] = []
    replicas: list[Replica] = []
    for instance in instances:
        shape = shapes[instance_type(instance)]
        node = _node_of(instance, nodes)
        if node is None and shape.hosts_per_replica == 1:
            # One host is a whole replica: kept by name, so it can be removed by name.
            replica = _single_host_pending(shape, instance, now_s)
            if replica.name in {r.name for r in replicas}:  # instances without ids
                replica = replace(replica, name=f"{replica.name}#{len(replicas)}")
            replicas.append(replica)
        elif node is None:
            untied.append(instance)
        elif shape.hosts_per_replica == 1:
            name = node.labels.get(labels.RAY_TPU_SLICE_NAME) or host_name(instance)
            replicas.append(_replica(shape, name, [(instance, node)], now_s))
        else:
            slice_name = node.labels.get(labels.RAY_TPU_SLICE_NAME)
            if slice_name is None:
                untied.append(instance)
            else:
                by_slice[(shape.group, slice_name)].append((instance, node))
    missing: dict[str, int] = defaultdict(int)
    for (group, slice_name), members in sorted(by_slice.items()):
        replica = _replica(shapes[group], slice_name, members, now_s)
        replicas.append(replica)
        missing[group] += max(0, shapes[group].hosts_per_replica - len(members))
    # Hosts not running Ray yet most likely complete the partial slices above; the
    # rest are whole replicas on their way.
    leftover: list[Any] = []
    for instance in untied:
        group = instance_type(instance)
        if missing[group] > 0:
            missing[group] -= 1
        else:
            leftover.append(instance)
    replicas += requested_as_replicas(shapes, leftover, {r.name for r in replicas}, now_s)
    return replicas


def _single_host_pending(shape: SliceShape, instance: Any, now_s: float) -> Replica:
    name = host_name(instance)
    stopping = instance_status(instance) in _STOPPING
    return Replica(
        group=shape.group,
        name=name,
        state=ReplicaState.DRAINING if stopping else ReplicaState.PENDING,
        hosts=(Host(pod_name=name, host_index=0),),
        created_at_s=now_s,
    )


def _node_of(instance: Any, nodes: Mapping[str, RayNode]) -> RayNode | None:
    if instance.ray_node is None:
        return None
    node_id = instance.ray_node.node_id
    key = node_id.hex() if isinstance(node_id, bytes) else str(node_id)
    return nodes.get(key)


def _replica(
    shape: SliceShape, name: str, members: list[tuple[Any, RayNode]], now_s: float
) -> Replica:
    hosts = []
    for fallback, (instance, node) in enumerate(members):
        worker_id = node.labels.get(labels.RAY_TPU_WORKER_ID, "")
        hosts.append(
            Host(
                pod_name=host_name(instance),
                host_index=int(worker_id) if worker_id.isdecimal() else fallback,
                node_id=node.node_id,
                labels=node.labels,
                total=node.total,
                available=node.available,
                idle_s=node.idle_s,
                dead=node.dead,
            )
        )
    hosts.sort(key=lambda h: h.host_index)
    complete = len(hosts) == shape.hosts_per_replica
    if any(instance_status(i) in _STOPPING for i, _ in members):
        state = ReplicaState.DRAINING
    elif complete and all(h.registered for h in hosts):
        state = ReplicaState.RUNNING
    else:
        state = ReplicaState.PENDING
    return Replica(
        group=shape.group,
        name=name,
        state=state,
        hosts=tuple(hosts),
        created_at_s=now_s,
        slice_name=next(
            (
                h.labels[labels.RAY_TPU_SLICE_NAME]
                for h in hosts
                if labels.RAY_TPU_SLICE_NAME in h.labels
            ),
            None,
        ),
        # Without pods, which hosts not running Ray belong to a partial slice is a
        # guess: such a slice is never removed here (KubeRay removes broken replicas).
        identified=complete,
    )
