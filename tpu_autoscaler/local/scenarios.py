"""Ray drivers for a local cluster: the workloads the end-to-end tests and the local
benchmark run, each a separate process as a user's job is. A driver prints one JSON
object per line: `{"mark": ..., "t": wall seconds, ...}` as it goes, and a last
`{"result": ...}`; a step that times out is a result too (`"ok": false`), since under
Ray's stock autoscaler that is the behaviour being recorded.

    python -m tpu_autoscaler.local.scenarios slice-placement-group --address HOST:PORT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

POD_TYPE = "v6e-16"
TOPOLOGY = "4x4"
GENERATION = "v6e"


def _mark(mark: str, **details: Any) -> None:
    print(json.dumps({"mark": mark, "t": time.time(), **details}), flush=True)


def _result(ok: bool, **details: Any) -> dict[str, Any]:
    return {"ok": ok, **details}


def _host_identity() -> dict[str, Any]:
    import ray

    return {
        "worker_id": os.environ.get("TPU_WORKER_ID"),
        "slice": os.environ.get("TPU_NAME"),
        "node_id": ray.get_runtime_context().get_node_id(),
        "tpu_ids": ray.get_runtime_context().get_accelerator_ids().get("TPU", []),
    }


def slice_placement_group(timeout_s: float, hold_s: float, num_slices: int = 1) -> dict[str, Any]:
    """The seed's example: reserve whole slices, run one task per host on each."""
    import ray
    from ray.util.tpu import run_on_slice
    from ray.util.tpu import slice_placement_group as reserve

    identity = ray.remote(_host_identity)
    _mark("submitted", num_slices=num_slices)
    try:
        handle = reserve(
            topology=TOPOLOGY,
            accelerator_version=GENERATION,
            num_slices=num_slices,
            head_reservation_timeout_s=timeout_s,
        )
        ray.get(handle.slice_placement_group.ready(), timeout=timeout_s)
    except Exception as exc:  # Ray raises several kinds on a reservation that times out
        return _result(False, error=f"{type(exc).__name__}: {exc}")
    _mark("ready")
    results: list[dict[str, Any]] = ray.get(
        run_on_slice(identity, tpu_slice=handle), timeout=timeout_s
    )
    _mark("ran", hosts=len(results))
    time.sleep(hold_s)
    handle.shutdown()
    return _result(True, hosts=results)


def two_slices(timeout_s: float, hold_s: float) -> dict[str, Any]:
    return slice_placement_group(timeout_s, hold_s, num_slices=2)


def pinned_actor(timeout_s: float, hold_s: float) -> dict[str, Any]:
    """An actor on TPU worker 1 of a v6e-16 slice, alive `hold_s` seconds, then gone."""
    import ray
    from ray.exceptions import GetTimeoutError

    @ray.remote(
        resources={"TPU": 4},
        label_selector={"ray.io/tpu-worker-id": "1", "ray.io/tpu-pod-type": POD_TYPE},
    )
    class Pinned:
        def where(self) -> dict[str, Any]:
            return _host_identity()

    _mark("submitted")
    actor = Pinned.remote()  # type: ignore[attr-defined]
    try:
        where = ray.get(actor.where.remote(), timeout=timeout_s)
    except GetTimeoutError as exc:
        return _result(False, error=f"{type(exc).__name__}: {exc}")
    _mark("actor-running", where=where)
    return _hold(actor, where, timeout_s, hold_s)


def busy_slice(timeout_s: float, hold_s: float) -> dict[str, Any]:
    """Four `{TPU: 4}` actors with no label selector fill one slice; three exit and
    one stays `hold_s` seconds, so three hosts go idle beside a busy one."""
    import ray
    from ray.exceptions import GetTimeoutError

    @ray.remote(resources={"TPU": 4})
    class Host:
        def where(self) -> dict[str, Any]:
            return _host_identity()

    _mark("submitted")
    actors = [Host.remote() for _ in range(4)]  # type: ignore[attr-defined]
    try:
        places = ray.get([a.where.remote() for a in actors], timeout=timeout_s)
    except GetTimeoutError as exc:
        for actor in actors:
            ray.kill(actor)
        return _result(False, error=_short(exc))
    keep = max(range(4), key=lambda i: places[i]["worker_id"] == "1")
    for index, actor in enumerate(actors):
        if index != keep:
            ray.kill(actor)
    _mark("actor-running", where=places[keep])
    return _hold(actors[keep], places[keep], timeout_s, hold_s)


def _hold(actor: Any, where: dict[str, Any], timeout_s: float, hold_s: float) -> dict[str, Any]:
    """Call the actor through the hold, so that an actor lost with its host (a slice
    deleted under it) is a result, not an `ok` for an actor that was never checked."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    until = time.time() + hold_s
    while True:
        try:
            ray.get(actor.where.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError) as exc:
            _mark("actor-lost", error=f"{type(exc).__name__}")
            ray.kill(actor)
            return _result(False, where=where, survived=False, error=_short(exc))
        left = until - time.time()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    ray.kill(actor)
    _mark("actor-exited")
    return _result(True, where=where, survived=True)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "..."


def label_selector_placement_group(timeout_s: float, hold_s: float) -> dict[str, Any]:
    """The seed's placement group: one bundle per host, hosts chosen by pod type."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group, remove_placement_group

    _mark("submitted")
    group = placement_group(
        [{"TPU": 4}] * 4,
        strategy="SPREAD",
        bundle_label_selector=[{"ray.io/tpu-pod-type": POD_TYPE}] * 4,
    )
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except GetTimeoutError as exc:
        remove_placement_group(group)
        return _result(False, error=f"{type(exc).__name__}: {exc}")
    _mark("ready")
    time.sleep(hold_s)
    remove_placement_group(group)
    return _result(True)


def unservable(timeout_s: float, hold_s: float) -> dict[str, Any]:
    """A task no worker group can serve (a v6e-256 host); what `ray status` says."""
    import ray

    def nothing() -> None:
        return None

    never = ray.remote(nothing).options(
        resources={"TPU": 4}, label_selector={"ray.io/tpu-pod-type": "v6e-256"}
    )

    _mark("submitted")
    ref = never.remote()
    time.sleep(hold_s)
    ready, _ = ray.wait([ref], timeout=0)
    address = ray.get_runtime_context().gcs_address
    status = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "status", "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    ray.cancel(ref, force=True)
    return _result(not ready, scheduled=bool(ready), ray_status=status.stdout)


SCENARIOS: dict[str, Callable[[float, float], dict[str, Any]]] = {
    "slice-placement-group": slice_placement_group,
    "two-slices": two_slices,
    "pinned-actor": pinned_actor,
    "busy-slice": busy_slice,
    "label-selector-placement-group": label_selector_placement_group,
    "unservable": unservable,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_autoscaler.local.scenarios")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--address", required=True)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--hold-s", type=float, default=0.0, help="keep the work this long")
    args = parser.parse_args(argv)
    import ray

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        result = SCENARIOS[args.scenario](args.timeout_s, args.hold_s)
    finally:
        ray.shutdown()
    print(json.dumps({"result": result, "t": time.time()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
