"""`policy.plan` of two revisions side by side on bench_policy.py's snapshots: the
speed of each, and whether they decide the same.

The older revision is exported (`git archive`, no worktree registered) to
/tmp/policy-speed-<commit>; the newer one is this tree as it is on disk, or another
revision exported alike (--new-rev: a tree being edited must not change mid-run).
For each size a fresh subprocess per tree (PYTHONPATH set to that tree) builds the
snapshot once, with this tree's benchmarks/bench_policy.py (the same benchmark; a
row the old code cannot build is shown as '-'), then plans it on request; old and
new alternate, plan by plan, so neither gets a quiet moment the other did not.

The machine may be shared: times are CPU time of the planning process
(`time.process_time`, not wall time), and the figure reported is the minimum of
--repeats plans, the least disturbed run.

    .venv/bin/python benchmarks/compare_policy_speed.py --rev b1bb89b [--new-rev REV]
        [--repeats 15] [--quick] [--only 16384x100000 ...]
    .venv/bin/python benchmarks/compare_policy_speed.py --rev main --check-plans

--ladder REV... times each revision (say each commit of a branch) round robin.
--check-plans plans every bench snapshot up to 2,048 x 100,000, every
examples/snapshots file and --examples generated snapshots of the property tests
(test_policy_properties, test_parity_properties) once under each tree and exits 1
if any plan's JSON differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
        try:
            staging.rename(target)
        except OSError:  # another run exported it meanwhile
            shutil.rmtree(staging)
    return target


def child_env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")


def run_child(tree: Path, args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        env=child_env(tree),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    _check_module(tree, result)
    return result


def _check_module(tree: Path, said: dict[str, Any]) -> None:
    if not said["module"].startswith(str(tree)):
        raise RuntimeError(f"{tree}: the child imported {said['module']}")


class Planner:
    """A child process under one tree holding one bench snapshot, planning it on
    request (the snapshot is built once: at 16,384 hosts that takes longer than
    several plans)."""

    def __init__(self, tree: Path, case: tuple[str, int, int]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", "time", *map(str, case)],
            env=child_env(tree),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.tree = tree
        self.error: str | None = None
        self._ready = False

    def _line(self) -> str | None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            lines = self.process.stderr.read().strip().splitlines()
            self.error = lines[-1] if lines else "the child exited"
            return None
        return line

    def plan_s(self) -> float | None:
        """CPU seconds of one `plan`; None if the child failed."""
        if not self._ready:
            self._ready = True
            first = self._line()  # the snapshot is built
            if first is not None:
                _check_module(self.tree, json.loads(first))
        if self.error is not None:
            return None
        assert self.process.stdin is not None
        self.process.stdin.write("plan\n")
        self.process.stdin.flush()
        line = self._line()
        return float(line) if line is not None else None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


# --- the child: runs under one tree ------------------------------------------------


def child(argv: list[str]) -> int:
    sys.path.insert(0, str(BENCH_DIR))
    import gc

    import bench_policy

    import tpu_autoscaler
    from tpu_autoscaler.core.policy import plan

    mode, *rest = argv
    if mode == "time":
        # Build the snapshot, then plan it once per line the parent sends.
        cluster, hosts, bundles = rest[0], int(rest[1]), int(rest[2])
        make = bench_policy.make_snapshot if cluster == "v6e" else bench_policy.make_mixed_snapshot
        snapshot = make(hosts, bundles).snapshot
        gc.collect()
        print(json.dumps({"module": tpu_autoscaler.__file__}), flush=True)
        for _ in sys.stdin:
            start = time.process_time()
            plan(snapshot)
            print(time.process_time() - start, flush=True)
        return 0
    from tpu_autoscaler.adapters.snapshot_file import load_snapshot

    plans: dict[str, Any] = {}
    for cluster, hosts, bundles in plan_cases():
        make = bench_policy.make_snapshot if cluster == "v6e" else bench_policy.make_mixed_snapshot
        plans[f"{cluster} {hosts}x{bundles}"] = plan(make(hosts, bundles).snapshot).to_json()
    for path in sorted((ROOT / "examples/snapshots").glob("*.yaml")):
        plans[path.name] = plan(load_snapshot(str(path)).snapshot).to_json()
    plans.update(random_plans(int(rest[0])))
    print(json.dumps({"plans": plans, "module": tpu_autoscaler.__file__}))
    return 0


def random_plans(examples: int) -> dict[str, Any]:
    """Plans of the property tests' generated snapshots (TPU clusters; CPU and GPU
    clusters with a head), the same `examples` of each under either tree: the
    generation is derandomized and built by modules this comparison does not change
    (`tests/` of this tree, after the tree's own package on sys.path)."""
    sys.path.append(str(ROOT))
    from hypothesis import HealthCheck, given, settings

    from tests.test_parity_properties import cpu_gpu_snapshots
    from tests.test_policy_properties import snapshots
    from tpu_autoscaler.adapters.snapshot_file import build_snapshot
    from tpu_autoscaler.core.policy import plan
    from tpu_autoscaler.core.snapshot import ClusterSnapshot

    plans: dict[str, Any] = {}
    quiet = settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )

    @quiet
    @given(snapshots())
    def tpu(snapshot: ClusterSnapshot) -> None:
        plans[f"random TPU {len(plans)}"] = plan(snapshot).to_json()

    @quiet
    @given(cpu_gpu_snapshots())
    def cpu_gpu(raw: dict[str, Any]) -> None:
        plans[f"random CPU/GPU {len(plans)}"] = plan(
            build_snapshot(raw, "random").snapshot
        ).to_json()

    tpu()
    cpu_gpu()
    return plans


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
    header = (
        f"{'cluster':>7} {'hosts':>6} {'bundles':>8} {'old ms':>9} {'new ms':>9} {'new/old':>8}"
    )
    print(f"old: {args.rev} ({old}); new: {args.new_rev or 'this tree'} ({new})")
    print(f"CPU time of policy.plan, min of {args.repeats} runs each, old and new alternating")
    print(header)
    print("-" * len(header), flush=True)
    for case in cases:
        planners = {"old": Planner(old, case), "new": Planner(new, case)}
        best: dict[str, float | None] = {"old": None, "new": None}
        for repeat in range(args.repeats):
            order = ("old", "new") if repeat % 2 == 0 else ("new", "old")
            for name in order:
                took = planners[name].plan_s()
                previous = best[name]
                if took is not None:
                    best[name] = took if previous is None else min(previous, took)
        for planner in planners.values():
            planner.close()
        cells = [f"{v * 1e3:>9.1f}" if v is not None else f"{'-':>9}" for v in best.values()]
        old_s, new_s = best["old"], best["new"]
        ratio = f"{new_s / old_s:>8.2f}" if old_s and new_s else f"{'-':>8}"
        cluster, hosts, bundles = case
        print(f"{cluster:>7} {hosts:>6} {bundles:>8} {cells[0]} {cells[1]} {ratio}", flush=True)
        for name, planner in planners.items():
            if planner.error is not None:
                print(f"    {name}: {planner.error}")
    return 0


