"""How well one new replica of a group would be used by the demand placed on it:
Ray 2.60's utilization score (`SchedulingNode._compute_score` in
`ray/autoscaler/v2/scheduler.py`), which the expander ranks options by.

The score is computed from the hosts' totals and what is left free once the demand is
placed, summed over the replica's hosts (one host: exactly Ray's node score). Higher
is better, element by element:

1. the label selector: 1 if the placed demand asked for labels (it matched them),
   else 0 (Ray: `len(selectors) - i` for the first selector matched; the policy reads
   a request's first selector);
2. GPU conservation: False if the replica has GPUs and the demand uses none (Ray's
   `AUTOSCALER_CONSERVE_GPU_NODES`, on by default);
3. how many resource types the demand uses;
4. the least and 5. the mean of `total x utilization^3` over the replica's resources
   (Ray's weighting: a large resource left idle costs more than a small one)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import NamedTuple

from tpu_autoscaler.core.demand import Bundle, GangDemand, copies_that_fit, selector_matches
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.shape import SliceShape

GPU = "GPU"
USED_EPSILON = 1e-9


class Score(NamedTuple):
    """Ray's `UtilizationScore`, element by element (higher is better)."""

    label_rank: int
    gpu_ok: bool
    resource_types: int
    min_utilization: float
    mean_utilization: float


HostUse = tuple[Mapping[str, float], Mapping[str, float]]
"""A host's total resources and what is free of them once the demand is placed."""


def score_hosts(
    hosts: Iterable[HostUse],
    label_rank: int,
    conserve_gpu: bool,
    requested: Collection[str] | None = None,
) -> Score:
    """The score of a replica with these hosts; `label_rank` as Ray's first element;
    `requested`: the resources the demand placed now asks for (default: every
    resource in use, which is the same on hosts that were empty)."""
    total: dict[str, float] = {}
    free: dict[str, float] = {}
    reported: set[str] = set()
    for host_total, host_free in hosts:
        reported.update(host_free)
        for name, amount in host_total.items():
            total[name] = total.get(name, 0.0) + amount
            free[name] = free.get(name, 0.0) + host_free.get(name, 0.0)
    used = (
        [name for name in requested if name in total]
        if requested is not None
        else [name for name, amount in total.items() if amount - free[name] > USED_EPSILON]
    )
    weighted = []
    for name, amount in total.items():
        # Ray weighs only the resources the node reports as available: the GCS leaves
        # out those with nothing free, so a node's full resources do not count.
        if amount == 0 or name not in reported:
            continue
        utilization = min(1.0, max(0.0, (amount - free[name]) / amount))
        weighted.append(amount * utilization**3)
    # A replica with GPUs is kept for GPU work: demand that uses none scores lower.
    gpu_ok = not (conserve_gpu and total.get(GPU, 0.0) > 0 and GPU not in used)
    return Score(
        label_rank,
        gpu_ok,
        len(used),
        min(weighted) if weighted else 0.0,
        sum(weighted) / len(weighted) if weighted else 0.0,
    )


class Scorer:
    """Scores of a new replica holding copies of one bundle, remembered per group,
    bundle kind and copies for the plan (the same options are ranked again after
    every launch)."""

    def __init__(self, conserve_gpu: bool) -> None:
        self.conserve_gpu = conserve_gpu
        self._known: dict[tuple[str, object, int], Score] = {}

    def copies(self, shape: SliceShape, bundle: Bundle, copies: int) -> Score:
        """The score of one empty replica of `shape` once `copies` copies of `bundle`
        are placed on it first fit, host by host (as the policy places them)."""
        key = (shape.group, bundle.key, copies)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = self.hosts(
                _packed(shape, bundle, copies), label_rank(bundle)
            )
        return known

    def hosts(
        self, hosts: Iterable[HostUse], rank: int, requested: Collection[str] | None = None
    ) -> Score:
        return score_hosts(hosts, rank, self.conserve_gpu, requested)

    def gang(
        self, world: World, gang: GangDemand, shape: SliceShape, needed: int
    ) -> Callable[[], Score]:
        """The score of the best-used of `needed` new replicas of `shape` once `gang`
        is placed with them, computed (by one more trial) only if a comparator asks."""

        @functools.cache
        def score() -> Score:
            found: list[Score] = []
            rank = max(label_rank(b) for b in gang.bundles)
            with world.trial([(shape, needed)]):
                new = world.replicas[-needed:]

                def look() -> None:
                    found.extend(
                        self.hosts(((h.total, h.free) for h in r.hosts), rank)
                        for r in new
                        if r.used
                    )

                world.gang_fits(gang, look)
            return max(found, default=NO_SCORE)

        return score


NO_SCORE = Score(0, True, 0, 0.0, 0.0)
"""The score of an option nothing was scored for."""


def label_rank(bundle: Bundle) -> int:
    """Ray's label element for demand of this bundle: 1 if it selects labels."""
    return 1 if bundle.selector else 0


def _packed(shape: SliceShape, bundle: Bundle, copies: int) -> list[HostUse]:
    hosts: list[HostUse] = []
    left = copies
    for index in range(shape.hosts_per_replica):
        total = shape.host_resources(index)
        placed = 0
        if left and selector_matches(bundle.selector, shape.host_labels(index)):
            placed = min(left, _fits(total, bundle))
        left -= placed
        free = dict(total)
        for name, amount in bundle.resources.items():
            free[name] = free.get(name, 0.0) - amount * placed
        hosts.append((total, free))
    return hosts


def _fits(total: Mapping[str, float], bundle: Bundle) -> int:
    copies = copies_that_fit(total, bundle.resources)
    return min(copies, 1) if bundle.head_resource is not None else copies
