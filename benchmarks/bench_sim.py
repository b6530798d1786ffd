"""Every example workload under both autoscalers in both simulated worlds, metrics side
by side, how fast the simulator runs (simulated seconds per wall second and per CPU
second) at 64, 1,024 and 4,096 slices beside the speeds before issue 19 (`BEFORE`),
each with where its wall time went (the autoscaler's rounds that ran, the world between
them, and what a round may take for 1,000 simulated seconds per wall second),
and the wall time of a day-long trace on 1,024 slices
(`examples/workloads/day-1024-slices.yaml`).

The realistic world (`tpu_autoscaler/controlplane/world.py`) is the one the simulator and the
tests default to: KubeRay creates a replica's pods one POST at a time, deleted pods
stay listed for their grace period, a slice's pods turn Running staggered, KubeRay
writes the status and the autoscaler's API calls take time. The ideal world makes all
of that instant; it is here to show what the realistic one changes.

Then the scarce-capacity figures (fallback from a stocked-out or churning spot group
to on-demand, a warm buffer, a two-slice gang while GKE holds one slice on a plain and
on a queued-provisioning group), per group, beside stock Ray on the same trace and
seed.

Prints the tables and the speeds, and writes benchmarks/out/sim.json (every run's
summary) and benchmarks/out/sim.md (the table, the speeds, the numbers that moved
between the worlds; a hand-written section headed WHY_HEADING in an existing sim.md is
carried over), plus one plot per world of idle chip-hours by workload and policy.

    .venv/bin/python benchmarks/bench_sim.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.world import IDEAL, REALISTIC, WorldModel
from tpu_autoscaler.sim.cluster import Policy, SimulatedCluster
from tpu_autoscaler.sim.workload import Workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"
RUNS = [
    ("v6e-4x4-multihost", "seed-slice-placement-group"),
    ("v6e-4x4-multihost", "seed-two-slices"),
    ("v6e-4x4-multihost", "seed-bundle-label-selector"),
    ("v6e-4x4-multihost", "busy-slice"),
    ("v6e-4x4-multihost", "training-day"),
    ("rl-disaggregated", "rl-rollouts"),
    ("v6e-16x16-multihost", "bursty-large-slices"),
    ("v6e-4x4-queued", "queued-provisioning"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang-returns"),
    ("v6e-4x4-multihost", "scarce-sequential-two-slices"),
]
QUICK_RUNS = RUNS[:3]
POLICIES: tuple[Policy, ...] = ("ray", "slice")
WORLDS = (IDEAL, REALISTIC)
SCARCITY_RUNS = [
    ("v6e-4x4-spot-and-on-demand", "spot-stockout", POLICIES),
    ("v6e-4x4-spot-and-on-demand", "spot-churn", POLICIES),
    ("v6e-4x4-warm", "warm-buffer", POLICIES),
    ("v6e-4x4-multihost", "warm-buffer", ("slice",)),
    ("v6e-4x4-multihost", "scarce-two-slice-gang-returns", POLICIES),
    ("v6e-4x4-multihost-queued", "scarce-two-slice-gang-returns", POLICIES),
]
"""Issue 14's figures, in the realistic world: (cluster, workload, policies). The
fourth runs the warm-buffer trace on the same shape without a buffer, for what it
buys; the last two a two-slice gang while GKE holds one slice, on a plain group and
on the same group with queued provisioning (one ProvisioningRequest for the gang)."""
RETURNS_AT_S = (2400.0, 2600.0, 2800.0, 3000.0, 3200.0)
"""When capacity comes back in the gang scenario's sweep: across one backoff gap of the
plain group (its attempts are a stockout hold plus a bound apart), so the figure does
not hang on whether an attempt happens to be in flight at the one time of the example."""
TAIL_S = 1800.0
"""Simulated time after the last work ends: long enough for every idle removal."""
DAY_TRACE = ("v6e-4x4-multihost", "day-1024-slices", 1024)
"""The day-long trace: cluster, workload, the group's maxReplicas. Before issue 19
(BEFORE_TREE) it took 579 CPU s (736 wall s on a shared machine), 872 slices launched;
on main at 1527460 (branch simspeed merged) 59.8 CPU s (59.9 wall s, min of
2, on the quiet machine of the simspeed2 measurements below), 873 launched; on branch
simspeed2 31.6 CPU s (31.7 wall s, min of 2), 873 launched; on main 47514e8 (simspeed2
merged) 31.3 CPU s (32.2 wall s) and on branch simspeed3 (c6b33fb) 22.5 CPU s (23.4 wall
s), both min of 2 on a loaded machine, 873 launched, summaries identical; at AFTER_TREE
6.7 CPU s."""
BEFORE_TREE = "commit a399bcf (main), measured 2026-12-04 between 19:21 and 19:36 UTC"
BEFORE: dict[int, dict[str, float | None]] = {
    64: {"sim_s_per_wall_s": 709, "sim_s_per_cpu_s": 714},
    1024: {"sim_s_per_wall_s": 5.1, "sim_s_per_cpu_s": 13.1},
    4096: {"sim_s_per_wall_s": None, "sim_s_per_cpu_s": None},
}
"""Our policy in the realistic world before issue 19 (every round read and planned in
full), from `speed(N, REALISTIC, "slice", 0)` at BEFORE_TREE: 64 slices on an idle
machine (5.2 s), 1,024 on one shared at load 5-17 (284 CPU s in 724 wall s); 4,096
not measured (None). Wall speeds on a shared machine are rough; CPU seconds (the
process's time) are the steadier measure."""
AFTER_TREE = (
    "main of session 16 (branches rayread16, world16, plan16, kuberead16, kubelay16"
    " merged), measured 2026-12-05 19:11-19:16 UTC"
)
"""Measured there on 2 cores at load 0.6, nothing else running, our policy in the
realistic world, alternated with 19d80fd (session 15's end) in nine pairs: 1,024 slices
5.09-7.43 s against 5.49-7.68 (best 731 sim s per wall s against 678; 1.08-1.32x a
pair, about 1.10x typical); 64 slices 8,565 and 8,806 (19d80fd 8,820 and 8,852); 4,096
slices 107 (34.8 s; 19d80fd 97, 38.5 s); the day trace 98,580 sim s in 6.7 wall s
(19d80fd 7.1). Decision pins equal to 528e30f's.

Before that, main of session 15 (2026-12-05 16:22-16:27 UTC, same load), alternated
with bc8a181 (session 14's end): 1,024 slices 599 at best (6.21 s; 6.56 and 6.39 in the
other pairs; bc8a181 7.83, 8.44 and 8.33 s: 1.19x, 1.36x, 1.30x; 680 in a quieter
minute, 5.47 s); 64 slices 8,291 and 9,225 (bc8a181 7,516 and 7,380); 4,096 slices 96
and 96 (38.9 s; bc8a181 41.5 s); the day trace 98,580 sim s in 6 wall s (bc8a181 7).

Before that, main 17850cd (branches kuberead, rayread, shellspeed, planspeed3,
worldspeed3 merged), measured 2026-12-05 10:17-10:25 UTC on 2 cores at load 1, nothing
else running, our policy in the realistic world (sim s per wall s, per CPU s): 64 slices
6,122-6,500 and 6,150 (three runs, 0.6 s); 1,024 slices 432 and 433 (8.6 s, best of 7;
this VM's speed drifts by up to 40% within minutes, so 0fd230a, the session's start, ran
interleaved with main: main 1.80x, 1.82x and 2.07x faster, 13.1 against 23.8 s, 13.0
against 23.4, 9.1 against 18.8); 4,096 slices 60 and 60 (61.8 s, one run); the day trace
98,580 sim s in 11.6 wall s, 11.6 CPU s. Summaries (all but the timings) identical to
0fd230a's at 64 slices in both worlds under both policies, at 1,024 slices and on the
day trace. Still far from issue 19's 1,000 per wall s at 1,024 slices: what is left is
some thirty per-round passes of a few microseconds per replica each (docs/simulator.md).

Before that, main 79e8a0d (branches planspeed, worldspeed, readspeed, speed4 merged),
measured 2026-12-05 07:53-07:57 UTC on 2 cores at load 1-2, nothing else running, our
policy in the realistic world (min of 2 runs, 3 at 64 slices): 64 slices
6,028 and 6,150 (bc3a873, the session's start, on the same machine just after: 3,815
and 3,690); 1,024 slices 216 and 216 (17.2 s; bc3a873: 27.8 CPU s, 134 per CPU s);
4,096 slices, one run, 31 and 31 (118 s; branch simspeed2 on 1527460: 13 and 13, 292
CPU s); the day trace 98,580 sim s in 13 wall s, 12 CPU s (bc3a873: 27 and 27).
Summaries (all but the timings) identical to bc3a873's at 64 and 1,024 slices and on the
day trace for every speed branch (each checked by its branch). Still far from issue 19's
1,000 per wall s at 1,024 slices: each of the 409 full rounds (of 744; only 23 of them
read what the round before read) reads every pod and Ray node and plans over every
replica, about 30 ms; the world (KubeRay making 4,096 pods, Ray placing 1,024 gangs) is
about 3 s of the 17.

Before that, branch simspeed3 on main 47514e8 (c6b33fb), measured 2026-12-05 03:41-03:46
UTC on 2 cores shared with two other busy processes (load 2-3), runs of
main 47514e8 and of AFTER_TREE alternated, our policy in the realistic world (sim s per
wall s, per CPU s; min of 2 runs, 3 at 64 slices): 64 slices 4,478 and 4,518 (0.82 CPU
s; main: 3,172 and 3,313, 1.11 CPU s); 1,024 slices 144 and 150 (24.8 CPU s; main: 114
and 118, 31.6 CPU s); 4,096 slices not measured. Summaries (all but the
timings) identical to main's at 64 and 1,024 slices and on the day trace. Still far
from issue 19's 1,000 per wall s at 1,024 slices: what is left is flat, the rounds'
read (every pod and Ray node: the GCS state built and parsed, the replicas
assembled), the plan's world of every host, the sampler and the simulated Ray.

Earlier, branch simspeed2 on main 1527460 (b8d72da), measured 2026-12-05 00:58-01:05
UTC on 2 cores at load 1-2 (min of 2 runs): 64 slices 2,906 and 2,952 (1.25 CPU s; main at
1527460 on the same machine: 2,073 and 2,121); 1,024 slices 110 and 111 (33.6 CPU s;
main at 1527460: 42 and 43, 87.2 CPU s); 4,096 slices, one run, 13 and 13 (292 CPU s;
main at 1527460, one run: 3.0 and 3.5, 1,066 CPU s). Summaries identical to main's at
64, 1,024, 2,048 (92 CPU s against main's 332) and 4,096 slices and on the day trace. The earlier
branch simspeed (main 1c6e08b, 2026-12-04 21:35-22:08 UTC, load 2-7) measured 1,024
slices at 8 and 20."""


@dataclass(frozen=True)
class Column:
    title: str
    read: Callable[[dict[str, Any]], Any]


def _key(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda summary: summary[name]


def _wait(quantile: str) -> Callable[[dict[str, Any]], Any]:
    return lambda summary: summary["demand_wait_s"][quantile]


COLUMNS = [
    Column("slices", _key("slices_launched")),
    Column("partial s", _key("partial_slice_seconds")),
    Column("busy killed", _key("busy_replicas_terminated")),
    Column("unsatisfied", _key("unsatisfied_at_end")),
    Column("busy chip-h", _key("busy_chip_hours")),
    Column("idle chip-h", _key("idle_chip_hours")),
    Column("flaps", _key("scale_flaps")),
    Column("wait p50 s", _wait("p50")),
    Column("wait p95 s", _wait("p95")),
    Column("conflicts", _key("patch_conflicts")),
    Column("cancelled", _key("launches_cancelled")),
    Column("resv failed", _key("reservations_failed")),
]
"""`SimulatedCluster.run`'s summary (`Metrics.summary`) as the table shows it; `cancelled`
is launches the autoscaler took back, `resv failed` slice head reservations that timed
out."""
KEYS = ["workload", "policy", "world"]
WHY_HEADING = "## Why they moved"


def load_cluster(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / f"examples/clusters/{name}.yaml").read_text())
    return loaded


def simulate(
    cluster: dict[str, Any], workload: Workload, policy: Policy, world: WorldModel, seed: int
) -> tuple[SimulatedCluster, dict[str, Any], float, list[float]]:
    """One run, as `tpu-autoscaler simulate` sets it up (the trace's provisioning delays
    and capacity), except that the delays come from a seeded stream of their own: the
    worlds draw different amounts of the simulator's randomness (the Running stagger,
    Ray's scheduling picks), which would otherwise shift every later slice's delay
    and blur what the world itself changes. Returns the provisioning delays drawn."""
    delay_range = workload.provisioning.delay_s
    draws = random.Random(seed)
    delays_s: list[float] = []

    def provisioning_delay(_: EventQueue) -> float:
        delays_s.append(draws.uniform(delay_range.min, delay_range.max))
        return delays_s[-1]

    started = time.perf_counter()
    started_cpu = time.process_time()
    sim = SimulatedCluster(
        cluster,
        policy=policy,
        seed=seed,
        provisioning_delay=provisioning_delay,
        capacity=workload.provisioning.capacity,
        world=world,
        scale_down_delay_s=workload.provisioning.scale_down_delay_s,
    )
    sim.load(workload)
    summary = sim.run(workload.last_end_s + TAIL_S)
    summary["cpu_s"] = round(time.process_time() - started_cpu, 1)
    return sim, summary, time.perf_counter() - started, delays_s


WIDTHS = [30, 6, 9] + [max(11, len(c.title)) for c in COLUMNS]


def print_row(cells: list[str]) -> None:
    """Keys left-aligned, figures right-aligned, in the table's column widths."""
    print(
        " ".join(
            f"{text:{width}}" if index < len(KEYS) else f"{text:>{width}}"
            for index, (text, width) in enumerate(zip(cells, WIDTHS, strict=True))
        ),
        flush=True,
    )


def compare_workloads(runs: list[tuple[str, str]], seed: int) -> list[dict[str, Any]]:
    """Each (cluster, workload) under each policy in each world, printed as it ends."""
    records: list[dict[str, Any]] = []
    print_row([*KEYS, *(c.title for c in COLUMNS)])
    print("-" * (sum(WIDTHS) + len(WIDTHS) - 1))
    for cluster_name, workload_name in runs:
        cluster = load_cluster(cluster_name)
        workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
        for policy in POLICIES:
            for world in WORLDS:
                sim, summary, wall_s, delays_s = simulate(cluster, workload, policy, world, seed)
                record = {
                    "cluster": cluster_name,
                    "workload": workload_name,
                    "wall_s": round(wall_s, 1),
                    "provisioning_delays_s": [round(d, 1) for d in delays_s],
                    "operator_errors": len(sim.operator.errors),
                    "violations": sim.violations,
                    **summary,
                }
                records.append(record)
                print_row([str(record[k]) for k in KEYS] + [cell(c.read(record)) for c in COLUMNS])
    return records


def by_group(values: dict[str, Any]) -> str:
    return ", ".join(f"{g} {cell(v)}" for g, v in values.items()) or "-"


SCARCITY_HEADER = [
    "workload",
    "cluster",
    "policy",
    "slices by group",
    "idle chip-h by group",
    "wait p50 s",
    "wait max s",
    "busy killed",
    "unsatisfied",
    "placed after return s",
]


def scarcity_row(r: dict[str, Any]) -> list[str]:
    return [
        r["workload"],
        r["cluster"],
        r["policy"],
        by_group(r["slices_launched_by_group"]),
        by_group(r["idle_chip_hours_by_group"]),
        cell(r["demand_wait_s"]["p50"]),
        cell(r["demand_wait_s"]["max"]),
        str(r["busy_replicas_terminated"]),
        str(r["unsatisfied_at_end"]),
        cell(r.get("placed_after_return_s", "-")),
    ]


def placed_after_return_s(sim: SimulatedCluster, workload: Workload) -> float | str:
    """From the capacity limit lifted (a `capacity` fault to unlimited) to the last
    work placed; "-" without such a fault, "never" if some work was never placed."""
    returned = [f.at for f in workload.faults if f.capacity and f.capacity.slices is None]
    if not returned:
        return "-"
    placed = [w.placed_s for w in sim.ray.finished + list(sim.ray.running.values())]
    if not placed or None in placed or sim.ray.pending:
        return "never"
    return round(max(p for p in placed if p is not None) - min(returned), 1)


def scarcity_figures(seed: int) -> list[dict[str, Any]]:
    """Each scarce-capacity scenario under each of its policies, realistic world."""
    records = []
    print(" | ".join(SCARCITY_HEADER))
    for cluster_name, workload_name, policies in SCARCITY_RUNS:
        cluster = load_cluster(cluster_name)
        workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
        for policy in policies:
            sim, summary, wall_s, _ = simulate(cluster, workload, policy, REALISTIC, seed)
            record = {
                "cluster": cluster_name,
                "workload": workload_name,
                "wall_s": round(wall_s, 1),
                "violations": sim.violations,
                "placed_after_return_s": placed_after_return_s(sim, workload),
                **summary,
            }
            records.append(record)
            print(" | ".join(scarcity_row(record)), flush=True)
    records += capacity_return_sweep(seed)
    return records


def capacity_return_sweep(seed: int) -> list[dict[str, Any]]:
    """The two-slice gang with capacity returning at each of `RETURNS_AT_S`, on the
    plain and the queued group, under our policy (stock Ray never places the gang)."""
    base = load_workload(str(ROOT / "examples/workloads/scarce-two-slice-gang-returns.yaml"))
    records = []
    for cluster_name in ("v6e-4x4-multihost", "v6e-4x4-multihost-queued"):
        cluster = load_cluster(cluster_name)
        for returns_s in RETURNS_AT_S:
            faults = [
                f.model_copy(update={"at": returns_s}) if f.capacity else f for f in base.faults
            ]
            workload = base.model_copy(update={"faults": faults})
            sim, summary, wall_s, _ = simulate(cluster, workload, "slice", REALISTIC, seed)
            record = {
                "cluster": cluster_name,
                "workload": f"scarce-two-slice-gang-returns, back at {returns_s:.0f} s",
                "wall_s": round(wall_s, 1),
                "violations": sim.violations,
                "placed_after_return_s": placed_after_return_s(sim, workload),
                **summary,
            }
            records.append(record)
            print(" | ".join(scarcity_row(record)), flush=True)
    return records


def speed_workload(slices: int) -> tuple[dict[str, Any], Workload]:
    """`slices` one-slice placement groups on a v6e 4x4 group with room for them all.
    Their heads wait without a timeout, as every head did before the simulator ran Ray's
    100 s one, so every slice launches and the speeds compare with earlier runs."""
    cluster = load_cluster("v6e-4x4-multihost")
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = slices
    items = [
        {
            "at": 60 * (i % 10),
            "duration": 1200 + 30 * (i % 7),
            "slice_placement_group": {
                "topology": "4x4",
                "accelerator_version": "v6e",
                "head_reservation_timeout_s": None,
            },
        }
        for i in range(slices)
    ]
    return cluster, parse_workload(items, "speed")


TARGET_SIM_S_PER_WALL_S = 1000
"""Issue 19's speed at 1,024 slices: what `round_budget_ms` is worked out for."""


def speed(slices: int, world: WorldModel, policy: Policy, seed: int) -> dict[str, Any]:
    """One speed run, with where its wall time went: the autoscaler's rounds that ran
    (`Metrics.rounds_wall_s`) and the world between them, and what a round run may
    take for the run to reach `TARGET_SIM_S_PER_WALL_S` beside this run's world
    (None: the world alone takes longer)."""
    cluster, workload = speed_workload(slices)
    sim, summary, wall_s, _ = simulate(cluster, workload, policy, world, seed)
    rounds_run = len(sim.metrics.decision_s)
    rounds_wall_s = sim.metrics.rounds_wall_s
    world_wall_s = wall_s - rounds_wall_s
    budget_s = summary["sim_seconds"] / TARGET_SIM_S_PER_WALL_S - world_wall_s
    before = BEFORE.get(slices, {}) if (world, policy) == (REALISTIC, "slice") else {}
    record = {
        "slices": slices,
        "world": world.name,
        "policy": policy,
        "sim_s": summary["sim_seconds"],
        "wall_s": round(wall_s, 1),
        "cpu_s": summary["cpu_s"],
        "sim_s_per_wall_s": round(summary["sim_seconds"] / wall_s),
        "sim_s_per_cpu_s": round(summary["sim_seconds"] / max(summary["cpu_s"], 0.1)),
        "before_sim_s_per_wall_s": before.get("sim_s_per_wall_s"),
        "before_sim_s_per_cpu_s": before.get("sim_s_per_cpu_s"),
        "launched": summary["slices_launched"],
        "decision_p50_ms": summary["decision_ms"]["p50"],
        "rounds_run": rounds_run,
        "rounds_skipped": sim.quiet.skipped,
        "rounds_wall_s": round(rounds_wall_s, 1),
        "world_wall_s": round(world_wall_s, 1),
        "ms_per_round_run": round(1e3 * rounds_wall_s / max(rounds_run, 1), 1),
        "round_budget_ms": round(1e3 * budget_s / max(rounds_run, 1), 1) if budget_s > 0 else None,
    }
    print(
        f"{slices:>6} slices  {world.name:9} {policy:6} {record['sim_s']:>8.0f} sim s in"
        f" {wall_s:6.1f} wall s = {record['sim_s_per_wall_s']:>6} sim s/s,"
        f" {record['sim_s_per_cpu_s']:>6} per CPU s (before:"
        f" {cell(record['before_sim_s_per_wall_s'])}, {cell(record['before_sim_s_per_cpu_s'])})"
        f"  (launched {record['launched']}, decision p50 {record['decision_p50_ms']} ms)",
        flush=True,
    )
    print(
        f"{'':>14}rounds run {rounds_run} (skipped {record['rounds_skipped']}):"
        f" {record['rounds_wall_s']} s, {record['ms_per_round_run']} ms each;"
        f" the world between them {record['world_wall_s']} s;"
        f" {TARGET_SIM_S_PER_WALL_S:,} sim s/s would leave"
        + (
            f" {record['round_budget_ms']} ms a round"
            if record["round_budget_ms"] is not None
            else " no time at all (the world alone takes longer)"
        ),
        flush=True,
    )
    return record


def day_trace(seed: int) -> dict[str, Any]:
    """The day-long trace on 1,024 slices, our policy in the realistic world."""
    cluster_name, workload_name, max_replicas = DAY_TRACE
    cluster = load_cluster(cluster_name)
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = max_replicas
    workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
    _, summary, wall_s, _ = simulate(cluster, workload, "slice", REALISTIC, seed)
    record = {
        "workload": workload_name,
        "sim_s": summary["sim_seconds"],
        "wall_s": round(wall_s, 1),
        "cpu_s": summary["cpu_s"],
        "launched": summary["slices_launched"],
        "unsatisfied": summary["unsatisfied_at_end"],
    }
    print(
        f"day-long trace {workload_name}: {record['sim_s']:.0f} sim s in {wall_s:.0f} wall s"
        f" ({record['cpu_s']:.0f} CPU s), launched {record['launched']}",
        flush=True,
    )
    return record


def speed_runs(quick: bool) -> list[tuple[int, WorldModel, Policy]]:
    """Both worlds and both autoscalers at 64 slices; at 1,024 and 4,096 only ours in
    the realistic world (Ray's scheduler takes minutes per decision there)."""
    runs: list[tuple[int, WorldModel, Policy]] = [
        (64, world, policy) for world in WORLDS for policy in ("slice", "ray")
    ]
    if not quick:
        runs += [(1024, REALISTIC, "slice"), (4096, REALISTIC, "slice")]
    return runs


# --- the report ---------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def workload_table(records: list[dict[str, Any]]) -> str:
    rows = [[str(r[k]) for k in KEYS] + [cell(c.read(r)) for c in COLUMNS] for r in records]
    return markdown_table([*KEYS, *(c.title for c in COLUMNS)], rows)


def moved(records: list[dict[str, Any]]) -> list[str]:
    """Per workload and policy, each column whose value differs between the worlds."""
    by_run: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        by_run.setdefault((r["workload"], r["policy"]), {})[r["world"]] = r
    lines = []
    for (workload, policy), worlds in by_run.items():
        ideal, realistic = worlds.get(IDEAL.name), worlds.get(REALISTIC.name)
        if ideal is None or realistic is None:
            continue
        changes = [
            f"{c.title} {cell(c.read(ideal))} -> {cell(c.read(realistic))}"
            for c in COLUMNS
            if c.read(ideal) != c.read(realistic)
        ]
        lines.append(f"- {workload}, `{policy}`: " + ("; ".join(changes) or "nothing moved"))
    return lines


def speed_table(records: list[dict[str, Any]]) -> str:
    header = ["slices", "world", "policy", "sim s", "wall s", "CPU s", "sim s / wall s"]
    header += ["sim s / CPU s", "before: sim s / wall s", "before: sim s / CPU s", "launched"]
    header += ["decision p50 ms", "rounds run", "ms a round run", "world wall s"]
    header.append(f"ms a round at {TARGET_SIM_S_PER_WALL_S:,} sim s / wall s")
    keys = ["slices", "world", "policy", "sim_s", "wall_s", "cpu_s", "sim_s_per_wall_s"]
    keys += ["sim_s_per_cpu_s", "before_sim_s_per_wall_s", "before_sim_s_per_cpu_s", "launched"]
    keys += ["decision_p50_ms", "rounds_run", "ms_per_round_run", "world_wall_s"]
    keys.append("round_budget_ms")
    rows = [[cell(r.get(k)) for k in keys] for r in records]
    return markdown_table(header, rows)


def provenance() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout

    dirty = git("status", "--porcelain", "--", "tpu_autoscaler", "examples").splitlines()
    changed = ", ".join(line[3:] for line in dirty)  # "XY path"
    tree = f"commit {git('rev-parse', '--short', 'HEAD').strip()}"
    return tree + (f" with uncommitted changes to {changed}" if changed else "")


def machine() -> str:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"
        + (f" ({model})" if model else "")
        + f", Python {platform.python_version()}"
    )


