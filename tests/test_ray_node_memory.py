"""Reading the GCS with the last read's nodes remembered (`NodeMemory`) gives what
parsing every node afresh gives, read after read (the nodes, and the nodes by pod
made from the last read's), and leaves the message as it was."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.adapters.kube.pods import ReplicaMemo
from tpu_autoscaler.adapters.ray import state as state_module
from tpu_autoscaler.adapters.ray.state import NodeMemory, RayNode, from_message

STATUSES = ["RUNNING", "IDLE", "DRAINING", "DEAD"]
NODE = st.fixed_dictionaries(
    {
        "pod": st.sampled_from(["w-0", "w-1", "w-2"]),
        "status": st.sampled_from(STATUSES),
        "idle_ms": st.integers(0, 5000),
        "tpu_free": st.sampled_from([0.0, 2.0, 4.0]),
        "slice": st.sampled_from(["s-a", "s-b"]),
    }
)


def _state(nodes: list[dict[str, Any]]) -> Any:
    state = autoscaler_pb2.ClusterResourceState()
    for node in nodes:
        message = state.node_states.add()
        message.node_id = node["pod"].encode()
        message.instance_id = node["pod"]
        message.ray_node_type_name = "workers"
        message.status = autoscaler_pb2.NodeStatus.Value(node["status"])
        message.idle_duration_ms = node["idle_ms"]
        message.total_resources["TPU"] = 4.0
        message.available_resources["TPU"] = node["tpu_free"]
        message.labels["ray.io/tpu-slice-name"] = node["slice"]
    return state


@given(st.lists(st.lists(NODE, max_size=4), min_size=1, max_size=6))
def test_remembered_nodes_read_as_parsed_afresh(reads: list[list[dict[str, Any]]]) -> None:
    memory = NodeMemory()
    for nodes in reads:
        state = _state(nodes)
        sent = state.SerializeToString(deterministic=True)
        read = from_message(state, memory)
        afresh = from_message(_state(nodes))
        assert read.nodes == afresh.nodes
        assert read.node_for_pod() == afresh.node_for_pod()
        assert list(read.node_for_pod()) == list(afresh.node_for_pod())
        assert state.SerializeToString(deterministic=True) == sent
        assert len(memory.keys) == len(memory.found) == len(nodes)


def _many(count: int, idle_ms: int = 1000) -> list[dict[str, Any]]:
    return [
        {
            "pod": f"w-{index}",
            "status": "IDLE" if index % 3 else "RUNNING",
            "idle_ms": idle_ms if index % 3 else 0,
            "tpu_free": 4.0 if index % 3 else 0.0,
            "slice": f"s-{index // 4}",
        }
        for index in range(count)
    ]


def _read(memory: NodeMemory, nodes: list[dict[str, Any]]) -> tuple[Any, ...]:
    read = from_message(_state(nodes), memory)
    afresh = from_message(_state(nodes))
    assert read.nodes == afresh.nodes
    assert list(read.node_for_pod().items()) == list(afresh.node_for_pod().items())
    return read.nodes


def test_nodes_after_some_gone_are_taken_from_the_last_read() -> None:
    """Nodes gone from the middle of the list, others changed where they stand and
    some new at its end: each node whose message is the same is the last read's
    (the places are followed past those gone), the others read anew."""
    memory = NodeMemory()
    nodes = _many(300)
    before = dict(zip([n["pod"] for n in nodes], _read(memory, nodes), strict=True))
    nodes = nodes[:40] + nodes[43:200] + nodes[205:] + _many(310)[300:]
    for node in nodes[10:30]:
        node["idle_ms"] += 5000 * bool(node["idle_ms"])  # an IDLE node's idle time moves
    nodes[100]["tpu_free"] = 2.0
    after = _read(memory, nodes)
    changed = {n["pod"] for n in nodes[10:30] if n["idle_ms"]} | {nodes[100]["pod"]}
    for node, read in zip(nodes, after, strict=True):
        kept = before.get(node["pod"])
        assert (read is kept) == (node["pod"] not in changed and kept is not None), node["pod"]


def test_nodes_in_another_order_are_found_by_message() -> None:
    """A read whose nodes follow the last read's order too little (reversed here)
    finds each unchanged node by its message, and reads as parsed afresh."""
    memory = NodeMemory()
    nodes = _many(300)
    before = _read(memory, nodes)
    after = _read(memory, list(reversed(nodes)))
    assert all(a is b for a, b in zip(after, reversed(before), strict=True))


def _changed_pods(before: dict[str, Any], now: dict[str, Any]) -> set[str]:
    """The pods whose node differs between two mappings (a node compared as an
    object: a pod's node parsed again is a change)."""
    return {pod for pod in before.keys() | now.keys() if before.get(pod) is not now.get(pod)}


def _check_delta(memory: NodeMemory, before: Any, nodes: list[dict[str, Any]]) -> Any:
    """Read `nodes` after the state `before`: the state's `delta`, if any, says how
    its nodes by pod came from `before`'s (the very mapping), names every pod whose
    node changed, and the mapping is what reading afresh makes, in its order."""
    read = from_message(_state(nodes), memory)
    afresh = from_message(_state(nodes)).node_for_pod()
    now = read.node_for_pod()
    assert list(now.items()) == list(afresh.items())
    delta = read.delta
    if delta is not None:
        assert delta.before is before.node_for_pod()
        assert delta.now is now
        assert _changed_pods(dict(delta.before), now) <= delta.pods
    return read


@given(st.lists(st.lists(NODE, max_size=4), min_size=1, max_size=6))
def test_each_state_names_the_pods_whose_node_changed(reads: list[list[dict[str, Any]]]) -> None:
    memory = NodeMemory()
    before = from_message(_state(reads[0]), memory)
    for nodes in reads[1:]:
        before = _check_delta(memory, before, nodes)


@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 59), max_size=6, unique=True),
            st.lists(st.integers(0, 59), max_size=6, unique=True),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_pods_gone_changed_and_new_are_named_with_the_rest_kept(
    steps: list[tuple[list[int], list[int], int]],
) -> None:
    """A large cluster's reads, nodes gone from anywhere in the list, others idle
    longer where they stand, new ones at the end: each state's delta, from the last
    read's mapping, names the pods of those alone (the others' nodes are the last
    read's objects)."""
    memory = NodeMemory()
    nodes = _many(60)
    before = from_message(_state(nodes), memory)
    joined = 60
    for gone, idler, new in steps:
        gone_pods = {nodes[i]["pod"] for i in gone if i < len(nodes)}
        nodes = [n for n in nodes if n["pod"] not in gone_pods]
        longer = {nodes[i]["pod"] for i in idler if i < len(nodes) and nodes[i]["idle_ms"]}
        for node in nodes:
            if node["pod"] in longer:
                node["idle_ms"] += 1000
        added = [dict(n, pod=f"w-{joined + k}") for k, n in enumerate(_many(new))]
        joined += new
        nodes = nodes + added
        read = _check_delta(memory, before, nodes)
        assert read.delta is not None
        assert read.delta.pods == gone_pods | longer | {n["pod"] for n in added}
        before = read


