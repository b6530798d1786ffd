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

A gang may span groups (a STRICT_SPREAD placement group without selectors lands on
any TPU hosts, single-host and multi-host groups alike), so an idle replica may wait for
a late one of another group. It is taken to, and given back the same way, only when no
replica anywhere is still pending within the bound (it might wait for that one) and a
pending gang could span its group and the late one's; the late ones then go too.

`slice_placement_group` asks for its heads one after another: slice 1 holds its head
(busy, never a sibling here) while slice 2 provisions, and each retry of the user's
places head 1 on it again. Its slice 2 is left pending up to the provisioning timeout:
a pending slice holds no chips, and it is first in line when capacity returns (slice
1 is held either way)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tpu_autoscaler.core.demand import Bundle, copies_that_fit
from tpu_autoscaler.core.plan import RemovalCause, Terminate
from tpu_autoscaler.core.policy.warm import ready_spare
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState


def incomplete_gangs(
    snapshot: ClusterSnapshot,
    shapes: Mapping[str, SliceShape],
    removed: set[str],
    timed_out: frozenset[str] = frozenset(),
    pending_replicas: Sequence[Replica] | None = None,
) -> list[Terminate]:
    """Removals for every group whose gang did not arrive whole within the bound: the
    late replicas (PROVISIONING_TIMEOUT, so the group backs off) and the arrived ones
    waiting for them, once idle past their timeout and down to minReplicas
    (GANG_INCOMPLETE). A replica among `removed` for its provisioning timeout
    (`timed_out`) is late too, not removed again: a told stockout may keep it pending
    as first in line (`Pass`), and the arrived ones must not wait with it.
    `pending_replicas`: the PENDING replicas of `shapes`' groups, if the caller has them
    (`Roster.pending`): only a late one of those, or one `timed_out` (pending too),
    could be late below."""
    now = snapshot.now_s
    bound = snapshot.config.gang_arrival_bound_s
    pending = ReplicaState.PENDING
    if not any(
        ((r.state is pending and now - r.created_at_s >= bound) or r.name in timed_out)
        and not r.came_up
        for r in (snapshot.replicas if pending_replicas is None else pending_replicas)
    ):
        # Most rounds: no replica pending past the bound or timed out that never came
        # up, so none is late (below), and nothing else needs counting.
        return []
    late: dict[str, list[Replica]] = {}
    timed_out_late: dict[str, list[Replica]] = {}
    running: dict[str, list[Replica]] = {}
    kept: dict[str, int] = {}
    awaited = False
    """A replica is pending within the bound: an idle one may wait for it."""
    for replica in snapshot.replicas:
        if replica.group not in shapes:
            continue
        if replica.name in removed:
            if replica.name in timed_out and not replica.came_up:
                timed_out_late.setdefault(replica.group, []).append(replica)
            continue
        if replica.state is not ReplicaState.DRAINING:
            kept[replica.group] = kept.get(replica.group, 0) + 1
        if not replica.identified:
            awaited = awaited or replica.state is not ReplicaState.DRAINING
            continue
        if replica.state is ReplicaState.PENDING and not replica.came_up:
            if now - replica.created_at_s >= bound:
                late.setdefault(replica.group, []).append(replica)
            else:
                awaited = True
        elif replica.state is ReplicaState.REQUESTED:
            awaited = True
        elif replica.state is ReplicaState.RUNNING:
            running.setdefault(replica.group, []).append(replica)
    if not late and not timed_out_late:
        return []  # most rounds: nothing below to walk
    settle_s = snapshot.config.registration_settle_s
    waiting = {
        group: [r for r in replicas if waiting_for_siblings(r, shapes[group], settle_s)]
        for group, replicas in running.items()
        if group in late or not awaited
    }
    every_late = {
        group: [*late.get(group, []), *timed_out_late.get(group, [])]
        for group in (*late, *timed_out_late)
    }
    across = (
        _across_groups(snapshot, shapes, every_late, waiting, late)
        if every_late and not awaited
        else {}
    )
    after = _across_groups_after(snapshot, shapes, late, waiting, awaited)
    removals: list[Terminate] = []
    for group, group_late in every_late.items():
        siblings = [
            *waiting.get(group, []),
            *(r for other, replicas in across.items() if other != group for r in replicas),
        ]
        if not siblings:
            siblings = [r for other, replicas in after.items() if other != group for r in replicas]
        if not siblings:
            continue
        stragglers = late.get(group, [])
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
        spare = kept.get(group, 0) - len(stragglers) - shapes[group].min_replicas
        removals += _given_back(
            snapshot, shapes[group], waiting.get(group, []), group_late, spare, removed
        )
    all_late = [r for replicas in every_late.values() for r in replicas]
    for group, siblings in across.items():
        if group in every_late:
            continue  # given back above, for its own late slices
        spare = kept[group] - shapes[group].min_replicas
        removals += _given_back(snapshot, shapes[group], siblings, all_late, spare, removed)
    return removals


