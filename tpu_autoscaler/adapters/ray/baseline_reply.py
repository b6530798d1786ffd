"""What Ray 2.60 and KubeRay make of the stock scheduler's reply, for the stock
comparison (`baseline.py`): the reconciler's launches and terminations handed to
Ray's own `KubeRayProvider` over the snapshot held in memory, and the RayCluster it
writes read back as KubeRay (>= 1.6) carries it out, in whole replicas.

Launches are rate-limited by the reconciler's own `_compute_to_launch` (upscaling
speed, at most `AUTOSCALER_MAX_CONCURRENT_LAUNCHES` hosts in flight), then handed to
`KubeRayProvider.terminate` and `.launch` in the reconciler's order. The provider's
arithmetic is therefore Ray's as written: host counts floor-divided by numOfHosts,
the max with observed pods, nothing done while any group's `workersToDelete` names a
pod still listed, single pods named. The resulting plan brings the provider's patch
(`UnguardedPlan`): the shell sends it without a resourceVersion precondition, as Ray
does."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ray.autoscaler._private.kuberay.node_provider import IKubernetesHttpApiClient
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.cloud_provider import (
    KubeRayProvider,
)
from ray.autoscaler.v2.instance_manager.node_provider import LaunchNodeError
from ray.autoscaler.v2.instance_manager.reconciler import Reconciler
from ray.core.generated import instance_manager_pb2

from tpu_autoscaler.adapters.kube.patches import effective_replicas
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.adapters.ray.baseline_ippr import ray_resizes
from tpu_autoscaler.adapters.ray.baseline_request import Held, raycluster_as_served
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane.json_patch import apply_operation
from tpu_autoscaler.core.plan import Launch, Terminate, Unmet
from tpu_autoscaler.core.snapshot import Replica, ReplicaState
from tpu_autoscaler.core.units import Replicas
from tpu_autoscaler.shell.controller import UnguardedPlan

_Instance = instance_manager_pb2.Instance


class _SnapshotKube(IKubernetesHttpApiClient):  # type: ignore[misc]
    """The snapshot's RayCluster and pods as `KubeRayProvider` reads them over HTTP;
    its patches applied in memory, unconditionally (Ray sends no precondition), and
    kept in order."""

    def __init__(self, raycluster: dict[str, Any], pods: Iterable[Pod]) -> None:
        self.raycluster = raycluster
        self.pods = [p.model_dump(by_alias=True, exclude_none=True) for p in pods]
        self.patches: list[list[dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any]:
        if path.startswith("rayclusters/"):
            return copy.deepcopy(self.raycluster)
        if path.startswith("pods?"):
            return {"metadata": {"resourceVersion": "0"}, "items": copy.deepcopy(self.pods)}
        if path.startswith("pods/"):
            return {"metadata": {"resourceVersion": "0"}}
        raise NotImplementedError(path)

    def patch(
        self,
        path: str,
        payload: list[dict[str, Any]] | dict[str, Any],
        content_type: str = "application/json-patch+json",
    ) -> dict[str, Any]:
        if not path.startswith("rayclusters/") or not isinstance(payload, list):
            raise NotImplementedError(f"{content_type} {path}")
        for operation in payload:
            apply_operation(self.raycluster, operation)
        self.patches.append(copy.deepcopy(payload))
        return copy.deepcopy(self.raycluster)

    def delete(self, path: str) -> dict[str, Any]:
        raise NotImplementedError(path)


def _launch_shape(held: Held, reply: Any) -> dict[str, int]:
    """Hosts per node type the reconciler hands the provider this round: the
    scheduler's launches, cut by `_compute_to_launch` to the upscaling speed and the
    cap on hosts in flight."""
    instances = [i.im_instance for i in held.request.current_instances]
    queued = [
        _Instance(instance_id=f"queued-{n}", instance_type=r.instance_type, status=_Instance.QUEUED)
        for r in reply.to_launch
        for n in range(r.count)
    ]
    launching = Reconciler._compute_to_launch(
        queued,
        [i for i in instances if i.status == _Instance.REQUESTED],
        [i for i in instances if i.status == _Instance.RAY_RUNNING],
        held.config.get_upscaling_speed(),
        held.config.get_max_concurrent_launches(),
    )
    return {group: len(chosen) for group, chosen in launching.items() if chosen}


def as_kuberay_plan(loaded: LoadedSnapshot, held: Held, reply: Any) -> UnguardedPlan:
    """Ray's `reply` carried out by its reconciler, its `KubeRayProvider` and KubeRay, as
    a plan bringing the provider's patch."""
    infeasible = tuple(_infeasible(reply))
    if not held.head_running:
        why = "Ray: the head node is not running; Ray's reconciler scales nothing until it is"
        return UnguardedPlan(infeasible=infeasible, waiting=(Unmet("any scaling", why),))
    raw = raycluster_as_served(loaded)
    kube = _SnapshotKube(copy.deepcopy(raw), loaded.pods)
    provider = KubeRayProvider(
        loaded.cluster.metadata.name,
        {"namespace": loaded.cluster.metadata.namespace},
        gcs_client=None,
        k8s_api_client=kube,
    )
    causes: dict[str, str] = {}
    for termination in reply.to_terminate:
        pod = held.cloud_ids.get(termination.instance_id)
        if pod is not None:
            causes[pod] = instance_manager_pb2.TerminationRequest.Cause.Name(termination.cause)
    shape = _launch_shape(held, reply)
    # What the provider would log is in the plan (`waiting`), so its log is kept quiet.
    provider_log = logging.getLogger(KubeRayProvider.__module__)
    level = provider_log.level
    provider_log.setLevel(logging.CRITICAL + 1)
    try:
        # The reconciler's order: the scheduler's terminations, the stopped Ray
        # nodes', then launches; each call reads the RayCluster the previous one wrote.
        if causes:
            provider.terminate(list(causes), "terminate")
        if held.stopped:
            causes.update(dict.fromkeys(held.stopped, "RAY_STOPPED"))
            provider.terminate(list(held.stopped), "terminate-stopped")
        if shape:
            provider.launch(shape, "launch")
    finally:
        provider_log.setLevel(level)
    errors = provider.poll_errors()
    waiting = [Unmet(_error_subject(e), f"Ray: {e}") for e in errors]
    launches, terminates = _changes(loaded, raw, kube.raycluster, causes, shape)
    refused = {e.node_type for e in errors if isinstance(e, LaunchNodeError)}
    waiting += _dropped(loaded, {g: n for g, n in shape.items() if g not in refused}, launches)
    return UnguardedPlan(
        tuple(launches),
        tuple(terminates),
        infeasible,
        tuple(dict.fromkeys(waiting)),
        operations=tuple(op for patch in kube.patches for op in patch),
        resize=ray_resizes(reply.to_ippr, loaded.pods),
    )


