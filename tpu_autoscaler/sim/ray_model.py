"""What the simulated Ray keeps of its nodes and its work: a node's resources, labels,
idleness and drain; a bundle with its label selector; a task, actor or placement group
with where it runs and how often it was placed."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.controlplane.selectors import Selector, parse_selector, selector_matches
from tpu_autoscaler.core.demand import RESOURCE_EPSILON, GangStrategy

SPREAD_THRESHOLD = 0.5
"""`scheduler_spread_threshold`: below this utilization a node counts as empty."""
CRITICAL_RESOURCES = ("CPU", "memory", "object_store_memory")
"""What `CalculateCriticalResourceUtilization` looks at."""

NodeLedger = dict[str, bool]
"""The pods whose worker node changed since its reader last emptied it (`Node.changed`,
`RayScheduler.watch`): True if the pod's node came or went (or was replaced), False
if it was only written."""

_VERSIONS = itertools.count(1)
"""Node versions, unique across nodes: a node made anew for a pod never has the
version of the one before (`SimRay.state_key` compares them, not the nodes)."""


@dataclass
class Node:
    pod: str
    group: str
    labels: dict[str, str]
    total: dict[str, float]
    available: dict[str, float]
    idle_since_s: float | None
    node_id: bytes = b""
    draining: bool = False
    """Accepted a drain: no new work lands here."""
    exit_when_idle: bool = False
    """Drained with work on it: its raylet exits when that work ends."""
    death_reason: str = ""
    """Once dead, why, as the GCS's `NodeDeathInfo.Reason` names it, and in words."""
    death_message: str = ""
    died_at_s: float | None = None
    version: int = field(default_factory=lambda: next(_VERSIONS), repr=False, compare=False)
    """Made anew (`changed`) by every write to what its GCS `NodeState` is made of: its
    available resources, its status (draining, busy or idle), its idleness
    (`idle_since_s`), its totals and labels. The GCS state reuses a node's serialized
    part while its version stays (`sim/gcs_state.py`), and the simulator leaves out
    rounds while the versions stay (`SimRay.state_key`): a write without a new version
    leaves the autoscaler reading the node as it was (`tests/test_sim_caches.py`
    compares the kept parts with parts made anew all through runs, and goes red)."""
    cached_fixed: bytes | None = field(default=None, repr=False, compare=False)
    cached_changing: tuple[int, bytes, float | None] | None = field(
        default=None, repr=False, compare=False
    )
    cached_dead: bytes | None = field(default=None, repr=False, compare=False)
    """Parts of its serialized `NodeState` (`sim/gcs_state.py`): the fixed one; the
    whole message but for its idle duration, with the `version` it was made at and the
    time it is idle since (None: not reported IDLE); the dead one as a `node_states`
    member."""
    cached_dead_info: Any = field(default=None, repr=False, compare=False)
    """Once dead, its `GcsNodeInfo` as the GCS lists it (`SimRay.get_all_node_info`):
    made at the first ask, the same from then on (what it is made of is set when it
    dies)."""
    ledgers: list[NodeLedger] = field(default_factory=list, repr=False, compare=False)
    """The ledgers of the scheduler it was added to (`RayScheduler.watch`), shared with
    its other nodes: `changed` notes its pod in each."""

    def changed(self, fixed: bool = False) -> None:
        """Its available resources, status or idleness were written (`fixed`: its
        totals or labels too): what the GCS reports of it is made anew, and the
        readers watching its scheduler's nodes hear of it."""
        self.version = next(_VERSIONS)
        if fixed:
            self.cached_fixed = None
        for ledger in self.ledgers:
            ledger.setdefault(self.pod, False)

    def drain(self) -> None:
        """Accepted a drain: it takes no new work, and the GCS reports it DRAINING."""
        self.draining = True
        self.changed()

    @property
    def busy(self) -> bool:
        return self.idle_since_s is None

    @property
    def has_gpu(self) -> bool:
        return self.total.get("GPU", 0.0) > 0

    def fits(self, resources: Mapping[str, float]) -> bool:
        return all(self.available.get(k, 0.0) + RESOURCE_EPSILON >= v for k, v in resources.items())

    def could_fit(self, resources: Mapping[str, float]) -> bool:
        return all(self.total.get(k, 0.0) + RESOURCE_EPSILON >= v for k, v in resources.items())

    def score(self) -> float:
        """Critical resource utilization, 0 below the spread threshold."""
        used = max(
            (
                1.0 - self.available.get(name, 0.0) / self.total[name]
                for name in CRITICAL_RESOURCES
                if self.total.get(name, 0.0) > 0
            ),
            default=0.0,
        )
        return 0.0 if used < SPREAD_THRESHOLD else used


