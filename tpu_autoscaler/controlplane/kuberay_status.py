"""What status does KubeRay (v1.7.0) compute for a RayCluster after a reconcile?
`calculateStatus` of its `raycluster_controller.go`: worker counts in pods (not
replicas) and the `ReplicaFailure` condition of a reconcile that ended in an error.
`controlplane/kuberay.py` writes it when it differs from the stored status."""

from __future__ import annotations

from typing import Any

from tpu_autoscaler.controlplane.clock import rfc3339
from tpu_autoscaler.controlplane.kuberay_groups import desired_replicas, hosts_per_replica


def worker_counts(spec: dict[str, Any]) -> tuple[int, int, int]:
    """The desired, minimum and maximum worker pods of a RayCluster `spec`."""
    groups = spec.get("workerGroupSpecs", [])
    hosts = [hosts_per_replica(g) for g in groups]
    return (
        sum(desired_replicas(g) * h for g, h in zip(groups, hosts, strict=True)),
        sum(int(g.get("minReplicas") or 0) * h for g, h in zip(groups, hosts, strict=True)),
        sum(int(g.get("maxReplicas") or 0) * h for g, h in zip(groups, hosts, strict=True)),
    )


def status_from_counts(
    raycluster: dict[str, Any],
    ready: int,
    available: int,
    error: str | None,
    now_s: float,
    counts: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """The status of `raycluster` from the counts of its worker pods Running and not
    being deleted (`ready`) and Running (`available`), as the operator's pod cache
    keeps them (`kuberay_cache.ClusterPods`), and the reconcile's error; `now_s`
    stamps a condition that turns True. `counts`: `worker_counts` of its spec, if
    the caller kept them."""
    desired, minimum, maximum = counts or worker_counts(raycluster["spec"])
    status: dict[str, Any] = dict(raycluster.get("status") or {})
    status.update(
        readyWorkerReplicas=ready,
        availableWorkerReplicas=available,
        desiredWorkerReplicas=desired,
        minWorkerReplicas=minimum,
        maxWorkerReplicas=maximum,
    )
    conditions = [c for c in status.get("conditions", []) if c["type"] != "ReplicaFailure"]
    if error is not None:
        previous = next(
            (c for c in status.get("conditions", []) if c["type"] == "ReplicaFailure"), None
        )
        conditions.append(
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedReconcile",
                "message": error,
                # meta.SetStatusCondition keeps the time while the status stays True.
                "lastTransitionTime": previous["lastTransitionTime"]
                if previous is not None
                else rfc3339(now_s),
            }
        )
    status["conditions"] = conditions
    return status
