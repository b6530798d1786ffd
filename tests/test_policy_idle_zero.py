"""Idle removal with `idle_timeout_s = 0`: Ray 2.60 removes a node only once it has
been idle *longer* than the timeout (`idle_duration_ms <= timeout` is kept), so a
busy node, which reports 0 s idle, is never taken for an idle one."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from tests.factories import cpu_group
from tests.snapshots import running_replica, shapes_for, snapshot, v6e_16_shapes
from tpu_autoscaler.core.policy import plan


def test_busy_single_host_node_stays_with_a_zero_timeout() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 0, 4, idleTimeoutSeconds=0))
    busy = running_replica(shape, 0, idle_s=0.0, used={0: {"CPU": 1.0}})
    idle = running_replica(shape, 1, idle_s=0.5)
    result = plan(snapshot((shape,), [busy, idle]))
    assert [t.replica for t in result.terminate] == [idle.name]


def test_busy_slice_stays_whole_with_a_zero_timeout() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=0)
    one_busy_host = running_replica(shape, 0, idle_s=[5.0, 0.0, 5.0, 5.0], used={1: {"TPU": 4}})
    all_idle = running_replica(shape, 1, idle_s=5.0)
    result = plan(snapshot((shape,), [one_busy_host, all_idle]))
    assert [t.replica for t in result.terminate] == [all_idle.name]


@given(timeout_s=st.integers(0, 600), idle_s=st.floats(0, 1200, allow_nan=False))
def test_a_replica_goes_only_once_idle_longer_than_its_timeout(
    timeout_s: int, idle_s: float
) -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=timeout_s)
    result = plan(snapshot((shape,), [running_replica(shape, 0, idle_s=idle_s)]))
    assert bool(result.terminate) == (idle_s > timeout_s)


def test_an_idle_replica_at_min_replicas_stays_with_a_zero_timeout() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=0, min_replicas=1)
    assert plan(snapshot((shape,), [running_replica(shape, 0, idle_s=5.0)])).terminate == ()


def test_a_negative_timeout_built_into_a_shape_takes_a_replica_idle_zero_seconds() -> None:
    """The manifest allows no negative timeout, but a shape built by hand may carry
    one: a replica idle 0 s is idle longer than it and goes, as the rule says. Idle
    removal looks only at the replicas idle longer than the least timeout of any
    group, 0 at most (`Roster.idle`), so it still finds this one."""
    (manifest_shape,) = v6e_16_shapes()
    shape = replace(manifest_shape, idle_timeout_s=-1.0)
    replica = running_replica(shape, 0, idle_s=0.0)
    result = plan(snapshot((shape,), [replica]))
    assert [t.replica for t in result.terminate] == [replica.name]
