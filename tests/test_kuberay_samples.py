"""KubeRay v1.7.0's own samples, read from a git mirror of KubeRay (nothing copied here):
the three issue 17 was filed on validate, and none of the 87 objects differs from Ray's
reading or is refused by us while Ray reads it. Skipped, with the path, where there is
no mirror (`$KUBERAY_MIRROR`, default /work/.mirror/ray-project+kuberay/repo)."""

from __future__ import annotations

import collections
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tpu_autoscaler.cli import main

ROOT = Path(__file__).parent.parent
MIRROR = Path(os.environ.get("KUBERAY_MIRROR", "/work/.mirror/ray-project+kuberay/repo"))
TAG = "v1.7.0"

pytestmark = pytest.mark.skipif(
    not (MIRROR / "HEAD").exists(), reason=f"no KubeRay mirror at {MIRROR} ($KUBERAY_MIRROR)"
)


def _conformance() -> ModuleType:
    path = ROOT / "benchmarks" / "conformance_kuberay_samples.py"
    spec = importlib.util.spec_from_file_location("conformance_kuberay_samples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("sample", "first_line"),
    [
        ("ray-cluster-label-selector.yaml", "RayCluster default/ray-label-cluster"),
        (
            "ray-job.tpu-v6e-16-multihost.yaml",
            "RayJob default/v6e-16-job: the RayCluster in spec.rayClusterSpec",
        ),
        (
            "ray-service.tpu-single-host.yaml",
            "RayService default/stable-diffusion-tpu: the RayCluster in spec.rayClusterConfig",
        ),
    ],
)
def test_the_samples_issue_17_was_filed_on_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sample: str, first_line: str
) -> None:
    conformance = _conformance()
    path = tmp_path / sample
    path.write_text(conformance.git(MIRROR, "show", f"{TAG}:{conformance.SAMPLES}/{sample}"))
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0] == first_line
    if "label-selector" in sample:
        assert "ray.io/market-type=spot" in out


def test_every_sample_reads_as_ray_reads_it() -> None:
    conformance = _conformance()
    verdicts = [
        conformance.verdict_of(path, obj) for path, obj in conformance.sample_objects(MIRROR, TAG)
    ]
    counts = collections.Counter(v.outcome for v in verdicts)
    assert not any(counts[bad] for bad in conformance.BAD), counts
    assert counts["same"] >= 70 and sum(counts.values()) >= 80, counts
    # The only objects Ray refuses and we read are those without worker groups.
    for verdict in verdicts:
        if verdict.outcome == "Ray refuses, we read":
            assert verdict.divergences == ("no-worker-groups",), verdict.why
