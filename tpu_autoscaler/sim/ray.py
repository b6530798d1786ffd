"""Ray in the simulator, as unforgiving as Ray 2.60: a head node (the driver's) and a
node per running pod with the resources and labels Ray derives from the pod's
environment; work placed the way Ray places it; the `ClusterResourceState` the GCS
would report.

What is modelled, read from Ray 2.60's sources:

- **Label selectors** (`sim/selectors.py`): Ray's dict syntax parsed as the raylet
  parses it, IN / NOT_IN matched as `NodeLabelMatchesConstraint` matches them, hard
  constraints for tasks, actors and bundles, reported to the autoscaler with their
  operators.
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
- **Idleness as the raylet counts it** (`local_resource_manager.cc`): a node is idle
  when every resource is fully free; the idle time runs from the last release. A
  placement-group bundle takes its resources from the node when it is prepared
  (`PlacementGroupResourceManager::PrepareBundle` allocates them like a task), so a
  node whose resources a bundle holds is busy even with nothing running in the
  bundle, and turns idle only when the group is removed. The raylet reports at least
  1 ms of idleness and the GCS reports IDLE only for a positive duration.

Not modelled: a task that finds no available node waits in one cluster-wide queue
and is placed again when resources free up (Ray queues it at the chosen feasible
node, which later places it with its own view); the GCS's bundle scorer (bundles
are placed first fit in node order within each strategy); object store usage and
busy workers without resources (actors that hold no CPU once running), which keep a
real raylet busy; fallback selectors; the head's object store and `node:<ip>`
resources.

Placement here is written independently of the policy's, so the simulator checks
the policy against a second opinion rather than against itself."""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.core.generated import autoscaler_pb2

from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.selectors import Selector, parse_selector, selector_matches
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import RESOURCE_EPSILON, GangStrategy
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim import objects

SPREAD_THRESHOLD = 0.5
"""`scheduler_spread_threshold`: below this utilization a node counts as empty."""
TOP_K_FRACTION = 0.2
"""`scheduler_top_k_fraction`: how many of the best nodes a task is spread over."""
TOP_K_ABSOLUTE = 1
"""`scheduler_top_k_absolute`: at least this many."""
CRITICAL_RESOURCES = ("CPU", "memory", "object_store_memory")
"""What `CalculateCriticalResourceUtilization` looks at."""
HEAD_GROUP = "headgroup"
"""KubeRay's `ray.io/group` of the head pod, which is its `RAY_NODE_TYPE_NAME`."""
HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


def _node_id(pod: str) -> bytes:
    return hashlib.sha1(pod.encode()).digest()[:28]


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
    cached_fixed: bytes | None = field(default=None, repr=False, compare=False)
    cached_changing: tuple[object, bytes] | None = field(default=None, repr=False, compare=False)
    cached_dead: bytes | None = field(default=None, repr=False, compare=False)
    """Parts of its serialized `NodeState` (`SimRay.state`), the changing one with
    what it was made from."""

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


