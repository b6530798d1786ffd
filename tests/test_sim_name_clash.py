"""KubeRay 1.7 names a multi-host replica `<group>-` + 5 random characters
(`GenerateRayWorkerReplicaGroupName`) and never checks the name is free: about n^2/28.7M
for n live replicas of a group (44% at 4,096). Two slices under one name are one
replica to KubeRay: naming either pod in workersToDelete, or one failing, deletes both.
So they are one replica to us too, and it must not be taken for a broken one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.controlplane.kuberay_groups import GroupReconciler
from tpu_autoscaler.shell import events
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import Workload, parse_workload

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
SLICE = {"topology": "4x4", "accelerator_version": "v6e", "head_reservation_timeout_s": None}
TWO_SLICES = [
    {"at": 0, "duration": 3000, "slice_placement_group": SLICE},
    {"at": 300, "duration": 200, "slice_placement_group": SLICE},
]
"""A long job's slice, and a short one's launched while it runs."""


def _run_with_second_name_reused(
    trace: Workload, monkeypatch: pytest.MonkeyPatch
) -> tuple[SimulatedCluster, dict[str, Any]]:
    """Run `trace` where KubeRay names the second replica as it named the first."""
    names: list[str] = []
    draw = GroupReconciler._replica_name

    def second_reuses_first(self: GroupReconciler, group: str) -> str:
        names.append(names[0] if len(names) == 1 else draw(self, group))
        return names[-1]

    monkeypatch.setattr(GroupReconciler, "_replica_name", second_reuses_first)
    sim = SimulatedCluster(yaml.safe_load(CLUSTER.read_text()), policy="slice", seed=0)
    sim.load(trace)
    summary = sim.run(trace.last_end_s + 1800)
    assert names[0] == names[1]
    return sim, summary


def test_a_busy_slice_whose_replica_name_a_later_one_reuses_is_never_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = parse_workload(TWO_SLICES, "clash")
    sim, summary = _run_with_second_name_reused(trace, monkeypatch)
    # Before: the eight pods under one name never made a whole replica; it stayed
    # pending from the older slice's launch and went as a provisioning timeout at
    # 910 s, the busy slice with it.
    assert summary["busy_replicas_terminated"] == 0, sim.violations
    assert not sim.violations
    assert summary["demand_wait_s"]["max"] < 300
    # Both slices went together once both were idle; nothing is left.
    assert not sim.ray.pending
    assert not [n for n in sim.ray.nodes.values() if n.group != "headgroup" and n.labels]


def test_a_busy_slice_stays_when_the_slice_sharing_its_name_never_gets_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The newer slice of a clashed pair is stocked out past the provisioning timeout.
    Removing it names the replica, and KubeRay deletes the busy older slice with it:
    the pair waits until the older slice's work ends, its group backing off."""
    trace = parse_workload(
        {
            "faults": [{"at": 250, "stockout": {"group": "tpu-v6e-group", "until": 2600}}],
            "items": [
                {"at": 0, "duration": 2400, "slice_placement_group": SLICE},
                {"at": 300, "duration": 200, "slice_placement_group": SLICE},
            ],
        },
        "clash-stockout",
    )
    sim, summary = _run_with_second_name_reused(trace, monkeypatch)
    # Before: the pair went as a provisioning timeout at 1210 s, the busy slice with it.
    assert summary["busy_replicas_terminated"] == 0, sim.violations
    assert not sim.violations
    # The second job waits out the stockout (to 2600 s), not the older slice's work.
    assert summary["demand_wait_s"]["max"] < 2600 - 300 + 60
    assert not sim.ray.pending
    assert not [n for n in sim.ray.nodes.values() if n.group != "headgroup" and n.labels]


def test_the_operator_is_told_once_which_replica_name_holds_two_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = parse_workload(TWO_SLICES, "clash")
    sim, _ = _run_with_second_name_reused(trace, monkeypatch)
    told = [e for e in sim.store.events if e["reason"] == events.REPLICA_NAME_CLASH]
    assert len(told) == 1, told  # once while it lasts, not every round
    (said,) = told
    assert said["type"] == "Warning"
    replica = said["message"].split("replica name ")[1].split()[0].strip("'")
    assert replica.startswith("tpu-v6e-group-")
    assert said["message"] == (
        f"worker group 'tpu-v6e-group': KubeRay gave the replica name {replica!r} to 2 "
        "slices (8 pods for 4-host slices), so removing either removes all of them; they "
        "are kept and removed as one replica"
    )


def test_no_clash_is_reported_without_one() -> None:
    trace = parse_workload(TWO_SLICES, "no-clash")
    sim = SimulatedCluster(yaml.safe_load(CLUSTER.read_text()), policy="slice", seed=0)
    sim.load(trace)
    sim.run(trace.last_end_s + 1800)
    assert not [e for e in sim.store.events if e["reason"] == events.REPLICA_NAME_CLASH]
