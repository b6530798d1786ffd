"""What one replica of each worker group is: its hosts, their resources and labels.

`derive_shapes` turns a validated RayCluster into one `SliceShape` per worker group
and checks the rules that span fields, as the TPU webhook, KubeRay and Ray apply
them. A group with an error gets no shape, so callers can keep scaling the others;
every problem names the group and the manifest field, and says what would be valid.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler import catalog, labels
from tpu_autoscaler.catalog import CatalogError, SliceType
from tpu_autoscaler.raycluster import (
    Container,
    Quantity,
    RayCluster,
    UpscalingMode,
    WorkerGroupSpec,
)
from tpu_autoscaler.units import Chips, Hosts, Replicas

DEFAULT_IDLE_TIMEOUT_S = 60.0
"""KubeRay's default `autoscalerOptions.idleTimeoutSeconds`."""

STANDARD_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory"})

# Ray's node-label syntax (ray/_private/label_utils.py), which Ray enforces at start.
_LABEL_PART = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_LABEL_NAME = re.compile(_LABEL_PART)
_LABEL_PREFIX = re.compile(rf"({_LABEL_PART})?(\.({_LABEL_PART})?)*")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a manifest: where, in which group, and what would be valid."""

    path: str
    message: str
    group: str | None = None
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"worker group {self.group!r}: " if self.group is not None else ""
        return f"{self.severity}: {where}{self.path}: {self.message}"

    def to_json(self) -> dict[str, str | None]:
        return {
            "severity": self.severity,
            "group": self.group,
            "path": self.path,
            "message": self.message,
        }


class ManifestError(Exception):
    """Input that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class SliceShape:
    """One replica of a worker group: `hosts_per_replica` pods that live and die together."""

    group: str
    hosts_per_replica: Hosts
    min_replicas: Replicas
    max_replicas: Replicas
    idle_timeout_s: float
    upscaling_mode: UpscalingMode
    priority: int
    resources_per_host: Mapping[str, float]
    """Ray resources every host has: CPU, memory, TPU, GPU, custom, accelerator type."""
    group_labels: Mapping[str, str]
    """Ray labels every host has: the group's own, `ray.io/node-group`, the static TPU ones."""
    tpu: SliceType | None = None
    tpu_per_host: float = 0.0
    """The Ray `TPU` resource per host: chips, or devices with RAY_TPU_RESOURCE_PER_CHIP."""
    tpu_resource_per_chip: int = 1
    warnings: tuple[Problem, ...] = field(default=())

    @property
    def chips_per_host(self) -> Chips:
        return self.tpu.chips_per_host if self.tpu else Chips(0)

    @property
    def chips_per_replica(self) -> Chips:
        return Chips(self.chips_per_host * self.hosts_per_replica)

    @property
    def head_resource(self) -> str | None:
        return self.tpu.head_resource if self.tpu else None

    def host_labels(self, host_index: int, slice_name: str | None = None) -> dict[str, str]:
        """Labels of host `host_index` of a replica; the TPU ones as Ray derives them."""
        host = dict(self.group_labels)
        if self.tpu is not None:
            host.update(self.tpu.host_labels(host_index, slice_name))
        return host

    def host_resources(self, host_index: int, slice_name: str | None = None) -> dict[str, float]:
        """Resources of host `host_index`; the head resource on host 0 only."""
        resources = dict(self.resources_per_host)
        if self.tpu is not None:
            resources.update(self.tpu.host_extra_resources(host_index, slice_name))
        return resources


@dataclass(frozen=True, slots=True)
class ClusterShapes:
    """Every usable group of a RayCluster, and what is wrong with the others."""

    cluster: str
    namespace: str
    shapes: tuple[SliceShape, ...]
    problems: tuple[Problem, ...]

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


class _GroupProblems:
    """Collects the problems of one worker group with paths relative to it."""

    def __init__(self, index: int, group: str) -> None:
        self.prefix = f"spec.workerGroupSpecs[{index}]"
        self.group = group
        self.found: list[Problem] = []

    def error(self, field_path: str, message: str) -> None:
        self.found.append(Problem(f"{self.prefix}.{field_path}", message, self.group))

    def warn(self, field_path: str, message: str) -> None:
        self.found.append(Problem(f"{self.prefix}.{field_path}", message, self.group, "warning"))

    @property
    def has_errors(self) -> bool:
        return any(p.severity == "error" for p in self.found)