def ladder(revs: list[str], args: argparse.Namespace) -> int:
    """Each of `revs` (say every commit of a branch) on each size, round robin: what
    each step changed, from the snapshot built once per revision."""
    cases = bench_cases(args.quick)
    if args.only:
        wanted = {tuple(map(int, s.split("x"))) for s in args.only}
        cases = [c for c in cases if (c[1], c[2]) in wanted]
    trees = {rev: export_tree(rev) for rev in revs}
    print(f"CPU time of policy.plan, min of {args.repeats} runs each, revisions round robin")
    for case in cases:
        planners = {rev: Planner(tree, case) for rev, tree in trees.items()}
        best: dict[str, float] = {}
        for repeat in range(args.repeats):
            order = list(planners) if repeat % 2 == 0 else list(reversed(planners))
            for rev in order:
                took = planners[rev].plan_s()
                if took is not None:
                    best[rev] = min(best.get(rev, took), took)
        for planner in planners.values():
            planner.close()
        print(f"{case[0]} {case[1]} hosts x {case[2]} bundles")
        previous: float | None = None
        for rev in revs:
            took_s = best.get(rev)
            if took_s is None:
                print(f"  {rev:>12} {'-':>9}  {planners[rev].error}")
                continue
            step = f"{took_s / previous:>6.2f} of the one before" if previous else ""
            print(f"  {rev:>12} {took_s * 1e3:>9.1f} ms {step}")
            previous = took_s
    return 0


def compare_plans(old: Path, new: Path, examples: int) -> int:
    results = {
        name: run_child(tree, ["plans", str(examples)])
        for name, tree in (("old", old), ("new", new))
    }
    for name, out in results.items():
        if "error" in out:
            print(f"{name}: {out['error']}")
            return 2
    old_plans, new_plans = results["old"]["plans"], results["new"]["plans"]
    differ = [k for k in old_plans if old_plans[k] != new_plans.get(k)]
    for key in old_plans:
        if not key.startswith("random") or key in differ:
            print(f"{'DIFFERS' if key in differ else 'same':>7}  {key}")
    randoms = [k for k in old_plans if k.startswith("random")]
    print(f"{len(randoms)} generated snapshots: {len(set(randoms) & set(differ))} differ")
    return 1 if differ or set(old_plans) != set(new_plans) else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", default="b1bb89b", help="the older revision (git)")
    parser.add_argument("--new-rev", help="the newer revision (default: this tree)")
    parser.add_argument("--repeats", type=int, default=15, help="plans per tree and size")
    parser.add_argument("--quick", action="store_true", help="bench_policy's quick sizes")
    parser.add_argument("--only", nargs="*", help="sizes as HOSTSxBUNDLES")
    parser.add_argument("--ladder", nargs="+", help="time each of these revisions instead")
    parser.add_argument("--check-plans", action="store_true", help="compare plans, not times")
    parser.add_argument(
        "--examples", type=int, default=300, help="generated snapshots of each kind to plan"
    )
    args = parser.parse_args()
    if args.ladder:
        return ladder(args.ladder, args)
    old = export_tree(args.rev)
    new = export_tree(args.new_rev) if args.new_rev else ROOT
    if args.check_plans:
        return compare_plans(old, new, args.examples)
    return compare_times(old, new, args)


if __name__ == "__main__":
    sys.exit(main())
