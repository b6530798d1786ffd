"""`tpu-autoscaler snapshot` against a Kubernetes API served on loopback, and the
round trip through `plan`."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).parent.parent / "examples" / "clusters"


@pytest.fixture
def api_server() -> Iterator[tuple[str, dict[str, Any]]]:
    builder = SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))
    data = builder.replica("tpu-v6e-group", 0, idle_s=120).tasks({"TPU": 4.0}, 6).build()
    store = ObjectStore()
    store.create_raycluster(data["raycluster"])
    for pod in data["pods"]["items"]:
        store.create_pod(pod)
    # Another cluster's pod in the namespace: the label selector must leave it out.
    stranger = copy.deepcopy(data["pods"]["items"][0])
    stranger["metadata"]["name"] = "other-cluster-worker"
    stranger["metadata"]["labels"][labels.KUBERAY_CLUSTER] = "other-cluster"
    store.create_pod(stranger)
    # The store stamps resourceVersions: the original is what it serves (a typed list's
    # items carry no apiVersion or kind).
    data["raycluster"] = store.get_raycluster("default", "tpu-v6e-16")
    listed = store.list_pods("default", {labels.KUBERAY_CLUSTER: "tpu-v6e-16"})
    data["pods"]["items"] = [
        {k: copy.deepcopy(v) for k, v in pod.items() if k not in ("apiVersion", "kind")}
        for pod in listed
    ]
    with ApiServer(store) as server:
        yield server.url, data


def test_snapshot_round_trips_with_plan(
    api_server: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host, original = api_server
    out = tmp_path / "snap.yaml"
    code = main(["snapshot", "--cluster-name", "tpu-v6e-16", "--kube-host", host, "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    written = yaml.safe_load(out.read_text())
    assert written["raycluster"] == original["raycluster"]
    assert written["pods"] == original["pods"]["items"]
    # The live read has no GCS here; give it the GCS view and the time of the original.
    written["ray_state"], written["now"] = original["ray_state"], original["now"]
    out.write_text(yaml.safe_dump(written))
    original_file = tmp_path / "original.yaml"
    original_file.write_text(yaml.safe_dump(original))
    plans = []
    for path in (out, original_file):
        assert main(["plan", "--output", "json", str(path)]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0] == plans[1]
    assert plans[0]["launch"][0]["replicas"] == 1  # 6 hosts' demand: 4 idle ones, one more slice


def test_snapshot_of_a_missing_cluster_fails_cleanly(
    api_server: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    host, _ = api_server
    assert main(["snapshot", "--cluster-name", "nope", "--kube-host", host]) == 1
    err = capsys.readouterr().err
    assert "404" in err and "default/nope" in err and "Traceback" not in err


def test_snapshot_needs_a_cluster_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_CLUSTER_NAME", raising=False)
    assert main(["snapshot"]) == 2
