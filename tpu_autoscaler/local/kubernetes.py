"""Where a local cluster's Kubernetes lives, and how its autoscaler reaches it.

- `simulated` (the default): the simulator's object store, served over plain HTTP from
  this process; the autoscaler is pointed at its URL.
- `real` (`--kubernetes real`): etcd and kube-apiserver 1.20.2 started on this machine
  (`make kube-binaries` builds them), KubeRay's CRDs installed; the simulated
  controllers (KubeRay, the TPU webhook, GKE's provisioning, the kubelet's phases) act
  on it through the official client (`controlplane/real_store.py`), and the autoscaler
  holds only what it holds in production: a token of a ServiceAccount bound to the
  documented Role (`docs/rbac.yaml`), in a kubeconfig (ours) or as the in-cluster token
  and CA files (Ray's stock autoscaler)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes import client

from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.real_kube import HOW_TO_GET, RealKube, StartFailed, find_binaries
from tpu_autoscaler.controlplane.real_rbac import SERVICE_ACCOUNT, documented_rbac, grant
from tpu_autoscaler.controlplane.real_store import ServerBackedStore
from tpu_autoscaler.controlplane.store import ObjectStore

KubernetesKind = Literal["simulated", "real"]


class KubernetesUnavailable(Exception):
    """The real API server cannot be had here: why, and what to do about it."""


@dataclass(frozen=True)
class AutoscalerAccess:
    """How the autoscaler process reaches the API server."""

    url: str
    kubeconfig: Path | None = None
    """Ours loads it (`KUBECONFIG`), as `run` does outside a pod; None: `--kube-host`."""
    token_file: Path | None = None
    """The service account's token, for Ray's client (it reads the in-cluster files)."""
    ca_file: Path | None = None

    def run_arguments(self) -> list[str]:
        return [] if self.kubeconfig is not None else ["--kube-host", self.url]

    def stock_arguments(self) -> list[str]:
        arguments = ["--kube-url", self.url]
        if self.token_file is not None:
            arguments += ["--kube-token-file", str(self.token_file)]
        if self.ca_file is not None:
            arguments += ["--kube-ca-file", str(self.ca_file)]
        return arguments

    def environment(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)} if self.kubeconfig is not None else {}


class SimulatedKubernetes:
    """The object store, and the HTTP API over it once `serve` is called."""

    kind: KubernetesKind = "simulated"

    def __init__(self, events: EventQueue, lock: threading.RLock) -> None:
        self.store = ObjectStore(events)
        self.api = ApiServer(self.store, lock)

    def create_running_pod(self, pod: dict[str, Any]) -> None:
        self.store.create_pod(pod)

    def take_kubelet_failures(self) -> list[str]:
        """None: the store's kubelet removes a pod in memory, which cannot fail."""
        return []

    def serve(self, state_dir: Path) -> AutoscalerAccess:
        self.api.start()
        return AutoscalerAccess(self.api.url)

    def stop(self) -> None:
        self.api.stop()


class RealKubernetes:
    """A real API server started for this cluster, its namespace, and the cache of it
    the simulated controllers keep; stopped (by pid) with the cluster."""

    kind: KubernetesKind = "real"

    def __init__(self, events: EventQueue, namespace: str) -> None:
        binaries = find_binaries()
        if binaries is None:
            raise KubernetesUnavailable(f"--kubernetes real: {HOW_TO_GET}")
        try:
            self.kube = RealKube(binaries).start()
        except StartFailed as exc:
            raise KubernetesUnavailable(f"--kubernetes real: {exc}") from exc
        self.namespace = namespace
        self.admin: client.ApiClient | None = None
        try:
            self.admin = self.kube.api_client()
            _ensure_namespace(self.admin, namespace)
            self.store = ServerBackedStore(events, self.admin, namespace)
        except BaseException:
            self.stop()
            raise

    def create_running_pod(self, pod: dict[str, Any]) -> None:
        """Created Pending, as the server creates every pod; then bound and Running with
        the status `pod` asks for (the head pod: no scheduler or kubelet runs here)."""
        name = pod["metadata"]["name"]
        self.store.create_pod(pod)
        self.store.set_pod_status(self.namespace, name, pod.get("status") or {"phase": "Running"})

    def take_kubelet_failures(self) -> list[str]:
        """Removals of terminating pods the server refused or never answered since the
        last call, in order (each tried again); the store forgets them."""
        taken = list(self.store.kubelet_failures)
        self.store.kubelet_failures.clear()
        return taken

    def serve(self, state_dir: Path) -> AutoscalerAccess:
        """The documented Role's token for the autoscaler, as a kubeconfig and as the
        in-cluster files (owner-only, in `state_dir`)."""
        assert self.admin is not None
        role, binding = documented_rbac(self.namespace, SERVICE_ACCOUNT)
        token = grant(self.admin, self.kube, role, binding)
        directory = state_dir / "kube"
        directory.mkdir(parents=True, exist_ok=True)
        token_file = _private_file(directory / "token", token)
        kubeconfig = _private_file(
            directory / "kubeconfig", yaml.safe_dump(self.kube.kubeconfig(token, self.namespace))
        )
        return AutoscalerAccess(self.kube.url, kubeconfig, token_file, self.kube.ca_file)

    def stop(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.kube.stop()


LocalKubernetes = SimulatedKubernetes | RealKubernetes


def _ensure_namespace(admin: client.ApiClient, namespace: str) -> None:
    """The API server makes `default` itself; any other namespace is created."""
    core = client.CoreV1Api(admin)
    try:
        core.read_namespace(namespace)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespace({"metadata": {"name": namespace}})


def _private_file(path: Path, text: str) -> Path:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    return path


__all__ = [
    "AutoscalerAccess",
    "KubernetesKind",
    "KubernetesUnavailable",
    "LocalKubernetes",
    "RealKubernetes",
    "SimulatedKubernetes",
]
