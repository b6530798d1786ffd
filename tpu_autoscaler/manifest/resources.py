"""The Ray resources of a group's hosts and of the head, as KubeRay and Ray derive
them from container requests and limits, `rayStartParams` and the TPU request, with
every Kubernetes quantity notation."""

from __future__ import annotations

import json
import math
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.core.units import TpuResource
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import Container, Quantity, RayCluster, WorkerGroupSpec

STANDARD_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory"})


def container_path(spec: WorkerGroupSpec, container: Container) -> str:
    index = next(i for i, c in enumerate(spec.template.spec.containers) if c is container)
    return f"template.spec.containers[{index}]"


def chips_requested(
    spec: WorkerGroupSpec, container: Container, found: GroupProblems
) -> int | None:
    """The webhook's chips per host: the TPU limit, and the request if it is set."""
    path = container_path(spec, container) + f".resources[{labels.GKE_TPU_RESOURCE}]"
    values: dict[str, Decimal] = {}
    for kind, table in (
        ("limits", container.resources.limits),
        ("requests", container.resources.requests),
    ):
        if labels.GKE_TPU_RESOURCE in table:
            parsed = parse_quantity_at(table[labels.GKE_TPU_RESOURCE], path, found)
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


def parse_quantity_at(value: Quantity, path: str, found: GroupProblems) -> Decimal | None:
    try:
        parsed: Decimal = parse_quantity(value)
    except (ValueError, ArithmeticError):
        found.error(path, f"{value!r} is not a Kubernetes quantity (e.g. 4, 500m, 100Gi)")
        return None
    return parsed


def resource_per_chip(spec: WorkerGroupSpec, container: Container, found: GroupProblems) -> int:
    raw = container.env_value(labels.ENV_TPU_RESOURCE_PER_CHIP)
    if raw is None:
        return 1
    if not raw.isdecimal() or int(raw) < 1:
        found.error(
            container_path(spec, container) + f".env[{labels.ENV_TPU_RESOURCE_PER_CHIP}]",
            f"is {raw!r}; Ray needs a positive integer (2 on TPU7x for one resource per device)",
        )
        return 1
    return int(raw)


def tpu_resource(
    spec: WorkerGroupSpec,
    container: Container,
    custom: dict[str, float],
    tpu: SliceType,
    per_chip: int,
    found: GroupProblems,
) -> TpuResource:
    """The `TPU` resource each host advertises: an explicit override wins (as in Ray),
    else the chips Ray detects. RAY_TPU_RESOURCE_PER_CHIP alone does not change it,
    which is why the seed sets both for TPU7x."""
    override = _explicit_tpu(spec, custom, found)
    chips = float(tpu.chips_per_host)
    devices = chips * per_chip
    if per_chip > tpu.generation.logical_devices_per_chip:
        found.warn(
            container_path(spec, container) + f".env[{labels.ENV_TPU_RESOURCE_PER_CHIP}]",
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
        return TpuResource(chips)  # Ray detects one TPU per chip
    if override != devices:
        found.warn(
            "rayStartParams.resources",
            f"TPU: {override:g} per host, but {tpu.chips_per_host} chips x "
            f"{labels.ENV_TPU_RESOURCE_PER_CHIP}={per_chip} is {devices:g}; "
            "slice_placement_group will size its bundles by the latter",
        )
    return TpuResource(override)


def _explicit_tpu(
    spec: WorkerGroupSpec, custom: dict[str, float], found: GroupProblems
) -> float | None:
    if spec.resources and labels.TPU_RESOURCE in spec.resources:
        parsed = parse_quantity_at(spec.resources[labels.TPU_RESOURCE], "resources[TPU]", found)
        return None if parsed is None else float(parsed)
    return custom.get(labels.TPU_RESOURCE)


def custom_resources(spec: WorkerGroupSpec, found: GroupProblems) -> dict[str, float]:
    """Custom Ray resources: the group `resources` field if set, else the
    rayStartParams `resources` JSON (KubeRay's escaped form `'"{\\"TPU\\": 8}"'`).
    `TPU` is included here when given; CPU, GPU and memory are not."""
    if spec.resources:
        custom: dict[str, float] = {}
        for key, value in spec.resources.items():
            if key in STANDARD_RESOURCES - {"TPU"}:
                continue
            parsed = parse_quantity_at(value, f"resources[{key}]", found)
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
    found = GroupProblems(0, "headgroup")
    containers = head.template.spec.containers
    resources = host_resources(as_group, containers[0], {}, found) if containers else {}
    resources.setdefault("CPU", 1.0)
    return resources


def host_resources(
    spec: WorkerGroupSpec, container: Container, custom: dict[str, float], found: GroupProblems
) -> dict[str, float]:
    """CPU, GPU and memory as Ray's KubeRay config reads them: the group `resources`
    field, then rayStartParams, then the container's limits, then its requests."""
    resources = {k: v for k, v in custom.items() if k != labels.TPU_RESOURCE}
    cpu = _standard_resource(spec, container, "CPU", "num-cpus", "cpu", found)
    if cpu is None:
        found.error(
            f"{container_path(spec, container)}.resources.limits.cpu",
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
    found: GroupProblems,
) -> Decimal | None:
    if spec.resources and ray_name in spec.resources:
        return parse_quantity_at(spec.resources[ray_name], f"resources[{ray_name}]", found)
    if start_param in spec.ray_start_params:
        return parse_quantity_at(
            spec.ray_start_params[start_param], f"rayStartParams.{start_param}", found
        )
    path = container_path(spec, container)
    for kind, table in (
        ("limits", container.resources.limits),
        ("requests", container.resources.requests),
    ):
        if k8s_name in table:
            return parse_quantity_at(table[k8s_name], f"{path}.resources.{kind}.{k8s_name}", found)
    return None
