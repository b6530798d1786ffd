"""Invariants of the slice policy over hundreds of generated snapshots."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.factories import cpu_group, tpu_group
from tests.snapshots import apply_plan, pending_replica, running_replica, shapes_for
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    pinned_slice,
    selector_from_mapping,
)
from tpu_autoscaler.core.plan import GroupVerdict
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState


def _slice(gen: str, topology: str, chips: int | None = None) -> catalog.SliceType:
    return catalog.slice_type(catalog.find_generation(gen), topology, chips)  # type: ignore[arg-type]


SMALL_SLICES = [
    _slice("v6e", "4x4"),
    _slice("v6e", "2x4", 8),
    _slice("v6e", "2x4", 4),
    _slice("v5p", "2x2x2"),
    _slice("tpu7x", "2x2x2"),
    _slice("v4", "2x2x1"),
    _slice("v5e", "4x8"),
]


@st.composite
def shapes_strategy(draw: st.DrawFn) -> tuple[SliceShape, ...]:
    picks = draw(st.lists(st.sampled_from(SMALL_SLICES), min_size=1, max_size=3, unique=True))
    groups: list[dict[str, Any]] = []
    for i, s in enumerate(picks):
        low = draw(st.integers(0, 1))
        groups.append(
            tpu_group(
                f"tpu{i}",
                s,
                low,
                draw(st.integers(max(low, 1), 4)),
                idleTimeoutSeconds=draw(st.sampled_from([30, 60, 600])),
                priority=draw(st.integers(0, 2)),
            )
        )
    if draw(st.booleans()):
        groups.append(cpu_group("cpu", 0, draw(st.integers(1, 4))))
    mode = draw(st.sampled_from(["Default", "Conservative"]))
    return shapes_for(*groups, upscalingMode=mode)


@st.composite
def replica_strategy(draw: st.DrawFn, shape: SliceShape, index: int) -> Replica:
    kind = draw(
        st.sampled_from(
            ["running", "running", "running", "pending", "requested", "draining", "dead"]
        )
    )
    if kind == "pending":
        return pending_replica(
            shape, index, created_at_s=draw(st.sampled_from([0.0, 500.0, 990.0]))
        )
    if kind == "requested":
        return Replica(shape.group, f"{shape.group}-r{index}", ReplicaState.REQUESTED, (), 990.0)
    used: dict[int, dict[str, float]] = {}
    idle: list[float] = []
    for h in range(shape.hosts_per_replica):
        busy = draw(st.booleans())
        if busy and shape.tpu is not None:
            used[h] = {"TPU": shape.tpu_per_host}
        elif busy:
            used[h] = {"CPU": 1.0}
        idle.append(0.0 if busy else draw(st.sampled_from([0.0, 20.0, 45.0, 100.0, 1000.0])))
    # Launched at any time: one that came up after a capacity signal answers it.
    created_at_s = draw(st.sampled_from([0.0, 0.0, 500.0, 950.0]))
    replica = running_replica(shape, index, idle_s=idle, used=used, created_at_s=created_at_s)
    if kind == "draining":
        return Replica(
            replica.group,
            replica.name,
            ReplicaState.DRAINING,
            replica.hosts,
            0.0,
            replica.slice_name,
        )
    if kind == "dead":
        hosts = list(replica.hosts)
        from dataclasses import replace

        hosts[-1] = replace(hosts[-1], dead=True)
        return replace(replica, hosts=tuple(hosts))
    return replica


def _bundle(draw: st.DrawFn, shapes: tuple[SliceShape, ...]) -> Bundle:
    tpu_shapes = [s for s in shapes if s.tpu is not None]
    kind = draw(st.sampled_from(["tpu", "tpu", "tpu-any", "cpu", "bogus"]))
    if kind == "cpu" or not tpu_shapes:
        return Bundle({"CPU": float(draw(st.integers(1, 8)))})
    shape = draw(st.sampled_from(tpu_shapes))
    assert shape.tpu is not None
    if kind == "bogus":
        return Bundle({"TPU": 4.0}, selector_from_mapping({"ray.io/tpu-pod-type": "v5p-2048"}))
    amount = draw(st.sampled_from(sorted({1.0, shape.tpu_per_host})))
    selector = {"ray.io/tpu-pod-type": shape.tpu.pod_type} if kind == "tpu" else {}
    return Bundle({"TPU": amount}, selector_from_mapping(selector))


@st.composite
def demand_strategy(
    draw: st.DrawFn, shapes: tuple[SliceShape, ...], replicas: list[Replica]
) -> Demand:
    resources = tuple(
        ResourceDemand(_bundle(draw, shapes), draw(st.integers(1, 12)))
        for _ in range(draw(st.integers(0, 3)))
    )
    gangs: list[GangDemand] = []
    for g in range(draw(st.integers(0, 3))):
        tpu_shapes = [s for s in shapes if s.tpu is not None]
        kind = draw(
            st.sampled_from(["head", "spread", "strict_spread", "pack", "strict_pack", "stage2"])
        )
        if kind == "head" and tpu_shapes:
            shape = draw(st.sampled_from(tpu_shapes))
            assert shape.tpu is not None
            pod_type = shape.tpu.pod_type
            sel = selector_from_mapping(
                {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type}
            )
            bundle = Bundle({f"TPU-{pod_type}-head": 1.0}, sel)
            gangs.append(GangDemand(f"g{g}", (bundle,) * draw(st.integers(1, 3))))
        elif kind == "stage2":
            names = [r.slice_name for r in replicas if r.slice_name] + ["missing-slice"]
            name = draw(st.sampled_from(names))
            bundle = Bundle(
                {"CPU": 1.0, "TPU": 4.0}, selector_from_mapping({"ray.io/tpu-slice-name": name})
            )
            gangs.append(
                GangDemand(f"g{g}", (bundle,) * draw(st.integers(1, 4)), GangStrategy.SPREAD)
            )
        else:
            strategy = {
                "spread": GangStrategy.SPREAD,
                "strict_spread": GangStrategy.STRICT_SPREAD,
                "pack": GangStrategy.PACK,
                "strict_pack": GangStrategy.STRICT_PACK,
            }.get(kind, GangStrategy.PACK)
            bundles = tuple(_bundle(draw, shapes) for _ in range(draw(st.integers(1, 5))))
            gangs.append(GangDemand(f"g{g}", bundles, strategy))
    constraints: tuple[ClusterConstraint, ...] = ()
    if draw(st.integers(0, 4)) == 0:
        constraints = (
            ClusterConstraint(tuple(_bundle(draw, shapes) for _ in range(draw(st.integers(1, 4))))),
        )
    return Demand(resources, tuple(gangs), constraints)


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    shapes = draw(shapes_strategy())
    replicas: list[Replica] = []
    for shape in shapes:
        for i in range(draw(st.integers(0, shape.max_replicas))):
            replicas.append(draw(replica_strategy(shape, i)))
    demand = draw(demand_strategy(shapes, replicas))
    return ClusterSnapshot(shapes, tuple(replicas), demand, now_s=1000.0)


def _bundle_total(demand: Demand) -> int:
    return (
        sum(r.count for r in demand.resources)
        + sum(len(g.bundles) for g in demand.gangs)
        + sum(len(c.bundles) for c in demand.constraints)
    )


@settings(max_examples=300)
@given(snapshots())
def test_plan_invariants(snap: ClusterSnapshot) -> None:
    result = plan(snap)
    by_name = {r.name: r for r in snap.replicas}
    shapes = {s.group: s for s in snap.shapes}

    # Only whole replicas: a removal names every pod of its replica; launches count replicas.
    for t in result.terminate:
        replica = by_name[t.replica]
        assert set(t.pods) == {h.pod_name for h in replica.hosts}
        assert t.reason
    assert all(launch.replicas >= 1 and launch.reason for launch in result.launch)
    assert len({t.replica for t in result.terminate}) == len(result.terminate)

    for group, shape in shapes.items():
        mine = [r for r in snap.replicas if r.group == group]
        removed = [t for t in result.terminate if t.group == group]
        launched = result.launched(group)
        # maxReplicas: never launch past it.
        assert launched == 0 or len(mine) - len(removed) + launched <= shape.max_replicas
        # minReplicas: idle removal never goes below it.
        idle_removed = [t for t in removed if "idle" in t.reason]
        healthy_after = (
            len([r for r in mine if r.state is not ReplicaState.DRAINING]) - len(removed) + launched
        )
        if idle_removed:
            assert healthy_after >= shape.min_replicas

    # No replica with a busy host is removed for idleness; healthy replicas go only when idle.
    for t in result.terminate:
        replica = by_name[t.replica]
        shape = shapes[t.group]
        healthy = (
            all(h.registered for h in replica.hosts)
            and len(replica.hosts) == shape.hosts_per_replica
            and replica.state is ReplicaState.RUNNING
        )
        if healthy:
            assert all(h.idle_s > shape.idle_timeout_s for h in replica.hosts), t
            assert all(h.available == h.total for h in replica.hosts) or "idle" in t.reason

    # Never lost: every demand bundle is placed or reported.
    assert result.bundles_placed + result.bundles_unmet == _bundle_total(snap.demand)
    assert (result.bundles_unmet > 0) == bool(result.infeasible or result.waiting)


@settings(max_examples=300)
@given(snapshots())
def test_plan_is_idempotent_and_deterministic(snap: ClusterSnapshot) -> None:
    first = plan(snap)
    assert plan(snap) == first
    again = plan(apply_plan(snap, first))
    assert again.launch == (), (first, again)
    assert [t for t in again.terminate if "idle" not in t.reason] == []


@st.composite
def pinned_snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    """`snapshots()` with one more gang: `slice_placement_group`'s stage two pinned to
    one of its running slices (any TPU per bundle, up to two bundles per host)."""
    snap = draw(snapshots())
    names = [
        r.slice_name
        for r in snap.replicas
        if r.slice_name and r.state is ReplicaState.RUNNING and not any(h.dead for h in r.hosts)
    ]
    assume(names)
    name = draw(st.sampled_from(names))
    tpu = draw(st.sampled_from([1.0, 4.0, 8.0]))
    bundle = Bundle(
        {"CPU": 1.0, "TPU": tpu}, selector_from_mapping({"ray.io/tpu-slice-name": name})
    )
    hosts = len(next(r for r in snap.replicas if r.slice_name == name).hosts)
    gang = GangDemand("pinned", (bundle,) * draw(st.integers(1, 2 * hosts)), GangStrategy.SPREAD)
    demand = replace(snap.demand, gangs=(*snap.demand.gangs, gang))
    return replace(snap, demand=demand)


@settings(max_examples=300)
@given(pinned_snapshots())
def test_a_stage_two_waits_for_its_running_slice_exactly_when_the_slice_holds_it_idle(
    snap: ClusterSnapshot,
) -> None:
    """A gang pinned by name to a running slice is never placed elsewhere; unplaced, it
    waits (verdict busy) if the slice's hosts hold it once their work ends, and is
    infeasible otherwise: counted here from the hosts' totals, bundle by bundle."""
    gang = snap.demand.gangs[-1]
    (name,) = pinned_slice(gang.bundles[0].selector) or ()
    result = plan(snap)
    unmet = [u for u in (*result.waiting, *result.infeasible) if str(gang) in u.demand]
    if not unmet:
        return
    item = unmet[0]
    removed = {t.replica for t in result.terminate}
    if any(r.name in removed for r in snap.replicas if r.slice_name == name):
        # Idle (a busy slice is never removed for idleness: it waits for nothing), or
        # removed before demand is placed (broken, or given back by `gang_arrival`,
        # whose premise is that Ray places at once what fits an idle slice; the drain
        # before the removal is refused if it did): gone for the gang too.
        assert item in result.infeasible, item
        assert all(g.verdict is GroupVerdict.REJECTED for g in item.groups), item
        return
    bundle = gang.bundles[0].resources
    per_host = [
        int(min(h.total.get(k, 0.0) / v for k, v in bundle.items()))
        for r in snap.replicas
        if r.slice_name == name
        for h in r.hosts
    ]
    busy = [g for g in item.groups if g.verdict is GroupVerdict.BUSY]
    if sum(per_host) >= len(gang.bundles):
        assert item in result.waiting and busy and name in item.reason, item
    else:
        assert item in result.infeasible and not busy, item


