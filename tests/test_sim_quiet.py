"""Leaving out quiet rounds (`sim/quiet.py`) changes no decision and no measurement:
the same runs with and without it make the same writes at the same simulated times,
record the same Events and end with the same summary and timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.world import REALISTIC
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.snapshot import PolicyConfig
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import Workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    ("v6e-4x4-multihost", "seed-slice-placement-group"),
    ("v6e-4x4-multihost", "seed-two-slices"),
    ("v6e-4x4-multihost", "seed-bundle-label-selector"),
    ("v6e-4x4-multihost", "busy-slice"),
    ("v6e-4x4-multihost", "training-day"),
    ("rl-disaggregated", "rl-rollouts"),
    ("v6e-4x4-queued", "queued-provisioning"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang-returns"),
    ("v6e-4x4-multihost", "scarce-sequential-two-slices"),
    ("v6e-4x4-multihost", "spot-preemption-storm"),
    ("v6e-4x4-spot-and-on-demand", "spot-stockout"),
    ("v6e-4x4-spot-and-on-demand", "spot-churn"),
    ("v6e-4x4-warm", "warm-buffer"),
    ("v6e-4x4-multihost", "warm-buffer"),
]
"""`benchmarks/bench_sim.py`'s workloads but the largest (bursty-large-slices), and its
scarce-capacity ones: stockouts, preemptions, churn, warm buffers, gangs, queued
provisioning."""
NEVER_QUIET = {"scarce-two-slice-gang"}
"""Workloads with no round to leave out: the gang can never run, so its demand is
pending in every round to the end."""
TAIL_S = 1800.0
ROUND_LATENCY_S = 3 * REALISTIC.autoscaler_call_latency_s + 3 * REALISTIC.gcs_call_latency_s
"""What a quiet round's calls take: the RayCluster, its pods and the Events about them
from the API server; the GCS's state, its preempted dead nodes and the report to it. A
round left out at the very end does not carry the clock past the end by that much."""


def recorded(sim: SimulatedCluster, workload: Workload) -> dict[str, Any]:
    """Everything a run of `workload` on `sim` decided and measured: its writes at
    their simulated times, Events, summary (timings aside), timeline and memory."""
    writes: list[tuple[float, str, str, str]] = []
    sim.store.watchers.append(
        lambda kind, obj: writes.append(
            (sim.events.now_s, kind, obj["metadata"]["name"], obj["metadata"]["resourceVersion"])
        )
    )
    sim.load(workload)
    summary = sim.run(workload.last_end_s + TAIL_S)
    summary.pop("decision_ms")  # wall time
    return {
        "summary": summary,
        "writes": writes,
        "raycluster": sim.store.get_raycluster(sim.namespace, sim.name),
        "events": sim.store.events,
        "removals": dict(sim.removals),
        "violations": sim.violations,
        "timeline": vars(sim.timeline),
        "operator_errors": sim.operator.errors,
        "registered": sim.autoscaler.memory.registered_at,
        "launch_failures": sim.autoscaler.memory.launch_failures,
    }


def _run(
    cluster: dict[str, Any], workload: Workload, skip: bool, config: PolicyConfig | None = None
) -> tuple[dict[str, Any], int]:
    """Everything a run decided and measured, and how many rounds it left out."""
    sim = SimulatedCluster(
        cluster,
        seed=3,
        capacity=workload.provisioning.capacity,
        policy_config=config,
        skip_quiet_rounds=skip,
    )
    return recorded(sim, workload), sim.quiet.skipped


def _assert_same(
    cluster: dict[str, Any], workload: Workload, config: PolicyConfig | None = None
) -> int:
    skipping, skipped = _run(cluster, workload, True, config)
    planning, none = _run(cluster, workload, False, config)
    assert none == 0
    ended_s = skipping["summary"].pop("sim_seconds"), planning["summary"].pop("sim_seconds")
    assert 0 <= ended_s[1] - ended_s[0] <= ROUND_LATENCY_S + 1e-9
    for key in planning:
        assert skipping[key] == planning[key], key
    return skipped


@pytest.mark.parametrize(("cluster_name", "workload_name"), EXAMPLES)
def test_example_workloads_decide_the_same_with_quiet_rounds_left_out(
    cluster_name: str, workload_name: str
) -> None:
    cluster = yaml.safe_load((ROOT / f"examples/clusters/{cluster_name}.yaml").read_text())
    workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
    skipped = _assert_same(cluster, workload)
    assert (skipped == 0) == (workload_name in NEVER_QUIET)


def _fuzz_cluster(idle_timeout_s: int, min_singles: int) -> dict[str, Any]:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    multi = tpu_group(
        "slices", catalog.slice_type(v6e, "4x4"), 0, 3, idleTimeoutSeconds=idle_timeout_s
    )
    single = tpu_group(
        "singles",
        catalog.slice_type(v6e, "2x4", 8),
        min_singles,
        3,
        idleTimeoutSeconds=idle_timeout_s,
    )
    loaded: dict[str, Any] = yaml.safe_load(yaml.safe_dump(raycluster(multi, single, name="quiet")))
    return loaded


WORK = st.sampled_from(
    [
        {"task": {"resources": {"TPU": 4}}},
        {"actor": {"resources": {"TPU": 8}, "label_selector": {"ray.io/tpu-pod-type": "v6e-8"}}},
        {"placement_group": {"bundles": [{"TPU": 4}] * 4, "strategy": "STRICT_SPREAD"}},
        {"placement_group": {"bundles": [{"TPU": 2}] * 3, "strategy": "PACK"}},
        {"slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"}},
    ]
)
ITEM = st.fixed_dictionaries(
    {"at": st.integers(0, 3000), "duration": st.integers(1, 1500), "count": st.integers(1, 3)}
)
FAULT = st.one_of(
    st.fixed_dictionaries(
        {
            "at": st.integers(0, 3000),
            "host_failure": st.fixed_dictionaries(
                {"group": st.sampled_from(["slices", "singles"])}
            ),
        }
    ),
    st.integers(0, 3000).flatmap(
        lambda at: st.fixed_dictionaries(
            {
                "at": st.just(at),
                "stockout": st.fixed_dictionaries(
                    {"group": st.just("slices"), "until": st.integers(at + 1, at + 2000)}
                ),
            }
        )
    ),
)


@st.composite
def random_runs(draw: st.DrawFn) -> tuple[dict[str, Any], Workload, PolicyConfig]:
    """Work of every kind, host failures and stockouts, a group that holds one slice
    (launches past it time out and back off), short and long idle timeouts, a group
    kept at its minimum: a cluster, a workload and the policy's settings."""
    items = draw(
        st.lists(st.tuples(ITEM, WORK).map(lambda p: {**p[0], **p[1]}), min_size=1, max_size=8)
    )
    faults = draw(st.lists(FAULT, max_size=3))
    capacity = draw(st.sampled_from([{}, {"slices": 1}]))
    cluster = _fuzz_cluster(draw(st.sampled_from([30, 60, 600])), draw(st.integers(0, 1)))
    workload = parse_workload(
        {"items": items, "faults": faults, "provisioning": {"capacity": capacity}}, "fuzz"
    )
    config = PolicyConfig(provisioning_timeout_s=draw(st.sampled_from([120.0, 900.0])))
    return cluster, workload, config


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(random_runs())
def test_random_traces_decide_the_same_with_quiet_rounds_left_out(
    run: tuple[dict[str, Any], Workload, PolicyConfig],
) -> None:
    _assert_same(*run)


