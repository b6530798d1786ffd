"""Warm slices: per group, `ScarcitySettings.warm_replicas` idle slices kept ready
beyond demand, for shapes whose provisioning is slow or scarce. They are idle on
purpose: arriving demand lands on them like on any replica (and they are then
replenished), and idle removal never takes a group below its buffer.

A replica is spare when nothing was placed on it this pass and it is ready and idle
(running, every host idle), or on its way (requested or pending, or launched by this
pass). The buffer launches while a group has fewer spare replicas than it asks for,
within the group's limits (maxReplicas, the cluster's max worker hosts, backoff).
Idle removal keeps that many of the group's ready spare replicas and removes the
longest idle of the rest, as without a buffer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tpu_autoscaler.core.snapshot import Replica, ReplicaState

if TYPE_CHECKING:  # the ledger's module reaches health, which gives back gang slices
    # short of the buffer (`ready_spare`)
    from tpu_autoscaler.core.policy.ledger import Ledger
    from tpu_autoscaler.core.slots import SlotReplica

WARM_REASON = "warm buffer"


def ready_spare(replica: Replica, removed: set[str], used: set[str]) -> bool:
    """Running, every host registered and idle, nothing placed on it this pass."""
    return (
        replica.state is ReplicaState.RUNNING
        and replica.name not in removed
        and replica.name not in used
        and bool(replica.hosts)
        and all(h.registered and h.idle_s > 0 for h in replica.hosts)
    )


def spare_counts(
    replicas: Iterable[Replica],
    ledger: Ledger,
    removed: set[str],
    used: set[str],
    new_replicas: Iterable[SlotReplica],
) -> dict[str, tuple[int, int]]:
    """Per group with a buffer: (ready spare, spare on its way)."""
    counts: dict[str, tuple[int, int]] = {
        g: (0, 0) for g, s in ledger.groups.items() if s.shape.scarcity.warm_replicas
    }
    if not counts:
        return counts  # no group keeps a buffer (most clusters): no replica to count
    for replica in replicas:
        if replica.group not in counts or replica.name in removed or replica.name in used:
            continue
        ready, coming = counts[replica.group]
        if ready_spare(replica, removed, used):
            counts[replica.group] = (ready + 1, coming)
        elif replica.state in (ReplicaState.REQUESTED, ReplicaState.PENDING):
            counts[replica.group] = (ready, coming + 1)
    used_new: dict[str, int] = {}
    for slot in new_replicas:
        if slot.new and slot.name in used:
            used_new[slot.group] = used_new.get(slot.group, 0) + 1
    for group, (ready, coming) in counts.items():
        # Withdrawn launches stay in the world but not in `new`: count from the ledger.
        unused_new = ledger.groups[group].new - used_new.get(group, 0)
        counts[group] = (ready, coming + max(0, unused_new))
    return counts


def top_up_warm(
    replicas: Iterable[Replica],
    ledger: Ledger,
    removed: set[str],
    used: set[str],
    new_replicas: Iterable[SlotReplica],
) -> None:
    """Launch what each group's buffer lacks, within the group's limits."""
    for group, (ready, coming) in spare_counts(
        replicas, ledger, removed, used, new_replicas
    ).items():
        warm = ledger.groups[group].shape.scarcity.warm_replicas
        missing = warm - ready - coming
        if missing <= 0:
            continue
        limit, _ = ledger.limit(group)
        count = min(missing, limit)
        if count > 0:
            ledger.launch(
                group,
                count,
                f"{WARM_REASON}: keeps {warm} idle slice(s) ready, has {ready + coming}",
            )


def idle_removals_allowed(
    replicas: Iterable[Replica], ledger: Ledger, removed: set[str], used: set[str]
) -> dict[str, int]:
    """Per group with a buffer, how many of its ready spare replicas idle removal may
    take: those beyond the buffer."""
    ready: dict[str, int] = {
        g: 0 for g, s in ledger.groups.items() if s.shape.scarcity.warm_replicas
    }
    if not ready:
        return ready  # no group keeps a buffer: nothing to count
    for replica in replicas:
        if replica.group in ready and ready_spare(replica, removed, used):
            ready[replica.group] += 1
    return {g: max(0, n - ledger.groups[g].shape.scarcity.warm_replicas) for g, n in ready.items()}
