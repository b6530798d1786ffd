"""The seed page's Ray Core example on a local cluster: reserve a v6e 4x4 slice with
`slice_placement_group`, run one task per host with `run_on_slice` (CPU work in
place of torch_tpu), then a placement group that selects hosts by
`ray.io/tpu-pod-type`. Every step waits for the autoscaler to bring the slice.

    tpu-autoscaler local --cluster examples/clusters/v6e-4x4-multihost.yaml \\
        --address-file /tmp/ray-address &
    python examples/jobs/seed_slice.py --address "$(cat /tmp/ray-address)"
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.tpu import run_on_slice, slice_placement_group


@ray.remote
def host_worker() -> dict[str, object]:
    """What the seed's `device_worker` returns, with a checksum computed on the CPU."""
    digest = hashlib.sha256()
    for block in range(2_000):
        digest.update(block.to_bytes(4, "little"))
    return {
        "host_id": os.environ.get("TPU_WORKER_ID"),
        "slice": os.environ.get("TPU_NAME"),
        "tpu_ids": ray.get_runtime_context().get_accelerator_ids()["TPU"],
        "checksum": digest.hexdigest()[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    started = time.monotonic()

    def stamp(message: str) -> None:
        print(f"[job {time.monotonic() - started:6.1f}s] {message}", flush=True)

    stamp('slice_placement_group(topology="4x4", accelerator_version="v6e")')
    slice_handle = slice_placement_group(topology="4x4", accelerator_version="v6e")
    results = ray.get(run_on_slice(host_worker, tpu_slice=slice_handle), timeout=args.timeout_s)
    for result in sorted(results, key=lambda r: str(r["host_id"])):
        stamp(f"run_on_slice: {result}")
    slice_handle.shutdown()

    stamp('placement_group([{"TPU": 4}] * 4, bundle_label_selector ray.io/tpu-pod-type=v6e-16)')
    group = placement_group(
        [{"TPU": 4}] * 4,
        strategy="SPREAD",
        bundle_label_selector=[{"ray.io/tpu-pod-type": "v6e-16"}] * 4,
    )
    ray.get(group.ready(), timeout=args.timeout_s)
    stamp("placement group ready")
    remove_placement_group(group)
    stamp("done; the slice is idle from now")


if __name__ == "__main__":
    main()
