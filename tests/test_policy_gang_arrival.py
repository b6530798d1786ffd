"""All-or-nothing gangs of slices (`core/policy/gang_arrival.py`): a gang's slices are
launched in one plan; if some arrive and the rest do not within the gang arrival
bound, the arrived idle ones are given back and the group backs off; within the bound
nothing goes; `slice_placement_group`'s slice 1 is kept and reused, its slice 2 left
pending."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.factories import tpu_group
from tests.snapshots import (
    pending_replica,
    running_replica,
    shapes_for,
    slice_head_gang,
    snapshot,
    v6e_16_shapes,
)
from tpu_autoscaler.cli import EXIT_BAD_INPUT, main
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal, CapacityStatus
from tpu_autoscaler.core.demand import Bundle, Demand, GangDemand, GangStrategy
from tpu_autoscaler.core.demand import selector_from_mapping as selector
from tpu_autoscaler.core.plan import RemovalCause
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState

BOUND_S = 240.0
TWO_SLICE_GANG = GangDemand(
    "pg-two-slices",
    (Bundle({"TPU": 4.0}, selector({"ray.io/tpu-pod-type": "v6e-16"})),) * 8,
    GangStrategy.STRICT_SPREAD,
)


def _arrived(shape: SliceShape, index: int, registered_at_s: float, now_s: float) -> Replica:
    """Up since `registered_at_s` and unused since: idle as long as it is registered."""
    replica = running_replica(shape, index, idle_s=now_s - registered_at_s, created_at_s=0)
    hosts = tuple(replace(h, registered_at_s=registered_at_s) for h in replica.hosts)
    return replace(replica, hosts=hosts)


def _gang_snapshot(now_s: float, registered_at_s: float = 120.0) -> ClusterSnapshot:
    (shape,) = v6e_16_shapes(max_replicas=2)
    return snapshot(
        (shape,),
        [_arrived(shape, 0, registered_at_s, now_s), pending_replica(shape, 1, created_at_s=0)],
        Demand(gangs=(TWO_SLICE_GANG,)),
        now_s=now_s,
    )


def test_a_gang_is_launched_whole_in_one_plan() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    result = plan(snapshot((shape,), [], Demand(gangs=(TWO_SLICE_GANG,)), now_s=0))
    assert result.launched("tpu") == 2


def test_within_the_bound_the_arrived_slice_waits_for_its_sibling() -> None:
    result = plan(_gang_snapshot(now_s=BOUND_S - 1))
    assert result.terminate == () and result.launch == () and result.capacity == ()


def test_past_the_bound_the_arrived_slice_is_given_back_and_the_group_backs_off() -> None:
    result = plan(_gang_snapshot(now_s=BOUND_S))
    causes = {t.replica: t.cause for t in result.terminate}
    assert causes == {
        "tpu-r1": RemovalCause.PROVISIONING_TIMEOUT,
        "tpu-r0": RemovalCause.GANG_INCOMPLETE,
    }
    given_back = next(t for t in result.terminate if t.cause is RemovalCause.GANG_INCOMPLETE)
    assert "240s gang arrival bound" in given_back.reason and given_back.idle
    assert result.launch == ()
    (state,) = result.capacity
    assert state.status is CapacityStatus.BACKING_OFF and state.until_s is not None
    assert BOUND_S + 30 <= state.until_s <= BOUND_S + 36
    (waiting,) = result.waiting
    assert "backs off until" in waiting.reason


def test_an_arrived_slice_idle_less_than_its_timeout_is_not_yet_given_back() -> None:
    # Up at 200 s: idle 40 s at the bound, less than the 60 s idle timeout.
    snap = _gang_snapshot(now_s=BOUND_S, registered_at_s=200.0)
    result = plan(snap)
    assert [(t.replica, t.cause) for t in result.terminate] == [
        ("tpu-r1", RemovalCause.PROVISIONING_TIMEOUT)
    ]
    # Backing off, its sibling gone: the gang cannot hold it, so idleness takes it.
    (arrived,) = snap.after(result).replicas
    idle = replace(arrived, hosts=tuple(replace(h, idle_s=61.0) for h in arrived.hosts))
    later = plan(replace(snap.after(result), replicas=(idle,), now_s=261))
    assert later.launch == ()
    assert [(t.replica, t.cause) for t in later.terminate] == [("tpu-r0", RemovalCause.IDLE)]


def test_a_slice_that_ran_work_is_no_gang_sibling() -> None:
    snap = _gang_snapshot(now_s=BOUND_S + 60)
    used = replace(
        snap.replicas[0], hosts=tuple(replace(h, idle_s=5.0) for h in snap.replicas[0].hosts)
    )
    result = plan(replace(snap, replicas=(used, snap.replicas[1])))
    assert not any(t.replica == "tpu-r1" for t in result.terminate)


def test_registration_times_are_not_needed() -> None:
    """A snapshot file carries no registration times: idleness alone tells."""
    snap = _gang_snapshot(now_s=BOUND_S + 60)
    unknown = replace(
        snap.replicas[0],
        hosts=tuple(replace(h, registered_at_s=None) for h in snap.replicas[0].hosts),
    )
    result = plan(replace(snap, replicas=(unknown, snap.replicas[1])))
    assert {t.replica for t in result.terminate} == {"tpu-r0", "tpu-r1"}


def _head_holder(shape: SliceShape, now_s: float) -> Replica:
    """Slice 1 of slice_placement_group: worker 0's head reserved, nothing else used."""
    replica = running_replica(shape, 0, used={0: {"TPU-v6e-16-head": 1.0}}, created_at_s=0)
    hosts = tuple(
        replace(h, registered_at_s=120.0, idle_s=0.0 if h.host_index == 0 else now_s - 120.0)
        for h in replica.hosts
    )
    return replace(replica, hosts=hosts)


