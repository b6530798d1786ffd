"""What the GCS reports to an autoscaler, in the protobufs the adapters read: a
raylet's `NodeState`, pending tasks and placement groups as resource requests, and
the simulated Ray's whole `ClusterResourceState` as the GCS builds it
(`GcsAutoscalerStateManager`): the head and every worker node, dead nodes with ids and
status only, tasks aggregated by shape and selector, one gang request per pending
placement group.

`node_state` makes the `NodeState` of a pod's raylet for snapshots and tests. The
simulated Ray's state is built from each node's and each gang's own serialized parts,
kept while they stay the same: the autoscaler reads the state every few seconds and
building every node's message anew each time was most of a large cluster's run.
Concatenated messages parse as one (repeated fields append)."""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ray.core.generated import autoscaler_pb2, common_pb2

from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.selectors import parse_selector
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import RESOURCE_EPSILON
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.ray_model import Node, Work

# --- a raylet's NodeState and pending demand, as messages ------------------------------


def node_state(
    pod: Mapping[str, Any],
    shape: SliceShape,
    host_index: int,
    used: Mapping[str, float] | None = None,
    idle_s: float = 0.0,
    dead: bool = False,
) -> Any:
    """The `NodeState` the GCS reports for the raylet in `pod`
    (`GcsAutoscalerStateManager::GetNodeStates`): a dead node with its ids and status
    only; a live one IDLE only with an idle duration of at least 1 ms (the raylet
    rounds up), with the `ray.io/node-id` label every raylet adds."""
    name = gke.spec_environment(pod).get(labels.ENV_TPU_NAME)
    node = autoscaler_pb2.NodeState()
    node.node_id = hashlib.sha1(pod["metadata"]["name"].encode()).digest()[:28]
    node.instance_id = pod["metadata"]["name"]
    node.ray_node_type_name = shape.group
    node.node_ip_address = "10.0.0.1"
    if dead:
        node.status = autoscaler_pb2.NodeStatus.DEAD
        return node
    total = shape.host_resources(host_index, name)
    available = dict(total)
    for key, amount in (used or {}).items():
        available[key] = available.get(key, 0.0) - amount
    for key, value in total.items():
        node.total_resources[key] = value
    for key, value in available.items():
        if value > 0:
            node.available_resources[key] = value
    for key, label in shape.host_labels(host_index, name).items():
        node.labels[key] = label
    node.labels[RAY_NODE_ID] = node.node_id.hex()
    if any(amount > 0 for amount in (used or {}).values()):
        node.status = autoscaler_pb2.NodeStatus.RUNNING
    else:
        node.status = autoscaler_pb2.NodeStatus.IDLE
        node.idle_duration_ms = max(1, int(idle_s * 1000))
    return node


RAY_NODE_ID = "ray.io/node-id"
"""The label every raylet adds (`kLabelKeyNodeID`): the node id in hex."""


_OPERATORS = {
    "in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN"),
    "not_in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_NOT_IN"),
}


def fill_request(
    request: Any, resources: Mapping[str, float], selector: Mapping[str, str] | None
) -> None:
    """A `ResourceRequest`'s resources and label selector. `selector` is in Ray's dict
    syntax (`v`, `!v`, `in(a,b)`, `!in(a,b)`); it becomes one `LabelSelector` of
    IN / NOT_IN constraints, as the GCS turns a task's or bundle's selector into one
    (`LabelSelector::ToProto`)."""
    for key, value in resources.items():
        request.resources_bundle[key] = value
    if selector:
        constraints = request.label_selectors.add()
        for constraint in parse_selector(selector):
            c = constraints.label_constraints.add()
            c.label_key = constraint.key
            c.operator = _OPERATORS[constraint.operator]
            c.label_values.extend(sorted(constraint.values))


def add_task_demand(
    state: Any,
    resources: Mapping[str, float],
    count: int,
    selector: Mapping[str, str] | None = None,
) -> None:
    """Pending tasks or actors as the GCS reports them (`ResourceRequestByCount`)."""
    request = state.pending_resource_requests.add()
    request.count = count
    fill_request(request.request, resources, selector)


