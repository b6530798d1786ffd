"""Our policy as Ray 2.60's autoscaler v2 scheduler (`IResourceScheduler`): Ray's
`SchedulingRequest` in, translated into a `ClusterSnapshot`; `policy.plan` decides
in whole replicas; the plan goes back as a `SchedulingReply` in Ray's units (hosts
to launch, instances to terminate, Ray's own request messages that are infeasible).

Slice shapes come from the RayCluster when there is one, else from Ray's node type
configs (`node_types.py`). Replicas come from the pods when the cluster can be read;
otherwise from the instances themselves (`instances.py`)."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ray.autoscaler.v2.scheduler import IResourceScheduler, SchedulingReply
from ray.core.generated import autoscaler_pb2
from ray.core.generated.instance_manager_pb2 import LaunchRequest, TerminationRequest

from tpu_autoscaler.adapters.kube.pods import replicas_of
from tpu_autoscaler.adapters.ray import outdated
from tpu_autoscaler.adapters.ray.instances import (
    NOT_YET_LAUNCHED,
    host_name,
    instance_status,
    instance_type,
    is_head,
    is_running_ray,
    is_worker,
    replicas_from_instances,
    requested_as_replicas,
)
from tpu_autoscaler.adapters.ray.ippr_request import (
    queued_resizes,
    with_ippr_bounds,
    with_pod_sizes,
)
from tpu_autoscaler.adapters.ray.node_types import shape_from_node_type
from tpu_autoscaler.adapters.ray.provider_cluster import KubeCluster
from tpu_autoscaler.adapters.ray.settings import conserve_gpu_nodes_of_ray
from tpu_autoscaler.adapters.ray.state import RayNode, copy_infeasible, from_message
from tpu_autoscaler.core import policy
from tpu_autoscaler.core.plan import Plan, RemovalCause
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Host, PolicyConfig
from tpu_autoscaler.core.units import Hosts, Replicas
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

log = logging.getLogger(__name__)

KUBERAY_HEAD_GROUP = "headgroup"
"""The node type Ray's KubeRay config reader gives the head group."""

_CAUSES = {
    RemovalCause.IDLE: TerminationRequest.Cause.IDLE,
    RemovalCause.GANG_INCOMPLETE: TerminationRequest.Cause.IDLE,
    RemovalCause.MAX_REPLICAS: TerminationRequest.Cause.MAX_NUM_NODE_PER_TYPE,
    RemovalCause.MAX_WORKERS: TerminationRequest.Cause.MAX_NUM_NODES,
    RemovalCause.OUTDATED: TerminationRequest.Cause.OUTDATED,
}


@dataclass(frozen=True)
class Translation:
    """A request as the policy sees it, and the way back to Ray's instances."""

    snapshot: ClusterSnapshot
    instance_of_host: Mapping[str, Any]
    """Host (pod) name -> the `AutoscalerInstance` behind it."""
    message: Any
    """The `ClusterResourceState` the demand was read from (Ray's own messages)."""
    of_removed_types: tuple[Any, ...] = ()
    """Instances of node types configured no more (`outdated.py`): in no group."""
    ippr_statuses: Mapping[str, Any] = field(default_factory=dict)
    """Ray's `IPPRStatus` per pod, for the resizes of the reply (`to_ippr`)."""


