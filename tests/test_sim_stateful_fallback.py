"""The stateful machine of `test_sim_stateful.py` on a cluster with fallback groups:
beside its groups, the same v6e 4x4 shape on a spot group (higher priority, cheaper)
and an on-demand one, as `examples/clusters/v6e-4x4-spot-and-on-demand.yaml` has them.
GCE preempts spot slices one at a time and in storms (the simulator's own faults, so
the policy reads the raylets' death reason and the kubelets' node shutdown), spot
stocks out and recovers, its capacity shrinks and returns. Every invariant of the
first machine holds here too, and new demand either group could serve gets a launch
elsewhere once spot is stocked out or churning."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from tests.factories import tpu_group
from tests.scarcity_groups import V6E_4X4, annotated
from tests.test_sim_stateful import (
    IDLE_TIMEOUT_S,
    PINNED_V6E_16,
    PLACED_WITHIN_S,
    PROVISIONING_MAX_S,
    SLOW_API,
    SlicedCluster,
)
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.capacity import CapacityStatus
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import ClusterSnapshot, PolicyConfig, ReplicaState
from tpu_autoscaler.sim.cluster import AUTOSCALER_PERIOD_S

SPOT = "spot"
SAME_SHAPE = ("slices", SPOT, "on-demand")
"""The groups of one v6e 4x4 shape: each serves what the others do."""
OTHERS = tuple(g for g in SAME_SHAPE if g != SPOT)
SHUNNED = (CapacityStatus.STOCKED_OUT, CapacityStatus.BACKING_OFF, CapacityStatus.CHURNING)

SEEN_WITHIN_S = SLOW_API.demand_report_period_s + AUTOSCALER_PERIOD_S + 1.0
"""From a round's plan to the next one that has seen demand submitted before it: the
raylets report pending work to the GCS this often, the next round reads it, and one
second covers the round's API and GCS calls."""
SETTLE_S = PolicyConfig().registration_settle_s
"""A slice whose host joined Ray this recently counts whole (Ray's report of pending
demand lags its placements), so demand arriving then may wait this long for a launch
elsewhere: found by the machine, four tasks arriving 4 s after a replacement spot slice
joined and filled up launched on `slices` 10 s after the round that saw them."""
STOCKOUT_DETECTED_WITHIN_S = (
    SEEN_WITHIN_S + 4 * SLOW_API.pod_create_latency_s + PROVISIONING_MAX_S + AUTOSCALER_PERIOD_S
)
"""From demand arriving while spot is stocked out to a launch elsewhere: the round that
has seen it launches a spot slice (nothing said spot is short yet), KubeRay creates its
four pods one POST at a time, GKE's first attempt fails at most the longest
provisioning delay later (the FailedScaleUp Events on its pods), and the next round
reads them and launches elsewhere."""


def _cluster() -> dict[str, Any]:
    manifest = SlicedCluster.cluster()
    spot = tpu_group(SPOT, V6E_4X4, 0, 2, priority=10, idleTimeoutSeconds=IDLE_TIMEOUT_S)
    on_demand = tpu_group("on-demand", V6E_4X4, 0, 2, idleTimeoutSeconds=IDLE_TIMEOUT_S)
    manifest["spec"]["workerGroupSpecs"] += [
        annotated(spot, cost=1.0),
        annotated(on_demand, cost=3.0),
    ]
    return manifest


EITHER_WORK = st.sampled_from(
    [
        {"task": {"resources": {"TPU": 4}, "label_selector": PINNED_V6E_16}, "count": 4},
        {"slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"}},
    ]
)
"""One v6e 4x4 slice of work: spot, on-demand and `slices` all serve it."""


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    work_ids: frozenset[str]
    spot_refused_until_s: float
    """Until when GKE refused spot slices, as it stood when the work arrived."""


