"""Issue 14's two-slice gang on a queued-provisioning group: the gang's two v6e 4x4
slices asked of GKE in one ProvisioningRequest (count = 8 hosts), which GKE grants
whole or not at all, and bound with `replicas += 2`. While GKE can hold one slice,
nothing is launched and nothing idles; once capacity returns, the job runs within
the request's wait for it, two autoscaler periods and the hosts' start. A crash
between the autoscaler's writes never leaves one slice of the gang raised alone.
(`benchmarks/bench_sim.py` prints the run beside the plain group's and stock Ray's;
docs/queued-provisioning.md has the figures.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.queued_faults import failing_writes_and_restarts
from tpu_autoscaler.adapters.kube.provreq_objects import CONSUME_ANNOTATION, pod_template
from tpu_autoscaler.adapters.kube.queued_steps import QueuedSteps, QueuedView
from tpu_autoscaler.controlplane.provreq_lifecycle import QueueTimings
from tpu_autoscaler.controlplane.world import REALISTIC
from tpu_autoscaler.core import labels
from tpu_autoscaler.sim.cluster import AUTOSCALER_PERIOD_S, SimulatedCluster
from tpu_autoscaler.sim.provisioning import NODES_READY_S, RAYLET_START_S
from tpu_autoscaler.sim.sampling import SAMPLE_PERIOD_S
from tpu_autoscaler.sim.workload import Workload, load_workload, parse_workload

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "examples/clusters/v6e-4x4-multihost-queued.yaml"
WORKLOAD = ROOT / "examples/workloads/scarce-two-slice-gang-returns.yaml"
GROUP = "tpu-v6e-group"
NS = "default"
HOSTS, CHIPS_PER_HOST, SLICES = 4, 4, 2
RETURNED_S = 2700.0
HOST_START_S = NODES_READY_S + REALISTIC.running_stagger_s + RAYLET_START_S
"""From a granted request's pods created to the last of their raylets registered:
nodes ready, each pod Running within the stagger, its raylet a few seconds later."""


class Watched:
    """What the run wrote, heard from the stores: each request's pod count and when it
    was granted, every `replicas` the queued group took, each pod's request."""

    def __init__(self, sim: SimulatedCluster) -> None:
        assert sim.queued is not None
        self.sim = sim
        self.counts: dict[str, int] = {}
        self.granted_s: dict[str, float] = {}
        self.replicas: list[int] = []
        self.consumes: dict[str, str] = {}
        sim.queued.objects.watchers.append(self.request)
        sim.store.watchers.append(self.cluster)

    def request(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "ProvisioningRequest":
            return
        name = obj["metadata"]["name"]
        self.counts[name] = sum(p["count"] for p in obj["spec"]["podSets"])
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition["type"] == "Provisioned" and condition["status"] == "True":
                self.granted_s.setdefault(name, self.sim.events.now_s)

    def cluster(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "RayCluster":
            (group,) = [g for g in obj["spec"]["workerGroupSpecs"] if g["groupName"] == GROUP]
            if not self.replicas or self.replicas[-1] != group["replicas"]:
                self.replicas.append(group["replicas"])
        elif kind == "Pod" and obj["metadata"].get("labels", {}).get(labels.KUBERAY_GROUP) == GROUP:
            consumed = (obj["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION)
            if consumed:
                self.consumes[obj["metadata"]["name"]] = consumed


def _simulate(
    trace: Workload,
    until_s: float,
    before: Callable[[SimulatedCluster], None] = lambda sim: None,
    seed: int = 0,
) -> tuple[SimulatedCluster, Watched, dict[str, Any]]:
    cluster = yaml.safe_load(CLUSTER.read_text())
    sim = SimulatedCluster(cluster, seed=seed, capacity=trace.provisioning.capacity)
    watched = Watched(sim)
    before(sim)
    sim.load(trace)
    return sim, watched, sim.run(until_s)


def _placed_s(sim: SimulatedCluster) -> float:
    (job,) = sim.ray.finished + list(sim.ray.running.values())
    assert job.placed_s is not None
    return job.placed_s


def _assert_whole_gang(sim: SimulatedCluster, watched: Watched) -> None:
    """Every request is for both slices; `replicas` went from none to both at once;
    all eight pods consume one granted request; nothing is left once it is served."""
    assert set(watched.counts.values()) == {SLICES * HOSTS}
    assert set(watched.replicas) <= {0, SLICES}, watched.replicas
    assert len(watched.consumes) == SLICES * HOSTS
    assert len(set(watched.consumes.values())) == 1
    assert set(watched.consumes.values()) <= set(watched.granted_s)
    assert sim.queued is not None
    assert sim.queued.objects.list_provisioning_requests(NS) == []
    assert sim.queued.objects.list_pod_templates(NS) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_the_gang_idles_nothing_and_runs_once_gke_can_grant_both_slices(seed: int) -> None:
    sim, watched, summary = _simulate(load_workload(str(WORKLOAD)), 5400.0, seed=seed)
    _assert_whole_gang(sim, watched)
    assert summary["slices_launched"] == SLICES
    assert summary["unsatisfied_at_end"] == 0 and sim.violations == []
    asked = [e["message"] for e in sim.store.events if e["reason"] == "ProvisioningRequested"]
    assert asked and all(f"asked GKE for 2 slices at once of {GROUP}" in m for m in asked)
    launched = [e["message"] for e in sim.store.events if e["reason"] == "LaunchReplicas"]
    assert len(launched) == 1 and "launching 2 replica(s)" in launched[0]
    # Idle only while the gang's hosts register one by one (the job needs all eight):
    # each host at most the Running stagger, give or take one sample.
    idle_bound_chip_s = (
        SLICES * HOSTS * CHIPS_PER_HOST * (REALISTIC.running_stagger_s + SAMPLE_PERIOD_S)
    )
    assert sim.metrics.idle_chip_seconds <= idle_bound_chip_s
    # The request waited in GKE's queue: granted at its next try once capacity is back,
    (granted_s,) = [t for t in watched.granted_s.values() if t >= RETURNED_S]
    assert granted_s - RETURNED_S <= QueueTimings().retry_s
    # then bound within two periods, and the job placed once its hosts are up.
    assert _placed_s(sim) - granted_s <= 2 * AUTOSCALER_PERIOD_S + HOST_START_S


def test_while_gke_never_can_hold_both_slices_no_slice_is_launched() -> None:
    """`scarce-two-slice-gang.yaml`: room for one slice for all 90 minutes. Requests
    for both slices wait, fail after 30 minutes and are asked again after the
    stockout hold; no pod of the group is ever made, so no chip idles."""
    trace = load_workload(str(ROOT / "examples/workloads/scarce-two-slice-gang.yaml"))
    sim, watched, summary = _simulate(trace, 5400.0)
    assert set(watched.counts.values()) == {SLICES * HOSTS} and len(watched.counts) >= 2
    assert watched.granted_s == {} and set(watched.replicas) <= {0}
    assert summary["slices_launched"] == 0 and sim.metrics.idle_chip_seconds == 0
    assert summary["unsatisfied_at_end"] == 1


def test_gke_grants_a_gangs_request_whole_or_not_at_all() -> None:
    """With room for one slice, the request for two is never granted (no pod of the
    group exists); with room for both, it holds both until their pods take them."""
    cluster = yaml.safe_load(CLUSTER.read_text())
    sim = SimulatedCluster(cluster, seed=0, capacity={GROUP: 1})
    gke = sim.gke
    assert not gke.try_reserve(GROUP, "both", SLICES * HOSTS)
    assert gke.try_reserve(GROUP, "one", HOSTS)
    gke.release("one")
    gke.set_capacity(GROUP, 2)
    assert gke.try_reserve(GROUP, "both", SLICES * HOSTS)
    assert not gke.try_reserve(GROUP, "third", HOSTS)
    assert gke.reserved("both")


SHORT = {
    "items": [
        {
            "at": 0,
            "duration": 600,
            "placement_group": {
                "strategy": "STRICT_SPREAD",
                "bundles": [{"TPU": 4}] * (SLICES * HOSTS),
                "bundle_label_selector": [{labels.RAY_TPU_POD_TYPE: "v6e-16"}] * (SLICES * HOSTS),
            },
        }
    ],
    "provisioning": {"capacity": {GROUP: 1}},
    "faults": [{"at": 600, "capacity": {"group": GROUP, "slices": None}}],
}
"""The scenario shortened: room for one slice for ten minutes, then for any number."""


def _crash_after_patch(
    when: Callable[[QueuedSteps], bool],
    writes_done: Callable[[Any, QueuedSteps], None],
    crashed: list[float],
) -> Callable[[SimulatedCluster], None]:
    """The first round whose steps `when` picks dies after its RayCluster patch, having
    made only `writes_done` of its request writes (when, into `crashed`); a new
    process takes over."""

    def install(sim: SimulatedCluster) -> None:
        assert sim.autoscaler.queued is not None
        queued = sim.autoscaler.queued
        carry_out = queued.carry_out

        def crashing(cluster_raw: Mapping[str, Any], view: QueuedView, steps: QueuedSteps) -> int:
            if crashed or not when(steps):
                return carry_out(cluster_raw, view, steps)
            crashed.append(sim.events.now_s)
            writes_done(cluster_raw, steps)
            sim.autoscaler = sim.new_autoscaler_process()
            return 0

        queued.carry_out = crashing  # type: ignore[method-assign]

    return install


def _templates_only(sim: SimulatedCluster) -> Callable[[Any, QueuedSteps], None]:
    def write(cluster_raw: Any, steps: QueuedSteps) -> None:
        assert sim.queued is not None
        for group, name, _ in steps.create:
            sim.queued.objects.create_pod_template(NS, pod_template(name, cluster_raw, group))

    return write


@pytest.mark.parametrize("crash", ["after the binding patch", "between template and request"])
def test_a_crash_between_steps_never_raises_one_slice_of_the_gang(crash: str) -> None:
    crashed: list[float] = []

    def install(sim: SimulatedCluster) -> None:
        if crash == "after the binding patch":
            # `replicas += 2` landed; the served request is never deleted by this process.
            _crash_after_patch(lambda s: bool(s.bind), lambda raw, s: None, crashed)(sim)
        else:
            # The gang's PodTemplate is made, its request never: an orphan to clean up.
            _crash_after_patch(lambda s: bool(s.create), _templates_only(sim), crashed)(sim)

    sim, watched, summary = _simulate(parse_workload(SHORT, "short"), 1800.0, install)
    assert len(crashed) == 1
    _assert_whole_gang(sim, watched)
    assert summary["slices_launched"] == SLICES and summary["unsatisfied_at_end"] == 0
    assert sim.violations == []


def test_failed_writes_and_restarts_every_few_rounds_never_raise_one_slice() -> None:
    """Every 3rd request create fails after its PodTemplate was made, and the
    autoscaler restarts every 5 rounds: the gang still comes up whole, once."""

    def flaky(sim: SimulatedCluster) -> None:
        failing_writes_and_restarts(sim, fail_every=3, restart_every=5)

    sim, watched, summary = _simulate(parse_workload(SHORT, "short"), 1800.0, flaky)
    _assert_whole_gang(sim, watched)
    assert summary["slices_launched"] == SLICES and summary["unsatisfied_at_end"] == 0
