"""A RayCluster on this machine: a real Ray head, the simulator's control plane (the
object store behind a Kubernetes-shaped HTTP API, the KubeRay operator with the TPU
webhook's pod mutations, GKE provisioning) running in real time, and one real
`ray start` per pod that reaches Running, with the pod's environment. The autoscaler
(ours, by `run`'s code path, or Ray's stock one) is a separate process that sees only
the HTTP API and the GCS, as it would in the head pod."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tpu_autoscaler.adapters.ray.state import from_message, infeasible_texts
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.local.processes import (
    LOOPBACK,
    MARKER,
    RayProcess,
    free_port,
    head_command,
    head_environment,
    host_command,
    machine_environment,
    pod_environment,
    stop_all,
)
from tpu_autoscaler.local.timeline import (
    HostView,
    Observation,
    RayNodeEnd,
    ReplicaView,
    ScalingEvent,
    changes,
)
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

Policy = Literal["slice", "ray"]
log = logging.getLogger("tpu_autoscaler.local")

TICK_S = 0.1
OBSERVE_EVERY_S = 0.5
STOP_GRACE_S = 3.0
"""From SIGTERM to SIGKILL when a pod is deleted (the kubelet gives 30 s; the
raylets here have nothing to save)."""
RESTART_BACKOFF_S = 5.0


class ClusterStartFailed(Exception):
    """The Ray head did not come up; everything started so far has been stopped."""


@dataclass
class _Autoscaler:
    process: subprocess.Popen[bytes]
    log_path: Path
    restart_at: float | None = None


class LocalCluster:
    def __init__(
        self,
        raycluster: Mapping[str, Any],
        state_dir: Path,
        policy: Policy = "slice",
        provision_delay_s: float = 5.0,
        on_event: Callable[[ScalingEvent], None] = print,
    ) -> None:
        self.state_dir = state_dir
        self.policy = policy
        self.provision_delay_s = provision_delay_s
        self.on_event = on_event
        self.lock = threading.RLock()
        self.started_s = time.time()
        # Wall-clock seconds, so pods carry real creation times and the autoscaler's
        # launch ages (read from them) are right.
        self.events = EventQueue(start_s=self.started_s)
        # The realistic world of the simulator: deleted pods linger for their grace
        # period, and KubeRay's pod POSTs are events of their own, so the autoscaler's
        # HTTP reads (which take the lock between events) see replicas half made.
        self.store = ObjectStore(self.events)
        created = self.store.create_raycluster(raycluster)
        self.namespace: str = created["metadata"]["namespace"]
        self.name: str = created["metadata"]["name"]
        self.parsed = parse_raycluster(created, "local cluster")
        self.shapes: dict[str, SliceShape] = {s.group: s for s in derive_shapes(self.parsed).shapes}
        self.template_env = {
            spec.group_name: {
                var.name: var.value
                for container in spec.template.spec.containers[:1]
                for var in container.env
                if var.value is not None
            }
            for spec in self.parsed.spec.worker_group_specs
        }
        self.operator = KubeRayOperator(
            self.store,
            self.events,
            self.namespace,
            self.name,
            multi_host_indexing=True,
            on_replica_created=self._replica_created,
            on_pods_deleted=self._pods_deleted,
        )
        self.store.watchers.append(self.operator.on_store_change)
        self.api = ApiServer(self.store, self.lock)
        self.hosts: dict[str, RayProcess] = {}
        self.stopping: list[tuple[RayProcess, float]] = []
        self.head: RayProcess | None = None
        self.gcs_address = ""
        self.autoscaler: _Autoscaler | None = None
        self._host_serial = 0
        self._observed = Observation(0.0)
        self._next_observation_s = 0.0
        self._gcs: Any = None
        self.history: list[ScalingEvent] = []

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, head_ready_timeout_s: float = 60.0) -> str:
        """Start the head, the API and the autoscaler; the Ray address."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.gcs_address = f"{LOOPBACK}:{port}"
        head_pod = self._create_head_pod()
        self.head = RayProcess.start(
            "head",
            head_command(port, self.state_dir / "head", self._head_cpus()),
            {**head_environment(head_pod), MARKER: str(self.state_dir)},
            self.state_dir / "logs" / "head.log",
        )
        self._wait_for_head(head_ready_timeout_s)
        self.api.start()
        self._start_autoscaler()
        with self.lock:
            self.operator.reconcile()
        return self.gcs_address

    def run(self, stop: threading.Event) -> str | None:
        """Until `stop` is set, or the head dies (then why: nothing works without it)."""
        while not stop.is_set():
            if self.head is not None and self.head.exited():
                return f"the Ray head exited (code {self.head.process.returncode})"
            self.tick()
            stop.wait(TICK_S)
        return None

    def tick(self) -> None:
        now = time.time()
        with self.lock:
            self.events.run_until(now)
            self._reap_hosts()
            self._finish_stopping(now)
        self._watch_autoscaler(now)
        if now >= self._next_observation_s:
            self._next_observation_s = now + OBSERVE_EVERY_S
            self.observe()

    def shutdown(self, keep_state: bool = False) -> list[str]:
        """Stop every process this cluster started; the names of any that survived."""
        processes: list[RayProcess] = []
        if self.autoscaler is not None:
            scaler = RayProcess("autoscaler", self.autoscaler.process, self.autoscaler.log_path)
            processes.append(scaler)
        processes += list(self.hosts.values()) + [p for p, _ in self.stopping]
        if self.head is not None:
            processes.append(self.head)
        survivors = stop_all(processes, STOP_GRACE_S)
        self.hosts.clear()
        self.stopping.clear()
        self.api.stop()
        if not keep_state and not survivors:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return survivors

    # --- the head -------------------------------------------------------------------------

    def _create_head_pod(self) -> str:
        """KubeRay's head pod: Ray's own autoscaler lists it with the workers."""
        name = f"{self.name}-head"
        self.store.create_pod(
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
                "spec": {"containers": [{"name": "ray-head", "env": []}]},
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
            self._gcs = client
            return
        raise ClusterStartFailed(
            f"the Ray head did not answer in {timeout_s:.0f} s; see {self.head.log_path}"
        )

    # --- the autoscaler ------------------------------------------------------------------

    def autoscaler_command(self) -> list[str]:
        common = [
            "--cluster-name",
            self.name,
            "--cluster-namespace",
            self.namespace,
            "--gcs-address",
            self.gcs_address,
        ]
        if self.policy == "ray":
            return [
                sys.executable,
                "-m",
                "tpu_autoscaler.local.stock",
                *common,
                "--kube-url",
                self.api.url,
            ]
        return [
            sys.executable,
            "-m",
            "tpu_autoscaler",
            "run",
            *common,
            "--kube-host",
            self.api.url,
            "--metrics-port",
            "0",
            "--log-format",
            "text",
        ]

    def _start_autoscaler(self) -> None:
        log_path = self.state_dir / "logs" / "autoscaler.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = dict(machine_environment())
        # Ray's autoscaler serves metrics on 44217 by default; a second Ray would clash.
        environment["AUTOSCALER_METRIC_PORT"] = str(free_port())
        environment.pop("RAY_HEAD_POD_NAME", None)
        environment[MARKER] = str(self.state_dir)
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                self.autoscaler_command(),
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.autoscaler = _Autoscaler(process, log_path)

    def _watch_autoscaler(self, now: float) -> None:
        """The autoscaler container restarts when it exits, as the kubelet would."""
        scaler = self.autoscaler
        if scaler is None:
            return
        code = scaler.process.poll()
        if code is None:
            return
        if scaler.restart_at is None:
            scaler.restart_at = now + RESTART_BACKOFF_S
            self._emit(
                ScalingEvent(
                    now - self.started_s,
                    "autoscaler",
                    f"exited with code {code}",
                    f"restarting in {RESTART_BACKOFF_S:g} s; log {scaler.log_path}",
                )
            )
        elif now >= scaler.restart_at:
            self._start_autoscaler()

    # --- pods and hosts --------------------------------------------------------------------

    def _replica_created(self, group: str, replica: str, pods: list[str]) -> None:
        self.events.after(self.provision_delay_s, lambda: self._provision(group, pods))

    def _provision(self, group: str, pods: list[str]) -> None:
        """The slice's VMs are up: every pod runs, and each starts Ray."""
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["metadata"].get("deletionTimestamp") for p in stored):
            return  # deleted while it waited
        for pod in pods:
            self.store.set_pod_phase(self.namespace, pod, "Running")
        for pod in pods:
            self._start_host(group, pod)

    def _start_host(self, group: str, pod_name: str) -> None:
        pod = self.store.pod(self.namespace, pod_name)
        if pod is None:
            return
        self._host_serial += 1
        environment = {
            **self.template_env.get(group, {}),
            **pod_environment(pod),
            MARKER: str(self.state_dir),
        }
        self.hosts[pod_name] = RayProcess.start(
            pod_name,
            host_command(
                self.shapes[group], self.gcs_address, self.state_dir / f"h{self._host_serial}"
            ),
            environment,
            self.state_dir / "logs" / f"{pod_name}.log",
        )

    def _pods_deleted(self, pods: list[str], requested: bool) -> None:
        """Deleting a pod stops its Ray: SIGTERM, then SIGKILL after a grace period."""
        deadline = time.time() + STOP_GRACE_S
        for pod in pods:
            host = self.hosts.pop(pod, None)
            if host is not None:
                host.terminate()
                self.stopping.append((host, deadline))

    def _reap_hosts(self) -> None:
        """A `ray start --block` that exits fails its pod (`restartPolicy: Never`)."""
        for pod_name, host in list(self.hosts.items()):
            if host.exited():
                del self.hosts[pod_name]
                host.kill()
                if self.store.pod(self.namespace, pod_name) is not None:
                    self.store.set_pod_phase(self.namespace, pod_name, "Failed")

    def _finish_stopping(self, now: float) -> None:
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

    # --- what happened -------------------------------------------------------------------

    def observe(self) -> Observation:
        ray_nodes, infeasible, ends = self._read_gcs()
        with self.lock:
            pods = self.store.list_pods(
                self.namespace,
                {labels.KUBERAY_CLUSTER: self.name, labels.KUBERAY_NODE_TYPE: "worker"},
            )
            replicas: dict[str, list[HostView]] = {}
            groups: dict[str, tuple[str, str]] = {}
            for pod in pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    continue  # deleted: removed for the timeline, terminating for its grace
                key = meta["labels"].get(labels.KUBERAY_REPLICA_NAME) or meta["name"]
                if key in self.operator.creating:
                    continue  # KubeRay is still POSTing its pods: launched once all exist
                env = pod_environment(pod)
                slice_name = env.get(labels.ENV_TPU_NAME, key)
                groups[key] = (meta["labels"][labels.KUBERAY_GROUP], slice_name)
                replicas.setdefault(key, []).append(
                    HostView(
                        meta["name"],
                        int(env.get(labels.ENV_TPU_WORKER_ID, "0")),
                        pod["status"]["phase"],
                        ray_nodes.get(meta["name"]),
                    )
                )
        if ray_nodes is _UNKNOWN:
            return self._observed
        observation = Observation(
            time.time() - self.started_s,
            {
                key: ReplicaView(groups[key][0], groups[key][1], tuple(hosts))
                for key, hosts in replicas.items()
            },
            frozenset(infeasible),
            ends,
        )
        for event in changes(self._observed, observation):
            self._emit(event)
        self._observed = observation
        return observation

    def _read_gcs(self) -> tuple[dict[str, str], list[str], dict[str, RayNodeEnd]]:
        from ray.core.generated import autoscaler_pb2

        try:
            raw = self._gcs.get_cluster_status(timeout_s=5)
            infos = self._gcs.get_all_node_info(timeout=5)
        except Exception:
            return _UNKNOWN, [], {}
        reply = autoscaler_pb2.GetClusterStatusReply()
        reply.ParseFromString(raw)
        state = from_message(reply.cluster_resource_state)
        statuses = {pod: node.status for pod, node in state.node_for_pod().items()}
        return statuses, infeasible_texts(reply.autoscaling_state), _ray_node_ends(infos)

    def _emit(self, event: ScalingEvent) -> None:
        self.history.append(event)
        self.on_event(event)

    def describe(self) -> dict[str, Any]:
        return {
            "ray_address": self.gcs_address,
            "kubernetes_api": self.api.url,
            "policy": self.policy,
            "logs": str(self.state_dir / "logs"),
            "pid": os.getpid(),
        }


def _ray_node_ends(infos: Mapping[Any, Any]) -> dict[str, RayNodeEnd]:
    """TPU hosts whose Ray node drains or has died, from `GcsNodeInfo` messages."""
    from ray.core.generated import common_pb2, gcs_pb2

    ends: dict[str, RayNodeEnd] = {}
    for info in infos.values():
        slice_name = info.labels.get(labels.RAY_TPU_SLICE_NAME)
        if not slice_name:
            continue
        if info.state == gcs_pb2.GcsNodeInfo.DEAD:
            how = common_pb2.NodeDeathInfo.Reason.Name(info.death_info.reason)
        elif info.state_snapshot.state == gcs_pb2.NodeSnapshot.DRAINING:
            how = "DRAINING"
        else:
            continue
        worker_id = int(info.labels.get(labels.RAY_TPU_WORKER_ID, "0"))
        ends[info.node_id.hex()] = RayNodeEnd(slice_name, worker_id, how)
    return ends


_UNKNOWN: dict[str, str] = {}
"""The GCS did not answer: nothing observed this time."""
