"""A RayCluster on this machine: a real Ray head, the simulator's control plane (the
object store behind a Kubernetes-shaped HTTP API, the KubeRay operator with the TPU
webhook's pod mutations, GKE provisioning) running in real time, and one real
`ray start` per pod that reaches Running, with the pod's environment. The autoscaler
(ours, by `run`'s code path, or Ray's stock one) is a separate process that sees only
the HTTP API and the GCS, as it would in the head pod.

This module answers how the parts are put together and how the whole starts, runs
and stops; the pods' raylets are `hosts.py`'s, the autoscaler's process
`autoscaler.py`'s, what is seen of it all `observer.py`'s."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.ports import LOOPBACK, free_ports
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.local.autoscaler import AutoscalerContainer, Policy, autoscaler_command
from tpu_autoscaler.local.hosts import STOP_GRACE_S, PodHosts, template_environments
from tpu_autoscaler.local.kubernetes import (
    KubernetesKind,
    LocalKubernetes,
    RealKubernetes,
    SimulatedKubernetes,
)
from tpu_autoscaler.local.observer import Observer
from tpu_autoscaler.local.processes import (
    MARKER,
    RayProcess,
    head_command,
    head_environment,
    stop_all,
)
from tpu_autoscaler.local.timeline import Observation, ScalingEvent
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

__all__ = ["ClusterStartFailed", "LocalCluster", "Policy"]

TICK_S = 0.1
OBSERVER_JOIN_S = 12.0
"""How long a stop waits for the timeline's thread: its two GCS reads time out at 5 s."""
DEFAULT_HEAD_IMAGE = "rayproject/ray:2.60.0"
"""The head pod's image when the manifest names none (a real API server requires one;
nothing here pulls it)."""


class ClusterStartFailed(Exception):
    """The Ray head did not come up; everything started so far has been stopped."""