def test_a_node_gone_before_one_changed_leaves_the_delta_exact() -> None:
    """A node gone right before one that changed where it stands: the places pair
    the changed node with the gone one (another pod), and the mapping is made
    afresh, but the delta still names those two pods alone."""
    memory = NodeMemory()
    nodes = _many(40)
    before = from_message(_state(nodes), memory)
    gone = nodes.pop(10)
    nodes[10]["idle_ms"] += 1000  # the node after it (IDLE), idle longer
    read = _check_delta(memory, before, nodes)
    assert read.delta is not None
    assert read.delta.pods == {gone["pod"], nodes[10]["pod"]}


def test_nodes_new_before_others_and_many_gone_are_named() -> None:
    """New nodes listed before others of the last read's (live ones before the
    dead), and a run of nodes gone longer than a look ahead of a few: each node
    not changed is the last read's, and the delta names the pods of those that
    came and went alone."""
    memory = NodeMemory()
    nodes = _many(200)
    before = from_message(_state(nodes), memory)
    kept = {node.instance_id: node for node in before.nodes}
    new = [dict(n, pod=f"new-{k}") for k, n in enumerate(_many(40))]
    gone = nodes[100:140]
    nodes = nodes[:20] + new + nodes[20:100] + nodes[140:]
    read = _check_delta(memory, before, nodes)
    assert read.delta is not None
    assert read.delta.pods == {n["pod"] for n in new + gone}
    unchanged = [node for node in read.nodes if node.instance_id in kept]
    assert all(node is kept[node.instance_id] for node in unchanged)