def _joined_lately(replica: Replica, joined_s: float) -> Replica:
    """`replica` with its registered hosts joined Ray at `joined_s`: settling for
    `registration_settle_s` (10 s) after, offering their total."""
    hosts = tuple(
        replace(h, registered_at_s=joined_s) if h.registered else h for h in replica.hosts
    )
    return replace(replica, hosts=hosts)


def _freed(replica: Replica) -> Replica:
    """`replica` with nothing taken on its hosts any more."""
    return replace(replica, hosts=tuple(replace(h, available=dict(h.total)) for h in replica.hosts))


@settings(max_examples=200)
@given(
    snapshots(),
    st.randoms(use_true_random=False),
    st.lists(st.sampled_from(["same", "joined", "copy", "freed"]), min_size=12, max_size=12),
    st.sampled_from([-5.0, 0.0, 1.0, 5.0, 1000.0]),
    st.sampled_from([8.0, 12.0]),
)
def test_replica_objects_planned_before_plan_as_fresh_ones(
    snap: ClusterSnapshot, rng: Any, changes: list[str], later_s: float, joined_ago_s: float
) -> None:
    """What a plan keeps on replica objects (`Replica.memo`: their scratch pieces, the
    last build's order and pieces) and carries to the next: the next snapshot, some
    objects the same (settling at the first plan, or not), some copied, some changed,
    listed in another order and planned later (settled by then, or not) or earlier
    (as tests do: time is the snapshot's), plans as
    one of only fresh objects."""
    first = [
        _joined_lately(r, snap.now_s - joined_ago_s) if changes[i % len(changes)] == "joined" else r
        for i, r in enumerate(snap.replicas)
    ]
    snap = replace(snap, replicas=tuple(first))
    plan(snap)
    change = {"same": lambda r: r, "joined": lambda r: r, "copy": replace, "freed": _freed}
    replicas = [change[changes[i % len(changes)]](r) for i, r in enumerate(snap.replicas)]
    if rng.random() < 0.5:
        rng.shuffle(replicas)
    later = replace(snap, replicas=tuple(replicas), now_s=snap.now_s + later_s)
    fresh = replace(later, replicas=tuple(replace(r) for r in later.replicas))
    assert plan(later) == plan(fresh)
    assert plan(later) == plan(fresh)  # and once more, both kept now
