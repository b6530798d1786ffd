"""The capacity a pass places demand on: a scratch copy of every usable replica's
hosts (`World`), and a second one of total capacity for `request_resources`.

Nodes that are no replica (the head) enter first, then replicas running, pending,
requested, oldest first, so demand lands on what exists before anything new. Hosts
not up yet carry the capacity and labels Ray will give them; hosts that joined Ray
moments ago offer their total (`health`)."""

from __future__ import annotations

from collections.abc import Iterable

from tpu_autoscaler.core.placement import World
from tpu_autoscaler.core.policy.health import settling
from tpu_autoscaler.core.policy.resizing import offered_while_resizing
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.slots import HostCapacity, SlotReplica, fresh_hosts
from tpu_autoscaler.core.snapshot import Host, PolicyConfig, Replica, ReplicaState

FIXED_GROUP = ""
"""The group of a node that is no replica (the head): no group's ledger has it."""

_STATE_ORDER = {ReplicaState.RUNNING: 0, ReplicaState.PENDING: 1, ReplicaState.REQUESTED: 2}


class Scratch:
    def __init__(self, constrained: bool) -> None:
        self.world = World()
        self.capacity_world = World()
        """Total capacity, for `request_resources`; built only when there are any."""
        self.constrained = constrained
        self.slice_names: set[str] = set()
        """Slices that exist (by `TPU_NAME`): what a pinned bundle can name."""

    def add_fixed(self, hosts: Iterable[Host]) -> None:
        """Nodes that are no replica (the head): capacity that exists, first in line.
        Each is a replica of its own that no group owns, so nothing removes it."""
        for host in hosts:
            offered = [(host.labels, host.total, host.available)]
            self.world.add_replica(SlotReplica(FIXED_GROUP, host.pod_name, False, None), offered)
            if self.constrained:
                capacity = [(host.labels, host.total, host.total)]
                self.capacity_world.add_replica(
                    SlotReplica(FIXED_GROUP, host.pod_name, False, None), capacity
                )

    def add_existing(
        self,
        usable: Iterable[Replica],
        shapes: dict[str, SliceShape],
        config: PolicyConfig,
        now_s: float,
    ) -> None:
        for replica in sorted(
            usable, key=lambda r: (_STATE_ORDER[r.state], r.created_at_s, r.name)
        ):
            if replica.slice_name:
                self.slice_names.add(replica.slice_name)
            hosts = self._hosts(replica, shapes[replica.group], config, now_s)
            self.world.add_replica(
                SlotReplica(replica.group, replica.name, False, replica.slice_name), hosts
            )
            if self.constrained:
                capacity = [(labels, total, total) for labels, total, _ in hosts]
                self.capacity_world.add_replica(
                    SlotReplica(replica.group, replica.name, False, replica.slice_name), capacity
                )

    def _hosts(
        self, replica: Replica, shape: SliceShape, config: PolicyConfig, now_s: float
    ) -> list[HostCapacity]:
        # `Host.registered`, inlined: this runs for every host of every replica.
        real = {h.host_index: h for h in replica.hosts if h.node_id is not None and not h.dead}
        if not real:  # nothing up yet (a requested replica): every host synthesized
            return list(self._synthesized(replica, shape))
        settled = not settling(replica, config, now_s)

        def offered(host: Host) -> HostCapacity:
            capacity = (host.labels, host.total, host.available if settled else host.total)
            return offered_while_resizing(host, shape, capacity)

        if len(real) == shape.hosts_per_replica:
            if shape.resize is None:  # `offered` without a call per host: nothing resizes
                return [
                    (h.labels, h.total, h.available if settled else h.total)
                    for _, h in sorted(real.items())
                ]
            return [offered(h) for _, h in sorted(real.items())]
        synthesized = self._synthesized(replica, shape)
        return [offered(real[i]) if i in real else host for i, host in enumerate(synthesized)]

    def _synthesized(self, replica: Replica, shape: SliceShape) -> list[HostCapacity]:
        """Hosts not up yet count at full capacity with the labels Ray will give them."""
        if replica.slice_name is not None:
            return fresh_hosts(shape, replica.slice_name)
        return self.world.fresh(shape)

    def add_new(self, shape: SliceShape, name: str) -> list[SlotReplica]:
        """A replica this pass launches, in every world it keeps."""
        added = [self.world.add_new_replica(shape, name)]
        if self.constrained:
            added.append(self.capacity_world.add_new_replica(shape, name))
        return added

    def release(self) -> None:
        """The pass is over: its worlds' hosts and replicas may go (`World.release`)."""
        self.world.release()
        self.capacity_world.release()

    def used(self) -> set[str]:
        """Replicas some demand was placed on this pass: none of them may go."""
        used = {r.name for r in self.world.replicas if r.used}
        used |= {r.name for r in self.capacity_world.replicas if r.used}
        return used