def test_a_replica_memo_that_missed_a_state_takes_no_delta() -> None:
    """A state's delta is from the state before it: a `ReplicaMemo` that did not see
    that state (a read whose round went no further) takes none, and what it hands out
    is what reading afresh makes; one that saw it takes the state's."""
    memory, memo = NodeMemory(), ReplicaMemo()
    nodes = _many(30)
    memo.nodes_by_pod(from_message(_state(nodes), memory))
    nodes[4]["idle_ms"] += 1000
    from_message(_state(nodes), memory)  # not shown to the memo
    nodes[7]["idle_ms"] += 1000
    state = from_message(_state(nodes), memory)
    assert state.delta is not None and state.delta.pods == {nodes[7]["pod"]}
    assert memo.nodes_by_pod(state) == from_message(_state(nodes)).node_for_pod()
    assert memo.node_delta is None
    nodes[8]["idle_ms"] += 1000
    state = from_message(_state(nodes), memory)
    memo.nodes_by_pod(state)
    assert memo.node_delta is state.delta


EDITS = st.lists(
    st.tuples(st.sampled_from(["gone", "new", "changed", "moved"]), st.integers(0, 10**6)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), EDITS)
def test_the_places_followed_account_for_every_node_of_both_reads(
    count: int, edits: list[tuple[str, int]]
) -> None:
    """Whatever changed between two reads (nodes gone, new anywhere, changed where
    they stand, moved), `_aligned` takes a last read's node only for an equal
    message, and accounts for each place of both reads once: a last read's node is
    taken, compared with a changed one (`paired`) or passed over (`gone`); a new
    read's node is taken, paired, passed over (`inserted`) or past the end (`came`).
    `_delta` names the pods of all but the taken from this."""
    ids = iter(range(10**6))

    def message(node: int, version: int) -> bytes:
        return f"{node:032d}".encode() + b"v" * version  # the node's id first

    last = [message(next(ids), 0) for _ in range(count)]
    now = list(last)
    for edit, at in edits:
        place = at % (len(now) + 1)
        if edit == "new":
            now.insert(place, message(next(ids), 0))
        elif now and edit == "gone":
            del now[place % len(now)]
        elif now and edit == "changed":
            node = now[place % len(now)]
            now[place % len(now)] = node + b"v"
        elif now and edit == "moved":
            now.insert(place, now.pop(at % len(now)))
    found = [object() for _ in last]
    alignment = state_module._aligned(now, last, found)  # type: ignore[arg-type]
    by_message = dict(zip(last, found, strict=True))
    for key, node in zip(now, alignment.nodes, strict=True):
        assert node is None or node is by_message[key]
    if not alignment.followed:
        return
    taken = {id(node) for node in alignment.nodes if node is not None}
    was_places = [was for _, was in alignment.paired] + alignment.gone
    was_places += [i for i, node in enumerate(found) if id(node) in taken]
    assert sorted(was_places) == list(range(len(last)))
    places = [index for index, _ in alignment.paired] + alignment.inserted
    places += [i for i, node in enumerate(alignment.nodes) if node is not None]
    places += range(alignment.came, len(now))
    assert sorted(places) == list(range(len(now)))


class _Counted(bytes):
    """A node message that counts how often it is compared for inequality (what
    `_aligned` does in C to find the places that differ)."""

    compared = 0

    def __ne__(self, other: object) -> bool:
        _Counted.compared += 1
        return bytes.__ne__(self, other)  # type: ignore[operator]


def test_places_after_a_node_gone_are_not_compared_again_and_again() -> None:
    """A read of a cluster removing idle slices: a replica's nodes gone here and
    there, and the IDLE nodes between them changed where they stand. The places are
    compared about once each, not again from each node gone on (a first chunk of
    256 places that differ, found and dropped at each node gone, compared most of
    the list again per replica gone)."""
    count = 2000

    def message(node: int, version: int) -> _Counted:
        return _Counted(f"{node:032d}".encode() + b"v" * version)

    last = [message(node, 0) for node in range(count)]
    now = [
        message(node, 1 if node % 3 == 0 else 0)  # the IDLE ones, idle longer
        for node in range(count)
        if node % 50 >= 4  # a 4-host replica gone every 50 nodes
    ]
    found = [RayNode(str(n), str(n), "w", {}, {}, {}, 0.0, "IDLE") for n in range(count)]
    _Counted.compared = 0
    alignment = state_module._aligned(list(now), list(last), found)
    assert len(alignment.gone) == 4 * (count // 50)
    assert _Counted.compared < 2 * len(now)
