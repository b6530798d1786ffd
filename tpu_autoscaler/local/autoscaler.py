"""The autoscaler container of a local cluster: the command line of the autoscaler a
policy names (ours by `tpu-autoscaler run`, or Ray's stock one through
`tpu_autoscaler.local.stock`), its process, and its restarts when it exits, as the
kubelet restarts a container."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tpu_autoscaler.controlplane.ports import free_port
from tpu_autoscaler.local.kubernetes import AutoscalerAccess
from tpu_autoscaler.local.processes import MARKER, RayProcess, machine_environment
from tpu_autoscaler.local.timeline import ScalingEvent

Policy = Literal["slice", "ray"]

RESTART_BACKOFF_S = 5.0


def autoscaler_command(
    policy: Policy, namespace: str, name: str, gcs_address: str, access: AutoscalerAccess
) -> list[str]:
    """How the head pod's autoscaler container would start the autoscaler."""
    common = [
        "--cluster-name",
        name,
        "--cluster-namespace",
        namespace,
        "--gcs-address",
        gcs_address,
    ]
    if policy == "ray":
        return [
            sys.executable,
            "-m",
            "tpu_autoscaler.local.stock",
            *common,
            *access.stock_arguments(),
        ]
    return [
        sys.executable,
        "-m",
        "tpu_autoscaler",
        "run",
        *common,
        *access.run_arguments(),
        "--metrics-port",
        "0",
        "--log-format",
        "text",
    ]


@dataclass(eq=False)
class AutoscalerContainer:
    """One autoscaler process at a time, its output appended to one log; an exit is
    told as a scaling event and a new process started `RESTART_BACKOFF_S` later."""

    command: list[str]
    state_dir: Path
    started_s: float
    emit: Callable[[ScalingEvent], None]
    kube_environment: Mapping[str, str] = field(default_factory=dict)
    """How the process finds the API server (`KUBECONFIG`), where it needs more than
    its command line."""
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None

    @property
    def log_path(self) -> Path:
        return self.state_dir / "logs" / "autoscaler.log"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = dict(machine_environment())
        # Ray's autoscaler serves metrics on 44217 by default; a second Ray would clash.
        environment["AUTOSCALER_METRIC_PORT"] = str(free_port())
        environment.pop("RAY_HEAD_POD_NAME", None)
        environment[MARKER] = str(self.state_dir)
        environment.update(self.kube_environment)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.command,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.restart_at = None

    def watch(self, now: float) -> None:
        """The container restarts when it exits, as the kubelet would."""
        if self.process is None:
            return
        code = self.process.poll()
        if code is None:
            return
        if self.restart_at is None:
            self.restart_at = now + RESTART_BACKOFF_S
            self.emit(
                ScalingEvent(
                    now - self.started_s,
                    "autoscaler",
                    f"exited with code {code}",
                    f"restarting in {RESTART_BACKOFF_S:g} s; log {self.log_path}",
                )
            )
        elif now >= self.restart_at:
            self.start()

    def as_ray_process(self) -> RayProcess | None:
        """The current process, to be stopped with the cluster's others."""
        if self.process is None:
            return None
        return RayProcess("autoscaler", self.process, self.log_path)
