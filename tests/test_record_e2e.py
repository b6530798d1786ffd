"""`record` against real raylets: `tpu-autoscaler local` runs a known job mix
(`record_job_mix.py`), `record` reads the GCS and writes a trace, and (1) the trace
holds that mix, arrivals within a second and a half of what the driver saw and run
times from the function body's to five seconds more (Ray counts from dispatch), and
(2) `simulate` of the trace launches within one slice of what the real run launched,
its p50 and p95 waits for capacity are within max(10 s, 25 %) of the waits on the
real raylets, and its slices come up (pods created to last host in Ray, p50) within
max(5 s, 25 %) of the real ones. `record` measures from Ray how far apart one
slice's hosts came up (the trace's `host_stagger_s`), and the provisioning delay from
each slice's pods created (the autoscaler's `ReplicaUp` Events, read from local's API
server) to its first host in Ray, less the simulator's own raylet start
(`RAYLET_START_S`); the test checks that delay against its own reading, from the
launch lines `local` printed. The simulation runs in the ideal world, whose other
timings (pod creation, deletion grace) are instant, as local mode's nearly are.

Set TPUA_RECORD_KEEP=DIR to keep the trace, the history and the figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_autoscaler.cli import main
from tpu_autoscaler.local.harness import LocalRun, SeenEvent
from tpu_autoscaler.record.history import History, launches_up
from tpu_autoscaler.sim.metrics import quantiles
from tpu_autoscaler.sim.provisioning import RAYLET_START_S

pytestmark = pytest.mark.ray_e2e

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
IDLE_TIMEOUT_S = 10
RECORDED_WITHIN_S = 1.5
WORKER_START_S = 5.0
"""Ray counts a task running from dispatch to its worker, which on this loaded 2-core
machine starts the function body up to a few seconds later: the capacity was held."""
LAUNCHES_WITHIN = 1
DELAY_WITHIN_S = 3.0
SLICE_UP_TOLERANCE_S, SLICE_UP_TOLERANCE = 5.0, 0.25
WAIT_TOLERANCE_S, WAIT_TOLERANCE = 10.0, 0.25


def close(simulated: float, real: float) -> bool:
    return abs(simulated - real) <= max(WAIT_TOLERANCE_S, WAIT_TOLERANCE * real)


def test_recorded_trace_reproduces_the_job_mix_and_simulates_like_the_real_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    cluster["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = IDLE_TIMEOUT_S
    manifest = tmp_path / "v6e-4x4.yaml"
    manifest.write_text(yaml.safe_dump(cluster))
    with LocalRun(manifest, provision_delay_s=5.0) as local:
        driver = subprocess.run(
            [sys.executable, str(ROOT / "tests/record_job_mix.py"), local.address],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        # Ray forwards its processes' output to the driver's (a raylet's dying stack
        # trace among it): the mix's figures are the last JSON line.
        (*_, truth_line) = (line for line in driver.stdout.splitlines() if line.startswith('{"'))
        truth = json.loads(truth_line)
        trace, history = tmp_path / "trace.yaml", tmp_path / "history.json"
        args = ["record", "--gcs-address", local.address, "--cluster", str(manifest)]
        args += ["--cluster-name", cluster["metadata"]["name"], "--kube-host", local.kube_url]
        args += ["-o", str(trace), "--history-output", str(history), "--no-progress"]
        assert main(args) == 0
        launches = local.of_kind("launch")
    recorded = History.model_validate_json(history.read_text())
    ups = recorded.slices_up

    def first_host_s(launch: SeenEvent) -> float | None:
        """A slice's name is reused by later launches: each launch's hosts are the
        first to come up under its name after it."""
        starts_s = [up.hosts_started_ms[0] / 1000 for up in ups if up.slice_name == launch.subject]
        return min((s for s in starts_s if s >= launch.wall_s), default=None)

    firsts_s = [first - e.wall_s for e in launches if (first := first_host_s(e)) is not None]
    delays = [max(0.0, first_s - RAYLET_START_S) for first_s in firsts_s]
    trace_yaml = yaml.safe_load(trace.read_text())
    # Every launch told once it came up, and the delay measured from the pods' creation,
    # which follows the launch line by what local's KubeRay and its printing take.
    assert len(recorded.slices_launched) == len(launches), recorded.slices_launched
    measured = trace_yaml["provisioning"]["delay_s"]
    assert abs(measured["min"] - min(delays)) <= DELAY_WITHIN_S, (measured, delays)
    assert abs(measured["max"] - max(delays)) <= DELAY_WITHIN_S, (measured, delays)
    capsys.readouterr()
    keep = os.environ.get("TPUA_RECORD_KEEP")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for path in (trace, history, manifest):
            shutil.copy(path, keep)
        Path(keep, "truth.json").write_text(json.dumps(truth, indent=1))
        Path(keep, "timeline.txt").write_text("\n".join(local.lines))

    # (1) The trace is the mix.
    items = yaml.safe_load(trace.read_text())["items"]
    start = min(
        truth["slice"]["submitted"], truth["actor"]["submitted"], truth["tasks"][0]["submitted"]
    )
    spg = [i for i in items if "slice_placement_group" in i]
    tasks = [i for i in items if "task" in i]
    actors = [i for i in items if "actor" in i]
    assert len(spg) == 1 and len(actors) == 1 and sum(i.get("count", 1) for i in tasks) == 4
    assert len(items) == len(spg) + len(tasks) + len(actors)
    assert spg[0]["slice_placement_group"] == {"topology": "4x4", "accelerator_version": "v6e"}
    assert tasks[0]["task"]["label_selector"] == {"ray.io/tpu-pod-type": "v6e-16"}
    for item, seen in [(spg[0], truth["slice"]), (actors[0], truth["actor"])] + [
        (t, truth["tasks"][0]) for t in tasks
    ]:
        assert abs(item["at"] - (seen["submitted"] - start)) <= RECORDED_WITHIN_S, item
        body_s = seen["ended"] - seen["placed"]
        assert body_s - RECORDED_WITHIN_S <= item["duration"] <= body_s + WORKER_START_S, item

    # (2) Simulated, it behaves as the real run did.
    real_waits = [truth["slice"]["placed"] - truth["slice"]["submitted"]]
    real_waits += [t["placed"] - t["submitted"] for t in truth["tasks"]]
    real_waits += [truth["actor"]["placed"] - truth["actor"]["submitted"]]
    real = quantiles(real_waits)
    # Each slice's pods created to its last host in Ray, as the GCS timed the hosts.
    real_up = quantiles(
        [
            (up.hosts_started_ms[-1] - launch.first_pod_created_ms) / 1000
            for launch, up in launches_up(recorded.slices_launched, ups)
        ]
    )
    args = ["simulate", "--cluster", str(manifest), "--workload", str(trace), "--output", "json"]
    assert main([*args, "--world", "ideal"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    figures = {
        "launches": {"real": len(launches), "simulated": simulated["slices_launched"]},
        "wait_p50_s": {"real": real["p50"], "simulated": simulated["demand_wait_s"]["p50"]},
        "wait_p95_s": {"real": real["p95"], "simulated": simulated["demand_wait_s"]["p95"]},
        "launch_to_first_host_s": [round(d, 1) for d in firsts_s],
        "delay_s": {"measured": measured, "from_launch_lines": [round(d, 1) for d in delays]},
        "host_stagger_s": trace_yaml["provisioning"]["host_stagger_s"],
        "slice_up_p50_s": {"real": real_up["p50"], "simulated": simulated["slice_up_s"]["p50"]},
    }
    keep = os.environ.get("TPUA_RECORD_KEEP")
    if keep:
        Path(keep, "figures.json").write_text(json.dumps(figures, indent=1))
    launches_off = figures["launches"]["simulated"] - figures["launches"]["real"]
    assert abs(launches_off) <= LAUNCHES_WITHIN, figures
    assert close(simulated["demand_wait_s"]["p50"], real["p50"]), figures
    assert close(simulated["demand_wait_s"]["p95"], real["p95"]), figures
    # The delay and the hosts' spread recorded bring the simulated slices up as the
    # real ones came.
    assert abs(simulated["slice_up_s"]["p50"] - real_up["p50"]) <= max(
        SLICE_UP_TOLERANCE_S, SLICE_UP_TOLERANCE * real_up["p50"]
    ), figures