def _error_subject(error: Any) -> str:
    if isinstance(error, LaunchNodeError):
        return f"launch of {error.count} host(s) of {error.node_type}"
    return f"termination of {error.cloud_instance_id}"


def _changes(
    loaded: LoadedSnapshot,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    causes: Mapping[str, str],
    shape: Mapping[str, int],
) -> tuple[list[Launch], list[Terminate]]:
    """What KubeRay (>= 1.6) does with the provider's writes, as whole replicas: a
    replica any pod of which is newly named is deleted whole; new replicas are the
    written `replicas` beyond those the group keeps."""
    snapshot = loaded.snapshot
    launches: list[Launch] = []
    terminates: list[Terminate] = []
    groups = zip(before["spec"]["workerGroupSpecs"], after["spec"]["workerGroupSpecs"], strict=True)
    for old, new in groups:
        group = new["groupName"]
        listed = set(_names(old))
        doomed = [p for p in _names(new) if p not in listed]
        removed = [
            r
            for r in snapshot.replicas
            if r.group == group and any(h.pod_name in doomed for h in r.hosts)
        ]
        for replica in removed:
            terminates.append(
                _removal(replica, [p for p in doomed if p in _pods_of(replica)], causes)
            )
        # KubeRay creates `replicas` minus the replicas it has; the snapshot already
        # counts those it owes (`replicas` above the pods) as requested.
        alive = sum(
            r.group == group and r.state not in (ReplicaState.REQUESTED, ReplicaState.DRAINING)
            for r in snapshot.replicas
        )
        kept = max(effective_replicas(loaded.cluster, group), alive) - len(removed)
        new_replicas = int(new.get("replicas", 0)) - kept
        if new_replicas <= 0:
            continue
        hosts = shape.get(group, 0)
        if removed:
            reason = (
                f"Ray's provider wrote replicas {old.get('replicas', 0)} -> {new['replicas']} "
                f"while naming pods of {len(removed)} replica(s), which KubeRay deletes whole: "
                f"it creates {new_replicas} new"
            )
        else:
            reason = (
                f"Ray asked for {hosts} host(s); KubeRay's provider floor-divides by "
                f"numOfHosts: replicas {old.get('replicas', 0)} -> {new['replicas']}"
            )
        launches.append(Launch(group, Replicas(new_replicas), reason))
    return launches, terminates


def _names(group: Mapping[str, Any]) -> Sequence[str]:
    names: Sequence[str] = group.get("scaleStrategy", {}).get("workersToDelete") or []
    return names


def _pods_of(replica: Replica) -> set[str]:
    return {h.pod_name for h in replica.hosts}


def _removal(replica: Replica, named: Sequence[str], causes: Mapping[str, str]) -> Terminate:
    busy = [h.pod_name for h in replica.hosts if h.available != h.total]
    said = ", ".join(f"{pod} ({causes.get(pod, 'named')})" for pod in named)
    why = f"Ray terminated {said}; KubeRay deletes the whole replica"
    if busy:
        why += f", busy hosts included: {', '.join(busy)}"
    return Terminate(replica.group, replica.name, tuple(h.pod_name for h in replica.hosts), why)


def _dropped(
    loaded: LoadedSnapshot, shape: Mapping[str, int], launches: Sequence[Launch]
) -> list[Unmet]:
    """Hosts Ray asked for that became no replica (fewer than numOfHosts)."""
    launched = {launch.group for launch in launches}
    dropped = []
    for group, hosts in sorted(shape.items()):
        found = loaded.snapshot.shape(group)
        if found is not None and group not in launched:
            dropped.append(
                Unmet(
                    f"{hosts} host(s) of {group}",
                    f"Ray: KubeRay's provider floor-divides {hosts} host(s) by numOfHosts "
                    f"{found.hosts_per_replica}: no new replica",
                )
            )
    return dropped


def _infeasible(reply: Any) -> Iterable[Unmet]:
    for request in reply.infeasible_resource_requests:
        yield Unmet(_request_text(request), "Ray: infeasible")
    for gang in reply.infeasible_gang_resource_requests:
        yield Unmet(gang.details or "placement group", "Ray: infeasible")
    for _ in reply.infeasible_cluster_resource_constraints:
        yield Unmet("request_resources", "Ray: infeasible")


def _request_text(request: Any) -> str:
    resources = ", ".join(f"{k}: {v:g}" for k, v in sorted(request.resources_bundle.items()))
    return f"{{{resources}}}"
