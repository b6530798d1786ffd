"""Which worker groups resize their pods in place, and how far: the RayCluster's
`ray.io/ippr` annotation, read as Ray 2.60 reads it (`KubeRayIPPRProvider.
validate_and_set_ippr_specs` against `IPPRSpecsSchema`) plus the rules that make a
group unfit for it. Ray raises on a bad annotation every round (its autoscaler then
scales nothing); here every problem is named, with its path, and `validate` exits 2.

```json
{"groups": {"cpu-group": {"max-cpu": "8", "max-memory": "32Gi", "resize-timeout": 300}}}
```

Ray's rules: each group gives all three keys (`max-cpu` a quantity or number,
`max-memory` a quantity or integer, `resize-timeout` whole seconds); its `rayStartParams`
set neither `num-cpus` nor `memory`; its first container requests `cpu` and `memory`;
a `resizePolicy` for either says `restartPolicy: NotRequired`. Groups the cluster does
not have are ignored, as Ray ignores them. Ours on top: a group with TPUs, or with more
than one host per replica, is refused (a TPU host's chips are fixed by its VM and a
slice's hosts must stay alike); `headgroup` is accepted but never resized here."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
)

from tpu_autoscaler.core.problems import Problem
from tpu_autoscaler.core.resize import IPPR_ANNOTATION, ResizeBounds
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import RayCluster, WorkerGroupSpec
from tpu_autoscaler.manifest.resources import parse_quantity_at

ANNOTATION_PATH = f"metadata.annotations[{IPPR_ANNOTATION}]"
HEAD_GROUP = "headgroup"


def _whole(value: int | float) -> int | float:
    """JSON Schema's `integer`: a number without a fractional part (300.0 is one)."""
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("must be a whole number")
    return value


Whole = Annotated[StrictInt | StrictFloat, AfterValidator(_whole)]


class _GroupBounds(BaseModel):
    """One group of the annotation, with `IPPRSpecsSchema`'s types."""

    model_config = ConfigDict(extra="allow", frozen=True)
    max_cpu: str | StrictInt | StrictFloat = Field(alias="max-cpu")
    max_memory: str | Whole = Field(alias="max-memory")
    resize_timeout: Whole = Field(alias="resize-timeout")


class _Annotation(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    groups: dict[str, _GroupBounds] = Field(default_factory=dict)


def read_annotation(cluster: RayCluster) -> tuple[dict[str, Any], list[Problem]]:
    """Each group's raw bounds (validated as Ray validates them), and what is wrong."""
    raw = cluster.metadata.annotations.get(IPPR_ANNOTATION)
    if not raw:
        return {}, []
    try:
        parsed = _Annotation.model_validate(json.loads(raw))
    except json.JSONDecodeError as exc:
        return {}, [Problem(ANNOTATION_PATH, f"is not JSON ({exc.msg}); e.g. {_EXAMPLE}")]
    except ValidationError as exc:
        problems = [
            Problem(
                ANNOTATION_PATH + "".join(f".{p}" for p in err["loc"]),
                f"{err['msg']}; e.g. {_EXAMPLE}",
            )
            for err in exc.errors()
        ]
        return {}, problems
    return dict(parsed.groups), []


_EXAMPLE = '{"groups": {"<group>": {"max-cpu": "8", "max-memory": "32Gi", "resize-timeout": 300}}}'


def resize_bounds(
    spec: WorkerGroupSpec, bounds: Any, has_tpu: bool, found: GroupProblems
) -> ResizeBounds | None:
    """The group's bounds if the annotation names it and it can resize; else None,
    with the reason in `found`."""
    if not isinstance(bounds, _GroupBounds):
        return None
    where = f"{ANNOTATION_PATH}.groups.{spec.group_name}"
    if has_tpu or spec.num_of_hosts > 1:
        found.error(
            "template" if has_tpu else "numOfHosts",
            f"is named in {where}, but only single-host groups without TPUs resize in "
            "place (a TPU host's chips are fixed by its VM; a slice's hosts stay alike); "
            "remove the group from the annotation",
        )
        return None
    for key in ("num-cpus", "memory"):
        if key in spec.ray_start_params:
            found.error(
                f"rayStartParams[{key}]",
                f"is set, but Ray refuses in-place resize ({where}) with it: the pod's "
                "size must be Ray's; remove it",
            )
    containers = spec.template.spec.containers
    if containers:
        container = containers[0]
        for resource in ("cpu", "memory"):
            if resource not in container.resources.requests:
                found.error(
                    f"template.spec.containers[0].resources.requests[{resource}]",
                    f"is missing; Ray needs cpu and memory requests (the lower bounds) "
                    f"for in-place resize ({where})",
                )
        for index, policy in enumerate(container.resize_policy or ()):
            if policy.resource_name in ("cpu", "memory") and policy.restart_policy not in (
                None,
                "NotRequired",
            ):
                found.error(
                    f"template.spec.containers[0].resizePolicy[{index}].restartPolicy",
                    f"is {policy.restart_policy!r}; in-place resize ({where}) needs "
                    "NotRequired (a restart would kill the raylet)",
                )
    max_cpu = parse_quantity_at(bounds.max_cpu, f"{where}.max-cpu", found)
    max_memory = parse_quantity_at(bounds.max_memory, f"{where}.max-memory", found)
    for name, value in (("max-cpu", max_cpu), ("max-memory", max_memory)):
        if value is not None and value <= 0:
            found.error(f"{where}.{name}", f"is {value}; give a positive quantity")
    if found.has_errors or max_cpu is None or max_memory is None:
        return None
    return ResizeBounds(
        max_cpu=float(max_cpu),
        max_memory_bytes=float(int(max_memory)),
        timeout_s=float(bounds.resize_timeout),
    )


def unknown_groups(cluster: RayCluster, named: dict[str, Any]) -> list[Problem]:
    """Groups the annotation names that resize nothing here: warnings."""
    groups = {g.group_name for g in cluster.spec.worker_group_specs}
    problems = []
    for name in named:
        if name == HEAD_GROUP:
            problems.append(
                Problem(
                    f"{ANNOTATION_PATH}.groups.{name}",
                    "the head is never resized by tpu-autoscaler (Ray 2.60 may resize it)",
                    severity="warning",
                )
            )
        elif name not in groups:
            problems.append(
                Problem(
                    f"{ANNOTATION_PATH}.groups.{name}",
                    "names no worker group; ignored (as Ray ignores it)",
                    severity="warning",
                )
            )
    return problems
