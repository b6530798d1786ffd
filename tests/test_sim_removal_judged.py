"""How the simulator judges a removal KubeRay carries out: a Ray node removed before
its idle timeout is a violation if it was there when the autoscaler named its pod in
workersToDelete, not if its raylet joined after (KubeRay, waiting for earlier
deletions to end, acted after a slice timing out had come)."""

from __future__ import annotations

import pytest

from tests.test_controller import _replicas, _sim, _submit
from tpu_autoscaler.core import labels
from tpu_autoscaler.sim.cluster import SimulatedCluster

PINNED = {
    "count": 4,
    "task": {"resources": {"TPU": 4}, "label_selector": {"ray.io/tpu-pod-type": "v6e-16"}},
}


def _raylets_start(sim: SimulatedCluster, pods: list[str]) -> None:
    for name in pods:
        pod = sim.store.pod("default", name)
        assert pod is not None
        host = int(pod["metadata"]["labels"][labels.KUBERAY_HOST_INDEX])
        sim.ray.add_node(pod, sim.shapes["slices"], host)
        sim.ray_seen.add(name)


def _named_for_deletion(sim: SimulatedCluster, pods: list[str]) -> None:
    """The autoscaler's removal, as its patch writes it."""
    spec = sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"]
    index = next(i for i, g in enumerate(spec) if g["groupName"] == "slices")
    sim.store.edit_raycluster(
        "default",
        "ctl",
        [
            {"op": "replace", "path": f"/spec/workerGroupSpecs/{index}/replicas", "value": 0},
            {
                "op": "add",
                "path": f"/spec/workerGroupSpecs/{index}/scaleStrategy",
                "value": {"workersToDelete": pods},
            },
        ],
    )


def _launched_slice(sim: SimulatedCluster) -> list[str]:
    _submit(sim, PINNED, duration=600)
    sim.events.run_until(21.0)  # pods created, not provisioned; no round until 25 s
    sim.ray.pending.clear()  # the job went away: the raylets stay idle
    ((_, pods),) = _replicas(sim, "slices").items()
    return pods


@pytest.mark.parametrize("joined_after_naming", [True, False])
def test_a_raylet_is_judged_by_whether_it_was_there_when_its_pod_was_named(
    joined_after_naming: bool,
) -> None:
    sim = _sim()
    pods = _launched_slice(sim)
    if joined_after_naming:
        _named_for_deletion(sim, pods)
        _raylets_start(sim, pods)
    else:
        _raylets_start(sim, pods)
        _named_for_deletion(sim, pods)
    sim.events.run_until(24.0)
    assert _replicas(sim, "slices") == {} and not any(p in sim.ray.nodes for p in pods)
    if joined_after_naming:
        assert sim.violations == []
    else:
        assert len(sim.violations) == 4
        assert all("removed after 0s idle" in v for v in sim.violations)
