"""`tpu-autoscaler plan` on snapshots of each upstream failure, under both policies:
Ray 2.60's stock autoscaling reproduces the failure, ours does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.testing.scenarios import SCENARIOS, SnapshotBuilder, write_all

EXAMPLES = Path(__file__).parent.parent / "examples" / "snapshots"


def run_plan(path: Path, policy: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(["plan", "--output", "json", "--policy", policy, str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    assert result["policy"] == policy
    return result


@pytest.fixture(scope="module")
def scenario_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {p.stem: p for p in write_all(tmp_path_factory.mktemp("snapshots"))}


def test_committed_examples_are_current(scenario_files: dict[str, Path]) -> None:
    for name, path in scenario_files.items():
        assert (EXAMPLES / f"{name}.yaml").read_text() == path.read_text(), (
            f"examples/snapshots/{name}.yaml is stale: python -m tpu_autoscaler.testing.scenarios"
        )


def test_failure_1_busy_slice(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["busy-slice-with-idle-hosts"]
    assert run_plan(path, "slice", capsys)["terminate"] == []
    (ray_removal,) = run_plan(path, "ray", capsys)["terminate"]
    assert len(ray_removal["pods"]) == 4 and "busy hosts included" in ray_removal["reason"]


def test_a_stage_two_waits_for_its_busy_slice_where_ray_calls_it_infeasible(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["stage-two-on-busy-slice"]
    ours = run_plan(path, "slice", capsys)
    assert ours["launch"] == [] and ours["infeasible"] == []
    (waiting,) = ours["waiting"]
    assert [g["verdict"] for g in waiting["groups"]] == ["busy"]
    ray = run_plan(path, "ray", capsys)
    assert ray["launch"] == [] and len(ray["infeasible"]) == 1 and ray["waiting"] == []


def test_failure_2_sub_slice_launch(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["sub-slice-launch"]
    (launch,) = run_plan(path, "slice", capsys)["launch"]
    assert launch["replicas"] == 1
    assert run_plan(path, "ray", capsys)["launch"] == []


def test_failure_3_slice_placement_group(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["slice-placement-group-on-empty-cluster"]
    ours = run_plan(path, "slice", capsys)
    assert [x["replicas"] for x in ours["launch"]] == [1] and ours["infeasible"] == []
    ray = run_plan(path, "ray", capsys)
    assert ray["launch"] == [] and len(ray["infeasible"]) == 1


def test_failure_4_head_resource_per_slice(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["two-slice-heads"]
    assert [x["replicas"] for x in run_plan(path, "slice", capsys)["launch"]] == [2]
    assert run_plan(path, "ray", capsys)["launch"] == []


def test_whole_idle_slice_goes_under_both(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["idle-slice"]
    for policy in ("slice", "ray"):
        (removal,) = run_plan(path, policy, capsys)["terminate"]
        assert len(removal["pods"]) == 4


def launches(result: dict[str, Any]) -> dict[str, int]:
    return {x["group"]: x["replicas"] for x in result["launch"]}


@pytest.mark.parametrize(
    ("name", "expected", "reason"),
    [
        ("mixed-group-choice", {"cpu-small": 1}, "GPU nodes kept for GPU work"),
        ("mixed-gpu-choice", {"gpu-1": 4}, "first in Ray's node type rotation"),
        ("mixed-fits-on-head", {"gpu-1": 1}, "1 x {GPU: 1}"),
        ("mixed-large-and-small", {"cpu-small": 1, "cpu-large": 1}, "highest mean utilization"),
    ],
)
def test_mixed_clusters_choose_as_ray_with_reasons(
    scenario_files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    name: str,
    expected: dict[str, int],
    reason: str,
) -> None:
    """Non-TPU demand on a CPU/GPU/TPU cluster: the groups Ray 2.60 picks, each launch
    naming the comparator that decided."""
    ours = run_plan(scenario_files[name], "slice", capsys)
    assert launches(ours) == expected
    assert any(reason in x["reason"] for x in ours["launch"])
    assert launches(run_plan(scenario_files[name], "ray", capsys)) == expected


def test_mixed_tpu_demand_takes_a_slice_and_the_cpu_task_rides_on_it(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["mixed-tpu-and-cpu"]
    ours = run_plan(path, "slice", capsys)
    assert launches(ours) == {"tpu-v6e-16": 1} and ours["infeasible"] == []
    ray = run_plan(path, "ray", capsys)
    assert launches(ray) == {"cpu-small": 1} and len(ray["infeasible"]) == 4


def test_text_output(scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(scenario_files["sub-slice-launch"])]) == 0
    assert capsys.readouterr().out.startswith("launch 1 x tpu-v6e-group")


def test_every_scenario_has_a_committed_example() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == set(SCENARIOS)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.pop("raycluster"), "raycluster"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["ray_state"].update(node_states=[{"bogus_field": 1}]), "ray_state"),
        (lambda d: d["pods"]["items"][0]["metadata"].update(labels=[1]), "pods[0].metadata.labels"),
        (
            lambda d: d["raycluster"]["spec"]["workerGroupSpecs"][0].update(numOfHosts="x"),
            "numOfHosts",
        ),
        (lambda d: d.update(now="yesterday"), "now"),
    ],
)
def test_malformed_snapshots_exit_2_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any, needle: str
) -> None:
    data = SnapshotBuilder(
        yaml.safe_load(
            (Path(__file__).parent.parent / "examples/clusters/v6e-4x4-multihost.yaml").read_text()
        )
    )
    built = data.replica("tpu-v6e-group", 0).build()
    mutate(built)
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump(built))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_replica_still_being_created_is_neither_removed_nor_relaunched(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_plan(scenario_files["replica-being-created"], "slice", capsys)
    assert result["terminate"] == [] and result["launch"] == []
    assert result["bundles_placed"] == 4  # on the hosts KubeRay is still creating


def test_a_replica_that_lost_a_host_long_after_creation_goes_whole(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (removal,) = run_plan(scenario_files["replica-lost-a-host"], "slice", capsys)["terminate"]
    assert len(removal["pods"]) == 3 and "3 of 4 hosts" in removal["reason"]


def test_creation_timeout_is_a_positive_flag(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(scenario_files["replica-being-created"])
    assert main(["plan", "--creation-timeout-s", "0", path]) == 2
    assert "--creation-timeout-s must be positive" in capsys.readouterr().err
    # Past the creation timeout the same replica is a broken one.
    assert main(["plan", "--output", "json", "--creation-timeout-s", "0.5", path]) == 0
    (removal,) = json.loads(capsys.readouterr().out)["terminate"]
    assert "2 of 4 hosts" in removal["reason"]


def test_an_ippr_group_grows_a_pod_in_place_under_both_policies(
    scenario_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_files["mixed-ippr-grow"]
    for policy in ("slice", "ray"):
        result = run_plan(path, policy, capsys)
        (resize,) = result["resize"]
        assert resize["group"] == "cpu-small" and resize["to"] == {"CPU": 8.0, "memory": 32e9}
        assert resize["reason"]
        assert [(x["group"], x["replicas"]) for x in result["launch"]] == [("cpu-small", 1)]
        assert not result["infeasible"]
