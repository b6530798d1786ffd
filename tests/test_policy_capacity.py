"""Each group's capacity state (`core/policy/capacity.py`): stocked out after stockout,
quota or node pool signals, backing off after launches that failed, available again
once capacity returned; a blocked group gets no new launch, its pending replicas stay.
Also the jittered backoff and, over generated snapshots, that no blocked group ever
launches."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.snapshots import pending_replica, running_replica, snapshot, v6e_16_shapes
from tests.test_policy_properties import snapshots
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal, CapacityStatus
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.plan import GroupVerdict, Plan
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.policy.capacity import SHORTAGES
from tpu_autoscaler.core.snapshot import ClusterSnapshot, LaunchFailures, PolicyConfig

SOURCE = "Event FailedScaleUp on pod tpu-r1-h0"


def _slice_demand(count: int = 1) -> Demand:
    return Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 4 * count),))


def _signal(at_s: float, problem: CapacityProblem = CapacityProblem.STOCKOUT) -> CapacitySignal:
    return CapacitySignal("tpu", problem, at_s, "GCE out of resources", SOURCE)


def _with_signals(snap: ClusterSnapshot, *signals: CapacitySignal) -> ClusterSnapshot:
    return replace(snap, capacity_signals=signals)


def _capacity(result: Plan) -> dict[str, tuple[CapacityStatus, float | None, float | None]]:
    return {c.group: (c.status, c.since_s, c.until_s) for c in result.capacity}


def test_a_recent_stockout_blocks_new_launches_and_says_why() -> None:
    shapes = v6e_16_shapes()
    result = plan(
        _with_signals(snapshot(shapes, demand=_slice_demand(), now_s=1300), _signal(1200))
    )
    assert result.launch == ()
    (state,) = result.capacity
    assert (state.status, state.since_s, state.until_s) == (CapacityStatus.STOCKED_OUT, 1200, 1800)
    assert state.reason == f"stocked out since t=1200s: GCE out of resources ({SOURCE})"
    (waiting,) = result.waiting
    (verdict,) = waiting.groups
    assert (
        verdict.verdict is GroupVerdict.SKIPPED and "stocked out since t=1200s" in verdict.message
    )


def test_quota_and_node_pool_failures_stock_out_too() -> None:
    shapes = v6e_16_shapes()
    for problem in (CapacityProblem.QUOTA, CapacityProblem.NODE_POOL_FAILED):
        snap = _with_signals(
            snapshot(shapes, demand=_slice_demand(), now_s=1300), _signal(1200, problem)
        )
        assert plan(snap).launch == (), problem


def test_stocked_out_since_the_first_signal_of_the_run() -> None:
    shapes = v6e_16_shapes()
    close = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1600),
        _signal(1000),
        _signal(1300),
        _signal(1500),
    )
    assert _capacity(plan(close))["tpu"] == (CapacityStatus.STOCKED_OUT, 1000, 2100)
    # 800 s apart, more than the 600 s hold: the earlier one belongs to an older run.
    apart = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1100), _signal(200), _signal(1000)
    )
    assert _capacity(plan(apart))["tpu"] == (CapacityStatus.STOCKED_OUT, 1000, 1600)


def test_a_stockout_older_than_the_hold_no_longer_counts() -> None:
    shapes = v6e_16_shapes()
    result = plan(
        _with_signals(snapshot(shapes, demand=_slice_demand(), now_s=1800), _signal(1200))
    )
    assert result.capacity == () and result.launched("tpu") == 1


def test_a_launch_that_came_up_after_the_signal_means_capacity_returned() -> None:
    (shape,) = v6e_16_shapes()
    # Launched after the stockout at 1200 and up since: the shape has capacity again.
    up = running_replica(shape, 0, used={i: {"TPU": 4.0} for i in range(4)}, created_at_s=1250)
    snap = _with_signals(snapshot((shape,), [up], _slice_demand(), now_s=1400), _signal(1200))
    result = plan(snap)
    assert result.capacity == () and result.launched("tpu") == 1
    # A launch older than the signal proves nothing.
    older = replace(up, created_at_s=1100)
    assert plan(replace(snap, replicas=(older,))).launch == ()


def test_pending_replicas_of_a_stocked_out_group_stay() -> None:
    (shape,) = v6e_16_shapes()
    waiting = pending_replica(shape, 0, created_at_s=1000)
    snap = _with_signals(snapshot((shape,), [waiting], _slice_demand(2), now_s=1300), _signal(1200))
    result = plan(snap)
    assert result.terminate == () and result.launch == ()
    assert result.bundles_placed == 4  # the pending replica still counts as capacity


def test_min_replicas_wait_while_stocked_out() -> None:
    shapes = v6e_16_shapes(min_replicas=1)
    assert plan(snapshot(shapes, now_s=1300)).launched("tpu") == 1
    assert plan(_with_signals(snapshot(shapes, now_s=1300), _signal(1200))).launch == ()


def test_timed_out_signals_back_off_with_jitter() -> None:
    shapes = v6e_16_shapes()
    timed_out = _signal(1200, CapacityProblem.TIMED_OUT)
    config = PolicyConfig()
    until = config.backoff_until(LaunchFailures(1, 1200), "tpu")
    assert 1230 <= until <= 1236
    blocked = _with_signals(snapshot(shapes, demand=_slice_demand(), now_s=until - 1), timed_out)
    result = plan(blocked)
    assert result.launch == ()
    assert _capacity(result)["tpu"] == (CapacityStatus.BACKING_OFF, 1200, until)
    (waiting,) = result.waiting
    assert "backs off until" in waiting.reason
    assert plan(replace(blocked, now_s=until)).launched("tpu") == 1


def test_launch_failures_and_timed_out_signals_are_not_counted_twice() -> None:
    shapes = v6e_16_shapes()
    failures = {"tpu": LaunchFailures(1, 1200)}
    snap = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1201, launch_failures=failures),
        _signal(1200, CapacityProblem.TIMED_OUT),
    )
    (state,) = plan(snap).capacity
    assert state.until_s == PolicyConfig().backoff_until(LaunchFailures(1, 1200), "tpu")


@settings(max_examples=300, deadline=None)
@given(
    group=st.text(min_size=1, max_size=12),
    base=st.floats(1, 120),
    cap=st.floats(1, 3600),
    jitter=st.floats(0, 1),
    count=st.integers(1, 30),
)
def test_jittered_backoff_is_bounded_and_monotone(
    group: str, base: float, cap: float, jitter: float, count: int
) -> None:
    config = PolicyConfig(backoff_base_s=base, backoff_cap_s=cap, backoff_jitter=jitter)
    delay = config.backoff_until(LaunchFailures(count, 0), group)
    plain = base * 2.0 ** (count - 1)
    assert min(cap, plain) - 1e-6 <= delay <= min(cap, plain * (1 + jitter)) + 1e-6
    assert delay <= config.backoff_until(LaunchFailures(count + 1, 0), group) + 1e-6
    assert delay == config.backoff_until(LaunchFailures(count, 0), group)  # repeatable


def test_jitter_spreads_groups_that_failed_together() -> None:
    config = PolicyConfig()
    retries = {config.backoff_until(LaunchFailures(1, 0), f"group-{i}") for i in range(10)}
    assert len(retries) == 10 and all(30 <= r <= 36 for r in retries)


SIGNALS = st.lists(
    st.builds(
        CapacitySignal,
        group=st.sampled_from(["tpu0", "tpu1", "tpu2", "cpu"]),
        problem=st.sampled_from(list(CapacityProblem)),
        at_s=st.sampled_from([0.0, 390.0, 500.0, 900.0, 990.0, 1000.0]),
        message=st.just("out of resources"),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    snap=snapshots(),
    signals=SIGNALS,
    failures=st.dictionaries(
        st.sampled_from(["tpu0", "tpu1", "cpu"]),
        st.builds(LaunchFailures, st.integers(1, 6), st.sampled_from([700.0, 950.0, 999.0])),
        max_size=2,
    ),
)
def test_no_group_stocked_out_or_backing_off_gets_a_launch(
    snap: ClusterSnapshot, signals: list[CapacitySignal], failures: dict[str, LaunchFailures]
) -> None:
    known = {s.group for s in snap.shapes}
    snap = replace(
        snap,
        capacity_signals=tuple(signals),
        launch_failures={g: f for g, f in failures.items() if g in known},
    )
    result = plan(snap)
    blocked = {
        c.group
        for c in result.capacity
        if c.status in (CapacityStatus.STOCKED_OUT, CapacityStatus.BACKING_OFF)
    }
    launched = {launch.group for launch in result.launch}
    assert not blocked & launched
    # Independently of the plan's own report: a shortage heard within the hold, with no
    # launch made since that came up, stocks the group out.
    hold = snap.config.stockout_hold_s
    for signal in signals:
        answered = any(
            r.group == signal.group
            and r.created_at_s >= signal.at_s
            and any(h.registered for h in r.hosts)
            for r in snap.replicas
        )
        if signal.problem in SHORTAGES and snap.now_s - hold < signal.at_s and not answered:
            assert signal.group not in launched, signal
    for state in result.capacity:
        assert state.until_s is None or state.until_s > snap.now_s
        assert state.reason


def test_capacity_that_returned_stays_returned_when_the_replica_that_showed_it_goes() -> None:
    """Found by `make fuzz` (FallbackCluster): the spot replica that came up after a
    stockout was preempted and removed as broken; the plan's first pass, which saw it,
    launched spot, and its second pass, which no longer did, reported spot stocked out
    since the old signal: a launch into a group its own plan calls stocked out."""
    (shape,) = v6e_16_shapes()
    up = running_replica(shape, 0, created_at_s=1250)
    broken = replace(up, hosts=(replace(up.hosts[0], dead=True), *up.hosts[1:]))
    snap = _with_signals(snapshot((shape,), [broken], _slice_demand(), now_s=1400), _signal(1200))
    result = plan(snap)
    assert [t.replica for t in result.terminate] == [broken.name]
    assert result.launched("tpu") == 1 and result.capacity == ()
    # The next round, once the broken replica is gone, remembers it as well.
    after = snap.after(result)
    assert after.capacity_returned_s == {"tpu": 1250}
    gone = replace(after, replicas=(), now_s=1410)
    assert _capacity(plan(gone)) == {}


def test_a_backoff_says_since_when_how_many_and_what_failed() -> None:
    """The report a platform engineer reads: since the last failure, how many failed,
    and the signal that said so (or the launches that were not up in time)."""
    shapes = v6e_16_shapes()
    config = PolicyConfig()
    counted = {"tpu": LaunchFailures(3, 1200)}
    snap = snapshot(shapes, demand=_slice_demand(), now_s=1201, launch_failures=counted)
    (state,) = plan(snap).capacity
    until = config.backoff_until(LaunchFailures(3, 1200), "tpu")
    assert (state.status, state.since_s, state.until_s) == (
        CapacityStatus.BACKING_OFF,
        1200,
        until,
    )
    assert state.reason == (
        f"backs off until t={until:.0f}s after 3 failed launch(es): launches not up in time"
    )
    # One TIMED_OUT signal beside three counted failures: three, and its words.
    told = _with_signals(snap, _signal(1150, CapacityProblem.TIMED_OUT))
    (state,) = plan(told).capacity
    assert state.reason == (
        f"backs off until t={until:.0f}s after 3 failed launch(es): GCE out of resources ({SOURCE})"
    )
    # A signal read without a source is quoted as it is.
    bare = CapacitySignal("tpu", CapacityProblem.TIMED_OUT, 1150, "not up in time")
    (state,) = plan(_with_signals(snap, bare)).capacity
    assert state.reason.endswith("after 3 failed launch(es): not up in time")


def test_stockout_runs_and_answers_at_their_boundaries() -> None:
    shapes = v6e_16_shapes()
    # Two signals within the hold are one run, since the first.
    two = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1300), _signal(1000), _signal(1200)
    )
    assert _capacity(plan(two))["tpu"] == (CapacityStatus.STOCKED_OUT, 1000, 1800)
    # Exactly the hold apart: two runs, since the later.
    apart = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1700), _signal(1000), _signal(1600)
    )
    assert _capacity(plan(apart))["tpu"] == (CapacityStatus.STOCKED_OUT, 1600, 2200)
    # A signal heard this very second counts.
    now = _with_signals(snapshot(shapes, demand=_slice_demand(), now_s=1300), _signal(1300))
    assert _capacity(plan(now))["tpu"] == (CapacityStatus.STOCKED_OUT, 1300, 1900)
    # A launch made the second the signal came, that came up since, answers it.
    (shape,) = shapes
    up = running_replica(shape, 0, used={i: {"TPU": 4.0} for i in range(4)}, created_at_s=1200)
    same_second = _with_signals(snapshot(shapes, [up], _slice_demand(), now_s=1400), _signal(1200))
    assert plan(same_second).capacity == ()


def test_stocked_out_and_backing_off_at_once_report_the_later_end() -> None:
    shapes = v6e_16_shapes()
    failures = {"tpu": LaunchFailures(6, 1290)}  # backs off ~600 s, past the stockout
    snap = _with_signals(
        snapshot(shapes, demand=_slice_demand(), now_s=1300, launch_failures=failures),
        _signal(1000),
    )
    until = PolicyConfig().backoff_until(LaunchFailures(6, 1290), "tpu")
    assert until > 1600
    assert _capacity(plan(snap))["tpu"] == (CapacityStatus.BACKING_OFF, 1290, until)
    # A short backoff inside a longer stockout: the stockout is reported.
    short = replace(snap, launch_failures={"tpu": LaunchFailures(1, 1290)})
    assert _capacity(plan(short))["tpu"] == (CapacityStatus.STOCKED_OUT, 1000, 1600)


def test_a_launch_timing_out_in_this_pass_backs_off_as_one_failure() -> None:
    (shape,) = v6e_16_shapes()
    late = pending_replica(shape, 0, created_at_s=0)
    result = plan(snapshot((shape,), [late], _slice_demand(), now_s=1000))
    assert [t.replica for t in result.terminate] == [late.name]
    (state,) = result.capacity
    assert state.status is CapacityStatus.BACKING_OFF
    assert state.reason.endswith("after 1 failed launch(es): launches not up in time")
    assert state.since_s == 1000  # the timeout is now: since then, not unknown
