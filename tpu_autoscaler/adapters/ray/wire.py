"""The node messages of a serialized `GetClusterResourceStateReply`, read off the wire
without parsing them: each as the bytes the GCS sent, to look up the node parsed from
the same bytes at the last read (`NodeMemory`). Parsing a large cluster's state into
message objects and serializing each node again to find it was most of reading it; a
node whose bytes did not change needs neither.

Protobuf's wire format: a message is a sequence of fields, each a varint tag (field
number << 3 | wire type) and a value; a message field is length-delimited (wire type
2), and each occurrence of a repeated message field is one element, in order; a
singular message field that occurs more than once is merged, its repeated fields
appended. So the node states are the field-3 values inside every field-1 value of
the reply, in order of appearance."""

from __future__ import annotations

from ray.core.generated import autoscaler_pb2

REPLY_STATE: int = autoscaler_pb2.GetClusterResourceStateReply.DESCRIPTOR.fields_by_name[
    "cluster_resource_state"
].number
"""`GetClusterResourceStateReply.cluster_resource_state`'s field number, from the
installed Ray's own descriptor (1 in Ray 2.60), so a renumbered field cannot be
misread."""
STATE_NODES: int = autoscaler_pb2.ClusterResourceState.DESCRIPTOR.fields_by_name[
    "node_states"
].number
"""`ClusterResourceState.node_states`'s (3 in Ray 2.60)."""
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a message this reader knows how to walk."""


def node_messages(reply: bytes) -> list[bytes]:
    """The serialized `node_states` of a serialized `GetClusterResourceStateReply`,
    in order; WireError (or IndexError) for bytes it cannot walk (the caller then
    parses)."""
    return [
        reply[start:stop]
        for state_start, state_stop in _values(reply, 0, len(reply), REPLY_STATE)
        for start, stop in _values(reply, state_start, state_stop, STATE_NODES)
    ]


def _values(data: bytes, pos: int, end: int, number: int) -> list[tuple[int, int]]:
    """Where the values of field `number` (length-delimited) of the message at
    `data[pos:end]` are; the other fields are stepped over."""
    found = []
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag & 0x80:
            tag, pos = _varint(data, pos - 1)
        wire_type = tag & 7
        if wire_type == _LENGTH_DELIMITED:
            # The length, its one- and two-byte forms inline (a node's is two).
            length = data[pos]
            if not length & 0x80:
                pos += 1
            elif not data[pos + 1] & 0x80:
                length = length & 0x7F | data[pos + 1] << 7
                pos += 2
            else:
                length, pos = _varint(data, pos)
            if tag >> 3 == number:
                found.append((pos, pos + length))
            pos += length
        elif wire_type == _VARINT:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        else:
            raise WireError(f"wire type {wire_type} at byte {pos - 1}")
    if pos != end:
        raise WireError(f"a field runs past the end of its message ({pos} > {end})")
    return found


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError(f"a varint longer than 10 bytes at byte {pos}")
