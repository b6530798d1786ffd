"""`policy.plan` of two revisions side by side on bench_policy.py's snapshots: the
speed of each, and whether they decide the same.

The older revision is exported (`git archive`, no worktree registered) to
/tmp/policy-speed-<commit>; the newer one is this tree as it is on disk, or another
revision exported alike (--new-rev: a tree being edited must not change mid-run). Each measurement runs in a
fresh subprocess with PYTHONPATH set to one tree, and old and new alternate, so
neither profits from warm caches or a quiet moment the other did not get. Both build
the snapshot with this tree's benchmarks/bench_policy.py (the same benchmark; a row
the old code cannot build is shown as '-').

The machine may be shared: times are CPU time of the planning process
(`time.process_time`, not wall time), and the figure reported is the minimum over
every repeat in every round, the least disturbed run.

    .venv/bin/python benchmarks/compare_policy_speed.py --rev b1bb89b [--rounds 3]
        [--repeats 5] [--quick] [--only 16384x100000]
    .venv/bin/python benchmarks/compare_policy_speed.py --rev main --check-plans

--check-plans plans every bench snapshot and every examples/snapshots file once
under each tree and exits 1 if any plan's JSON differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


def export_tree(rev: str) -> Path:
    """The tree of `rev` under /tmp (exported once per commit)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    target = Path(tempfile.gettempdir()) / f"policy-speed-{commit[:12]}"
    if not (target / "tpu_autoscaler").is_dir():
        staging = Path(tempfile.mkdtemp(prefix=f"policy-speed-{commit[:12]}-"))
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "tpu_autoscaler"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
        staging.rename(target)
    return target


def run_child(tree: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["module"].startswith(str(tree)):
        raise RuntimeError(f"{tree}: the child imported {result['module']}")
    return result


# --- the child: runs under one tree ------------------------------------------------


def child(argv: list[str]) -> int:
    sys.path.insert(0, str(BENCH_DIR))
    import gc

    import bench_policy

    import tpu_autoscaler
    from tpu_autoscaler.core.policy import plan

    mode, *rest = argv
    if mode == "time":
        cluster, hosts, bundles, repeats = rest[0], int(rest[1]), int(rest[2]), int(rest[3])
        make = bench_policy.make_snapshot if cluster == "v6e" else bench_policy.make_mixed_snapshot
        snapshot = make(hosts, bundles).snapshot
        gc.collect()
        times = []
        for _ in range(repeats):
            start = time.process_time()
            plan(snapshot)
            times.append(time.process_time() - start)
        print(json.dumps({"times": times, "module": tpu_autoscaler.__file__}))
        return 0
    from tpu_autoscaler.adapters.snapshot_file import load_snapshot

    plans: dict[str, Any] = {}
    for cluster, hosts, bundles in plan_cases():
        make = bench_policy.make_snapshot if cluster == "v6e" else bench_policy.make_mixed_snapshot
        plans[f"{cluster} {hosts}x{bundles}"] = plan(make(hosts, bundles).snapshot).to_json()
    for path in sorted((ROOT / "examples/snapshots").glob("*.yaml")):
        plans[path.name] = plan(load_snapshot(str(path)).snapshot).to_json()
    print(json.dumps({"plans": plans, "module": tpu_autoscaler.__file__}))
    return 0


def bench_cases(quick: bool) -> list[tuple[str, int, int]]:
    sys.path.insert(0, str(BENCH_DIR))
    import bench_policy

    sizes = bench_policy.QUICK if quick else bench_policy.CASES
    return [("v6e", h, b) for h, b in sizes] + [("mixed", h, b) for h, b in bench_policy.MIXED]


def plan_cases() -> list[tuple[str, int, int]]:
    """The bench snapshots small enough to plan in a few seconds each."""
    return [c for c in bench_cases(quick=False) if c[1] * c[2] <= 2_048 * 100_000]


# --- the parent ----------------------------------------------------------------------


def compare_times(old: Path, new: Path, args: argparse.Namespace) -> int:
    cases = bench_cases(args.quick)
    if args.only:
        wanted = {tuple(map(int, s.split("x"))) for s in args.only}
        cases = [c for c in cases if (c[1], c[2]) in wanted]
    trees = {"old": old, "new": new}
    header = f"{'cluster':>7} {'hosts':>6} {'bundles':>8} {'old ms':>9} {'new ms':>9} {'new/old':>8}"
    print(f"old: {args.rev} ({old}); new: {args.new_rev or 'this tree'} ({new})")
    print(f"CPU time of policy.plan, min over {args.rounds} rounds x {args.repeats} repeats")
    print(header)
    print("-" * len(header), flush=True)
    for cluster, hosts, bundles in cases:
        best: dict[str, float | None] = {"old": None, "new": None}
        errors: dict[str, str] = {}
        repeats = args.repeats if hosts * bundles <= 2_560_000 else max(1, args.repeats // 2)
        for _ in range(args.rounds):
            for name, tree in trees.items():
                out = run_child(tree, ["time", cluster, str(hosts), str(bundles), str(repeats)])
                if "error" in out:
                    errors[name] = out["error"]
                    continue
                fastest = min(out["times"])
                previous = best[name]
                best[name] = fastest if previous is None else min(previous, fastest)
        cells = [f"{v * 1e3:>9.1f}" if v is not None else f"{'-':>9}" for v in best.values()]
        old_s, new_s = best["old"], best["new"]
        ratio = f"{new_s / old_s:>8.2f}" if old_s and new_s else f"{'-':>8}"
        print(f"{cluster:>7} {hosts:>6} {bundles:>8} {cells[0]} {cells[1]} {ratio}", flush=True)
        for name, error in errors.items():
            print(f"    {name}: {error}")
    return 0


def compare_plans(old: Path, new: Path) -> int:
    results = {name: run_child(tree, ["plans"]) for name, tree in (("old", old), ("new", new))}
    for name, out in results.items():
        if "error" in out:
            print(f"{name}: {out['error']}")
            return 2
    old_plans, new_plans = results["old"]["plans"], results["new"]["plans"]
    differ = [k for k in old_plans if old_plans[k] != new_plans.get(k)]
    for key in old_plans:
        print(f"{'DIFFERS' if key in differ else 'same':>7}  {key}")
    return 1 if differ else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", default="b1bb89b", help="the older revision (git)")
    parser.add_argument("--new-rev", help="the newer revision (default: this tree)")
    parser.add_argument("--rounds", type=int, default=3, help="subprocess pairs per size")
    parser.add_argument("--repeats", type=int, default=5, help="plans per subprocess")
    parser.add_argument("--quick", action="store_true", help="bench_policy's quick sizes")
    parser.add_argument("--only", nargs="*", help="sizes as HOSTSxBUNDLES")
    parser.add_argument("--check-plans", action="store_true", help="compare plans, not times")
    args = parser.parse_args()
    old = export_tree(args.rev)
    new = export_tree(args.new_rev) if args.new_rev else ROOT
    return compare_plans(old, new) if args.check_plans else compare_times(old, new, args)


if __name__ == "__main__":
    sys.exit(main())
