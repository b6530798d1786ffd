"""Ray's `ClusterResourceState` (what the GCS reports to autoscalers) into our model:
the Ray node behind each pod, and pending demand as bundles with label selectors.

Input is the protobuf message or its JSON form (`MessageToDict(state,
preserving_proto_field_name=True)`); the JSON is parsed with Ray's own generated
message, so a misspelt field is an error that names it."""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from google.protobuf.json_format import ParseDict, ParseError
from ray.core.generated import autoscaler_pb2, common_pb2

from tpu_autoscaler.adapters.ray import wire
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    DemandRef,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    ResourceDemand,
)
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.snapshot import Host

_IN = common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN")
_NOT_IN = common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_NOT_IN")
_DETAILS = re.compile(r"^(?P<pg_id>[^:]*):(?P<strategy>[A-Z_]+)\|(?P<state>.*)$")


@dataclass(frozen=True, slots=True)
class RayNode:
    """A live or dead Ray node, keyed by the pod it runs in (`instance_id`)."""

    node_id: str
    instance_id: str
    node_type: str
    labels: Mapping[str, str]
    total: Mapping[str, float]
    available: Mapping[str, float]
    idle_s: float
    status: str
    """RUNNING, IDLE, DRAINING or DEAD."""

    @property
    def dead(self) -> bool:
        return self.status == "DEAD"

    def as_fixed_host(self, pod_name: str) -> Host:
        """This node as capacity that is no replica's host (the head): one host, index 0."""
        return Host(
            pod_name=pod_name,
            host_index=0,
            node_id=self.node_id,
            labels=self.labels,
            total=self.total,
            available=self.available,
            idle_s=self.idle_s,
        )


_INSTANCE_ID = operator.attrgetter("instance_id")


@dataclass(frozen=True)
class NodeDelta:
    """A mapping of pods to Ray nodes (`now`) that differs from another (`before`) only
    in the nodes of `pods` (a pod's node changed, came or went). Both are kept as they
    are (never changed once made)."""

    before: Mapping[str, RayNode]
    now: Mapping[str, RayNode]
    pods: frozenset[str]


@dataclass(frozen=True, slots=True)
class RayState:
    nodes: tuple[RayNode, ...]
    demand: Demand
    requests: Any = field(default=None, compare=False)
    """The message the demand was read from, for what the autoscaler reports back
    (the state's version, the infeasible requests by the index each `DemandRef`
    names, `copy_infeasible`): the `ClusterResourceState`, or, read off the wire, its
    `wire.StateView` (nodes and gangs left serialized)."""
    sent: bytes | None = field(default=None, compare=False, repr=False)
    """The serialized `GetClusterResourceStateReply` it was read from, if read off the
    wire (`NodeMemory.read`): the whole message is parsed from it when first asked
    for (`message`)."""
    whole: list[Any] = field(default_factory=list, compare=False, repr=False)
    """`message` once parsed from `sent` (a list, so a frozen state can keep it)."""
    by_pod: dict[str, RayNode] | None = field(default=None, compare=False, repr=False)
    """`node_for_pod`, if made with the nodes (`NodeMemory.read`: from the last
    read's, where one node per pod)."""
    delta: NodeDelta | None = field(default=None, compare=False, repr=False)
    """How `by_pod` was brought up from the `by_pod` of the state read before it (its
    `before`), if it was: which pods' nodes changed since (`NodeMemory`). None if made
    afresh. A reader that kept the state before's mapping needs to look at those pods
    alone (`ReplicaMemo.nodes_by_pod`)."""

    @property
    def message(self) -> Any:
        """The whole `ClusterResourceState` it came from, for Ray's own reconciler
        (`baseline_request.py`): read off the wire, parsed at the first ask, once."""
        if self.sent is None:
            return self.requests
        if not self.whole:
            reply = autoscaler_pb2.GetClusterResourceStateReply()
            reply.ParseFromString(self.sent)
            self.whole.append(reply.cluster_resource_state)
        return self.whole[0]

    def node_for_pod(self) -> dict[str, RayNode]:
        """The newest node of each pod: a restarted raylet leaves its dead node behind.
        Read, never written, by its callers (it may be the one the state was made
        with, `by_pod`)."""
        if self.by_pod is not None:
            return self.by_pod
        return node_for_pod(self.nodes)


