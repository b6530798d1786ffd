"""Reading the GCS with the last read's nodes remembered (`NodeMemory`) gives what
parsing every node afresh gives, read after read (the nodes, and the nodes by pod
made from the last read's), and leaves the message as it was."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.adapters.ray.state import NodeMemory, from_message

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