def test_sequential_heads_slice_one_stays_while_slice_two_is_within_its_bound() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    now = 230.0
    snap = snapshot(
        (shape,),
        [_head_holder(shape, now), pending_replica(shape, 1, created_at_s=130)],
        Demand(gangs=(slice_head_gang("v6e-16", gang_id="head-2"),)),
        now_s=now,
    )
    result = plan(snap)
    assert result.terminate == () and result.launch == ()
    # The user's retry after a head timeout: head 1 again, on the arrived slice.
    released = replace(
        snap.replicas[0],
        hosts=tuple(
            replace(h, idle_s=100.0, available=dict(h.total)) for h in snap.replicas[0].hosts
        ),
    )
    retry = replace(
        snap,
        replicas=(released, snap.replicas[1]),
        demand=Demand(gangs=(slice_head_gang("v6e-16", gang_id="head-1"),)),
    )
    reused = plan(retry)
    assert reused.terminate == () and reused.launch == ()


def test_sequential_heads_slice_two_stays_pending_past_the_bound() -> None:
    """Slice 1 holds head 1 either way; slice 2, pending, holds no chips and is first in
    line when capacity returns: it waits for the provisioning timeout."""
    (shape,) = v6e_16_shapes(max_replicas=2)
    now = 130.0 + BOUND_S + 300
    snap = snapshot(
        (shape,),
        [_head_holder(shape, now), pending_replica(shape, 1, created_at_s=130)],
        Demand(gangs=(slice_head_gang("v6e-16", gang_id="head-2"),)),
        now_s=now,
    )
    result = plan(snap)
    assert result.terminate == () and result.launch == ()
    timed_out = plan(replace(snap, now_s=130.0 + 900))
    assert [(t.replica, t.cause) for t in timed_out.terminate] == [
        ("tpu-r1", RemovalCause.PROVISIONING_TIMEOUT)
    ]


def test_a_lone_pending_slice_waits_for_the_provisioning_timeout() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    snap = snapshot(
        (shape,),
        [pending_replica(shape, 0, created_at_s=0)],
        Demand(gangs=(TWO_SLICE_GANG,)),
        now_s=600,
    )
    result = plan(snap)
    assert result.terminate == ()