def node_for_pod(nodes: Sequence[RayNode]) -> dict[str, RayNode]:
    """`RayState.node_for_pod` of `nodes`."""
    # One node per pod, each with an id (the usual case), is found in C.
    found = dict(zip(map(_INSTANCE_ID, nodes), nodes, strict=True))
    if len(found) == len(nodes) and "" not in found:
        return found
    found = {}
    for node in nodes:
        if node.instance_id and (node.instance_id not in found or not node.dead):
            found[node.instance_id] = node
    return found


def parse_ray_state(data: Mapping[str, Any], source: str = "ray_state") -> RayState:
    """`ClusterResourceState` JSON into nodes and demand; ManifestError naming the path."""
    message = autoscaler_pb2.ClusterResourceState()
    try:
        ParseDict(dict(data), message)
    except ParseError as exc:
        raise ManifestError([Problem(source, f"is not a ClusterResourceState: {exc}")]) from None
    return from_message(message)


@dataclass
class NodeMemory:
    """What the last read of the GCS parsed, to parse only what changed since: the
    nodes by their serialized message, the pending gangs by theirs, and the last
    reply with the state read from it. A node's message stays the same while its use
    and status do (an IDLE node's but for its idle duration), and parsing thousands
    of them every round was most of reading a large cluster.

    Safe against a real GCS whether or not it sends an unchanged node's bytes again:
    a node is taken from the last read only for a message equal byte for byte to the
    one it was parsed from (the same bytes parse to the same message), so it is what
    parsing would give; bytes that differ in any way (a changed node, or the same
    node encoded otherwise) are parsed. Each message is compared with the one at its
    place in the last read, in C, the places followed past nodes gone from or new to
    the list (`_aligned`): hashing every message of a large cluster to look it up
    was half of the read. Only the idle duration is left out of an IDLE node's
    second key, and put back into the node made from it. Each state names the pods
    whose node changed since the state before it (`RayState.delta`, `_delta`): a
    node taken from the last read is its very object, so only the pods of the nodes
    parsed or gone can have another node. Holds only the last read's messages;
    losing them costs parsing again (and a state without a delta)."""

    keys: list[bytes] = field(default_factory=list)
    """The node messages of the last read, as sent, in order."""
    found: list[RayNode] = field(default_factory=list)
    """The node read from each of `keys`."""
    idle: dict[bytes, RayNode] = field(default_factory=dict)
    """By the message without its idle duration: a node whose message changed only
    there (an IDLE node's, each read)."""
    gangs: dict[bytes, tuple[_GangParts, GangDemand]] = field(default_factory=dict)
    """The pending placement groups of the last read, by message as sent: what a gang
    is made of but its place in the list (`_gang_parts`), and the gang made of it at
    its place then (the same again while its place stays)."""
    last: RayState | None = None
    """The state read at the last read, with the reply it was read from (`sent`): a
    reply equal to it byte for byte reads as the same state."""
    by_pod: dict[str, RayNode] | None = None
    """The last read's nodes by pod (`node_for_pod`), if one node per pod: the next
    read's made from it by the nodes that changed, came or went (`_delta`), while
    the places follow the last read's (`_aligned`) and no pod moved."""
    delta: NodeDelta | None = None
    """How the last read's `by_pod` was made from the one before it, if it was."""

    def read(self, sent: bytes) -> RayState:
        """The state in `sent`, a serialized `GetClusterResourceStateReply`: the last
        read's if the bytes are the same (compared in C), else read off the wire with
        nodes and gangs as bytes (`wire.read_view`), each parsed only if this memory
        does not hold it. `wire.DecodeError` for bytes that are not a reply."""
        last = self.last
        if last is not None and last.sent == sent:
            return last
        view = wire.read_view(sent)
        nodes = self._nodes(list(view.node_states))
        gangs = self._gangs(list(view.pending_gang_resource_requests))
        self.last = _made_state(view, nodes, gangs, sent, self.by_pod, self.delta)
        return self.last

    def gang_demand(self, messages: Sequence[Any]) -> tuple[GangDemand, ...]:
        """The gangs of `messages` (`GangResourceRequest`s), those parsed at the last
        read found by their serialization."""
        return self._gangs(list(map(_SERIALIZED_GANG, messages)))

    def nodes(self, messages: Sequence[Any]) -> tuple[RayNode, ...]:
        """The nodes of `messages` (`NodeState`s), those parsed at the last read found
        by their serialization."""
        return self._nodes(list(map(_SERIALIZED, messages)))

    def _gangs(self, keys: list[bytes]) -> tuple[GangDemand, ...]:
        """The gang serialized as each of `keys`, parsed if not held."""
        held = list(map(self.gangs.get, keys))
        found: list[tuple[_GangParts, GangDemand]] = []
        for index, kept in enumerate(held):
            if kept is None:
                parts = _gang_parts(_parsed_gang(keys[index]))
                found.append((parts, _made_gang(index, *parts)))
            elif cast(DemandRef, kept[1].source).index == index:
                found.append(kept)
            elif kept[0][0] is None:  # named by its place, which moved
                found.append((kept[0], _made_gang(index, *kept[0])))
            else:  # a gang ahead of it left the list
                found.append((kept[0], _moved_gang(kept[1], index)))
        self.gangs = dict(zip(keys, found, strict=True))
        return tuple(made for _, made in found)

    def _nodes(self, keys: list[bytes]) -> tuple[RayNode, ...]:
        """The node serialized as each of `keys`: the last read's where its message
        is the same (`_aligned`), else parsed; only IDLE nodes and changed ones take
        a Python step, and an IDLE node whose bytes changed only in its idle
        duration is not parsed either (`wire.without_idle`). Brings `by_pod` (and
        `delta`) up to them."""
        alignment = _aligned(keys, self.keys, self.found)
        nodes = alignment.nodes
        idle: dict[bytes, RayNode] = {}
        missing = map(operator.is_, nodes, itertools.repeat(None))
        changed = list(itertools.compress(itertools.count(), missing))
        held = self.idle
        for index in changed:
            sent = keys[index]
            key, idle_ms = wire.without_idle(sent)
            node = held.get(key)
            if node is None:
                node = node_of(_parsed_node(sent))
            elif node.status == "IDLE":
                node = _idle_for(node, idle_ms / 1000.0)
            idle[key] = node
            nodes[index] = node
        found = cast(list[RayNode], nodes)
        self.delta = self._delta(found, changed, alignment)
        if self.delta is not None:
            by_pod: dict[str, RayNode] | None = cast(dict[str, RayNode], self.delta.now)
        else:
            by_pod = node_for_pod(found)
            if len(by_pod) != len(found):  # several nodes of a pod, or one without
                by_pod = None
        self.keys, self.found, self.by_pod = keys, found, by_pod
        self.idle = idle
        return tuple(found)

    def _delta(
        self, found: list[RayNode], changed: list[int], alignment: _Alignment
    ) -> NodeDelta | None:
        """`node_for_pod(found)`, as made from the last read's (`by_pod`), and the pods
        of the nodes that changed, came or went since; None if the last read had no
        mapping (not one node per pod) or this read has not one node per pod.

        Only a node not taken from the last read can have moved a pod's node: with
        one node per pod in both reads, a node in both (the same object) is its
        pod's in both. So the pods of the new nodes (at `changed`) and of the last
        read's not taken (at the places compared with those, and those passed over:
        `_aligned`; found by identity if the places were not followed) are all that
        can differ. Where each new node is of the pod of the one it replaced in its
        place, or past the last read's end (none inserted before others), the
        mapping is the last read's with those put in, taken out and added, in the
        order `node_for_pod` makes it (a pod's place kept, a pod gone left out, the
        new at the end); else made afresh."""
        last = self.by_pod
        if last is None:
            return None
        last_found = self.found
        if alignment.followed:
            out = [last_found[was] for _, was in alignment.paired]
            out += map(last_found.__getitem__, alignment.gone)
        else:
            taken = set(map(id, found))
            kept = map(taken.__contains__, map(id, last_found))
            out = list(itertools.compress(last_found, map(operator.not_, kept)))
        came = list(map(found.__getitem__, changed))
        pods = frozenset(map(_INSTANCE_ID, itertools.chain(out, came)))
        in_place = (
            alignment.followed
            and not alignment.inserted
            and all(
                found[index].instance_id == last_found[was].instance_id
                for index, was in alignment.paired
            )
        )
        by_pod: dict[str, RayNode] | None = None
        if in_place:
            by_pod = last.copy()
            for was in alignment.gone:
                del by_pod[last_found[was].instance_id]
            for node in came:  # of the pod of the node it replaced, or past the end
                by_pod[node.instance_id] = node
        if by_pod is None or len(by_pod) != len(found) or "" in by_pod:
            by_pod = node_for_pod(found)
            if len(by_pod) != len(found):  # several nodes of a pod, or one without
                return None
        return NodeDelta(last, by_pod, pods)


