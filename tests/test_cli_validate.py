"""`tpu-autoscaler validate` as a user runs it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.cli import main
from tpu_autoscaler.core import catalog

EXAMPLES = Path(__file__).parent.parent / "examples" / "clusters"
GROUP_FIELDS = {
    "name", "accelerator", "generation", "topology", "pod_type", "hosts_per_replica",
    "chips_per_host", "tpu_per_host", "head_resource", "labels", "min_replicas",
    "max_replicas", "idle_timeout_s",
}  # fmt: skip


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("manifest", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_validates(manifest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["validate", str(manifest)], capsys)
    assert code == 0, err
    assert "GROUP" in out and err == ""


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["validate", "--output", "json", str(EXAMPLES / "cpu-and-tpu.yaml")], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["cluster"] == "mixed"
    cpu, tpu = report["groups"]
    assert set(cpu) >= GROUP_FIELDS and set(tpu) >= GROUP_FIELDS
    assert (
        cpu["pod_type"] is None and cpu["head_resource"] is None and cpu["chips_per_host"] is None
    )
    assert tpu["pod_type"] == "v5p-16"
    assert tpu["hosts_per_replica"] == 2
    assert tpu["labels"]["ray.io/tpu-topology"] == "2x2x2"


def _bad_manifest(tmp_path: Path) -> Path:
    group = tpu_group("bad-group", catalog.slice_type(catalog.find_generation("v6e"), "4x4"))  # type: ignore[arg-type]
    group["numOfHosts"] = 3
    group["minReplicas"] = 9
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raycluster(group)))
    return path


def test_every_error_is_printed_and_exit_is_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["validate", str(_bad_manifest(tmp_path))], capsys)
    assert code == 2
    assert out == ""
    assert "numOfHosts" in err and "minReplicas" in err
    assert err.count("worker group 'bad-group'") == 2


def test_json_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["validate", "--output", "json", str(_bad_manifest(tmp_path))], capsys)
    assert code == 2
    report = json.loads(out)
    assert {e["group"] for e in report["errors"]} == {"bad-group"}
    assert report["groups"] == []


def test_stdin_and_multi_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}},
        yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text()),
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all(docs)))
    code, out, _ = run(["validate", "-"], capsys)
    assert code == 0 and "v6e-16" in out


def test_json_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())))
    assert run(["validate", str(path)], capsys)[0] == 0


TWO_CLUSTERS = "kind: RayCluster\nmetadata: {name: a}\nspec: {}\n---\n" * 2
BAD_GROUPS = "kind: RayCluster\nmetadata: {name: a}\nspec: {workerGroupSpecs: 3}\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "kind: Deployment\nmetadata: {name: x}\n",
            "no RayCluster, RayJob or RayService (found: Deployment)",
        ),
        ("a: [\n", "not valid YAML"),
        (TWO_CLUSTERS, "2 clusters"),
        (BAD_GROUPS, "workerGroupSpecs"),
    ],
)
def test_bad_input_exits_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(content)
    code, _, err = run(["validate", str(path)], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["validate", "/no/such/file.yaml"], capsys)
    assert code == 2 and "cannot be read" in err


def test_console_script_and_module_entrypoints(tmp_path: Path) -> None:
    manifest = str(EXAMPLES / "v6e-4x4-multihost.yaml")
    module = subprocess.run(
        [sys.executable, "-m", "tpu_autoscaler", "validate", manifest], capture_output=True
    )
    assert module.returncode == 0, module.stderr
    script = Path(sys.executable).parent / "tpu-autoscaler"
    bad = subprocess.run(
        [str(script), "validate", str(_bad_manifest(tmp_path))], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    usage = subprocess.run([str(script), "validate"], capture_output=True, text=True)
    assert usage.returncode == 2
