"""Ray in the simulator: a node per running pod with the resources and labels Ray
derives from the pod's environment, work placed the way Ray places it (label
selectors, the four placement-group strategies, both stages of
`slice_placement_group`), and the `ClusterResourceState` the GCS would report.

Placement here is written independently of the policy's, so the simulator checks
the policy against a second opinion rather than against itself."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.core.generated import autoscaler_pb2

from tpu_autoscaler import labels
from tpu_autoscaler.demand import RESOURCE_EPSILON, GangStrategy
from tpu_autoscaler.shapes import SliceShape
from tpu_autoscaler.sim import objects


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

    @property
    def busy(self) -> bool:
        return self.idle_since_s is None

    def fits(self, resources: Mapping[str, float]) -> bool:
        return all(self.available.get(k, 0.0) + RESOURCE_EPSILON >= v for k, v in resources.items())


@dataclass
class Bundle:
    resources: dict[str, float]
    selector: dict[str, str] = field(default_factory=dict)

    def matches(self, node: Node) -> bool:
        return all(node.labels.get(k) == v for k, v in self.selector.items())


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
    """For slice_placement_group's first stage: what to ask for next."""
    holds: Work | None = None
    """A first stage kept reserved until this work finishes."""
    finishes: bool = True

    @property
    def is_gang(self) -> bool:
        return self.strategy is not None

    @property
    def kind(self) -> object:
        """Equal for work that asks for the same thing the same way."""
        bundles = tuple(
            (tuple(sorted(b.resources.items())), tuple(sorted(b.selector.items())))
            for b in self.bundles
        )
        return (self.strategy, bundles)


DEAD_NODES_KEPT = 1000