def derive_shapes(cluster: RayCluster) -> ClusterShapes:
    """One `SliceShape` per valid worker group, and every problem found."""
    problems: list[Problem] = []
    shapes: list[SliceShape] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(cluster.spec.worker_group_specs):
        found = _GroupProblems(index, spec.group_name)
        if spec.group_name in seen:
            found.error(
                "groupName",
                f"duplicates spec.workerGroupSpecs[{seen[spec.group_name]}]; "
                "every worker group needs a unique name",
            )
        seen.setdefault(spec.group_name, index)
        shape = _shape_of_group(cluster, spec, found)
        problems.extend(found.found)
        if shape is not None and not found.has_errors:
            shapes.append(shape)
    return ClusterShapes(
        cluster=cluster.metadata.name,
        namespace=cluster.metadata.namespace,
        shapes=tuple(shapes),
        problems=tuple(problems),
    )


def _shape_of_group(
    cluster: RayCluster, spec: WorkerGroupSpec, found: _GroupProblems
) -> SliceShape | None:
    if not spec.template.spec.containers:
        found.error("template.spec.containers", "a worker group needs at least one container")
        return None
    ray_container = spec.template.spec.containers[0]
    _check_replica_bounds(spec, found)
    _check_labels(spec, found)

    custom = _custom_resources(spec, found)
    tpu_container = next((c for c in spec.template.spec.containers if c.requests_tpu()), None)
    tpu: SliceType | None = None
    per_chip = 1
    tpu_per_host = 0.0
    hosts = Hosts(spec.num_of_hosts)
    if tpu_container is not None:
        per_chip = _resource_per_chip(spec, tpu_container, found)
        tpu = _slice_type(spec, tpu_container, found)
        if tpu is not None:
            if tpu.hosts != spec.num_of_hosts:
                found.error(
                    "numOfHosts",
                    f"is {spec.num_of_hosts}, but {tpu.generation.name} {tpu.topology} "
                    f"({tpu.chips} chips) on {tpu.chips_per_host}-chip pods has {tpu.hosts} "
                    f"host(s); set numOfHosts: {tpu.hosts}",
                )
            tpu_per_host = _tpu_resource(spec, tpu_container, custom, tpu, per_chip, found)
    elif any(k in spec.template.spec.node_selector for k in _TPU_SELECTORS):
        found.warn(
            "template.spec.nodeSelector",
            f"selects TPU nodes but no container requests {labels.GKE_TPU_RESOURCE}; "
            "the group is treated as CPU-only",
        )

    if spec.idle_timeout_seconds is not None and not _autoscaler_v2(cluster):
        found.error(
            "idleTimeoutSeconds",
            "needs spec.autoscalerOptions.version: v2; KubeRay refuses the whole RayCluster "
            "otherwise (InvalidRayClusterSpec) and creates no pods",
        )
    resources = _host_resources(spec, ray_container, custom, found)
    if found.has_errors:
        return None
    if tpu is not None:
        resources[labels.TPU_RESOURCE] = tpu_per_host
    group_labels = dict(spec.labels or {})
    group_labels[labels.RAY_NODE_GROUP] = spec.group_name
    if tpu is not None:
        group_labels.update(tpu.static_labels())

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
    )


_TPU_SELECTORS = (labels.GKE_TPU_ACCELERATOR_SELECTOR, labels.GKE_TPU_TOPOLOGY_SELECTOR)


def _check_replica_bounds(spec: WorkerGroupSpec, found: _GroupProblems) -> None:
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


def label_key_problem(key: str) -> str | None:
    """Why Ray would refuse `key` as a node label key, or None if it is fine."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _LABEL_PREFIX.fullmatch(prefix)):
        return f"prefix {prefix!r} is not a series of DNS labels separated by dots"
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return (
            f"name {name!r} is not 1-63 alphanumerics, '-', '_' or '.', "
            "starting and ending alphanumeric"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why Ray would refuse `value` as a node label value, or None if it is fine."""
    if value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
        return None
    return (
        f"value {value!r} is not at most 63 alphanumerics, '-', '_' or '.', "
        "starting and ending alphanumeric"
    )


def _check_labels(spec: WorkerGroupSpec, found: _GroupProblems) -> None:
    for key, value in (spec.labels or {}).items():
        if key.startswith(labels.RAY_RESERVED_LABEL_PREFIX):
            found.error(
                f"labels[{key}]",
                f"keys under {labels.RAY_RESERVED_LABEL_PREFIX} belong to Ray; use another prefix",
            )
        key_problem = label_key_problem(key)
        if key_problem:
            found.error(f"labels[{key}]", f"is not a valid label key: {key_problem}")
        value_problem = label_value_problem(value)
        if value_problem:
            found.error(f"labels[{key}]", f"is not a valid label value: {value_problem}")