class LocalCluster:
    """The parts of a local cluster wired together, started, ticked and stopped."""

    def __init__(
        self,
        raycluster: Mapping[str, Any],
        state_dir: Path,
        policy: Policy = "slice",
        provision_delay_s: float = 5.0,
        on_event: Callable[[ScalingEvent], None] = print,
        kubernetes: KubernetesKind = "simulated",
    ) -> None:
        self.state_dir = state_dir
        self.policy = policy
        self.lock = threading.RLock()
        self.started_s = time.time()
        # Wall-clock seconds, so pods carry real creation times and the autoscaler's
        # launch ages (read from them) are right.
        self.events = EventQueue(start_s=self.started_s)
        # The realistic world of the simulator: deleted pods linger for their grace
        # period, and KubeRay's pod POSTs are events of their own, so the autoscaler's
        # HTTP reads (which take the lock between events) see replicas half made.
        self.kubernetes: LocalKubernetes = (
            RealKubernetes(self.events, _namespace_of(raycluster))
            if kubernetes == "real"
            else SimulatedKubernetes(self.events, self.lock)
        )
        self.store = self.kubernetes.store
        try:
            created = self.store.create_raycluster(raycluster)
        except BaseException:
            self.kubernetes.stop()
            raise
        self.namespace: str = created["metadata"]["namespace"]
        self.name: str = created["metadata"]["name"]
        self.parsed = parse_raycluster(created, "local cluster")
        self.shapes: dict[str, SliceShape] = {s.group: s for s in derive_shapes(self.parsed).shapes}
        self.hosts = PodHosts(
            self.store,
            self.events,
            self.namespace,
            self.shapes,
            template_environments(self.parsed),
            state_dir,
            provision_delay_s,
        )
        self.operator = KubeRayOperator(
            self.store,
            self.events,
            self.namespace,
            self.name,
            multi_host_indexing=True,
            on_replica_created=self.hosts.replica_created,
            on_pods_deleted=self.hosts.pods_deleted,
        )
        self.store.watchers.append(self.operator.on_store_change)
        self.store.watchers.append(self.hosts.on_store_change)
        self.kube_url = ""
        self.observer = Observer(
            self.store,
            self.lock,
            self.operator,
            self.namespace,
            self.name,
            self.started_s,
            on_event,
        )
        self.head: RayProcess | None = None
        self.gcs_address = ""
        self.autoscaler: AutoscalerContainer | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, head_ready_timeout_s: float = 60.0) -> str:
        """Start the head, the API and the autoscaler; the Ray address."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        port, metrics_port = free_ports(2)
        self.gcs_address = f"{LOOPBACK}:{port}"
        self.hosts.gcs_address = self.gcs_address
        head_pod = self._create_head_pod()
        self.head = RayProcess.start(
            "head",
            head_command(port, self.state_dir / "head", self._head_cpus(), {metrics_port}),
            {**head_environment(head_pod, metrics_port), MARKER: str(self.state_dir)},
            self.state_dir / "logs" / "head.log",
        )
        self._wait_for_head(head_ready_timeout_s)
        access = self.kubernetes.serve(self.state_dir)
        self.kube_url = access.url
        self.autoscaler = AutoscalerContainer(
            autoscaler_command(self.policy, self.namespace, self.name, self.gcs_address, access),
            self.state_dir,
            self.started_s,
            self.observer.emit,
            access.environment(),
        )
        self.autoscaler.start()
        with self.lock:
            self.operator.reconcile()
        return self.gcs_address

    def run(self, stop: threading.Event) -> str | None:
        """Until `stop` is set, or the head dies (then why: nothing works without it).

        The timeline is observed on a thread of its own: its reads of the GCS wait up
        to 5 s each while the GCS stalls, and Kubernetes (the operator, the kubelet's
        removals at the end of a grace period) must not wait with them, as on a real
        cluster it never does."""
        ended = threading.Event()
        failed: list[BaseException] = []
        observing = threading.Thread(
            target=self._observe_until, args=(stop, ended, failed), name="timeline", daemon=True
        )
        observing.start()
        try:
            while not stop.is_set():
                if self.head is not None and self.head.exited():
                    return f"the Ray head exited (code {self.head.process.returncode})"
                if failed:
                    # As when both ran on one thread: `local` stops, saying why.
                    return f"observing the cluster failed: {failed[0]!r}"
                self.tick_world()
                stop.wait(TICK_S)
            return None
        finally:
            ended.set()
            observing.join(timeout=OBSERVER_JOIN_S)

    def _observe_until(
        self, stop: threading.Event, ended: threading.Event, failed: list[BaseException]
    ) -> None:
        try:
            while not (stop.is_set() or ended.is_set()):
                self.observer.tick(time.time())
                ended.wait(TICK_S)
        except BaseException as exc:  # handed to `run`, which stops with it
            failed.append(exc)

    def tick(self) -> None:
        """One step of the world and of the timeline, on this thread (`run` steps them
        on two)."""
        self.tick_world()
        self.observer.tick(time.time())

    def tick_world(self) -> None:
        """Kubernetes and the hosts up to now: the operator, GKE, the kubelet, the Ray
        processes, the autoscaler's container."""
        now = time.time()
        with self.lock:
            self.events.run_until(now)
            self.hosts.reap()
            self.hosts.finish_stopping(now)
            failures = self.kubernetes.take_kubelet_failures()
        for failure in failures:
            # Never silent: the pod stays terminating on the server until a retry lands.
            self.observer.emit(ScalingEvent(now - self.started_s, "kubernetes", "kubelet", failure))
        if self.autoscaler is not None:
            self.autoscaler.watch(now)

    def observe(self) -> Observation:
        return self.observer.observe()

    def shutdown(self, keep_state: bool = False) -> list[str]:
        """Stop every process this cluster started; the names of any that survived."""
        processes: list[RayProcess] = []
        scaler = self.autoscaler.as_ray_process() if self.autoscaler is not None else None
        if scaler is not None:
            processes.append(scaler)
        processes += self.hosts.processes()
        if self.head is not None:
            processes.append(self.head)
        survivors = stop_all(processes, STOP_GRACE_S)
        self.hosts.forget()
        self.kubernetes.stop()
        if not keep_state and not survivors:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return survivors

    # --- the head -------------------------------------------------------------------------

    def _create_head_pod(self) -> str:
        """KubeRay's head pod: Ray's own autoscaler lists it with the workers."""
        name = f"{self.name}-head"
        containers = self.parsed.spec.head_group_spec.template.spec.containers
        image = (containers[0].image if containers else None) or DEFAULT_HEAD_IMAGE
        self.kubernetes.create_running_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": {
                        labels.KUBERAY_CLUSTER: self.name,
                        labels.KUBERAY_GROUP: "headgroup",
                        labels.KUBERAY_NODE_TYPE: "head",
                    },
                    "creationTimestamp": rfc3339(self.started_s),
                },
                "spec": {"containers": [{"name": "ray-head", "image": image, "env": []}]},
                "status": {
                    "phase": "Running",
                    "podIP": LOOPBACK,
                    "containerStatuses": [{"name": "ray-head", "state": {"running": {}}}],
                },
            }
        )
        return name

    def _head_cpus(self) -> int:
        head = self.parsed.spec.head_group_spec
        if "num-cpus" in head.ray_start_params:
            return int(float(head.ray_start_params["num-cpus"]))
        from kubernetes.utils import parse_quantity

        for container in head.template.spec.containers[:1]:
            for amounts in (container.resources.limits, container.resources.requests):
                if "cpu" in amounts:
                    return max(1, int(parse_quantity(str(amounts["cpu"]))))
        return 1

    def _wait_for_head(self, timeout_s: float) -> None:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        assert self.head is not None
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.head.exited():
                raise ClusterStartFailed(f"the Ray head exited; see {self.head.log_path}")
            try:
                client = GcsClient(address=self.gcs_address)
                client.get_cluster_status(timeout_s=2)
            except Exception:
                time.sleep(0.25)
                continue
            self.observer.gcs = client
            return
        raise ClusterStartFailed(
            f"the Ray head did not answer in {timeout_s:.0f} s; see {self.head.log_path}"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "ray_address": self.gcs_address,
            "kubernetes_api": self.kube_url,
            "kubernetes": self.kubernetes.kind,
            "policy": self.policy,
            "logs": str(self.state_dir / "logs"),
            "pid": os.getpid(),
        }


def _namespace_of(raycluster: Mapping[str, Any]) -> str:
    namespace: str = (raycluster.get("metadata") or {}).get("namespace") or "default"
    return namespace
