"""Reading the GCS with the last read's nodes remembered (`NodeMemory`) gives what
parsing every node afresh gives, read after read, and leaves the message as it was."""

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
        assert from_message(state, memory).nodes == from_message(_state(nodes)).nodes
        assert state.SerializeToString(deterministic=True) == sent
        assert len(memory.parsed) <= len(nodes)
