"""`tpu-autoscaler snapshot` against a Kubernetes API served on loopback, and the
round trip through `plan`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.sim.scenarios import SnapshotBuilder

CLUSTERS = Path(__file__).parent.parent / "examples" / "clusters"


class _Api(BaseHTTPRequestHandler):
    raycluster: ClassVar[dict[str, Any]] = {}
    pods: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        name = self.raycluster["metadata"]["name"]
        if url.path == f"/apis/ray.io/v1/namespaces/default/rayclusters/{name}":
            self._send(200, self.raycluster)
        elif url.path == "/api/v1/namespaces/default/pods":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            key, _, value = selector.partition("=")
            items = [p for p in self.pods if p["metadata"]["labels"].get(key) == value]
            self._send(200, {"apiVersion": "v1", "kind": "PodList", "items": items})
        else:
            self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[tuple[str, dict[str, Any]]]:
    builder = SnapshotBuilder(yaml.safe_load((CLUSTERS / "v6e-4x4-multihost.yaml").read_text()))
    data = builder.replica("tpu-v6e-group", 0, idle_s=120).tasks({"TPU": 4.0}, 6).build()
    _Api.raycluster = data["raycluster"]
    _Api.pods = data["pods"]["items"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", data
    finally:
        server.shutdown()
        server.server_close()


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
