"""A known job mix for `record`'s end-to-end test, run as a Ray driver against
`tpu-autoscaler local`: a `slice_placement_group` whose hosts each run a 40 s task,
four `{TPU: 4}` tasks pinned to the pod type that need a second slice, and, once both
slices are gone, an actor alive 20 s. Prints what happened, as the driver saw it, as one JSON line:
per item the wall times it was submitted, placed and ended."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import ray


def _run_for(seconds: float) -> tuple[float, float]:
    started = time.time()
    time.sleep(seconds)
    return started, time.time()


def slice_job(out: dict[str, Any]) -> None:
    from ray.util.tpu import run_on_slice, slice_placement_group

    submitted = time.time()
    handle = slice_placement_group(topology="4x4", accelerator_version="v6e")
    ray.get(handle.slice_placement_group.ready(), timeout=300)
    times = ray.get(run_on_slice(ray.remote(_run_for), 40.0, tpu_slice=handle), timeout=300)
    handle.shutdown()
    out["slice"] = {
        "submitted": submitted,
        "placed": min(t[0] for t in times),
        "ended": max(t[1] for t in times),
    }


def task_burst(out: dict[str, Any]) -> None:
    time.sleep(5)
    run = ray.remote(resources={"TPU": 4}, label_selector={"ray.io/tpu-pod-type": "v6e-16"})(
        _run_for
    )
    submitted = time.time()
    times = ray.get([run.remote(20.0) for _ in range(4)], timeout=300)
    out["tasks"] = [{"submitted": submitted, "placed": s, "ended": e} for s, e in times]


@ray.remote(resources={"TPU": 4})
class Holder:
    def started(self) -> float:
        return time.time()


def actor_job(out: dict[str, Any]) -> None:
    time.sleep(90)
    submitted = time.time()
    actor = Holder.remote()  # type: ignore[attr-defined]
    placed = ray.get(actor.started.remote(), timeout=300)
    time.sleep(20)
    ray.kill(actor)
    out["actor"] = {"submitted": submitted, "placed": placed, "ended": time.time()}


def main() -> int:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    out: dict[str, Any] = {}
    threads = [
        threading.Thread(target=job, args=(out,)) for job in (slice_job, task_burst, actor_job)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(2)  # the GCS receives task events in batches, about every second
    print(json.dumps(out), flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