@dataclass
class Bundle:
    resources: dict[str, float]
    selector: dict[str, str] = field(default_factory=dict)
    """In Ray's dict syntax: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    constraints: Selector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.constraints = parse_selector(self.selector)

    def matches(self, node: Node) -> bool:
        return selector_matches(self.constraints, node.labels)


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

    @functools.cached_property
    def gang_demand(self) -> bytes:
        """Its pending gang request, serialized as a `ClusterResourceState` holding it
        alone (the same for as long as it waits)."""
        state = autoscaler_pb2.ClusterResourceState()
        objects.add_gang_demand(
            state,
            self.work_id,
            [b.resources for b in self.bundles],
            str(self.strategy),
            [b.selector for b in self.bundles],
        )
        return bytes(state.SerializeToString())

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


DEAD_NODES_KEPT = 1000


class SimRay:
    def __init__(
        self,
        now: Callable[[], float],
        schedule_after: Callable[[float, Callable[[], None]], None],
        rng: random.Random,
    ) -> None:
        self.now = now
        self.schedule_after = schedule_after
        self.random = rng
        self.head: Node | None = None
        """The head node: the driver's, never a worker, not in `nodes`."""
        self.nodes: dict[str, Node] = {}
        """Worker nodes by pod name."""
        self.dead: dict[str, Node] = {}
        self.pending: list[Work] = []
        self.running: dict[str, Work] = {}
        self.finished: list[Work] = []
        self._ids = itertools.count()
        self.autoscaling_state: Any = None
        """The last state an autoscaler reported, as `ray status` would read it."""
        self.reported_demand: list[Work] | None = None
        """Pending work as the GCS last heard of it from the raylets (`report_demand`);
        None: the GCS sees the queues as they are."""
        # What changed since the last round: after a round no pending work fits, so
        # only new work and work that could use a node that gained room can place.
        self._grown: dict[str, Node] | None = {}
        """Nodes that gained room (None: assume any did, scan everything)."""
        self._fresh: set[int] = set()
        """`id()` of work queued since the last round."""
        self._tracked_nodes = 0
        """`len(nodes)` as this class last left it: a node added by hand (tests) is
        noticed and everything is scanned again."""

    # --- nodes ---------------------------------------------------------------------

    def add_head(self, pod: str, resources: Mapping[str, float]) -> None:
        """The head node of `pod` (KubeRay's head pod): the group's CPUs and memory,
        Ray's head resource, labels from its environment (`ray.io/node-group`)."""
        node_id = _node_id(pod)
        self.head = Node(
            pod=pod,
            group=HEAD_GROUP,
            labels={labels.RAY_NODE_GROUP: HEAD_GROUP, objects.RAY_NODE_ID: node_id.hex()},
            total={**resources, HEAD_NODE_RESOURCE: 1.0},
            available={**resources, HEAD_NODE_RESOURCE: 1.0},
            idle_since_s=self.now(),
            node_id=node_id,
        )
        self._grew(self.head)
        self._round()

    def add_node(self, pod: Mapping[str, Any], shape: SliceShape, host_index: int) -> None:
        slice_name = gke.spec_environment(pod).get(labels.ENV_TPU_NAME)
        name = pod["metadata"]["name"]
        node_id = _node_id(name)
        if host_index < shape.hosts_per_replica:
            total = dict(shape.host_resources(host_index, slice_name))
            host_labels = dict(shape.host_labels(host_index, slice_name))
        else:
            # The webhook numbered a single-host pod past its slice (its counting bug):
            # Ray takes TPU_WORKER_ID as given, and only worker 0 gets the head resource.
            total = dict(shape.host_resources(0, slice_name))
            host_labels = dict(shape.host_labels(0, slice_name))
            host_labels[labels.RAY_TPU_WORKER_ID] = str(host_index)
            if shape.tpu is not None:
                total.pop(shape.tpu.head_resource, None)
        self._check_tracked()
        node = Node(
            pod=name,
            group=shape.group,
            labels={**host_labels, objects.RAY_NODE_ID: node_id.hex()},
            total=dict(total),
            available=dict(total),
            idle_since_s=self.now(),
            node_id=node_id,
        )
        self.nodes[name] = node
        self._tracked_nodes = len(self.nodes)
        self._grew(node)
        self._round()

    def remove_node(self, pod: str) -> list[Work]:
        """The node's raylet is gone; work on it is retried, as Ray retries tasks and
        reschedules placement groups. Returns the work that was running there."""
        self._check_tracked()
        node = self.nodes.pop(pod, None)
        self._tracked_nodes = len(self.nodes)
        if node is None:
            return []
        self.dead.pop(pod, None)  # newest last
        self.dead[pod] = node
        hit = [w for w in self.running.values() if any(p == pod for p, _ in w.placement)]
        for work in hit:
            self._release(work)
            del self.running[work.work_id]
            work.placed_s = None
            work.placement = []
            self.pending.insert(0, work)
            self._fresh.add(id(work))
        self._round()
        return hit

    def _node(self, pod: str) -> Node | None:
        if self.head is not None and pod == self.head.pod:
            return self.head
        return self.nodes.get(pod)

    def _live_nodes(self) -> list[Node]:
        head = [self.head] if self.head is not None else []
        return head + list(self.nodes.values())

    # --- work ----------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        self.pending.append(work)
        self._fresh.add(id(work))
        self._round()

    def remove(self, work: Work) -> None:
        """`remove_placement_group` (or a cancelled task): pending, it is dropped;
        placed, its resources are returned. It does not count as finished."""
        self.pending = [w for w in self.pending if w is not work]
        if self.running.get(work.work_id) is work:
            del self.running[work.work_id]
            self._release(work)
            self._round()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def schedule(self) -> None:
        """A round over all pending work."""
        self._grown = None
        self._round()

    def _round(self) -> None:
        """A round that tries only the work that could place now: what came since the
        last round, and what could use a node that gained room since. Any other work
        did not fit at the end of the last round and nothing it could use has grown,
        so it would not fit now (a failed try draws no randomness and changes nothing):
        the outcome is a full round's."""
        self._check_tracked()
        grown, fresh = self._grown, self._fresh
        self._grown, self._fresh = {}, set()
        if grown is not None and not grown and not fresh:
            return
        still: list[Work] = []
        placed: list[Work] = []
        # Capacity only shrinks within a round: a kind of work that did not fit once
        # will not fit again until something is released.
        failed: set[object] = set()
        usable: dict[object, bool] = {}
        for work in self.pending:
            kind = work.kind
            if kind in failed:
                still.append(work)
                continue
            if grown is not None and id(work) not in fresh:
                # Capacity only shrinks within a round, so a kind that could use no
                # grown node earlier in it cannot later either.
                if kind not in usable:
                    usable[kind] = any(work.could_use(n) for n in grown.values() if self._usable(n))
                if not usable[kind]:
                    still.append(work)
                    continue
            if self._place(work):
                work.placed_s = self.now()
                work.runs += 1
                self.running[work.work_id] = work
                placed.append(work)
                if work.finishes:
                    self.schedule_after(work.duration_s, self._finisher(work, work.runs))
            else:
                failed.add(kind)
                still.append(work)
        self.pending = still
        for work in placed:
            if work.on_placed is not None:
                # `ready()` resolves after the round: what it submits queues behind.
                self.schedule_after(0.0, self._announcer(work))

    def _check_tracked(self) -> None:
        if len(self.nodes) != self._tracked_nodes:
            self._grown = None
            self._tracked_nodes = len(self.nodes)

    def _grew(self, node: Node) -> None:
        if self._grown is not None:
            self._grown[node.pod] = node

    def _usable(self, node: Node) -> bool:
        """Still the live node of its pod, taking work."""
        return self._node(node.pod) is node and not node.draining

    def _announcer(self, work: Work) -> Callable[[], None]:
        def announce() -> None:
            if self.running.get(work.work_id) is work and work.on_placed is not None:
                work.on_placed(work)

        return announce

    def _finisher(self, work: Work, run: int) -> Callable[[], None]:
        return lambda: self._finish(work, run)

    def _finish(self, work: Work, run: int | None = None) -> None:
        """`work`'s run number `run` ends (None: its current one)."""
        if self.running.get(work.work_id) is not work or run not in (None, work.runs):
            return  # its node died: the retry, placed anew, ends a full duration later
        del self.running[work.work_id]
        self._release(work)
        self.finished.append(work)
        for held in work.holds or []:
            if self.running.get(held.work_id) is held:
                del self.running[held.work_id]
                self._release(held)
                self.finished.append(held)
            else:
                self.pending = [w for w in self.pending if w is not held]
        self._round()

    def _release(self, work: Work) -> None:
        for pod, resources in work.placement:
            node = self._node(pod)
            if node is None:
                continue
            self._grew(node)
            for key, value in resources.items():
                node.available[key] = node.available.get(key, 0.0) + value
            if all(
                abs(node.available.get(k, 0.0) - v) < RESOURCE_EPSILON
                for k, v in node.total.items()
            ):
                node.idle_since_s = self.now()

    def _take(self, node: Node, resources: Mapping[str, float]) -> None:
        for key, value in resources.items():
            node.available[key] = node.available.get(key, 0.0) - value
        node.idle_since_s = None

    def _place(self, work: Work) -> bool:
        nodes = [n for n in self._live_nodes() if not n.draining]
        if not work.is_gang:
            bundle = work.bundles[0]
            node = self._hybrid(bundle, nodes)
            if node is None:
                return False
            self._take(node, bundle.resources)
            work.placement = [(node.pod, dict(bundle.resources))]
            return True
        chosen = self._place_gang(work, nodes)
        if chosen is None:
            return False
        for node, bundle in chosen:
            self._take(node, bundle.resources)
        work.placement = [(node.pod, dict(bundle.resources)) for node, bundle in chosen]
        return True

    def _hybrid(self, bundle: Bundle, nodes: list[Node]) -> Node | None:
        """The node the hybrid policy runs a task or actor on now, or None: it waits."""
        k = max(TOP_K_ABSOLUTE, int(len(self._live_nodes()) * TOP_K_FRACTION))
        if not bundle.resources.get("GPU"):
            found = self._best_available(bundle, [n for n in nodes if not n.has_gpu], k)
            if found is not None:
                return found
        return self._best_available(bundle, nodes, k)

    def _best_available(self, bundle: Bundle, nodes: list[Node], k: int) -> Node | None:
        available = [n for n in nodes if bundle.matches(n) and n.fits(bundle.resources)]
        if not available:
            return None
        ranked = sorted(sorted(available, key=lambda n: n.node_id), key=Node.score)
        local = self.head
        local_is_best = local is not None and local.score() <= ranked[0].score()
        if local_is_best and any(n is local for n in available):
            return local
        candidates = min(k, len(ranked))
        return ranked[self.random.randrange(candidates) if candidates > 1 else 0]

    def _place_gang(self, work: Work, nodes: list[Node]) -> list[tuple[Node, Bundle]] | None:
        strategy = work.strategy
        if strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
            total: Counter[str] = Counter()
            for b in work.bundles:
                total.update(b.resources)
            distinct = work.distinct_bundles
            for node in nodes:
                if node.fits(total) and all(b.matches(node) for b in distinct):
                    return [(node, b) for b in work.bundles]
            if strategy is GangStrategy.STRICT_PACK:
                return None
        # Copied only for the nodes this gang takes from (a copy of every node's
        # resources per try was most of a round on a large cluster).
        free: dict[str, dict[str, float]] = {}
        matching: dict[Selector, list[Node]] = {}
        chosen: list[tuple[Node, Bundle]] = []
        for bundle in work.bundles:
            candidates = matching.get(bundle.constraints)
            if candidates is None:
                candidates = [n for n in nodes if bundle.matches(n)]
                matching[bundle.constraints] = candidates
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

    # --- the GCS, as Ray's GcsClient offers it to autoscalers ----------------------------

    def report_demand(self) -> None:
        """The raylets' periodic report of their queues reaching the GCS: until the
        next one, work placed since still shows as pending, and work submitted since
        does not show yet, while node resources are current."""
        self.reported_demand = list(self.pending)

    def get_cluster_resource_state(self) -> bytes:
        return _field(REPLY_STATE, self._state_bytes())

    def drain_node(
        self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int
    ) -> tuple[bool, str]:
        """An idle-termination drain is accepted only by an idle node, as the raylet
        decides; an accepted node takes no new work."""
        node = next((n for n in self.nodes.values() if n.node_id.hex() == node_id), None)
        if node is None:
            return True, ""  # gone already: nothing left to drain
        if node.busy:
            return False, "The node to be idle terminated is no longer idle."
        node.draining = True
        return True, ""

    def report_autoscaling_state(self, serialized_state: bytes) -> None:
        self.autoscaling_state = autoscaler_pb2.AutoscalingState.FromString(serialized_state)

    def state(self) -> Any:
        """`ClusterResourceState` for the autoscaler, built as the GCS builds it
        (`GcsAutoscalerStateManager`): the head and every worker node, dead nodes with
        ids and status only, tasks aggregated by shape and selector, one gang request
        per pending placement group."""
        return autoscaler_pb2.ClusterResourceState.FromString(self._state_bytes())

    def _state_bytes(self) -> bytes:
        """`state()` serialized. Built from each node's and each gang's own serialized
        parts, kept while they stay the same: the autoscaler reads the state every few
        seconds and building every node's message anew each time was most of a large
        cluster's run. Concatenated messages parse as one (repeated fields append)."""
        now = self.now()
        parts = [_node_state(node, now) for node in self._live_nodes()]
        # The GCS keeps reporting dead nodes, the newest 1,000 (Ray's default cache).
        for pod, node in list(self.dead.items())[-DEAD_NODES_KEPT:]:
            if pod not in self.nodes:
                parts.append(_field(STATE_NODES, _dead_node_state(node)))
        tasks: Counter[tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...]]] = (
            Counter()
        )
        demand = self.pending if self.reported_demand is None else self.reported_demand
        for work in demand:
            if work.is_gang:
                parts.append(work.gang_demand)
            else:
                bundle = work.bundles[0]
                tasks[
                    (
                        tuple(sorted(bundle.resources.items())),
                        tuple(sorted(bundle.selector.items())),
                    )
                ] += 1
        requests = autoscaler_pb2.ClusterResourceState()
        for (resources, selector), count in tasks.items():
            objects.add_task_demand(requests, dict(resources), count, dict(selector))
        parts.append(requests.SerializeToString())
        return b"".join(parts)