def _across_groups_after(
    snapshot: ClusterSnapshot,
    shapes: Mapping[str, SliceShape],
    late: Mapping[str, list[Replica]],
    waiting: Mapping[str, list[Replica]],
    awaited: bool,
) -> dict[str, list[Replica]]:
    """`_across_groups` once this pass removes the late replicas of the groups whose
    own replicas wait for them: those replicas then wait for no late slice of their
    own, and are siblings of the other groups' late ones, as for a group whose late
    ones timed out (`_across_groups`). The next pass would take the ones it keeps for
    such (a plan does not leave to the next round what it can decide now); the ones it
    gives back came for the same gang, which did not come whole either way."""
    going = {group: waiting[group] for group in late if waiting.get(group)}
    staying = {group: replicas for group, replicas in late.items() if group not in going}
    if awaited or not going or not staying:
        return {}
    return _across_groups(snapshot, shapes, staying, going, staying)


def _given_back(
    snapshot: ClusterSnapshot,
    shape: SliceShape,
    siblings: list[Replica],
    stragglers: list[Replica],
    spare: int,
    removed: set[str],
) -> list[Terminate]:
    """The siblings idle past their group's timeout, longest idle first, at most
    `spare` of them (minReplicas keeps the rest), and never the group's warm buffer:
    idle removal keeps that many ready idle slices, so does this (`warm.py`)."""
    warm = shape.scarcity.warm_replicas
    if warm:
        ready = sum(
            1
            for r in snapshot.replicas
            if r.group == shape.group and ready_spare(r, removed, set())
        )
        spare = min(spare, ready - warm)
    bound = snapshot.config.gang_arrival_bound_s
    idle = [(min(h.idle_s for h in r.hosts), r) for r in siblings]
    overdue = [(s, r) for s, r in idle if s > shape.idle_timeout_s]
    return [
        Terminate(
            shape.group,
            replica.name,
            tuple(h.pod_name for h in replica.hosts),
            f"held for an all-or-nothing gang whose other slice(s) "
            f"({', '.join(r.name for r in stragglers)}) did not come within the "
            f"{bound:.0f}s gang arrival bound; given back after {idle_s:.0f}s idle "
            "instead of held",
            RemovalCause.GANG_INCOMPLETE,
        )
        for idle_s, replica in sorted(overdue, key=lambda c: (-c[0], c[1].name))[: max(0, spare)]
    ]


def _across_groups(
    snapshot: ClusterSnapshot,
    shapes: Mapping[str, SliceShape],
    late: Mapping[str, list[Replica]],
    waiting: Mapping[str, list[Replica]],
    pending_late: Mapping[str, list[Replica]],
) -> dict[str, list[Replica]]:
    """The replicas of `waiting` in groups without a late replica of their own still
    pending (`pending_late`) that a pending gang could span with a late group: a bundle
    of it fits one of their hosts, another a host of the late group's shape. A group
    whose late ones all timed out this pass is no exception: they are removed now, and
    the next pass, without them, would take its idle replicas for the other group's
    siblings (a plan does not leave to the next round what it can decide now)."""
    late_hosts = [
        (shapes[group].host_labels(i), shapes[group].host_resources(i))
        for group in late
        for i in range(shapes[group].hosts_per_replica)
    ]
    spanning = [
        gang
        for gang in snapshot.demand.gangs
        if any(_takes(bundle, late_hosts) for bundle in gang.bundles)
    ]
    across: dict[str, list[Replica]] = {}
    for group, replicas in waiting.items():
        if group in pending_late:
            continue
        siblings = [
            r
            for r in replicas
            if any(
                _takes(bundle, [(h.labels, h.total) for h in r.hosts])
                for gang in spanning
                for bundle in gang.bundles
            )
        ]
        if siblings:
            across[group] = siblings
    return across


def _takes(bundle: Bundle, hosts: Sequence[tuple[Mapping[str, str], Mapping[str, float]]]) -> bool:
    """A host with these labels and resources in all could take the bundle."""
    return any(
        all(c.matches(labels) for c in variant.selector)
        and copies_that_fit(total, variant.resources) >= 1
        for variant in bundle.variants()
        for labels, total in hosts
    )


def waiting_for_siblings(replica: Replica, shape: SliceShape, settle_s: float) -> bool:
    """Whole, up, and idle on every host for at least `settle_s`: Ray would have placed
    on it by now any pending work it could serve alone, so what holds it (the pass
    places a gang on it and the late slices) waits for the late ones too."""
    return (
        len(replica.hosts) == shape.hosts_per_replica
        and all(h.registered for h in replica.hosts)
        and all(h.idle_s >= settle_s for h in replica.hosts)
    )
