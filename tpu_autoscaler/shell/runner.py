"""`tpu-autoscaler run`: the process KubeRay starts beside the Ray head, in place of
`ray kuberay-autoscaler`. It waits for the GCS, then runs one round every interval
until SIGTERM or SIGINT; a round in progress finishes first, so a stop never cuts a
drain from its patch. Everything else is rebuilt from the cluster at start."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

from tpu_autoscaler.adapters.ray.gcs import GcsApi, GcsUnavailable
from tpu_autoscaler.shell.controller import Autoscaler, Round

log = logging.getLogger("tpu_autoscaler")

DEFAULT_UPDATE_INTERVAL_S = 5.0
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(
            {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k != "ts"}
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextLogFormatter(logging.Formatter):
    """One line per record for a person: time, level, message, then the record's extra
    fields as key=value (which replica, which hosts), which a bare message leaves out."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        extra = [
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _RECORD_FIELDS and k != "asctime" and not k.startswith("_")
        ]
        line = " ".join([self.formatMessage(record), *extra])
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """Writes each record to `sys.stderr` as it is then, not as it was when the handler
    was made: in a process that swaps stderr and closes the old one (pytest's capture
    per test, a wrapper redirecting it) a handler bound at start would lose every later
    line to "Logging error ... I/O operation on closed file"."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # under the handler's lock (`Handler.handle`)
        super().emit(record)


def configure_logging(log_format: str) -> None:
    handler = CurrentStderrHandler()
    if log_format == "json":
        formatter: logging.Formatter = JsonLogFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = TextLogFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger("tpu_autoscaler")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def wait_for_gcs(gcs: GcsApi, stop: threading.Event, interval_s: float) -> bool:
    """Until the GCS answers (the head may still be starting); False if stopped first."""
    while not stop.is_set():
        try:
            gcs.get_cluster_resource_state()
            return True
        except GcsUnavailable as exc:
            log.info("waiting for the GCS", extra={"detail": str(exc)})
        stop.wait(interval_s)
    return False


def run_rounds(
    autoscaler: Autoscaler,
    stop: threading.Event,
    interval_s: float,
    timer: Callable[[], float] = time.monotonic,
) -> int:
    """Rounds every `interval_s` from the start of the last, until `stop`; returns
    how many ran. A round that fails is logged by the round and retried next time."""
    rounds = 0
    while not stop.is_set():
        started = timer()
        outcome: Round = autoscaler.step()
        rounds += 1
        if outcome.plan is not None and (outcome.plan.launch or outcome.plan.terminate):
            log.info(
                "round applied",
                extra={
                    "launched": sum(x.replicas for x in outcome.plan.launch),
                    "removed": len(outcome.plan.terminate),
                    "replans": outcome.replans,
                },
            )
        stop.wait(max(0.0, interval_s - (timer() - started)))
    return rounds


def namespace_from_pod(default: str = "default") -> str:
    """The namespace this pod runs in (its service account's), else `default`."""
    try:
        with open(NAMESPACE_FILE, encoding="utf-8") as handle:
            return handle.read().strip() or default
    except OSError:
        return default
