"""Single cases where our plan differed from Ray 2.60's on a cluster without
multi-host groups (found by `test_parity_properties.py`), each asserted by what Ray
does and checked against Ray's own scheduler (`baseline.ray_plan`)."""

from __future__ import annotations

from tests.test_parity_properties import (
    IDLE_TIMEOUT_S,
    _group,
    _raycluster,
    launches,
    ray_launches,
    terminations,
)
from tpu_autoscaler.adapters.ray.baseline import ray_plan
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, build_snapshot
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.shell.controller import decide_by_slices
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

LONG_IDLE = 2.0 * IDLE_TIMEOUT_S


def _both(builder: SnapshotBuilder) -> tuple[Plan, Plan]:
    loaded: LoadedSnapshot = build_snapshot(builder.build(), "case")
    ours, theirs = decide_by_slices(loaded), ray_plan(loaded)
    assert launches(ours) == ray_launches(theirs), (ours.render_text(), theirs.render_text())
    assert terminations(ours) == terminations(theirs), (ours.render_text(), theirs.render_text())
    return ours, theirs


def _pod(builder: SnapshotBuilder, group: str, index: int) -> str:
    return [p["metadata"]["name"] for p in builder.pods if group in p["metadata"]["name"]][index]


def test_an_idle_node_the_first_pass_placed_work_on_is_kept() -> None:
    """A later pass of the settled plan sees the first pass's launches as capacity
    and may place the work elsewhere; what goes is decided on the cluster as it is
    (Ray places the 1-CPU tasks on the three 1-CPU nodes, keeping all of them)."""
    groups = [_group("group-0", 16, 0, 1), _group("group-1", 4, 0, 3), _group("group-2", 1, 0, 3)]
    builder = SnapshotBuilder(_raycluster(groups, 2)).head(used={"CPU": 2.0})
    builder.replica("group-0", 0, used={0: {"CPU": 16.0}})
    for index, idle_s in enumerate([LONG_IDLE, 1.0, LONG_IDLE]):
        builder.replica("group-2", index, idle_s=idle_s)
    builder.tasks({"CPU": 1.0}, count=3).tasks({"CPU": 2.0}, count=3)
    ours, _ = _both(builder)
    assert ours.terminate == ()
    assert launches(ours) == {"group-1": 2}


def test_request_resources_lands_on_the_best_used_existing_node() -> None:
    """Ray places request_resources on existing nodes by its utilization score: the
    idle 1-CPU node is fully used by {CPU: 1} and stays; the head would not be."""
    groups = [_group("group-0", 16, 0, 4), _group("group-1", 1, 0, 3)]
    builder = SnapshotBuilder(_raycluster(groups, 2)).head(used={"CPU": 2.0})
    builder.replica("group-0", 0, used={0: {"CPU": 16.0}})
    builder.replica("group-1", 0, idle_s=LONG_IDLE)
    builder.request_resources([{"CPU": 1.0}])
    ours, _ = _both(builder)
    assert ours.terminate == () and ours.launch == ()


def test_request_resources_launches_before_tasks_are_placed() -> None:
    """Ray enforces request_resources first: its new node then serves tasks too, and
    what is left of the tasks picks its own nodes (two 4-CPU/1-GPU nodes, not one
    8-CPU/4-GPU node for everything)."""
    groups = [_group("group-0", 1, 0, 3), _group("group-1", 4, 1, 3), _group("group-2", 8, 4, 3)]
    builder = SnapshotBuilder(_raycluster(groups, 2)).head()
    builder.tasks({"GPU": 1.0}, count=2).tasks({"CPU": 2.0}, count=5)
    builder.request_resources([{"GPU": 1.0}, {"CPU": 2.0}])
    ours, _ = _both(builder)
    assert launches(ours) == {"group-1": 2}


def test_a_pack_placement_group_without_tpus_is_placed_bundle_by_bundle() -> None:
    """PACK and SPREAD are no constraint to Ray's autoscaler: the bundles go on the
    best existing nodes, then node by node as tasks do (the GPU bundle alone takes a
    new 1-GPU node; the CPU bundles fit on the idle 16-CPU node)."""
    groups = [_group("group-0", 16, 0, 2), _group("group-1", 16, 8, 1), _group("group-2", 4, 1, 3)]
    builder = SnapshotBuilder(_raycluster(groups, 0)).head()
    builder.replica("group-0", 0, idle_s=1.0)
    builder.placement_group("pg", [{"CPU": 2.0}, {"CPU": 12.0}, {"GPU": 1.0}], "PACK")
    ours, _ = _both(builder)
    assert launches(ours) == {"group-2": 1}


def test_a_placement_group_bundle_takes_the_best_used_existing_node() -> None:
    """{CPU: 1} goes on the idle 1-CPU node (fully used) rather than a 2-CPU one, so
    that node is kept."""
    groups = [_group("group-0", 16, 0, 1), _group("group-1", 2, 0, 2), _group("group-2", 1, 0, 3)]
    builder = SnapshotBuilder(_raycluster(groups, 0)).head()
    builder.replica("group-1", 0, idle_s=1.0).replica("group-1", 1, idle_s=30.0)
    builder.replica("group-2", 0, used={0: {"CPU": 1.0}})
    builder.replica("group-2", 1, idle_s=LONG_IDLE)
    builder.placement_group("pg", [{"CPU": 1.0}], "PACK")
    ours, _ = _both(builder)
    assert ours.terminate == () and ours.launch == ()


def test_an_existing_node_is_scored_with_all_the_work_placed_on_it_this_round() -> None:
    """Ray scores a node with every request it placed there in this round: the GPU
    node holding the placement group's GPU bundles counts as used by GPU work, so
    the 1-CPU task joins it (two resource types) and the idle 2-CPU node goes."""
    groups = [_group("group-0", 2, 0, 4), _group("group-1", 8, 4, 1), _group("group-2", 16, 0, 2)]
    builder = SnapshotBuilder(_raycluster(groups, 2)).head(used={"CPU": 2.0})
    builder.replica("group-0", 0, idle_s=LONG_IDLE)
    builder.replica("group-1", 0, idle_s=1.0).replica("group-2", 0, idle_s=1.0)
    builder.tasks({"CPU": 1.0})
    gpu, both = {"GPU": 1.0}, {"GPU": 1.0, "CPU": 1.0}
    builder.placement_group("pg", [gpu, both, both], "PACK")
    ours, _ = _both(builder)
    assert terminations(ours) == {_pod(builder, "group-0", 0)} and ours.launch == ()
