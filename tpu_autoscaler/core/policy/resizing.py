"""Running pods grown in place for tasks, actors and PACK/SPREAD gangs without TPUs
(what `nodes.py` serves), as Ray 2.60's scheduler grows them
(`ResourceDemandScheduler._try_schedule`, between the existing nodes and the new
ones): once the nodes at their current size are full, every pod of a `ray.io/ippr`
group that may still grow (`PodSize.can_grow`) is counted at its maximum, and the
best-scored of them take what of the rest fits, each once; each that took something
is resized to the maximum (not to what it took), the others stay as they are. A pod
being resized counts at the size it was asked for.

Hosts not up yet (pending pods, replicas requested or launched) already count at
the maximum (`SliceShape.launch_resources`), so only registered hosts are grown here.
TPU slices never resize: shapes with TPUs carry no bounds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from tpu_autoscaler.core.demand import ResourceDemand
from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.plan import Resize
from tpu_autoscaler.core.resize import CPU, MEMORY, PodSize, ResizeBounds
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import HostCapacity, SlotHost
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState

Placed = list[tuple[SlotHost, tuple[int, ...]]]
"""Hosts that took work, each with how many copies of each request it took."""


def offered_while_resizing(host: Host, shape: SliceShape, offered: HostCapacity) -> HostCapacity:
    """A registered host's capacity with a resize under way counted at the size asked
    for, as Ray counts it until the raylet is told."""
    size = host.size
    if shape.resize is None or size is None or not size.resizing:
        return offered
    host_labels, total, free = offered
    return host_labels, *_regrown(
        total, free, {CPU: size.desired_cpu, MEMORY: size.desired_memory_bytes}
    )


def _regrown(
    total: Mapping[str, float], free: Mapping[str, float], to: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Ray's `SchedulingNode.update_total_resources`: totals set, the change added to
    what is free (never below 0)."""
    new_total = dict(total)
    new_free = dict(free)
    for name, amount in to.items():
        delta = amount - total.get(name, 0.0)
        new_total[name] = max(0.0, amount)
        new_free[name] = max(0.0, free.get(name, 0.0) + delta)
    return new_total, new_free


class Growth:
    """The registered pods a pass may grow, and the resizes it decided."""

    def __init__(
        self, replicas: Iterable[Replica], shapes: Mapping[str, SliceShape], removed: set[str]
    ) -> None:
        self._growable: dict[tuple[str, int], tuple[Replica, Host, ResizeBounds]] = {}
        for replica in replicas:
            shape = shapes.get(replica.group)
            if (
                shape is None
                or shape.resize is None
                or replica.name in removed
                or replica.state is not ReplicaState.RUNNING
            ):
                continue
            for host in replica.hosts:
                if host.registered and host.size is not None:
                    self._growable[(replica.name, host.host_index)] = (replica, host, shape.resize)
        self.resizes: list[Resize] = []
        self._kept: list[tuple[SlotHost, Mapping[str, float], dict[str, float]]] = []
        """Hosts grown this pass, each with its total and free before: grown once only
        (a pod being resized is no candidate again, as in Ray)."""

    def mark(self) -> int:
        return len(self._kept)

    def rollback(self, mark: int) -> None:
        """Take back the growth since `mark` (a gang not kept whole), once the world
        has taken back what was placed."""
        while len(self._kept) > mark:
            slot, total, free = self._kept.pop()
            slot.total = total
            slot.free.clear()
            slot.free.update(free)
            self.resizes.pop()

    def full_hosts(self, ordered: Sequence[ResourceDemand], world: World) -> set[int]:
        """The growable hosts (by id) that fit none of the requests as they are: Ray
        sets such nodes aside before its first stage and lists them last after it."""
        if not self._growable:
            return set()
        return {
            id(slot)
            for slot in world.hosts
            if (slot.replica.name, slot.index) in self._growable
            and not any(slot.fits(r.bundle.resources) for r in ordered)
        }

    def serve(
        self,
        ordered: Sequence[ResourceDemand],
        world: World,
        placed_first: Sequence[SlotHost],
        full: set[int],
        place_on: Callable[[list[SlotHost]], Placed],
    ) -> None:
        """Grow the pods that may grow to their maximum, let `place_on` place what is
        left on them, and keep the growth of those that took something. They are tried
        in Ray's order of its nodes after the first stage: those that took work there
        (in the order they took it), then the others, those that were full last."""
        if not self._growable:
            return
        first = {id(slot): i for i, slot in enumerate(placed_first)}
        in_order = sorted(
            world.hosts,
            key=lambda slot: (
                (0, first[id(slot)]) if id(slot) in first else (1 + (id(slot) in full), 0)
            ),
        )
        grown: list[tuple[SlotHost, Mapping[str, float], dict[str, float], PodSize]] = []
        kept = {id(k[0]) for k in self._kept}
        for slot in in_order:
            if id(slot) in kept:
                continue
            found = self._growable.get((slot.replica.name, slot.index))
            if found is None or slot.replica.new:
                continue
            _, host, bounds = found
            size = host.size
            assert size is not None
            if not size.can_grow(bounds):
                continue
            before_total, before_free = slot.total, dict(slot.free)
            slot.total, free = _regrown(slot.total, slot.free, size.grown(bounds))
            slot.free.clear()
            slot.free.update(free)
            grown.append((slot, before_total, before_free, size))
        if not grown:
            return
        placed = {id(slot): taken for slot, taken in place_on([g[0] for g in grown])}
        for slot, before_total, before_free, size in grown:
            taken = placed.get(id(slot))
            if taken is None:
                slot.total = before_total
                slot.free.clear()
                slot.free.update(before_free)
                continue
            self._kept.append((slot, before_total, before_free))
            replica, host, bounds = self._growable[(slot.replica.name, slot.index)]
            wanted = [f"{n} x {r.bundle}" for r, n in zip(ordered, taken, strict=True) if n]
            self.resizes.append(
                Resize(
                    replica.group,
                    replica.name,
                    host.pod_name,
                    size.now(),
                    size.grown(bounds),
                    f"{', '.join(wanted)} fit once grown in place "
                    f"(its group's ray.io/ippr maximum); no new pod",
                )
            )
