"""Which group to grow: every group that could serve a demand item becomes an
`Option` carrying how many replicas and chips it would launch, how well its first
new replica would be used (`utilization.Score`) and why; the best is chosen by a
chain of small comparators (cluster-autoscaler's expander chain), each narrowing the
candidates to those it ranks best, until one is left:

1. fewest chips: TPU slices cost chips, so demand that needs none goes to groups
   without TPUs, and slice demand to the cheapest slices (for the same work: a group
   with room for only part of the demand is compared on that part, `counts.py`);
2. fewest slices, among TPU groups of equal chips (a slice is provisioned whole);
3. Ray 2.60's utilization score, element by element: label selector matched, GPU
   nodes kept for GPU work, most resource types used, highest least and then mean
   utilization (`utilization.py`);
4. a steadier group: one not churning (`churn.py`: its slices keep getting
   preempted soon after they arrive) before one that is;
5. higher `priority`, 6. lower cost (`ScarcitySettings.cost`, per chip-hour; unknown
   last), 7. higher cloud availability (Ray's `cloud_resource_availabilities`: a type
   that just stocked out is avoided), then 8. Ray's rotation: the group chosen longest
   ago in this round of launches (never: first), then the group's place in the
   RayCluster (Ray's node type order), so plans are deterministic.

Groups that can serve a demand alike (the same shape on a spot and an on-demand node
pool, say) tie on 1-3, so the user's order decides: priority, then cost. Churn ranks
above priority because priority is the user's preference for a group that delivers:
a higher-priority group losing its slices every few minutes serves new demand worse
than a steadier lower one, until its churn window passes. Cost ranks below priority
(the user's explicit word) and above availability, so groups without a cost rank as
before. A group stocked out or backing off is no option at all (`ledger.py`): the
demand moves to the next group in the same pass.

The comparator that left one option names the decision in its reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpu_autoscaler.core.demand import (
    RESOURCE_EPSILON,
    Bundle,
    copies_that_fit,
    offered,
    selector_matches,
)
from tpu_autoscaler.core.policy.utilization import NO_SCORE, Score
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Chips, Replicas

SCORE_DIGITS = 9
"""Utilizations are compared rounded: float noise in how amounts were summed must not
decide between groups that Ray's arithmetic would tie."""


@dataclass(frozen=True, slots=True)
class Option:
    group: str
    replicas: Replicas
    chips: Chips
    priority: int
    debug: str
    order: int = 0
    """The group's place among the RayCluster's worker groups."""
    score_of: Callable[[], Score] = field(default=lambda: NO_SCORE, compare=False, repr=False)
    """The utilization score of its first new replica, computed when a comparator
    needs it (most choices are decided by chips alone)."""
    last_chosen: int = -1
    """When `Rotation` last chose the group (-1: not yet)."""
    availability: float = 1.0
    """Ray's cloud resource availability of the group: after priority, as in Ray."""
    cost: float | None = None
    """The group's relative cost per chip-hour (`ScarcitySettings.cost`); None: unknown."""
    churning: bool = False
    """Its slices keep getting preempted soon after they arrive (`churn.py`)."""
    compared_replicas: Replicas | None = None
    compared_chips: Chips | None = None
    """What it needs for the work every option compared with it can hold, when its
    group's limit leaves it room for only part of the demand (`counts.py`); None: its
    `replicas` and `chips`, which are for all of it. A group with room for less is
    not cheaper for doing less."""

    @property
    def ranked_chips(self) -> Chips:
        return self.chips if self.compared_chips is None else self.compared_chips

    @property
    def ranked_replicas(self) -> Replicas:
        return self.replicas if self.compared_replicas is None else self.compared_replicas


@dataclass(frozen=True, slots=True)
class Comparator:
    """One link of the chain: `key` orders options, lower first; `name` says why the
    option it kept won."""

    name: str
    key: Callable[[Option], object]