def test_a_slice_that_ran_other_work_and_went_idle_is_held_for_the_gang_too() -> None:
    """Found by the stateful machine: slice 0 ran a task after slice 1 was launched for
    the gang, then went idle; the pass holds it for the gang as a fresh one."""
    (shape,) = v6e_16_shapes(max_replicas=2)
    now = 1000.0 + BOUND_S
    earlier = running_replica(shape, 0, idle_s=now - 1050.0, created_at_s=1000.0)
    earlier = replace(
        earlier, hosts=tuple(replace(h, registered_at_s=1030.0) for h in earlier.hosts)
    )
    snap = snapshot(
        (shape,),
        [earlier, pending_replica(shape, 1, created_at_s=1000.0)],
        Demand(gangs=(TWO_SLICE_GANG,)),
        now_s=now,
    )
    causes = {t.replica: t.cause for t in plan(snap).terminate}
    assert causes == {
        "tpu-r1": RemovalCause.PROVISIONING_TIMEOUT,
        "tpu-r0": RemovalCause.GANG_INCOMPLETE,
    }


def test_slices_given_back_stop_at_min_replicas() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2, min_replicas=1)
    snap = replace(_gang_snapshot(now_s=BOUND_S), shapes=(shape,))
    assert [(t.replica, t.cause) for t in plan(snap).terminate] == [
        ("tpu-r1", RemovalCause.PROVISIONING_TIMEOUT)
    ]


def test_the_bound_is_a_flag_that_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    snapshot_file = Path(__file__).parent.parent / "examples/snapshots/idle-slice.yaml"
    assert main(["plan", "--gang-arrival-bound-s", "0", str(snapshot_file)]) == EXIT_BAD_INPUT
    assert "--gang-arrival-bound-s must be positive" in capsys.readouterr().err
    assert main(["plan", "--gang-arrival-bound-s", "120", str(snapshot_file)]) == 0


SPREAD_GANG = GangDemand(
    "pg-any-four-hosts", (Bundle({"TPU": 4.0}),) * 4, GangStrategy.STRICT_SPREAD
)
"""No selector: it lands on single-host and multi-host groups alike."""


def _across_groups(
    now_s: float, *extra: Replica, demand: Demand | None = None, min_singles: int = 0
) -> ClusterSnapshot:
    """Two single-host replicas up since 120 s and a 4-host slice pending since 0 s,
    launched together for a gang that spans both groups."""
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    shapes = shapes_for(
        tpu_group("tpu", catalog.slice_type(v6e, "4x4"), 0, 2),  # type: ignore[arg-type]
        tpu_group("singles", catalog.slice_type(v6e, "2x2"), min_singles, 4),  # type: ignore[arg-type]
    )
    tpu, singles = shapes
    replicas = [
        _arrived(singles, 0, 120.0, now_s),
        _arrived(singles, 1, 120.0, now_s),
        pending_replica(tpu, 0, created_at_s=0),
        *extra,
    ]
    return snapshot(shapes, replicas, demand or Demand(gangs=(SPREAD_GANG,)), now_s=now_s)


def test_a_gang_across_groups_gives_back_the_arrived_replicas_of_the_other_group() -> None:
    """Found by the clash machine: single-host replicas launched with a slice for one
    STRICT_SPREAD gang were held idle until a stockout ended, long past the bound."""
    assert plan(_across_groups(now_s=BOUND_S - 1)).terminate == ()
    result = plan(_across_groups(now_s=BOUND_S))
    causes = {t.replica: t.cause for t in result.terminate}
    assert causes == {
        "tpu-r0": RemovalCause.PROVISIONING_TIMEOUT,
        "singles-r0": RemovalCause.GANG_INCOMPLETE,
        "singles-r1": RemovalCause.GANG_INCOMPLETE,
    }
    given_back = next(t for t in result.terminate if t.replica == "singles-r0")
    assert "(tpu-r0) did not come within the 240s gang arrival bound" in given_back.reason
    assert [s.group for s in result.capacity] == ["tpu"]


def test_a_gang_across_groups_waits_while_any_replica_is_pending_within_the_bound() -> None:
    """The idle ones may wait for the young pending one instead."""
    (_, singles) = _across_groups(now_s=0).shapes
    young = pending_replica(singles, 2, created_at_s=100.0)
    assert plan(_across_groups(BOUND_S, young)).terminate == ()


