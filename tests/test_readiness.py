"""`ReadinessWatch`: which replicas are told as come up, and when (the controller
tests run it in the simulated cluster; these pin its edges)."""

from __future__ import annotations

from dataclasses import replace

from tests.snapshots import pending_replica, running_replica, snapshot, v6e_16_shapes
from tpu_autoscaler.core.snapshot import Host, Replica
from tpu_autoscaler.shell.readiness import ReadinessWatch

SHAPES = v6e_16_shapes()
(SHAPE,) = SHAPES


def _registered(replica: Replica, at_s: list[float | None]) -> Replica:
    hosts = tuple(
        replace(h, registered_at_s=t, node_id=h.node_id if t is not None else None)
        for h, t in zip(replica.hosts, at_s, strict=True)
    )
    return replace(replica, hosts=hosts)


def _up(index: int, at_s: list[float | None], created_at_s: float = 100.0) -> Replica:
    return _registered(running_replica(SHAPE, index, created_at_s=created_at_s), at_s)


def test_a_replica_is_told_once_when_its_last_host_registers() -> None:
    watch = ReadinessWatch()
    assert watch.came_up(snapshot(SHAPES, [pending_replica(SHAPE, 0, 100.0)])) == []
    assert watch.came_up(snapshot(SHAPES, [_up(0, [160.0, 170.0, None, 165.0])])) == []
    (up,) = watch.came_up(snapshot(SHAPES, [_up(0, [160.0, 170.0, 185.0, 165.0])]))
    assert (up.replica, up.group, up.slice_name, up.hosts) == ("tpu-r0", "tpu", "tpu-0", 4)
    assert (up.created_at_s, up.first_host_s, up.last_host_s, up.up_s) == (100, 160, 185, 85)
    assert watch.came_up(snapshot(SHAPES, [_up(0, [160.0, 170.0, 185.0, 165.0])])) == []


def test_whole_at_the_first_look_is_not_told_but_a_later_one_is() -> None:
    watch = ReadinessWatch()
    assert watch.came_up(snapshot(SHAPES, [_up(0, [10.0] * 4)])) == []
    ups = watch.came_up(snapshot(SHAPES, [_up(0, [10.0] * 4), _up(1, [300.0] * 4)]))
    assert [u.replica for u in ups] == ["tpu-r1"]


def test_a_replica_short_of_a_live_host_is_not_whole() -> None:
    watch = ReadinessWatch()
    watch.came_up(snapshot(SHAPES))
    three = _up(0, [160.0] * 4)
    three = replace(three, hosts=three.hosts[:3])
    assert watch.came_up(snapshot(SHAPES, [three])) == []
    dead = _up(0, [160.0] * 4)
    dead = replace(dead, hosts=(*dead.hosts[:3], replace(dead.hosts[3], dead=True)))
    assert watch.came_up(snapshot(SHAPES, [dead])) == []
    unidentified = replace(_up(0, [160.0] * 4), identified=False)
    assert watch.came_up(snapshot(SHAPES, [unidentified])) == []


def test_a_name_gone_and_back_is_another_slice_told_again() -> None:
    watch = ReadinessWatch()
    watch.came_up(snapshot(SHAPES))
    assert len(watch.came_up(snapshot(SHAPES, [_up(0, [160.0] * 4)]))) == 1
    assert watch.came_up(snapshot(SHAPES)) == []
    (again,) = watch.came_up(snapshot(SHAPES, [_up(0, [900.0] * 4, created_at_s=800.0)]))
    assert again.up_s == 100.0


def test_first_and_last_host_are_by_time_not_by_host_index() -> None:
    watch = ReadinessWatch()
    watch.came_up(snapshot(SHAPES))
    replica = _up(0, [160.0, 150.0, 170.0, 155.0])
    hosts: tuple[Host, ...] = tuple(reversed(replica.hosts))
    (up,) = watch.came_up(snapshot(SHAPES, [replace(replica, hosts=hosts)]))
    assert (up.first_host_s, up.last_host_s) == (150.0, 170.0)


def test_every_replica_of_a_round_is_looked_at_whatever_comes_before_it() -> None:
    watch = ReadinessWatch()
    # Two whole at the first look: both taken as told.
    assert watch.came_up(snapshot(SHAPES, [_up(0, [10.0] * 4), _up(1, [10.0] * 4)])) == []
    coming = _up(2, [300.0, None, 300.0, 300.0])
    later = [_up(0, [10.0] * 4), _up(1, [10.0] * 4), coming, _up(3, [310.0] * 4)]
    assert [u.replica for u in watch.came_up(snapshot(SHAPES, later))] == ["tpu-r3"]


def test_the_message_gives_the_last_and_the_first_host_after_the_pods() -> None:
    watch = ReadinessWatch()
    watch.came_up(snapshot(SHAPES))
    (up,) = watch.came_up(snapshot(SHAPES, [_up(0, [160.0, 170.0, 185.0, 165.0])]))
    assert up.message() == (
        "replica tpu-r0 of tpu up: 4 host(s) registered with Ray 85 s after its first pod "
        "was created (first host at 60 s)"
    )
