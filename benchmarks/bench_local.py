"""The local end-to-end scenarios under Ray 2.60's stock KubeRay autoscaler (v2) and
under ours, side by side in one run: the stock behaviour recorded, not tested.

Each scenario runs twice, `--policy ray` first and then `--policy slice`, each on a
fresh `tpu-autoscaler local` (a real Ray head, one real raylet per running pod, the
simulated control plane in real time) with the v6e 4x4 example at a 10 s idle
timeout, and the same driver timeouts for both. Only one `tpu-autoscaler local` can run
on a machine, so the runs are sequential. Prints a table and writes
benchmarks/out/local.json (raw records, with every run's full timeline) and
benchmarks/out/local.md (the table and what stock Ray did, in figures).

    .venv/bin/python benchmarks/bench_local.py [--quick] [--timeout-s 90] [--keep-logs]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tpu_autoscaler.local.harness import DriverRun, LocalRun, SeenEvent

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"
EXAMPLE = ROOT / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
IDLE_TIMEOUT_S = 10
PERIOD_S = 5.0
PINNED_HOLD_S = IDLE_TIMEOUT_S + 2 * PERIOD_S + 5
"""Past the point a per-host idle timeout fires on the actor's idle neighbours."""
REMOVAL_WAIT_S = 30.0
"""After the pinned actor exits: how long to wait for its slice to be removed."""
POLICIES = ("ray", "slice")


@dataclass(frozen=True)
class Scenario:
    name: str
    hold_s: float = 0.0
    ready_mark: str = "ready"
    wait_for_removal: bool = False


SCENARIOS = [
    Scenario("slice-placement-group"),
    Scenario("two-slices"),
    Scenario("pinned-actor", PINNED_HOLD_S, "actor-running", wait_for_removal=True),
    Scenario("busy-slice", PINNED_HOLD_S, "actor-running", wait_for_removal=True),
    Scenario("label-selector-placement-group"),
    Scenario("unservable", 3 * PERIOD_S, ready_mark=""),
]
QUICK = ("slice-placement-group", "busy-slice")
ACTOR_SCENARIOS = ("pinned-actor", "busy-slice")
"""An actor is kept through a hold: did its slice stay while it lived?"""


