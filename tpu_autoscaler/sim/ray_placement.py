"""Where Ray 2.60 puts a task, an actor or a placement group, given the nodes as they
are now; read from Ray's sources.

- **Tasks and actors: the hybrid policy** (`hybrid_scheduling_policy.cc`, defaults from
  `ray_config_def.h`). The driver runs on the head, so the head is the local node.
  Nodes that are draining are skipped. A node is feasible if its labels match and its
  total resources hold the request, available if its free resources do. Each node
  scores its critical resource utilization (the highest used fraction of CPU, memory
  and object store memory; TPUs do not count), rounded down to 0 below the spread
  threshold (0.5). Available nodes are preferred to feasible ones: nodes are ordered
  by id, then stably by score; the local node wins if it is available and scores no
  worse than the best; otherwise one of the best k is picked at random (k = max(1,
  int(20 % of all nodes))), with the simulator's seeded random. Work that asks for no
  GPU first tries nodes without GPUs, then all (`scheduler_avoid_gpu_nodes`).
- **Placement groups**: all bundles reserved together or none; PACK on one node if
  one holds them all, else spread over several; SPREAD on distinct nodes while any
  is left, STRICT_PACK on one node, STRICT_SPREAD on distinct nodes; selectors as
  hard constraints; draining nodes skipped.

Not modelled: the GCS's bundle scorer (bundles are placed first fit in node order
within each strategy); fallback selectors.

Placement here is written independently of the policy's, so the simulator checks
the policy against a second opinion rather than against itself."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping

from tpu_autoscaler.controlplane.selectors import Selector
from tpu_autoscaler.core.demand import RESOURCE_EPSILON, GangStrategy
from tpu_autoscaler.sim.ray_model import Bundle, Node, Work, fitting

Narrow = Callable[[list[Bundle], Mapping[str, float]], list[Node]]
"""Given bundles and resources, the nodes placement may take (live, not draining, in
order) whose free resources hold them, or an ordered part of those holding every
one that matches all the bundles: a caller that indexes its nodes by label need not
walk them all."""

TOP_K_FRACTION = 0.2
"""`scheduler_top_k_fraction`: how many of the best nodes a task is spread over."""
TOP_K_ABSOLUTE = 1
"""`scheduler_top_k_absolute`: at least this many."""


def place(
    work: Work,
    live: list[Node],
    local: Node | None,
    rng: random.Random,
    taking: list[Node] | None = None,
) -> bool:
    """Whether `work` places on the `live` nodes now (`local`: the head, the driver's
    node); if so its bundles take their resources from the nodes chosen. `taking`:
    the live nodes not draining, if the caller has them."""
    nodes = [n for n in live if not n.draining] if taking is None else taking
    if not work.is_gang:
        bundle = work.bundles[0]
        node = hybrid(bundle, nodes, len(live), local, rng)
        if node is None:
            return False
        take(node, bundle.resources)
        work.placement = [(node.pod, dict(bundle.resources))]
        return True
    return place_group(work, lambda _, resources: fitting(nodes, resources))


def place_group(work: Work, narrow: Narrow) -> bool:
    """Whether the placement group `work` places now on the nodes `narrow` offers;
    if so its bundles take their resources from the nodes chosen."""
    chosen = place_gang(work, narrow)
    if chosen is None:
        return False
    for node, bundle in chosen:
        take(node, bundle.resources)
    work.placement = [(node.pod, dict(bundle.resources)) for node, bundle in chosen]
    return True


def take(node: Node, resources: Mapping[str, float]) -> None:
    for key, value in resources.items():
        node.available[key] = node.available.get(key, 0.0) - value
    node.idle_since_s = None
    node.changed()


def hybrid(
    bundle: Bundle, nodes: list[Node], live_count: int, local: Node | None, rng: random.Random
) -> Node | None:
    """The node the hybrid policy runs a task or actor on now, or None: it waits.
    `live_count`: all live nodes, draining ones too (they count for k)."""
    k = max(TOP_K_ABSOLUTE, int(live_count * TOP_K_FRACTION))
    if not bundle.resources.get("GPU"):
        found = _best_available(bundle, [n for n in nodes if not n.has_gpu], k, local, rng)
        if found is not None:
            return found
    return _best_available(bundle, nodes, k, local, rng)


def _best_available(
    bundle: Bundle, nodes: list[Node], k: int, local: Node | None, rng: random.Random
) -> Node | None:
    available = [n for n in nodes if bundle.matches(n) and n.fits(bundle.resources)]
    if not available:
        return None
    ranked = sorted(sorted(available, key=lambda n: n.node_id), key=Node.score)
    local_is_best = local is not None and local.score() <= ranked[0].score()
    if local_is_best and any(n is local for n in available):
        return local
    candidates = min(k, len(ranked))
    return ranked[rng.randrange(candidates) if candidates > 1 else 0]


def place_gang(work: Work, narrow: Narrow) -> list[tuple[Node, Bundle]] | None:
    """The node each bundle of a placement group takes, by its strategy, or None: the
    group waits (all bundles or none). `narrow`: the nodes it may take with room
    for a request, or fewer that still hold every node its bundles match (see
    `Narrow`): each is filtered by the bundles' selectors."""
    strategy = work.strategy
    if strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
        total: Counter[str] = Counter()
        for b in work.bundles:
            total.update(b.resources)
        # The first node (in order) every bundle matches that holds them all. Both
        # are filters that keep the order, so which goes first changes nothing: the
        # free resources first, as a slice head's (one free per idle slice) leaves
        # few nodes for the label tests on a large busy cluster.
        holding = narrow(work.distinct_bundles, total)
        for bundle in work.distinct_bundles:
            holding = bundle.matching(holding)
        if holding:
            return [(holding[0], b) for b in work.bundles]
        if strategy is GangStrategy.STRICT_PACK or len(work.bundles) == 1:
            return None  # one bundle spread is the try just made
    # Copied only for the nodes this gang takes from (a copy of every node's
    # resources per try was most of a round on a large cluster).
    free: dict[str, dict[str, float]] = {}
    # The nodes each kind of bundle could take: a node's free resources only shrink
    # as this gang's bundles take them (no request is negative), so one that does
    # not hold a bundle now will not later in this try.
    matching: dict[tuple[Selector, tuple[tuple[str, float], ...]], list[Node]] = {}
    chosen: list[tuple[Node, Bundle]] = []
    for bundle in work.bundles:
        kind = (bundle.constraints, tuple(bundle.resources.items()))
        candidates = matching.get(kind)
        if candidates is None:
            # Both order-kept filters: the same nodes whichever goes first.
            candidates = bundle.matching(narrow([bundle], bundle.resources))
            matching[kind] = candidates
        used = {n.pod for n, _ in chosen}
        ordered = candidates
        if strategy in (GangStrategy.SPREAD, GangStrategy.STRICT_SPREAD):
            ordered = [n for n in candidates if n.pod not in used]
            if strategy is GangStrategy.SPREAD:
                ordered += [n for n in candidates if n.pod in used]
        found = next(
            (
                n
                for n in ordered
                if all(
                    free.get(n.pod, n.available).get(k, 0.0) + RESOURCE_EPSILON >= v
                    for k, v in bundle.resources.items()
                )
            ),
            None,
        )
        if found is None:
            return None
        left = free.setdefault(found.pod, dict(found.available))
        for key, value in bundle.resources.items():
            left[key] = left.get(key, 0.0) - value
        chosen.append((found, bundle))
    return chosen