def previous_explanation(path: Path) -> str | None:
    """The hand-written section of an earlier sim.md, kept across runs."""
    if not path.exists():
        return None
    text = path.read_text()
    start = text.find(WHY_HEADING)
    return text[start:].rstrip() + "\n" if start >= 0 else None


def markdown(
    records: list[dict[str, Any]],
    speeds: list[dict[str, Any]],
    meta: dict[str, Any],
    plots: list[str],
    kept: str | None,
    scarcity: list[dict[str, Any]],
    day: dict[str, Any] | None = None,
) -> str:
    import ray

    parts = [
        "# Simulated cluster: both autoscalers in the ideal and the realistic world",
        "",
        f"Produced by `{meta['command']}` on {meta['machine']}, {meta['date']}, from"
        f" {meta['tree']} (Ray {ray.__version__}); wall time {meta['wall_s']:.0f} s on a"
        " machine shared with other work, so wall times and speeds are rough.",
        "",
        "Each run is `SimulatedCluster(cluster, policy, seed, world)` on"
        f" `examples/clusters/<cluster>.yaml` with `examples/workloads/<workload>.yaml`, seed"
        f" {meta['seed']}, run until {TAIL_S:.0f} s after the last work ends. `ray` is Ray"
        " 2.60's autoscaler with its KubeRay provider's arithmetic (`adapters/ray/baseline.py`),"
        " `slice` is ours. `realistic` is the default world, `ideal` the instant one"
        " (`tpu_autoscaler/controlplane/world.py`).",
        "",
        "Columns (`Metrics.summary` in `tpu_autoscaler/sim/cluster.py`): slices launched;"
        " partial-slice seconds (5 s samples of a replica that holds chips but cannot run a"
        " slice-wide job); busy replicas KubeRay deleted on the autoscaler's request;"
        " work still pending at the end; chip-hours of Ray nodes busy and idle; flaps"
        " (a launch within the idle timeout of a removal in the same group); the time"
        " from submit to placement of the placed work (p50, p95); guarded patches that"
        " met a 409 Conflict and were re-planned; launches the autoscaler took back"
        " before they came up; slice head reservations that timed out.",
        "",
        "## Workloads",
        "",
        workload_table(records),
        "",
        "## What moved between the worlds",
        "",
        *moved(records),
        "",
        "## Simulator speed",
        "",
        "N one-slice `slice_placement_group`s on a v6e 4x4 group with room for N slices"
        " (arrivals over 10 minutes, 20-23 minutes each, heads waiting without a"
        " timeout), simulated seconds per wall second and per CPU second of the process.",
        "",
        speed_table(speeds),
        "",
        f"Before: {BEFORE_TREE}; `-`: not measured.",
        "",
    ]
    if day is not None:
        parts += [
            "## A day-long trace",
            "",
            f"`examples/workloads/{day['workload']}.yaml` (1,024 slices over a day, our"
            f" policy, realistic world): {day['sim_s']:.0f} simulated s in {day['wall_s']:.0f}"
            f" wall s ({day['cpu_s']:.0f} CPU s), {day['launched']} slices launched.",
            "",
        ]
    if scarcity:
        parts += [
            "## Scarce capacity",
            "",
            "Issue 14's figures in the realistic world, seed as above: spot (priority 10,"
            " cost 1) and on-demand (priority 0, cost 3) groups of one v6e 4x4 shape with"
            " spot stocked out for the whole trace (`spot-stockout`; our only signal of it"
            " so far is the 900 s provisioning timeout) or preempted twice in 8 minutes"
            " (`spot-churn`); one group with one warm slice (`warm-buffer`), and the same"
            " trace on the plain group for what the buffer buys. Idle chip-hours include"
            " the 1800 s tail, through which a warm slice stays up on purpose. Last, a gang"
            " of two v6e 4x4 slices while GKE holds one, capacity back at t=2700 s"
            " (`scarce-two-slice-gang-returns`), on a plain group and on the same group with"
            " queued provisioning (`v6e-4x4-multihost-queued`: one ProvisioningRequest for"
            " both slices); the last column is from capacity back to the job placed.",
            "",
            markdown_table(SCARCITY_HEADER, [scarcity_row(r) for r in scarcity]),
            "",
        ]
    if plots:
        parts += ["## Idle chip-hours", ""]
        parts += [f"![idle chip-hours, {Path(p).stem}]({Path(p).name})" for p in plots]
        parts.append("")
    if kept:
        parts.append(kept)
    return "\n".join(parts)


