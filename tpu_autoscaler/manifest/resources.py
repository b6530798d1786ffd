"""How many TPU chips does a host of a group have, and what `TPU` resource does it
advertise? The webhook's chip request (limit and request equal), Ray's
RAY_TPU_RESOURCE_PER_CHIP and the `TPU` written in `resources` or rayStartParams.
The other resources of a node are Ray's reading, in `manifest/ray_resources.py`."""

from __future__ import annotations

from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.core.units import TpuResource
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import Container, Quantity, WorkerGroupSpec


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
    override: float | None,
    tpu: SliceType,
    per_chip: int,
    found: GroupProblems,
) -> TpuResource:
    """The `TPU` resource each host advertises: the one written in `resources` or
    rayStartParams wins (as in Ray), else the chips Ray detects. RAY_TPU_RESOURCE_PER_CHIP
    alone does not change it, which is why the seed sets both for TPU7x."""
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
