"""Running a sweep's runs and keeping their results: each finished run is appended to
a JSON-lines results file at once, so a sweep stopped part way (a dead worker, a
lost driver, ^C) resumes where it stopped and runs only what is missing.

Runs go to Ray as one task each (`max_retries`: a worker that dies has its run
retried elsewhere), or through this process for a sweep without Ray."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_autoscaler.whatif.simulation import RunSpec, simulate_run

Finished = tuple[RunSpec, dict[str, Any], float]
"""A run, its summary, and the wall seconds it took."""
Executor = Callable[[list[RunSpec]], Iterator[Finished]]

TASK_RETRIES = 3
"""Ray retries of a run whose worker died; beyond them the run is left for a rerun."""


@dataclass(frozen=True)
class SweepOutcome:
    rows: list[dict[str, Any]]
    """Every result of this sweep's runs, old and new, in the order of `specs`."""
    ran: int
    skipped: int
    failed: list[str]
    """Runs Ray gave up on after its retries, each as `setting seed: why`."""
    wall_s: float


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """Rows by run key; a torn last line (the writer was killed mid-write) is skipped."""
    if not path.exists():
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows[row["key"]] = row
    return rows


def result_row(spec: RunSpec, summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    return {
        "key": spec.key,
        "inputs": spec.inputs_digest,
        "setting": [list(kv) for kv in spec.setting],
        "policy": spec.policy,
        "seed": spec.seed,
        "world": spec.world,
        "summary": summary,
        "wall_s": round(wall_s, 3),
    }


def run_sweep(
    specs: list[RunSpec], results: Path, executor: Executor, progress: bool = True
) -> SweepOutcome:
    started = time.perf_counter()
    done = read_results(results)
    pending = [s for s in specs if s.key not in done]
    failed: list[str] = []
    if pending:
        results.parent.mkdir(parents=True, exist_ok=True)
        with results.open("a") as out:
            if out.tell() > 0 and not results.read_text().endswith("\n"):
                out.write("\n")  # the torn line stays alone on its line
            for n, (spec, summary, wall_s) in enumerate(executor(pending), 1):
                if "error" in summary:
                    failed.append(f"{spec.setting} seed {spec.seed}: {summary['error']}")
                    continue
                row = result_row(spec, summary, wall_s)
                out.write(json.dumps(row, sort_keys=True) + "\n")
                out.flush()
                os.fsync(out.fileno())
                done[spec.key] = row
                if progress:
                    label = " ".join(f"{k}={v}" for k, v in spec.setting) or "as given"
                    print(
                        f"[{n}/{len(pending)}] {label} {spec.policy} seed {spec.seed}: "
                        f"{wall_s:.1f}s",
                        file=sys.stderr,
                    )
    rows = [done[s.key] for s in specs if s.key in done]
    return SweepOutcome(
        rows,
        len(pending) - len(failed),
        len(specs) - len(pending),
        failed,
        time.perf_counter() - started,
    )


def in_process(specs: list[RunSpec]) -> Iterator[Finished]:
    for spec in specs:
        started = time.perf_counter()
        summary = simulate_run(spec)
        yield spec, summary, time.perf_counter() - started


def _timed_run(spec: RunSpec) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    summary = simulate_run(spec)
    return summary, time.perf_counter() - started


def on_ray(address: str | None, workers: int | None, in_flight_per_cpu: int = 2) -> Executor:
    """Runs as Ray tasks: on a local Ray of `workers` CPUs (all cores if None), or on
    the cluster at `address`. At most `in_flight_per_cpu` tasks per CPU are queued at
    once, so a sweep of any size holds little in the object store."""

    def execute(specs: list[RunSpec]) -> Iterator[Finished]:
        import ray

        saved = {k: os.environ.get(k) for k in _AUTH_ENV}
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            _token_for_this_ray()
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        try:
            yield from _execute(ray, specs, in_flight_per_cpu)
        finally:
            ray.shutdown()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    return execute


_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def _token_for_this_ray() -> None:
    """A local `ray.init()` turns on token authentication and, with no token given,
    writes one to ~/.ray/auth_token, which every later Ray on the machine then reads
    (and `tpu-autoscaler local`'s raylets then fail to authenticate). Unless the user
    chose a mode, the sweep's Ray gets a token of its own in the environment its
    workers inherit, and nothing is written."""
    if os.environ.get("RAY_AUTH_MODE") is None and os.environ.get("RAY_AUTH_TOKEN") is None:
        from ray._raylet import Config  # type: ignore[attr-defined]

        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        Config.initialize("")  # this process reads the mode again, as Ray's own setup does


def _execute(ray: Any, specs: list[RunSpec], in_flight_per_cpu: int) -> Iterator[Finished]:
    remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_timed_run)
    limit = max(1, int(ray.cluster_resources().get("CPU", 1)) * in_flight_per_cpu)
    queue: Iterable[RunSpec] = iter(specs)
    running: dict[Any, RunSpec] = {}
    for spec in queue:
        running[remote.remote(spec)] = spec
        if len(running) >= limit:
            break
    while running:
        ready, _ = ray.wait(list(running), num_returns=1)
        spec = running.pop(ready[0])
        try:
            summary, wall_s = ray.get(ready[0])
        except ray.exceptions.RayTaskError as exc:
            # The run itself failed (bad input): the same everywhere, so stop.
            cause = exc.cause
            raise (cause if isinstance(cause, Exception) else exc) from None
        except ray.exceptions.RayError as exc:
            yield spec, {"error": f"{type(exc).__name__} after {TASK_RETRIES} retries"}, 0.0
        else:
            yield spec, summary, wall_s
        for spec in queue:
            running[remote.remote(spec)] = spec
            break