def plot_idle(records: list[dict[str, Any]], out: Path) -> list[str]:
    """One PNG per world: idle chip-hours by workload and policy, on one shared scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in records))
    top = max((r["idle_chip_hours"] for r in records), default=1.0) or 1.0
    paths = []
    for world in WORLDS:
        fig, axes = plt.subplots(figsize=(8, 0.6 * len(workloads) + 1.5))
        for offset, policy in enumerate(POLICIES):
            values = [
                next(
                    (
                        r["idle_chip_hours"]
                        for r in records
                        if r["workload"] == w and r["policy"] == policy and r["world"] == world.name
                    ),
                    0.0,
                )
                for w in workloads
            ]
            positions = [i + 0.4 * offset - 0.2 for i in range(len(workloads))]
            bars = axes.barh(positions, values, height=0.4, label=policy)
            axes.bar_label(bars, labels=[cell(v) for v in values], padding=3, fontsize=8)
        axes.set_yticks(range(len(workloads)), workloads)
        axes.invert_yaxis()
        # Log-like beyond 1 chip-hour: the workloads span three orders of magnitude.
        axes.set_xscale("symlog", linthresh=1.0)
        axes.set_xlim(0, top * 4)
        axes.set_xlabel("idle chip-hours (linear to 1, logarithmic beyond)")
        axes.set_title(f"Idle chip-hours, {world.name} world")
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        fig.tight_layout()
        path = out / f"sim-idle-{world.name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seed workloads and 64 slices only")
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed for every run")
    parser.add_argument("--out", type=Path, default=OUT, help="where sim.json/.md and plots go")
    parser.add_argument(
        "--rewrite", action="store_true", help="run nothing: write sim.md and plots from sim.json"
    )
    args = parser.parse_args()
    if args.rewrite:
        saved = json.loads((args.out / "sim.json").read_text())
        runs, speeds, day = saved.pop("runs"), saved.pop("speed"), saved.pop("day", None)
        scarcity = saved.pop("scarcity", [])
        write_report(args.out, runs, speeds, saved, scarcity, day)
        return 0

    started = time.time()
    tree = provenance()  # the code as imported now, whatever lands during the run
    records = compare_workloads(QUICK_RUNS if args.quick else RUNS, args.seed)
    print()
    scarcity = scarcity_figures(args.seed)
    print()
    speeds = [speed(n, world, policy, args.seed) for n, world, policy in speed_runs(args.quick)]
    day = None if args.quick else day_trace(args.seed)
    wall_s = time.time() - started

    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_sim.py" + " ".join(["", *sys.argv[1:]])
    meta = {
        "command": command.rstrip(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "tree": tree,
        "seed": args.seed,
        "wall_s": round(wall_s, 1),
    }
    (args.out / "sim.json").write_text(
        json.dumps(
            {**meta, "runs": records, "speed": speeds, "scarcity": scarcity, "day": day},
            indent=1,
        )
        + "\n"
    )
    print(f"\nwall time {wall_s:.0f} s")
    write_report(args.out, records, speeds, meta, scarcity, day)
    return 0


def write_report(
    out: Path,
    records: list[dict[str, Any]],
    speeds: list[dict[str, Any]],
    meta: dict[str, Any],
    scarcity: list[dict[str, Any]],
    day: dict[str, Any] | None = None,
) -> None:
    plots = plot_idle(records, out)
    report = out / "sim.md"
    kept = previous_explanation(report)
    report.write_text(markdown(records, speeds, meta, plots, kept, scarcity, day))
    print(f"wrote {report}, sim.json and {len(plots)} plots")
    if kept:
        print(f"kept the hand-written '{WHY_HEADING[3:]}' section: check it against the new table")


if __name__ == "__main__":
    sys.exit(main())