def write_manifest(directory: Path) -> Path:
    """The v6e 4x4 example with a short idle timeout, as the end-to-end tests use."""
    cluster: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    cluster["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = IDLE_TIMEOUT_S
    path = directory / "v6e-4x4.yaml"
    path.write_text(yaml.safe_dump(cluster))
    return path


def short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def drained_hosts(event: SeenEvent) -> int:
    """Hosts a drain line names: `hosts 0,1,2,3: AUTOSCALER_DRAIN_IDLE`."""
    found = re.match(r"hosts ([\d,]+):", event.detail)
    return len(found.group(1).split(",")) if found else 0


def busy_hosts(event: SeenEvent) -> int:
    found = re.search(r"(\d+) of them busy in Ray", event.detail)
    return int(found.group(1)) if found else 0


def run_one(
    manifest: Path, scenario: Scenario, policy: str, timeout_s: float, keep_logs: bool
) -> dict[str, Any]:
    started = time.time()
    local = LocalRun(manifest, policy=policy, extra_args=["--keep-logs"] if keep_logs else [])
    local.start()
    try:
        run = local.driver(scenario.name, timeout_s=timeout_s, hold_s=scenario.hold_s)
        driver_ended = time.time()
        if scenario.wait_for_removal and _launched(local.events):
            local.wait_for(lambda events: _all_removed(events), REMOVAL_WAIT_S)
    finally:
        code = local.stop()
    return record(local, run, scenario, policy, timeout_s, started, driver_ended, code)


def _launched(events: list[SeenEvent]) -> list[SeenEvent]:
    return [e for e in events if e.kind == "launch"]


def _all_removed(events: list[SeenEvent]) -> bool:
    launched = {e.subject for e in events if e.kind == "launch"}
    removed = {e.subject for e in events if e.kind == "removal"}
    return launched <= removed


def record(
    local: LocalRun,
    run: DriverRun,
    scenario: Scenario,
    policy: str,
    timeout_s: float,
    started: float,
    driver_ended: float,
    local_exit: int,
) -> dict[str, Any]:
    events = list(local.events)
    marks = run.marks
    submitted = marks.get("submitted", {}).get("t")
    ready_at = marks.get(scenario.ready_mark, {}).get("t") if scenario.ready_mark else None
    result = run.result
    error = result.get("error") or ""
    if not result:
        lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        error = f"driver printed no result (exit {run.returncode}): {last}"

    def since_start(event: SeenEvent) -> float:
        return round(event.wall_s - started, 1)

    launches = _launched(events)
    removals = [e for e in events if e.kind == "removal"]
    drains = [e for e in events if e.kind == "drain"]
    data: dict[str, Any] = {
        "scenario": scenario.name,
        "policy": policy,
        "timeout_s": timeout_s,
        "hold_s": scenario.hold_s,
        "wall_s": round(time.time() - started, 1),
        "driver_s": round(driver_ended - started, 1),
        "ok": bool(result.get("ok")),
        "error": short(error, 300) if error else "",
        "ready_after_s": round(ready_at - submitted, 1) if ready_at and submitted else None,
        "launches": [
            {"slice": e.subject, "hosts": e.hosts, "at_s": since_start(e)} for e in launches
        ],
        "ready": [
            {"slice": e.subject, "at_s": since_start(e)} for e in events if e.kind == "ready"
        ],
        "removals": [
            {
                "slice": e.subject,
                "hosts": e.hosts,
                "busy_hosts": busy_hosts(e),
                "at_s": since_start(e),
            }
            for e in removals
        ],
        "removed_busy": sum(busy_hosts(e) > 0 for e in removals),
        "drains": [
            {"slice": e.subject, "detail": e.detail, "at_s": since_start(e)} for e in drains
        ],
        "hosts_drained": sum(drained_hosts(e) for e in drains),
        "failed": [{"slice": e.subject, "detail": e.detail} for e in events if e.kind == "failed"],
        "infeasible": [e.subject for e in events if e.kind == "infeasible"],
        "local_exit": local_exit,
        "driver_exit": run.returncode,
        "marks": {name: round(mark["t"] - started, 1) for name, mark in marks.items()},
        "result": result,
        "driver_stderr_tail": run.stderr.strip().splitlines()[-5:],
        "state_dir": str(local.state_dir) if local.state_dir else None,
        "lines": list(local.lines),
    }
    if scenario.name in ACTOR_SCENARIOS:
        data.update(pinned(run, events, scenario, started))
    if scenario.name == "unservable":
        data["launched_anything"] = bool(launches)
        data["scheduled"] = bool(result.get("scheduled"))
    return data


def pinned(
    run: DriverRun, events: list[SeenEvent], scenario: Scenario, started: float
) -> dict[str, Any]:
    """While the actor lived: from its first answer to its exit, or to its planned end."""
    running = run.marks.get("actor-running", {}).get("t")
    if running is None:
        return {"actor_ran": False, "survived": None, "left_while_alive": []}
    end = run.marks.get("actor-exited", {}).get("t", running + scenario.hold_s)
    early = [
        f"{e.kind} {e.subject} {e.detail}"
        for e in events
        if e.kind in ("drain", "removal") and running <= e.wall_s < end
    ]
    lost = run.marks.get("actor-lost", {}).get("t")
    exited = run.marks.get("actor-exited", {}).get("t")
    after = [e for e in events if e.kind == "removal" and exited and e.wall_s >= exited]
    return {
        "actor_ran": True,
        "worker_id": (run.result.get("where") or {}).get("worker_id"),
        "survived": run.result.get("survived"),
        "lost_after_s": round(lost - running, 1) if lost else None,
        "left_while_alive": early,
        "removal_after_exit_s": round(after[0].wall_s - exited, 1) if after and exited else None,
    }


def outcome(r: dict[str, Any]) -> str:
    if r["scenario"] == "unservable":
        if r["scheduled"]:
            return "scheduled?!"
        return "pending, reported" if r["infeasible"] else "pending, not reported"
    if r["scenario"] in ACTOR_SCENARIOS and r.get("actor_ran") and not r.get("survived"):
        return f"actor lost after {r['lost_after_s']} s"
    if r["ok"]:
        return "ok"
    if "Timeout" in r["error"] or "Timed out" in r["error"]:
        return f"timed out ({r['timeout_s']:g} s)"
    return "failed"


def launched(r: dict[str, Any]) -> str:
    hosts = [launch["hosts"] for launch in r["launches"]]
    return f"{len(hosts)} ({'+'.join(map(str, hosts))} hosts)" if hosts else "0"


def notes(r: dict[str, Any]) -> str:
    parts = []
    if r["removals"]:
        parts.append(f"{len(r['removals'])} removed")
    if r["hosts_drained"]:
        parts.append(f"{r['hosts_drained']} hosts drained")
    if r["scenario"] in ACTOR_SCENARIOS and r.get("actor_ran"):
        parts.append(f"actor on worker {r['worker_id']}")
        if r["left_while_alive"]:
            parts.append(f"{len(r['left_while_alive'])} drain/removal while it lived")
        if r.get("removal_after_exit_s") is not None:
            parts.append(f"removed {r['removal_after_exit_s']} s after exit")
    if r["infeasible"]:
        parts.append("infeasible: " + "; ".join(map(demand, r["infeasible"])))
    if r["failed"]:
        parts.append(f"{len(r['failed'])} failed")
    if r["error"] and outcome(r) == "failed":
        parts.append(short(r["error"], 80))
    return ", ".join(parts) or "-"


def demand(text: str) -> str:
    """An infeasible line's demand, without the placement group's id."""
    return re.sub(r"^placement group [0-9a-f]+ \((.*)\)$", r"placement group \1", text)


COLUMNS = ["scenario", "policy", "outcome", "launched", "ready after", "removed busy", "notes"]


def row(r: dict[str, Any]) -> list[str]:
    ready = f"{r['ready_after_s']} s" if r["ready_after_s"] is not None else "-"
    busy = f"{r['removed_busy']} of {len(r['removals'])}" if r["removals"] else "-"
    return [r["scenario"], r["policy"], outcome(r), launched(r), ready, busy, notes(r)]


def markdown_table(records: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)).replace("\n", " ") + " |" for r in records]
    return "\n".join(lines)