SPOT_AND_ON_DEMAND = ROOT / "examples/clusters/v6e-4x4-spot-and-on-demand.yaml"
PINNED_V6E_16 = {"ray.io/tpu-pod-type": "v6e-16"}
SPG_TWO = {
    "slice_placement_group": {
        "topology": "4x4",
        "accelerator_version": "v6e",
        "num_slices": 2,
        "retries": -1,
    }
}
"""Two slices' heads reserved one after another, retried without limit (Ray Train)."""
SCARCE_WORK = st.sampled_from(
    [
        {"task": {"resources": {"TPU": 4}}},
        {"placement_group": {"bundles": [{"TPU": 4}] * 4, "strategy": "STRICT_SPREAD"}},
        {
            "placement_group": {
                "bundles": [{"TPU": 4}] * 8,
                "strategy": "STRICT_SPREAD",
                "bundle_label_selector": [PINNED_V6E_16] * 8,
            }
        },
        SPG_TWO,
    ]
)
"""Slices, a gang of one slice and of two, heads reserved one after another."""


def _scarce_fault(at: int, group: str, length_s: int, kind: str) -> dict[str, Any]:
    if kind in ("stockout", "quota"):
        return {"at": at, kind: {"group": group, "until": at + length_s}}
    if kind == "preemption_storm":
        storm = {"group": group, "until": at + length_s, "mean_interval_s": 120}
        return {"at": at, kind: storm}
    if kind == "capacity":
        return {"at": at, kind: {"group": group, "slices": 1}}
    return {"at": at, kind: {"group": group}}  # preemption, host_failure