def test_without_a_pending_gang_no_replica_is_taken_for_another_group_s_sibling() -> None:
    result = plan(_across_groups(BOUND_S, demand=Demand()))
    assert not any(t.replica == "tpu-r0" for t in result.terminate)
    assert RemovalCause.GANG_INCOMPLETE not in {t.cause for t in result.terminate}


def test_an_idle_replica_of_a_group_no_pending_gang_spans_is_no_sibling() -> None:
    """Found by the clash machine with a first version of the rule: slice 2 of a
    slice_placement_group (its head needs a v6e-16 host) went at the bound because an
    idle single-host replica minReplicas kept was taken for its sibling."""
    heads = Demand(gangs=(slice_head_gang("v6e-16"),))
    result = plan(_across_groups(BOUND_S, demand=heads))
    assert {(t.replica, t.cause) for t in result.terminate} == {
        ("singles-r0", RemovalCause.IDLE),
        ("singles-r1", RemovalCause.IDLE),
    }
    # A gang only the single-host group can take waits for none of the late slice.
    v6e_4 = (Bundle({"TPU": 4.0}, selector({"ray.io/tpu-pod-type": "v6e-4"})),) * 3
    singles_only = Demand(gangs=(GangDemand("pg-singles", v6e_4, GangStrategy.STRICT_SPREAD),))
    result = plan(_across_groups(BOUND_S, demand=singles_only))
    assert not any(t.replica == "tpu-r0" for t in result.terminate)


def test_a_stockout_holds_no_arrived_slice_past_the_bound_for_a_gang() -> None:
    """Found by the clash machine: the gang's late slice, past the 900 s provisioning
    timeout, was reprieved as first in line while GKE said stocked out (the gang was
    placed on it and the arrived one), so the arrived one was held idle for the whole
    stockout (395 s against a 240 s bound). A stranded slice is kept for demand that
    waits on it alone; a gang's goes the way of its late slices: both go, the arrived
    one given back."""
    now = 1000.0
    snap = _gang_snapshot(now_s=now, registered_at_s=now - 120.0)
    stockout = CapacitySignal("tpu", CapacityProblem.STOCKOUT, now - 20.0, "GCE out of resources")
    result = plan(replace(snap, capacity_signals=(stockout,)))
    causes = {t.replica: t.cause for t in result.terminate}
    assert causes == {
        "tpu-r1": RemovalCause.PROVISIONING_TIMEOUT,
        "tpu-r0": RemovalCause.GANG_INCOMPLETE,
    }
    (state,) = result.capacity
    assert state.status is CapacityStatus.STOCKED_OUT and result.launch == ()
    given_back = next(t for t in result.terminate if t.replica == "tpu-r0")
    assert "other slice(s) (tpu-r1) did not come" in given_back.reason
    # The same with the late slice listed first.
    reordered = replace(snap, replicas=snap.replicas[::-1], capacity_signals=(stockout,))
    assert {t.replica: t.cause for t in plan(reordered).terminate} == causes


def test_across_groups_the_late_slice_goes_whole_and_min_replicas_keeps_its_share() -> None:
    snap = _across_groups(BOUND_S, min_singles=1)
    result = plan(snap)
    late = next(r for r in snap.replicas if r.name == "tpu-r0")
    (timed_out,) = [t for t in result.terminate if t.replica == "tpu-r0"]
    assert timed_out.pods == tuple(h.pod_name for h in late.hosts)
    assert timed_out.reason.startswith("pending 240s, past the 240s gang arrival bound while")
    given_back = [t for t in result.terminate if t.cause is RemovalCause.GANG_INCOMPLETE]
    assert len(given_back) == 1  # one of the two: minReplicas keeps the other
    (back,) = given_back
    replica = next(r for r in snap.replicas if r.name == back.replica)
    assert back.group == "singles" and back.pods == tuple(h.pod_name for h in replica.hosts)


