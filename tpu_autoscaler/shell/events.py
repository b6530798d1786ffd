"""Kubernetes Events on the RayCluster: what `kubectl describe raycluster` shows of
the autoscaler's decisions, each with its reason. Built here, posted by the shell."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

COMPONENT = "tpu-autoscaler"
MESSAGE_LIMIT = 1024
"""The API server rejects longer Event messages."""

LAUNCH = "LaunchReplicas"
REMOVE = "RemoveReplica"
DRAIN_REFUSED = "DrainRefused"
REMOVAL_TAKEN_BACK = "RemovalTakenBack"
INFEASIBLE = "InfeasibleDemand"
INVALID_GROUP = "InvalidWorkerGroup"
UNIDENTIFIED = "UnidentifiedReplicas"
REPLICA_NAME_CLASH = "ReplicaNameClash"
APPLY_FAILED = "ScalingFailed"
CAPACITY_STOCKED_OUT = "CapacityStockedOut"
CAPACITY_BACKING_OFF = "CapacityBackingOff"
CAPACITY_CHURNING = "CapacityChurning"
CAPACITY_AVAILABLE = "CapacityAvailable"
SIGNALS_UNREADABLE = "CapacitySignalsUnreadable"
REPLICA_UP = "ReplicaUp"

EventType = Literal["Normal", "Warning"]


def cluster_event(
    raycluster: dict[str, Any],
    reason: str,
    message: str,
    event_type: EventType,
    now_s: float,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about `raycluster` (its metadata as read from the API);
    `annotations`: figures a reader takes back without parsing the message."""
    meta = raycluster.get("metadata", {})
    stamp = datetime.fromtimestamp(now_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    metadata: dict[str, Any] = {
        "generateName": f"{meta.get('name', 'raycluster')}.",
        "namespace": meta.get("namespace"),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": {
            "apiVersion": raycluster.get("apiVersion", "ray.io/v1"),
            "kind": "RayCluster",
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
