"""Drive `tpu-autoscaler local` from outside, as a person would: start it, read the
address and the timeline it prints, run drivers against it, stop it with a signal.
The end-to-end tests and the local benchmark use this; both see only what a user
sees (printed lines, driver output, `ray status`), not the local cluster's insides."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

_EVENT = re.compile(r"^\[\s*(?P<t>[\d.]+)s\] (?P<kind>\S+)\s+(?P<subject>.+?)  (?P<detail>.*)$")
_KUBE_API = re.compile(r"; Kubernetes API \(\w+\) (?P<url>\S+);")


@dataclass(frozen=True)
class SeenEvent:
    """A timeline line, with the wall time this side read it."""

    wall_s: float
    kind: str
    subject: str
    detail: str

    @property
    def hosts(self) -> int:
        """Hosts a launch or removal names."""
        found = re.search(r"(\d+) hosts", self.detail)
        return int(found.group(1)) if found else 0


@dataclass(frozen=True)
class DriverRun:
    marks: dict[str, dict[str, Any]]
    result: dict[str, Any]
    returncode: int
    stderr: str

    def at(self, mark: str) -> float:
        return float(self.marks[mark]["t"])


class LocalRun:
    """`tpu-autoscaler local` in a child process."""

    def __init__(
        self,
        manifest: Path,
        policy: str = "slice",
        provision_delay_s: float = 1.0,
        extra_args: Sequence[str] = (),
        echo: Callable[[str], None] | None = None,
    ) -> None:
        """`echo`: called with every line `local` prints, as it prints it."""
        self.manifest = manifest
        self.echo = echo
        self.policy = policy
        self.provision_delay_s = provision_delay_s
        self.extra_args = list(extra_args)
        self._dir = tempfile.TemporaryDirectory(prefix="tpua-run-")
        self.address_file = Path(self._dir.name) / "address"
        self.lines: list[str] = []
        self.events: list[SeenEvent] = []
        self.process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._changed = threading.Condition()
        self.address = ""
        self.state_dir: Path | None = None
        self.kube_url = ""
        """The URL of the cluster's Kubernetes API server, from `local`'s RayCluster line."""
        self.autoscaler_log: list[str] = []
        """The autoscaler's log, as it was when `local` stopped (its state is gone then)."""

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tpu_autoscaler",
            "local",
            "--cluster",
            str(self.manifest),
            "--policy",
            self.policy,
            "--address-file",
            str(self.address_file),
            "--provision-delay-s",
            str(self.provision_delay_s),
            # Kept so that `stop` can take the autoscaler's log for a failing test's
            # message; `stop` removes the state after.
            "--keep-logs",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 90.0) -> str:
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.address_file.exists() and self.address_file.read_text().strip():
                self.address = self.address_file.read_text().strip()
                # `local` prints its RayCluster line before it writes the address file,
                # but the reader thread may not have taken that line off the pipe yet.
                with self._changed:
                    while (
                        self.state_dir is None
                        and self.process.poll() is None
                        and time.time() < deadline
                    ):
                        self._changed.wait(min(1.0, max(0.0, deadline - time.time())))
                if self.state_dir is not None:
                    return self.address
                break
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("local did not come up:\n" + "\n".join(self.lines[-40:]))

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip("\n")
            now = time.time()
            if self.echo is not None:
                self.echo(line)
            with self._changed:
                self.lines.append(line)
                if match := _EVENT.match(line):
                    self.events.append(
                        SeenEvent(now, match["kind"], match["subject"].strip(), match["detail"])
                    )
                if line.startswith("RayCluster ") and " logs " in line:
                    self.state_dir = Path(line.rsplit(" logs ", 1)[1]).parent
                    if api := _KUBE_API.search(line):
                        self.kube_url = api["url"]
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def of_kind(self, kind: str) -> list[SeenEvent]:
        with self._changed:
            return [e for e in self.events if e.kind == kind]

    def wait_for(self, predicate: Callable[[list[SeenEvent]], bool], timeout_s: float) -> bool:
        deadline = time.time() + timeout_s
        with self._changed:
            while not predicate(list(self.events)):
                left = deadline - time.time()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def driver(self, scenario: str, timeout_s: float = 120.0, hold_s: float = 0.0) -> DriverRun:
        """Run a scenario driver to its end."""
        process = self.start_driver(scenario, timeout_s, hold_s)
        try:
            out, err = process.communicate(timeout=timeout_s * 3 + hold_s + 60)
        except subprocess.TimeoutExpired:
            # `communicate` leaves the child running on a timeout: stop it, and keep
            # what it printed (its marks; no result).
            process.kill()
            out, err = process.communicate()
        return parse_driver(out, err, process.returncode)

    def start_driver(
        self, scenario: str, timeout_s: float = 120.0, hold_s: float = 0.0
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpu_autoscaler.local.scenarios",
                scenario,
                "--address",
                self.address,
                "--timeout-s",
                str(timeout_s),
                "--hold-s",
                str(hold_s),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._dir.cleanup()
        if self.state_dir is not None and self.state_dir.exists():
            self.autoscaler_log = self._autoscaler_log_lines()
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return code

    def _autoscaler_log_lines(self) -> list[str]:
        if self.state_dir is None:
            return []
        path = self.state_dir / "logs" / "autoscaler.log"
        try:
            return path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def diagnosis(self, lines: int = 60) -> str:
        """For a failing test's message: the end of the timeline `local` printed and of
        the autoscaler's log (its decisions: drains accepted or refused, launches)."""
        log = self.autoscaler_log or self._autoscaler_log_lines()
        return (
            "timeline (local's output):\n"
            + "\n".join(self.lines[-lines:])
            + "\nautoscaler log:\n"
            + "\n".join(log[-lines:])
        )

    def __enter__(self) -> LocalRun:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def parse_driver(stdout: str, stderr: str, returncode: int) -> DriverRun:
    marks: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {}
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "mark" in record:
            marks[str(record["mark"])] = record
        elif "result" in record:
            result = dict(record["result"])
    return DriverRun(marks, result, returncode, stderr)


def processes_of(state_dir: Path) -> list[str]:
    """Live processes a local cluster with this state directory started (they, and the
    Ray workers they start, carry it in their environment)."""
    from tpu_autoscaler.local.processes import MARKER

    marker = f"{MARKER}={state_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker in environment and state != "Z":
            found.append(f"{entry.name}: {command[:160]}")
    return found
