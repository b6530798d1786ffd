"""Real Ray processes on this machine: the head, and one `ray start --block` per TPU
host, each started as KubeRay's container would start it (the pod's environment, the
group's resources and labels) so that Ray itself derives the TPU labels and the
`TPU-<pod type>-head` resource from `TPU_NAME`, `TPU_WORKER_ID`, ... .

Every `ray start` runs in a session of its own. The raylet, the GCS and the agents
stay in its process group; Ray's worker processes get groups of their own but stay
in the session, so stopping a host signals every group of its session and none of
its processes outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tpu_autoscaler.controlplane.gke import container_environment
from tpu_autoscaler.controlplane.ports import LOOPBACK, free_ports
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape

OBJECT_STORE_BYTES = 128 * 1024 * 1024
"""Per node: plenty for control messages and results, and small, since /dev/shm is
shared by every host on the machine."""

MARKER = "TPU_AUTOSCALER_LOCAL"
"""In the environment of every process a local cluster starts (Ray's workers inherit
it): its state directory, so that whatever outlives a stop can be found."""

_STARTED_BY_RAY = ("CPU", "GPU", "memory", "object_store_memory")
"""Resources with their own `ray start` flag."""


def session_groups(session: int) -> set[int]:
    """Process groups of live (not zombie) processes in `session`; empty where /proc
    is absent, and there signalling the process group is all that can be done."""
    groups: set[int] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return groups
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it exited meanwhile
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == session:
            groups.add(int(fields[2]))
    return groups


def ray_executable() -> str:
    """`ray` beside this interpreter: the one installed with this package."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else "ray"


def _node_ports(agent: int, metrics: int, runtime_env_agent: int) -> list[str]:
    """Ports several nodes on one machine would otherwise share (the dashboard agent
    listens on 52365 by default); the rest Ray picks itself."""
    return [
        f"--dashboard-agent-listen-port={agent}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env_agent}",
    ]


def head_command(
    port: int, temp_dir: Path, num_cpus: int, besides: Collection[int] = ()
) -> list[str]:
    """`port`: the GCS's; the head's other ports are picked apart from it and from
    `besides` (ports the head's environment names)."""
    dashboard, client, *node = free_ports(5, besides={port, *besides})
    return [
        ray_executable(),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        f"--node-ip-address={LOOPBACK}",
        f"--num-cpus={num_cpus}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        # KubeRay starts the head so when the autoscaler is a sidecar: no autoscaler
        # of Ray's own beside ours (or beside Ray's stock one, which runs as ours does).
        "--no-monitor",
        f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        *_node_ports(*node),
    ]


def head_environment(head_name: str, metrics_port: int) -> dict[str, str]:
    """The head pod's: Ray's autoscaler v2 is on (KubeRay sets this with `version: v2`,
    and `ray status` reads the autoscaler's report only then); the dashboard's metrics
    on `metrics_port`."""
    return {
        "RAY_enable_autoscaler_v2": "1",
        labels.ENV_CLOUD_INSTANCE_ID: head_name,
        labels.ENV_NODE_TYPE_NAME: "headgroup",
        "RAY_USAGE_STATS_ENABLED": "0",
        # The head's metrics port (44227 by default) would clash with a second Ray.
        "DASHBOARD_METRIC_PORT": str(metrics_port),
    }


