"""The simulated GKE says what GKE says when capacity is short (FailedScaleUp Events on
a waiting slice's pods for a stockout, a quota or the capacity cap; the kubelet's
node-shutdown status on a preempted pod), and the production adapters read it into
the snapshot's capacity signals."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.adapters.kube.capacity_events import parse_events
from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.kube.pods import timestamp_s
from tpu_autoscaler.adapters.live import take_snapshot
from tpu_autoscaler.adapters.ray.gcs import read_dead_nodes, read_ray_state
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, assemble, build_snapshot
from tpu_autoscaler.controlplane.store import EVENT_TTL_S
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.capacity import CapacityProblem, CapacitySignal
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.sim.cluster import AUTOSCALER_PERIOD_S, SimulatedCluster
from tpu_autoscaler.sim.provisioning import CAPACITY_RETRY_S, SCALE_UP_RETRY_S
from tpu_autoscaler.sim.workload import Workload, parse_workload

DELAY_S = 60.0
SLICE = {
    "slice_placement_group": {
        "topology": "4x4",
        "accelerator_version": "v6e",
        "head_reservation_timeout_s": None,
    }
}
OUT_OF_RESOURCES = (
    "Node scale up in zones us-central2-b associated with this pod failed: GCE out of "
    "resources. Pod is at risk of not being scheduled."
)


def _sim(**kwargs: Any) -> SimulatedCluster:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    cluster = raycluster(
        tpu_group("slices", catalog.slice_type(v6e, "4x4"), 0, 3, idleTimeoutSeconds=60),
        name="sig",
    )
    return SimulatedCluster(cluster, provisioning_delay=lambda _: DELAY_S, **kwargs)


def _workload(*faults: dict[str, Any], slices: int = 1) -> Workload:
    items = [{"at": 0, "duration": 3000, **SLICE} for _ in range(slices)]
    return parse_workload({"items": items, "faults": list(faults)}, "trace")


def _scale_up_failures(sim: SimulatedCluster) -> list[dict[str, Any]]:
    return [e for e in sim.store.events if e["reason"] == "FailedScaleUp"]


def _signals(sim: SimulatedCluster) -> tuple[CapacitySignal, ...]:
    """The snapshot's signals, read as the controller reads them."""
    observed = Observer(sim.namespace, sim.name).read(sim.store, events=True)
    assert observed.events_error is None
    loaded = assemble(
        observed.cluster,
        list(observed.pods),
        read_ray_state(sim.gcs),
        sim.events.now_s,
        events=parse_events(observed.events),
        dead=read_dead_nodes(sim.gcs),
    )
    return loaded.snapshot.capacity_signals


def _slice_pods(sim: SimulatedCluster) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in sim.store.list_pods(sim.namespace, {labels.KUBERAY_GROUP: "slices"})
    )


def test_a_stockout_leaves_failed_scale_up_events_that_the_snapshot_reads() -> None:
    sim = _sim()
    sim.load(_workload({"at": 0, "stockout": {"group": "slices", "until": 1000}}))
    sim.run(DELAY_S + 10)  # the launch's VMs were asked for and refused
    pods = _slice_pods(sim)
    assert len(pods) == 4
    failures = _scale_up_failures(sim)
    assert sorted(e["involvedObject"]["name"] for e in failures) == pods
    for event in failures:
        assert event["involvedObject"]["kind"] == "Pod"
        assert (
            event["involvedObject"]["uid"]
            == sim.store.pod(sim.namespace, event["involvedObject"]["name"])["metadata"]["uid"]
        )  # type: ignore[index]
        assert event["type"] == "Warning"
        assert event["message"] == OUT_OF_RESOURCES
        assert event["source"]["component"] == "cluster-autoscaler"
        assert event["count"] == 1
        assert event["firstTimestamp"] == event["lastTimestamp"]
    (signal,) = _signals(sim)
    assert (signal.group, signal.problem) == ("slices", CapacityProblem.STOCKOUT)
    first_s = signal.at_s
    assert DELAY_S <= first_s <= DELAY_S + 10
    assert signal.message == OUT_OF_RESOURCES

    # cluster-autoscaler tries again after its backoff, fails again: counted, not repeated.
    sim.run(DELAY_S + SCALE_UP_RETRY_S + 10)
    failures = _scale_up_failures(sim)
    assert len(failures) == 4 and {e["count"] for e in failures} == {2}
    assert all(e["firstTimestamp"] < e["lastTimestamp"] for e in failures)
    (signal,) = _signals(sim)
    assert signal.at_s == pytest.approx(first_s + SCALE_UP_RETRY_S, abs=1.0)
    assert signal.source.endswith("(x2)")

    # The snapshot `tpu-autoscaler snapshot` writes carries the Events to `plan`.
    stranger = {**_scale_up_failures(sim)[0], "metadata": {"name": "someone-else.1"}}
    stranger["reason"] = "NotTriggerScaleUp"
    stranger["involvedObject"] = {"kind": "Pod", "name": "someone-elses-pod"}
    sim.store.create_event(sim.namespace, stranger)
    written = take_snapshot(sim.store, sim.name, sim.namespace, None)
    assert len(written["events"]) == 4, "about this cluster's pods only"
    (carried,) = build_snapshot(written, "snap").snapshot.capacity_signals
    assert (carried.group, carried.problem, carried.at_s) == ("slices", signal.problem, signal.at_s)

    # Capacity back: the slice comes up, and no more failures are said.
    sim.run(1000 + 60)
    assert all(
        p["status"]["phase"] == "Running"
        for p in sim.store.list_pods(sim.namespace, {labels.KUBERAY_GROUP: "slices"})
    )
    assert {e["count"] for e in _scale_up_failures(sim)} == {3}  # the last refusal before 1000