class SliceScheduler(IResourceScheduler):  # type: ignore[misc]
    """`IResourceScheduler` backed by `policy.plan`: launches and terminations in
    whole replicas, a busy slice never removed, slice heads served by new slices."""

    def __init__(
        self,
        cluster: KubeCluster | None = None,
        raycluster: Mapping[str, Any] | None = None,
        config: PolicyConfig | None = None,
        clock: Callable[[], float] = time.time,
        head_node_type: str = KUBERAY_HEAD_GROUP,
    ) -> None:
        """`cluster`: read the RayCluster and its pods each round (shapes and
        replicas from them); else `raycluster` for shapes only; else neither.
        `head_node_type` is never launched (Ray's KubeRay config lists it with
        max_workers 1)."""
        self.cluster = cluster
        self.head_node_type = head_node_type
        self.raycluster = (
            parse_raycluster(dict(raycluster), "raycluster") if raycluster is not None else None
        )
        self.config = config or PolicyConfig()
        self.clock = clock
        self.last_plan: Plan | None = None
        """The policy's plan of the latest round, with its reasons, for logs and tests."""

    def schedule(self, request: Any) -> SchedulingReply:
        translation = self.translate(request)
        plan = policy.plan(translation.snapshot)
        self.last_plan = plan
        if plan.launch or plan.terminate:
            log.info("plan:\n%s", plan.render_text())
        return self.reply(plan, translation)

    # --- request -> snapshot -------------------------------------------------------------

    def translate(self, request: Any) -> Translation:
        now_s = self.clock()
        message = autoscaler_pb2.ClusterResourceState()
        message.pending_resource_requests.extend(request.resource_requests)
        message.pending_gang_resource_requests.extend(request.gang_resource_requests)
        message.cluster_resource_constraints.extend(request.cluster_resource_constraints)
        workers = [i for i in request.current_instances if is_worker(i)]
        running = [i for i in request.current_instances if is_running_ray(i)]
        for instance in {id(i): i for i in workers + running}.values():
            if instance.ray_node is not None:
                message.node_states.append(instance.ray_node)
        ray = from_message(message)
        nodes = {n.node_id: n for n in ray.nodes}

        state = self.cluster.read() if self.cluster is not None else None
        raycluster = state.cluster if state is not None else self.raycluster
        heads = Counter(instance_type(i) for i in request.current_instances if is_head(i))
        groups = {g.group_name for g in raycluster.spec.worker_group_specs} if raycluster else None
        derived = derive_shapes(raycluster) if raycluster else None
        shapes = self._shapes(request, derived, heads, {instance_type(i) for i in workers}, groups)
        shapes = with_ippr_bounds(shapes, request.ippr_specs)
        by_group = {s.group: s for s in shapes}
        gone = outdated.of_removed_types(request, workers)
        stale = outdated.outdated_hosts(request, workers)
        workers = [i for i in workers if instance_type(i) in by_group]
        instance_of_host = {host_name(i): i for i in workers}
        # Ray packs demand on every node running Ray, the head included, before it
        # launches: nodes that are no replica of a known group are capacity too.
        fixed = [
            _fixed_host(i, nodes)
            for i in running
            if (is_head(i) or instance_type(i) not in by_group) and i.ray_node is not None
        ]

        if state is not None and raycluster is not None:
            known = ClusterShapes(state.shapes.cluster, state.shapes.namespace, shapes, ())
            replicas = list(replicas_of(raycluster, known, state.pods, ray.node_for_pod(), now_s))
            queued = [i for i in workers if instance_status(i) in NOT_YET_LAUNCHED]
            replicas += requested_as_replicas(by_group, queued, {r.name for r in replicas}, now_s)
        else:
            replicas = replicas_from_instances(by_group, workers, nodes, now_s)
        replicas = [
            replace(r, outdated=True) if any(h.pod_name in stale for h in r.hosts) else r
            for r in replicas
        ]
        replicas = with_pod_sizes(replicas, by_group, request.ippr_statuses)
        config = replace(self.config, conserve_gpu_nodes=conserve_gpu_nodes_of_ray())
        # Ray counts the head among its max_num_nodes; the policy counts workers.
        max_workers = request.max_num_nodes
        snapshot = ClusterSnapshot(
            tuple(shapes),
            tuple(replicas),
            ray.demand,
            now_s,
            {},
            config,
            fixed_hosts=tuple(fixed),
            availability=dict(request.cloud_resource_availabilities),
            max_worker_hosts=(
                Hosts(max(0, max_workers - heads.total())) if max_workers is not None else None
            ),
        )
        statuses = dict(request.ippr_statuses or {})
        return Translation(snapshot, instance_of_host, message, tuple(gone), statuses)

    def _shapes(
        self,
        request: Any,
        derived: ClusterShapes | None,
        heads: Counter[str],
        worker_types: set[str],
        groups: set[str] | None,
    ) -> tuple[SliceShape, ...]:
        """The RayCluster's shapes, then shapes from node type configs for the
        worker types it leaves out (all of them when there is no RayCluster). As in
        Ray, a head counts toward its own type's max_worker_nodes; a type that may
        have no workers gets a shape only while it has some (they are removed)."""
        shapes = list(derived.shapes) if derived is not None else []
        covered = {s.group for s in shapes}
        # In Ray's order (the RayCluster's): the expander's last tie-break, as Ray's.
        for name, config in request.node_type_configs.items():
            if name in covered or (groups is not None and name not in groups):
                continue
            # The head type counts its head even before the head reports.
            head_count = heads[name] or (1 if name == self.head_node_type else 0)
            room = config.max_worker_nodes - head_count
            if room <= 0 and name not in worker_types:
                continue
            shape = shape_from_node_type(config, request.idle_timeout_s)
            if head_count:
                hosts = shape.hosts_per_replica
                shape = replace(shape, max_replicas=Replicas(max(0, room) // hosts))
            shapes.append(shape)
        for shape in shapes:
            for problem in shape.warnings:
                log.warning("%s", problem)
        return tuple(shapes)

    # --- plan -> reply -------------------------------------------------------------------

    def reply(self, plan: Plan, translation: Translation) -> SchedulingReply:
        snapshot = translation.snapshot
        now_ms = int(self.clock() * 1000)
        reply = SchedulingReply()
        for launch in plan.launch:
            shape = snapshot.shape(launch.group)
            assert shape is not None
            reply.to_launch.append(
                LaunchRequest(
                    instance_type=launch.group,
                    count=launch.replicas * shape.hosts_per_replica,
                    id=str(uuid.uuid4()),
                    request_ts_ms=now_ms,
                )
            )
        hosts = {h.pod_name: h for r in snapshot.replicas for h in r.hosts}
        for terminate in plan.terminate:
            cause = _CAUSES.get(terminate.cause, TerminationRequest.Cause.UNKNOWN)
            for pod in terminate.pods:
                instance = translation.instance_of_host.get(pod)
                if instance is None or instance.im_instance is None:
                    # Not (yet) an instance Ray manages: the provider removes its pod
                    # with the rest of the replica.
                    continue
                im = instance.im_instance
                host = hosts.get(pod)
                reply.to_terminate.append(
                    TerminationRequest(
                        id=str(uuid.uuid4()),
                        instance_id=im.instance_id,
                        ray_node_id=im.node_id or (host.node_id if host and host.node_id else ""),
                        cause=cause,
                        instance_type=im.instance_type,
                        instance_status=im.status,
                        idle_duration_ms=int(host.idle_s * 1000) if host else 0,
                        details=f"{terminate.group}/{terminate.replica}: {terminate.reason}",
                    )
                )
        reply.to_terminate.extend(outdated.termination(i) for i in translation.of_removed_types)
        reply.to_ippr.extend(queued_resizes(plan.resize, translation.ippr_statuses, hosts))
        copy_infeasible(translation.message, plan.infeasible_refs(), reply)
        return reply


def _fixed_host(instance: Any, nodes: Mapping[str, RayNode]) -> Host:
    """A node running Ray that is no replica's host (the head), as capacity."""
    node_id = instance.ray_node.node_id
    node = nodes[node_id.hex() if isinstance(node_id, bytes) else str(node_id)]
    return node.as_fixed_host(host_name(instance))
