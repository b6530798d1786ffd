"""Fallback across groups that serve the same demand: by priority, then cost; past a
group backing off to the next in the same plan, without moving running work, and
back to the preferred group for new demand once it recovers; churning groups
(slices preempted soon after they arrive) ranked after steadier ones."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.scarcity_groups import spot_and_on_demand
from tests.snapshots import pending_replica, running_replica, slice_head_gang, snapshot
from tpu_autoscaler.core.capacity import (
    CapacityProblem,
    CapacitySignal,
    CapacityStatus,
)
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.policy.churn import churning_groups
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    LaunchFailures,
    PolicyConfig,
    ReplicaState,
)

ONE_SLICE = Demand(gangs=(slice_head_gang("v6e-16", 1),))
TPU_TASKS = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 8),))
"""Small TPU demand, served by the exhaustive search (`exact_search.py`)."""
MANY_TPU_TASKS = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 16),))
"""Past the exhaustive search: served by counts (`counts.py`)."""
NOW = 1000.0


def _launched(result: Plan) -> dict[str, int]:
    return {x.group: x.replicas for x in result.launch}


def _preempted(group: str, *at_s: float) -> tuple[CapacitySignal, ...]:
    return tuple(
        CapacitySignal(group, CapacityProblem.PREEMPTED, t, "spot VM preempted", f"pod {group}-{i}")
        for i, t in enumerate(at_s)
    )


def _backing_off(snap: ClusterSnapshot, group: str) -> ClusterSnapshot:
    """`group` had a provisioning timeout 10 s ago: it backs off for 30 s more."""
    return replace(snap, launch_failures={group: LaunchFailures(1, snap.now_s - 10.0)})


# --- priority, then cost ------------------------------------------------------------


def test_equal_priority_goes_to_the_cheaper_group() -> None:
    cheap_spot = spot_and_on_demand(spot_priority=10, spot_cost=1.0, on_demand_cost=3.0)
    assert _launched(plan(snapshot(cheap_spot, demand=ONE_SLICE))) == {"spot": 1}
    cheap_on_demand = spot_and_on_demand(spot_priority=10, spot_cost=5.0, on_demand_cost=3.0)
    result = plan(snapshot(cheap_on_demand, demand=ONE_SLICE))
    assert _launched(result) == {"on-demand": 1}
    assert "lower cost" in result.launch[0].reason


def test_an_unknown_cost_ranks_after_every_known_one() -> None:
    shapes = spot_and_on_demand(spot_priority=10, spot_cost=None, on_demand_cost=30.0)
    assert _launched(plan(snapshot(shapes, demand=ONE_SLICE))) == {"on-demand": 1}


def test_without_costs_the_raycluster_order_decides_as_before() -> None:
    shapes = spot_and_on_demand(spot_priority=10, spot_cost=None, on_demand_cost=None)
    result = plan(snapshot(shapes, demand=ONE_SLICE))
    assert _launched(result) == {"spot": 1}
    assert "lower cost" not in result.launch[0].reason


def test_tasks_go_to_the_cheaper_group_by_either_search() -> None:
    for spot_cost, on_demand_cost, cheaper in ((5.0, 3.0, "on-demand"), (1.0, 3.0, "spot")):
        shapes = spot_and_on_demand(spot_cost=spot_cost, on_demand_cost=on_demand_cost)
        assert _launched(plan(snapshot(shapes, demand=TPU_TASKS))) == {cheaper: 2}
        assert _launched(plan(snapshot(shapes, demand=MANY_TPU_TASKS))) == {cheaper: 4}
    churning = replace(
        snapshot(shapes, demand=TPU_TASKS), capacity_signals=_preempted("on-demand", 400.0, 900.0)
    )
    assert _launched(plan(churning)) == {"spot": 2}
    assert _launched(plan(replace(churning, demand=MANY_TPU_TASKS))) == {"spot": 4}


def test_priority_outranks_cost() -> None:
    shapes = spot_and_on_demand(spot_priority=10, spot_cost=9.0, on_demand_priority=0)
    assert _launched(plan(snapshot(shapes, demand=ONE_SLICE))) == {"spot": 1}


# --- fallback past a group backing off ----------------------------------------------


def test_demand_moves_to_the_next_group_while_the_preferred_one_backs_off() -> None:
    shapes = spot_and_on_demand()
    result = plan(_backing_off(snapshot(shapes, demand=ONE_SLICE), "spot"))
    assert _launched(result) == {"on-demand": 1}
    assert not result.waiting


def test_fallback_never_removes_running_work_to_move_it() -> None:
    spot, on_demand = spot_and_on_demand()
    busy = running_replica(spot, 0, idle_s=0.0, used={0: {"TPU": 4.0}})
    idle_but_young = running_replica(spot, 1, idle_s=5.0)
    snap = _backing_off(
        snapshot((spot, on_demand), [busy, idle_but_young], demand=ONE_SLICE), "spot"
    )
    result = plan(snap)
    # The idle spot slice takes the new head; nothing of spot goes, nothing launches.
    assert not result.terminate
    assert _launched(result) == {}
    two = Demand(gangs=(slice_head_gang("v6e-16", 2),))
    result = plan(replace(snap, demand=two))
    assert not result.terminate
    assert _launched(result) == {"on-demand": 1}


def test_new_demand_returns_to_the_preferred_group_once_it_recovers() -> None:
    spot, on_demand = spot_and_on_demand()
    # Launched on on-demand while spot backed off; spot's backoff ended since.
    fallback = pending_replica(on_demand, 0, created_at_s=NOW - 60.0)
    recovered = replace(
        snapshot((spot, on_demand), [fallback], demand=ONE_SLICE),
        launch_failures={"spot": LaunchFailures(1, NOW - 300.0)},
    )
    # The demand already launched for stays on its pending fallback replica.
    result = plan(recovered)
    assert not result.terminate
    assert _launched(result) == {}
    # New demand beyond it goes to spot again.
    two = replace(recovered, demand=Demand(gangs=(slice_head_gang("v6e-16", 2),)))
    result = plan(two)
    assert _launched(result) == {"spot": 1}
    assert not result.terminate


# --- fallback past a stockout: launches it strands ----------------------------------


def _stocked_out(snap: ClusterSnapshot, group: str, at_s: float) -> ClusterSnapshot:
    told = CapacitySignal(
        group, CapacityProblem.STOCKOUT, at_s, "GCE out of resources", "Event FailedScaleUp"
    )
    return replace(snap, capacity_signals=(told,))


def test_a_stockout_strands_the_pending_launch_and_demand_moves_on_at_once() -> None:
    spot, on_demand = spot_and_on_demand()
    # Launched on spot 185 s ago; GKE told of the stockout 5 s ago.
    stuck = pending_replica(spot, 0, created_at_s=NOW - 185.0)
    waiting = snapshot((spot, on_demand), [stuck], demand=ONE_SLICE)
    assert _launched(plan(waiting)) == {}, "unexplained, a pending launch is capacity"
    result = plan(_stocked_out(waiting, "spot", NOW - 5.0))
    assert _launched(result) == {"on-demand": 1}
    assert not result.terminate, "the stranded launch stays: it may yet come"
    assert [c.status for c in result.capacity] == [CapacityStatus.STOCKED_OUT]
    # The same with more demand than the exhaustive search takes.
    many = replace(_stocked_out(waiting, "spot", NOW - 5.0), demand=MANY_TPU_TASKS)
    assert _launched(plan(many)) == {"on-demand": 4}


def test_a_slice_that_came_up_is_not_stranded() -> None:
    spot, on_demand = spot_and_on_demand()
    up = running_replica(spot, 0, idle_s=30.0, created_at_s=NOW - 400.0)
    stuck = pending_replica(spot, 1, created_at_s=NOW - 185.0)
    snap = _stocked_out(
        snapshot((spot, on_demand), [up, stuck], demand=ONE_SLICE), "spot", NOW - 5.0
    )
    # The running spot slice takes the head; no launch anywhere.
    assert _launched(plan(snap)) == {}
    # A pending slice one of whose hosts once joined Ray came up: capacity exists.
    joined = replace(stuck.hosts[0], registered_at_s=NOW - 20.0)  # no Ray node now
    came = replace(stuck, hosts=(joined, *stuck.hosts[1:]))
    two = Demand(gangs=(slice_head_gang("v6e-16", 2),))
    assert _launched(plan(replace(snap, replicas=(up, came), demand=two))) == {}


def test_demand_only_the_stocked_out_group_serves_waits_on_its_stranded_launch() -> None:
    spot, on_demand = spot_and_on_demand()
    no_on_demand = replace(on_demand, max_replicas=0)
    stuck = pending_replica(spot, 0, created_at_s=NOW - 185.0)
    snap = _stocked_out(
        snapshot((spot, no_on_demand), [stuck], demand=ONE_SLICE), "spot", NOW - 5.0
    )
    result = plan(snap)
    assert _launched(result) == {} and not result.terminate
    assert result.bundles_placed == 1 and not result.waiting


def test_a_stranded_launch_past_its_timeout_stays_while_demand_waits_on_it() -> None:
    spot, on_demand = spot_and_on_demand()
    timeout_s = PolicyConfig().provisioning_timeout_s
    stuck = pending_replica(spot, 0, created_at_s=NOW - timeout_s - 1.0)
    only_spot = (spot, replace(on_demand, max_replicas=0))
    snap = _stocked_out(snapshot(only_spot, [stuck], demand=ONE_SLICE), "spot", NOW - 5.0)
    result = plan(snap)
    assert not result.terminate, "a told stockout, not a broken launch, explains the wait"
    assert result.bundles_placed == 1
    # With somewhere else to go, the demand moves on and the launch goes as timed out.
    moved = plan(replace(snap, shapes=(spot, on_demand)))
    assert _launched(moved) == {"on-demand": 1}
    assert [t.replica for t in moved.terminate if t.provisioning_timeout] == [stuck.name]
    # Nothing waiting on it: it goes as timed out.
    idle = plan(replace(snap, demand=Demand()))
    assert [t.replica for t in idle.terminate if t.provisioning_timeout] == [stuck.name]
    # Unexplained by a stockout, the timeout removes it whatever waits.
    plain = plan(replace(snap, capacity_signals=()))
    assert [t.replica for t in plain.terminate if t.provisioning_timeout] == [stuck.name]


# --- churn --------------------------------------------------------------------------


def test_a_churning_group_loses_new_demand_to_a_steadier_one() -> None:
    shapes = spot_and_on_demand()
    churning = replace(
        snapshot(shapes, demand=ONE_SLICE), capacity_signals=_preempted("spot", 400.0, 900.0)
    )
    result = plan(churning)
    assert _launched(result) == {"on-demand": 1}
    assert "steadier group" in result.launch[0].reason
    (spot_capacity,) = result.capacity
    assert spot_capacity.group == "spot"
    assert spot_capacity.status is CapacityStatus.CHURNING
    assert (spot_capacity.since_s, spot_capacity.until_s) == (400.0, 900.0 + 1800.0)


def test_one_preemption_is_no_churn() -> None:
    shapes = spot_and_on_demand()
    snap = replace(snapshot(shapes, demand=ONE_SLICE), capacity_signals=_preempted("spot", 900.0))
    result = plan(snap)
    assert _launched(result) == {"spot": 1}
    assert result.capacity == ()


def test_churn_ends_a_window_after_the_last_preemption() -> None:
    shapes = spot_and_on_demand()
    signals = _preempted("spot", 400.0, 900.0)
    later = replace(
        snapshot(shapes, demand=ONE_SLICE, now_s=900.0 + 1800.0), capacity_signals=signals
    )
    assert _launched(plan(later)) == {"spot": 1}
    just_before = replace(later, now_s=900.0 + 1799.0)
    assert _launched(plan(just_before)) == {"on-demand": 1}


def test_preemptions_further_apart_than_the_window_are_no_churn() -> None:
    config = PolicyConfig()
    far_apart = _preempted("spot", 0.0, config.churn_window_s + 1.0)
    assert churning_groups(far_apart, ["spot"], config, config.churn_window_s + 2.0) == {}
    close = _preempted("spot", 1.0, config.churn_window_s + 1.0)
    assert set(churning_groups(close, ["spot"], config, config.churn_window_s + 2.0)) == {"spot"}


def test_the_preemption_count_is_configurable() -> None:
    config = PolicyConfig(churn_preemptions=3)
    two = _preempted("spot", 100.0, 200.0)
    assert churning_groups(two, ["spot"], config, 300.0) == {}
    three = _preempted("spot", 100.0, 200.0, 270.0)
    churn = churning_groups(three, ["spot"], config, 300.0)
    assert churn["spot"].since_s == 100.0
    assert "3 slice preemption(s)" in churn["spot"].reason


def test_other_problems_and_unknown_groups_are_no_churn() -> None:
    config = PolicyConfig()
    stockouts = tuple(
        CapacitySignal("spot", CapacityProblem.STOCKOUT, t, "no capacity") for t in (1.0, 2.0)
    )
    assert churning_groups(stockouts, ["spot"], config, 3.0) == {}
    assert churning_groups(_preempted("gone", 1.0, 2.0), ["spot"], config, 3.0) == {}


def test_a_churning_group_still_serves_what_nothing_else_can() -> None:
    shapes = spot_and_on_demand(max_replicas=1)
    on_demand = shapes[1]
    full = running_replica(on_demand, 0, idle_s=0.0, used={0: {"TPU": 4.0}})
    snap = replace(
        snapshot(shapes, [full], demand=ONE_SLICE),
        capacity_signals=_preempted("spot", 400.0, 900.0),
    )
    assert _launched(plan(snap)) == {"spot": 1}


def _spot_with_room_for_one(churning: bool) -> ClusterSnapshot:
    """Spot (preferred by priority and cost) holds three busy replicas of its four, so
    it has room for one more; on-demand for all four `MANY_TPU_TASKS` need."""
    shapes = spot_and_on_demand(max_replicas=4)
    busy = {host: {"TPU": 4.0} for host in range(shapes[0].hosts_per_replica)}
    replicas = [running_replica(shapes[0], i, used=busy) for i in range(3)]
    snap = snapshot(shapes, replicas, demand=MANY_TPU_TASKS)
    signals = _preempted("spot", 400.0, 900.0) if churning else ()
    return replace(snap, capacity_signals=signals)


def test_a_churning_group_with_room_for_part_is_not_cheaper_for_doing_less() -> None:
    # Found by the fallback machine: spot's option, capped at its one replica of room,
    # held a quarter of the work for 16 chips; on-demand's held all of it for 64, so
    # "fewest chips" chose spot before churn was asked. Options are compared for the
    # work each of them can hold: one replica each, a tie, so the steadier group wins.
    result = plan(_spot_with_room_for_one(churning=True))
    assert _launched(result) == {"on-demand": 4}
    assert "steadier group" in result.launch[0].reason
    # Not churning, spot still takes what it has room for, and on-demand the rest.
    assert _launched(plan(_spot_with_room_for_one(churning=False))) == {
        "spot": 1,
        "on-demand": 3,
    }


def test_churn_outranks_priority_and_cost() -> None:
    # Spot is preferred twice over (priority and cost), yet churn sends demand away.
    shapes = spot_and_on_demand(spot_priority=20, spot_cost=0.1, on_demand_priority=0)
    snap = replace(
        snapshot(shapes, demand=ONE_SLICE), capacity_signals=_preempted("spot", 800.0, 990.0)
    )
    assert _launched(plan(snap)) == {"on-demand": 1}


# --- property -----------------------------------------------------------------------


@st.composite
def _two_groups(draw: st.DrawFn) -> ClusterSnapshot:
    shapes = spot_and_on_demand(
        spot_priority=draw(st.integers(0, 2)),
        spot_cost=draw(st.sampled_from([None, 1.0, 3.0])),
        on_demand_cost=draw(st.sampled_from([None, 1.0, 3.0])),
        on_demand_priority=draw(st.integers(0, 2)),
    )
    replicas = []
    for shape in shapes:
        for i in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["busy", "idle", "pending"]))
            if kind == "pending":
                replicas.append(pending_replica(shape, i, created_at_s=NOW - 100.0))
            elif kind == "busy":
                replicas.append(running_replica(shape, i, used={0: {"TPU": 4.0}}))
            else:
                idle_s = draw(st.sampled_from([1.0, 30.0, 600.0]))
                replicas.append(running_replica(shape, i, idle_s=idle_s))
    heads = draw(st.integers(0, 3))
    demand = Demand(gangs=(slice_head_gang("v6e-16", heads),)) if heads else Demand()
    failures = {
        g: LaunchFailures(1, NOW - 10.0) for g in ("spot", "on-demand") if draw(st.booleans())
    }
    preemptions = _preempted("spot", *draw(st.lists(st.sampled_from([100.0, 500.0, 990.0]))))
    return replace(
        snapshot(shapes, replicas, demand=demand),
        launch_failures=failures,
        capacity_signals=preemptions,
    )


@settings(max_examples=150, deadline=None)
@given(_two_groups())
def test_fallback_never_removes_a_busy_or_young_replica(snap: ClusterSnapshot) -> None:
    result = plan(snap)
    by_name = {r.name: r for r in snap.replicas}
    shapes = {s.group: s for s in snap.shapes}
    for removal in result.terminate:
        replica = by_name[removal.replica]
        assert removal.idle
        assert replica.state is ReplicaState.RUNNING
        assert all(h.idle_s > shapes[replica.group].idle_timeout_s for h in replica.hosts)
    for launch in result.launch:
        # No launch into a group backing off, whatever the ranking.
        assert launch.group not in snap.launch_failures
