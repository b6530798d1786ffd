"""Issue 14's scarce-capacity scenarios in the simulator, under our policy (bench_sim
prints them beside stock Ray): fallback from a stocked-out spot group to on-demand,
from a churning one, and a warm buffer; the preemption fault they need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal, CapacityStatus
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy.churn import reclaims
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.shell.controller import decide_by_slices
from tpu_autoscaler.sim.cluster import AUTOSCALER_PERIOD_S, SimulatedCluster
from tpu_autoscaler.sim.provisioning import RAYLET_START_S
from tpu_autoscaler.sim.workload import Workload, load_workload, parse_workload

ROOT = Path(__file__).parent.parent
SPOT = ROOT / "examples/clusters/v6e-4x4-spot-and-on-demand.yaml"
WARM = ROOT / "examples/clusters/v6e-4x4-warm.yaml"
PLAIN = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
MAX_PROVISIONING_S = 180.0
"""The top of the simulator's default provisioning delay (60-180 s)."""


def _run(
    cluster: Path, workload: str | Workload, seed: int = 0, seen: list[CapacitySignal] | None = None
) -> tuple[SimulatedCluster, Any]:
    trace = (
        workload
        if isinstance(workload, Workload)
        else load_workload(str(ROOT / "examples/workloads" / workload))
    )
    sim = SimulatedCluster(yaml.safe_load(cluster.read_text()), policy="slice", seed=seed)
    if seen is not None:
        _spy_signals(sim, seen)
    sim.load(trace)
    return sim, sim.run(trace.last_end_s + 1800)


def _spy_signals(sim: SimulatedCluster, seen: list[CapacitySignal]) -> None:
    """Collect every capacity signal the adapters put in the policy's snapshots."""

    def decide(loaded: LoadedSnapshot) -> Plan:
        seen.extend(s for s in loaded.snapshot.capacity_signals if s not in seen)
        return decide_by_slices(loaded)

    sim.autoscaler.decide = decide


def _slice_up_s(sim: SimulatedCluster) -> float:
    """The longest a launched slice takes to be placed on: VMs, pods Running one by
    one, raylets started, and a few autoscaler rounds and demand reports between."""
    return (
        MAX_PROVISIONING_S + sim.world.running_stagger_s + RAYLET_START_S + 4 * AUTOSCALER_PERIOD_S
    )


def _waits(sim: SimulatedCluster, submitted_s: float) -> list[float]:
    work = sim.ray.finished + list(sim.ray.running.values())
    return [
        w.placed_s - w.submitted_s
        for w in work
        if w.placed_s is not None and w.submitted_s == submitted_s
    ]


def test_a_preemption_is_one_of_the_fault_kinds() -> None:
    fault = {"at": 5, "preemption": {"group": "spot"}, "stockout": {"group": "spot", "until": 9}}
    with pytest.raises(
        ManifestError,
        match="exactly one of host_failure, stockout, quota, preemption_storm, preemption",
    ):
        parse_workload({"items": [], "faults": [fault]}, "t")


def test_a_preemption_takes_a_running_slice_whole_and_says_so() -> None:
    trace = parse_workload(
        {
            "items": [{"at": 0, "duration": 3000, "count": 4, "task": {"resources": {"TPU": 4}}}],
            "faults": [{"at": 600, "preemption": {"group": "spot"}}],
        },
        "t",
    )
    sim = SimulatedCluster(yaml.safe_load(SPOT.read_text()), policy="slice", seed=0)
    seen: list[CapacitySignal] = []
    _spy_signals(sim, seen)
    sim.load(trace)
    sim.run(599)
    up = {p for p, n in sim.ray.nodes.items() if n.group == "spot"}
    assert len(up) == 4
    sim.run(601)
    assert not up & set(sim.ray.nodes)
    sim.run(600 + 2 * AUTOSCALER_PERIOD_S)
    # Read back by the adapters (the raylets' death reason, the pods' node shutdown):
    # per host, all at the fault's time, one preemption to the churn count.
    assert seen and {(s.group, s.problem) for s in seen} == {("spot", CapacityProblem.PREEMPTED)}
    assert all(600 <= s.at_s <= 601 for s in seen)
    assert reclaims(sorted(s.at_s for s in seen)) == [seen[0].at_s]
    # KubeRay replaces the slice whole; the work is retried on it.
    sim.run(trace.last_end_s + 1800)
    assert sim.metrics.busy_replicas_terminated == 0
    assert not sim.ray.pending and not sim.violations