@dataclass(frozen=True, slots=True)
class _Alignment:
    """The nodes of the last read found for a read's messages (`_aligned`), and how
    the two lists' places were followed."""

    nodes: list[RayNode | None]
    """The last read's node of the equal message at each place, or None."""
    followed: bool
    """Whether the places were followed (else each message was looked up): then the
    rest of this tells how."""
    paired: list[tuple[int, int]]
    """Each place whose message differs from the one at the last read's place it was
    compared with, and that place (a node changed where it stands)."""
    gone: list[int]
    """The last read's places passed over (nodes gone from the list since)."""
    inserted: list[int]
    """The places passed over (nodes new to the list, before others of the last
    read's)."""
    came: int
    """The place from which on the messages are past the last read's end (nodes new
    to the list)."""


_LOOKAHEAD = 64
"""How many of the last read's nodes `_aligned` looks past for a node found further
on (nodes gone from the list since)."""

_DIFFER_CHUNK = 256
"""How many places that differ `_aligned` finds at once, at most: past a node gone,
every place differs until the lists are put in step again."""

_DIFFER_FIRST = 8
"""How many it finds at once first, and again after the lists are put in step anew
(twice as many each time after): the places found past a node gone are found
again, and a large chunk there scanned most of the list again for each replica
gone (~1 ms a read of a cluster removing idle slices)."""

