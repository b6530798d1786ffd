"""All-or-nothing gangs of slices whose slices did not arrive together.

The policy launches every slice a gang needs in one plan, and Ray places nothing of a
gang until all of it fits. So, from the snapshot alone: in a group with a replica
still pending `gang_arrival_bound_s` after it was created (late: none of its hosts
ever registered), a replica that is up and idle (every host for at least
`registration_settle_s`) waits for it: Ray would have placed on the idle one any
pending work it could serve alone, so whatever the late one was launched for needs
both, and a gang of slices did not come whole.

Then the late replicas go as a timed-out launch (the group backs off), and the idle
ones waiting for them are given back (GANG_INCOMPLETE) once idle for their group's
idle timeout, down to minReplicas, instead of being held for the gang until the
provisioning timeout. Within the bound nothing is touched: slice 1 stays while
slice 2 may still come.

`slice_placement_group` asks for its heads one after another: slice 1 holds its head
(busy, never a sibling here) while slice 2 provisions, and each retry of the user's
places head 1 on it again. Its slice 2 is left pending up to the provisioning timeout:
a pending slice holds no chips, and it is first in line when capacity returns (slice
1 is held either way)."""

from __future__ import annotations

from collections.abc import Mapping

from tpu_autoscaler.core.plan import RemovalCause, Terminate
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState


def incomplete_gangs(
    snapshot: ClusterSnapshot, shapes: Mapping[str, SliceShape], removed: set[str]
) -> list[Terminate]:
    """Removals for every group whose gang did not arrive whole within the bound: the
    late replicas (PROVISIONING_TIMEOUT, so the group backs off) and the arrived ones
    waiting for them, once idle past their timeout and down to minReplicas
    (GANG_INCOMPLETE)."""
    now = snapshot.now_s
    bound = snapshot.config.gang_arrival_bound_s
    late: dict[str, list[Replica]] = {}
    kept: dict[str, int] = {}
    for replica in snapshot.replicas:
        if replica.group not in shapes or replica.name in removed:
            continue
        if replica.state is not ReplicaState.DRAINING:
            kept[replica.group] = kept.get(replica.group, 0) + 1
        if (
            replica.state is ReplicaState.PENDING
            and replica.identified
            and not replica.came_up
            and now - replica.created_at_s >= bound
        ):
            late.setdefault(replica.group, []).append(replica)
    removals: list[Terminate] = []
    if not late:
        return removals
    running: dict[str, list[Replica]] = {}
    """The running replicas of groups with late ones, in snapshot order."""
    for replica in snapshot.replicas:
        if (
            replica.group in late
            and replica.state is ReplicaState.RUNNING
            and replica.identified
            and replica.name not in removed
        ):
            running.setdefault(replica.group, []).append(replica)
    for group, stragglers in late.items():
        shape = shapes[group]
        settle_s = snapshot.config.registration_settle_s
        siblings = [r for r in running.get(group, []) if waiting_for_siblings(r, shape, settle_s)]
        if not siblings:
            continue
        came = ", ".join(r.name for r in siblings)
        for replica in stragglers:
            removals.append(
                Terminate(
                    group,
                    replica.name,
                    tuple(h.pod_name for h in replica.hosts),
                    f"pending {now - replica.created_at_s:.0f}s, past the {bound:.0f}s gang "
                    f"arrival bound while {came} came for the same gang; the group backs off",
                    RemovalCause.PROVISIONING_TIMEOUT,
                )
            )
        spare = kept[group] - len(stragglers) - shape.min_replicas
        idle = [(min(h.idle_s for h in r.hosts), r) for r in siblings]
        overdue = [(s, r) for s, r in idle if s > shape.idle_timeout_s]
        for idle_s, replica in sorted(overdue, key=lambda c: (-c[0], c[1].name))[: max(0, spare)]:
            removals.append(
                Terminate(
                    group,
                    replica.name,
                    tuple(h.pod_name for h in replica.hosts),
                    f"held for an all-or-nothing gang whose other slice(s) "
                    f"({', '.join(r.name for r in stragglers)}) did not come within the "
                    f"{bound:.0f}s gang arrival bound; given back after {idle_s:.0f}s idle "
                    "instead of held",
                    RemovalCause.GANG_INCOMPLETE,
                )
            )
    return removals


def waiting_for_siblings(replica: Replica, shape: SliceShape, settle_s: float) -> bool:
    """Whole, up, and idle on every host for at least `settle_s`: Ray would have placed
    on it by now any pending work it could serve alone, so what holds it (the pass
    places a gang on it and the late slices) waits for the late ones too."""
    return (
        len(replica.hosts) == shape.hosts_per_replica
        and all(h.registered for h in replica.hosts)
        and all(h.idle_s >= settle_s for h in replica.hosts)
    )
