"""Workload traces for the simulator: what is submitted when, for how long, and
which faults happen. A trace is YAML: a list of items, or a mapping with `items`
and `faults`; pydantic names the bad field of a bad trace."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from tpu_autoscaler.controlplane.selectors import selector_problem
from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.manifest.loading import format_path, read_text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _ray_accepts(selector: dict[str, str]) -> dict[str, str]:
    """Ray's own check, as `.options(label_selector=...)` runs it."""
    problem = selector_problem(selector)
    if problem is not None:
        raise ValueError(problem)
    return selector


RaySelector = Annotated[dict[str, str], AfterValidator(_ray_accepts)]
"""A label selector in Ray's dict syntax: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""


class TaskSpec(_Strict):
    resources: dict[str, float]
    label_selector: RaySelector = Field(default_factory=dict)


class PlacementGroupSpec(_Strict):
    bundles: list[dict[str, float]] = Field(min_length=1)
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    bundle_label_selector: list[RaySelector] | None = None

    @model_validator(mode="after")
    def _selectors_match_bundles(self) -> PlacementGroupSpec:
        if self.bundle_label_selector is not None and len(self.bundle_label_selector) != len(
            self.bundles
        ):
            raise ValueError("bundle_label_selector needs one selector per bundle")
        return self


class SlicePlacementGroupSpec(_Strict):
    """`slice_placement_group(topology, accelerator_version, num_slices=...,
    resources_per_bundle=..., head_reservation_timeout_s=...)`, run as `sim/slice_pg.py`
    describes; `retries` is how often the caller starts again after a head
    reservation times out (0: the program fails; -1: without limit, as Ray Train)."""

    topology: str
    accelerator_version: str
    num_slices: int = Field(default=1, ge=1)
    resources_per_bundle: dict[str, float] | None = None
    head_reservation_timeout_s: float | None = Field(default=100.0, gt=0)
    """Ray's `DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S`; Ray Train passes 60. None: forever."""
    retries: int = Field(default=0, ge=-1)


class WorkItem(_Strict):
    at: float = Field(ge=0)
    duration: float = Field(gt=0)
    count: int = Field(default=1, ge=1)
    task: TaskSpec | None = None
    actor: TaskSpec | None = None
    placement_group: PlacementGroupSpec | None = None
    slice_placement_group: SlicePlacementGroupSpec | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> WorkItem:
        kinds = [self.task, self.actor, self.placement_group, self.slice_placement_group]
        if sum(k is not None for k in kinds) != 1:
            raise ValueError(
                "give exactly one of task, actor, placement_group, slice_placement_group"
            )
        return self


class HostFailure(_Strict):
    group: str


class Stockout(_Strict):
    """GKE has no capacity of the group's shape until `until`: each slice that asks
    meanwhile waits, and its pods carry FailedScaleUp Events ("GCE out of resources")."""

    group: str
    until: float


class Preemption(_Strict):
    """GCE preempts one running slice of `group` (spot): every host of it goes at once."""

    group: str


class CapacityChange(_Strict):
    """From then on, GKE can hold `slices` slices of `group` at once (None: unlimited)."""

    group: str
    slices: int | None = Field(ge=0)


class Quota(_Strict):
    """A quota the group's slices count against is exhausted until `until`: as a
    stockout, but the FailedScaleUp Events say "GCE quota exceeded"."""

    group: str
    until: float


class PreemptionStorm(_Strict):
    """The group's running hosts (spot VMs) are preempted, one at a time, at
    exponentially distributed intervals of `mean_interval_s` on average, from the
    fault's `at` until `until`; each takes its slice, as a host failure does."""

    group: str
    until: float
    mean_interval_s: float = Field(gt=0)


FAULT_KINDS = (
    "host_failure",
    "stockout",
    "quota",
    "preemption_storm",
    "preemption",
    "capacity",
)


class Fault(_Strict):
    at: float = Field(ge=0)
    host_failure: HostFailure | None = None
    stockout: Stockout | None = None
    quota: Quota | None = None
    preemption_storm: PreemptionStorm | None = None
    preemption: Preemption | None = None
    capacity: CapacityChange | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Fault:
        given = [kind for kind in FAULT_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(FAULT_KINDS)}")
        ends = [k for k in (self.stockout, self.quota, self.preemption_storm) if k is not None]
        if ends and ends[0].until <= self.at:
            raise ValueError(f"{given[0]}.until ({ends[0].until:g}) must be after at ({self.at:g})")
        return self

    @property
    def group(self) -> str:
        kind: HostFailure | Stockout | Quota | PreemptionStorm | Preemption | CapacityChange = next(
            getattr(self, kind) for kind in FAULT_KINDS if getattr(self, kind) is not None
        )
        return kind.group


class DelayRange(_Strict):
    min: float = Field(default=60.0, ge=0)
    max: float = Field(default=180.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> DelayRange:
        if self.min > self.max:
            raise ValueError("min must not exceed max")
        return self

    @classmethod
    def parse(cls, text: str) -> DelayRange:
        """Seconds as a command line gives them, `S` or `MIN-MAX`; ValueError if not."""
        low, _, high = text.partition("-")
        return cls(min=float(low), max=float(high or low))


class Provisioning(_Strict):
    """How GKE behaves: a slice's VMs come up together after a delay drawn uniformly
    from `delay_s`, then each of its pods turns Running up to `host_stagger_s` later
    (image pull, init containers) and registers its raylet a few seconds after that;
    `capacity` caps the slices a group can hold at once; a slice's VMs outlive its pods
    by `scale_down_delay_s`."""

    delay_s: DelayRange = Field(default_factory=DelayRange)
    host_stagger_s: float | None = Field(default=None, ge=0)
    """None: the world's own (`WorldModel.running_stagger_s`: 20 s realistic, 0 ideal).
    `record` measures it: the widest spread of one slice's hosts registering in Ray."""
    capacity: dict[str, int] = Field(default_factory=dict)
    scale_down_delay_s: float = Field(default=0.0, ge=0)
    """How long GKE keeps a slice's VMs once its pods are gone: cluster-autoscaler's
    `scale-down-unneeded-time` (10 minutes unless the cluster's autoscaling profile
    says otherwise). Billed meanwhile, and a slice of the same group and size asked
    for in that time lands on them at once. 0: the VMs go with the pods."""

    def applied_to(self, world: WorldModel) -> WorldModel:
        """`world` with this trace's host stagger, where it gives one."""
        if self.host_stagger_s is None:
            return world
        return replace(world, running_stagger_s=self.host_stagger_s)


class Workload(_Strict):
    items: list[WorkItem]
    faults: list[Fault] = Field(default_factory=list)
    provisioning: Provisioning = Field(default_factory=Provisioning)

    @property
    def last_end_s(self) -> float:
        return max((item.at + item.duration for item in self.items), default=0.0)


def parse_workload(data: Any, source: str) -> Workload:
    if isinstance(data, list):
        data = {"items": data}
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(
            [
                Problem(f"{source}: {format_path(tuple(e['loc']))}", str(e["msg"]))
                for e in exc.errors()
            ]
        ) from None


def load_workload(source: str) -> Workload:
    try:
        data = yaml.safe_load(read_text(source))
    except yaml.YAMLError as exc:
        raise ManifestError([Problem(source, f"is not valid YAML: {exc}")]) from None
    return parse_workload(data, source)
