"""What one replica of each worker group is: its hosts, their resources and labels.

`derive_shapes` turns a validated RayCluster into one `SliceShape` per worker group
and checks the rules that span fields, as the TPU webhook, KubeRay and Ray apply
them. A group with an error gets no shape, so callers can keep scaling the others;
every problem names the group and the manifest field, and says what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.catalog import CatalogError, SliceType
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Hosts, Replicas, TpuResource
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.head import HeadNode, read_head
from tpu_autoscaler.manifest.ippr import read_annotation, resize_bounds, unknown_groups
from tpu_autoscaler.manifest.model import Container, RayCluster, WorkerGroupSpec
from tpu_autoscaler.manifest.node_labels import check_labels, node_labels
from tpu_autoscaler.manifest.ray_resources import ray_node_resources
from tpu_autoscaler.manifest.resources import (
    chips_requested,
    container_path,
    resource_per_chip,
    tpu_resource,
)
from tpu_autoscaler.manifest.scarcity import read_scarcity

DEFAULT_IDLE_TIMEOUT_S = 60.0
"""KubeRay's default `autoscalerOptions.idleTimeoutSeconds`."""


@dataclass(frozen=True, slots=True)
class ClusterShapes:
    """Every usable group of a RayCluster, and what is wrong with the others."""

    cluster: str
    namespace: str
    shapes: tuple[SliceShape, ...]
    problems: tuple[Problem, ...]
    head: HeadNode | None = None
    """The head node as Ray's autoscaler sees it (its problems are in `problems`)."""

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")

    def shape(self, group: str) -> SliceShape | None:
        return next((s for s in self.shapes if s.group == group), None)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise ManifestError(list(self.errors))


def derive_shapes(cluster: RayCluster) -> ClusterShapes:
    """One `SliceShape` per valid worker group, and every problem found."""
    head = read_head(cluster)
    problems: list[Problem] = list(head.problems)
    resizable, bad_annotation = read_annotation(cluster)
    problems += bad_annotation + unknown_groups(cluster, resizable)
    shapes: list[SliceShape] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(cluster.spec.worker_group_specs):
        found = GroupProblems(index, spec.group_name)
        if spec.group_name in seen:
            found.error(
                "groupName",
                f"duplicates spec.workerGroupSpecs[{seen[spec.group_name]}]; "
                "every worker group needs a unique name",
            )
        seen.setdefault(spec.group_name, index)
        shape = _shape_of_group(cluster, spec, found, resizable.get(spec.group_name))
        problems.extend(found.found)
        if shape is not None and not found.has_errors:
            shapes.append(shape)
    return ClusterShapes(
        cluster=cluster.metadata.name,
        namespace=cluster.metadata.namespace,
        shapes=tuple(shapes),
        problems=tuple(problems),
        head=head,
    )


def _shape_of_group(
    cluster: RayCluster, spec: WorkerGroupSpec, found: GroupProblems, ippr: object = None
) -> SliceShape | None:
    if not spec.template.spec.containers:
        found.error("template.spec.containers", "a worker group needs at least one container")
        return None
    ray_container = spec.template.spec.containers[0]
    _check_replica_bounds(spec, found)
    check_labels(spec.labels, spec.ray_start_params, spec.group_name, found)
    read = ray_node_resources(
        spec.resources,
        spec.ray_start_params,
        ray_container,
        container_path(spec, ray_container),
        found,
    )
    resources = read.resources
    tpu_container = next((c for c in spec.template.spec.containers if c.requests_tpu()), None)
    tpu: SliceType | None = None
    per_chip = 1
    tpu_per_host = TpuResource(0.0)
    hosts = Hosts(spec.num_of_hosts)
    if tpu_container is not None:
        per_chip = resource_per_chip(spec, tpu_container, found)
        tpu = _slice_type(spec, tpu_container, found)
        if tpu is not None:
            if tpu.hosts != spec.num_of_hosts:
                found.error(
                    "numOfHosts",
                    f"is {spec.num_of_hosts}, but {tpu.generation.name} {tpu.topology} "
                    f"({tpu.chips} chips) on {tpu.chips_per_host}-chip pods has {tpu.hosts} "
                    f"host(s); set numOfHosts: {tpu.hosts}",
                )
            written = resources.get(labels.TPU_RESOURCE) if read.tpu_written else None
            tpu_per_host = tpu_resource(spec, tpu_container, written, tpu, per_chip, found)
    elif any(k in spec.template.spec.node_selector for k in _TPU_SELECTORS):
        found.warn(
            "template.spec.nodeSelector",
            f"selects TPU nodes but no container requests {labels.GKE_TPU_RESOURCE}; "
            "the group is treated as CPU-only",
        )

    _check_priority(cluster, spec, found)
    if spec.idle_timeout_seconds is not None and not _autoscaler_v2(cluster):
        found.error(
            "idleTimeoutSeconds",
            "needs spec.autoscalerOptions.version: v2; KubeRay refuses the whole RayCluster "
            "otherwise (InvalidRayClusterSpec) and creates no pods",
        )
    if tpu is not None:
        resources[labels.TPU_RESOURCE] = tpu_per_host
    derived = {labels.RAY_NODE_GROUP: spec.group_name}
    if tpu is not None:
        derived.update(tpu.static_labels())
    group_labels = node_labels(spec.labels, derived, found)
    scarcity = read_scarcity(spec, found)
    resize = resize_bounds(spec, ippr, tpu_container is not None, found)
    if found.has_errors:
        return None

    options = cluster.spec.autoscaler_options
    idle_timeout_s = (
        spec.idle_timeout_seconds
        if spec.idle_timeout_seconds is not None
        else options.idle_timeout_seconds
        if options.idle_timeout_seconds is not None
        else DEFAULT_IDLE_TIMEOUT_S
    )
    return SliceShape(
        group=spec.group_name,
        hosts_per_replica=hosts,
        min_replicas=Replicas(spec.min_replicas),
        max_replicas=Replicas(spec.max_replicas),
        idle_timeout_s=float(idle_timeout_s),
        upscaling_mode=options.upscaling_mode or "Default",
        priority=spec.priority or 0,
        resources_per_host=resources,
        group_labels=group_labels,
        tpu=tpu,
        tpu_per_host=tpu_per_host,
        tpu_resource_per_chip=per_chip,
        warnings=tuple(p for p in found.found if p.severity == "warning"),
        scarcity=scarcity,
        resize=resize,
    )