SCARCE_FAULT = st.builds(
    _scarce_fault,
    st.integers(0, 3000),
    st.sampled_from(["spot", "on-demand"]),
    st.integers(60, 2000),
    st.sampled_from(
        ["stockout", "quota", "preemption", "preemption_storm", "capacity", "host_failure"]
    ),
)


def _spot_cluster(warm_group: str | None, idle_timeout_s: int) -> dict[str, Any]:
    """The spot and on-demand example, one group keeping a warm slice if named."""
    cluster: dict[str, Any] = yaml.safe_load(SPOT_AND_ON_DEMAND.read_text())
    cluster["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = idle_timeout_s
    for group in cluster["spec"]["workerGroupSpecs"]:
        if group["groupName"] == warm_group:
            annotations = group["template"]["metadata"]["annotations"]
            annotations["tpu-autoscaler.dev/warm-replicas"] = "1"
    return cluster


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@example(
    # Found by this test: the round at 2315 s, left out, would have read the GCS after
    # work ended at 2315.1 s (a round's calls take time), and removed a spot slice the
    # warm buffer no longer needed 5 s before the next round did.
    items=[
        {**SPG_TWO, "at": 277, "duration": 713, "count": 2},
        {**SPG_TWO, "at": 2560, "duration": 798, "count": 2},
    ],
    faults=[
        {"at": 518, "quota": {"group": "spot", "until": 671}},
        {"at": 44, "host_failure": {"group": "spot"}},
        {"at": 1193, "quota": {"group": "on-demand", "until": 1442}},
        {"at": 312, "capacity": {"group": "on-demand", "slices": 1}},
    ],
    warm_group="spot",
    idle_timeout_s=30,
    provisioning_timeout_s=120.0,
)
@given(
    items=st.lists(
        st.tuples(ITEM, SCARCE_WORK).map(lambda p: {**p[0], **p[1]}), min_size=1, max_size=6
    ),
    faults=st.lists(SCARCE_FAULT, max_size=4),
    warm_group=st.sampled_from([None, "spot", "on-demand"]),
    idle_timeout_s=st.sampled_from([30, 60, 600]),
    provisioning_timeout_s=st.sampled_from([120.0, 900.0]),
)
def test_random_scarce_traces_decide_the_same_with_quiet_rounds_left_out(
    items: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    warm_group: str | None,
    idle_timeout_s: int,
    provisioning_timeout_s: float,
) -> None:
    """Fallback from a preferred spot group to on-demand under stockouts, quota,
    preemptions one by one and in storms (churn), a group held to one slice, a warm
    slice: every capacity state that ends with time (backoff, stockout hold, churn
    window) ends the same with rounds left out."""
    workload = parse_workload({"items": items, "faults": faults}, "fuzz-scarce")
    config = PolicyConfig(provisioning_timeout_s=provisioning_timeout_s)
    _assert_same(_spot_cluster(warm_group, idle_timeout_s), workload, config)


@given(
    events=st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=30),
    ran_until_s=st.integers(0, 10),
    end_s=st.integers(0, 20),
)
def test_the_queue_tells_whether_an_action_due_may_change_the_world(
    events: list[tuple[int, bool]], ran_until_s: int, end_s: int
) -> None:
    """What keeps a round whose reads would see a change: any action due by then but
    those that only observe (the sampler), whatever the heap's shape after runs."""
    queue = EventQueue()
    for at_s, observes in events:
        queue.at(float(at_s), lambda: None, observes)
    queue.run_until(float(ran_until_s))
    left = [(at_s, observes) for at_s, observes in events if at_s > ran_until_s]
    expected = any(not observes and at_s <= end_s for at_s, observes in left)
    assert queue.changes_by(float(end_s)) == expected