@dataclass(frozen=True, slots=True)
class Round:
    """A round's plan and what the cluster held when it was made."""

    at_s: float
    plan: Plan | None
    spot_in_flight: int
    """Spot replicas requested or pending: launched, not up yet."""
    room: dict[str, int]
    """Per other group of the shape not stocked out, backing off or churning: the
    replicas it could still launch (maxReplicas less those it holds)."""
    in_flight_elsewhere: int

    @property
    def room_elsewhere(self) -> int:
        return sum(self.room.values())

    @property
    def spot(self) -> CapacityStatus | None:
        states = self.plan.capacity if self.plan is not None else ()
        return next((s.status for s in states if s.group == SPOT), None)

    def launched(self, groups: Iterable[str]) -> int:
        """Replicas the round's plan launched in `groups`."""
        wanted = set(groups)
        launches = self.plan.launch if self.plan is not None else ()
        return sum(x.replicas for x in launches if x.group in wanted)

    @property
    def launched_elsewhere(self) -> bool:
        return self.launched(OTHERS) > 0


class FallbackCluster(SlicedCluster):
    SCARCE_GROUP = SPOT

    @staticmethod
    def cluster() -> dict[str, Any]:
        return _cluster()

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[Arrival] = []
        self.seen: list[Round] = []
        """Every round, beside `rounds`."""
        self._decided_on: ClusterSnapshot | None = None
        step, decide = self.sim.autoscaler.step, self.sim.autoscaler.decide

        def observed() -> Any:
            self._decided_on = None
            outcome = step()
            self.seen.append(self._round(outcome.plan, self._decided_on))
            return outcome

        def spied(loaded: LoadedSnapshot) -> Plan:
            self._decided_on = loaded.snapshot
            return decide(loaded)

        self.sim.autoscaler.step = observed  # type: ignore[method-assign]
        self.sim.autoscaler.decide = spied

    def _round(self, plan: Plan | None, snapshot: ClusterSnapshot | None) -> Round:
        """The round as its plan saw the cluster: the replicas of its snapshot."""
        states = plan.capacity if plan is not None else ()
        shunned = {s.group for s in states if s.status in SHUNNED}
        held = dict.fromkeys(SAME_SHAPE, 0)
        in_flight = dict.fromkeys(SAME_SHAPE, 0)
        for replica in snapshot.replicas if snapshot is not None else ():
            if replica.group in held:
                held[replica.group] += 1
                if replica.state in (ReplicaState.REQUESTED, ReplicaState.PENDING):
                    in_flight[replica.group] += 1
        available = [g for g in OTHERS if g not in shunned]
        return Round(
            self.sim.events.now_s,
            plan,
            in_flight[SPOT],
            {g: max(0, self.sim.shapes[g].max_replicas - held[g]) for g in available},
            sum(in_flight[g] for g in OTHERS),
        )

    def _disturb(self) -> None:
        self.disturbed = True
        self._last_disturbance_s = self.sim.events.now_s

    # --- rules ------------------------------------------------------------------------------

    @rule(work=EITHER_WORK, duration=st.integers(60, 900))
    def submit_either(self, work: dict[str, Any], duration: int) -> None:
        before = self._work_ids()
        self.submit({k: v for k, v in work.items() if k != "count"}, duration, work.get("count", 1))
        self.arrivals.append(
            Arrival(
                self.sim.events.now_s,
                frozenset(self._work_ids() - before),
                self.sim.gke.stockout_until.get(SPOT, 0.0),
            )
        )

    def _work_ids(self) -> set[str]:
        ray = self.sim.ray
        return {w.work_id for w in (*ray.pending, *ray.running.values(), *ray.finished)}

    @rule()
    def spot_slice_preempted(self) -> None:
        """GCE reclaims one running spot slice whole."""
        self._disturb()
        self.sim.preemption(SPOT)
        self._settle()

    @rule(length=st.integers(120, 900), mean_interval=st.integers(20, 120))
    def spot_preemption_storm(self, length: int, mean_interval: int) -> None:
        """Spot hosts preempted one after another, each taking its slice (KubeRay
        deletes a replica that lost a host): several slices within minutes."""
        self._disturb()
        self.sim.preemption_storm(SPOT, self.sim.events.now_s + length, mean_interval)

    @rule(
        work=EITHER_WORK,
        length=st.integers(300, 900),
        mean_interval=st.integers(20, 120),
    )
    def spot_preemption_storm_under_load(
        self, work: dict[str, Any], length: int, mean_interval: int
    ) -> None:
        """Issue 14's storm: a long job lands on spot (given the time a slice takes to
        come up), then spot hosts are preempted one after another; what arrives next
        finds spot churning."""
        self.submit_either(work, 1800)
        self.wait(int(PLACED_WITHIN_S))
        self.spot_preemption_storm(length, mean_interval)

    @precondition(lambda self: self.sim.gke.stockout_until.get(SPOT, 0.0) <= self.sim.events.now_s)
    @rule(length=st.integers(60, 1500))
    def spot_stocks_out(self, length: int) -> None:
        """GKE has no spot capacity of the shape for `length` seconds, then has again."""
        self._disturb()
        self.sim.stockout(SPOT, self.sim.events.now_s + length)

    @precondition(lambda self: self.sim.gke.stockout_until.get(SPOT, 0.0) <= self.sim.events.now_s)
    @rule(length=st.integers(300, 1500), work=EITHER_WORK, duration=st.integers(60, 900))
    def spot_stocks_out_under_demand(
        self, length: int, work: dict[str, Any], duration: int
    ) -> None:
        """Issue 14's scenario: spot has no capacity as a job arrives that either group
        serves; the policy learns it only from the launch it makes on spot."""
        self.spot_stocks_out(length)
        self.submit_either(work, duration)

    # --- invariants ---------------------------------------------------------------------

    def _never_placed(self, arrival: Arrival) -> bool:
        """Some of the arrival's work waits for a new slice, and none of it was ever
        placed (work that ran and was retried after a preemption arrived again, later).
        Stage two of `slice_placement_group` waits for its reserved slice, not a new one."""
        pending = [
            w for w in self.sim.ray.pending if w.work_id in arrival.work_ids and w.holds is None
        ]
        return bool(pending) and all(w.runs == 0 for w in pending)

    @invariant()
    def a_churning_spot_gets_no_launch_a_steadier_group_could_take(self) -> None:
        """A round whose plan says spot churns launches on spot only what no other
        available group of the shape had room for, after its own launches: churn ranks
        a group after steadier ones (not below other limits). A gang's slices go to one
        group if one can hold them all (found by the machine: a gang of two on a
        churning spot while the others had room for one), so room counts per group."""
        for seen in self.seen:
            on_spot = seen.launched([SPOT])
            if seen.spot is CapacityStatus.CHURNING and on_spot:
                left = {g: room - seen.launched([g]) for g, room in seen.room.items()}
                assert max(left.values(), default=0) < on_spot, seen

    @invariant()
    def new_demand_goes_elsewhere_once_spot_is_stocked_out_or_churning(self) -> None:
        """Once a round's plan says spot is stocked out, backing off or churning while
        another group of the shape has room, demand that arrived since and still waits
        has a launch elsewhere (or a replica on its way there) within the rounds that
        see it, and one `SETTLE_S` more. Exempt: demand that may be waiting on a spot
        replica already on its way, for a churning group's slices do come (churn is a
        preference for new launches);
        a stocked-out group's are `stocked_out_demand_moves_within_the_detection_delay`'s."""
        now = self.sim.events.now_s
        for arrival in self.arrivals:
            if not self._never_placed(arrival):
                continue
            told = next(
                (
                    r
                    for r in self.seen
                    if r.at_s >= arrival.at_s and r.spot in SHUNNED and r.room_elsewhere > 0
                ),
                None,
            )
            within_s = told.at_s + SEEN_WITHIN_S + SETTLE_S if told is not None else 0.0
            if told is None or now < within_s or told.spot_in_flight:
                continue
            window = [r for r in self.seen if arrival.at_s <= r.at_s <= within_s]
            assert any(r.launched_elsewhere or r.in_flight_elsewhere for r in window), (
                arrival,
                told,
            )

    @invariant()
    def stocked_out_demand_moves_within_the_detection_delay(self) -> None:
        """Demand arriving while GKE refuses spot (for longer than the detection delay)
        has a launch elsewhere, or a replica on its way there, within
        `STOCKOUT_DETECTED_WITHIN_S`, while another group of the shape has room."""
        now = self.sim.events.now_s
        for arrival in self.arrivals:
            deadline_s = arrival.at_s + STOCKOUT_DETECTED_WITHIN_S
            if now < deadline_s or arrival.spot_refused_until_s < deadline_s:
                continue
            if not self._never_placed(arrival):
                continue
            window = [r for r in self.seen if arrival.at_s <= r.at_s <= deadline_s]
            if any(r.room_elsewhere == 0 for r in window):
                continue
            assert any(r.launched_elsewhere or r.in_flight_elsewhere for r in window), arrival