_SAME_START = 32
"""How many leading bytes of two node messages `_aligned` compares to take them for
the same node (its id, the first field, the same; changed or not). Only the cost
rides on it: a node is only ever taken for an equal message."""


_ONE_MORE = functools.partial(operator.add, 1)
_START = operator.itemgetter(slice(0, _SAME_START))
"""A node message's first bytes (`_SAME_START`), sliced in C."""
_FIRST = operator.itemgetter(0)


def _aligned(keys: list[bytes], last_keys: list[bytes], last_found: list[RayNode]) -> _Alignment:
    """For each of `keys`, the node of the equal message in `last_keys` (whose nodes
    are `last_found`), or None; and how the places were followed. The places where
    messages differ are found in C, many at once, from where the two lists were
    last put in step: at each, the places move on together (a node changed where it
    stands, the usual case: an IDLE node's idle duration, every read), or, where the
    next message differs too and this one's node (`_SAME_START`) is not the one at
    its place but found a little further on in the last read, the last read's place
    skips the nodes gone since, and the places that differ are found again from
    there. A node is only ever taken for an equal
    message, so the places followed make nothing wrong, only cheap: when the
    messages follow the last read's order too little (too many looks ahead for
    messages of other nodes), each is looked up by message instead. Likewise, where
    the last read's node at its place is found a little further on in this read,
    the nodes before it are new (inserted) and passed over.

    The places that differ are paired many at once, in C (whether the next differs
    too, and whether the node is the same by its first bytes); a Python step only for
    the few where the lists come out of step. The nodes are put together once at the
    end from the stretches each shift holds (putting them in again from a place on at
    each shift was a copy of the rest of the list for every replica gone)."""
    length, last_length = len(keys), len(last_keys)
    paired: list[tuple[int, int]] = []
    gone: list[int] = []
    inserted: list[int] = []
    stretches: list[tuple[int, int]] = [(0, 0)]  # (first place, shift) of each stretch
    at = was = 0  # the places from which on the two lists are compared in step
    looks_left = length // 16 + 64
    chunk = _DIFFER_FIRST
    while at < length and was < last_length:
        shift = was - at
        if shift != stretches[-1][1]:
            if stretches[-1][0] == at:
                stretches[-1] = (at, shift)
            else:
                stretches.append((at, shift))
        end = min(length, last_length - shift)  # in step to here, unless nodes left
        differ = list(
            itertools.islice(
                itertools.compress(
                    itertools.count(at), map(operator.ne, _from(keys, at), _from(last_keys, was))
                ),
                chunk,
            )
        )
        # A full chunk: its last place is looked at with the next chunk, which tells
        # whether the place after it differs too.
        at = differ.pop() if len(differ) == chunk else end
        shifting = functools.partial(operator.add, shift)
        # A place needs a look when the next place differs too (nodes may have gone
        # or come there) and its node is not the one at its place (another first
        # bytes); the others changed where they stand.
        follows = differ[1:]
        follows.append(at)
        runs = map(operator.eq, follows, map(_ONE_MORE, differ))
        same = map(
            operator.eq,
            map(_START, map(keys.__getitem__, differ)),
            map(_START, map(last_keys.__getitem__, map(shifting, differ))),
        )
        # Lazily: past a node gone, the places after it are found again.
        looks = itertools.compress(itertools.count(), map(operator.gt, runs, same))
        for place in looks:
            index = differ[place]
            looks_left -= 1
            if not looks_left:  # the order moved too much: each by message
                by_message = dict(zip(last_keys, last_found, strict=True))
                return _Alignment(list(map(by_message.get, keys)), False, [], [], [], length)
            start = keys[index][:_SAME_START]
            further = index + shift + 1
            ahead = [key[:_SAME_START] for key in last_keys[further : further + _LOOKAHEAD]]
            if start in ahead:
                paired += zip(differ[:place], map(shifting, differ[:place]), strict=True)
                skipped = ahead.index(start) + 1  # the nodes before it are gone
                gone.extend(range(index + shift, index + shift + skipped))
                at, was = index, index + shift + skipped
                chunk = _DIFFER_FIRST
                break
            there = last_keys[index + shift][:_SAME_START]
            ahead = [key[:_SAME_START] for key in keys[index + 1 : index + 1 + _LOOKAHEAD]]
            if there in ahead:
                paired += zip(differ[:place], map(shifting, differ[:place]), strict=True)
                came = ahead.index(there) + 1  # new nodes before the last read's
                inserted.extend(range(index, index + came))
                at, was = index + came, index + shift
                chunk = _DIFFER_FIRST
                break
        else:
            paired += zip(differ, map(shifting, differ), strict=True)
            was = at + shift
            chunk = min(2 * chunk, _DIFFER_CHUNK)
    nodes: list[RayNode | None] = []
    for (first, shift), (after, _) in zip(stretches, [*stretches[1:], (length, 0)], strict=True):
        nodes += last_found[first + shift : after + shift]
        if len(nodes) < after:  # past the last read's end
            nodes += itertools.repeat(None, after - len(nodes))
    unset = itertools.chain(map(_FIRST, paired), inserted)
    collections.deque(map(nodes.__setitem__, unset, itertools.repeat(None)), maxlen=0)
    gone.extend(range(was, last_length))  # past the end of this read's list
    return _Alignment(nodes, True, paired, gone, inserted, at)


