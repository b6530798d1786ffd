"""Our policy as Ray 2.60's autoscaler v2 scheduler (`IResourceScheduler`): Ray's
`SchedulingRequest` in, translated into a `ClusterSnapshot`; `policy.plan` decides
in whole replicas; the plan goes back as a `SchedulingReply` in Ray's units (hosts
to launch, instances to terminate, Ray's own request messages that are infeasible).

Slice shapes come from the RayCluster when there is one, else from Ray's node type
configs: the `TPU-{pod_type}-head` resource (which Ray's KubeRay config reader puts
on every host) or the `ray.io/tpu-*` labels name the slice, and the `TPU` resource
per host says how many hosts it has. Replicas come from the pods when the cluster
can be read; otherwise from the instances themselves: running hosts by their
`ray.io/tpu-slice-name` label, hosts not yet running Ray as whole requested replicas
(which the policy neither counts short nor removes)."""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ray.autoscaler.v2.instance_manager.common import InstanceUtil
from ray.autoscaler.v2.scheduler import IResourceScheduler, SchedulingReply
from ray.core.generated import autoscaler_pb2
from ray.core.generated.instance_manager_pb2 import (
    Instance,
    LaunchRequest,
    NodeKind,
    TerminationRequest,
)

from tpu_autoscaler.adapters.kube.pods import replicas_of
from tpu_autoscaler.adapters.ray.provider_cluster import KubeCluster
from tpu_autoscaler.adapters.ray.state import RayNode, copy_infeasible, from_message
from tpu_autoscaler.core import catalog, labels, policy
from tpu_autoscaler.core.catalog import CatalogError, SliceType
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.problems import Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    Host,
    PolicyConfig,
    Replica,
    ReplicaState,
    requested_replicas,
)
from tpu_autoscaler.core.units import Hosts, Replicas
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

log = logging.getLogger(__name__)

KUBERAY_HEAD_GROUP = "headgroup"
"""The node type Ray's KubeRay config reader gives the head group."""
_HEAD_RESOURCE = re.compile(r"^TPU-(?P<pod_type>.+)-head$")
_STOPPING = frozenset({Instance.RAY_STOP_REQUESTED})
_NOT_YET_LAUNCHED = frozenset({Instance.QUEUED})


# --- shapes from Ray's node type configs ------------------------------------------------


