"""`tpu-autoscaler whatif`: a grid of settings x seeds simulated as Ray tasks, a table
per setting and a Pareto plot of idle chip-hours (or, priced, cost) against p95 wait."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tpu_autoscaler.cli.exit_codes import EXIT_FAILURE, EXIT_OK
from tpu_autoscaler.core.problems import ManifestError, Problem


def add_whatif_parser(sub: Any) -> None:
    whatif = sub.add_parser(
        "whatif",
        help="sweep settings x seeds of a cluster and trace through the simulator, on Ray",
        description="Simulate a workload trace on a cluster under every combination of the "
        "--vary settings and each seed, one Ray task per run (a local Ray unless --address), "
        "append each result to a results file as it finishes (a rerun skips finished runs), "
        "and print one line per setting with the Pareto front of idle chip-hours (or, with "
        "--price, cost) against p95 wait marked.",
    )
    whatif.add_argument("--cluster", required=True, help="RayCluster manifest")
    whatif.add_argument("--workload", required=True, help="workload trace (YAML)")
    whatif.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="[GROUP.]maxReplicas, minReplicas, idleTimeoutSeconds, warmReplicas, capacity; "
        "provisioningDelay (S or MIN-MAX seconds), hostStagger (seconds), scaleDownDelay "
        "(seconds a slice's VMs outlive its pods), stockoutScale (factor on the trace's "
        "stockout windows). Repeat for more axes.",
    )
    whatif.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per setting")
    whatif.add_argument(
        "--policy", default="slice", help="comma-separated: slice, ray (both is an axis)"
    )
    whatif.add_argument("--world", choices=("realistic", "ideal"), default="realistic")
    whatif.add_argument(
        "--duration-s", type=float, help="simulated seconds (default: last work end + 30 min)"
    )
    whatif.add_argument("--address", help="an existing Ray cluster (default: a local Ray)")
    whatif.add_argument(
        "--workers",
        type=int,
        help="CPUs of the local Ray (default: all cores); 0: no Ray, one run after another "
        "in this process",
    )
    whatif.add_argument(
        "--results",
        default="whatif-results.jsonl",
        help="JSON lines, one per finished run; an existing file is resumed",
    )
    whatif.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="GROUP=PRICE",
        help="the price of one chip-hour of a worker group (a spot group and an on-demand "
        "one apart); given for every TPU group, the table gains the runs' COST and the "
        "Pareto front and plot are cost against p95 wait. Repeat per group.",
    )
    whatif.add_argument(
        "--plot", help="write idle chip-hours (or cost, with --price) against p95 wait (PNG)"
    )
    whatif.add_argument("--output", choices=("text", "json"), default="text")
    whatif.set_defaults(handler=cmd_whatif)


def cmd_whatif(args: argparse.Namespace) -> int:
    from tpu_autoscaler.manifest.loading import load_manifest
    from tpu_autoscaler.sim.workload import load_workload
    from tpu_autoscaler.whatif.prices import parse_prices
    from tpu_autoscaler.whatif.report import plot_pareto, render_table, summarize
    from tpu_autoscaler.whatif.settings import grid, parse_axis
    from tpu_autoscaler.whatif.simulation import RunSpec
    from tpu_autoscaler.whatif.sweep import in_process, on_ray, run_sweep

    found, cluster = load_manifest(args.cluster)
    if cluster is None:
        raise ManifestError([Problem(args.cluster, found.describe())])
    workload = load_workload(args.workload)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in ("slice", "ray")] or ([] if policies else ["''"])
    if bad:
        raise ManifestError([Problem("--policy", f"{bad}: give slice, ray or slice,ray")])
    if args.seeds < 1:
        raise ManifestError([Problem("--seeds", f"is {args.seeds}; give 1 or more")])
    if args.workers is not None and args.workers < 0:
        raise ManifestError([Problem("--workers", f"is {args.workers}; give 0 or more")])
    groups = [g.group_name for g in cluster.spec.worker_group_specs]
    settings = grid([parse_axis(v, groups) for v in args.vary])
    prices = parse_prices(args.price, _chips_per_host(cluster, groups))
    raycluster = cluster.model_dump(by_alias=True, exclude_none=True)
    trace = workload.model_dump(mode="json")
    specs = [
        RunSpec(raycluster, trace, s.values, policy, seed, args.world, args.duration_s)
        for s in settings
        for policy in policies
        for seed in range(args.seeds)
    ]
    _check_settings(raycluster, workload, settings)
    if prices is not None:
        _check_priced(Path(args.results), {spec.key for spec in specs}, prices)
    executor = in_process if args.workers == 0 else on_ray(args.address, args.workers)
    outcome = run_sweep(specs, Path(args.results), executor)
    results = summarize(outcome.rows, prices)
    print(
        f"{len(specs)} runs ({len(settings)} settings x {len(policies)} policies x "
        f"{args.seeds} seeds): {outcome.ran} ran, {outcome.skipped} already in "
        f"{args.results}, {len(outcome.failed)} failed; {outcome.wall_s:.1f}s",
        file=sys.stderr,
    )
    if args.output == "json":
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render_table(results))
    if args.plot:
        plot_pareto(results, args.plot, f"{cluster.metadata.name}: {Path(args.workload).name}")
    for failure in outcome.failed:
        print(f"error: {failure}; rerun the same command to retry it", file=sys.stderr)
    return EXIT_FAILURE if outcome.failed else EXIT_OK


def _chips_per_host(cluster: Any, groups: list[str]) -> dict[str, int]:
    """Each worker group's TPU chips per host (0: no TPUs, or a group the manifest
    rules refuse, which `_check_settings` names)."""
    from tpu_autoscaler.manifest.shapes import derive_shapes

    shapes = {s.group: int(s.chips_per_host) for s in derive_shapes(cluster).shapes}
    return {group: shapes.get(group, 0) for group in groups}


def _check_priced(results: Path, keys: set[str], prices: Any) -> None:
    """This sweep's rows already in the results file (`keys`) that cannot be priced
    are named before any run is sent (rows of an older tpu-autoscaler, without
    chip-hours by group): the sweep would reuse them."""
    from tpu_autoscaler.whatif.prices import UnpricedResults, run_cost
    from tpu_autoscaler.whatif.sweep import read_results

    for key, row in read_results(results).items():
        if key not in keys:
            continue
        try:
            run_cost(row["summary"], prices)
        except UnpricedResults as exc:
            raise ManifestError([Problem(f"--results {results}", str(exc))]) from exc


def _check_settings(raycluster: dict[str, Any], workload: Any, settings: list[Any]) -> None:
    """Settings the manifest rules refuse (minReplicas above maxReplicas, warm slices
    above maxReplicas) are named here, before any run is sent anywhere."""
    from tpu_autoscaler.manifest.loading import parse_raycluster
    from tpu_autoscaler.manifest.shapes import derive_shapes
    from tpu_autoscaler.whatif.settings import apply_setting

    problems: list[Problem] = []
    for setting in settings:
        cluster, _ = apply_setting(raycluster, workload, setting)
        shapes = derive_shapes(parse_raycluster(cluster, setting.label))
        problems += [
            Problem(f"--vary {setting.label}: {p.path}", p.message, p.group) for p in shapes.errors
        ]
    if problems:
        raise ManifestError(problems)


__all__ = ["add_whatif_parser", "cmd_whatif"]