FallbackCluster.TestCase.settings = SlicedCluster.TestCase.settings
TestFallbackCluster = FallbackCluster.TestCase


def _check_every_invariant(machine: FallbackCluster) -> None:
    for check in machine.invariants:
        if all(holds(machine) for holds in check.preconditions):
            check.function(machine)


def _run(machine: FallbackCluster, seconds: int, step_s: int = 30) -> None:
    """Time passes, every invariant checked as often as the machine's steps would."""
    for _ in range(seconds // step_s):
        machine.wait(step_s)
        _check_every_invariant(machine)


def _launched(machine: FallbackCluster, group: str, after_s: float) -> bool:
    return any(
        x.group == group
        for r in machine.seen
        if r.at_s >= after_s and r.plan
        for x in r.plan.launch
    )


ONE_SLICE_OF_TASKS = {
    "task": {"resources": {"TPU": 4}, "label_selector": PINNED_V6E_16},
    "count": 4,
}


ONE_SLICE_BY_HEAD = {"slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"}}


@pytest.mark.parametrize("work", [ONE_SLICE_OF_TASKS, ONE_SLICE_BY_HEAD], ids=["tasks", "head"])
def test_a_preemption_storm_on_spot_sends_new_demand_on_demand(work: dict[str, Any]) -> None:
    """The storm the machine may draw, taken on purpose: a job on spot, spot hosts
    preempted every minute or so for ten minutes, a second job arriving once the
    plan says spot churns (tasks, placed by the exhaustive search; a slice head, by
    the gang rules)."""
    machine = FallbackCluster()
    machine.submit_either(ONE_SLICE_OF_TASKS, 1800)
    _run(machine, 300)
    assert {n.group for n in machine.sim.ray.nodes.values()} >= {SPOT}
    machine.spot_preemption_storm(600, 60)
    _run(machine, 600)
    assert any(r.spot is CapacityStatus.CHURNING for r in machine.seen), "spot churned"
    arrived_s = machine.sim.events.now_s
    machine.submit_either(work, 600)
    _run(machine, 600)
    assert _launched(machine, "on-demand", arrived_s)
    assert machine.sim.metrics.busy_replicas_terminated == 0


