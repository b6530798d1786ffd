"""The simulator's parts, and the upstream failures: present under Ray 2.60's stock
autoscaling, absent under ours, on the same simulated cluster and workload."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.adapters.kube.api import Conflict, Rejected
from tpu_autoscaler.adapters.ray.gcs import drain_nodes
from tpu_autoscaler.cli import main
from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import WorkItem, load_workload, parse_workload

ROOT = Path(__file__).parent.parent
V6E = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"


def v6e_cluster(**options: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(V6E.read_text())
    raw["spec"]["autoscalerOptions"].update(options)
    return raw


def run(
    workload: str | list[dict[str, Any]], policy: str, **kwargs: Any
) -> tuple[SimulatedCluster, dict[str, Any]]:
    trace = (
        load_workload(str(ROOT / "examples/workloads" / workload))
        if isinstance(workload, str)
        else parse_workload(workload, "t")
    )
    sim = SimulatedCluster(v6e_cluster(), policy=policy, seed=3, **kwargs)  # type: ignore[arg-type]
    sim.load(trace)
    return sim, sim.run(trace.last_end_s + 1800)


# --- parts ----------------------------------------------------------------------------


def test_event_queue_runs_in_time_then_submission_order() -> None:
    events = EventQueue(seed=1)
    seen: list[str] = []
    events.at(5, lambda: seen.append("b"))
    events.at(1, lambda: seen.append("a"))
    events.at(5, lambda: seen.append("c"))
    events.run_until(4)
    assert seen == ["a"] and events.now_s == 4
    events.run_until(10)
    assert seen == ["a", "b", "c"]


def test_store_rejects_stale_writes_and_schema_violations() -> None:
    store = ObjectStore()
    created = store.create_raycluster(v6e_cluster())
    version = created["metadata"]["resourceVersion"]
    op = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]
    store.patch_raycluster("default", "tpu-v6e-16", op, version)
    with pytest.raises(Conflict):
        store.patch_raycluster("default", "tpu-v6e-16", op, version)
    with pytest.raises(Rejected):
        store.patch_raycluster(
            "default",
            "tpu-v6e-16",
            [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": "two"}],
            None,
        )
    assert (
        store.get_raycluster("default", "tpu-v6e-16")["spec"]["workerGroupSpecs"][0]["replicas"]
        == 1
    )


def _pods(sim: SimulatedCluster) -> list[dict[str, Any]]:
    return sim.store.list_pods("default", {labels.KUBERAY_CLUSTER: "tpu-v6e-16"})


def _set_replicas(sim: SimulatedCluster, replicas: int, delete: list[str] | None = None) -> None:
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": replicas}
    ]
    if delete is not None:
        ops.append(
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": delete},
            }
        )
    sim.store.patch_raycluster("default", "tpu-v6e-16", ops, None)
    sim.events.run_until(sim.events.now_s + 1)


@pytest.mark.parametrize("gate", [True, False])
def test_operator_deletes_whole_replicas_only_with_the_gate(gate: bool) -> None:
    sim = SimulatedCluster(v6e_cluster(), policy="slice", multi_host_indexing=gate)
    sim.events.every = lambda *a, **k: None  # type: ignore[method-assign]
    _set_replicas(sim, 2)
    pods = _pods(sim)
    assert len(pods) == 8
    key = labels.KUBERAY_REPLICA_NAME if gate else labels.WEBHOOK_REPLICA_INDEX
    replica = pods[0]["metadata"]["labels"][key]
    _set_replicas(sim, 1, [pods[0]["metadata"]["name"]])
    left = _pods(sim)
    if gate:
        assert len(left) == 4
        assert all(p["metadata"]["labels"][key] != replica for p in left)
    else:
        assert len(left) == 7  # only the named pod: a partial slice remains
    # KubeRay clears the list in memory only: the name stays until an autoscaler rewrites it.
    spec = sim.store.get_raycluster("default", "tpu-v6e-16")["spec"]["workerGroupSpecs"][0]
    assert spec["scaleStrategy"]["workersToDelete"] == [pods[0]["metadata"]["name"]]


def test_a_failed_host_takes_its_replica_and_the_replica_is_replaced() -> None:
    sim = SimulatedCluster(v6e_cluster(), policy="slice")
    _set_replicas(sim, 1)
    first = {p["metadata"]["name"] for p in _pods(sim)}
    sim.store.set_pod_phase("default", sorted(first)[0], "Failed")
    sim.events.run_until(sim.events.now_s + 1)
    now = {p["metadata"]["name"] for p in _pods(sim)}
    assert len(now) == 4 and not (now & first)


def test_stockout_holds_pods_pending() -> None:
    task = {"at": 0, "duration": 60, "task": {"resources": {"TPU": 4}}}
    stockout = {"at": 0, "stockout": {"group": "tpu-v6e-group", "until": 1000}}
    sim = SimulatedCluster(v6e_cluster(), policy="slice", seed=3)
    sim.load(parse_workload({"items": [task], "faults": [stockout]}, "t"))
    sim.events.run_until(900)
    assert _pods(sim) and all(p["status"]["phase"] == "Pending" for p in _pods(sim))
    assert sim.ray.pending
    sim.events.run_until(1300)
    assert not sim.ray.pending


# --- upstream failures, both autoscalers ------------------------------------------------------


def test_failure_1_busy_slice_removed_by_ray_kept_by_us() -> None:
    _, ray = run("busy-slice.yaml", "ray")
    sim, ours = run("busy-slice.yaml", "slice")
    assert ray["busy_replicas_terminated"] >= 1
    assert ours["busy_replicas_terminated"] == 0 and ours["unsatisfied_at_end"] == 0
    assert sim.violations == []


def test_failure_2_sub_slice_launch_dropped_by_ray() -> None:
    work = [{"at": 0, "duration": 300, "count": 2, "task": {"resources": {"TPU": 4}}}]
    _, ray = run(work, "ray")
    _, ours = run(work, "slice")
    assert ray["slices_launched"] == 0 and ray["unsatisfied_at_end"] == 2
    assert ours["slices_launched"] == 1 and ours["unsatisfied_at_end"] == 0


def retrying(workload: str) -> list[dict[str, Any]]:
    """A seed trace whose caller retries a timed-out head reservation, as Ray Train
    does: with Ray's 100 s head timeout and 60-180 s of provisioning the seed's own
    program would fail with TimeoutError before any new slice is up."""
    items: list[dict[str, Any]] = yaml.safe_load(
        (ROOT / "examples/workloads" / workload).read_text()
    )["items"]
    for item in items:
        item["slice_placement_group"]["retries"] = -1
    return items


@pytest.mark.parametrize("workload", ["seed-slice-placement-group.yaml", "seed-two-slices.yaml"])
def test_failure_3_slice_placement_group_never_scales_up_under_ray(workload: str) -> None:
    ray_sim, ray = run(retrying(workload), "ray")
    _, ours = run(retrying(workload), "slice")
    assert ray["slices_launched"] == 0 and ray["reservations_failed"] >= 10
    assert not ray_sim.ray.finished  # the caller retried for good, in vain
    slices = 2 if "two" in workload else 1
    assert ours["unsatisfied_at_end"] == 0 and ours["slices_launched"] == slices
    assert 1 <= ours["reservations_failed"] <= slices  # one timeout per slice still provisioning
    assert ours["partial_slice_seconds"] == 0


SUMMARY_KEYS = [
    "policy", "seed", "sim_seconds", "slices_launched", "partial_slice_seconds",
    "busy_replicas_terminated", "demand_wait_s", "unsatisfied_at_end", "busy_chip_hours",
    "idle_chip_hours", "scale_flaps", "decision_ms",
]  # fmt: skip


def test_simulate_cli_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "run.png"
    workload = str(ROOT / "examples/workloads/seed-two-slices.yaml")
    args = ["simulate", "--cluster", str(V6E), "--workload", workload, "--output", "json"]
    assert main([*args, "--plot", str(plot)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert plot.stat().st_size > 10_000


def test_simulate_rejects_bad_traces(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "bad.yaml"
    trace.write_text(
        "- {at: 0, duration: 5, task: {resources: {TPU: 4}}, actor: {resources: {TPU: 4}}}\n"
    )
    assert main(["simulate", "--cluster", str(V6E), "--workload", str(trace)]) == 2
    assert "exactly one" in capsys.readouterr().err


def test_failure_4_one_head_per_slice() -> None:
    work = [{"at": 0, "duration": 300, "count": 2, "task": {"resources": {"TPU-v6e-16-head": 1}}}]
    _, ray = run(work, "ray")
    _, ours = run(work, "slice")
    assert ray["slices_launched"] == 0 and ray["unsatisfied_at_end"] == 2
    assert ours["slices_launched"] == 2 and ours["unsatisfied_at_end"] == 0


def test_failure_5_idle_slices_scale_down_whole_to_zero() -> None:
    sim, ours = run(retrying("seed-two-slices.yaml"), "slice")
    assert ours["slices_launched"] == 2 and ours["busy_replicas_terminated"] == 0
    assert _pods(sim) == []  # both slices gone once idle, every host with them
    assert sim.violations == []
    last_work_end = max(
        w.placed_s + w.duration_s for w in sim.ray.finished if w.placed_s is not None
    )
    assert min(sim.removals["tpu-v6e-group"]) >= last_work_end + 60  # not before the idle timeout


def test_shape_capacity_holds_extra_slices_pending() -> None:
    work = [{"at": 0, "duration": 600, "count": 8, "task": {"resources": {"TPU": 4}}}]
    sim = SimulatedCluster(v6e_cluster(), policy="slice", seed=3, capacity={"tpu-v6e-group": 1})
    sim.load(parse_workload(work, "t"))
    sim.events.run_until(400)
    phases = sorted(p["status"]["phase"] for p in _pods(sim))
    assert phases == ["Pending"] * 4 + ["Running"] * 4
    assert len(sim.ray.pending) == 4


def test_tpu7x_pods_get_process_addresses() -> None:
    raw = yaml.safe_load((ROOT / "examples/clusters/tpu7x-2x2x2-per-device.yaml").read_text())
    sim = SimulatedCluster(raw, policy="slice", provisioning_delay=lambda events: 60.0)
    sim.submit(
        WorkItem.model_validate({"at": 0, "duration": 60, "task": {"resources": {"TPU": 8}}})
    )
    sim.events.run_until(100)  # launched at 5 s, up at 69 s, the task runs until 129 s
    # The webhook gives TPU7x process addresses on port 8471 beside the hostnames; the
    # device plugin, on the node, the accelerator type Ray reads as v7x-16.
    env = gke.container_environment(_pods_of(sim, "tpu7x-16")[0])
    assert env["TPU_PROCESS_PORT"] == "8471" and "TPU_WORKER_HOSTNAMES" in env
    assert env["TPU_PROCESS_ADDRESSES"].endswith(".tpu7x-16-headless:8471")
    assert env[labels.ENV_TPU_ACCELERATOR_TYPE] == "tpu7x-16"
    node = next(iter(sim.ray.nodes.values()))
    assert node.labels["ray.io/tpu-pod-type"] == "v7x-16" and node.total["TPU"] == 8


def _pods_of(sim: SimulatedCluster, cluster: str) -> list[dict[str, Any]]:
    return sim.store.list_pods("default", {labels.KUBERAY_CLUSTER: cluster})


def test_drain_refused_by_a_busy_host_and_draining_hosts_take_no_new_work() -> None:
    sim, _ = run(
        [{"at": 0, "duration": 60, "count": 4, "task": {"resources": {"TPU": 4}}}], "slice"
    )
    sim2 = SimulatedCluster(v6e_cluster(), policy="slice", provisioning_delay=lambda events: 60.0)
    sim2.submit(
        WorkItem.model_validate({"at": 0, "duration": 300, "task": {"resources": {"TPU": 4}}})
    )
    sim2.events.run_until(100)
    pods = sorted(sim2.ray.nodes)
    assert len(pods) == 4
    node_ids = [sim2.ray.nodes[p].node_id.hex() for p in pods]
    busy = next(i for i, p in enumerate(pods) if sim2.ray.nodes[p].busy)
    outcome = drain_nodes(sim2.ray, node_ids[busy:] + node_ids[:busy], "test")
    assert not outcome.complete and outcome.accepted == ()  # the busy host refused first
    assert not any(n.draining for n in sim2.ray.nodes.values())
    idle = [n for i, n in enumerate(node_ids) if i != busy]
    assert drain_nodes(sim2.ray, idle, "test").complete
    sim2.submit(
        WorkItem.model_validate({"at": 100, "duration": 60, "task": {"resources": {"TPU": 4}}})
    )
    assert len(sim2.ray.pending) == 1  # draining hosts take no new work
    assert sim.violations == []


def test_trace_provisioning_section() -> None:
    trace = parse_workload(
        {"items": [], "provisioning": {"delay_s": {"min": 10, "max": 20}, "capacity": {"g": 2}}},
        "t",
    )
    assert trace.provisioning.delay_s.max == 20 and trace.provisioning.capacity == {"g": 2}
    with pytest.raises(ManifestError):
        parse_workload({"items": [], "provisioning": {"delay_s": {"min": 30, "max": 20}}}, "t")


def test_64_host_slices_under_bursty_demand_launch_exactly_the_slices_needed() -> None:
    """KubeRay creates a 64-host slice's pods one call at a time (about 2 s), the
    autoscaler's rounds see them half made and KubeRay's status writes race its
    patches: still one launch per slice needed, no partial or busy slice removed."""
    trace = load_workload(str(ROOT / "examples/workloads/bursty-large-slices.yaml"))
    first_burst = parse_workload(
        [item.model_dump(exclude_none=True) for item in trace.items[:3]], "burst"
    )
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-16x16-multihost.yaml").read_text())
    sim = SimulatedCluster(cluster, policy="slice", seed=1)
    sim.load(first_burst)
    summary = sim.run(2400.0)
    # Two training slices, and a third for the 64 pinned tasks that find both busy.
    assert summary["slices_launched"] == 3
    assert summary["unsatisfied_at_end"] == 0
    assert summary["partial_slice_seconds"] == 0
    assert summary["busy_replicas_terminated"] == 0 and summary["launches_cancelled"] == 0
    assert summary["scale_flaps"] == 0
    assert sim.violations == []


@pytest.mark.parametrize("seed", [0, 3, 4, 6])
def test_work_placed_as_a_slice_comes_up_launches_no_second_slice(seed: int) -> None:
    """Seen on real raylets: 16 x {TPU: 1} on the TPU7x per-device example launched a
    second slice three seconds after the first came up, which held all 16. The GCS
    hears of pending work later than the raylets place it, so the tasks taken by the
    new hosts were counted as used and as still pending (these seeds did that)."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/tpu7x-2x2x2-per-device.yaml").read_text())
    sim = SimulatedCluster(cluster, policy="slice", seed=seed)
    sim.load(
        parse_workload(
            [{"at": 0, "duration": 120, "count": 16, "task": {"resources": {"TPU": 1}}}], "t"
        )
    )
    summary = sim.run(600.0)
    assert summary["slices_launched"] == 1 and summary["unsatisfied_at_end"] == 0


