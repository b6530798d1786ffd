"""`make demo`: a local v6e 4x4 cluster from empty to one whole slice and back.

Starts `tpu-autoscaler local` on examples/clusters/v6e-4x4-multihost.yaml, runs the
seed's job (examples/jobs/seed_slice.py) against it, waits until the autoscaler has
removed the idle slice (idle timeout 60 s), stops `local` with SIGINT and prints the
timeline. Every line `local` and the job print is shown as it comes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tpu_autoscaler.local.harness import LocalRun, SeenEvent

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFEST = ROOT / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
JOB = ROOT / "examples" / "jobs" / "seed_slice.py"
IDLE_TIMEOUT_S = 60.0
PERIOD_S = 5.0


def main() -> int:
    started = time.time()
    print(f"== tpu-autoscaler local --cluster {MANIFEST.relative_to(ROOT)}", flush=True)
    local = LocalRun(MANIFEST, provision_delay_s=5.0, echo=lambda line: print(line, flush=True))
    local.start()
    try:
        print(f"== python {JOB.relative_to(ROOT)} --address {local.address}", flush=True)
        job = subprocess.run([sys.executable, str(JOB), "--address", local.address], check=False)
        if job.returncode != 0:
            print(f"error: the job failed with exit code {job.returncode}", file=sys.stderr)
            return 1
        job_done = time.time()
        print(
            f"== waiting for the idle slice to go (idle timeout {IDLE_TIMEOUT_S:g} s)", flush=True
        )
        removed = local.wait_for(
            lambda events: any(e.kind == "removal" for e in events),
            IDLE_TIMEOUT_S + 4 * PERIOD_S + 30,
        )
    finally:
        code = local.stop(signal.SIGINT)
    print(f"== local stopped (exit code {code})")
    _summary(local.events, started, job_done)
    if not removed or code != 0:
        print("error: the slice was not removed, or local did not stop cleanly", file=sys.stderr)
        return 1
    return 0


def _summary(events: list[SeenEvent], started: float, job_done: float) -> None:
    print("\nTimeline (seconds since `make demo` started the cluster):")
    print(f"  {0.0:6.1f}  empty: no TPU host")
    for event in events:
        if event.kind in ("launch", "ready", "drain", "removal", "infeasible", "failed"):
            print(f"  {event.wall_s - started:6.1f}  {event.kind:<8} {event.subject}")
        if event.kind == "ready":
            print(f"  {job_done - started:6.1f}  job done: the slice is idle")
    removals = [e for e in events if e.kind == "removal"]
    if removals:
        print(f"  {removals[-1].wall_s - started:6.1f}  empty again")
    print(f"Total: {time.time() - started:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