def test_a_stocked_out_spot_gets_no_launch_while_demand_keeps_coming() -> None:
    """Spot stocks out under a job; a second job arrives once the plan says so: it
    goes elsewhere, and spot gets nothing new until its stockout has passed."""
    machine = FallbackCluster()
    machine.spot_stocks_out(1500)
    machine.submit_either(ONE_SLICE_OF_TASKS, 600)
    _run(machine, int(STOCKOUT_DETECTED_WITHIN_S))
    assert any(r.spot is CapacityStatus.STOCKED_OUT for r in machine.seen), "spot stocked out"
    arrived_s = machine.sim.events.now_s
    machine.submit_either(ONE_SLICE_OF_TASKS, 600)
    _run(machine, 600)
    assert _launched(machine, "on-demand", arrived_s)


def test_demand_stocked_out_on_spot_moves_within_the_detection_delay() -> None:
    machine = FallbackCluster()
    machine.spot_stocks_out(1500)
    machine.submit_either(ONE_SLICE_OF_TASKS, 600)
    _run(machine, int(STOCKOUT_DETECTED_WITHIN_S) + 30)
    # The plan knew spot was stocked out while its slice launched for the demand was
    # still on its way (stranded: it no longer holds the demand).
    assert any(r.spot is CapacityStatus.STOCKED_OUT and r.spot_in_flight for r in machine.seen)
    machine.stocked_out_demand_moves_within_the_detection_delay()