def test_a_quota_fault_says_quota_exceeded() -> None:
    sim = _sim()
    sim.load(_workload({"at": 0, "quota": {"group": "slices", "until": 1000}}))
    sim.run(DELAY_S + 10)
    messages = {e["message"] for e in _scale_up_failures(sim)}
    assert messages == {OUT_OF_RESOURCES.replace("GCE out of resources", "GCE quota exceeded")}
    (signal,) = _signals(sim)
    assert signal.problem is CapacityProblem.QUOTA


def test_slices_beyond_the_capacity_cap_fail_to_scale_up_every_retry() -> None:
    sim = _sim(capacity={"slices": 1})
    sim.load(_workload(slices=2))
    sim.run(DELAY_S + 3 * CAPACITY_RETRY_S + 10)
    failures = _scale_up_failures(sim)
    assert len(failures) == 4, "the second slice's four pods"
    assert {e["count"] for e in failures} == {4}  # refused at 60, 90, 120 and 150 s
    (signal,) = _signals(sim)
    assert signal.problem is CapacityProblem.STOCKOUT


def test_a_preemption_storm_fails_pods_as_a_node_shutdown_and_is_read_as_preemption() -> None:
    sim = _sim()
    storm = {"group": "slices", "until": 1500, "mean_interval_s": 200}
    sim.load(_workload({"at": 400, "preemption_storm": storm}))
    sim.run(1500)
    preempted = [p for p in sim.ray.dead.values() if p.death_reason == "AUTOSCALER_DRAIN_PREEMPTED"]
    assert preempted, "no host was preempted in the storm"
    # The GCS keeps each preempted node's reason: a signal per host, long after KubeRay
    # deleted its pods.
    signals = _signals(sim)
    assert {s.problem for s in signals} == {CapacityProblem.PREEMPTED}
    assert sorted(s.source for s in signals) == sorted(f"pod {n.pod}" for n in preempted)
    said = "the GCS: AUTOSCALER_DRAIN_PREEMPTED: spot VM preempted"
    assert all(s.message == said for s in signals)
    died = sorted(n.died_at_s or 0.0 for n in preempted)
    assert sorted(s.at_s for s in signals) == pytest.approx(died, abs=1e-3)  # milliseconds
    # Each preempted host took its slice: KubeRay replaced it whole, more than one launch.
    assert sim.metrics.slices_launched >= 1 + len(
        {n.labels[labels.RAY_TPU_SLICE_NAME] for n in preempted}
    )
    assert not _scale_up_failures(sim)
    # A failed pod is seen (while it is listed) as the kubelet leaves it.
    sim2 = _sim()
    sim2.load(_workload())
    sim2.run(400)
    preempted_at_s = sim2.events.now_s
    sim2.gke._preempt("slices", preempted_at_s, 100.0)  # one, and none after its window
    (failed,) = [
        p
        for p in sim2.store.list_pods(sim2.namespace, {labels.KUBERAY_GROUP: "slices"})
        if p["status"]["phase"] == "Failed"
    ]
    assert failed["status"]["reason"] == "Terminated"
    assert (
        failed["status"]["message"] == "Pod was terminated in response to imminent node shutdown."
    )
    (signal,) = _signals(sim2)
    assert (signal.problem, signal.at_s) == (CapacityProblem.PREEMPTED, preempted_at_s)


