"""Limits on existing replicas and on launches: a group above its maxReplicas (or
with max 0) and a cluster above its max worker hosts shed replicas as Ray 2.60 does
(not running Ray first, then the longest idle, then the least used), whole; a
multi-host slice in use is never removed for it; launches stop at either limit."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import cpu_group
from tests.snapshots import running_replica, shapes_for, snapshot, v6e_16_shapes
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.plan import RemovalCause
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.snapshot import Replica, ReplicaState, requested_replicas
from tpu_autoscaler.core.units import Hosts, Replicas


def _cpu(max_replicas: int, min_replicas: int = 0, name: str = "cpu"):  # type: ignore[no-untyped-def]
    (shape,) = shapes_for(cpu_group(name, min_replicas, 10))
    return replace(shape, max_replicas=Replicas(max_replicas))


def _removed(result) -> list[tuple[str, RemovalCause]]:  # type: ignore[no-untyped-def]
    return sorted((t.replica, t.cause) for t in result.terminate)


def test_above_max_replicas_the_least_useful_single_hosts_go() -> None:
    shape = _cpu(max_replicas=2)
    (requested,) = requested_replicas("cpu", 1, (), 900.0)
    idle = running_replica(shape, 1, idle_s=5.0)
    half_used = running_replica(shape, 2, used={0: {"CPU": 4.0}})
    replicas = [requested, idle, half_used]
    # One too many: the one not running Ray goes first.
    assert _removed(plan(snapshot((shape,), replicas))) == [
        (requested.name, RemovalCause.MAX_REPLICAS)
    ]
    # Max 1: then the idle one; the used one stays.
    result = plan(snapshot((replace(shape, max_replicas=Replicas(1)),), replicas))
    assert _removed(result) == sorted(
        [(requested.name, RemovalCause.MAX_REPLICAS), (idle.name, RemovalCause.MAX_REPLICAS)]
    )
    reasons = {t.replica: t.reason for t in result.terminate}
    assert reasons[requested.name].endswith("removed first: not running Ray yet")
    assert (
        reasons[idle.name] == "cpu has 3 replicas, above its maxReplicas 1; removed first: idle 5s"
    )


def test_among_busy_single_hosts_the_least_used_share_goes_first() -> None:
    shape = _cpu(max_replicas=1)
    big = replace(running_replica(shape, 0, used={0: {"CPU": 2.0}}))  # 2 of 8: 25 %
    small_total = {"CPU": 2.0}
    small = running_replica(shape, 1)
    small = replace(
        small,
        hosts=(replace(small.hosts[0], total=small_total, available={"CPU": 1.0}),),  # 50 %
    )
    (removal,) = plan(snapshot((shape,), [small, big])).terminate
    assert removal.replica == big.name
    assert removal.reason.endswith("removed first: least used (12%)")


def test_a_slice_idle_under_a_second_is_not_in_use() -> None:
    (shape,) = v6e_16_shapes(max_replicas=0)
    just_idle = running_replica(shape, 0, idle_s=0.5)
    (removal,) = plan(snapshot((shape,), [just_idle])).terminate
    assert removal.cause is RemovalCause.MAX_REPLICAS


def test_a_group_with_max_zero_loses_every_single_host_as_ray_does() -> None:
    shape = _cpu(max_replicas=0)
    busy = running_replica(shape, 0, used={0: {"CPU": 8.0}})
    result = plan(snapshot((shape,), [busy, running_replica(shape, 1, idle_s=1.0)]))
    assert {t.cause for t in result.terminate} == {RemovalCause.MAX_REPLICAS}
    assert len(result.terminate) == 2


def test_a_slice_in_use_is_never_removed_for_a_limit() -> None:
    (shape,) = v6e_16_shapes(max_replicas=1)
    busy = running_replica(shape, 0, idle_s=[9.0, 0.0, 9.0, 9.0], used={1: {"TPU": 4}})
    idle = running_replica(shape, 1, idle_s=9.0)
    result = plan(snapshot((shape,), [busy, idle]))
    (removal,) = result.terminate
    assert (removal.replica, removal.cause) == (idle.name, RemovalCause.MAX_REPLICAS)
    assert len(removal.pods) == 4
    zero = replace(shape, max_replicas=Replicas(0))
    assert _removed(plan(snapshot((zero,), [busy]))) == []


def test_a_replica_not_tied_to_a_slice_is_never_removed_for_a_limit() -> None:
    (shape,) = v6e_16_shapes(max_replicas=0)
    untied = replace(running_replica(shape, 0, idle_s=9.0), identified=False)
    assert plan(snapshot((shape,), [untied])).terminate == ()


def test_launches_stop_at_the_cluster_max_and_the_rest_waits() -> None:
    shape = _cpu(max_replicas=10)
    demand = Demand(resources=(ResourceDemand(Bundle({"CPU": 8.0}), 5),))
    snap = replace(snapshot((shape,), [running_replica(shape, 0, used={0: {"CPU": 8}})], demand))
    result = plan(replace(snap, max_worker_hosts=Hosts(3)))
    assert [(x.group, x.replicas) for x in result.launch] == [("cpu", 2)]
    (waiting,) = result.waiting
    assert "max of 3 worker hosts" in waiting.reason
    assert result.infeasible == ()


def test_min_replicas_are_topped_up_only_within_the_cluster_max() -> None:
    shape = _cpu(max_replicas=10, min_replicas=4)
    result = plan(replace(snapshot((shape,)), max_worker_hosts=Hosts(3)))
    assert [(x.group, x.replicas) for x in result.launch] == [("cpu", 3)]


def test_above_the_cluster_max_whole_replicas_go_least_useful_first() -> None:
    cpu = _cpu(max_replicas=4)
    (tpu,) = v6e_16_shapes(max_replicas=2)
    busy_cpu = running_replica(cpu, 0, used={0: {"CPU": 1.0}})
    idle_cpu = running_replica(cpu, 1, idle_s=3.0)
    idle_slice = running_replica(tpu, 0, idle_s=30.0)
    busy_slice = running_replica(tpu, 1, used={0: {"TPU": 4}})
    replicas = [busy_cpu, idle_cpu, idle_slice, busy_slice]
    # 10 hosts, max 7: the slice idle longest goes (4 hosts), nothing more.
    result = plan(replace(snapshot((cpu, tpu), replicas), max_worker_hosts=Hosts(7)))
    assert _removed(result) == [(idle_slice.name, RemovalCause.MAX_WORKERS)]
    assert "10 worker hosts, above its max of 7" in result.terminate[0].reason
    # Max 4: the idle CPU node too, and the busy CPU node (Ray's order); the busy slice stays.
    result = plan(replace(snapshot((cpu, tpu), replicas), max_worker_hosts=Hosts(4)))
    assert _removed(result) == sorted(
        [(r.name, RemovalCause.MAX_WORKERS) for r in (idle_slice, idle_cpu, busy_cpu)]
    )


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[list[Replica], list, Hosts | None]:  # type: ignore[type-arg]
    (slice_shape,) = v6e_16_shapes(max_replicas=draw(st.integers(0, 3)))
    cpu = _cpu(max_replicas=draw(st.integers(0, 4)))
    replicas: list[Replica] = []
    for shape in (slice_shape, cpu):
        for index in range(draw(st.integers(0, 4))):
            hosts = shape.hosts_per_replica
            idle = draw(st.lists(st.sampled_from([0.0, 5.0, 50.0]), min_size=hosts, max_size=hosts))
            used = {i: {"CPU": 1.0} for i in range(hosts) if idle[i] == 0.0 and draw(st.booleans())}
            state = draw(st.sampled_from([ReplicaState.RUNNING, ReplicaState.DRAINING]))
            replicas.append(running_replica(shape, index, idle, used, state=state))
    limit = draw(st.one_of(st.none(), st.integers(0, 12).map(Hosts)))
    return replicas, [slice_shape, cpu], limit


@settings(max_examples=300, deadline=None)
@given(_clusters())
def test_limits_hold_after_the_plan_except_for_slices_in_use(case) -> None:  # type: ignore[no-untyped-def]
    replicas, shapes, limit = case
    snap = replace(snapshot(tuple(shapes), replicas), max_worker_hosts=limit)
    result = plan(snap)
    by_name = {r.name: r for r in replicas}
    gone = {t.replica for t in result.terminate}
    for t in result.terminate:
        replica = by_name[t.replica]
        shape = next(s for s in shapes if s.group == t.group)
        if shape.hosts_per_replica > 1:
            assert all(h.idle_s > 0 and h.available == h.total for h in replica.hosts), t
    assert not result.launch  # no demand: nothing to launch for
    kept = [r for r in replicas if r.name not in gone and r.state is not ReplicaState.DRAINING]
    for shape in shapes:
        mine = [r for r in kept if r.group == shape.group]
        in_use = [r for r in mine if any(h.idle_s == 0 for h in r.hosts)]
        if shape.hosts_per_replica == 1:
            assert len(mine) <= shape.max_replicas
        else:
            assert len(mine) <= max(shape.max_replicas, len(in_use))
    if limit is not None:
        hosts = sum(len(r.hosts) for r in kept)
        slices_in_use = sum(
            len(r.hosts) for r in kept if len(r.hosts) > 1 and any(h.idle_s == 0 for h in r.hosts)
        )
        assert hosts <= max(limit, slices_in_use) or hosts - slices_in_use <= limit


def test_a_replica_already_going_is_not_counted_again() -> None:
    (shape,) = v6e_16_shapes(max_replicas=1)
    broken = running_replica(shape, 0, idle_s=9.0)
    broken = replace(broken, hosts=(replace(broken.hosts[0], dead=True), *broken.hosts[1:]))
    kept = running_replica(shape, 1, idle_s=9.0)
    result = plan(snapshot((shape,), [broken, kept]))
    assert [(t.replica, t.cause) for t in result.terminate] == [
        (broken.name, RemovalCause.UNHEALTHY)
    ]