def paragraph(scenario: str, records: list[dict[str, Any]]) -> str:
    """What stock Ray did, in figures, beside ours."""
    by = {r["policy"]: r for r in records}
    stock, ours = by.get("ray"), by.get("slice")
    text = []
    if stock:
        text.append("Stock Ray: " + describe(stock) + ".")
    if ours:
        text.append("Ours: " + describe(ours) + ".")
    return f"**{scenario}.** " + " ".join(text)


def describe(r: dict[str, Any]) -> str:
    said = []
    if r["scenario"] == "unservable":
        said.append("the task was " + ("scheduled" if r["scheduled"] else "never scheduled"))
        said.append(f"{len(r['launches'])} replicas launched")
        said.append(
            f"{len(r['infeasible'])} infeasible line(s)"
            + (f" ({'; '.join(map(demand, r['infeasible']))})" if r["infeasible"] else "")
        )
        return ", ".join(said)
    if r["ok"]:
        said.append(f"ready {r['ready_after_s']} s after submit")
    elif r["scenario"] in ACTOR_SCENARIOS and r.get("actor_ran"):
        said.append(f"the actor ran, then was lost {r['lost_after_s']} s into its hold")
    else:
        said.append(f"driver gave up after {r['driver_s']} s ({short(r['error'], 120)})")
    said.append(f"launched {launched(r)}")
    if r["removals"]:
        busy = sum(x["busy_hosts"] for x in r["removals"])
        said.append(
            f"removed {len(r['removals'])} replica(s), {r['removed_busy']} with busy hosts"
            f" ({busy} busy hosts in all)"
        )
    if r["hosts_drained"]:
        said.append(f"drained {r['hosts_drained']} hosts")
    if r.get("left_while_alive"):
        said.append(f"{len(r['left_while_alive'])} drain/removal line(s) while the actor lived")
    if r.get("removal_after_exit_s") is not None:
        said.append(f"the slice left {r['removal_after_exit_s']} s after the actor exited")
    if r["infeasible"]:
        said.append(f"reported infeasible: {'; '.join(map(demand, r['infeasible']))}")
    return ", ".join(said)


