"""The commands on RayJobs and RayServices: the cluster each embeds is read and named,
a RayJob on an existing cluster is reported (not an error), a snapshot given to
`validate` is pointed at `plan`, and bad input still names the object and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.manifest.objects import cluster_source
from tpu_autoscaler.testing.ray_parity import judge

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
SNAPSHOT = ROOT / "examples" / "snapshots" / "idle-slice.yaml"
WORKLOAD = ROOT / "examples" / "workloads" / "busy-slice.yaml"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def owner(kind: str, cluster: dict[str, Any], name: str = "tpu-work") -> dict[str, Any]:
    field = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}[kind]
    spec: dict[str, Any] = {field: cluster["spec"]}
    if kind == "RayJob":
        spec["entrypoint"] = "python train.py"
    return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def write(tmp_path: Path, obj: dict[str, Any]) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


@pytest.mark.parametrize(
    ("kind", "field"), [("RayJob", "rayClusterSpec"), ("RayService", "rayClusterConfig")]
)
def test_validate_reads_the_embedded_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, field: str
) -> None:
    path = write(tmp_path, owner(kind, yaml.safe_load(CLUSTER.read_text())))
    code, out, err = run(["validate", str(path)], capsys)
    assert code == 0, err
    assert out.splitlines()[0] == f"{kind} default/tpu-work: the RayCluster in spec.{field}"
    assert "v6e-16" in out
    # Resources as Ray counts them: the head resource on host 0 only.
    assert "resources per host CPU=24, TPU=4," in out and "TPU-v6e-16-head=1 on host 0" in out
    code, out, _ = run(["validate", "--output", "json", str(path)], capsys)
    report = json.loads(out)
    assert report["source"]["kind"] == kind
    assert report["source"]["cluster_spec"] == f"spec.{field}"
    assert [g["pod_type"] for g in report["groups"]] == ["v6e-16"]
    assert report["head"]["labels"] == {"ray.io/node-group": "headgroup"}


def test_rayjob_on_an_existing_cluster_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "on-existing"},
        "spec": {"entrypoint": "x", "clusterSelector": {"ray.io/cluster": "shared-tpu"}},
    }
    path = write(tmp_path, job)
    code, out, err = run(["validate", str(path)], capsys)
    assert code == 0 and err == ""
    assert "existing RayCluster 'shared-tpu' (spec.clusterSelector)" in out
    code, _, err = run(["local", "--cluster", str(path)], capsys)
    assert code == 2 and "shared-tpu" in err


def test_bad_embedded_field_names_object_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = yaml.safe_load(CLUSTER.read_text())
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["numOfHosts"] = 3
    group["labels"] = {"Example.com/zone": "a"}
    code, out, err = run(["validate", str(write(tmp_path, owner("RayService", cluster)))], capsys)
    assert code == 2 and out == ""
    assert "spec.rayClusterConfig.workerGroupSpecs[0].numOfHosts" in err
    assert "spec.rayClusterConfig.workerGroupSpecs[0].labels[Example.com/zone]" in err
    assert "KubeRay refuses the RayCluster: invalid label key" in err
    cluster["spec"]["workerGroupSpecs"] = 3
    code, _, err = run(["validate", str(write(tmp_path, owner("RayJob", cluster)))], capsys)
    assert code == 2 and "m.yaml: spec.rayClusterSpec.workerGroupSpecs" in err


def test_rayjob_without_a_cluster_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"}, "spec": {}}
    code, _, err = run(["validate", str(write(tmp_path, job))], capsys)
    assert code == 2
    assert "RayJob j: spec.rayClusterSpec: is missing" in err


def test_snapshot_given_to_validate_points_at_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["validate", str(SNAPSHOT)], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert "is a snapshot" in line and f"tpu-autoscaler plan {SNAPSHOT}" in line


def test_plan_reads_a_rayjob_in_a_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = yaml.safe_load(SNAPSHOT.read_text())
    code, out, err = run(["plan", "--output", "json", str(SNAPSHOT)], capsys)
    assert code == 0, err
    as_cluster = json.loads(out)
    # The pods name their cluster; a RayJob's is named after it here.
    name = snapshot["raycluster"]["metadata"]["name"]
    snapshot["raycluster"] = owner("RayJob", snapshot["raycluster"], name)
    code, out, err = run(["plan", "--output", "json", str(write(tmp_path, snapshot))], capsys)
    assert code == 0, err
    assert json.loads(out) == as_cluster


def test_simulate_and_local_read_the_embedded_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, owner("RayJob", yaml.safe_load(CLUSTER.read_text())))
    args = ["simulate", "--cluster", str(path), "--workload", str(WORKLOAD), "--duration-s", "60"]
    code, out, err = run([*args, "--output", "json"], capsys)
    assert code == 0, err
    assert "reading RayJob default/tpu-work: the RayCluster in spec.rayClusterSpec" in err
    assert json.loads(out)
    cpu_only = yaml.safe_load(CLUSTER.read_text())
    cpu_only["spec"]["workerGroupSpecs"] = []
    code, _, err = run(
        ["local", "--cluster", str(write(tmp_path, owner("RayService", cpu_only)))], capsys
    )
    # Read far enough to know there is nothing to autoscale; no Ray process started.
    assert code == 2 and "reading RayService default/tpu-work" in err
    assert "has no TPU worker group" in err


@pytest.mark.parametrize(
    "manifest",
    sorted((ROOT / "examples" / "jobs-and-services").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_example_jobs_and_services_validate_and_read_as_ray(
    manifest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["validate", str(manifest)], capsys)
    assert code == 0, err
    assert out.startswith(("RayJob default/", "RayService default/"))
    source = cluster_source(yaml.safe_load(manifest.read_text()), str(manifest))
    assert source.raycluster is not None
    assert judge(source.raycluster).outcome == "same"
