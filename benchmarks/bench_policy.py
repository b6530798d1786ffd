"""Plan latency of the slice policy beside Ray 2.60's ResourceDemandScheduler on the
same snapshots, in the same run.

Each snapshot of the rows `v6e` is a v6e 4x4 cluster (4 hosts per slice) half of
whose slices are busy, with pending demand of which 40 % is tasks ({TPU: 4} selected by pod type),
50 % placement groups (SPREAD, 4 x {TPU: 4}) and 10 % slice_placement_group heads.
Both sides get the snapshot already parsed: ours times `policy.plan`, Ray's times
`ResourceDemandScheduler.schedule` on the request Ray's reconciler would build. Ray
runs in a forked process and is stopped after --ray-timeout-s. Rows `mixed` are a
head beside CPU, GPU and TPU groups (`make_mixed_snapshot`).

    .venv/bin/python benchmarks/bench_policy.py [--quick] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tpu_autoscaler.adapters.ray.baseline import ray_request
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, build_snapshot
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    (16, 10),
    (16, 1_000),
    (256, 1_000),
    (256, 10_000),
    (2_048, 10_000),
    (2_048, 100_000),
    (16_384, 100_000),
]
QUICK = [(16, 10), (256, 1_000), (2_048, 10_000)]
MIXED = [(256, 1_000), (2_048, 10_000)]
"""Sizes of the mixed-cluster rows (`make_mixed_snapshot`)."""


def make_snapshot(hosts: int, bundles: int) -> LoadedSnapshot:
    raw = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    slices = hosts // 4
    raw["spec"]["workerGroupSpecs"][0]["maxReplicas"] = slices * 2
    builder = SnapshotBuilder(raw)
    for index in range(slices):
        busy = index % 2 == 1
        builder.replica(
            "tpu-v6e-group",
            index,
            used={h: {"TPU": 4.0} for h in range(4)} if busy else None,
            idle_s=0 if busy else 10,
        )
    selector = {"ray.io/tpu-pod-type": "v6e-16"}
    tasks = bundles * 4 // 10
    heads = max(1, bundles // 10)
    gangs = max(0, (bundles - tasks - heads) // 4)
    builder.tasks({"TPU": 4.0}, count=max(1, tasks), selector=selector)
    for i in range(gangs):
        builder.placement_group(f"pg{i}", [{"TPU": 4.0}] * 4, "SPREAD", [selector] * 4)
    for i in range(heads):
        builder.slice_placement_group_head("v6e-16", 1, pg_id=f"spg{i}")
    return build_snapshot(builder.build(), f"bench-{hosts}-{bundles}")


def make_mixed_snapshot(hosts: int, bundles: int) -> LoadedSnapshot:
    """examples/clusters/cpu-gpu-tpu.yaml with half its hosts in v6e-16 slices, a
    quarter 4-CPU nodes, a quarter 1-GPU nodes, every other one busy; demand 40 %
    {TPU: 4} tasks, 30 % {CPU: 1}, 20 % {GPU: 1}, 10 % SPREAD gangs of 4 x {TPU: 4}."""
    raw = yaml.safe_load((ROOT / "examples/clusters/cpu-gpu-tpu.yaml").read_text())
    slices, cpus, gpus = hosts // 8, hosts // 4, hosts // 4
    for group in raw["spec"]["workerGroupSpecs"]:
        group["maxReplicas"] = max(slices, cpus, gpus) * 2
    builder = SnapshotBuilder(raw).head()
    for index in range(slices):
        busy = index % 2 == 1
        used = {h: {"TPU": 4.0} for h in range(4)} if busy else None
        builder.replica("tpu-v6e-16", index, used=used, idle_s=0 if busy else 10)
    for group, count, busy_use in (
        ("cpu-small", cpus, {"CPU": 3.0}),
        ("gpu-1", gpus, {"GPU": 1.0}),
    ):
        for index in range(count):
            busy = index % 2 == 1
            builder.replica(
                group, index, used={0: busy_use} if busy else None, idle_s=0 if busy else 10
            )
    selector = {"ray.io/tpu-pod-type": "v6e-16"}
    builder.tasks({"TPU": 4.0}, count=max(1, bundles * 4 // 10), selector=selector)
    builder.tasks({"CPU": 1.0}, count=max(1, bundles * 3 // 10))
    builder.tasks({"GPU": 1.0}, count=max(1, bundles * 2 // 10))
    for i in range(max(1, bundles // 40)):
        builder.placement_group(f"pg{i}", [{"TPU": 4.0}] * 4, "SPREAD", [selector] * 4)
    return build_snapshot(builder.build(), f"bench-mixed-{hosts}-{bundles}")


def time_ours(loaded: LoadedSnapshot, repeats: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan(loaded.snapshot)
        timings.append(time.perf_counter() - start)
    return timings


_SHARED: dict[str, Any] = {}


def _ray_child(connection: Any, repeats: int) -> None:
    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler

    request = ray_request(_SHARED["loaded"])
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        ResourceDemandScheduler(event_logger=None).schedule(request)
        timings.append(time.perf_counter() - start)
        connection.send(timings[-1])
    connection.close()


def time_ray(loaded: LoadedSnapshot, repeats: int, timeout_s: float) -> list[float] | None:
    """Ray's scheduler timings, or None if its first run did not finish in time."""
    _SHARED["loaded"] = loaded
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_ray_child, args=(child, repeats))
    process.start()
    child.close()
    timings: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(timings) < repeats:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not parent.poll(remaining):
            break
        try:
            timings.append(parent.recv())
        except EOFError:
            break
    process.kill()
    process.join()
    return timings or None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="three small cases only")
    parser.add_argument("--ray-timeout-s", type=float, default=120.0)
    parser.add_argument("--plot", type=Path, help="write latency against size as a PNG")
    args = parser.parse_args()

    rows = []
    columns = [("cluster", 7), ("hosts", 6), ("bundles", 8), ("ours p50", 10), ("ours p99", 10)]
    columns += [("ray p50", 10), ("ray p99", 10), ("ray/ours", 9)]
    header = " ".join(f"{name:>{width}}" for name, width in columns)
    print(header)
    print("-" * len(header))
    cases = [("v6e", h, b) for h, b in (QUICK if args.quick else CASES)]
    cases += [("mixed", h, b) for h, b in MIXED]
    for cluster, hosts, bundles in cases:
        loaded = (make_snapshot if cluster == "v6e" else make_mixed_snapshot)(hosts, bundles)
        repeats = 20 if hosts * bundles <= 2_560_000 else 5
        ours = time_ours(loaded, repeats)
        ray = time_ray(loaded, min(repeats, 5), args.ray_timeout_s)
        ours_p50, ours_p99 = statistics.median(ours), percentile(ours, 0.99)
        if ray:
            ray_p50, ray_p99 = statistics.median(ray), percentile(ray, 0.99)
            ray_text = (
                f"{ray_p50 * 1e3:>8.1f}ms {ray_p99 * 1e3:>8.1f}ms {ray_p50 / ours_p50:>8.1f}x"
            )
        else:
            ray_p50 = None
            ray_text = f"{'> ' + format(args.ray_timeout_s, 'g') + 's':>10} {'-':>10} {'-':>9}"
        print(
            f"{cluster:>7} {hosts:>6} {bundles:>8} "
            f"{ours_p50 * 1e3:>8.1f}ms {ours_p99 * 1e3:>8.1f}ms {ray_text}",
            flush=True,
        )
        rows.append((f"{cluster} {hosts}", bundles, ours_p50, ray_p50))
    print(f"ours: {len(ours)} runs per case at most; Ray: up to 5, timeout {args.ray_timeout_s:g}s")
    if args.plot:
        write_plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def write_plot(rows: list[tuple[str, int, float, float | None]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{h} hosts\n{b} bundles" for h, b, _, _ in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([x - 0.2 for x in xs], [r[2] * 1e3 for r in rows], width=0.4, label="slice policy")
    ax.bar(
        [x + 0.2 for x in xs],
        [(r[3] or 0) * 1e3 for r in rows],
        width=0.4,
        label="Ray 2.60 scheduler",
    )
    for x, r in zip(xs, rows, strict=True):
        if r[3] is None:
            ax.annotate("timed out", (x + 0.2, 1), ha="center", rotation=90, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("plan latency, median (ms)")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.legend()
    ax.set_title("Plan latency on the same snapshots")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
