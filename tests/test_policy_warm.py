"""Warm slices: per group, `warm-replicas` idle slices kept ready beyond demand,
launched within maxReplicas and the cluster's max, never removed by idle timeout
below the buffer, used by arriving demand like any replica and then replenished."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import tpu_group
from tests.scarcity_groups import V6E_4X4, annotated
from tests.snapshots import (
    pending_replica,
    running_replica,
    shapes_for,
    slice_head_gang,
    snapshot,
)
from tpu_autoscaler.core.demand import Demand
from tpu_autoscaler.core.plan import Plan, RemovalCause
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.policy.warm import ready_spare
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import LaunchFailures, Replica, ReplicaState
from tpu_autoscaler.core.units import Hosts

IDLE_TIMEOUT_S = 60


def _warm_group(warm: int, max_replicas: int = 4, min_replicas: int = 0) -> SliceShape:
    (shape,) = shapes_for(
        annotated(
            tpu_group(
                "tpu", V6E_4X4, min_replicas, max_replicas, idleTimeoutSeconds=IDLE_TIMEOUT_S
            ),
            warm=warm,
        )
    )
    return shape


def _idle(shape: SliceShape, index: int, idle_s: float) -> Replica:
    return running_replica(shape, index, idle_s=idle_s)


def _removed(result: Plan) -> list[str]:
    return sorted(t.replica for t in result.terminate)


def test_an_empty_group_launches_its_buffer() -> None:
    shape = _warm_group(2)
    result = plan(snapshot((shape,)))
    assert result.launched("tpu") == 2
    assert "warm buffer" in result.launch[0].reason


def test_the_buffer_is_bounded_by_max_replicas_and_the_cluster_max() -> None:
    tight = _warm_group(3, max_replicas=3)
    busy = running_replica(tight, 0, used={0: {"TPU": 4.0}})
    assert plan(snapshot((tight,), [busy])).launched("tpu") == 2
    hosts = tight.hosts_per_replica
    capped = replace(snapshot((tight,), [busy]), max_worker_hosts=Hosts(2 * hosts))
    assert plan(capped).launched("tpu") == 1


def test_ready_and_pending_spare_replicas_count_toward_the_buffer() -> None:
    shape = _warm_group(2)
    spare = [_idle(shape, 0, 5.0), pending_replica(shape, 1, created_at_s=990.0)]
    assert plan(snapshot((shape,), spare)).launch == ()


def test_busy_replicas_do_not_count_toward_the_buffer() -> None:
    shape = _warm_group(1)
    busy = running_replica(shape, 0, used={0: {"TPU": 4.0}})
    assert plan(snapshot((shape,), [busy])).launched("tpu") == 1


def test_idle_timeout_never_takes_the_group_below_its_buffer() -> None:
    shape = _warm_group(1)
    long_idle = _idle(shape, 0, 10 * IDLE_TIMEOUT_S)
    result = plan(snapshot((shape,), [long_idle]))
    assert result.terminate == ()
    assert result.launch == ()


def test_the_longest_idle_go_first_above_the_buffer() -> None:
    shape = _warm_group(1)
    replicas = [_idle(shape, i, idle_s) for i, idle_s in enumerate([200.0, 900.0, 400.0])]
    result = plan(snapshot((shape,), replicas))
    assert _removed(result) == ["tpu-r1", "tpu-r2"]
    assert {t.cause for t in result.terminate} == {RemovalCause.IDLE}


def test_arriving_demand_takes_a_warm_slice_and_the_buffer_is_replenished() -> None:
    shape = _warm_group(1)
    demand = Demand(gangs=(slice_head_gang("v6e-16", 1),))
    result = plan(snapshot((shape,), [_idle(shape, 0, 300.0)], demand=demand))
    # The head lands on the warm slice (no launch for it), one more slice warms up.
    assert result.bundles_placed == 1
    assert result.launched("tpu") == 1
    assert result.launch[0].reason.startswith("warm buffer")
    assert result.terminate == ()


def test_a_slice_launched_for_demand_is_no_warm_slice() -> None:
    shape = _warm_group(1)
    demand = Demand(gangs=(slice_head_gang("v6e-16", 1),))
    result = plan(snapshot((shape,), demand=demand))
    assert result.launched("tpu") == 2
    assert "warm buffer" in result.launch[0].reason


def test_no_warm_launch_while_the_group_backs_off() -> None:
    shape = _warm_group(1)
    backing_off = snapshot((shape,), launch_failures={"tpu": LaunchFailures(1, 990.0)})
    assert plan(backing_off).launch == ()


def test_min_replicas_fill_the_buffer_too() -> None:
    shape = _warm_group(2, min_replicas=1)
    assert plan(snapshot((shape,))).launched("tpu") == 2


# --- properties ---------------------------------------------------------------------


@st.composite
def _warm_cluster(draw: st.DrawFn) -> tuple[SliceShape, list[Replica], int]:
    max_replicas = draw(st.integers(1, 5))
    warm = draw(st.integers(0, max_replicas))
    shape = _warm_group(warm, max_replicas, min_replicas=draw(st.integers(0, 1)))
    replicas: list[Replica] = []
    for i in range(draw(st.integers(0, max_replicas))):
        kind = draw(st.sampled_from(["idle", "idle", "busy", "pending"]))
        if kind == "pending":
            replicas.append(pending_replica(shape, i, created_at_s=draw(st.sampled_from([0, 990]))))
        elif kind == "busy":
            replicas.append(running_replica(shape, i, used={0: {"TPU": 4.0}}))
        else:
            replicas.append(_idle(shape, i, draw(st.sampled_from([1.0, 30.0, 61.0, 600.0]))))
    heads = draw(st.integers(0, 2))
    return shape, replicas, heads


@settings(max_examples=150, deadline=None)
@given(_warm_cluster())
def test_buffer_within_max_and_idle_removal_keeps_it(
    cluster: tuple[SliceShape, list[Replica], int],
) -> None:
    shape, replicas, heads = cluster
    demand = Demand(gangs=(slice_head_gang("v6e-16", heads),)) if heads else Demand()
    result = plan(snapshot((shape,), replicas, demand=demand))
    removed = {t.replica for t in result.terminate}
    staying = [r for r in replicas if r.name not in removed]
    assert len(staying) + result.launched("tpu") <= shape.max_replicas
    warm = shape.scarcity.warm_replicas
    idle_removed = {t.replica for t in result.terminate if t.idle}
    ready_before = [r for r in replicas if ready_spare(r, set(), set())]
    ready_after = [r for r in ready_before if r.name not in idle_removed]
    # Idle removal never takes the ready idle slices below the buffer.
    if idle_removed:
        assert len(ready_after) >= warm
    assert all(r.state is ReplicaState.RUNNING for r in replicas if r.name in idle_removed)
    timed_out = any(t.provisioning_timeout for t in result.terminate)
    if not heads and not timed_out:
        # Without demand or backoff, the buffer is filled as far as maxReplicas allows.
        coming = [r for r in staying if r.state is ReplicaState.PENDING]
        spare = len(ready_after) + len(coming) + result.launched("tpu")
        busy = len(staying) - len(ready_after) - len(coming)
        assert spare >= min(warm, shape.max_replicas - busy)