def test_demand_arriving_as_a_replacement_spot_slice_fills_waits_one_settle_at_most() -> None:
    """The machine's example (a random run): storms on a churning spot; four tasks
    arrive at 1144 s, 4 s after a replacement spot slice's last hosts joined Ray and
    took earlier work. The slice counts whole until it settles (10 s), so the launch
    on `slices` comes at 1155 s, past the rounds that saw the tasks: the invariant
    allows one settle more (red without it)."""
    machine = FallbackCluster()
    storms = [
        (616, 25, ONE_SLICE_OF_TASKS),
        (604, 101, ONE_SLICE_OF_TASKS),
        (500, 54, ONE_SLICE_OF_TASKS),
        (835, 41, ONE_SLICE_OF_TASKS),
        (442, 89, ONE_SLICE_BY_HEAD),
        (347, 90, ONE_SLICE_OF_TASKS),
    ]
    for length, mean_interval, work in storms:
        machine.spot_preemption_storm_under_load(
            work=work, length=length, mean_interval=mean_interval
        )
        _check_every_invariant(machine)
    late = [a for a in machine.arrivals if 1144 < a.at_s < 1145]
    assert late and _launched(machine, "slices", late[0].at_s)
    machine.teardown()


def test_a_stockout_answered_by_a_spot_slice_preempted_since_stays_answered() -> None:
    """Found by `make fuzz` (600 random examples; on 0fd230a too): spot stocks out at
    1,068 s, a spot slice launched at 1,167 s comes up, storms preempt it, and the round
    at 1,330 s removes it as broken. Its plan launched spot in its first pass (the
    stockout answered by that slice) and said spot was stocked out after its second
    (the slice gone, the old signal counted again), as did the rounds after it. The
    answer is remembered now, within a plan (`ClusterSnapshot.after`) and from round to
    round (the shell's memory)."""
    machine = FallbackCluster()
    machine.spot_preemption_storm_under_load(length=300, mean_interval=98, work=ONE_SLICE_BY_HEAD)
    _check_every_invariant(machine)
    machine.two_slice_gang_under_one_slice_capacity(duration=447)
    _check_every_invariant(machine)
    machine.spot_stocks_out_under_demand(duration=355, length=358, work=ONE_SLICE_OF_TASKS)
    _check_every_invariant(machine)
    storms = [
        (300, 90, ONE_SLICE_OF_TASKS),
        None,
        (480, 65, ONE_SLICE_BY_HEAD),
        (300, 94, ONE_SLICE_OF_TASKS),
        (300, 20, ONE_SLICE_OF_TASKS),
        (300, 20, ONE_SLICE_OF_TASKS),
    ]
    for storm in storms:
        if storm is None:
            machine.two_slice_gang_under_one_slice_capacity(duration=852)
        else:
            length, mean_interval, work = storm
            machine.spot_preemption_storm_under_load(
                work=work, length=length, mean_interval=mean_interval
            )
        _check_every_invariant(machine)
    removed_up = [
        r
        for r in machine.seen
        if 1330 < r.at_s < 1331 and r.plan and any(t.group == SPOT for t in r.plan.terminate)
    ]
    assert removed_up, "the round that removes the preempted spot slice"
    # Nor do the rounds after it, once the slice is gone, count the answered stockout
    # again (eight did, spot shunned until 1,668 s, without the shell's memory).
    answered_again = [
        r.at_s
        for r in machine.seen
        if r.at_s > 1331 and r.plan
        for c in r.plan.capacity
        if c.status is CapacityStatus.STOCKED_OUT and c.since_s < 1167
    ]
    assert answered_again == []
    machine.teardown()
