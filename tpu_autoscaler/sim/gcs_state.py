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
from typing import Any, cast

from ray.core.generated import autoscaler_pb2, common_pb2

from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.selectors import parse_selector
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import RESOURCE_EPSILON
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.ray_model import Node, NodeLedger, Work

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
    the GCS heard of (`demand`). Built from each node's kept parts alone, none kept
    across calls (`KeptState` keeps them)."""
    return b"".join(KeptState().parts(live, nodes, dead, demand, now))


class KeptState:
    """The simulated GCS's last state, by part, to build the next one from what
    changed since: the autoscaler reads it every few seconds, and a large cluster's
    nodes are mostly as they were. Each part is kept by what it is made of:

    - a live node's, by its `version` (every write to what its message is made of
      makes a new one, unique across nodes: `Node.version`), unless it is IDLE (its
      idle duration moves with the time);
    - the dead nodes', by the dead nodes listed, in order (equal nodes are the same
      message: a dead node's is its ids and group);
    - the demand's, by the works pending, in order (equal works ask the same).

    Given the `ledger` of the scheduler's nodes (`RayScheduler.watch`: every pod
    whose node came, went or was written, `Node.changed`, since it was last emptied),
    the worker nodes' parts are followed rather than looked up: kept by pod in the
    nodes' order, only the pods in the ledger made again, the IDLE ones' idle
    durations put in anew, and the reply joined from the kept parts. So a read costs
    the nodes that changed and the IDLE ones, and the join, not a step per node
    (it was most of a 1,024-slice run's GCS). Nodes added or removed by hand,
    past the ledger (tests), change how many there are: then every part is looked up
    again. Without a ledger, each read looks every node's part up by version (the
    state made anew, `cluster_resource_state`). Equal to the state made anew from
    the nodes (`tests/test_sim_caches.py` compares them all through runs)."""

    def __init__(self, ledger: NodeLedger | None = None) -> None:
        self.live: dict[int, bytes] = {}
        """The parts of live nodes that were not IDLE, by version: those of the last
        read and, until pruned, of versions gone since (a version is never made
        again, so those are never found). Without a ledger only."""
        self.dead: tuple[tuple[Node, ...], bytes] = ((), b"")
        self.demand: tuple[tuple[Work, ...], bytes] | None = None
        self.ledger = ledger
        self.followed: dict[str, bytes] | None = None
        """With a ledger: each worker node's part by pod, in the nodes' order (an IDLE
        node's with its idle duration at the last read); None until the first read
        and after one that found nodes added or removed past the ledger."""
        self.followed_length = 0
        """The length of the followed parts, together."""
        self.steady_length = 0
        """The length of the followed parts of nodes not IDLE, together."""
        self.idle: dict[str, _IdleNode] = {}
        """The IDLE worker nodes among those followed, by pod."""
        self.dead_listed_with: tuple[int, str | None] = (-1, None)
        """How many dead nodes there were, and the newest, when the dead nodes were
        last listed: while they stay, and no node came or went, so does the list."""

    def reply(
        self,
        live: list[Node],
        nodes: Mapping[str, Node],
        dead: dict[str, Node],
        demand: list[Work],
        now: float,
    ) -> bytes:
        """`GetClusterResourceStateReply` holding the state at `now`, serialized (what
        `reply(cluster_resource_state(...))` makes, without copying the state twice)."""
        parts, length = self._parts(live, nodes, dead, demand, now)
        parts.insert(0, _REPLY_TAG + _varint(length))
        return b"".join(parts)

    def parts(
        self,
        live: list[Node],
        nodes: Mapping[str, Node],
        dead: dict[str, Node],
        demand: list[Work],
        now: float,
    ) -> list[bytes]:
        """The state's serialized parts, in order: the live nodes, the dead nodes
        not live again, the demand."""
        return self._parts(live, nodes, dead, demand, now)[0]

    def _parts(
        self,
        live: list[Node],
        nodes: Mapping[str, Node],
        dead: dict[str, Node],
        demand: list[Work],
        now: float,
    ) -> tuple[list[bytes], int]:
        """`parts`, and their length together."""
        if self.ledger is None:
            made = self._looked_up(live, now)
            length = sum(map(len, made))
            self._list_dead(nodes, dead)
        else:
            dead_moved = self._follow(nodes, dead, now)
            heads = live[: len(live) - len(nodes)]  # the head, if any, is first
            made = [_node_state(head, now) for head in heads]
            length = sum(map(len, made)) + self.followed_length
            made.extend(cast(dict[str, bytes], self.followed).values())
            if dead_moved or self.dead_listed_with != (len(dead), _newest_pod(dead)):
                self._list_dead(nodes, dead)
        made.append(self.dead[1])
        pending = tuple(demand)
        if self.demand is None or pending != self.demand[0]:
            self.demand = (pending, _demand_state(demand))
        made.append(self.demand[1])
        return made, length + len(self.dead[1]) + len(self.demand[1])

    def _looked_up(self, live: list[Node], now: float) -> list[bytes]:
        """Every live node's part, looked up by its version."""
        versions = list(map(_VERSION, live))
        kept = self.live
        parts: list[bytes | None] = list(map(kept.get, versions))
        missing = map(operator.is_, parts, itertools.repeat(None))
        for index in itertools.compress(itertools.count(), missing):
            node = live[index]
            part = parts[index] = _node_state(node, now)
            if cast(tuple[int, bytes, float | None], node.cached_changing)[2] is None:
                kept[versions[index]] = part  # not IDLE: its part moves with nothing
        made = cast(list[bytes], parts)
        if len(kept) > 2 * len(made) + 64:  # versions gone, never to be asked for again
            self.live = {v: p for v, p in zip(versions, made, strict=True) if v in kept}
        return made

    def _list_dead(self, nodes: Mapping[str, Node], dead: dict[str, Node]) -> None:
        """The newest dead nodes not live again, and their parts, if the list changed
        (each node's kept on it, found in C)."""
        listed = tuple(
            map(dead.__getitem__, itertools.filterfalse(nodes.__contains__, newest_pods(dead)))
        )
        if listed != self.dead[0]:
            parts: list[bytes | None] = list(map(_CACHED_DEAD, listed))
            missing = map(operator.is_, parts, itertools.repeat(None))
            for index in itertools.compress(itertools.count(), missing):
                parts[index] = _dead_node_state(listed[index])
            self.dead = (listed, b"".join(cast(list[bytes], parts)))
        self.dead_listed_with = (len(dead), _newest_pod(dead))

    def _follow(self, nodes: Mapping[str, Node], dead: dict[str, Node], now: float) -> bool:
        """The followed worker parts moved on to the nodes as they are now: those of
        the pods in the ledger made again (dropped if gone), the IDLE ones' idle
        durations anew; all of them if nodes came or went past the ledger. Whether
        the dead nodes listed may have changed but for the dead nodes' number and
        newest: a pod among the dead came or went (`_dead_moved`), or all again."""
        ledger = cast(NodeLedger, self.ledger)
        followed = self.followed
        if followed is None:
            ledger.clear()
            self._follow_all(nodes, now)
            return True
        came_or_went = True in ledger.values()
        dead_moved = came_or_went and _dead_moved(ledger, dead)
        steady = self.steady_length
        idle = self.idle
        for pod in ledger:
            node = nodes.get(pod)
            was = followed.pop(pod, None) if node is None else followed.get(pod)
            if was is not None and idle.pop(pod, None) is None:
                steady -= len(was)
            if node is None:
                continue  # gone (or the head, which is not followed)
            followed[pod] = part = _node_state(node, now)
            changing = cast(tuple[int, bytes, float | None], node.cached_changing)
            if changing[2] is None:
                steady += len(part)
            else:
                idle[pod] = _IdleNode(changing[1], changing[2])
        ledger.clear()
        if len(followed) != len(nodes) or (came_or_went and list(followed) != list(nodes)):
            # Nodes added or removed by hand, past the ledger; or a pod gone and back
            # (or its node replaced) keeps its old place here: all again, in order.
            self._follow_all(nodes, now)
            return True
        self.steady_length = steady
        self._idle_anew(now)
        return dead_moved

    def _idle_anew(self, now: float) -> None:
        """The IDLE nodes' parts with their idle durations at `now`, each duration
        encoded once per time idle since (a slice's hosts go idle together)."""
        followed = cast(dict[str, bytes], self.followed)
        durations: dict[float, bytes] = {}
        parts = []
        for idle in self.idle.values():
            since = idle.idle_since_s
            duration = durations.get(since)
            if duration is None:
                duration = durations[since] = _varint(max(1, int((now - since) * 1000)))
            front = idle.front if idle.width == len(duration) else idle.front_for(duration)
            parts.append(front + duration)
        followed.update(zip(self.idle, parts, strict=True))
        self.followed_length = self.steady_length + sum(map(len, parts))

    def listed_dead(self, nodes: Mapping[str, Node], dead: dict[str, Node]) -> tuple[Node, ...]:
        """The newest dead nodes not live again, oldest first: the same tuple as at
        the last ask while no node came or went (the ledger says so, looked at but
        kept for the next read) and the dead nodes stay."""
        ledger = self.ledger
        if (
            ledger is None
            or self.followed is None
            or len(self.followed) != len(nodes)
            or _dead_moved(ledger, dead)
            or self.dead_listed_with != (len(dead), _newest_pod(dead))
        ):
            self._list_dead(nodes, dead)
        return self.dead[0]

    def _follow_all(self, nodes: Mapping[str, Node], now: float) -> None:
        """Every worker node's part made (or taken as kept by version), in order."""
        followed: dict[str, bytes] = {}
        idle: dict[str, _IdleNode] = {}
        steady = 0
        for pod, node in nodes.items():
            followed[pod] = part = _node_state(node, now)
            changing = cast(tuple[int, bytes, float | None], node.cached_changing)
            if changing[2] is None:
                steady += len(part)
            else:
                idle[pod] = _IdleNode(changing[1], changing[2])
        self.followed, self.idle, self.steady_length = followed, idle, steady
        self._idle_anew(now)


class _IdleNode:
    """An IDLE node's part but for its idle duration, and the time it is idle since:
    its `node_states` member at a time is the kept front (tag, length, message, the
    idle duration's tag) and the duration, the front made again only when the
    duration's length in bytes changes (a few times in a node's idle life)."""

    __slots__ = ("encoded", "front", "idle_since_s", "width")

    def __init__(self, encoded: bytes, idle_since_s: float) -> None:
        self.encoded = encoded
        self.idle_since_s = idle_since_s
        self.width = 0
        self.front = b""

    def front_for(self, duration: bytes) -> bytes:
        """The front for an idle duration as long as `duration` (encoded), kept."""
        self.width = len(duration)
        length = _varint(len(self.encoded) + 1 + self.width)  # the tag is a byte
        self.front = b"".join((_NODE_TAG, length, self.encoded, IDLE_DURATION_TAG))
        return self.front


def _dead_moved(ledger: NodeLedger, dead: dict[str, Node]) -> bool:
    """Whether a pod among the `dead` came or went since the ledger was emptied (one
    that died, or came back)."""
    return any(moved and pod in dead for pod, moved in ledger.items())


def _newest_pod(dead: dict[str, Node]) -> str | None:
    return next(reversed(dead), None)


def _demand_state(demand: list[Work]) -> bytes:
    """The pending work as the GCS reports it, serialized: a gang request per
    placement group, in order, then the tasks and actors aggregated by shape and
    selector (`ResourceRequestByCount`)."""
    parts = []
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
_CACHED_DEAD = operator.attrgetter("cached_dead")
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
    # The usual lengths and idle times (below 2**28 ms: 3 days), without the loop.
    if value < 0x80:
        return _BYTES[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if value < 0x10000000:
        return bytes(
            (value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80, value >> 21)
        )
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
_REPLY_TAG = _varint(REPLY_STATE << 3 | 2)


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
    return _idle_node_state(cached[1], idle_since_s, now)


def _idle_node_state(encoded: bytes, idle_since_s: float, now: float) -> bytes:
    """An IDLE node's `node_states` member: its message but for its idle duration
    (`encoded`), then the idle duration at `now`."""
    idle = _varint(max(1, int((now - idle_since_s) * 1000)))
    length = _varint(len(encoded) + 1 + len(idle))  # the idle duration's tag is a byte
    return b"".join((_NODE_TAG, length, encoded, IDLE_DURATION_TAG, idle))


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
