"""The `ClusterResourceState` the simulated Ray's GCS reports, serialized as the GCS
builds it (`GcsAutoscalerStateManager`): the head and every worker node, dead nodes
with ids and status only, tasks aggregated by shape and selector, one gang request per
pending placement group.

Built from each node's and each gang's own serialized parts, kept while they stay the
same: the autoscaler reads the state every few seconds and building every node's
message anew each time was most of a large cluster's run. Concatenated messages parse
as one (repeated fields append)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.core.demand import RESOURCE_EPSILON
from tpu_autoscaler.sim import objects
from tpu_autoscaler.sim.ray_model import Node, Work

DEAD_NODES_KEPT = 1000
"""How many dead nodes the GCS keeps reporting, the newest (Ray's default cache)."""
REPLY_STATE = 1
"""`GetClusterResourceStateReply.cluster_resource_state`."""
STATE_NODES = 3
"""`ClusterResourceState.node_states`."""
IDLE_DURATION_TAG = bytes([9 << 3])
"""`NodeState.idle_duration_ms` (field 9, a varint)."""


def cluster_resource_state(
    live: list[Node],
    nodes: Mapping[str, Node],
    dead: Mapping[str, Node],
    demand: list[Work],
    now: float,
) -> bytes:
    """The state at time `now`, serialized: the `live` nodes (the head and the worker
    `nodes`), the newest `dead` nodes that are not live again, and the pending work
    the GCS heard of (`demand`)."""
    parts = [_node_state(node, now) for node in live]
    for pod, node in list(dead.items())[-DEAD_NODES_KEPT:]:
        if pod not in nodes:
            parts.append(_field(STATE_NODES, _dead_node_state(node)))
    tasks: Counter[tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...]]] = Counter()
    for work in demand:
        if work.is_gang:
            parts.append(work.gang_demand)
        else:
            bundle = work.bundles[0]
            tasks[
                (
                    tuple(sorted(bundle.resources.items())),
                    tuple(sorted(bundle.selector.items())),
                )
            ] += 1
    requests = autoscaler_pb2.ClusterResourceState()
    for (resources, selector), count in tasks.items():
        objects.add_task_demand(requests, dict(resources), count, dict(selector))
    parts.append(requests.SerializeToString())
    return b"".join(parts)


def reply(state: bytes) -> bytes:
    """`GetClusterResourceStateReply` holding `state` (serialized)."""
    return _field(REPLY_STATE, state)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a message as a member of another."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _node_state(node: Node, now: float) -> bytes:
    """`NodeState` of a live node as a `node_states` member: its fixed part (a node's
    total resources and labels are set when it joins) and the part that changes with
    its resources and status, each kept until it changes, then the idle time."""
    if node.cached_fixed is None:
        message = autoscaler_pb2.NodeState()
        message.node_id = node.node_id
        message.instance_id = node.pod
        message.ray_node_type_name = node.group
        for key, value in node.total.items():
            message.total_resources[key] = value
        for key, label in node.labels.items():
            message.labels[key] = label
        node.cached_fixed = message.SerializeToString()
    if node.draining:
        status = autoscaler_pb2.NodeStatus.DRAINING
    elif node.idle_since_s is None:
        status = autoscaler_pb2.NodeStatus.RUNNING
    else:
        status = autoscaler_pb2.NodeStatus.IDLE
    changing_key = (tuple(node.available.items()), status)
    if node.cached_changing is None or node.cached_changing[0] != changing_key:
        message = autoscaler_pb2.NodeState()
        for key, value in node.available.items():
            if value > RESOURCE_EPSILON:
                message.available_resources[key] = value
        message.status = status
        encoded = node.cached_fixed + message.SerializeToString()
        if status != autoscaler_pb2.NodeStatus.IDLE:
            encoded = _field(STATE_NODES, encoded)
        node.cached_changing = (changing_key, encoded)
    if status != autoscaler_pb2.NodeStatus.IDLE or node.idle_since_s is None:
        return node.cached_changing[1]
    idle_ms = max(1, int((now - node.idle_since_s) * 1000))
    return _field(STATE_NODES, node.cached_changing[1] + IDLE_DURATION_TAG + _varint(idle_ms))


def _dead_node_state(node: Node) -> bytes:
    if node.cached_dead is None:
        message = autoscaler_pb2.NodeState()
        message.node_id = node.node_id
        message.instance_id = node.pod
        message.ray_node_type_name = node.group
        message.status = autoscaler_pb2.NodeStatus.DEAD
        node.cached_dead = message.SerializeToString()
    return node.cached_dead