def host_command(shape: SliceShape, gcs_address: str, temp_dir: Path) -> list[str]:
    """`ray start` as KubeRay writes it for a worker of this group: CPUs, GPUs, memory
    and custom resources from the group (the `TPU` count included, as KubeRay passes
    the `google.com/tpu` limit), the group's own labels. What Ray derives from the
    environment (accelerator type, slice name, head resource, TPU labels) is left to it."""
    resources = shape.resources_per_host
    custom = {
        name: amount
        for name, amount in resources.items()
        if name not in _STARTED_BY_RAY
        and not name.startswith(labels.ACCELERATOR_TYPE_RESOURCE_PREFIX)
    }
    command = [
        ray_executable(),
        "start",
        "--block",
        f"--address={gcs_address}",
        f"--node-ip-address={LOOPBACK}",
        f"--num-cpus={int(resources.get('CPU', 0))}",
        f"--temp-dir={temp_dir}",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        *_node_ports(*free_ports(3)),
    ]
    if resources.get("GPU"):
        command.append(f"--num-gpus={int(resources['GPU'])}")
    if resources.get("memory"):
        command.append(f"--memory={int(resources['memory'])}")
    if custom:
        command.append(f"--resources={json.dumps(custom, sort_keys=True)}")
    # The raylet derives ray.io/node-group and the static TPU labels itself; the group's
    # own labels (ray.io/market-type included, or one overriding a derived value) go
    # in --labels, as KubeRay writes them.
    derived = {
        labels.RAY_NODE_GROUP: shape.group,
        **(shape.tpu.static_labels() if shape.tpu else {}),
    }
    own_labels = {
        key: value for key, value in shape.group_labels.items() if derived.get(key) != value
    }
    if own_labels:
        command.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(own_labels.items())))
    return command


KUBERNETES_HEAD_ADDRESS = ("RAY_ADDRESS", "FQ_RAY_IP", "RAY_IP")
"""KubeRay's variables naming the head's Kubernetes service, which does not exist
here; `--address` names the local GCS (and `RAY_ADDRESS` would override it)."""


def pod_environment(pod: Mapping[str, Any]) -> dict[str, str]:
    """The environment of the pod's Ray container as it runs on its TPU node
    (`sim.gke.container_environment`): the template's and KubeRay's variables with their
    `fieldRef`s resolved (`RAY_CLOUD_INSTANCE_ID` = pod name), the webhook's TPU
    identity, and the device plugin's `TPU_ACCELERATOR_TYPE` and `TPU_TOPOLOGY`."""
    environment = container_environment(pod)
    for name in KUBERNETES_HEAD_ADDRESS:
        environment.pop(name, None)
    return environment


def machine_environment() -> dict[str, str]:
    """This machine's environment without what would make a host see another's TPU
    identity or a different cluster."""
    inherited = dict(os.environ)
    for name in (
        labels.ENV_TPU_NAME,
        labels.ENV_TPU_WORKER_ID,
        labels.ENV_TPU_ACCELERATOR_TYPE,
        labels.ENV_TPU_TOPOLOGY,
        labels.ENV_CLOUD_INSTANCE_ID,
        labels.ENV_NODE_TYPE_NAME,
        "RAY_ADDRESS",
        "TPU_VISIBLE_CHIPS",
    ):
        inherited.pop(name, None)
    return inherited


@dataclass
class RayProcess:
    """One `ray start --block` and everything it started, in its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, name: str, command: list[str], environment: Mapping[str, str], log_path: Path
    ) -> RayProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes] = log_path.open("wb")
        try:
            process = subprocess.Popen(
                command,
                env={**machine_environment(), **environment},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        return cls(name, process, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> bool:
        return self.process.poll() is not None

    def signal_group(self, signum: int) -> None:
        """Signal every process group of this process's session."""
        for group in {self.process.pid, *session_groups(self.process.pid)}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)  # unless the group has gone

    def group_alive(self) -> bool:
        self.process.poll()  # reap it, so that a zombie does not count as alive
        if session_groups(self.process.pid):
            return True
        try:
            os.killpg(self.process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def terminate(self) -> None:
        """As the kubelet stops a container: SIGTERM first; `kill` follows."""
        self.signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def stop_all(processes: list[RayProcess], grace_s: float) -> list[str]:
    """SIGTERM to each, SIGKILL to what is left after `grace_s`; the names of any
    still alive `grace_s` after that (SIGKILL lands, and the kernel reaps, later)."""
    for signal_them in (RayProcess.terminate, RayProcess.kill):
        for process in processes:
            signal_them(process)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.group_alive() for p in processes):
            time.sleep(0.1)
    return [p.name for p in processes if p.group_alive()]
