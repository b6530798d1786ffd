"""The simulated cluster every few seconds, into a run's measurements: its slices by
state (pending, running, partial, terminating), with the seconds partial slices held
chips; chips busy and idle; pending work."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.metrics import Metrics, Timeline
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Node

SAMPLE_PERIOD_S = 5.0


class Sampler:
    """Samples the pods of cluster `name` in `store` and the Ray nodes of `ray` into
    `metrics` and `timeline`; `ray_seen`: the pods whose raylet registered once."""

    def __init__(
        self,
        now: Callable[[], float],
        store: ObjectStore,
        namespace: str,
        name: str,
        shapes: Mapping[str, SliceShape],
        operator: KubeRayOperator,
        ray: SimRay,
        ray_seen: set[str],
        metrics: Metrics,
        timeline: Timeline,
    ) -> None:
        self.now = now
        self.store = store
        self.namespace = namespace
        self.name = name
        self.shapes = shapes
        self.operator = operator
        self.ray = ray
        self.ray_seen = ray_seen
        self.metrics = metrics
        self.timeline = timeline
        self._states: tuple[tuple[object, ...], dict[str, int]] | None = None
        """The last slice states counted, with what they were counted from."""
        self._node_chips: (
            tuple[tuple[int, ...], tuple[Node, ...], list[tuple[Node, int]]] | None
        ) = None
        """The nodes' chips per host, by the nodes' `id()`s (the nodes held)."""

    def _replica_state(self, shape: SliceShape, replica: str, members: list[dict[str, Any]]) -> str:
        """pending (being created, or coming up), running (every host in Ray),
        terminating (KubeRay deletes it whole), or partial: it holds chips but cannot
        run a slice-wide job and will not become whole by itself (a host missing or
        failed, or a host whose raylet left while others of the slice still run Ray;
        all of them gone is a drained slice about to be deleted)."""
        if any(p["metadata"].get("deletionTimestamp") for p in members):
            return "terminating"
        if replica in self.operator.creating or any(
            p["metadata"]["name"] in self.operator.creating for p in members
        ):
            return "pending"
        names = [p["metadata"]["name"] for p in members]
        up = sum(1 for n in names if n in self.ray.nodes)
        if up == shape.hosts_per_replica == len(members):
            return "running"
        if (
            len(members) < shape.hosts_per_replica
            or any(p["status"]["phase"] == "Failed" for p in members)
            or (up > 0 and any(n in self.ray_seen and n not in self.ray.nodes for n in names))
        ):
            return "partial"
        return "pending"

    def sample(self) -> None:
        states = self._replica_states()
        self.metrics.partial_slice_seconds += SAMPLE_PERIOD_S * states["partial"]
        busy, idle, idle_by_group = self._chips()
        for group, chips in idle_by_group.items():
            by_group = self.metrics.idle_chip_seconds_by_group
            by_group[group] = by_group.get(group, 0.0) + chips * SAMPLE_PERIOD_S
        self.metrics.busy_chip_seconds += busy * SAMPLE_PERIOD_S
        self.metrics.idle_chip_seconds += idle * SAMPLE_PERIOD_S
        timeline = self.timeline
        timeline.t_s.append(self.now())
        for state in ("pending", "running", "partial"):
            timeline.slices[state].append(states[state])
        timeline.chips_busy.append(busy)
        timeline.chips_idle.append(idle)
        timeline.pending.append(len(self.ray.pending))

    def _replica_states(self) -> dict[str, int]:
        """How many slices are in each state. The same as at the last sample while
        nothing it is made of has changed: no write to the store (its version), the
        same replicas being created, the same pods with a Ray node, and no raylet
        registered for the first time (`ray_seen` only grows). Most samples of a
        large cluster find it so, and each walked every pod."""
        key = (
            self.store.version,
            frozenset(self.operator.creating),
            tuple(self.ray.nodes),
            len(self.ray_seen),
        )
        if self._states is not None and self._states[0] == key:
            return self._states[1]
        pods = self.store.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name})
        replicas: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            meta = pod["metadata"]["labels"]
            shape = self.shapes.get(meta[labels.KUBERAY_GROUP])
            replica_key = (
                meta.get(labels.KUBERAY_REPLICA_NAME)
                or (
                    shape is not None
                    and shape.hosts_per_replica > 1
                    and meta.get(labels.WEBHOOK_REPLICA_INDEX)
                )
                or pod["metadata"]["name"]
            )
            replicas[(meta[labels.KUBERAY_GROUP], replica_key)].append(pod)
        states: dict[str, int] = defaultdict(int)
        for (group, replica), members in replicas.items():
            shape = self.shapes.get(group)
            if shape is None:
                continue
            states[self._replica_state(shape, replica, members)] += 1
        self._states = (key, states)
        return states

    def _chips(self) -> tuple[int, int, dict[str, int]]:
        """Chips of Ray nodes busy, idle, and idle by group. The nodes' chips are
        looked up again only when the nodes change (the same objects: their use
        changes in place)."""
        nodes = tuple(self.ray.nodes.values())
        known = self._node_chips
        if known is None or known[0] != tuple(map(id, nodes)):
            chips = [(node, int(self.shapes[node.group].chips_per_host)) for node in nodes]
            known = self._node_chips = (tuple(map(id, nodes)), nodes, chips)
        busy = idle = 0
        idle_by_group: dict[str, int] = {}
        for node, chips_per_host in known[2]:
            if node.idle_since_s is None:
                busy += chips_per_host
            else:
                idle += chips_per_host
                idle_by_group[node.group] = idle_by_group.get(node.group, 0) + chips_per_host
        return busy, idle, idle_by_group