def test_spot_stocked_out_demand_is_served_on_demand_within_the_detection_delay() -> None:
    sim, summary = _run(SPOT, "spot-stockout.yaml")
    assert summary["slices_launched_by_group"].get("on-demand", 0) >= 1
    assert summary["unsatisfied_at_end"] == 0
    # GKE's first scale-up attempt for the spot launch fails within the provisioning
    # delay and leaves a FailedScaleUp Event, read the next round: the stranded spot
    # launch stops holding the demand, which moves on then (plus on-demand's own
    # provisioning), not at the spot launch's provisioning timeout.
    detected_s = MAX_PROVISIONING_S + 2 * AUTOSCALER_PERIOD_S
    bound = detected_s + _slice_up_s(sim)
    assert bound < sim.policy_config.provisioning_timeout_s
    for arrival_s in (300.0, 3000.0):
        waits = _waits(sim, arrival_s)
        assert len(waits) == 4 and max(waits) <= bound, (arrival_s, waits)
    assert summary["busy_replicas_terminated"] == 0 and not sim.violations
    # Every busy chip was on-demand's (spot never came up): what `whatif --price`
    # charges at on-demand's price. Two jobs of 16 chips, 1,800 s and 1,200 s.
    assert summary["busy_chip_hours_by_group"] == {"on-demand": summary["busy_chip_hours"]}
    assert 13.0 <= summary["busy_chip_hours"] <= 13.4


def test_spot_churning_new_demand_goes_on_demand_and_nothing_busy_is_removed() -> None:
    seen: list[CapacitySignal] = []
    sim, summary = _run(SPOT, "spot-churn.yaml", seen=seen)
    preempted = sorted(s.at_s for s in seen if s.problem is CapacityProblem.PREEMPTED)
    assert len(reclaims(preempted)) == 2
    assert summary["slices_launched_by_group"]["on-demand"] == 1
    assert summary["busy_replicas_terminated"] == 0
    assert summary["unsatisfied_at_end"] == 0
    # Work ran on both groups' chips, and the groups' busy chip-hours add up to the
    # run's (each rounded to a hundredth).
    by_group = summary["busy_chip_hours_by_group"]
    assert sorted(by_group) == ["on-demand", "spot"] and min(by_group.values()) > 0
    assert abs(sum(by_group.values()) - summary["busy_chip_hours"]) <= 0.02
    metrics = sim.metrics  # before rounding, exactly
    assert sum(metrics.busy_chip_seconds_by_group.values()) == pytest.approx(
        metrics.busy_chip_seconds
    )
    assert sum(metrics.idle_chip_seconds_by_group.values()) == pytest.approx(
        metrics.idle_chip_seconds
    )
    assert not sim.violations
    # The second job landed on on-demand, within one provisioning of its arrival.
    assert max(_waits(sim, 1200.0)) <= _slice_up_s(sim)


def test_churn_shows_in_the_plan_while_it_lasts() -> None:
    trace = load_workload(str(ROOT / "examples/workloads/spot-churn.yaml"))
    sim = SimulatedCluster(yaml.safe_load(SPOT.read_text()), policy="slice", seed=0)
    sim.load(trace)
    sim.run(1000)
    assert sim.last_plan is not None
    assert [(c.group, c.status) for c in sim.last_plan.capacity] == [
        ("spot", CapacityStatus.CHURNING)
    ]
    churn_ends = 960 + sim.policy_config.churn_window_s
    sim.run(churn_ends + 10)
    assert sim.last_plan is not None and sim.last_plan.capacity == ()


def test_a_warm_buffer_places_arriving_demand_within_two_periods() -> None:
    sim, summary = _run(WARM, "warm-buffer.yaml")
    for arrival in (600.0, 1500.0, 2400.0, 3300.0):
        waits = _waits(sim, arrival)
        assert len(waits) == 4
        assert max(waits) <= 2 * AUTOSCALER_PERIOD_S + RAYLET_START_S
    # One warm slice, replenished after each of the four jobs.
    assert summary["slices_launched"] == 5
    assert summary["idle_chip_hours_by_group"]["tpu-v6e-group"] > 0
    assert summary["busy_replicas_terminated"] == 0 and not sim.violations


def test_without_a_buffer_the_same_demand_waits_for_provisioning() -> None:
    sim, summary = _run(PLAIN, "warm-buffer.yaml")
    assert min(_waits(sim, 600.0)) > 2 * AUTOSCALER_PERIOD_S + RAYLET_START_S
    _, warm = _run(WARM, "warm-buffer.yaml")
    assert warm["idle_chip_hours"] > summary["idle_chip_hours"]