def add_gang_demand(
    state: Any,
    pg_id: str,
    bundles: list[Mapping[str, float]],
    strategy: str,
    selectors: list[Mapping[str, str]] | None = None,
) -> None:
    """A pending placement group as `GcsAutoscalerStateManager::GetPendingGangResourceRequests`
    reports it: details `<id>:<strategy>|PENDING`; each bundle in `bundle_selectors` with
    its label selector, and in the legacy `requests` with its resources only; strict
    strategies as (anti-)affinity on a per-group label in both."""
    gang = state.pending_gang_resource_requests.add()
    gang.details = f"{pg_id}:{strategy}|PENDING"
    chosen = gang.bundle_selectors.add()
    for bundle, selector in zip(bundles, selectors or [{}] * len(bundles), strict=True):
        legacy = gang.requests.add()
        fill_request(legacy, bundle, None)
        current = chosen.resource_requests.add()
        fill_request(current, bundle, selector)
        for target in (legacy, current):
            if strategy == "STRICT_SPREAD":
                target.placement_constraints.add().anti_affinity.label_name = f"_PG_{pg_id}"
            elif strategy == "STRICT_PACK":
                target.placement_constraints.add().affinity.label_name = f"_PG_{pg_id}"


# --- the simulated Ray's state, serialized -------------------------------------------

DEAD_NODES_KEPT = 1000
"""How many dead nodes the GCS keeps reporting, the newest (Ray's default cache)."""
REPLY_STATE = 1
"""`GetClusterResourceStateReply.cluster_resource_state`."""
STATE_NODES = 3
"""`ClusterResourceState.node_states`."""
IDLE_DURATION_TAG = bytes([9 << 3])
"""`NodeState.idle_duration_ms` (field 9, a varint)."""
# The statuses as plain ints: each `NodeStatus.X` is a Python `__getattr__` on the enum
# wrapper, and `_changing_state` takes two or three per node changed.
_RUNNING: int = autoscaler_pb2.NodeStatus.RUNNING
_IDLE: int = autoscaler_pb2.NodeStatus.IDLE
_DRAINING: int = autoscaler_pb2.NodeStatus.DRAINING
_DEAD: int = autoscaler_pb2.NodeStatus.DEAD


def cluster_resource_state(
    live: list[Node],
    nodes: Mapping[str, Node],
    dead: dict[str, Node],
    demand: list[Work],
    now: float,
) -> bytes:
    """The state at time `now`, serialized: the `live` nodes (the head and the worker
    `nodes`), the newest `dead` nodes that are not live again, and the pending work
    the GCS heard of (`demand`)."""
    # A node unchanged since the last read and not idle is its kept bytes, taken here
    # without a call: most of a large cluster's nodes, every read.
    parts = [
        kept[1]
        if (kept := node.cached_changing) is not None
        and kept[0] == node.version
        and kept[2] is None
        else _node_state(node, now)
        for node in live
    ]
    for pod, node in newest(dead):
        if pod not in nodes:
            parts.append(_dead_node_state(node))
    tasks: Counter[tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...]]] = Counter()
    for work in demand:
        if work.is_gang:
            parts.append(_gang_demand(work))
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
        add_task_demand(requests, dict(resources), count, dict(selector))
    parts.append(requests.SerializeToString())
    return b"".join(parts)


def state_key(
    live: list[Node], nodes: Mapping[str, Node], dead: dict[str, Node], demand: list[Work]
) -> tuple[object, ...]:
    """What `cluster_resource_state` makes the state of, but the time: while the key
    stays the same, so does the state but for idle durations (a node's message is
    what its `version` stands for, which every write to it makes anew and no other
    node has; a work's request never changes). Made by `map`s, which walk the nodes
    without a Python step per node: it is taken around every round left out."""
    return (
        tuple(map(_VERSION, live)),
        tuple(itertools.filterfalse(nodes.__contains__, newest_pods(dead))),
        tuple(map(_WORK_ID, demand)),
    )


