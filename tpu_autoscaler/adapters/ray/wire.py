"""A serialized `GetClusterResourceStateReply` read with its node states and pending
gangs left as the bytes the GCS sent, one per element: to look up the node (or gang)
parsed from the same bytes at the last read (`NodeMemory`) and parse only those that
changed. Parsing a large cluster's whole state into message objects every read, and
walking its fields in Python to find each node's bytes, was most of reading it.

Protobuf's wire format makes this exact: a message field and a `bytes` field are
both length-delimited (wire type 2), so a field read as `repeated bytes` holds each
element's serialized message, in order, whatever the sender put in it; a singular
message field that occurs more than once is merged, its repeated fields appended,
the same for either reading. The view's message types are made here from the
installed Ray's own descriptors (`ClusterResourceState` with `node_states` and
`pending_gang_resource_requests` turned into `repeated bytes`), so a field Ray adds,
renumbers or renames is read as Ray reads it; the other fields keep Ray's own message
types, so their messages can be copied into Ray's messages as they are. The parse is
upb's, in C: bytes that are not a reply raise `DecodeError` as a full parse would.
`read_node_ids` reads the node states' instance ids and status alone the same way,
their other fields kept as sent (unknown to its message type), for a re-read that
wants a few nodes by pod."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from ray.core.generated import autoscaler_pb2

__all__ = [
    "DecodeError",
    "node_messages",
    "read_node_ids",
    "read_view",
    "whole_node",
    "without_idle",
]

_PACKAGE = "tpu_autoscaler.adapters.ray.wire"
_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_NODE_ID_FIELDS = ("instance_id", "status")
"""What `NodeIds` keeps of a `NodeState`."""
_NODE_IDLE_FIELDS = ("idle_duration_ms",)
"""What `NodeIdle` keeps of a `NodeState`."""


def _view_file() -> descriptor_pb2.FileDescriptorProto:
    """The view messages, from Ray's descriptors: `StateView` (a
    `ClusterResourceState` with `node_states` and `pending_gang_resource_requests` as
    `repeated bytes`), `NodeIds` (a `NodeState` with its instance id and status only:
    its other fields are kept unknown, as sent), `NodeIdle` (one with its idle
    duration only), `IdsView` (a `ClusterResourceState` with `NodeIds` for nodes),
    and a `GetClusterResourceStateReply` holding each view."""
    made = descriptor_pb2.FileDescriptorProto(
        name="tpu_autoscaler/adapters/ray/wire_view.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=[autoscaler_pb2.DESCRIPTOR.name],
    )
    for name, fields in (("NodeIds", _NODE_ID_FIELDS), ("NodeIdle", _NODE_IDLE_FIELDS)):
        node = made.message_type.add()
        autoscaler_pb2.NodeState.DESCRIPTOR.CopyToProto(node)
        node.name = name
        kept = [f for f in node.field if f.name in fields]
        del node.field[:]
        node.field.extend(kept)
        del node.nested_type[:]  # the map entries of the fields left out
    for name, nodes in (("StateView", None), ("IdsView", f".{_PACKAGE}.NodeIds")):
        state = made.message_type.add()
        autoscaler_pb2.ClusterResourceState.DESCRIPTOR.CopyToProto(state)
        state.name = name
        for field in state.field:
            if field.name == "node_states" and nodes is not None:
                field.type_name = nodes
            elif field.name in ("node_states", "pending_gang_resource_requests"):
                field.type = _BYTES
                field.ClearField("type_name")
        reply = made.message_type.add()
        autoscaler_pb2.GetClusterResourceStateReply.DESCRIPTOR.CopyToProto(reply)
        reply.name = f"Reply{name}"
        (held,) = [f for f in reply.field if f.name == "cluster_resource_state"]
        held.type_name = f".{_PACKAGE}.{name}"
    return made


def _view_class(name: str) -> Any:
    """A view message class, its file added to the default pool at the first ask."""
    pool = descriptor_pool.Default()
    try:
        found = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    except KeyError:
        pool.AddSerializedFile(_view_file().SerializeToString())
        found = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    return message_factory.GetMessageClass(found)


_REPLY_VIEW = _view_class("ReplyStateView")
_REPLY_IDS = _view_class("ReplyIdsView")
_NODE_IDLE = _view_class("NodeIdle")


def read_view(reply: bytes) -> Any:
    """The `StateView` of a serialized `GetClusterResourceStateReply`: every field as
    Ray's `ClusterResourceState` has it, of Ray's types, but the node states and the
    pending gangs, each the element's bytes as sent. `DecodeError` for bytes that are
    not a reply."""
    view = _REPLY_VIEW()
    view.ParseFromString(reply)
    return view.cluster_resource_state


def node_messages(reply: bytes) -> list[bytes]:
    """The serialized `node_states` of a serialized `GetClusterResourceStateReply`,
    in order, each as sent."""
    return list(read_view(reply).node_states)


def read_node_ids(reply: bytes) -> Any:
    """The node states of a serialized `GetClusterResourceStateReply`, each a
    `NodeIds`: its `instance_id` and `status` read, its other fields kept as sent
    (`whole_node`). `DecodeError` for bytes that are not a reply."""
    view = _REPLY_IDS()
    view.ParseFromString(reply)
    return view.cluster_resource_state.node_states


def whole_node(ids: Any) -> Any:
    """The `NodeState` a `NodeIds` was read from: the same fields (its instance id and
    status, last as sent, and the others as sent), so the same message."""
    return autoscaler_pb2.NodeState.FromString(ids.SerializeToString())


def without_idle(node: bytes) -> tuple[bytes, int]:
    """A serialized `NodeState` without its idle duration, and that duration (ms):
    the bytes as sent but for the idle duration's field, so two nodes whose bytes
    differ only there give the same, and any other difference gives other bytes."""
    idle = _NODE_IDLE.FromString(node)
    idle_ms: int = idle.idle_duration_ms
    if idle_ms:
        idle.ClearField("idle_duration_ms")
    return idle.SerializeToString(), idle_ms
