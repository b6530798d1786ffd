"""All-or-nothing gangs of slices whose slices did not arrive together.

The policy launches every slice a gang needs in one plan, and Ray places nothing of a
gang until all of it fits. So, from the snapshot alone: a group with a replica still
pending `gang_arrival_bound_s` after it was created (late: none of its hosts ever
registered) and a replica that is up and has been idle ever since the late one was
launched (or since it arrived, if later) holds a gang that did not come whole.

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
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Host, Replica, ReplicaState


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
    running: dict[str, list[Replica]] = {}
    kept: dict[str, int] = {}
    for replica in snapshot.replicas:
        if replica.group not in shapes or replica.name in removed:
            continue
        if replica.state is not ReplicaState.DRAINING:
            kept[replica.group] = kept.get(replica.group, 0) + 1
        if not replica.identified:
            continue
        if (
            replica.state is ReplicaState.PENDING
            and not any(h.registered or h.registered_at_s is not None for h in replica.hosts)
            and now - replica.created_at_s >= bound
        ):
            late.setdefault(replica.group, []).append(replica)
        elif replica.state is ReplicaState.RUNNING:
            running.setdefault(replica.group, []).append(replica)
    removals: list[Terminate] = []
    for group, stragglers in late.items():
        shape = shapes[group]
        launched_s = min(r.created_at_s for r in stragglers)
        siblings = [
            r
            for r in running.get(group, [])
            if waiting_for_siblings(
                r, shape, launched_s, snapshot.config.registration_settle_s, now
            )
        ]
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


def waiting_for_siblings(
    replica: Replica, shape: SliceShape, launched_s: float, settle_s: float, now_s: float
) -> bool:
    """Whole, up, and waiting for the slices launched at `launched_s`: idle ever since
    it arrived or since they were launched, whichever is later."""
    if len(replica.hosts) != shape.hosts_per_replica or not all(
        h.registered for h in replica.hosts
    ):
        return False
    return all(idle_since(h, launched_s, settle_s, now_s) for h in replica.hosts)


def idle_since(host: Host, launched_s: float, settle_s: float, now_s: float) -> bool:
    """Idle since `launched_s`, or since it registered if later. Ray's idle clock
    starts with the raylet, before the autoscaler first sees it, so a host never used
    is idle at least as long as it has been registered."""
    if host.idle_s <= 0:
        return False
    since = launched_s if host.registered_at_s is None else max(launched_s, host.registered_at_s)
    return host.idle_s + settle_s >= now_s - since
