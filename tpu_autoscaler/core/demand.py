"""What pending work asks for: resource bundles with label selectors, alone (tasks,
actors), in gangs (placement groups) or as a floor on cluster size
(`request_resources`). Values only; `placement.py` decides where they fit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.units import TpuResource

RESOURCE_EPSILON = 1e-9
"""Ray keeps resources in fixed point (1e-4); this only absorbs float noise."""


@dataclass(frozen=True, slots=True)
class LabelConstraint:
    """`key IN values` or `key NOT_IN values`; a host without `key` fails IN and passes NOT_IN."""

    key: str
    operator: Literal["in", "not_in"]
    values: frozenset[str]
    parts: tuple[str, str, frozenset[str]] = field(init=False, repr=False, compare=False)
    """The fields as a plain tuple, equal exactly when the constraints are: what a
    bundle's key holds, so that hashing and comparing keys (each gang's kind, per
    plan, for 100,000 gangs) stays in C, without a Python call per constraint."""
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = (self.key, self.operator, self.values)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "_hash", hash(parts))

    def __hash__(self) -> int:
        return self._hash

    def matches(self, host_labels: Mapping[str, str]) -> bool:
        value = host_labels.get(self.key)
        if self.operator == "in":
            return value is not None and value in self.values
        return value is None or value not in self.values

    def __str__(self) -> str:
        values = ",".join(sorted(self.values))
        op = "in" if self.operator == "in" else "!in"
        return (
            f"{self.key} {op} ({values})"
            if len(self.values) > 1 or op == "!in"
            else f"{self.key}={values}"
        )


LabelSelector = tuple[LabelConstraint, ...]
SelectorKey = tuple[tuple[str, str, frozenset[str]], ...]
"""A selector's constraints as plain tuples (`LabelConstraint.parts`)."""
BundleKey = tuple[object, ...]
"""Resources and selector (and fallbacks, if any) as plain tuples: equal for bundles
alike."""


def selector_key(selector: LabelSelector) -> SelectorKey:
    return tuple([c.parts for c in selector])


def offered(free: Mapping[str, float], name: str) -> float:
    """How much of resource `name` `free` holds. An implicit resource missing from it
    counts as the one unit every Ray node has without reporting it (Ray's `_fits`)."""
    value = free.get(name)
    if value is None:
        return 1.0 if name.startswith(labels.IMPLICIT_RESOURCE_PREFIX) else 0.0
    return value


