"""Ray's stock KubeRay autoscaler (v2) over plain HTTP against the simulator's API
server: the client speaks Ray's requests, Ray's own config reader and cloud provider
work through it, and (ray_e2e) the stock autoscaler process scales the simulated
RayCluster for a real Ray head's resource request."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import requests
import yaml
from ray.autoscaler._private.kuberay import node_provider
from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay import cloud_provider

from tpu_autoscaler.controlplane import apiserver_faults
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.ports import free_ports
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.local import stock
from tpu_autoscaler.local.processes import RayProcess, stop_all
from tpu_autoscaler.local.stock import PlainHttpKubernetesClient

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
NAMESPACE, NAME, GROUP = "default", "tpu-v6e-16", "tpu-v6e-group"
HEAD_POD = f"{NAME}-head-x7k2p"
"""KubeRay's `<cluster>-head-<5 chars>`; also the head raylet's RAY_CLOUD_INSTANCE_ID."""
HEAD_GROUP = "headgroup"
"""The node type Ray's KubeRay config reader gives the head group."""


def _head_pod() -> dict[str, Any]:
    """The head pod as KubeRay creates it, running (Ray's KubeRay provider reads the
    labels and `containerStatuses[0].state`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": HEAD_POD,
            "namespace": NAMESPACE,
            "labels": {
                labels.KUBERAY_CLUSTER: NAME,
                labels.KUBERAY_GROUP: HEAD_GROUP,
                labels.KUBERAY_NODE_TYPE: "head",
            },
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"containers": [{"name": "ray-head"}]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "ray-head", "state": {"running": {}}}],
        },
    }


def _store() -> ObjectStore:
    store = ObjectStore()
    store.create_raycluster(yaml.safe_load(CLUSTER.read_text()))
    store.create_pod(_head_pod())
    return store


def _group(store: ObjectStore) -> dict[str, Any]:
    group: dict[str, Any] = store.get_raycluster(NAMESPACE, NAME)["spec"]["workerGroupSpecs"][0]
    return group


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(_store()) as served:
        yield served


@pytest.fixture
def client(server: ApiServer) -> PlainHttpKubernetesClient:
    return PlainHttpKubernetesClient(server.url, NAMESPACE, timeout_s=5.0)


@pytest.fixture
def plain_http(server: ApiServer) -> Iterator[None]:
    undo = stock.use_plain_http(server.url)
    try:
        yield
    finally:
        undo()


# --- the client ----------------------------------------------------------------------


def test_get_raycluster(client: PlainHttpKubernetesClient, server: ApiServer) -> None:
    assert client.get(f"rayclusters/{NAME}") == server.store.get_raycluster(NAMESPACE, NAME)
    assert server.requests == [
        ("GET", f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters/{NAME}")
    ]


def test_list_pods_as_ray_asks_carries_a_resource_version(
    client: PlainHttpKubernetesClient,
) -> None:
    # Ray's exact path (cloud_provider._fetch_instances), extra query parameters too;
    # it reads the list's metadata.resourceVersion, so the API server must send one.
    selector = requests.utils.quote(f"ray.io/cluster={NAME}")
    path = f"pods?labelSelector={selector}&resourceVersion=1&resourceVersionMatch=NotOlderThan"
    pods = client.get(path)
    assert [p["metadata"]["name"] for p in pods["items"]] == [HEAD_POD]
    version = pods["metadata"]["resourceVersion"]
    assert int(version) >= int(pods["items"][0]["metadata"]["resourceVersion"])
    assert client.get(f"pods?labelSelector={requests.utils.quote('ray.io/cluster=x')}") == {
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": version},  # never goes back
        "items": [],
    }


def test_ray_replica_and_delete_patches_apply(
    client: PlainHttpKubernetesClient, server: ApiServer
) -> None:
    payload = [
        node_provider.worker_replica_patch("0", 2),
        node_provider.worker_delete_patch("0", ["a-pod"]),
    ]
    patched = client.patch(f"rayclusters/{NAME}", payload)
    assert patched == server.store.get_raycluster(NAMESPACE, NAME)
    assert _group(server.store)["replicas"] == 2
    assert _group(server.store)["scaleStrategy"] == {"workersToDelete": ["a-pod"]}


def test_ray_finalizer_patch_is_guarded_by_its_resource_version_test(
    client: PlainHttpKubernetesClient, server: ApiServer
) -> None:
    version = server.store.get_raycluster(NAMESPACE, NAME)["metadata"]["resourceVersion"]
    stale = node_provider.finalizer_patch("ray.io/x", [], str(int(version) - 1))
    with pytest.raises(requests.HTTPError) as failed:
        client.patch(f"rayclusters/{NAME}", stale)
    assert failed.value.response.status_code == 422  # what Ray retries next cycle
    fresh = node_provider.finalizer_patch("ray.io/x", [], version)
    assert client.patch(f"rayclusters/{NAME}", fresh)["metadata"]["finalizers"] == ["ray.io/x"]


def test_errors_are_http_errors_with_the_status(
    client: PlainHttpKubernetesClient, server: ApiServer
) -> None:
    with pytest.raises(requests.HTTPError) as missing:
        client.get("rayclusters/nope")
    assert missing.value.response.status_code == 404
    server.inject(apiserver_faults.status(503, "GET"))
    with pytest.raises(requests.HTTPError) as unavailable:
        client.get(f"rayclusters/{NAME}")
    assert unavailable.value.response.status_code == 503
    assert client.get(f"rayclusters/{NAME}")["metadata"]["name"] == NAME


def test_what_the_simulated_server_does_not_serve_fails_as_http_errors(
    client: PlainHttpKubernetesClient,
) -> None:
    """Beyond the simulator, each only used when the RayCluster or the environment asks
    for it: idle termination's DELETE of the RayCluster (405: deleting one is not
    modelled, nothing would collect its pods; its merge patch to suspend is served) and
    IPPR's pod patches (a `ray.io/ippr` annotation). Ray gets an HTTPError, as from a
    refusing server, and logs it. Reading the head pod by name (RAY_HEAD_POD_NAME set)
    is served now."""
    merge = node_provider.idle_suspend_patch(True)
    client.patch(f"rayclusters/{NAME}", merge, "application/merge-patch+json")
    assert client.get(f"pods/{HEAD_POD}")["metadata"]["name"] == HEAD_POD
    for call, code in (
        (lambda: client.delete(f"rayclusters/{NAME}"), 405),
        (lambda: client.patch(f"pods/{HEAD_POD}", {}, "application/merge-patch+json"), 405),
    ):
        with pytest.raises(requests.HTTPError) as refused:
            call()
        assert refused.value.response.status_code == code


def test_urls_are_ray_s() -> None:
    client = PlainHttpKubernetesClient("http://h:1/", "ns", kuberay_crd_version="v1alpha1")
    assert (
        client.url("rayclusters/c") == "http://h:1/apis/ray.io/v1alpha1/namespaces/ns/rayclusters/c"
    )
    assert (
        client.url("pods?labelSelector=a") == "http://h:1/api/v1/namespaces/ns/pods?labelSelector=a"
    )
    with pytest.raises(NotImplementedError):
        client.url("services/x")
    with pytest.raises(ValueError):
        PlainHttpKubernetesClient("h:1", "ns")


# --- Ray's own code through it ---------------------------------------------------------


@pytest.mark.usefixtures("plain_http")
def test_use_plain_http_replaces_only_the_names_ray_builds_its_client_by(
    server: ApiServer,
) -> None:
    assert isinstance(
        cloud_provider.KubernetesHttpApiClient(namespace=NAMESPACE), PlainHttpKubernetesClient
    )
    with pytest.raises(RuntimeError):
        stock.use_plain_http(server.url)  # twice is a mistake


def test_undo_restores_ray_s_client(server: ApiServer) -> None:
    original = node_provider.KubernetesHttpApiClient
    stock.use_plain_http(server.url)()
    assert node_provider.KubernetesHttpApiClient is original
    assert cloud_provider.KubernetesHttpApiClient is original


@pytest.mark.usefixtures("plain_http")
def test_ray_s_config_reader_and_provider_scale_the_served_raycluster(server: ApiServer) -> None:
    config = AutoscalingConfigProducer(NAME, NAMESPACE)()
    group = config["available_node_types"][GROUP]
    assert group["resources"]["TPU"] == 4
    assert (group["min_workers"], group["max_workers"]) == (0, 8)  # hosts, not slices
    provider = cloud_provider.KubeRayProvider(NAME, config["provider"], gcs_client=None)
    instances = provider.get_non_terminated()
    assert [(i.cloud_instance_id, i.is_running) for i in instances.values()] == [(HEAD_POD, True)]
    provider.launch({GROUP: 4}, "request-1")  # one 4-host slice, in Ray's units
    assert provider.poll_errors() == []
    assert _group(server.store)["replicas"] == 1


# --- end to end: a real Ray head, the stock autoscaler process ---------------------------

E2E_DEADLINE_S = 60.0
RAY_START_TIMEOUT_S = 60.0


def _stop(process: subprocess.Popen[bytes]) -> list[str]:
    """Stop everything `process` (started in a session of its own) left running, as
    local mode stops a host; what survived."""
    name = f"session {process.pid}: {' '.join(map(str, process.args))[:100]}"
    return stop_all([RayProcess(name, process, Path("/dev/null"))], grace_s=3.0)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


@pytest.mark.ray_e2e
def test_stock_kuberay_autoscaler_scales_the_simulated_raycluster() -> None:
    started = time.monotonic()
    temp_dir = tempfile.mkdtemp(prefix="tpua-", dir="/tmp")  # short: socket paths
    logs = Path(temp_dir)
    # Every fixed default port Ray would take is made free one: another Ray (or a
    # tpu-autoscaler) on this machine may hold 10001, 52365, 44217 or 44227.
    port, client_port, agent_port, metrics_port, dashboard_metrics_port = free_ports(5)
    gcs = f"127.0.0.1:{port}"
    store = _store()
    patches: list[list[dict[str, Any]]] = []
    ray_bin = str(Path(sys.executable).parent / "ray")
    env = {
        **os.environ,
        "RAY_enable_autoscaler_v2": "1",
        # KubeRay sets these on the head container; Ray's v2 autoscaler matches the
        # head raylet to the head pod by them and does not scale until it has.
        "RAY_CLOUD_INSTANCE_ID": HEAD_POD,
        "RAY_NODE_TYPE_NAME": HEAD_GROUP,
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "AUTOSCALER_METRIC_PORT": str(metrics_port),
        "DASHBOARD_METRIC_PORT": str(dashboard_metrics_port),
    }
    env.pop("RAY_ADDRESS", None)
    own: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def spawn(args: list[str], log: str) -> subprocess.Popen[bytes]:
        out = (logs / log).open("wb")
        process = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        own.append((process, out))
        return process

    survivors: list[str] = []
    try:
        with ApiServer(store) as server:
            route = server.routes.route

            def recording(
                method: str, path: str, query: Any, content_type: str, body: bytes
            ) -> Any:
                # The operations as Ray sent them over HTTP: a patch of the RayCluster
                # itself, not of its status.
                if method == "PATCH" and path.endswith(f"/rayclusters/{NAME}"):
                    patches.append(json.loads(body))
                return route(method, path, query, content_type, body)

            server.routes.route = recording  # type: ignore[method-assign]
            head = spawn(
                [
                    ray_bin,
                    "start",
                    "--head",
                    f"--port={port}",
                    "--node-ip-address=127.0.0.1",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    f"--temp-dir={temp_dir}",
                    "--num-cpus=1",
                    "--object-store-memory=100000000",
                    f"--ray-client-server-port={client_port}",
                    f"--dashboard-agent-listen-port={agent_port}",
                    # As KubeRay starts the head when the autoscaler is a sidecar: no
                    # autoscaler of Ray's own on the head.
                    "--no-monitor",
                ],
                "ray-start.log",
            )
            assert head.wait(RAY_START_TIMEOUT_S) == 0, _tail(logs / "ray-start.log")
            head_up_s = time.monotonic() - started
            autoscaler = spawn(
                [
                    sys.executable,
                    "-m",
                    "tpu_autoscaler.local.stock",
                    f"--cluster-name={NAME}",
                    f"--cluster-namespace={NAMESPACE}",
                    f"--gcs-address={gcs}",
                    f"--kube-url={server.url}",
                ],
                "stock-autoscaler.log",
            )
            driver = spawn(
                [
                    sys.executable,
                    "-c",
                    "import ray\n"
                    "from ray.autoscaler.sdk import request_resources\n"
                    f"ray.init(address={gcs!r}, log_to_driver=False)\n"
                    "request_resources(bundles=[{'TPU': 4}] * 4)\n"
                    "ray.shutdown()\n",
                ],
                "driver.log",
            )
            assert driver.wait(30) == 0, _tail(logs / "driver.log")
            deadline = time.monotonic() + E2E_DEADLINE_S
            group = _group(store)
            while group["replicas"] == 0 and time.monotonic() < deadline:
                assert autoscaler.poll() is None, _tail(logs / "stock-autoscaler.log")
                time.sleep(0.2)
                with server.lock:
                    group = _group(store)
            scaled_s = time.monotonic() - started
            # What Ray 2.60's stock v2 KubeRay autoscaler writes for four {"TPU": 4}
            # bundles on this 4-host v6e-16 group: one slice, one JSON-patch operation,
            # `replicas` 0 -> 1, no workersToDelete.
            assert patches[:1] == [
                [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]
            ], _tail(logs / "stock-autoscaler.log")
            assert group["replicas"] == 1
            assert not group.get("scaleStrategy", {}).get("workersToDelete")
            print(
                f"\nhead up {head_up_s:.1f}s, scaled {scaled_s:.1f}s after start; "
                f"patches: {patches}"
            )
    finally:
        for process, out in reversed(own):
            survivors += _stop(process)
            out.close()
        if not survivors:
            shutil.rmtree(temp_dir, ignore_errors=True)
    assert survivors == [], f"left running: {survivors}, logs in {temp_dir}"
    assert time.monotonic() - started < E2E_DEADLINE_S