REPLY_STATE = 1
"""`GetClusterResourceStateReply.cluster_resource_state`."""
STATE_NODES = 3
"""`ClusterResourceState.node_states`."""
IDLE_DURATION_TAG = bytes([9 << 3])
"""`NodeState.idle_duration_ms` (field 9, a varint)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a message as a member of another."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _node_state(node: Node, now: float) -> bytes:
    """`NodeState` of a live node as a `node_states` member: its fixed part (a node's
    total resources and labels are set when it joins) and the part that changes with
    its resources and status, each kept until it changes, then the idle time."""
    if node.cached_fixed is None:
        message = autoscaler_pb2.NodeState()
        message.node_id = node.node_id
        message.instance_id = node.pod
        message.ray_node_type_name = node.group
        for key, value in node.total.items():
            message.total_resources[key] = value
        for key, label in node.labels.items():
            message.labels[key] = label
        node.cached_fixed = message.SerializeToString()
    if node.draining:
        status = autoscaler_pb2.NodeStatus.DRAINING
    elif node.idle_since_s is None:
        status = autoscaler_pb2.NodeStatus.RUNNING
    else:
        status = autoscaler_pb2.NodeStatus.IDLE
    changing_key = (tuple(node.available.items()), status)
    if node.cached_changing is None or node.cached_changing[0] != changing_key:
        message = autoscaler_pb2.NodeState()
        for key, value in node.available.items():
            if value > RESOURCE_EPSILON:
                message.available_resources[key] = value
        message.status = status
        encoded = node.cached_fixed + message.SerializeToString()
        if status != autoscaler_pb2.NodeStatus.IDLE:
            encoded = _field(STATE_NODES, encoded)
        node.cached_changing = (changing_key, encoded)
    if status != autoscaler_pb2.NodeStatus.IDLE or node.idle_since_s is None:
        return node.cached_changing[1]
    idle_ms = max(1, int((now - node.idle_since_s) * 1000))
    return _field(STATE_NODES, node.cached_changing[1] + IDLE_DURATION_TAG + _varint(idle_ms))


def _dead_node_state(node: Node) -> bytes:
    if node.cached_dead is None:
        message = autoscaler_pb2.NodeState()
        message.node_id = node.node_id
        message.instance_id = node.pod
        message.ray_node_type_name = node.group
        message.status = autoscaler_pb2.NodeStatus.DEAD
        node.cached_dead = message.SerializeToString()
    return node.cached_dead
