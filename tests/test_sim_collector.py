"""A run goes with Python's cyclic collector off (`sim/cluster.py`): it makes little
cyclic garbage (the policy's scratch slots of replicas gone, some closures), so the
collector's passes over every object a run keeps were mostly cost. These tests hold
the premise (what a run leaves for the collector is a minor part of what it made) and
the bargain's terms (off only while the run goes, collecting all the same past a
growth bound)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tpu_autoscaler.controlplane.world import REALISTIC
from tpu_autoscaler.sim import cluster as sim_cluster
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import parse_workload

ROOT = Path(__file__).parent.parent
SLICE = {"topology": "4x4", "accelerator_version": "v6e", "head_reservation_timeout_s": None}
TRACE = parse_workload(
    [
        {"at": 60 * (i % 4), "duration": 600 + 30 * i, "slice_placement_group": SLICE}
        for i in range(8)
    ],
    "collector",
)


def _sim() -> SimulatedCluster:
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 8
    sim = SimulatedCluster(cluster, policy="slice", seed=0, world=REALISTIC)
    sim.load(TRACE)
    return sim


@pytest.fixture
def collector_on() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.enable()
    yield
    if not enabled:
        gc.disable()


def test_a_run_leaves_little_for_the_collector() -> None:
    sim = _sim()
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # kept off after the run too, lest a pass free its cycles unseen
    try:
        summary = sim.run(TRACE.last_end_s + 1800)
        grown = gc.get_count()[0]  # objects made and not freed, cycles among them
        left = gc.collect()  # what only the collector could free
    finally:
        if enabled:
            gc.enable()
    assert summary["slices_launched"] == 8
    # 549 of 5,759 here; one more cycle a round would leave 1,163 of 6,158.
    assert left * 8 < grown, (left, grown)


@pytest.mark.usefixtures("collector_on")
def test_the_collector_is_off_while_a_run_goes_and_on_again_after() -> None:
    sim = _sim()
    seen: list[bool] = []
    sim.events.at(100.0, lambda: seen.append(gc.isenabled()))
    sim.run(TRACE.last_end_s + 1800)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_turned_off_before_a_run_stays_off() -> None:
    enabled = gc.isenabled()
    gc.disable()
    try:
        _sim().run(300.0)
        assert not gc.isenabled()
    finally:
        if enabled:
            gc.enable()


@pytest.mark.usefixtures("collector_on")
def test_a_run_that_keeps_growing_is_collected_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generations: list[tuple[int, ...]] = []
    monkeypatch.setattr(sim_cluster, "COLLECT_AFTER_GROWTH", 0)
    monkeypatch.setattr(sim_cluster.gc, "collect", lambda *g: generations.append(g) or 0)
    _sim().run(300.0)
    # Every round (one each 5 s), the bound being 0; never a walk of the old generation.
    assert generations == [(1,)] * (300 // 5)