@pytest.mark.parametrize("seed", [4, 13, 21])
def test_a_gang_placed_as_the_last_host_joins_launches_no_second_slice(seed: int) -> None:
    """A STRICT_SPREAD gang lands on every host of a slice at once, when its last host
    joins (up to 20 s after the first): hosts that joined earlier must settle with it
    (these seeds launched a second slice with a per-host window)."""
    cluster = yaml.safe_load(V6E.read_text())
    sim = SimulatedCluster(cluster, policy="slice", seed=seed)
    gang = {"bundles": [{"TPU": 4}] * 4, "strategy": "STRICT_SPREAD"}
    sim.load(parse_workload([{"at": 0, "duration": 600, "placement_group": gang}], "g"))
    assert sim.run(1200.0)["slices_launched"] == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_patches_that_meet_status_churn_land_within_the_round(seed: int) -> None:
    """Jobs arriving while a 64-host slice's pods turn Running one by one (KubeRay
    writes the status at each, a few times a second): the launch patches meet
    409s (these seeds do), and every one is absorbed in its round: no round given up,
    one slice per job, nothing partial."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-16x16-multihost.yaml").read_text())
    spg = {"topology": "16x16", "accelerator_version": "v6e"}
    items = [{"at": at, "duration": 600, "slice_placement_group": spg} for at in (0, 70, 75, 80)]
    sim = SimulatedCluster(cluster, policy="slice", seed=seed)
    sim.load(
        parse_workload({"items": items, "provisioning": {"delay_s": {"min": 60, "max": 60}}}, "t")
    )
    summary = sim.run(1500.0)
    assert summary["patch_conflicts"] > 0
    assert summary["patch_conflicts_absorbed"] == summary["patch_conflicts"]
    assert summary["rounds_failed"] == 0
    assert summary["slices_launched"] == 4 and summary["unsatisfied_at_end"] == 0
    assert summary["partial_slice_seconds"] == 0 and summary["scale_flaps"] == 0
    assert sim.violations == []


def test_slice_placement_groups_coming_up_are_never_reported_unservable() -> None:
    """In the realistic world a slice's hosts join seconds apart, and 36 of 64 slice
    placement groups got an `InfeasibleDemand` Warning ("no group can ever serve it")
    for their stage two while their own slice came up (`claim_pinned_slices`)."""
    from tpu_autoscaler.controlplane.world import REALISTIC
    from tpu_autoscaler.shell import events

    spg = {"topology": "4x4", "accelerator_version": "v6e", "head_reservation_timeout_s": None}
    trace = parse_workload(
        [
            {"at": 60 * (i % 4), "duration": 600 + 30 * i, "slice_placement_group": spg}
            for i in range(16)
        ],
        "spg-burst",
    )
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 16
    sim = SimulatedCluster(cluster, policy="slice", seed=0, world=REALISTIC)
    sim.load(trace)
    summary = sim.run(trace.last_end_s + 1800)
    assert summary["slices_launched"] == 16
    assert summary["unsatisfied_at_end"] == 0
    unservable = [e["message"] for e in sim.store.events if e["reason"] == events.INFEASIBLE]
    assert unservable == []


@pytest.mark.parametrize("world_name", ["ideal", "realistic"])
def test_the_summary_times_each_slice_from_its_pods_created_to_its_last_raylet(
    world_name: str,
) -> None:
    from tests.test_controller import SLICE_WORK, _cluster
    from tpu_autoscaler.controlplane.world import IDEAL, REALISTIC

    world = {"ideal": IDEAL, "realistic": REALISTIC}[world_name]
    sim = SimulatedCluster(_cluster(), provisioning_delay=lambda _: 60.0, world=world)
    sim.events.run_until(0.0)
    for at_s in (0.0, 10.0):
        sim.submit(WorkItem.model_validate({"at": at_s, "duration": 100, **SLICE_WORK}))
    summary = sim.run(400)
    assert summary["slices_launched"] == 2 and len(sim.metrics.slice_up_s) == 2
    # The VMs after the delay, each pod Running up to the world's stagger later (its
    # last, the slice's), its raylet 4 s after.
    for up_s in sim.metrics.slice_up_s:
        assert 64.0 <= up_s <= 64.0 + world.running_stagger_s
    if world_name == "ideal":
        assert summary["slice_up_s"] == {"p50": 64.0, "p95": 64.0, "max": 64.0}
    else:
        assert max(sim.metrics.slice_up_s) > 64.0 + world.running_stagger_s / 2
        assert summary["slice_up_s"]["max"] == round(max(sim.metrics.slice_up_s), 1)


def test_the_rounds_that_ran_are_timed_apart_from_the_world_and_not_in_the_summary() -> None:
    """What `bench_sim.speed` splits a run's wall time by: the rounds that ran (one
    decision each), within the run's own wall time; a reading of the machine, so the
    summary, which repeats exactly, leaves it out."""
    from tests.test_controller import SLICE_WORK, _cluster

    sim = SimulatedCluster(_cluster(), provisioning_delay=lambda _: 60.0)
    sim.events.run_until(0.0)
    sim.submit(WorkItem.model_validate({"at": 0.0, "duration": 100, **SLICE_WORK}))
    started = time.perf_counter()
    summary = sim.run(900)
    wall_s = time.perf_counter() - started
    assert sim.quiet.skipped > 0 and len(sim.metrics.decision_s) > 0
    assert len(sim.metrics.decision_s) + sim.quiet.skipped == 900 / 5
    assert 0 < sim.metrics.rounds_wall_s < wall_s
    assert sim.metrics.rounds_wall_s >= sum(sim.metrics.decision_s)
    assert not any("wall" in key for key in summary)


def test_a_slice_is_up_once_at_its_last_raylet_and_unknown_raylets_count_nothing() -> None:
    from tpu_autoscaler.sim.metrics import Metrics

    metrics = Metrics()
    metrics.replica_created("g", ["a-0", "a-1"], 10.0)
    metrics.replica_created("g", ["b-0"], 20.0)
    assert (metrics.slices_launched, metrics.slices_launched_by_group) == (2, {"g": 2})
    metrics.raylet_started("head", 11.0)  # no replica's: nothing
    metrics.raylet_started("a-1", 70.25)
    assert metrics.slice_up_s == []
    metrics.raylet_started("b-0", 95.0)
    metrics.raylet_started("a-0", 84.0)
    metrics.raylet_started("a-0", 300.0)  # its raylet again (a restart): counted once
    assert metrics.slice_up_s == [75.0, 74.0]
    summary = metrics.summary("slice", 0, 400.0, 0, "ideal")
    assert summary["slice_up_s"] == {"p50": 74.5, "p95": 75.0, "max": 75.0}


def test_slice_up_quantiles_round_to_a_tenth_and_read_zero_without_slices() -> None:
    from tpu_autoscaler.sim.metrics import Metrics

    metrics = Metrics()
    assert metrics.summary("slice", 0, 1.0, 0, "ideal")["slice_up_s"] == {
        "p50": 0.0,
        "p95": 0.0,
        "max": 0.0,
    }
    metrics.slice_up_s = [60.04 + i for i in range(21)]  # 60.04 .. 80.04
    assert metrics.summary("slice", 0, 1.0, 0, "ideal")["slice_up_s"] == {
        "p50": 70.0,
        "p95": 79.0,
        "max": 80.0,
    }