_VERSION = operator.attrgetter("version")
_WORK_ID = operator.attrgetter("work_id")


def newest(dead: dict[str, Node]) -> list[tuple[str, Node]]:
    """The newest `DEAD_NODES_KEPT` dead nodes (`dead` is oldest first), oldest first,
    without a list of every node that ever died."""
    kept = list(itertools.islice(reversed(dead.items()), DEAD_NODES_KEPT))
    kept.reverse()
    return kept


def newest_pods(dead: dict[str, Node]) -> list[str]:
    """The pods of `newest(dead)`, in its order, without a Python step per node."""
    kept = list(itertools.islice(reversed(dead), DEAD_NODES_KEPT))
    kept.reverse()
    return kept


def reply(state: bytes) -> bytes:
    """`GetClusterResourceStateReply` holding `state` (serialized)."""
    return _field(REPLY_STATE, state)


def _gang_demand(work: Work) -> bytes:
    """`work`'s pending gang request, serialized as a `ClusterResourceState` holding it
    alone (the same for as long as it waits)."""
    if work.cached_gang_demand is None:
        state = autoscaler_pb2.ClusterResourceState()
        add_gang_demand(
            state,
            work.work_id,
            [b.resources for b in work.bundles],
            str(work.strategy),
            [b.selector for b in work.bundles],
        )
        work.cached_gang_demand = bytes(state.SerializeToString())
    return work.cached_gang_demand


def _varint(value: int) -> bytes:
    if value < 0x80:  # the usual lengths and idle times, without the loop
        return _BYTES[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


_BYTES = [bytes((value,)) for value in range(0x80)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a message as a member of another."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_NODE_TAG = _varint(STATE_NODES << 3 | 2)


def _node_field(payload: bytes) -> bytes:
    """`_field(STATE_NODES, payload)`, its tag made once."""
    return _NODE_TAG + _varint(len(payload)) + payload


def _node_state(node: Node, now: float) -> bytes:
    """`NodeState` of a live node as a `node_states` member: the message but for its
    idle duration, kept while the node's `version` stays (every write to its use,
    status or idleness bumps it, so an unchanged node costs a comparison, not a look at
    its resources), then the idle time, which moves with `now`."""
    cached = node.cached_changing
    if cached is None or cached[0] != node.version:
        cached = node.cached_changing = _changing_state(node)
    idle_since_s = cached[2]
    if idle_since_s is None:
        return cached[1]
    idle_ms = max(1, int((now - idle_since_s) * 1000))
    return _node_field(cached[1] + IDLE_DURATION_TAG + _varint(idle_ms))


def _changing_state(node: Node) -> tuple[int, bytes, float | None]:
    """The node's message at its `version` but for its idle duration: its fixed part
    (a node's total resources and labels are set when it joins, and made anew when
    `changed(fixed=True)`) and its available resources and status; a member of
    `node_states` already unless IDLE, whose idle duration follows. With the time it
    is idle since if IDLE, else None."""
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
    idle_since_s = node.idle_since_s
    if node.draining:
        status = _DRAINING
    elif idle_since_s is None:
        status = _RUNNING
    else:
        status = _IDLE
    message = autoscaler_pb2.NodeState()
    for key, value in node.available.items():
        if value > RESOURCE_EPSILON:
            message.available_resources[key] = value
    message.status = status
    encoded = node.cached_fixed + message.SerializeToString()
    if status != _IDLE:
        return node.version, _node_field(encoded), None
    return node.version, encoded, idle_since_s


def _dead_node_state(node: Node) -> bytes:
    if node.cached_dead is None:
        message = autoscaler_pb2.NodeState()
        message.node_id = node.node_id
        message.instance_id = node.pod
        message.ray_node_type_name = node.group
        message.status = _DEAD
        node.cached_dead = _node_field(message.SerializeToString())
    return node.cached_dead
