"""The drain's re-read of the GCS parses only the hosts it drains (`read_live_nodes`):
what it finds must be what the full read (`read_ray_state`) finds for them."""

from __future__ import annotations

import random

from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.adapters.ray.gcs import read_live_nodes, read_ray_state

STATUSES = ("RUNNING", "IDLE", "DRAINING", "DEAD")


class _Gcs:
    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def get_cluster_resource_state(self) -> bytes:
        return self.reply


def _reply(rng: random.Random, pods: list[str]) -> bytes:
    """Nodes of `pods` in random statuses, some pods listed twice (a restarted raylet
    leaves its dead node; a pod may even be listed live twice)."""
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    state = reply.cluster_resource_state
    for index in range(3 * len(pods)):
        pod = rng.choice(pods)
        node = state.node_states.add()
        node.node_id = index.to_bytes(28, "big")
        node.instance_id = pod
        node.ray_node_type_name = "slices"
        node.status = autoscaler_pb2.NodeStatus.Value(rng.choice(STATUSES))
        if node.status == autoscaler_pb2.NodeStatus.IDLE:
            node.idle_duration_ms = rng.randrange(1, 10**6)
        node.total_resources["TPU"] = 4.0
        node.available_resources["TPU"] = float(rng.choice((0, 4)))
        node.labels["ray.io/tpu-worker-id"] = str(index % 4)
    return reply.SerializeToString()


def test_the_reread_finds_for_the_drained_hosts_what_the_full_read_finds() -> None:
    rng = random.Random(7)
    pods = [f"pod-{i}" for i in range(12)]
    for _ in range(200):
        gcs = _Gcs(_reply(rng, pods))
        full = {n.instance_id: n for n in read_ray_state(gcs).nodes if not n.dead}
        wanted = set(rng.sample([*pods, "absent"], rng.randrange(0, 8)))
        found = read_live_nodes(gcs, wanted)
        assert found == {pod: node for pod, node in full.items() if pod in wanted}
        assert all(not node.dead for node in found.values())


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field as protobuf encodes it (short payloads only)."""
    assert len(payload) < 0x80
    return bytes((number << 3 | 2, len(payload))) + payload


def test_the_reread_reads_each_node_as_a_parser_does_whatever_the_field_order() -> None:
    """The re-read finds a node by its instance id as parsing reads it: the last of
    several, wherever in the message; the node it returns is the whole message, other
    fields as sent (a sender is free to order fields, and to repeat one)."""
    node = autoscaler_pb2.NodeState()
    node.node_id = b"\x01" * 28
    node.ray_node_type_name = "slices"
    node.status = autoscaler_pb2.NodeStatus.RUNNING
    node.total_resources["TPU"] = 4.0
    node.labels["ray.io/tpu-worker-id"] = "pod-1"
    first, last = _field(2, b"pod-1"), _field(2, b"pod-2")
    sent = first + node.SerializeToString() + last  # pod-1 first, then pod-2: pod-2
    reply = _field(1, _field(3, sent))
    gcs = _Gcs(reply)
    full = {n.instance_id: n for n in read_ray_state(gcs).nodes if not n.dead}
    assert set(full) == {"pod-2"}
    assert read_live_nodes(gcs, {"pod-1"}) == {}
    assert read_live_nodes(gcs, {"pod-1", "pod-2"}) == full