def print_table(records: list[dict[str, Any]]) -> None:
    rows = [COLUMNS] + [row(r) for r in records]
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(COLUMNS) - 1)]
    for index, cells in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1])
        if index == 0:
            print("-" * (sum(widths) + 2 * len(widths) + 5))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"only {' and '.join(QUICK)}")
    parser.add_argument("--timeout-s", type=float, default=90.0, help="each driver step's timeout")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep each run's /tmp/tpua-<pid> logs"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where local.json/.md go")
    args = parser.parse_args()

    scenarios = [s for s in SCENARIOS if not args.quick or s.name in QUICK]
    records: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        manifest = write_manifest(Path(tmp))
        for scenario in scenarios:
            for policy in POLICIES:
                r = run_one(manifest, scenario, policy, args.timeout_s, args.keep_logs)
                records.append(r)
                kept = f"  logs {r['state_dir']}" if args.keep_logs else ""
                print(
                    f"{scenario.name:32} {policy:6} {outcome(r):24} {r['wall_s']:6.1f} s{kept}",
                    flush=True,
                )
    wall = time.time() - started
    print()
    print_table(records)
    print(f"\nwall time {wall:.0f} s for {len(records)} runs")

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "manifest": str(EXAMPLE.relative_to(ROOT)),
        "idle_timeout_s": IDLE_TIMEOUT_S,
        "timeout_s": args.timeout_s,
        "quick": args.quick,
        "wall_s": round(wall, 1),
        "scenarios": [asdict(s) for s in scenarios],
    }
    (args.out / "local.json").write_text(json.dumps({**meta, "runs": records}, indent=1) + "\n")
    (args.out / "local.md").write_text(markdown(records, meta))
    print(f"wrote {args.out / 'local.json'} and {args.out / 'local.md'}")
    return 0


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    import ray

    parts = [
        "# Local end to end: Ray's stock autoscaler beside ours",
        "",
        f"`benchmarks/bench_local.py`{' --quick' if meta['quick'] else ''}: each scenario on"
        f" a fresh `tpu-autoscaler local` (real Ray {ray.__version__} head and raylets,"
        f" simulated control plane in real time), `{meta['manifest']}` with"
        f" idleTimeoutSeconds {meta['idle_timeout_s']}, driver timeouts"
        f" {meta['timeout_s']:g} s for both policies. `ray` is Ray's stock KubeRay"
        " autoscaler v2, `slice` is ours. Wall time"
        f" {meta['wall_s']:.0f} s. Times are seconds from the driver's submit.",
        "",
        markdown_table(records),
        "",
    ]
    for scenario in dict.fromkeys(r["scenario"] for r in records):
        parts += [paragraph(scenario, [r for r in records if r["scenario"] == scenario]), ""]
    stock = [r for r in records if r["policy"] == "ray"]
    if stock and all(not r["launches"] and r["infeasible"] for r in stock):
        parts += [WHY_NOTHING, ""]
    return "\n".join(parts)


WHY_NOTHING = (
    "Why stock Ray launched nothing: every scenario selects hosts by label"
    " (`ray.io/tpu-pod-type`, and `ray.io/tpu-worker-id` for the slice head and the pinned"
    " actor). Ray 2.60's KubeRay config gives a worker group only the labels written in"
    " its spec's `labels` field (`_get_labels_from_group_spec` in"
    " ray/autoscaler/_private/kuberay/autoscaling_config.py), here none, although Ray puts"
    " the TPU labels on each raylet when it starts; the v2 scheduler refuses a request on"
    " a node type whose labels do not satisfy its selector (`_try_schedule_one` in"
    " ray/autoscaler/v2/scheduler.py), so each request is reported infeasible and no"
    " replica is requested. The worker id differs per host, so no group label could"
    " satisfy it. Ray's own warning for the placement groups names only their resources"
    " (`{'TPU-v6e-16-head': 1.0}*1`, which the node type has), not the selectors."
)


if __name__ == "__main__":
    sys.exit(main())