_TPU_SELECTORS = (labels.GKE_TPU_ACCELERATOR_SELECTOR, labels.GKE_TPU_TOPOLOGY_SELECTOR)


def _check_replica_bounds(spec: WorkerGroupSpec, found: GroupProblems) -> None:
    if spec.min_replicas > spec.max_replicas:
        found.error(
            "minReplicas",
            f"is {spec.min_replicas}, above maxReplicas {spec.max_replicas}; "
            f"minReplicas must be at most {spec.max_replicas}",
        )
    elif spec.replicas is not None and not spec.min_replicas <= spec.replicas <= spec.max_replicas:
        found.warn(
            "replicas",
            f"is {spec.replicas}, outside [{spec.min_replicas}, {spec.max_replicas}]; "
            "KubeRay clamps it and the autoscaler will move it inside",
        )


def _slice_type(
    spec: WorkerGroupSpec, container: Container, found: GroupProblems
) -> SliceType | None:
    selector = spec.template.spec.node_selector
    accelerator = selector.get(labels.GKE_TPU_ACCELERATOR_SELECTOR)
    topology = selector.get(labels.GKE_TPU_TOPOLOGY_SELECTOR)
    path = "template.spec.nodeSelector"
    if accelerator is None:
        found.error(
            f"{path}[{labels.GKE_TPU_ACCELERATOR_SELECTOR}]",
            "is missing; a TPU group must select its accelerator, one of "
            + ", ".join(catalog.gke_accelerator_values()),
        )
    if topology is None:
        found.error(
            f"{path}[{labels.GKE_TPU_TOPOLOGY_SELECTOR}]",
            "is missing; a TPU group must select its topology (e.g. 4x4 or 2x2x2)",
        )
    chips_per_host = chips_requested(spec, container, found)
    generation = (
        None if accelerator is None else catalog.generation_for_gke_accelerator(accelerator)
    )
    if accelerator is not None and generation is None:
        found.error(
            f"{path}[{labels.GKE_TPU_ACCELERATOR_SELECTOR}]",
            f"{accelerator!r} is not a TPU accelerator; valid: "
            + ", ".join(catalog.gke_accelerator_values()),
        )
    if generation is None or topology is None:
        return None
    try:
        catalog.require_topology(generation, topology)
    except CatalogError as exc:
        found.error(f"{path}[{labels.GKE_TPU_TOPOLOGY_SELECTOR}]", str(exc))
        return None
    if chips_per_host is None:
        return None
    try:
        return catalog.slice_type(generation, topology, chips_per_host)
    except CatalogError as exc:
        found.error(
            container_path(spec, container) + f".resources[{labels.GKE_TPU_RESOURCE}]", str(exc)
        )
        return None


PRIORITY_MIN_RAY_VERSION = (2, 56, 0)
"""The Ray version KubeRay v1.7 requires for a group `priority` (`validateWorkerGroupPriority`)."""

_GENERIC_VERSION = re.compile(r"v?(\d+(?:\.\d+)+)")


def _check_priority(cluster: RayCluster, spec: WorkerGroupSpec, found: GroupProblems) -> None:
    """KubeRay refuses the RayCluster for a non-zero priority without Ray >= 2.56 and v2."""
    if not spec.priority:
        return
    refuses = "KubeRay refuses the RayCluster: priority is set, but "
    version = cluster.spec.ray_version or ""
    match = _GENERIC_VERSION.match(version.strip())
    if not version:
        found.error("priority", refuses + "spec.rayVersion is not; Ray 2.56.0 or later is required")
    elif match is None:
        found.error("priority", refuses + f"spec.rayVersion {version!r} is not a version")
    elif tuple(int(p) for p in match.group(1).split(".")) < PRIORITY_MIN_RAY_VERSION:
        found.error("priority", refuses + f"spec.rayVersion is {version}; the minimum is 2.56.0")
    elif not _autoscaler_v2(cluster):
        found.error(
            "priority",
            refuses + "autoscaler v2 is not enabled (spec.autoscalerOptions.version: v2)",
        )


def _autoscaler_v2(cluster: RayCluster) -> bool:
    """KubeRay's `IsAutoscalingV2Enabled`: autoscalerOptions.version v2, or the head's
    RAY_enable_autoscaler_v2 environment variable (older clusters)."""
    if cluster.spec.autoscaler_options.version == "v2":
        return True
    head = cluster.spec.head_group_spec.template.spec.containers
    value = head[0].env_value("RAY_enable_autoscaler_v2") if head else None
    return value in ("1", "true")