def test_a_requested_replica_is_awaited_too() -> None:
    """Counted in `replicas`, its pods not made yet: the idle ones may wait for it,
    however long ago it was asked for (it is no late slice: nothing was provisioned)."""
    (tpu, _) = _across_groups(now_s=0).shapes
    for asked_at_s in (200.0, -1000.0):
        asked = replace(
            pending_replica(tpu, 1, created_at_s=asked_at_s), state=ReplicaState.REQUESTED
        )
        result = plan(_across_groups(BOUND_S, replace(asked, hosts=())))
        assert not any(t.replica == "tpu-r1" for t in result.terminate), asked_at_s
        assert RemovalCause.GANG_INCOMPLETE not in {t.cause for t in result.terminate}


def test_the_same_group_rule_holds_while_another_group_awaits_a_replica() -> None:
    (tpu, singles) = _across_groups(now_s=0).shapes
    sibling = _arrived(tpu, 1, 120.0, BOUND_S)
    young = pending_replica(singles, 2, created_at_s=100.0)
    causes = {t.replica: t.cause for t in plan(_across_groups(BOUND_S, sibling, young)).terminate}
    assert causes["tpu-r0"] is RemovalCause.PROVISIONING_TIMEOUT
    assert causes["tpu-r1"] is RemovalCause.GANG_INCOMPLETE
    assert "singles-r0" not in causes and "singles-r1" not in causes


def test_a_slice_removed_as_broken_makes_no_sibling_of_the_arrived_one() -> None:
    """Only a slice removed for its provisioning timeout counts as late: one removed as
    broken (half its pods) was no launch the arrived one waits for."""
    snap = _gang_snapshot(now_s=BOUND_S - 1)
    arrived, pending = snap.replicas
    broken = replace(pending, hosts=pending.hosts[:2], created_at_s=-600.0)
    causes = {t.replica: t.cause for t in plan(replace(snap, replicas=(arrived, broken))).terminate}
    assert causes == {"tpu-r1": RemovalCause.UNHEALTHY}


def test_a_gang_slice_given_back_never_takes_the_warm_buffer() -> None:
    """Found by hypothesis in test_policy_warm: the arrived slice is also the group's one
    warm slice; idle removal keeps it, and so does the gang rule."""
    snap = _gang_snapshot(now_s=BOUND_S)
    (shape,) = snap.shapes
    warm = replace(shape, scarcity=replace(shape.scarcity, warm_replicas=1))
    causes = {t.replica: t.cause for t in plan(replace(snap, shapes=(warm,))).terminate}
    assert causes == {"tpu-r1": RemovalCause.PROVISIONING_TIMEOUT}


@pytest.mark.parametrize("single_created_at_s", [0.0, 500.0])
def test_a_group_whose_own_late_slice_goes_still_waits_across_groups(
    single_created_at_s: float,
) -> None:
    """Found by `test_plan_is_idempotent_and_deterministic` (random examples, twice): a
    single pending past its provisioning timeout (created at 0 s), or past the gang
    arrival bound with the arrived singles waiting for it (at 500 s), made the whole
    group count as waiting for its own late one, so the 4-host slice late past the
    bound stayed, and the plan after this one (the single gone) removed it: what a
    round decides must not wait for the round after it."""
    now = 1000.0
    (_, singles) = _across_groups(now_s=0).shapes
    late_single = pending_replica(singles, 2, created_at_s=single_created_at_s)
    snap = _across_groups(now, late_single)
    late_tpu = next(r for r in snap.replicas if r.name == "tpu-r0")
    arrived = [_arrived(singles, i, now - 20.0, now) for i in (0, 1)]  # idle within timeout
    snap = replace(snap, replicas=(*arrived, replace(late_tpu, created_at_s=500.0), late_single))
    first = plan(snap)
    assert {(t.replica, t.cause) for t in first.terminate} == {
        ("singles-r2", RemovalCause.PROVISIONING_TIMEOUT),
        ("tpu-r0", RemovalCause.PROVISIONING_TIMEOUT),
    }
    again = plan(snap.after(first))
    assert again.terminate == () and again.launch == ()
    # Idle past their timeout, the arrived singles are given back once, for their own
    # late single, though they count as siblings across groups too.
    idle = [_arrived(singles, i, now - 100.0, now) for i in (0, 1)]
    longer = replace(snap, replicas=(*idle, *snap.replicas[2:]))
    removed = [t.replica for t in plan(longer).terminate]
    assert sorted(removed) == ["singles-r0", "singles-r1", "singles-r2", "tpu-r0"]


