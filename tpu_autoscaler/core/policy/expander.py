"""Which group to grow: every group that could serve a demand item becomes an
`Option` carrying how many replicas and chips it would launch and why; the best is
the first by a chain of small comparisons (fewest chips, fewest replicas, higher
priority, higher cloud availability, then name), so plans are deterministic."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_autoscaler.core.demand import (
    RESOURCE_EPSILON,
    Bundle,
    copies_that_fit,
    offered,
    selector_matches,
)
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Chips, Replicas


@dataclass(frozen=True, slots=True)
class Option:
    group: str
    replicas: Replicas
    chips: Chips
    priority: int
    debug: str
    availability: float = 1.0
    """Ray's cloud resource availability of the group: after priority, as in Ray."""

    def rank(self) -> tuple[int, int, int, float, str]:
        return (self.chips, self.replicas, -self.priority, -self.availability, self.group)


def best_option(options: list[Option]) -> Option | None:
    return min(options, key=Option.rank, default=None)


def describe_options(options: list[Option], chosen: Option) -> str:
    others = [o for o in sorted(options, key=Option.rank) if o is not chosen]
    if not others:
        return chosen.debug
    alternatives = "; ".join(
        f"{o.group}: {o.replicas} replica(s), {o.chips} chips" for o in others[:3]
    )
    return f"{chosen.debug} (fewest chips; also possible: {alternatives})"


def copies_per_replica(shape: SliceShape, bundle: Bundle) -> int:
    """How many copies of `bundle` one empty replica of `shape` holds."""
    head = bundle.head_resource
    total = 0
    for index in range(shape.hosts_per_replica):
        host_labels = shape.host_labels(index)
        if not selector_matches(bundle.selector, host_labels):
            continue
        copies = copies_that_fit(shape.host_resources(index), bundle.resources)
        if head is not None:
            copies = min(copies, 1)
        total += copies
    return total


def why_not(shape: SliceShape, bundle: Bundle) -> str:
    """Why no replica of `shape` can ever hold `bundle`: the first selector term or
    resource that no host of it offers."""
    hosts = range(shape.hosts_per_replica)
    for constraint in bundle.selector:
        if not any(constraint.matches(shape.host_labels(i)) for i in hosts):
            values = sorted({shape.host_labels(i).get(constraint.key, "<unset>") for i in hosts})
            return f"{shape.group} offers {constraint.key}={'|'.join(values[:4])}, not {constraint}"
    matching = [i for i in hosts if selector_matches(bundle.selector, shape.host_labels(i))]
    for name, amount in sorted(bundle.resources.items()):
        best = max((offered(shape.host_resources(i), name) for i in matching), default=0.0)
        if best + RESOURCE_EPSILON < amount:
            return f"{shape.group} hosts have {name}: {best:g}, the bundle needs {amount:g}"
    return f"{shape.group} cannot hold it together with the rest of its gang"