def _from(items: list[bytes], place: int) -> Iterator[bytes]:
    """`items` from `place` on: a list iterator moved there in C (`islice` would
    step through the items before it)."""
    found: Any = iter(items)
    found.__setstate__(place)
    return cast(Iterator[bytes], found)


_SERIALIZED = functools.partial(autoscaler_pb2.NodeState.SerializeToString, deterministic=True)
_SERIALIZED_GANG = functools.partial(
    autoscaler_pb2.GangResourceRequest.SerializeToString, deterministic=True
)
_parsed_node = autoscaler_pb2.NodeState.FromString
_parsed_gang = autoscaler_pb2.GangResourceRequest.FromString


def from_message(state: Any, memory: NodeMemory | None = None) -> RayState:
    """From Ray's `autoscaler_pb2.ClusterResourceState` (as the GCS client returns it).
    Each demand item keeps which request it came from (`DemandRef`). `memory`: the
    nodes and gangs parsed at the last read, to parse only those whose message
    changed."""
    if memory is None:
        nodes = tuple(node_of(n) for n in state.node_states)
        gangs = tuple(_gang(i, g) for i, g in enumerate(state.pending_gang_resource_requests))
        return _made_state(state, nodes, gangs)
    nodes = memory.nodes(state.node_states)
    gangs = memory.gang_demand(state.pending_gang_resource_requests)
    return _made_state(state, nodes, gangs, by_pod=memory.by_pod, delta=memory.delta)