def shape_from_node_type(config: Any, idle_timeout_s: float | None) -> SliceShape:
    """The slice shape a Ray `NodeTypeConfig` describes. Its counts are hosts
    (`min_worker_nodes = minReplicas x numOfHosts`); the shape's are replicas."""
    resources = {str(k): float(v) for k, v in config.resources.items()}
    node_labels = {str(k): str(v) for k, v in config.labels.items()}
    warnings: list[Problem] = []
    tpu = slice_type_of(resources, node_labels, warnings, config.name)
    per_chip = 1
    tpu_per_host = 0.0
    group_labels = dict(node_labels)
    group_labels[labels.RAY_NODE_GROUP] = config.name
    if tpu is not None:
        tpu_per_host = resources.get(labels.TPU_RESOURCE, float(tpu.chips_per_host))
        per_chip = max(1, round(tpu_per_host / tpu.chips_per_host))
        resources[labels.TPU_RESOURCE] = tpu_per_host
        # Ray adds these per host (the head on worker 0 only); the shape adds them back.
        for key in list(resources):
            if _HEAD_RESOURCE.match(key) or key.startswith(labels.ACCELERATOR_TYPE_RESOURCE_PREFIX):
                del resources[key]
        group_labels.update(tpu.static_labels())
    hosts = tpu.hosts if tpu is not None else 1
    timeout = config.idle_timeout_s if config.idle_timeout_s is not None else idle_timeout_s
    return SliceShape(
        group=config.name,
        hosts_per_replica=Hosts(hosts),
        min_replicas=Replicas(math.ceil(config.min_worker_nodes / hosts)),
        max_replicas=Replicas(config.max_worker_nodes // hosts),
        # Ray's v2 scheduler terminates nothing for idleness without a timeout.
        idle_timeout_s=float(timeout) if timeout is not None else math.inf,
        upscaling_mode="Default",
        priority=int(config.priority or 0),
        resources_per_host=resources,
        group_labels=group_labels,
        tpu=tpu,
        tpu_per_host=tpu_per_host,
        tpu_resource_per_chip=per_chip,
        warnings=tuple(warnings),
    )


def slice_type_of(
    resources: Mapping[str, float],
    node_labels: Mapping[str, str],
    warnings: list[Problem] | None = None,
    group: str | None = None,
) -> SliceType | None:
    """The TPU slice a node type's resources and labels describe, or None (not TPU).
    The pod type comes from `TPU-{pod_type}-head` or `ray.io/tpu-pod-type`, the
    topology from `ray.io/tpu-topology` (else the squarest one of that many chips),
    the chips per host from the `TPU` resource."""
    pod_type = node_labels.get(labels.RAY_TPU_POD_TYPE)
    for key in resources:
        match = _HEAD_RESOURCE.match(key)
        if match:
            pod_type = match.group("pod_type")
    topology = node_labels.get(labels.RAY_TPU_TOPOLOGY)
    spelling = pod_type or node_labels.get(labels.RAY_ACCELERATOR_TYPE)
    generation = catalog.find_generation(spelling) if spelling else None
    if generation is None:
        return None
    try:
        if topology is None:
            if pod_type is None or not pod_type.rsplit("-", 1)[-1].isdecimal():
                return None
            chips = int(pod_type.rsplit("-", 1)[-1]) // generation.tensorcores_per_chip
            candidates = [t for t in generation.sorted_topologies() if _chips(t) == chips]
            if not candidates:
                return None
            topology = min(candidates, key=lambda t: (_aspect(t), t))
            if len(candidates) > 1 and warnings is not None:
                warnings.append(
                    Problem(
                        "labels",
                        f"{pod_type} may be any of {', '.join(candidates)}; assuming "
                        f"{topology}; set {labels.RAY_TPU_TOPOLOGY} to say",
                        group,
                        "warning",
                    )
                )
        options = generation.valid_chips_per_host(topology)
        tpu = resources.get(labels.TPU_RESOURCE)
        chips_per_host = generation.default_chips_per_host(topology)
        if tpu is not None:
            fits = [
                c
                for per_chip in sorted({1, generation.logical_devices_per_chip})
                for c in options
                if math.isclose(c * per_chip, tpu)
            ]
            if fits:
                chips_per_host = fits[0]
        return catalog.slice_type(generation, topology, chips_per_host)
    except CatalogError:
        return None


def _chips(topology: str) -> int:
    return int(catalog.chips_in_topology(topology))


def _aspect(topology: str) -> float:
    dims = [int(d) for d in topology.split("x")]
    return max(dims) / min(dims)


# --- the scheduler ----------------------------------------------------------------------


@dataclass(frozen=True)
class Translation:
    """A request as the policy sees it, and the way back to Ray's instances."""

    snapshot: ClusterSnapshot
    instance_of_host: Mapping[str, Any]
    """Host (pod) name -> the `AutoscalerInstance` behind it."""
    message: Any
    """The `ClusterResourceState` the demand was read from (Ray's own messages)."""


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
        workers = [i for i in request.current_instances if _is_worker(i)]
        for instance in workers:
            if instance.ray_node is not None:
                message.node_states.append(instance.ray_node)
        ray = from_message(message)
        nodes = {n.node_id: n for n in ray.nodes}

        state = self.cluster.read() if self.cluster is not None else None
        raycluster = state.cluster if state is not None else self.raycluster
        heads = {_instance_type(i) for i in request.current_instances if _is_head(i)}
        groups = {g.group_name for g in raycluster.spec.worker_group_specs} if raycluster else None
        derived = derive_shapes(raycluster) if raycluster else None
        shapes = self._shapes(request, derived, heads | {self.head_node_type}, groups)
        by_group = {s.group: s for s in shapes}
        workers = [i for i in workers if _instance_type(i) in by_group]
        instance_of_host = {_host_name(i): i for i in workers}

        if state is not None and raycluster is not None:
            known = ClusterShapes(state.shapes.cluster, state.shapes.namespace, shapes, ())
            replicas = list(replicas_of(raycluster, known, state.pods, ray.node_for_pod(), now_s))
            queued = [i for i in workers if _status(i) in _NOT_YET_LAUNCHED]
            replicas += _requested(by_group, queued, {r.name for r in replicas}, now_s)
        else:
            replicas = _replicas_from_instances(by_group, workers, nodes, now_s)
        snapshot = ClusterSnapshot(
            tuple(shapes), tuple(replicas), ray.demand, now_s, {}, self.config
        )
        return Translation(snapshot, instance_of_host, message)

    def _shapes(
        self,
        request: Any,
        derived: ClusterShapes | None,
        heads: set[str],
        groups: set[str] | None,
    ) -> tuple[SliceShape, ...]:
        """The RayCluster's shapes, then shapes from node type configs for the
        worker types it leaves out (all of them when there is no RayCluster)."""
        shapes = list(derived.shapes) if derived is not None else []
        covered = {s.group for s in shapes}
        for name, config in sorted(request.node_type_configs.items()):
            if name in covered or name in heads or config.max_worker_nodes <= 0:
                continue
            if groups is not None and name not in groups:
                continue
            shapes.append(shape_from_node_type(config, request.idle_timeout_s))
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
            cause = (
                TerminationRequest.Cause.IDLE
                if terminate.idle
                else TerminationRequest.Cause.UNKNOWN
            )
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
        copy_infeasible(translation.message, (r for u in plan.infeasible for r in u.refs), reply)
        return reply


# --- instances -> replicas ----------------------------------------------------------------


def _is_head(instance: Any) -> bool:
    return instance.im_instance is not None and instance.im_instance.node_kind == NodeKind.HEAD


def _is_worker(instance: Any) -> bool:
    im = instance.im_instance
    if im is None:
        return False  # not managed by Ray's instance manager: Ray skips it too
    return bool(im.node_kind != NodeKind.HEAD and InstanceUtil.is_ray_running_reachable(im.status))


def _instance_type(instance: Any) -> str:
    return str(instance.im_instance.instance_type)


def _status(instance: Any) -> int:
    return int(instance.im_instance.status)


def _host_name(instance: Any) -> str:
    """The pod name once there is one; the instance manager's id before that."""
    return str(instance.cloud_instance_id or instance.im_instance.cloud_instance_id) or (
        f"instance:{instance.im_instance.instance_id}"
    )


def _requested(
    shapes: Mapping[str, SliceShape], instances: Iterable[Any], taken: set[str], now_s: float
) -> list[Replica]:
    """Hosts asked for and not yet tied to a slice, as whole requested replicas."""
    hosts: dict[str, int] = defaultdict(int)
    for instance in instances:
        hosts[_instance_type(instance)] += 1
    replicas = []
    for group, count in sorted(hosts.items()):
        added = requested_replicas(
            group, math.ceil(count / shapes[group].hosts_per_replica), taken, now_s
        )
        taken |= {r.name for r in added}
        replicas += added
    return replicas


def _replicas_from_instances(
    shapes: Mapping[str, SliceShape],
    instances: list[Any],
    nodes: Mapping[str, RayNode],
    now_s: float,
) -> list[Replica]:
    """Replicas from Ray's instances alone: a running host names its slice
    (`ray.io/tpu-slice-name`); the others cannot be tied to one yet."""
    by_slice: dict[tuple[str, str], list[tuple[Any, RayNode]]] = defaultdict(list)
    untied: list[Any] = []
    replicas: list[Replica] = []
    for instance in instances:
        shape = shapes[_instance_type(instance)]
        node = _node_of(instance, nodes)
        if node is None:
            untied.append(instance)
        elif shape.hosts_per_replica == 1:
            name = node.labels.get(labels.RAY_TPU_SLICE_NAME) or _host_name(instance)
            replicas.append(_replica(shape, name, [(instance, node)], now_s))
        else:
            slice_name = node.labels.get(labels.RAY_TPU_SLICE_NAME)
            if slice_name is None:
                untied.append(instance)
            else:
                by_slice[(shape.group, slice_name)].append((instance, node))
    missing: dict[str, int] = defaultdict(int)
    for (group, slice_name), members in sorted(by_slice.items()):
        replica = _replica(shapes[group], slice_name, members, now_s)
        replicas.append(replica)
        missing[group] += max(0, shapes[group].hosts_per_replica - len(members))
    # Hosts not running Ray yet most likely complete the partial slices above; the
    # rest are whole replicas on their way.
    leftover: list[Any] = []
    for instance in untied:
        group = _instance_type(instance)
        if missing[group] > 0:
            missing[group] -= 1
        else:
            leftover.append(instance)
    replicas += _requested(shapes, leftover, {r.name for r in replicas}, now_s)
    return replicas


def _node_of(instance: Any, nodes: Mapping[str, RayNode]) -> RayNode | None:
    if instance.ray_node is None:
        return None
    node_id = instance.ray_node.node_id
    key = node_id.hex() if isinstance(node_id, bytes) else str(node_id)
    return nodes.get(key)


def _replica(
    shape: SliceShape, name: str, members: list[tuple[Any, RayNode]], now_s: float
) -> Replica:
    hosts = []
    for fallback, (instance, node) in enumerate(members):
        worker_id = node.labels.get(labels.RAY_TPU_WORKER_ID, "")
        hosts.append(
            Host(
                pod_name=_host_name(instance),
                host_index=int(worker_id) if worker_id.isdecimal() else fallback,
                node_id=node.node_id,
                labels=node.labels,
                total=node.total,
                available=node.available,
                idle_s=node.idle_s,
                dead=node.dead,
            )
        )
    hosts.sort(key=lambda h: h.host_index)
    complete = len(hosts) == shape.hosts_per_replica
    if any(_status(i) in _STOPPING for i, _ in members):
        state = ReplicaState.DRAINING
    elif complete and all(h.registered for h in hosts):
        state = ReplicaState.RUNNING
    else:
        state = ReplicaState.PENDING
    return Replica(
        group=shape.group,
        name=name,
        state=state,
        hosts=tuple(hosts),
        created_at_s=now_s,
        slice_name=next(
            (
                h.labels[labels.RAY_TPU_SLICE_NAME]
                for h in hosts
                if labels.RAY_TPU_SLICE_NAME in h.labels
            ),
            None,
        ),
        # Without pods, which hosts not running Ray belong to a partial slice is a
        # guess: such a slice is never removed here (KubeRay removes broken replicas).
        identified=complete,
    )
