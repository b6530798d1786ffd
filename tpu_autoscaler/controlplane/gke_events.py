"""What GKE says, in Kubernetes objects, when a slice cannot be had or is taken away:
the Events its cluster-autoscaler records on a Pending pod whose scale-up failed, and
the status the kubelet leaves on a pod whose spot VM was preempted. The words are the
ones `adapters/kube/capacity_events.py` cites and reads, so the simulator says what
GKE says and the autoscaler reads both the same way."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from tpu_autoscaler.adapters.kube.capacity_events import (
    FAILED_SCALE_UP,
    FAILED_SCALE_UP_MESSAGE,
    NODE_SHUTDOWN_MESSAGES,
    OUT_OF_RESOURCES,
    QUOTA_EXCEEDED,
)

ZONE: Final = "us-central2-b"
"""The zone the simulated node pools live in (a TPU zone)."""
CLUSTER_AUTOSCALER: Final = "cluster-autoscaler"
"""The component GKE's cluster-autoscaler records its Events as."""
MESSAGE_LIMIT: Final = 250
"""GKE's `messageLengthLimit`: a FailedScaleUp message is cut there."""
NODE_SHUTDOWN_REASON: Final = "Terminated"
"""The kubelet's `nodeShutdownReason` (Kubernetes >= 1.22)."""
NODE_SHUTDOWN_MESSAGE: Final = NODE_SHUTDOWN_MESSAGES[0]
PREEMPTED_DEATH_REASON: Final = "AUTOSCALER_DRAIN_PREEMPTED"
"""Ray's `NodeDeathInfo.Reason` for a node whose VM was preempted."""
PREEMPTED_DEATH_MESSAGE: Final = "spot VM preempted"
FAILED_DEATH_REASON: Final = "UNEXPECTED_TERMINATION"
"""Ray's `NodeDeathInfo.Reason` for a node that died (its host failed)."""

SCALE_UP_REASONS: Final = {"stockout": OUT_OF_RESOURCES, "quota": QUOTA_EXCEEDED}
"""What a failed scale-up says, by the fault that caused it."""


def failed_scale_up_message(reason: str, zones: str = ZONE) -> str:
    """GKE's `zonalErrorMessageTemplate`, cut to `messageLengthLimit`."""
    return FAILED_SCALE_UP_MESSAGE.format(zones=zones, reasons=reason)[:MESSAGE_LIMIT]


def failed_scale_up(pod: Mapping[str, Any], message: str, now_s: float) -> dict[str, Any]:
    """The core/v1 Event GKE's cluster-autoscaler records on `pod` (as stored) when a
    scale-up for it failed (client-go's recorder names it `<pod>.<nanoseconds, hex>`)."""
    meta = pod["metadata"]
    stamp = datetime.fromtimestamp(int(now_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{int(now_s * 1e9):x}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "reason": FAILED_SCALE_UP,
        "message": message,
        "type": "Warning",
        "source": {"component": CLUSTER_AUTOSCALER},
        "reportingComponent": CLUSTER_AUTOSCALER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