def _made_state(
    state: Any,
    nodes: tuple[RayNode, ...],
    gangs: tuple[GangDemand, ...],
    sent: bytes | None = None,
    by_pod: dict[str, RayNode] | None = None,
    delta: NodeDelta | None = None,
) -> RayState:
    """The state of `nodes` (by pod: `by_pod`, if known, made by `delta`), `gangs`
    and the other demand of `state` (a `ClusterResourceState` or its
    `wire.StateView`)."""
    resources = tuple(
        ResourceDemand(_bundle(r.request), int(r.count), DemandRef("resource", i))
        for i, r in enumerate(state.pending_resource_requests)
        if r.count > 0
    )
    constraints = tuple(
        _constraint(c, DemandRef("constraint", i))
        for i, c in enumerate(state.cluster_resource_constraints)
    )
    demand = Demand(resources, tuple(g for g in gangs if g.bundles), constraints)
    return RayState(nodes, demand, state, sent, by_pod=by_pod, delta=delta)


def copy_infeasible(state: Any, refs: Iterable[tuple[DemandRef, int]], target: Any) -> None:
    """Append to `target` (an `AutoscalingState` or a `SchedulingReply`: both have
    the three `infeasible_*` fields) the request messages of `state` (a
    `ClusterResourceState` or its `wire.StateView`) that `refs` name, each once, in
    the order given; a task or actor request as many times as its count says (Ray
    reports an infeasible request once per copy)."""
    seen: set[DemandRef] = set()
    for ref, copies in refs:
        if ref in seen:
            continue
        seen.add(ref)
        if ref.kind == "resource":
            message = state.pending_resource_requests[ref.index].request
            target.infeasible_resource_requests.extend([message] * max(1, copies))
        elif ref.kind == "gang":
            gang = state.pending_gang_resource_requests[ref.index]
            if isinstance(gang, bytes):  # a view's: the request as sent
                target.infeasible_gang_resource_requests.add().MergeFromString(gang)
            else:
                target.infeasible_gang_resource_requests.append(gang)
        else:
            target.infeasible_cluster_resource_constraints.append(
                state.cluster_resource_constraints[ref.index]
            )


def _constraint(constraint: Any, source: DemandRef | None = None) -> ClusterConstraint:
    return ClusterConstraint(
        tuple(
            _bundle(r.request, fallbacks=False)
            for r in constraint.resource_requests
            for _ in range(int(r.count))
        ),
        source,
    )


def node_of(node: Any) -> RayNode:
    """A `NodeState` message as our node. Its maps are copied key by key (a `dict()`
    of a protobuf map goes through Python's `Mapping` methods, slower), its status
    named from a table made once (`NodeStatus.Name`, a Python call into the enum's
    descriptor, for a number not in it)."""
    status = _STATUS_NAMES.get(node.status) or autoscaler_pb2.NodeStatus.Name(node.status)
    labels, total, available = node.labels, node.total_resources, node.available_resources
    return RayNode(
        node_id=node.node_id.hex() if isinstance(node.node_id, bytes) else str(node.node_id),
        instance_id=node.instance_id,
        node_type=node.ray_node_type_name,
        labels={key: labels[key] for key in labels},
        total={key: total[key] for key in total},
        available={key: available[key] for key in available},
        idle_s=node.idle_duration_ms / 1000.0 if status == "IDLE" else 0.0,
        status=status,
    )


def _idle_for(node: RayNode, idle_s: float) -> RayNode:
    """`node` idle for another duration, all else the same: every field named (a third
    cheaper than `Remade`, for every IDLE node of every read; a field added to
    `RayNode` and missed here is a TypeError at the first IDLE node)."""
    return RayNode(
        node.node_id,
        node.instance_id,
        node.node_type,
        node.labels,
        node.total,
        node.available,
        idle_s,
        node.status,
    )


_STATUS_NAMES: dict[int, str] = {
    value.number: value.name for value in autoscaler_pb2.NodeStatus.DESCRIPTOR.values
}


def _selector(selector: Any) -> LabelSelector:
    """One of a request's label selectors. An operator Ray's scheduler does not know
    fails on every node there: `IN ()` here."""
    constraints = []
    for c in selector.label_constraints:
        if c.operator == _IN:
            constraints.append(LabelConstraint(c.label_key, "in", frozenset(c.label_values)))
        elif c.operator == _NOT_IN:
            constraints.append(LabelConstraint(c.label_key, "not_in", frozenset(c.label_values)))
        else:
            constraints.append(LabelConstraint(c.label_key, "in", frozenset()))
    return tuple(sorted(constraints, key=lambda c: (c.key, c.operator)))