CHAIN: tuple[Comparator, ...] = (
    Comparator("fewest chips", lambda o: o.ranked_chips),
    Comparator("fewest slices", lambda o: o.ranked_replicas if o.ranked_chips else 0),
    Comparator("label selector matched", lambda o: -o.score_of().label_rank),
    Comparator("GPU nodes kept for GPU work", lambda o: not o.score_of().gpu_ok),
    Comparator("most resource types used", lambda o: -o.score_of().resource_types),
    Comparator(
        "highest least utilization",
        lambda o: -round(o.score_of().min_utilization, SCORE_DIGITS),
    ),
    Comparator(
        "highest mean utilization",
        lambda o: -round(o.score_of().mean_utilization, SCORE_DIGITS),
    ),
    Comparator("steadier group (the other is churning)", lambda o: o.churning),
    Comparator("higher priority", lambda o: -o.priority),
    Comparator("lower cost", lambda o: (o.cost is None, o.cost or 0.0)),
    Comparator("higher cloud availability", lambda o: -o.availability),
    Comparator("first in Ray's node type rotation", lambda o: (o.last_chosen, o.order, o.group)),
)


class Rotation:
    """Ray's candidate node types within one scheduling call: the type it chooses
    moves to the end of its list and ties go to the earliest, so among equal options
    the group chosen longest ago (or never) wins, then the RayCluster's order."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._step = 0

    def last_chosen(self, group: str) -> int:
        return self._last.get(group, -1)

    def chose(self, group: str) -> None:
        self._step += 1
        self._last[group] = self._step


@dataclass(frozen=True, slots=True)
class Choice:
    option: Option
    decided_by: str
    """The comparator that left it alone ("only option" when nothing competed)."""
    narrowed_by: tuple[str, ...] = ()
    """Every comparator that ruled options out, in chain order (`decided_by` last)."""


def choose(options: list[Option]) -> Choice | None:
    """The best option by the chain, and which comparator decided."""
    if not options:
        return None
    if len(options) == 1:
        return Choice(options[0], "only option")
    candidates = options
    narrowed: list[str] = []
    for comparator in CHAIN:
        keys = [comparator.key(o) for o in candidates]
        best = min(keys)  # type: ignore[type-var]
        kept = [o for o, k in zip(candidates, keys, strict=True) if k == best]
        if len(kept) < len(candidates):
            narrowed.append(comparator.name)
        candidates = kept
        if len(candidates) == 1:
            return Choice(candidates[0], comparator.name, tuple(narrowed))
    return Choice(candidates[0], CHAIN[-1].name, (*narrowed, CHAIN[-1].name))


def best_option(options: list[Option]) -> Option | None:
    choice = choose(options)
    return choice.option if choice is not None else None


def describe_options(options: list[Option], choice: Choice) -> str:
    """The chosen option's reason: which comparator decided, and the runners-up."""
    chosen = choice.option
    others = [o for o in options if o is not chosen]
    if not others:
        return chosen.debug
    alternatives = "; ".join(
        f"{o.group}: {o.replicas} replica(s), {o.chips} chips" for o in others[:3]
    )
    return f"{chosen.debug} ({', '.join(choice.narrowed_by)}; also possible: {alternatives})"


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
    # Each host's labels made once: a gang pinned to a slice that is not up asks this
    # every pass, and making them was most of the answer.
    labels_of = [shape.host_labels(i) for i in hosts]
    for constraint in bundle.selector:
        if not any(constraint.matches(labels_of[i]) for i in hosts):
            values = sorted({labels_of[i].get(constraint.key, "<unset>") for i in hosts})
            return f"{shape.group} offers {constraint.key}={'|'.join(values[:4])}, not {constraint}"
    matching = [i for i in hosts if selector_matches(bundle.selector, labels_of[i])]
    for name, amount in sorted(bundle.resources.items()):
        best = max((offered(shape.host_resources(i), name) for i in matching), default=0.0)
        if best + RESOURCE_EPSILON < amount:
            return f"{shape.group} hosts have {name}: {best:g}, the bundle needs {amount:g}"
    return f"{shape.group} cannot hold it together with the rest of its gang"