def copies_that_fit(free: Mapping[str, float], resources: Mapping[str, float]) -> int:
    """How many copies of `resources` fit in `free`."""
    copies = float("inf")
    for name, amount in resources.items():
        if amount > 0:
            have = free.get(name)
            if have is None:
                have = offered(free, name)
            copies = min(copies, (have + RESOURCE_EPSILON) // amount)
    return 0 if copies == float("inf") else int(copies)


def selector_matches(selector: LabelSelector, host_labels: Mapping[str, str]) -> bool:
    for constraint in selector:  # noqa: SIM110 (all() of a generator: slower in a hot loop)
        if not constraint.matches(host_labels):
            return False
    return True


def selector_from_mapping(selector: Mapping[str, str]) -> LabelSelector:
    """Ray's `label_selector` dict syntax: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    constraints = []
    for key, raw in sorted(selector.items()):
        text = raw.strip()
        negated = text.startswith("!")
        if negated:
            text = text[1:]
        if text.startswith("in(") and text.endswith(")"):
            values = frozenset(v.strip() for v in text[3:-1].split(",") if v.strip())
        else:
            values = frozenset({text})
        constraints.append(LabelConstraint(key, "not_in" if negated else "in", values))
    return tuple(constraints)


def pinned_slice(selector: LabelSelector) -> frozenset[str] | None:
    """The slice names a selector confines a bundle to, if it does."""
    for c in selector:
        if c.key == labels.RAY_TPU_SLICE_NAME and c.operator == "in":
            return c.values
    return None


@dataclass(frozen=True, slots=True)
class Bundle:
    """Resources one task, actor or placement-group bundle needs on one host."""

    resources: Mapping[str, float]
    selector: LabelSelector = ()
    fallbacks: tuple[LabelSelector, ...] = ()
    """Selectors to try in order when `selector` cannot be served (Ray 2.60's
    `fallback_strategy`: a host matching any of them may take the bundle)."""
    key: BundleKey = field(init=False, repr=False, compare=False)
    """Equal for bundles that ask for the same thing: placement caches by it."""
    head_resource: str | None = field(init=False, repr=False, compare=False)
    """The `TPU-{pod_type}-head` it asks for: stage one of slice_placement_group."""

    def __post_init__(self) -> None:
        key: BundleKey = (tuple(sorted(self.resources.items())), selector_key(self.selector))
        if self.fallbacks:
            key += (tuple([selector_key(s) for s in self.fallbacks]),)
        object.__setattr__(self, "key", key)
        head = next(
            (k for k in self.resources if k.startswith("TPU-") and k.endswith("-head")), None
        )
        object.__setattr__(self, "head_resource", head)

    def __hash__(self) -> int:
        return hash(self.key)

    def variants(self) -> tuple[Bundle, ...]:
        """The bundle under each of its selectors in order, without fallbacks."""
        if not self.fallbacks:
            return (self,)
        return tuple(Bundle(self.resources, s) for s in (self.selector, *self.fallbacks))

    @property
    def tpu(self) -> TpuResource:
        return TpuResource(self.resources.get(labels.TPU_RESOURCE, 0.0))

    def size(self) -> tuple[TpuResource, float, float]:
        """How much accelerator it asks for, to order bundles largest first: the
        `TPU` resource, then GPU, then CPU."""
        r = self.resources
        return (self.tpu, r.get("GPU", 0.0), r.get("CPU", 0.0))

    def __str__(self) -> str:
        res = ", ".join(f"{k}: {v:g}" for k, v in sorted(self.resources.items()))
        sel = " if " + ", ".join(str(c) for c in self.selector) if self.selector else ""
        for fallback in self.fallbacks:
            sel += " else if " + (", ".join(str(c) for c in fallback) or "anywhere")
        return f"{{{res}}}{sel}"


class GangStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


GangKind = tuple[GangStrategy, tuple[BundleKey, ...]]


DemandKind = Literal["resource", "gang", "constraint"]


@dataclass(frozen=True, slots=True)
class DemandRef:
    """Which request of Ray's report an item stands for: the `index`-th of its
    pending resource requests, gang requests or cluster constraints (`kind`), so that
    what the policy could not serve goes back to Ray as Ray's own messages."""

    kind: DemandKind
    index: int


@dataclass(frozen=True, slots=True)
class ResourceDemand:
    """`count` tasks or actors, each needing `bundle` on one host."""

    bundle: Bundle
    count: int
    source: DemandRef | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.count} x {self.bundle}"


@dataclass(frozen=True, slots=True)
class GangDemand:
    """A placement group: all bundles are reserved together or not at all."""

    gang_id: str
    bundles: tuple[Bundle, ...]
    strategy: GangStrategy = GangStrategy.PACK
    source: DemandRef | None = field(default=None, compare=False)
    kind: GangKind = field(init=False, repr=False, compare=False)
    """Equal for gangs that ask for the same thing."""
    is_slice_head: bool = field(init=False, repr=False, compare=False)
    """Stage one of slice_placement_group: one head bundle per wanted slice."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", (self.strategy, tuple(b.key for b in self.bundles)))
        heads = bool(self.bundles) and all(b.head_resource for b in self.bundles)
        object.__setattr__(self, "is_slice_head", heads)

    def __str__(self) -> str:
        return f"placement group {self.gang_id} ({self.kind_text()})"

    def kind_text(self) -> str:
        """What it asks for, without its id: equal for gangs of one kind."""
        counts: dict[Bundle, int] = {}
        for b in self.bundles:
            counts[b] = counts.get(b, 0) + 1
        parts = ", ".join(f"{n} x {b}" for b, n in counts.items())
        return f"{self.strategy.value}: {parts}"


@dataclass(frozen=True, slots=True)
class ClusterConstraint:
    """`request_resources(bundles=...)`: keep capacity for these, used or not."""

    bundles: tuple[Bundle, ...]
    source: DemandRef | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return "request_resources(" + ", ".join(str(b) for b in self.bundles) + ")"


@dataclass(frozen=True, slots=True)
class Demand:
    resources: tuple[ResourceDemand, ...] = ()
    gangs: tuple[GangDemand, ...] = ()
    constraints: tuple[ClusterConstraint, ...] = field(default=())

    @property
    def is_empty(self) -> bool:
        return not (self.resources or self.gangs or self.constraints)
