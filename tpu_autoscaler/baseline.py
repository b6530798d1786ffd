"""What the stock autoscaler does with the same snapshot: Ray 2.60's autoscaler v2
scheduler (`ResourceDemandScheduler`) on the node types Ray derives from the
RayCluster, then the KubeRay v2 provider's replica arithmetic on its decisions.

This is the side-by-side reference for `plan --policy ray`, the simulator and the
benchmarks. It reuses Ray's code as installed; only the glue is ours. Its quirks are
Ray's: per-host idle termination, `TPU-*-head` on every host, launches floored to
whole replicas (fewer than numOfHosts hosts: nothing), and one named pod removing
its whole replica in KubeRay."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.core.generated import autoscaler_pb2, instance_manager_pb2

from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.plan import Launch, Plan, Terminate, Unmet
from tpu_autoscaler.snapshot import ReplicaState
from tpu_autoscaler.units import Replicas

_Instance = instance_manager_pb2.Instance


def ray_plan(loaded: LoadedSnapshot) -> Plan:
    """The plan Ray 2.60 with KubeRay would carry out on `loaded`."""
    reply = ResourceDemandScheduler(event_logger=None).schedule(ray_request(loaded))
    return _as_kuberay_plan(loaded, reply)


def ray_request(loaded: LoadedSnapshot) -> SchedulingRequest:
    """The `SchedulingRequest` Ray's v2 reconciler would build for this snapshot."""
    raw = loaded.cluster.model_dump(by_alias=True, exclude_none=True)
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(raw), skip_content_hash=True)
    state = loaded.ray.message or autoscaler_pb2.ClusterResourceState()
    nodes_by_pod = {n.instance_id: n for n in state.node_states if n.instance_id}
    return SchedulingRequest(
        node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=list(state.pending_resource_requests),
        gang_resource_requests=list(state.pending_gang_resource_requests),
        cluster_resource_constraints=list(state.cluster_resource_constraints),
        current_instances=_instances(loaded, nodes_by_pod),
        idle_timeout_s=config.get_idle_timeout_s(),
        pending_idle_timeout_s=config.get_pending_idle_timeout_s(),
        disable_launch_config_check=True,
    )


def _instances(loaded: LoadedSnapshot, nodes_by_pod: dict[str, Any]) -> list[AutoscalerInstance]:
    instances = []
    for replica in loaded.snapshot.replicas:
        shape = loaded.snapshot.shape(replica.group)
        if shape is None:
            continue
        if replica.state is ReplicaState.REQUESTED:
            for index in range(shape.hosts_per_replica):
                im = _Instance(
                    instance_id=f"{replica.name}-{index}",
                    instance_type=replica.group,
                    status=_Instance.REQUESTED,
                    node_kind=instance_manager_pb2.NodeKind.WORKER,
                )
                instances.append(AutoscalerInstance(im_instance=im))
            continue
        for host in replica.hosts:
            node = nodes_by_pod.get(host.pod_name)
            running = node is not None and host.registered
            im = _Instance(
                instance_id=host.pod_name,
                cloud_instance_id=host.pod_name,
                instance_type=replica.group,
                status=_Instance.RAY_RUNNING if running else _Instance.ALLOCATED,
                node_kind=instance_manager_pb2.NodeKind.WORKER,
            )
            if node is not None and running:
                im.node_id = node.node_id.hex()
            instances.append(
                AutoscalerInstance(
                    cloud_instance_id=host.pod_name,
                    ray_node=node if running else None,
                    im_instance=im,
                )
            )
    return instances


def _as_kuberay_plan(loaded: LoadedSnapshot, reply: Any) -> Plan:
    """The KubeRay v2 provider's arithmetic on Ray's decision: hosts to launch are
    added to `replicas x numOfHosts` and floored back to replicas, capped at max; every
    terminated host's pod goes into workersToDelete, which removes its whole replica."""
    snapshot = loaded.snapshot
    shapes = {s.group: s for s in snapshot.shapes}
    existing = Counter(r.group for r in snapshot.replicas if r.state is not ReplicaState.DRAINING)
    launch_hosts: Counter[str] = Counter()
    for launch in reply.to_launch:
        launch_hosts[launch.instance_type] += launch.count
    launches = []
    for group, hosts in sorted(launch_hosts.items()):
        shape = shapes.get(group)
        if shape is None:
            continue
        current = existing[group]
        target = min(
            (current * shape.hosts_per_replica + hosts) // shape.hosts_per_replica,
            shape.max_replicas,
        )
        replicas = target - current
        reason = f"Ray asked for {hosts} host(s); KubeRay floors to whole replicas"
        if replicas > 0:
            launches.append(Launch(group, Replicas(replicas), reason))
    replica_of_pod = {h.pod_name: r for r in snapshot.replicas for h in r.hosts}
    removed: dict[str, list[str]] = defaultdict(list)
    for termination in reply.to_terminate:
        # Our instance ids are pod names, as the KubeRay provider's are.
        replica = replica_of_pod.get(termination.instance_id)
        if replica is not None:
            cause = instance_manager_pb2.TerminationRequest.Cause.Name(termination.cause)
            removed[replica.name].append(f"{termination.instance_id} ({cause})")
    terminates = []
    for replica in snapshot.replicas:
        if replica.name in removed:
            busy = [h.pod_name for h in replica.hosts if h.available != h.total]
            named = ", ".join(removed[replica.name])
            why = f"Ray terminated {named}; KubeRay deletes the whole replica"
            if busy:
                why += f", busy hosts included: {', '.join(busy)}"
            terminates.append(
                Terminate(
                    replica.group, replica.name, tuple(h.pod_name for h in replica.hosts), why
                )
            )
    infeasible = [
        Unmet(_request_text(r), "Ray: infeasible") for r in reply.infeasible_resource_requests
    ]
    infeasible += [
        Unmet(g.details or "placement group", "Ray: infeasible")
        for g in reply.infeasible_gang_resource_requests
    ]
    infeasible += [
        Unmet("request_resources", "Ray: infeasible")
        for _ in reply.infeasible_cluster_resource_constraints
    ]
    return Plan(tuple(launches), tuple(terminates), tuple(infeasible), ())


def _request_text(request: Any) -> str:
    resources = ", ".join(f"{k}: {v:g}" for k, v in sorted(request.resources_bundle.items()))
    return f"{{{resources}}}"