class SimRay:
    def __init__(
        self, now: Callable[[], float], schedule_after: Callable[[float, Callable[[], None]], None]
    ) -> None:
        self.now = now
        self.schedule_after = schedule_after
        self.nodes: dict[str, Node] = {}
        self.dead: dict[str, Node] = {}
        self.pending: list[Work] = []
        self.running: dict[str, Work] = {}
        self.finished: list[Work] = []
        self._ids = itertools.count()
        self.autoscaling_state: Any = None
        """The last state an autoscaler reported, as `ray status` would read it."""

    # --- nodes ---------------------------------------------------------------------

    def add_node(self, pod: Mapping[str, Any], shape: SliceShape, host_index: int) -> None:
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        slice_name = env.get(labels.ENV_TPU_NAME)
        total = shape.host_resources(host_index, slice_name)
        name = pod["metadata"]["name"]
        self.nodes[name] = Node(
            pod=name,
            group=shape.group,
            labels=shape.host_labels(host_index, slice_name),
            total=dict(total),
            available=dict(total),
            idle_since_s=self.now(),
            node_id=hashlib.sha1(name.encode()).digest()[:28],
        )
        self.schedule()

    def remove_node(self, pod: str) -> list[Work]:
        """The node's raylet is gone; work on it is retried, as Ray retries tasks and
        reschedules placement groups. Returns the work that was running there."""
        node = self.nodes.pop(pod, None)
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
        self.schedule()
        return hit

    # --- work ----------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        self.pending.append(work)
        self.schedule()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def schedule(self) -> None:
        still: list[Work] = []
        # Capacity only shrinks within a round: a kind of work that did not fit once
        # will not fit again until something is released.
        failed: set[object] = set()
        for work in self.pending:
            kind = work.kind
            if kind in failed:
                still.append(work)
                continue
            if self._place(work):
                work.placed_s = self.now()
                self.running[work.work_id] = work
                if work.on_placed is not None:
                    work.on_placed(work)
                if work.finishes:
                    self.schedule_after(work.duration_s, self._finisher(work))
            else:
                failed.add(kind)
                still.append(work)
        self.pending = [w for w in still if w.work_id not in self.running]

    def _finisher(self, work: Work) -> Callable[[], None]:
        return lambda: self._finish(work)

    def _finish(self, work: Work) -> None:
        if self.running.get(work.work_id) is not work:
            return  # retried elsewhere after a node died; that run finishes it
        del self.running[work.work_id]
        self._release(work)
        self.finished.append(work)
        if work.holds is not None and work.holds.work_id in self.running:
            del self.running[work.holds.work_id]
            self._release(work.holds)
            self.finished.append(work.holds)
        self.schedule()

    def _release(self, work: Work) -> None:
        for pod, resources in work.placement:
            node = self.nodes.get(pod)
            if node is None:
                continue
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
        """First fit in registration order, as a stand-in for Ray's hybrid policy."""
        nodes = [n for n in self.nodes.values() if not n.draining]
        if not work.is_gang:
            bundle = work.bundles[0]
            node = next((n for n in nodes if bundle.matches(n) and n.fits(bundle.resources)), None)
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

    def _place_gang(self, work: Work, nodes: list[Node]) -> list[tuple[Node, Bundle]] | None:
        strategy = work.strategy
        if strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
            total: Counter[str] = Counter()
            for b in work.bundles:
                total.update(b.resources)
            for node in nodes:
                if all(b.matches(node) for b in work.bundles) and node.fits(total):
                    return [(node, b) for b in work.bundles]
            if strategy is GangStrategy.STRICT_PACK:
                return None
        free = {n.pod: dict(n.available) for n in nodes}
        chosen: list[tuple[Node, Bundle]] = []
        for bundle in work.bundles:
            used = {n.pod for n, _ in chosen}
            ordered = nodes
            if strategy in (GangStrategy.SPREAD, GangStrategy.STRICT_SPREAD):
                ordered = [n for n in nodes if n.pod not in used]
                if strategy is GangStrategy.SPREAD:
                    ordered += [n for n in nodes if n.pod in used]
            found = next(
                (
                    n
                    for n in ordered
                    if bundle.matches(n)
                    and all(
                        free[n.pod].get(k, 0.0) + RESOURCE_EPSILON >= v
                        for k, v in bundle.resources.items()
                    )
                ),
                None,
            )
            if found is None:
                return None
            for key, value in bundle.resources.items():
                free[found.pod][key] = free[found.pod].get(key, 0.0) - value
            chosen.append((found, bundle))
        return chosen

    # --- the GCS, as Ray's GcsClient offers it to autoscalers ----------------------------

    def get_cluster_resource_state(self) -> bytes:
        reply = autoscaler_pb2.GetClusterResourceStateReply()
        reply.cluster_resource_state.CopyFrom(self.state())
        return bytes(reply.SerializeToString())

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
        """`ClusterResourceState` for the autoscaler, built as the GCS builds it."""
        state = autoscaler_pb2.ClusterResourceState()
        now = self.now()
        for node in self.nodes.values():
            message = state.node_states.add()
            message.node_id = node.node_id
            message.instance_id = node.pod
            message.ray_node_type_name = node.group
            for key, value in node.total.items():
                message.total_resources[key] = value
            for key, value in node.available.items():
                if value > RESOURCE_EPSILON:
                    message.available_resources[key] = value
            for key, label in node.labels.items():
                message.labels[key] = label
            if node.draining:
                message.status = autoscaler_pb2.NodeStatus.DRAINING
            elif node.idle_since_s is None:
                message.status = autoscaler_pb2.NodeStatus.RUNNING
            else:
                message.status = autoscaler_pb2.NodeStatus.IDLE
                message.idle_duration_ms = int((now - node.idle_since_s) * 1000)
        # The GCS keeps reporting dead nodes, the newest 1,000 (Ray's default cache).
        for pod, node in list(self.dead.items())[-DEAD_NODES_KEPT:]:
            if pod not in self.nodes:
                message = state.node_states.add()
                message.node_id = node.node_id
                message.instance_id = node.pod
                message.ray_node_type_name = node.group
                message.status = autoscaler_pb2.NodeStatus.DEAD
        tasks: Counter[tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...]]] = (
            Counter()
        )
        for work in self.pending:
            if work.is_gang:
                objects.add_gang_demand(
                    state,
                    work.work_id,
                    [b.resources for b in work.bundles],
                    str(work.strategy),
                    [b.selector for b in work.bundles],
                )
            else:
                bundle = work.bundles[0]
                tasks[
                    (
                        tuple(sorted(bundle.resources.items())),
                        tuple(sorted(bundle.selector.items())),
                    )
                ] += 1
        for (resources, selector), count in tasks.items():
            objects.add_task_demand(state, dict(resources), count, dict(selector))
        return state