def test_a_group_whose_own_late_slice_goes_waits_for_a_young_pending_replica_first() -> None:
    """As above, with a single pending within the bound too: the arrived singles may
    wait for it, so the 4-host slice is no late sibling of theirs yet."""
    now = 1000.0
    (_, singles) = _across_groups(now_s=0).shapes
    late_single = pending_replica(singles, 2, created_at_s=500.0)
    young = pending_replica(singles, 3, created_at_s=now - 100.0)
    snap = _across_groups(now, late_single, young)
    late_tpu = next(r for r in snap.replicas if r.name == "tpu-r0")
    arrived = [_arrived(singles, i, now - 20.0, now) for i in (0, 1)]
    snap = replace(
        snap, replicas=(*arrived, replace(late_tpu, created_at_s=500.0), late_single, young)
    )
    assert {(t.replica, t.cause) for t in plan(snap).terminate} == {
        ("singles-r2", RemovalCause.PROVISIONING_TIMEOUT),
    }


def test_every_other_group_is_given_back_across_groups_after_one_given_back_for_its_own() -> None:
    """Three groups: `singles`, whose own late single timed out this pass (given back
    for it, above), is listed before `more`, a group with no late replica of its own
    whose idle replica came for the same spanning gang: it is given back too."""
    now = 1000.0
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    shapes = shapes_for(
        tpu_group("tpu", catalog.slice_type(v6e, "4x4"), 0, 2),  # type: ignore[arg-type]
        tpu_group("singles", catalog.slice_type(v6e, "2x2"), 0, 4),  # type: ignore[arg-type]
        tpu_group("more", catalog.slice_type(v6e, "2x2"), 0, 4),  # type: ignore[arg-type]
    )
    tpu, singles, more = shapes
    replicas = (
        _arrived(singles, 0, now - 100.0, now),
        _arrived(singles, 1, now - 100.0, now),
        _arrived(more, 0, now - 100.0, now),
        replace(pending_replica(tpu, 0, created_at_s=0), created_at_s=500.0),
        pending_replica(singles, 2, created_at_s=0),
    )
    snap = snapshot(shapes, replicas, Demand(gangs=(SPREAD_GANG,)), now_s=now)
    causes = {t.replica: t.cause for t in plan(snap).terminate}
    assert causes == {
        "singles-r0": RemovalCause.GANG_INCOMPLETE,
        "singles-r1": RemovalCause.GANG_INCOMPLETE,
        "singles-r2": RemovalCause.PROVISIONING_TIMEOUT,
        "more-r0": RemovalCause.GANG_INCOMPLETE,
        "tpu-r0": RemovalCause.PROVISIONING_TIMEOUT,
    }


def test_the_late_and_the_given_back_say_who_waited_for_whom_and_how_long() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    now = 400.0
    arrived = _arrived(shape, 0, 120.0, now)
    late = pending_replica(shape, 1, created_at_s=100.0)
    result = plan(snapshot((shape,), [arrived, late], Demand(gangs=(TWO_SLICE_GANG,)), now_s=now))
    reasons = {t.replica: t.reason for t in result.terminate}
    assert reasons == {
        "tpu-r1": "pending 300s, past the 240s gang arrival bound while tpu-r0 came for the "
        "same gang; the group backs off",
        "tpu-r0": "held for an all-or-nothing gang whose other slice(s) (tpu-r1) did not come "
        "within the 240s gang arrival bound; given back after 280s idle instead of held",
    }
    # Across groups: the late slice names every replica that came for it.
    across = plan(_across_groups(BOUND_S))
    (timed_out,) = [t for t in across.terminate if t.replica == "tpu-r0"]
    assert "while singles-r0, singles-r1 came for the same gang" in timed_out.reason


