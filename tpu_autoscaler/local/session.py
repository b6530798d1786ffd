"""`tpu-autoscaler local`: one local cluster per machine, from start to the last
process stopped. The lock is an advisory `flock` on a file in the temp directory,
released by the kernel however this process ends, so a crash never leaves a stale
lock behind; the file names the holder for the message a second `local` prints."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from tpu_autoscaler.local.cluster import LocalCluster, Policy
from tpu_autoscaler.local.kubernetes import KubernetesKind
from tpu_autoscaler.local.timeline import ScalingEvent

LOCK_NAME = "tpu-autoscaler-local.lock"


class AlreadyRunning(Exception):
    """Another `tpu-autoscaler local` holds the lock."""


class MachineLock:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or Path(tempfile.gettempdir()) / LOCK_NAME
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise AlreadyRunning(_holder_text(holder)) from None
        self._file = handle
        self.record({"pid": os.getpid()})

    def record(self, details: Mapping[str, Any]) -> None:
        assert self._file is not None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps(dict(details)))
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _holder_text(recorded: str) -> str:
    try:
        holder = json.loads(recorded)
    except ValueError:
        return "another `tpu-autoscaler local` is running"
    where = f", Ray at {holder['ray_address']}" if holder.get("ray_address") else ""
    return f"another `tpu-autoscaler local` is running (pid {holder.get('pid')}{where})"


def run_local(
    raycluster: Mapping[str, Any],
    policy: Policy,
    provision_delay_s: float,
    address_file: Path | None,
    stop: threading.Event,
    keep_logs: bool = False,
    lock: MachineLock | None = None,
    out: Callable[[str], None] = print,
    kubernetes: KubernetesKind = "simulated",
) -> int:
    """Run until `stop` is set; 0 when every process stopped, 1 if any survived or
    the head died on its own."""
    lock = lock or MachineLock()
    lock.acquire()
    state_dir = Path(tempfile.gettempdir()) / f"tpua-{os.getpid()}"
    try:
        cluster = LocalCluster(
            raycluster,
            state_dir,
            policy,
            provision_delay_s,
            on_event=lambda event: _print_event(out, event),
            kubernetes=kubernetes,
        )
    except BaseException:
        lock.release()
        raise
    survivors: list[str] = []
    failure: str | None = None
    came_up = False
    try:
        address = cluster.start()
        came_up = True
        details = cluster.describe()
        lock.record(details)
        out(f"Ray address: {address}")
        out(
            f"RayCluster {cluster.namespace}/{cluster.name} "
            f"({', '.join(sorted(cluster.shapes))}); autoscaler: "
            + ("tpu-autoscaler run" if policy == "slice" else "Ray 2.60 KubeRay autoscaler v2")
            + f"; Kubernetes API ({details['kubernetes']}) {details['kubernetes_api']}"
            + f"; logs {details['logs']}"
        )
        if address_file is not None:
            address_file.write_text(address + "\n")
        failure = cluster.run(stop)
        if failure:
            print(f"error: {failure}; see {details['logs']}", file=sys.stderr)
        out("stopping: every Ray process this command started")
    finally:
        # The logs stay when the head did not come up: the error points at them.
        survivors = cluster.shutdown(keep_state=keep_logs or not came_up or bool(failure))
        if address_file is not None:
            address_file.unlink(missing_ok=True)
        lock.release()
    if survivors:
        print(f"error: processes outlived the stop: {survivors}", file=sys.stderr)
    return 1 if survivors or failure else 0


def _print_event(out: Callable[[str], None], event: ScalingEvent) -> None:
    out(str(event))