def fitting(nodes: list[Node], resources: Mapping[str, float]) -> list[Node]:
    """The `nodes` whose free resources hold `resources`, in order (`Node.fits` over
    a list; one or two resources, the usual cases, tested inline)."""
    if len(resources) == 1:
        ((key, amount),) = resources.items()
        return [n for n in nodes if n.available.get(key, 0.0) + RESOURCE_EPSILON >= amount]
    if len(resources) == 2:
        (key, amount), (other, second) = resources.items()
        return [
            n
            for n in nodes
            if n.available.get(key, 0.0) + RESOURCE_EPSILON >= amount
            and n.available.get(other, 0.0) + RESOURCE_EPSILON >= second
        ]
    return [n for n in nodes if n.fits(resources)]


@dataclass
class Bundle:
    resources: dict[str, float]
    selector: dict[str, str] = field(default_factory=dict)
    """In Ray's dict syntax: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    constraints: Selector = field(init=False, repr=False, compare=False)
    required_labels: tuple[tuple[str, str], ...] | None = field(
        init=False, repr=False, compare=False
    )
    """The selector as (key, value) pairs a node's labels must all have, when it is
    only that (`key IN (value)` each, the usual case); None for any other."""

    def __post_init__(self) -> None:
        self.constraints = parse_selector(self.selector)
        exact = all(c.operator == "in" and len(c.values) == 1 for c in self.constraints)
        self.required_labels = (
            tuple((c.key, next(iter(c.values))) for c in self.constraints) if exact else None
        )

    def matches(self, node: Node) -> bool:
        return selector_matches(self.constraints, node.labels)

    def matching(self, nodes: list[Node]) -> list[Node]:
        """The `nodes` it `matches`, in order: a walk of every node per placement try
        on a large cluster, so labels required exactly are looked up inline."""
        required = self.required_labels
        if required is None:
            return [n for n in nodes if self.matches(n)]
        if not required:
            return list(nodes)
        if len(required) == 1:
            ((key, value),) = required
            return [n for n in nodes if n.labels.get(key) == value]
        if len(required) == 2:
            (key, value), (other, second) = required
            return [
                n for n in nodes if n.labels.get(key) == value and n.labels.get(other) == second
            ]
        return [n for n in nodes if all(n.labels.get(k) == v for k, v in required)]


@dataclass
class Work:
    """A task or actor (one bundle, strategy None) or a placement group."""

    work_id: str
    bundles: list[Bundle]
    duration_s: float
    submitted_s: float
    strategy: GangStrategy | None = None
    placed_s: float | None = None
    placement: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    on_placed: Callable[[Work], None] | None = None
    """Called once placed (a placement group's `ready()`), after the round that placed it."""
    holds: list[Work] | None = None
    """Stage two of a multi-host slice_placement_group: the head placement groups it
    keeps reserved until it finishes (None for any other work)."""
    finishes: bool = True
    runs: int = field(default=0, compare=False)
    """Times placed: a retry's finish event is its own, the lost run's is stale."""
    cached_gang_demand: bytes | None = field(default=None, repr=False, compare=False)
    """Its pending gang request as the GCS reports it, serialized (`sim/gcs_state.py`)."""

    @property
    def is_gang(self) -> bool:
        return self.strategy is not None

    @functools.cached_property
    def kind(self) -> object:
        """Equal for work that asks for the same thing the same way."""
        bundles = tuple(
            (tuple(sorted(b.resources.items())), tuple(sorted(b.selector.items())))
            for b in self.bundles
        )
        return (self.strategy, bundles)

    def could_use(self, node: Node) -> bool:
        """Whether any bundle could take its resources from `node` as it is now: work
        for which this is false for every node that gained room places as before."""
        return any(b.matches(node) and node.fits(b.resources) for b in self.distinct_bundles)

    @functools.cached_property
    def distinct_bundles(self) -> list[Bundle]:
        # A slice's gang repeats one bundle per host: check each distinct one once.
        seen: dict[object, Bundle] = {}
        for b in self.bundles:
            seen.setdefault((tuple(b.resources.items()), b.constraints), b)
        return list(seen.values())