def _bundle(request: Any, fallbacks: bool = True) -> Bundle:
    """The first label selector is the preferred one, later ones its fallbacks (Ray
    2.60 lets a host matching any of them take the request). Placement group and
    `request_resources` bundles keep the first only (`fallbacks=False`): the policy
    tries fallbacks for tasks and actors, which is where Ray's `fallback_strategy`
    puts them (a placement group's go to other bundle selector sets, which Ray's
    autoscaler does not read)."""
    selectors = [_selector(s) for s in request.label_selectors]
    return Bundle(
        {k: float(v) for k, v in request.resources_bundle.items() if v > 0},
        selectors[0] if selectors else (),
        tuple(selectors[1:]) if fallbacks else (),
    )


_GangParts = tuple[str | None, tuple[Bundle, ...], GangStrategy]


def _gang(index: int, gang: Any) -> GangDemand:
    return _made_gang(index, *_gang_parts(gang))


def _gang_parts(gang: Any) -> _GangParts:
    """A gang request's id (None: its details name none), bundles and strategy."""
    requests = (
        gang.bundle_selectors[0].resource_requests if gang.bundle_selectors else gang.requests
    )
    bundles = tuple(_bundle(r, fallbacks=False) for r in requests)
    match = _DETAILS.match(gang.details or "")
    gang_id = match.group("pg_id") if match and match.group("pg_id") else None
    strategy = GangStrategy.PACK
    if match and match.group("strategy") in GangStrategy.__members__:
        strategy = GangStrategy[match.group("strategy")]
    # The GCS encodes the strict strategies as constraints on a per-group label.
    constraints = [c for r in requests for c in r.placement_constraints]
    if any(c.HasField("anti_affinity") for c in constraints):
        strategy = GangStrategy.STRICT_SPREAD
    elif any(c.HasField("affinity") for c in constraints):
        strategy = GangStrategy.STRICT_PACK
    return gang_id, bundles, strategy


def _made_gang(
    index: int, gang_id: str | None, bundles: tuple[Bundle, ...], strategy: GangStrategy
) -> GangDemand:
    """The gang at `index` of the pending list (a gang without an id is named by it)."""
    return GangDemand(gang_id or f"gang-{index}", bundles, strategy, DemandRef("gang", index))


def _moved_gang(gang: GangDemand, index: int) -> GangDemand:
    """`gang` (one with an id) at `index` of the pending list: what `_made_gang` makes
    of its parts there, its fields copied rather than derived again (a gang's
    place moves each time one ahead of it is placed, and deriving each of a long
    queue's gangs again was much of a read)."""
    moved: GangDemand = _NEW(GangDemand)
    for name, value in zip(_GANG_SLOTS, _GANG_VALUES(gang), strict=True):
        _SET(moved, name, value)
    _SET(moved, "source", _gang_ref(index))
    return moved


def _gang_ref(index: int) -> DemandRef:
    """`DemandRef("gang", index)`, made once for each place (a frozen value, so one
    object serves every gang ever at that place)."""
    refs = _GANG_REFS
    if index >= len(refs):
        refs.extend(DemandRef("gang", at) for at in range(len(refs), index + 1))
    return refs[index]


_GANG_REFS: list[DemandRef] = []
_NEW = object.__new__
_SET = object.__setattr__
_GANG_SLOTS: tuple[str, ...] = tuple(name for name in GangDemand.__slots__ if name != "source")
"""What a moved gang keeps: all but its place."""
_GANG_VALUES = operator.attrgetter(*_GANG_SLOTS)


def infeasible_texts(autoscaling_state: Any) -> list[str]:
    """The demand an `AutoscalingState` (ours or Ray's autoscaler's) reports as
    infeasible, in the policy's words."""
    texts = [
        str(ResourceDemand(_bundle(r), 1)) for r in autoscaling_state.infeasible_resource_requests
    ]
    texts += [
        str(_gang(i, g)) for i, g in enumerate(autoscaling_state.infeasible_gang_resource_requests)
    ]
    texts += [
        str(_constraint(c)) for c in autoscaling_state.infeasible_cluster_resource_constraints
    ]
    return texts