def _slice_type(
    spec: WorkerGroupSpec, container: Container, found: _GroupProblems
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
    chips_per_host = _chips_requested(spec, container, found)
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
            _container_path(spec, container) + f".resources[{labels.GKE_TPU_RESOURCE}]", str(exc)
        )
        return None


def _container_path(spec: WorkerGroupSpec, container: Container) -> str:
    index = next(i for i, c in enumerate(spec.template.spec.containers) if c is container)
    return f"template.spec.containers[{index}]"


def _chips_requested(
    spec: WorkerGroupSpec, container: Container, found: _GroupProblems
) -> int | None:
    """The webhook's chips per host: the TPU limit, and the request if it is set."""
    path = _container_path(spec, container) + f".resources[{labels.GKE_TPU_RESOURCE}]"
    values: dict[str, Decimal] = {}
    for kind, table in (
        ("limits", container.resources.limits),
        ("requests", container.resources.requests),
    ):
        if labels.GKE_TPU_RESOURCE in table:
            parsed = _parse_quantity(table[labels.GKE_TPU_RESOURCE], path, found)
            if parsed is None:
                return None
            values[kind] = parsed
    if len(set(values.values())) > 1:
        found.error(
            path,
            f"limit {values['limits']} and request {values['requests']} differ; "
            "Kubernetes requires them equal for an extended resource",
        )
        return None
    chips = next(iter(values.values()))
    if chips != chips.to_integral_value() or chips <= 0:
        found.error(path, f"is {chips}; TPU chips are a positive whole number (1, 4 or 8)")
        return None
    return int(chips)


def _parse_quantity(value: Quantity, path: str, found: _GroupProblems) -> Decimal | None:
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, ArithmeticError):
        found.error(path, f"{value!r} is not a Kubernetes quantity (e.g. 4, 500m, 100Gi)")
        return None
    return parsed


def _resource_per_chip(spec: WorkerGroupSpec, container: Container, found: _GroupProblems) -> int:
    raw = container.env_value(labels.ENV_TPU_RESOURCE_PER_CHIP)
    if raw is None:
        return 1
    if not raw.isdecimal() or int(raw) < 1:
        found.error(
            _container_path(spec, container) + f".env[{labels.ENV_TPU_RESOURCE_PER_CHIP}]",
            f"is {raw!r}; Ray needs a positive integer (2 on TPU7x for one resource per device)",
        )
        return 1
    return int(raw)


def _tpu_resource(
    spec: WorkerGroupSpec,
    container: Container,
    custom: dict[str, float],
    tpu: SliceType,
    per_chip: int,
    found: _GroupProblems,
) -> float:
    """The `TPU` resource each host advertises: an explicit override wins (as in Ray),
    else the chips Ray detects. RAY_TPU_RESOURCE_PER_CHIP alone does not change it,
    which is why the seed sets both for TPU7x."""
    override = _explicit_tpu(spec, custom, found)
    chips = float(tpu.chips_per_host)
    devices = chips * per_chip
    if per_chip > tpu.generation.logical_devices_per_chip:
        found.warn(
            _container_path(spec, container) + f".env[{labels.ENV_TPU_RESOURCE_PER_CHIP}]",
            f"is {per_chip}, but a {tpu.generation.name} chip has "
            f"{tpu.generation.logical_devices_per_chip} device(s)",
        )
    if override is None:
        if per_chip > 1:
            found.warn(
                "rayStartParams.resources",
                f"{labels.ENV_TPU_RESOURCE_PER_CHIP}={per_chip} is set but TPU is not: Ray will "
                f"advertise TPU: {chips:g} per host while slice_placement_group asks for "
                f"{devices:g}; set resources TPU: {devices:g}",
            )
        return chips
    if override != devices:
        found.warn(
            "rayStartParams.resources",
            f"TPU: {override:g} per host, but {tpu.chips_per_host} chips x "
            f"{labels.ENV_TPU_RESOURCE_PER_CHIP}={per_chip} is {devices:g}; "
            "slice_placement_group will size its bundles by the latter",
        )
    return override


def _explicit_tpu(
    spec: WorkerGroupSpec, custom: dict[str, float], found: _GroupProblems
) -> float | None:
    if spec.resources and labels.TPU_RESOURCE in spec.resources:
        parsed = _parse_quantity(spec.resources[labels.TPU_RESOURCE], "resources[TPU]", found)
        return None if parsed is None else float(parsed)
    return custom.get(labels.TPU_RESOURCE)


