"""Every example workload under both autoscalers in one run, metrics side by side,
and how fast the simulator runs (simulated seconds per wall second) at 64 and 1,024
slices.

    .venv/bin/python benchmarks/bench_sim.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import Workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent
RUNS = [
    ("v6e-4x4-multihost", "seed-slice-placement-group"),
    ("v6e-4x4-multihost", "seed-two-slices"),
    ("v6e-4x4-multihost", "seed-bundle-label-selector"),
    ("v6e-4x4-multihost", "busy-slice"),
    ("v6e-4x4-multihost", "training-day"),
    ("rl-disaggregated", "rl-rollouts"),
]
COLUMNS = [
    ("slices_launched", "slices"),
    ("partial_slice_seconds", "partial s"),
    ("busy_replicas_terminated", "busy killed"),
    ("unsatisfied_at_end", "unsatisfied"),
    ("busy_chip_hours", "busy chip-h"),
    ("idle_chip_hours", "idle chip-h"),
    ("scale_flaps", "flaps"),
]


def simulate(
    cluster: dict[str, Any], workload: Workload, policy: str, seed: int = 0
) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    sim = SimulatedCluster(cluster, policy=policy, seed=seed)  # type: ignore[arg-type]
    sim.load(workload)
    summary = sim.run(workload.last_end_s + 1800)
    return summary, time.perf_counter() - started


def compare_workloads(runs: list[tuple[str, str]]) -> None:
    header = f"{'workload':30} {'policy':6} " + " ".join(f"{title:>11}" for _, title in COLUMNS)
    header += f" {'wait p95 s':>11} {'decide p50':>11}"
    print(header)
    print("-" * len(header))
    for cluster_name, workload_name in runs:
        cluster = yaml.safe_load((ROOT / f"examples/clusters/{cluster_name}.yaml").read_text())
        workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
        for policy in ("ray", "slice"):
            summary, _ = simulate(cluster, workload, policy)
            cells = " ".join(f"{summary[key]!s:>11}" for key, _ in COLUMNS)
            wait = summary["demand_wait_s"]["p95"]
            decide = f"{summary['decision_ms']['p50']}ms"
            print(f"{workload_name:30} {policy:6} {cells} {wait!s:>11} {decide:>11}", flush=True)


def speed(slices: int) -> None:
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = slices
    items = [
        {
            "at": 60 * (i % 10),
            "duration": 1200 + 30 * (i % 7),
            "slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"},
        }
        for i in range(slices)
    ]
    workload = parse_workload(items, "speed")
    for policy in ("slice", "ray"):
        if policy == "ray" and slices > 64:
            print(f"{slices:>6} slices  {policy:6} skipped: Ray takes minutes per decision here")
            continue
        summary, wall = simulate(cluster, workload, policy)
        simulated = summary["sim_seconds"]
        print(
            f"{slices:>6} slices  {policy:6} {simulated:>8.0f} sim s in {wall:6.1f} wall s"
            f" = {simulated / wall:8.0f} sim s/s  (launched {summary['slices_launched']},"
            f" decision p50 {summary['decision_ms']['p50']} ms)",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seed workloads and 64 slices only")
    args = parser.parse_args()
    compare_workloads(RUNS[:3] if args.quick else RUNS)
    print()
    for slices in (64,) if args.quick else (64, 1024):
        speed(slices)
    return 0


if __name__ == "__main__":
    sys.exit(main())
