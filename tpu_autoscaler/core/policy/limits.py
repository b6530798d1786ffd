"""Which replicas the configuration no longer allows: outdated ones (launched from a
configuration their group no longer has), then those above their group's maxReplicas
or the cluster's max worker hosts (a lowered limit, a group with max 0).

As Ray 2.60's scheduler (`_terminate_outdated_nodes`, `_enforce_max_workers_per_type`,
then `_global`): outdated first, per group next, then cluster-wide, the least useful
first: replicas not running Ray yet, then the longest idle, then the least used.
Replicas are removed whole; the minimum is not kept (a max below the min is the
user's to fix). Two rules of our own: a multi-host slice with a host in use is never
removed (its job spans every host; it waits until the slice is idle), and a replica
whose pods cannot be tied to a slice never is."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tpu_autoscaler.core.plan import RemovalCause, Terminate
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState
from tpu_autoscaler.core.units import Hosts

if TYPE_CHECKING:
    from tpu_autoscaler.core.policy.roster import Roster

RemovalOrder = tuple[bool, float, float, str]


def limit_removals(
    snapshot: ClusterSnapshot,
    shapes: Mapping[str, SliceShape],
    removed: set[str],
    roster: Roster,
) -> list[Terminate]:
    """Removals that bring every group within maxReplicas and the cluster within its
    max worker hosts; `removed` (already going) are not counted. `roster`: the
    snapshot's (`Roster`): its outdated replicas, and its counts to tell that no limit
    can be exceeded without looking at a replica."""
    removals = [
        _removal(r, RemovalCause.OUTDATED, "launched from a configuration its group no longer has")
        for r in roster.outdated
        if r.outdated
        and r.group in shapes
        and r.name not in removed
        and r.state is not ReplicaState.DRAINING
        and _removable(r, shapes[r.group])
    ]
    if _within_limits(roster, shapes, snapshot.max_worker_hosts):
        return removals  # most passes: below every limit before anything is removed
    removed = removed | {t.replica for t in removals}
    counted = [
        r
        for r in snapshot.replicas
        if r.group in shapes and r.name not in removed and r.state is not ReplicaState.DRAINING
    ]
    by_group: dict[str, list[Replica]] = {}
    for replica in counted:
        by_group.setdefault(replica.group, []).append(replica)
    for group, replicas in by_group.items():
        shape = shapes[group]
        excess = len(replicas) - shape.max_replicas
        if excess <= 0:
            continue  # ordering every replica costs more than the rest of the check
        for replica in _least_useful(replicas, shape)[:excess]:
            removals.append(
                _removal(
                    replica,
                    RemovalCause.MAX_REPLICAS,
                    f"{group} has {len(replicas)} replicas, above its maxReplicas "
                    f"{shape.max_replicas}; {_why_first(replica)}",
                )
            )
    limit = snapshot.max_worker_hosts
    if limit is None:
        return removals
    going = {t.replica for t in removals}
    left = [r for r in counted if r.name not in going]
    hosts = sum(shapes[r.group].hosts_per_replica for r in left)
    excess_hosts = hosts - limit
    if excess_hosts <= 0:
        return removals
    for replica in _least_useful_across(left, shapes):
        if excess_hosts <= 0:
            break
        excess_hosts -= shapes[replica.group].hosts_per_replica
        removals.append(
            _removal(
                replica,
                RemovalCause.MAX_WORKERS,
                f"the cluster has {hosts} worker hosts, above its max of {limit}; "
                f"{_why_first(replica)}",
            )
        )
    return removals


def _within_limits(
    roster: Roster, shapes: Mapping[str, SliceShape], max_worker_hosts: Hosts | None
) -> bool:
    """Every group within maxReplicas and the cluster within its max worker hosts
    counting every replica not draining, those removed too: removing one only lowers
    a count, so no limit removal is due."""
    counts = roster.counts
    if any(count.not_draining > shapes[group].max_replicas for group, count in counts.items()):
        return False
    return max_worker_hosts is None or max_worker_hosts >= sum(
        count.not_draining * shapes[group].hosts_per_replica for group, count in counts.items()
    )


def _removable(replica: Replica, shape: SliceShape) -> bool:
    if not replica.identified:
        return False
    return shape.hosts_per_replica == 1 or not any(h.in_use for h in replica.hosts)


def _least_useful(replicas: Iterable[Replica], shape: SliceShape) -> list[Replica]:
    return sorted((r for r in replicas if _removable(r, shape)), key=_order)


def _least_useful_across(
    replicas: Iterable[Replica], shapes: Mapping[str, SliceShape]
) -> list[Replica]:
    return sorted((r for r in replicas if _removable(r, shapes[r.group])), key=_order)


def _order(replica: Replica) -> RemovalOrder:
    """Ray's `_sort_nodes_for_termination` for a whole replica: not running Ray first,
    then the longest idle (every host), then the lowest mean utilisation."""
    running = any(h.registered for h in replica.hosts)
    idle_s = min((h.idle_s for h in replica.hosts), default=0.0) if running else 0.0
    return (running, -idle_s, _utilisation(replica), replica.name)


def _utilisation(replica: Replica) -> float:
    """The mean over hosts of each host's mean share of every resource in use."""
    shares = []
    for host in replica.hosts:
        used = [
            (total - host.available.get(name, 0.0)) / total
            for name, total in host.total.items()
            if total > 0
        ]
        shares.append(sum(used) / len(used) if used else 0.0)
    return sum(shares) / len(shares) if shares else 0.0


def _why_first(replica: Replica) -> str:
    running, idle, util, _ = _order(replica)
    if not running:
        return "removed first: not running Ray yet"
    if idle < 0:
        return f"removed first: idle {-idle:.0f}s"
    return f"removed first: least used ({util:.0%})"


def _removal(replica: Replica, cause: RemovalCause, reason: str) -> Terminate:
    pods = tuple(h.pod_name for h in replica.hosts)
    return Terminate(replica.group, replica.name, pods, reason, cause)