def _custom_resources(spec: WorkerGroupSpec, found: _GroupProblems) -> dict[str, float]:
    """Custom Ray resources: the group `resources` field if set, else the
    rayStartParams `resources` JSON (KubeRay's escaped form `'"{\\"TPU\\": 8}"'`).
    `TPU` is included here when given; CPU, GPU and memory are not."""
    if spec.resources:
        custom: dict[str, float] = {}
        for key, value in spec.resources.items():
            if key in STANDARD_RESOURCES - {"TPU"}:
                continue
            parsed = _parse_quantity(value, f"resources[{key}]", found)
            if parsed is not None:
                custom[key] = float(parsed)
        if "resources" in spec.ray_start_params:
            found.warn(
                "rayStartParams.resources", "ignored: the group `resources` field takes precedence"
            )
        return custom
    raw = spec.ray_start_params.get("resources")
    if raw is None:
        return {}
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    try:
        loaded = json.loads(text.replace("\\", ""))
    except json.JSONDecodeError:
        loaded = None
    if not isinstance(loaded, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in loaded.values()
    ):
        found.error(
            "rayStartParams.resources",
            f'{raw!r} is not a JSON object of non-negative numbers, e.g. \'"{{\\"TPU\\": 8}}"\'',
        )
        return {}
    return {str(k): float(v) for k, v in loaded.items()}


def head_resources(cluster: RayCluster) -> dict[str, float]:
    """CPU, GPU and memory of the head node, read as a worker group's are
    (rayStartParams, then the first container's limits, then its requests); 1 CPU
    when none is given, as local mode starts the head."""
    head = cluster.spec.head_group_spec
    as_group = WorkerGroupSpec(
        group_name="headgroup", ray_start_params=head.ray_start_params, template=head.template
    )
    found = _GroupProblems(0, "headgroup")
    containers = head.template.spec.containers
    resources = _host_resources(as_group, containers[0], {}, found) if containers else {}
    resources.setdefault("CPU", 1.0)
    return resources


def _host_resources(
    spec: WorkerGroupSpec, container: Container, custom: dict[str, float], found: _GroupProblems
) -> dict[str, float]:
    """CPU, GPU and memory as Ray's KubeRay config reads them: the group `resources`
    field, then rayStartParams, then the container's limits, then its requests."""
    resources = {k: v for k, v in custom.items() if k != labels.TPU_RESOURCE}
    cpu = _standard_resource(spec, container, "CPU", "num-cpus", "cpu", found)
    if cpu is None:
        found.error(
            f"{_container_path(spec, container)}.resources.limits.cpu",
            "is missing, and so are rayStartParams num-cpus and resources CPU; "
            "the autoscaler needs the CPUs of each host",
        )
    else:
        resources["CPU"] = float(math.ceil(cpu))
    gpu = _standard_resource(spec, container, "GPU", "num-gpus", "nvidia.com/gpu", found)
    if gpu:
        resources["GPU"] = float(math.ceil(gpu))
    memory = _standard_resource(spec, container, "memory", "memory", "memory", found)
    if memory is not None:
        resources["memory"] = float(math.ceil(memory))
    return resources


def _standard_resource(
    spec: WorkerGroupSpec,
    container: Container,
    ray_name: str,
    start_param: str,
    k8s_name: str,
    found: _GroupProblems,
) -> Decimal | None:
    if spec.resources and ray_name in spec.resources:
        return _parse_quantity(spec.resources[ray_name], f"resources[{ray_name}]", found)
    if start_param in spec.ray_start_params:
        return _parse_quantity(
            spec.ray_start_params[start_param], f"rayStartParams.{start_param}", found
        )
    path = _container_path(spec, container)
    for kind, table in (
        ("limits", container.resources.limits),
        ("requests", container.resources.requests),
    ):
        if k8s_name in table:
            return _parse_quantity(table[k8s_name], f"{path}.resources.{kind}.{k8s_name}", found)
    return None


def _autoscaler_v2(cluster: RayCluster) -> bool:
    """KubeRay's `IsAutoscalingV2Enabled`: autoscalerOptions.version v2, or the head's
    RAY_enable_autoscaler_v2 environment variable (older clusters)."""
    if cluster.spec.autoscaler_options.version == "v2":
        return True
    head = cluster.spec.head_group_spec.template.spec.containers
    value = head[0].env_value("RAY_enable_autoscaler_v2") if head else None
    return value in ("1", "true")