def test_idle_exactly_its_timeout_is_kept_and_exactly_settled_is_waiting() -> None:
    # Idle 60 s, exactly the idle timeout: the late one goes, the arrived one stays.
    result = plan(_gang_snapshot(now_s=BOUND_S, registered_at_s=BOUND_S - 60.0))
    assert [t.replica for t in result.terminate] == ["tpu-r1"]
    # Idle 10 s, exactly the registration settle: it waits for the late one already.
    result = plan(_gang_snapshot(now_s=BOUND_S, registered_at_s=BOUND_S - 10.0))
    assert [t.replica for t in result.terminate] == ["tpu-r1"]
    result = plan(_gang_snapshot(now_s=BOUND_S, registered_at_s=BOUND_S - 9.0))
    assert result.terminate == ()


def test_min_replicas_keeps_the_least_idle_of_the_arrived() -> None:
    (shape,) = v6e_16_shapes(max_replicas=3, min_replicas=1)
    longer = _arrived(shape, 0, 100.0, BOUND_S)
    shorter = _arrived(shape, 2, 150.0, BOUND_S)
    late = pending_replica(shape, 1, created_at_s=0)
    for replicas in ([shorter, longer, late], [longer, shorter, late]):
        result = plan(snapshot((shape,), replicas, Demand(gangs=(TWO_SLICE_GANG,)), now_s=BOUND_S))
        given_back = [
            t.replica for t in result.terminate if t.cause is RemovalCause.GANG_INCOMPLETE
        ]
        assert given_back == ["tpu-r0"]


def test_a_replica_of_unknown_pods_is_awaited_across_groups() -> None:
    """Pods without a replica name (KubeRay < 1.6): which slice they form is unknown,
    so the idle ones may be waiting for them; a draining one is awaited by none."""
    (_, singles) = _across_groups(now_s=0).shapes
    unknown = replace(_arrived(singles, 2, 120.0, BOUND_S), identified=False)
    result = plan(_across_groups(BOUND_S, unknown))
    assert not any(t.replica == "tpu-r0" for t in result.terminate)
    draining = replace(unknown, state=ReplicaState.DRAINING)
    snap = _across_groups(BOUND_S)
    for replicas in ((*snap.replicas, draining), (draining, *snap.replicas)):
        result = plan(replace(snap, replicas=replicas))
        assert any(t.replica == "tpu-r0" for t in result.terminate)


def test_the_given_back_names_every_late_slice() -> None:
    (shape,) = v6e_16_shapes(max_replicas=3)
    late = [pending_replica(shape, i, created_at_s=0) for i in (1, 2)]
    arrived = _arrived(shape, 0, 120.0, BOUND_S)
    result = plan(
        snapshot((shape,), [arrived, *late], Demand(gangs=(TWO_SLICE_GANG,)), now_s=BOUND_S)
    )
    (given_back,) = [t for t in result.terminate if t.cause is RemovalCause.GANG_INCOMPLETE]
    assert "other slice(s) (tpu-r1, tpu-r2) did not come" in given_back.reason


def test_a_lone_late_slice_listed_first_does_not_stop_the_rule_for_the_others() -> None:
    """A late single with no sibling of its own (it waits for its provisioning timeout)
    and a replica of a group no longer in the spec, listed first: the v6e-16 gang's
    late slice still goes and its arrived one is given back."""
    (tpu, singles) = _across_groups(now_s=0).shapes
    lone = pending_replica(singles, 0, created_at_s=0)
    unmanaged = replace(_arrived(singles, 1, 120.0, BOUND_S), group="gone")
    arrived = _arrived(tpu, 0, 120.0, BOUND_S)
    late = pending_replica(tpu, 1, created_at_s=0)
    snap = snapshot(
        (tpu, singles),
        [unmanaged, lone, arrived, late],
        Demand(gangs=(TWO_SLICE_GANG,)),
        now_s=BOUND_S,
    )
    causes = {t.replica: t.cause for t in plan(snap).terminate}
    assert causes == {
        "tpu-r1": RemovalCause.PROVISIONING_TIMEOUT,
        "tpu-r0": RemovalCause.GANG_INCOMPLETE,
    }