@pytest.mark.parametrize(
    ("fault", "where", "says"),
    [
        (
            {"at": 5},
            "faults[0]",
            "give exactly one of host_failure, stockout, quota, preemption_storm",
        ),
        (
            {
                "at": 5,
                "quota": {"group": "slices", "until": 100},
                "stockout": {"group": "slices", "until": 100},
            },
            "faults[0]",
            "give exactly one of",
        ),
        (
            {"at": 500, "quota": {"group": "slices", "until": 100}},
            "faults[0]",
            "quota.until (100) must be after at (500)",
        ),
        (
            {"at": 5, "preemption_storm": {"group": "slices", "until": 100, "mean_interval_s": 0}},
            "faults[0].preemption_storm.mean_interval_s",
            "greater than 0",
        ),
        (
            {"at": 5, "preemption_storm": {"group": "slices", "until": 100}},
            "faults[0].preemption_storm.mean_interval_s",
            "Field required",
        ),
    ],
)
def test_a_bad_fault_is_named(fault: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_workload({"items": [], "faults": [fault]}, "trace")
    (problem,) = caught.value.problems
    assert problem.path == f"trace: {where}"
    assert says in problem.message


def test_each_round_of_the_autoscaler_plans_with_the_signals_of_its_read() -> None:
    """The controller's own snapshot, round by round: the stockout from the first
    refused scale-up on, the preemption from the first preempted host on."""
    sim = _sim()
    rounds: list[tuple[float, set[CapacityProblem]]] = []
    decide = sim.autoscaler.decide

    def recording(loaded: LoadedSnapshot) -> Plan:
        problems = {s.problem for s in loaded.snapshot.capacity_signals}
        rounds.append((sim.events.now_s, problems))
        return decide(loaded)

    sim.autoscaler.decide = recording
    storm = {"group": "slices", "until": 1500, "mean_interval_s": 200}
    sim.load(
        _workload(
            {"at": 0, "stockout": {"group": "slices", "until": 300}},
            {"at": 600, "preemption_storm": storm},
        )
    )
    sim.run(1500)
    refused_s = min(timestamp_s(e["firstTimestamp"]) or 0.0 for e in _scale_up_failures(sim))
    preempted_s = min(
        n.died_at_s or 0.0
        for n in sim.ray.dead.values()
        if n.death_reason == "AUTOSCALER_DRAIN_PREEMPTED"
    )
    # A round reads first and decides after; the round that decides moments after the
    # refusal read before it, so "after" means from the next round on. The refusals
    # were said on the first slice's pods, which go when its preempted host takes it.
    for at_s, problems in rounds:
        for problem, said_s, gone_s in (
            (CapacityProblem.STOCKOUT, refused_s, preempted_s),
            (CapacityProblem.PREEMPTED, preempted_s, float("inf")),
        ):
            if at_s < said_s:
                assert problem not in problems, (at_s, problem)
            elif said_s + AUTOSCALER_PERIOD_S <= at_s < gone_s:
                assert problem in problems, (at_s, problem)


def test_failed_scale_ups_expire_an_hour_after_their_last_repeat() -> None:
    sim = _sim()
    stockout = {"at": 0, "stockout": {"group": "slices", "until": 300}}
    sim.load(
        parse_workload({"items": [{"at": 0, "duration": 9000, **SLICE}], "faults": [stockout]}, "t")
    )
    sim.run(DELAY_S + SCALE_UP_RETRY_S + 10)
    (signal,) = _signals(sim)  # on the pods of the slice that then runs for hours
    sim.run(signal.at_s + EVENT_TTL_S - 10)
    assert [s.problem for s in _signals(sim)] == [CapacityProblem.STOCKOUT]
    sim.run(signal.at_s + EVENT_TTL_S + 10)
    assert _signals(sim) == ()
    assert len(_scale_up_failures(sim)) == 4, "kept in the store's record, not served"
