"""The scratch capacity a planning pass places on: each replica (existing, or added
by the pass) and each of its hosts with free resources that only shrink as demand
is placed, and the hosts of a replica not up yet."""

from __future__ import annotations

from collections.abc import Mapping

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import RESOURCE_EPSILON, copies_that_fit, offered
from tpu_autoscaler.core.shape import SliceShape

HostCapacity = tuple[Mapping[str, str], Mapping[str, float], Mapping[str, float]]
"""A host's labels, total resources and free resources."""


NOTHING_ASKED: frozenset[str] = frozenset()

MIXED = object()
"""`SlotReplica.shared_label` of a replica whose hosts differ in that label."""


class SlotReplica:
    """A replica as the pass sees it: existing, or added by this pass (`new`)."""

    __slots__ = (
        "claimed",
        "group",
        "hosts",
        "index",
        "label_memo",
        "name",
        "new",
        "slice_name",
        "used",
    )

    def __init__(self, group: str, name: str, new: bool, slice_name: str | None) -> None:
        self.group = group
        self.name = name
        self.new = new
        self.slice_name = slice_name
        self.hosts: list[SlotHost] = []
        self.index = -1
        """Its place in the world's replica order."""
        self.used = False
        """Some demand was placed on it this pass: it must stay."""
        self.claimed = False
        """Reserved by a slice head bundle (stage one of slice_placement_group): its
        TPUs are held for the per-host gang that follows."""
        self.label_memo: dict[str, tuple[list[SlotHost], int, object]] | None = None
        """`shared_label` by label: its hosts (list and length) then, and the value;
        made on first use (most replicas of a pass are never asked)."""

    def shared_label(self, key: str) -> object:
        """The value of label `key` on every one of its hosts (None: none has it), or
        `MIXED`. Kept while its hosts are the same (a host's labels never change): a
        kept replica (`KeptReplica`) has the same hosts in every world that takes it,
        so a world indexing hosts by a label (`cursors.Matches`) steps slice by slice,
        not host by host, through what did not change."""
        hosts = self.hosts
        memo = self.label_memo
        if memo is None:
            memo = self.label_memo = {}
        known = memo.get(key)
        if known is not None and known[0] is hosts and known[1] == len(hosts):
            return known[2]
        values = {host.labels.get(key) for host in hosts}
        value = next(iter(values)) if len(values) == 1 else MIXED
        memo[key] = (hosts, len(hosts), value)
        return value


class SlotHost:
    __slots__ = ("asked", "free", "index", "labels", "position", "replica", "total")

    def __init__(
        self,
        replica: SlotReplica,
        index: int,
        host_labels: Mapping[str, str],
        total: Mapping[str, float],
        free: dict[str, float],
        position: int,
    ) -> None:
        self.replica = replica
        self.index = index
        self.labels = host_labels
        self.total = total
        self.free = free
        self.position = position
        """Its place in the world's host order."""
        self.asked: frozenset[str] = NOTHING_ASKED
        """The resources the demand placed on it this pass asks for: Ray scores a node
        with every request it scheduled there in one round (`_compute_score`)."""

    @property
    def untouched(self) -> bool:
        """Nothing uses its TPUs: a slice gang could still take it."""
        tpu = self.total.get(labels.TPU_RESOURCE, 0.0)
        return self.free.get(labels.TPU_RESOURCE, 0.0) + RESOURCE_EPSILON >= tpu

    def fits(self, resources: Mapping[str, float]) -> bool:
        free = self.free
        for name, amount in resources.items():
            have = free.get(name)
            if have is None:  # inline fast path: this runs per host tried
                have = offered(free, name)
            if have + RESOURCE_EPSILON < amount:
                return False
        return True

    def copies_that_fit(self, resources: Mapping[str, float]) -> int:
        return copies_that_fit(self.free, resources)

    def take(self, resources: Mapping[str, float], copies: int = 1) -> None:
        free, asked = self.free, self.asked
        new_ask = False
        for name, amount in resources.items():
            have = free.get(name)
            free[name] = (offered(free, name) if have is None else have) - amount * copies
            if amount > 0 and name not in asked:
                new_ask = True
        if new_ask:
            self.asked = asked.union([n for n, amount in resources.items() if amount > 0])
        self.replica.used = True


class KeptReplica:
    """One existing replica's `SlotReplica` and `SlotHost`s, built once from what its
    hosts offer (`capacity`) and kept between passes and plans (`Replica.memo`, via
    `policy.scratch`): a world that takes it again resets what a pass changes
    (`World.add_kept`) instead of building a host object per host per pass (two
    thirds of a pass at 1,024 slices). One world holds it at a time (`owner`)."""

    __slots__ = ("capacity", "hosts", "owner", "replica", "unset", "untouched")

    def __init__(self, replica: SlotReplica, capacity: list[HostCapacity]) -> None:
        self.replica = replica
        self.capacity = capacity
        # Free resources and positions are set by the world that takes it.
        self.hosts = [
            SlotHost(replica, index, host_labels, total, {}, -1)
            for index, (host_labels, total, _) in enumerate(capacity)
        ]
        self.owner: object | None = None
        """The world holding it until that world's `release`; None: free to take."""
        tpu = labels.TPU_RESOURCE
        self.untouched = all(
            free.get(tpu, 0.0) + RESOURCE_EPSILON >= total.get(tpu, 0.0)
            for _, total, free in capacity
        )
        """Its hosts' TPUs all free as offered (`SlotHost.untouched` of each, as a
        world that takes it sets them): a slice head may take it (`World`)."""
        self.unset = True
        """Its hosts' free resources not set yet (the first world sets them)."""


def fresh_hosts(shape: SliceShape, slice_name: str | None = None) -> list[HostCapacity]:
    """The hosts of a replica not up yet: full capacity (grown to the resize maximum
    where the group resizes in place), the labels Ray will give them."""
    hosts: list[HostCapacity] = []
    for i in range(shape.hosts_per_replica):
        total = shape.launch_resources(i, slice_name)
        hosts.append((shape.host_labels(i, slice_name), total, total))
    return hosts
