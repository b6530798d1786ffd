"""Which running replicas go for idleness: every host idle longer than the group's
timeout and nothing placed on any of them this pass, the longest idle first, down to
minReplicas and never below the group's warm buffer (`warm.py`). A slice goes
whole or not at all.

Longer than, not as long as: a busy host reports 0 s idle, so with a timeout of 0
`>=` would take every busy host for an idle one (Ray 2.60 keeps a node while
`idle_duration_ms <= timeout`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_autoscaler.core.plan import RemovalCause, Terminate
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.warm import idle_removals_allowed
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState

if TYPE_CHECKING:
    from tpu_autoscaler.core.policy.roster import Roster


def idle_removals(
    snapshot: ClusterSnapshot,
    ledger: Ledger,
    removed: set[str],
    used: set[str],
    roster: Roster,
) -> list[Terminate]:
    """`roster`: the snapshot's: only its idle replicas (`Roster.idle`) are looked at."""
    candidates: dict[str, list[tuple[float, Replica]]] = {}
    for replica in roster.idle:
        state = ledger.groups.get(replica.group)
        if (
            state is None
            # First: most replicas of a busy cluster are not idle long enough.
            or replica.least_idle_s <= state.shape.idle_timeout_s
            or replica.state is not ReplicaState.RUNNING
            or not replica.identified
            or replica.name in removed
            or replica.name in used
            # Whole slices only; two under one name (KubeRay reused a replica name,
            # the read keeps them as one replica) go together, as KubeRay deletes them.
            or not replica.hosts
            or len(replica.hosts) % state.shape.hosts_per_replica
            or not replica.all_registered
        ):
            continue
        candidates.setdefault(replica.group, []).append((replica.least_idle_s, replica))
    removals = []
    beyond_buffer = idle_removals_allowed(snapshot.replicas, ledger, removed, used)
    for group, idle in candidates.items():
        state = ledger.groups[group]
        allowed = state.healthy + state.new - state.shape.min_replicas
        allowed = min(allowed, beyond_buffer.get(group, allowed))
        longest_first = sorted(idle, key=lambda c: (-c[0], c[1].name))
        for idle_s, replica in longest_first[: max(0, allowed)]:
            reason = (
                f"all {len(replica.hosts)} hosts idle {idle_s:.0f}s, "
                f"longer than the idle timeout {state.shape.idle_timeout_s:g}s"
            )
            pods = tuple(h.pod_name for h in replica.hosts)
            removals.append(Terminate(replica.group, replica.name, pods, reason, RemovalCause.IDLE))
    return removals
