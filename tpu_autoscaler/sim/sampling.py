"""The simulated cluster every few seconds, into a run's measurements: its slices by
state (pending, running, partial, terminating), with the seconds partial slices held
chips; chips busy and idle; chips of VMs up without a Ray node; pending work."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.metrics import Metrics, Timeline
from tpu_autoscaler.sim.provisioning import LingeringSlice
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Node

SAMPLE_PERIOD_S = 5.0


class _HeldNode(NamedTuple):
    """A worker node as the sampler last saw it: its place among the nodes (their
    order in `SimRay.nodes`, which only ever appends) and whether it was busy."""

    node: Node
    place: int
    busy: bool


@dataclass
class _GroupChips:
    """The held nodes of one group: how many, how many busy, and the places of the
    idle ones (a heap, with entries of nodes since busy or gone left in it)."""

    chips_per_host: int
    hosts: int = 0
    busy: int = 0
    idle_places: list[tuple[int, str]] = field(default_factory=list)


class ChipCounts(NamedTuple):
    """The chips of Ray nodes at a sample."""

    busy: int
    idle: int
    idle_by_group: dict[str, int]
    """In the order of each group's first idle node."""
    busy_by_group: dict[str, int]
    """By group name; groups with no busy chips left out."""


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
        vms_up: Set[str] = frozenset(),
        lingering: Sequence[LingeringSlice] = (),
    ) -> None:
        """`vms_up`: the pods whose VM is up (`GkeProvisioning.vms_up`, read as it
        changes; a VM comes or goes with a write of its pod); `lingering`: slices' VMs
        kept after their pods went (`GkeProvisioning.lingering`, read as it changes)."""
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
        self.vms_up = vms_up
        self.lingering = lingering
        self._unregistered: dict[str, str] = {}
        """Kept: the cluster's pods with a VM up and no Ray node, and their groups."""
        self._unregistered_chips: dict[str, int] = {}
        self._unregistered_dirty: set[str] = set()
        """Pods whose VM, Ray node or place in the store changed since the last count."""
        self._incremental = type(store) is ObjectStore
        """Slice states kept from sample to sample, told of every pod written by the
        store's watchers (another store, such as one mirroring a real server, is
        counted from its pods whenever anything changed)."""
        self._states: tuple[tuple[object, ...], dict[str, int]] | None = None
        """Not kept: the last slice states counted, with what they were counted from."""
        self._members: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        """Kept: the cluster's pods by (group, replica), by name."""
        self._replica_by_pod: dict[str, tuple[str, str]] = {}
        self._by_replica_name: dict[str, set[tuple[str, str]]] = {}
        """The (group, replica)s under a replica name, as `creating` names them."""
        self._state: dict[tuple[str, str], str] = {}
        """Each counted replica's state, as in `_counts`."""
        self._counts: dict[str, int] = defaultdict(int)
        self._dirty: set[tuple[str, str]] = set()
        """Replicas whose state may have changed since the last count."""
        self._creating_seen: set[str] = set()
        self._nodes_seen: set[str] = set()
        self._node_arrivals = ray.scheduler.watch() if self._incremental else {}
        """The worker nodes that came or went (or were written) since the last count."""
        self._ray_seen_seen: set[str] = set()
        if self._incremental:
            for pod in store.list_pods(namespace, {labels.KUBERAY_CLUSTER: name}):
                self._on_store_change("Pod", pod)
            store.watchers.append(self._on_store_change)
        self._node_changes = ray.scheduler.watch()
        """The worker nodes that came, went or were written since the last sample."""
        self._held_nodes: dict[str, _HeldNode] = {}
        """The worker nodes as last sampled, by pod, in `ray.nodes`' order."""
        self._node_places = itertools.count()
        self._group_chips: dict[str, _GroupChips] = {}
        """The held nodes' hosts, busy hosts and idle places by group."""

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
        busy, idle, idle_by_group, busy_by_group = self._chips()
        for counted, by_group in (
            (idle_by_group, self.metrics.idle_chip_seconds_by_group),
            (busy_by_group, self.metrics.busy_chip_seconds_by_group),
        ):
            for group, chips in counted.items():
                by_group[group] = by_group.get(group, 0.0) + chips * SAMPLE_PERIOD_S
        self.metrics.busy_chip_seconds += busy * SAMPLE_PERIOD_S
        self.metrics.idle_chip_seconds += idle * SAMPLE_PERIOD_S
        unregistered = self.metrics.unregistered_chip_seconds_by_group
        for group, chips in self._unregistered_by_group().items():
            unregistered[group] = unregistered.get(group, 0.0) + chips * SAMPLE_PERIOD_S
            self.metrics.unregistered_chip_seconds += chips * SAMPLE_PERIOD_S
        timeline = self.timeline
        timeline.t_s.append(self.now())
        for state in ("pending", "running", "partial"):
            timeline.slices[state].append(states[state])
        timeline.chips_busy.append(busy)
        timeline.chips_idle.append(idle)
        timeline.pending.append(len(self.ray.pending))

    def _replica_states(self) -> dict[str, int]:
        """How many slices are in each state: the counts kept from the last sample,
        with the slices recounted whose state may have changed since. Walking every
        pod of a large cluster per sample was most of a sample."""
        if not self._incremental:
            key = (
                self.store.version,
                frozenset(self.operator.creating),
                tuple(self.ray.nodes),
                len(self.ray_seen),
            )
            if self._states is not None and self._states[0] == key:
                return self._states[1]
            self._states = (key, self.count_from_pods())
            return self._states[1]
        self._note_world_changes()
        for replica in self._dirty:
            old = self._state.pop(replica, None)
            if old is not None:
                self._counts[old] -= 1
            members = self._members.get(replica)
            shape = self.shapes.get(replica[0])
            if members and shape is not None:
                new = self._replica_state(shape, replica[1], list(members.values()))
                self._state[replica] = new
                self._counts[new] += 1
        self._dirty.clear()
        return self._counts

    def count_from_pods(self) -> dict[str, int]:
        """The slices in each state counted from every pod of the cluster, as the kept
        counts must be."""
        replicas: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for pod in self.store.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name}):
            replicas[self._replica_of_pod(pod)].append(pod)
        states: dict[str, int] = defaultdict(int)
        for (group, replica), members in replicas.items():
            shape = self.shapes.get(group)
            if shape is None:
                continue
            states[self._replica_state(shape, replica, members)] += 1
        return states

    def _replica_of_pod(self, pod: dict[str, Any]) -> tuple[str, str]:
        """(group, replica) of a pod: KubeRay's replica name, else the webhook's replica
        index for a multi-host group, else the pod alone."""
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
        return (meta[labels.KUBERAY_GROUP], replica_key)

    # --- the kept counts: what changed since the last sample ---------------------------

    def _on_store_change(self, kind: str, obj: dict[str, Any]) -> None:
        """A pod was written or went: its slice (before and after) is counted again at
        the next sample. The stored version is read back rather than `obj`, as another
        watcher may have written the pod again before this one heard of `obj`."""
        if kind != "Pod" or obj["metadata"].get("namespace") != self.namespace:
            return
        name = obj["metadata"]["name"]
        self._unregistered_dirty.add(name)
        stored = self.store.pod(self.namespace, name)
        before = self._replica_by_pod.get(name)
        if (
            before is not None
            and stored is not None
            and self._members[before][name]["metadata"].get("labels")
            is stored["metadata"].get("labels")
        ):
            # A write to the pod that kept its labels (as every write of this store
            # does): the same replica, its members' order aside (no count reads it).
            self._members[before][name] = stored
            self._dirty.add(before)
            return
        self._replica_by_pod.pop(name, None)
        if before is not None:
            members = self._members[before]
            del members[name]
            if not members:
                del self._members[before]
                self._by_replica_name[before[1]].discard(before)
            self._dirty.add(before)
        if stored is None or stored["metadata"]["labels"].get(labels.KUBERAY_CLUSTER) != self.name:
            return
        replica = self._replica_of_pod(stored)
        self._replica_by_pod[name] = replica
        self._members.setdefault(replica, {})[name] = stored
        self._by_replica_name.setdefault(replica[1], set()).add(replica)
        self._dirty.add(replica)

    def _note_world_changes(self) -> None:
        """Slices to count again for what is not in the store: replicas (or pods)
        KubeRay started or stopped creating, raylets that came or went, raylets
        registered for the first time."""
        changed: set[str] = set()
        creating = self.operator.creating
        if creating != self._creating_seen:
            changed |= creating ^ self._creating_seen
            self._creating_seen = set(creating)
        nodes = self.ray.nodes
        seen = self._nodes_seen
        for pod, came_or_went in self._node_arrivals.items():
            if came_or_went and (pod in nodes) != (pod in seen):
                changed.add(pod)
                if pod in seen:
                    seen.discard(pod)
                else:
                    seen.add(pod)
        self._node_arrivals.clear()
        if len(nodes) != len(seen):  # changed by hand (tests), past the ledger
            changed |= nodes.keys() ^ seen
            self._nodes_seen = set(nodes)
        if len(self.ray_seen) != len(self._ray_seen_seen):
            changed |= self.ray_seen ^ self._ray_seen_seen
            self._ray_seen_seen = set(self.ray_seen)
        self._unregistered_dirty |= changed
        for name in changed:
            replica = self._replica_by_pod.get(name)
            if replica is not None:
                self._dirty.add(replica)
            self._dirty.update(self._by_replica_name.get(name, ()))

    # --- chips of VMs up without a Ray node ---------------------------------------------

    def _unregistered_by_group(self) -> dict[str, int]:
        """Chips of the cluster's pods whose VM is up (billed) but that have no Ray
        node, by group (groups with none left out): hosts booting (image pull, init
        containers, raylet start), drained hosts until their pods go, failed hosts
        until their slice is replaced, deleted pods in their grace period; and the
        VMs of slices whose pods went, for the scale-down delay. Kept from
        sample to sample, moved by the pods whose VM, node or pod changed (called
        after `_replica_states`, which hears of the nodes that came or went);
        `unregistered_from_pods` walks them."""
        if not self._incremental:
            return self.unregistered_from_pods()
        kept = self._unregistered
        chips_by_group = self._unregistered_chips
        for pod in self._unregistered_dirty:
            was = kept.pop(pod, None)
            if was is not None:
                chips_by_group[was] -= int(self.shapes[was].chips_per_host)
            replica = self._replica_by_pod.get(pod)
            if replica is None or pod not in self.vms_up or pod in self.ray.nodes:
                continue
            shape = self.shapes.get(replica[0])
            if shape is not None and shape.chips_per_host:
                kept[pod] = replica[0]
                chips_by_group[replica[0]] = chips_by_group.get(replica[0], 0) + int(
                    shape.chips_per_host
                )
        self._unregistered_dirty.clear()
        counted = {g: chips for g, chips in chips_by_group.items() if chips}
        return self._with_lingering(counted)

    def _with_lingering(self, chips_by_group: dict[str, int]) -> dict[str, int]:
        """`chips_by_group` with the chips of slices' VMs kept after their pods went,
        sorted by group."""
        for kept in self.lingering:
            chips = kept.hosts * int(self.shapes[kept.group].chips_per_host)
            if chips:
                chips_by_group[kept.group] = chips_by_group.get(kept.group, 0) + chips
        return dict(sorted(chips_by_group.items()))

    def unregistered_from_pods(self) -> dict[str, int]:
        """`_unregistered_by_group` from a walk of every pod, as the kept counts must
        give it."""
        chips_by_group: dict[str, int] = {}
        for pod in self.store.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name}):
            name = pod["metadata"]["name"]
            shape = self.shapes.get(pod["metadata"]["labels"].get(labels.KUBERAY_GROUP, ""))
            if name in self.vms_up and name not in self.ray.nodes and shape is not None:
                chips = int(shape.chips_per_host)
                if chips:
                    chips_by_group[shape.group] = chips_by_group.get(shape.group, 0) + chips
        return self._with_lingering(chips_by_group)

    def _chips(self) -> ChipCounts:
        """Chips of Ray nodes busy, idle, idle by group (the groups in the order of
        their first idle node) and busy by group (by name). Kept from sample to
        sample, moved by the nodes that came, went or were written since (the
        scheduler's ledger): a walk of every node per sample was most of a sample.
        `chips_from_nodes` walks them."""
        self._follow_nodes()
        busy = idle = 0
        idle_groups: list[tuple[int, str, int]] = []
        busy_by_group: dict[str, int] = {}
        held = self._held_nodes
        for group, chips in self._group_chips.items():
            busy += chips.busy * chips.chips_per_host
            if chips.busy and chips.chips_per_host:
                busy_by_group[group] = chips.busy * chips.chips_per_host
            if chips.busy < chips.hosts:
                places = chips.idle_places
                while True:  # the first idle node's place: drop entries gone stale
                    place, pod = places[0]
                    now = held.get(pod)
                    if now is not None and now.place == place and not now.busy:
                        break
                    heapq.heappop(places)
                if len(places) > 2 * chips.hosts + 16:
                    chips.idle_places = places = self._idle_places(group)
                idle_chips = (chips.hosts - chips.busy) * chips.chips_per_host
                idle += idle_chips
                idle_groups.append((place, group, idle_chips))
        idle_by_group = {group: chips for _, group, chips in sorted(idle_groups)}
        return ChipCounts(busy, idle, idle_by_group, dict(sorted(busy_by_group.items())))

    def chips_from_nodes(self) -> ChipCounts:
        """`_chips` from a walk of every node, as the kept counts must give it."""
        busy = idle = 0
        first_idle: dict[str, int] = {}
        idle_chips: dict[str, int] = {}
        busy_chips: dict[str, int] = {}
        for at, node in enumerate(self.ray.nodes.values()):
            chips_per_host = int(self.shapes[node.group].chips_per_host)
            if node.busy:
                busy += chips_per_host
                if chips_per_host:
                    busy_chips[node.group] = busy_chips.get(node.group, 0) + chips_per_host
            else:
                idle += chips_per_host
                first_idle.setdefault(node.group, at)
                idle_chips[node.group] = idle_chips.get(node.group, 0) + chips_per_host
        return ChipCounts(
            busy,
            idle,
            {g: idle_chips[g] for g in sorted(first_idle, key=first_idle.__getitem__)},
            dict(sorted(busy_chips.items())),
        )

    def _follow_nodes(self) -> None:
        """The held nodes moved on to `ray.nodes` as they are, from the ledger of
        those that changed; all held again if the ledger cannot tell (nodes added,
        removed or replaced by hand, or a node that keeps its place replaced)."""
        nodes = self.ray.nodes
        changes = self._node_changes
        if not changes and len(nodes) == len(self._held_nodes):
            return
        held = self._held_nodes
        arrived: list[str] = []
        for pod, came_or_went in changes.items():
            was = held.get(pod)
            node = nodes.get(pod)
            if was is not None:
                if not came_or_went and was.node is node:
                    if node.busy != was.busy:
                        self._release_node(pod, was)
                        self._hold_node(pod, node, was.place)
                    continue
                self._release_node(pod, was)
            if node is not None:
                arrived.append(pod)
        changes.clear()
        if arrived:
            # New keys go to the end of a dict: the nodes that came since are its last.
            last = list(islice(reversed(nodes), len(arrived)))
            if set(last) != set(arrived):
                self._hold_all_nodes()
                return
            for pod in reversed(last):
                self._hold_node(pod, nodes[pod], next(self._node_places))
        if len(nodes) != len(held):
            self._hold_all_nodes()

    def _idle_places(self, group: str) -> list[tuple[int, str]]:
        """The places of the held idle nodes of `group`, as a heap without stale entries
        (a node busy and idle again, over and over, would grow it without end)."""
        places = [
            (held.place, pod)
            for pod, held in self._held_nodes.items()
            if held.node.group == group and not held.busy
        ]
        heapq.heapify(places)
        return places

    def _hold_all_nodes(self) -> None:
        self._held_nodes = {}
        self._group_chips = {}
        self._node_changes.clear()
        for pod, node in self.ray.nodes.items():
            self._hold_node(pod, node, next(self._node_places))

    def _hold_node(self, pod: str, node: Node, place: int) -> None:
        chips = self._group_chips.get(node.group)
        if chips is None:
            chips_per_host = int(self.shapes[node.group].chips_per_host)
            chips = self._group_chips[node.group] = _GroupChips(chips_per_host)
        busy = node.busy
        self._held_nodes[pod] = _HeldNode(node, place, busy)
        chips.hosts += 1
        if busy:
            chips.busy += 1
        else:
            heapq.heappush(chips.idle_places, (place, pod))

    def _release_node(self, pod: str, was: _HeldNode) -> None:
        del self._held_nodes[pod]
        chips = self._group_chips[was.node.group]
        chips.hosts -= 1
        if was.busy:
            chips.busy -= 1
        if not chips.hosts:
            del self._group_chips[was.node.group]
