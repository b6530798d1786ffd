"""`tpu-autoscaler local --kubernetes real`: the whole local mode (a real Ray head, one
real raylet per running pod, the simulated KubeRay/webhook/GKE acting as controllers)
on a real kube-apiserver 1.20.2 and etcd started by the command, the autoscaler (ours,
or Ray's stock one) holding only the documented Role's service-account token. Read as
a user reads it (the printed timeline, the drivers' results) and, with the
autoscaler's own kubeconfig, on the server itself."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.test_local_e2e import IDLE_TIMEOUT_S, PERIOD_S, short_idle_manifest
from tpu_autoscaler.controlplane.real_kube import Binaries
from tpu_autoscaler.core import labels
from tpu_autoscaler.local.harness import LocalRun, processes_of

pytestmark = [pytest.mark.kube_real, pytest.mark.ray_e2e]

GRACE_S = 30.0
"""A deleted bound pod keeps its deletionTimestamp this long (the pod's default)."""


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return short_idle_manifest(tmp_path_factory.mktemp("local-real"))


@pytest.fixture
def real_local(
    manifest: Path, kube_binaries: Binaries, request: pytest.FixtureRequest
) -> Iterator[LocalRun]:
    policy = getattr(request, "param", "slice")
    with LocalRun(manifest, policy=policy, extra_args=["--kubernetes", "real"]) as local:
        yield local


def as_autoscaler(local: LocalRun) -> client.ApiClient:
    """The official client with the kubeconfig `local` gave the autoscaler."""
    assert local.state_dir is not None
    return config.new_client_from_config(str(local.state_dir / "kube" / "kubeconfig"))


def api_url(local: LocalRun) -> str:
    (line,) = [line for line in local.lines if "Kubernetes API (real) " in line]
    return line.split("Kubernetes API (real) ", 1)[1].split(";", 1)[0]


def worker_pods(api: client.ApiClient) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        "default", label_selector=f"{labels.KUBERAY_NODE_TYPE}=worker"
    )
    return list(pods.items)


def test_slice_from_empty_then_idle_slice_removed_whole_on_the_real_server(
    real_local: LocalRun,
) -> None:
    local = real_local
    run = local.driver("slice-placement-group", timeout_s=120)
    assert run.result.get("ok"), (run.result, run.stderr[-2000:], local.lines[-20:])
    hosts = run.result["hosts"]
    assert sorted(h["worker_id"] for h in hosts) == ["0", "1", "2", "3"]
    assert len({h["slice"] for h in hosts}) == 1
    launches = local.of_kind("launch")
    assert [e.hosts for e in launches] == [4], local.lines

    with as_autoscaler(local) as api:
        # The server holds what the timeline says: one replica of four bound, Running
        # pods, created by the simulated KubeRay from the autoscaler's patch.
        pods = worker_pods(api)
        assert len(pods) == 4, [p.metadata.name for p in pods]
        assert all(p.status.phase == "Running" and p.spec.node_name for p in pods)
        assert len({p.metadata.labels.get(labels.KUBERAY_REPLICA_NAME) for p in pods}) == 1
        objects = client.CustomObjectsApi(api)
        raycluster = objects.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "tpu-v6e-16"
        )
        (group,) = raycluster["spec"]["workerGroupSpecs"]
        assert group["replicas"] == 1

        # The autoscaler's credential is the documented Role's, nothing more.
        with pytest.raises(client.ApiException) as refused:
            objects.delete_namespaced_custom_object(
                "ray.io", "v1", "default", "rayclusters", "tpu-v6e-16"
            )
        assert refused.value.status == 403

        # Idle: all four hosts go together, their pods deleted on the server.
        bound_s = IDLE_TIMEOUT_S + 2 * PERIOD_S + 5
        assert local.wait_for(lambda seen: any(e.kind == "removal" for e in seen), bound_s)
        (removal,) = local.of_kind("removal")
        assert removal.hosts == 4 and removal.subject == launches[0].subject
        deadline = time.time() + GRACE_S + 15
        while worker_pods(api) and time.time() < deadline:
            time.sleep(1.0)
        assert worker_pods(api) == []
        raycluster = objects.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "tpu-v6e-16"
        )
        assert raycluster["spec"]["workerGroupSpecs"][0]["replicas"] == 0

    url = api_url(local)
    state_dir = local.state_dir
    assert state_dir is not None
    assert local.stop(signal.SIGTERM) == 0, local.lines[-20:]
    assert processes_of(state_dir) == []
    # The API server and etcd went with it.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{url}/readyz", timeout=2)


@pytest.mark.parametrize("real_local", ["ray"], indirect=True)
def test_stock_autoscaler_scales_with_the_documented_role_over_https(
    real_local: LocalRun,
) -> None:
    """Ray's stock KubeRay autoscaler, its requests sent with the service account's
    token and CA as in a pod, launches the slice four `{TPU: 4}` actors fill."""
    local = real_local
    run = local.driver("busy-slice", timeout_s=120, hold_s=1)
    launches = local.of_kind("launch")
    assert launches and launches[0].hosts == 4, (run.result, local.lines[-20:])
    assert local.state_dir is not None
    log = (local.state_dir / "logs" / "autoscaler.log").read_text(errors="replace")
    # requests' HTTPError says "403 Client Error: Forbidden for url: ..." (401: Unauthorized).
    assert "Forbidden" not in log and "Unauthorized" not in log, log[-3000:]
