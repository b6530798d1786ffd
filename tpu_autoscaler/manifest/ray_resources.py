"""What Ray resources does a node of a group (or the head) have, as Ray 2.60's KubeRay
autoscaler config reads them (`_get_ray_resources_from_group_spec` in
ray/autoscaler/_private/kuberay/autoscaling_config.py)?

Per resource, the first place that has it wins: the group's top-level `resources`
(KubeRay >= 1.4, quantities rounded up), then `rayStartParams` (`num-cpus`, `num-gpus`,
`memory` are integers, as `ray start` and the config read them; `resources` is KubeRay's
escaped JSON of integers), then the first container's limits, then its requests
(rounded up). A GPU is any container resource whose name ends in `gpu`. Custom
resources come from the top-level `resources` alone when it is set. What Ray refuses
(its config raises and the autoscaler stops) and what KubeRay refuses (the RayCluster
is not reconciled) is an error here, with their reason."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tpu_autoscaler.core import labels
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import Container, Quantity
from tpu_autoscaler.manifest.resources import parse_quantity_at

STANDARD_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory"})
"""Keys of the top-level `resources` that are not custom resources (Ray's `standard_keys`)."""

RAY_START_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
"""rayStartParams KubeRay will not combine with the top-level `resources`."""

_CPU = ("CPU", "num-cpus", "cpu")
_MEMORY = ("memory", "memory", "memory")
"""(Ray resource, rayStartParams key, container resource) of CPU and memory."""

_START_PARAM_EXAMPLE = '\'"{\\"TPU\\": 4}"\''


@dataclass(frozen=True, slots=True)
class NodeResources:
    """A node's Ray resources, and whether `TPU` was written (not read off the chips)."""

    resources: dict[str, float]
    tpu_written: bool


def ray_node_resources(
    group_resources: Mapping[str, Quantity] | None,
    ray_start_params: Mapping[str, str],
    container: Container | None,
    container_path: str,
    found: GroupProblems,
) -> NodeResources:
    """CPU, GPU, TPU, memory and custom resources of one node, as Ray's config has them
    (the TPU head resource aside: Ray puts it on every host, we on worker 0 only)."""
    group = dict(group_resources or {})
    if group and any(ray_start_params.get(k) for k in RAY_START_RESOURCE_PARAMS):
        found.error(
            "resources",
            "KubeRay refuses the RayCluster: resource fields should not be set in both "
            "rayStartParams and Resources; please use only one",
        )
    requests = container.resources.requests if container else {}
    limits = container.resources.limits if container else {}
    resources: dict[str, float] = {}
    cpu = _first(group, ray_start_params, limits, requests, _CPU, container_path, found)
    written = "CPU" in group or "num-cpus" in ray_start_params or "cpu" in {*limits, *requests}
    if cpu is None and not written:  # written but unreadable: that error is already named
        found.error(
            f"{container_path}.resources.limits.cpu",
            "is missing, and so are rayStartParams num-cpus and resources CPU; Ray's "
            "autoscaler refuses a group whose CPUs it cannot find (ValueError)",
        )
    if cpu is not None:
        resources["CPU"] = cpu
    gpu = _gpus(group, ray_start_params, limits, requests, container_path, found)
    if gpu is not None:
        resources["GPU"] = gpu
    custom = _custom(group, ray_start_params, found)
    tpu = _tpus(group, custom, limits, requests, container_path, found)
    if tpu is not None:
        resources[labels.TPU_RESOURCE] = tpu
    memory = _first(group, ray_start_params, limits, requests, _MEMORY, container_path, found)
    if memory is not None:
        resources["memory"] = memory
    resources.update(custom)
    written = labels.TPU_RESOURCE in group or labels.TPU_RESOURCE in custom
    return NodeResources(resources, written)


def _rounded_up(value: Quantity, path: str, found: GroupProblems) -> float | None:
    parsed = parse_quantity_at(value, path, found)
    return None if parsed is None else float(math.ceil(parsed))


def _start_param_int(params: Mapping[str, str], name: str, found: GroupProblems) -> float | None:
    raw = params[name]
    try:
        return float(int(raw))
    except ValueError:
        found.error(
            f"rayStartParams.{name}",
            f"is {raw!r}; `ray start --{name}` and Ray's autoscaler read a whole number "
            "(write quantities such as 500m or 2Gi in the container or in `resources`)",
        )
        return None


def _first(
    group: Mapping[str, Quantity],
    params: Mapping[str, str],
    limits: Mapping[str, Quantity],
    requests: Mapping[str, Quantity],
    names: tuple[str, str, str],
    container_path: str,
    found: GroupProblems,
) -> float | None:
    ray_name, start_param, k8s_name = names
    if ray_name in group:
        return _rounded_up(group[ray_name], f"resources[{ray_name}]", found)
    if start_param in params:
        return _start_param_int(params, start_param, found)
    for kind, table in (("limits", limits), ("requests", requests)):
        if k8s_name in table:
            path = f"{container_path}.resources.{kind}.{k8s_name}"
            return _rounded_up(table[k8s_name], path, found)
    return None


def _gpus(
    group: Mapping[str, Quantity],
    params: Mapping[str, str],
    limits: Mapping[str, Quantity],
    requests: Mapping[str, Quantity],
    container_path: str,
    found: GroupProblems,
) -> float | None:
    if "GPU" in group:
        return _rounded_up(group["GPU"], "resources[GPU]", found)
    if "num-gpus" in params:
        return _start_param_int(params, "num-gpus", found)
    for kind, table in (("limits", limits), ("requests", requests)):
        for key, value in table.items():
            # Ray takes the first non-zero `*gpu` resource (nvidia.com/gpu, amd.com/gpu).
            if key.endswith("gpu"):
                gpus = _rounded_up(value, f"{container_path}.resources.{kind}[{key}]", found)
                if gpus:
                    return gpus
    return None


def _tpus(
    group: Mapping[str, Quantity],
    custom: Mapping[str, float],
    limits: Mapping[str, Quantity],
    requests: Mapping[str, Quantity],
    container_path: str,
    found: GroupProblems,
) -> float | None:
    if labels.TPU_RESOURCE in group:
        return _rounded_up(group[labels.TPU_RESOURCE], "resources[TPU]", found)
    if labels.TPU_RESOURCE in custom:
        return custom[labels.TPU_RESOURCE]
    for kind, table in (("limits", limits), ("requests", requests)):
        if labels.GKE_TPU_RESOURCE in table:
            path = f"{container_path}.resources.{kind}[{labels.GKE_TPU_RESOURCE}]"
            chips = _rounded_up(table[labels.GKE_TPU_RESOURCE], path, found)
            if chips:
                return chips
    return None


def _warn_if_kuberay_reads_it_as_standard(key: str, found: GroupProblems) -> None:
    """KubeRay lower-cases a `resources` key and starts Ray with `--num-cpus`, `--memory`
    or `--num-gpus` for `cpu`, `memory` or a `*gpu` name (updateRayStartParamsResources),
    while Ray's autoscaler counts any key but CPU, GPU, TPU, memory as a custom resource."""
    lowered = key.lower()
    if lowered in ("cpu", "memory") or lowered.endswith("gpu"):
        standard = {"cpu": "CPU", "memory": "memory"}.get(lowered, "GPU")
        found.warn(
            f"resources[{key}]",
            f"KubeRay starts Ray with it as {standard}, but Ray's autoscaler counts a custom "
            f"resource {key!r}: write {standard}",
        )


def _custom(
    group: Mapping[str, Quantity], params: Mapping[str, str], found: GroupProblems
) -> dict[str, float]:
    if group:
        custom: dict[str, float] = {}
        for key, value in group.items():
            if key not in STANDARD_RESOURCES:
                rounded = _rounded_up(value, f"resources[{key}]", found)
                if rounded is not None:
                    custom[key] = rounded
                _warn_if_kuberay_reads_it_as_standard(key, found)
        return custom
    raw = params.get("resources")
    if raw is None:
        return {}
    # Ray drops the first and last character (KubeRay's outer quotes) and every backslash.
    try:
        loaded = json.loads(raw[1:-1].replace("\\", ""))
    except json.JSONDecodeError:
        loaded = None
    if not isinstance(loaded, dict) or not all(isinstance(v, int) for v in loaded.values()):
        found.error(
            "rayStartParams.resources",
            f"{raw!r}: Ray's autoscaler reads this as JSON of whole numbers inside one pair "
            f"of quotes, e.g. {_START_PARAM_EXAMPLE}, and refuses anything else",
        )
        return {}
    return {str(k): float(v) for k, v in loaded.items()}
