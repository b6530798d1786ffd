"""Which real Ray process plays which worker pod of a local cluster: once a replica's
slice is provisioned its pods run and each starts `ray start --block` with the pod's
environment; deleting a pod stops its Ray (SIGTERM, then SIGKILL after a grace
period), whoever deleted it; a Ray that exits fails its pod, as `restartPolicy: Never`
would."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.local.processes import MARKER, RayProcess, host_command, pod_environment
from tpu_autoscaler.manifest.model import RayCluster

STOP_GRACE_S = 3.0
"""From SIGTERM to SIGKILL when a pod is deleted (the kubelet gives 30 s; the
raylets here have nothing to save)."""


def template_environments(raycluster: RayCluster) -> dict[str, dict[str, str]]:
    """Per worker group, the literal environment of its pod template's first container
    (KubeRay's container starts Ray with it)."""
    return {
        spec.group_name: {
            var.name: var.value
            for container in spec.template.spec.containers[:1]
            for var in container.env
            if var.value is not None
        }
        for spec in raycluster.spec.worker_group_specs
    }


@dataclass(eq=False)
class PodHosts:
    """The Ray processes of a cluster's worker pods, and those of deleted pods still
    stopping. The operator's callbacks (`replica_created`, `pods_deleted`), the store's
    pod changes (`on_store_change`) and the cluster's ticks (`reap`, `finish_stopping`)
    drive it, under the cluster's lock."""

    store: ObjectStore
    events: EventQueue
    namespace: str
    shapes: Mapping[str, SliceShape]
    template_env: Mapping[str, Mapping[str, str]]
    state_dir: Path
    provision_delay_s: float
    gcs_address: str = ""
    """The head's, set when the cluster starts (before any pod is provisioned)."""
    running: dict[str, RayProcess] = field(default_factory=dict)
    """By pod name."""
    stopping: list[tuple[RayProcess, float]] = field(default_factory=list)
    """Deleted pods' processes, with when to SIGKILL them."""
    _serial: int = field(default=0, init=False)

    def replica_created(self, group: str, replica: str, pods: list[str]) -> None:
        self.events.after(self.provision_delay_s, lambda: self._provision(group, pods))

    def _provision(self, group: str, pods: list[str]) -> None:
        """The slice's VMs are up: every pod runs, and each starts Ray."""
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["metadata"].get("deletionTimestamp") for p in stored):
            return  # deleted while it waited
        for pod in pods:
            self.store.set_pod_phase(self.namespace, pod, "Running")
        for pod in pods:
            self._start(group, pod)

    def _start(self, group: str, pod_name: str) -> None:
        pod = self.store.pod(self.namespace, pod_name)
        if pod is None:
            return
        self._serial += 1
        environment = {
            **self.template_env.get(group, {}),
            **pod_environment(pod),
            MARKER: str(self.state_dir),
        }
        self.running[pod_name] = RayProcess.start(
            pod_name,
            host_command(self.shapes[group], self.gcs_address, self.state_dir / f"h{self._serial}"),
            environment,
            self.state_dir / "logs" / f"{pod_name}.log",
        )

    def pods_deleted(self, pods: list[str], requested: bool) -> None:
        """Deleting a pod stops its Ray: SIGTERM, then SIGKILL after a grace period."""
        deadline = time.time() + STOP_GRACE_S
        for pod in pods:
            host = self.running.pop(pod, None)
            if host is not None:
                host.terminate()
                self.stopping.append((host, deadline))

    def on_store_change(self, kind: str, obj: dict[str, Any]) -> None:
        """A store watcher, the kubelet's side of a deletion KubeRay did not make (a
        person's `kubectl delete pod`, a test's): a running pod of this cluster that
        turns terminating, or is gone, has its Ray stopped as KubeRay's deletions stop
        theirs (those come through `pods_deleted` first, while the pod is stored)."""
        if kind != "Pod":
            return
        meta = obj["metadata"]
        name = meta["name"]
        # The store stamps a deletionTimestamp on every pod it removes, too.
        deleted = bool(meta.get("deletionTimestamp"))
        if deleted and name in self.running and meta.get("namespace") == self.namespace:
            self.pods_deleted([name], requested=False)

    def reap(self) -> None:
        """A `ray start --block` that exits fails its pod (`restartPolicy: Never`)."""
        for pod_name, host in list(self.running.items()):
            if host.exited():
                del self.running[pod_name]
                host.kill()
                if self.store.pod(self.namespace, pod_name) is not None:
                    self.store.set_pod_phase(self.namespace, pod_name, "Failed")

    def finish_stopping(self, now: float) -> None:
        waiting = []
        for host, deadline in self.stopping:
            if not host.group_alive():
                host.process.poll()
                continue
            if now >= deadline:
                host.kill()
            else:
                waiting.append((host, deadline))
        self.stopping = waiting

    def processes(self) -> list[RayProcess]:
        """Every process still running or stopping, running ones first."""
        return list(self.running.values()) + [p for p, _ in self.stopping]

    def forget(self) -> None:
        """After the cluster stopped them all."""
        self.running.clear()
        self.stopping.clear()
