"""`tpu-autoscaler whatif`: settings parsed and applied, the Pareto front, a sweep that
resumes and keeps only finished runs, and the same result for a run wherever it runs
(this process, another process with another hash seed, a Ray worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tpu_autoscaler.cli import main
from tpu_autoscaler.core.capacity import WARM_REPLICAS_ANNOTATION
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.sim.provisioning import RAYLET_START_S
from tpu_autoscaler.sim.workload import Workload, load_workload
from tpu_autoscaler.whatif.report import pareto_front, summarize
from tpu_autoscaler.whatif.settings import Setting, apply_setting, grid, parse_axis
from tpu_autoscaler.whatif.simulation import RunSpec, simulate_run
from tpu_autoscaler.whatif.sweep import Finished, in_process, on_ray, read_results, run_sweep

ROOT = Path(__file__).parent.parent
V6E = ROOT / "examples/clusters/v6e-4x4-multihost.yaml"
RL = ROOT / "examples/clusters/rl-disaggregated.yaml"
TRAINING_DAY = ROOT / "examples/workloads/training-day.yaml"
BURSTS = ROOT / "examples/workloads/quarter-hour-bursts.yaml"


def manifest(path: Path = V6E) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    return raw


def spec(setting: tuple[tuple[str, str], ...] = (), seed: int = 0) -> RunSpec:
    trace = load_workload(str(BURSTS)).model_dump(mode="json")
    return RunSpec(manifest(), trace, setting, "slice", seed, "realistic", 1200.0)


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("vary", "named"),
    [
        ("maxReplica=1,2", "'maxReplica' is not a key"),
        ("nope.maxReplicas=1", "no worker group 'nope'"),
        ("tpu-v6e-group.provisioningDelay=5", "applies to the whole run"),
        ("tpu-v6e-group.scaleDownDelay=600", "applies to the whole run"),
        ("maxReplicas=one", "value 'one'"),
        ("provisioningDelay=90-30", "value '90-30'"),
        ("stockoutScale=-1", "value '-1'"),
        ("hostStagger=soon", "value 'soon': give seconds"),
        ("maxReplicas=", "give KEY=V1,V2"),
    ],
)
def test_a_bad_axis_is_named(vary: str, named: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_axis(vary, ["tpu-v6e-group"])
    assert named in str(caught.value)
    assert f"--vary {vary}" in str(caught.value)


@pytest.mark.parametrize(
    ("vary", "problem"),
    [
        ("provisioningDelay=30", None),
        ("provisioningDelay=30-45", None),
        ("provisioningDelay=45-30", "give seconds >= 0, S or MIN-MAX, e.g. 60-180"),
        ("provisioningDelay=soon", "give seconds >= 0, S or MIN-MAX, e.g. 60-180"),
        ("stockoutScale=0", None),
        ("stockoutScale=1.5", None),
        ("stockoutScale=-0.5", "give a factor >= 0, e.g. 0, 1, 2"),
        ("stockoutScale=x", "give a factor >= 0, e.g. 0, 1, 2"),
        ("hostStagger=0", None),
        ("hostStagger=7.5", None),
        ("hostStagger=-1", "give seconds >= 0"),
        ("hostStagger=soon", "give seconds >= 0"),
        ("scaleDownDelay=600", None),
        ("scaleDownDelay=0", None),
        ("scaleDownDelay=-60", "give seconds >= 0"),
        ("scaleDownDelay=10m", "give seconds >= 0"),
        ("maxReplicas=0", None),
        ("maxReplicas=1.5", "give a whole number >= 0"),
    ],
)
def test_each_keys_values_are_checked_with_the_keys_own_words(
    vary: str, problem: str | None
) -> None:
    if problem is None:
        assert parse_axis(vary, ["g"]).values == (vary.partition("=")[2],)
        return
    with pytest.raises(ManifestError) as caught:
        parse_axis(vary, ["g"])
    assert str(caught.value).endswith(f"value {vary.partition('=')[2]!r}: {problem}")


def test_the_grid_is_every_combination_first_axis_slowest() -> None:
    axes = [
        parse_axis("maxReplicas=1,2", ["g"]),
        parse_axis("g.idleTimeoutSeconds=0,60,600", ["g"]),
    ]
    settings = grid(axes)
    assert len(settings) == 6
    assert settings[0].values == (("maxReplicas", "1"), ("g.idleTimeoutSeconds", "0"))
    assert settings[3].values == (("maxReplicas", "2"), ("g.idleTimeoutSeconds", "0"))
    with pytest.raises(ManifestError, match="given twice"):
        grid([axes[0], axes[0]])


def test_group_settings_change_only_their_group_and_leave_the_input_alone() -> None:
    raw = manifest(RL)
    before = json.dumps(raw, sort_keys=True)
    groups = [g["groupName"] for g in raw["spec"]["workerGroupSpecs"]]
    trace = Workload(items=[])
    setting = Setting(
        ((f"{groups[0]}.maxReplicas", "7"), ("warmReplicas", "1"), ("idleTimeoutSeconds", "30"))
    )
    changed, _ = apply_setting(raw, trace, setting)
    specs = {g["groupName"]: g for g in changed["spec"]["workerGroupSpecs"]}
    assert specs[groups[0]]["maxReplicas"] == 7
    assert specs[groups[1]]["maxReplicas"] == raw["spec"]["workerGroupSpecs"][1]["maxReplicas"]
    for group in groups:
        assert specs[group]["idleTimeoutSeconds"] == 30
        annotations = specs[group]["template"]["metadata"]["annotations"]
        assert annotations[WARM_REPLICAS_ANNOTATION] == "1"
    assert json.dumps(raw, sort_keys=True) == before


def test_run_settings_change_the_trace() -> None:
    trace = load_workload(str(TRAINING_DAY))
    (stockout,) = [f for f in trace.faults if f.stockout]
    assert stockout.stockout is not None
    window_s = stockout.stockout.until - stockout.at
    setting = Setting(
        (
            ("provisioningDelay", "30-45"),
            ("capacity", "3"),
            ("stockoutScale", "2"),
            ("hostStagger", "7.5"),
            ("scaleDownDelay", "600"),
        )
    )
    _, changed = apply_setting(manifest(), trace, setting)
    assert (changed.provisioning.delay_s.min, changed.provisioning.delay_s.max) == (30, 45)
    assert changed.provisioning.host_stagger_s == 7.5
    assert trace.provisioning.scale_down_delay_s == 0  # the trace itself left as it was
    assert changed.provisioning.scale_down_delay_s == 600
    assert changed.provisioning.capacity == {"tpu-v6e-group": 3}
    (scaled,) = [f for f in changed.faults if f.stockout]
    assert scaled.stockout is not None
    assert scaled.stockout.until - scaled.at == 2 * window_s
    assert [f for f in changed.faults if f.host_failure] == [
        f for f in trace.faults if f.host_failure
    ]
    raw = manifest(RL)
    first = raw["spec"]["workerGroupSpecs"][0]["groupName"]
    _, scoped = apply_setting(raw, trace, Setting(((f"{first}.capacity", "2"),)))
    assert scoped.provisioning.capacity == {first: 2}
    _, dropped = apply_setting(manifest(), trace, Setting((("stockoutScale", "0"),)))
    assert not [f for f in dropped.faults if f.stockout]


# --- the Pareto front ---------------------------------------------------------------------

points = st.lists(
    st.tuples(st.integers(0, 20).map(float), st.integers(0, 20).map(float)), max_size=12
)


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a != b


@given(points)
def test_the_front_is_exactly_the_undominated_points(pts: list[tuple[float, float]]) -> None:
    front = pareto_front(pts)
    for i, p in enumerate(pts):
        beaten = any(dominates(q, p) for q in pts)
        assert (i in front) == (not beaten)
    if pts:
        assert front, "a non-empty set has a front"


def test_summarize_averages_seeds_and_marks_the_front() -> None:
    def row(setting: str, seed: int, idle: float, p95: float) -> dict[str, Any]:
        summary = {
            "idle_chip_hours": idle,
            "busy_chip_hours": 1.0,
            "demand_wait_s": {"p50": 1.0, "p95": p95},
            "unsatisfied_at_end": 0,
            "slices_launched": seed + 1,
            "scale_flaps": 0,
            "reservations_failed": 0,
        }
        return {"setting": [["k", setting]], "policy": "slice", "seed": seed, "summary": summary}

    results = summarize([row("a", 0, 1.0, 100.0), row("a", 1, 3.0, 300.0), row("b", 0, 5.0, 500.0)])
    assert [(r.label, r.seeds, r.idle_chip_hours, r.wait_p95_s, r.launches) for r in results] == [
        ("k=a", 2, 2.0, 200.0, 1.5),
        ("k=b", 1, 5.0, 500.0, 1.0),
    ]
    assert [r.pareto for r in results] == [True, False]


# --- sweeps: resumed, failures left for a rerun ----------------------------------------------


def counting(asked: list[RunSpec]) -> Any:
    def execute(specs: list[RunSpec]) -> Iterator[Finished]:
        asked.extend(specs)
        yield from in_process(specs)

    return execute


def test_a_sweep_resumes_after_a_torn_write_and_runs_only_what_is_missing(
    tmp_path: Path,
) -> None:
    results = tmp_path / "r.jsonl"
    specs = [spec((("maxReplicas", m), ("idleTimeoutSeconds", "30"))) for m in ("1", "2")]
    first = run_sweep(specs, results, in_process, progress=False)
    assert first.ran == 2
    lines = results.read_text().splitlines()
    # The driver died while writing the second row: half of it is on disk.
    results.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    asked: list[RunSpec] = []
    again = run_sweep(specs, results, counting(asked), progress=False)
    assert [s.setting for s in asked] == [specs[1].setting]
    assert (again.ran, again.skipped) == (1, 1)
    assert [r["summary"] for r in again.rows] == [r["summary"] for r in first.rows]
    assert len(read_results(results)) == 2
    # Rows read back name their setting as fresh ones do: one line per setting.
    assert summarize(again.rows) == summarize(first.rows)
    assert [r.label for r in summarize(again.rows)] == [
        "maxReplicas=1 idleTimeoutSeconds=30",
        "maxReplicas=2 idleTimeoutSeconds=30",
    ]


def test_a_changed_trace_is_not_taken_for_a_finished_run(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    run_sweep([spec()], results, in_process, progress=False)
    longer = RunSpec(**{**spec().__dict__, "duration_s": 1300.0})
    asked: list[RunSpec] = []
    run_sweep([longer], results, counting(asked), progress=False)
    assert asked == [longer]


def test_a_run_ray_gave_up_on_is_not_recorded_and_a_rerun_retries_it(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    specs = [spec(seed=0), spec(seed=1)]

    def worker_died_on_seed_1(pending: list[RunSpec]) -> Iterator[Finished]:
        for s in pending:
            if s.seed == 1:
                yield s, {"error": "WorkerCrashedError after 3 retries"}, 0.0
            else:
                yield from in_process([s])

    outcome = run_sweep(specs, results, worker_died_on_seed_1, progress=False)
    assert len(outcome.failed) == 1 and "seed 1" in outcome.failed[0]
    assert [r["seed"] for r in read_results(results).values()] == [0]
    asked: list[RunSpec] = []
    run_sweep(specs, results, counting(asked), progress=False)
    assert [s.seed for s in asked] == [1]


# --- deterministic wherever it runs ----------------------------------------------------------


def test_a_slice_waits_for_its_last_host_over_the_host_stagger_swept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slice placement group waits for every host of its slice: in the ideal world,
    the provisioning delay and the raylet's start, plus the spread of its hosts; and
    `simulate` of the trace that gives the stagger waits as the sweep's run."""
    trace = Workload.model_validate(
        {
            "items": [
                {
                    "at": 0,
                    "duration": 60,
                    "slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"},
                }
            ],
            "provisioning": {"delay_s": {"min": 10, "max": 10}},
        }
    ).model_dump(mode="json")
    waits = {
        stagger: simulate_run(
            RunSpec(manifest(), trace, (("hostStagger", stagger),), "slice", 0, "ideal", 600.0)
        )["demand_wait_s"]["p50"]
        for stagger in ("0", "40")
    }
    assert waits["0"] >= 10 + RAYLET_START_S
    # The last of four hosts drawn over 40 s: 32 s later on average, 40 at most.
    assert waits["0"] + 10 < waits["40"] <= waits["0"] + 40
    given = tmp_path / "trace.yaml"
    given.write_text(
        yaml.safe_dump({**trace, "provisioning": {**trace["provisioning"], "host_stagger_s": 40}})
    )
    args = ["simulate", "--cluster", str(V6E), "--workload", str(given), "--world", "ideal"]
    assert main([*args, "--duration-s", "600", "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["demand_wait_s"]["p50"] == waits["40"]


def test_a_run_is_the_same_in_another_process_with_another_hash_seed() -> None:
    run = spec((("idleTimeoutSeconds", "30"),), seed=3)
    here = simulate_run(run)
    assert "decision_ms" not in here
    code = (
        "import json, sys\n"
        "from tpu_autoscaler.whatif.simulation import RunSpec, simulate_run\n"
        "args = json.load(sys.stdin)\n"
        "args['setting'] = tuple(tuple(kv) for kv in args['setting'])\n"
        "print(json.dumps(simulate_run(RunSpec(**args))))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    there = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(run.__dict__),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(there.stdout) == here


def test_whatif_cli_prints_a_row_per_setting_and_draws_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["whatif", "--cluster", str(V6E), "--workload", str(BURSTS), "--workers", "0"]
    args += ["--vary", "maxReplicas=1,2", "--duration-s", "900", "--output", "json"]
    args += ["--results", str(tmp_path / "r.jsonl"), "--plot", str(tmp_path / "p.png")]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows] == ["maxReplicas=1", "maxReplicas=2"]
    assert (tmp_path / "p.png").stat().st_size > 0


def test_whatif_cli_refuses_a_setting_the_manifest_rules_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["whatif", "--cluster", str(V6E), "--workload", str(BURSTS), "--workers", "0"]
    args += ["--vary", "minReplicas=3", "--results", str(tmp_path / "r.jsonl")]
    assert main(args) == 2
    assert "--vary minReplicas=3" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.ray_e2e
def test_ray_workers_compute_what_this_process_computes(tmp_path: Path) -> None:
    specs = [spec((("maxReplicas", m),), seed) for m in ("1", "2") for seed in (0, 1)]
    on_ray_rows = run_sweep(specs, tmp_path / "ray.jsonl", on_ray(None, 2), progress=False).rows
    here_rows = run_sweep(specs, tmp_path / "here.jsonl", in_process, progress=False).rows
    assert [r["summary"] for r in on_ray_rows] == [r["summary"] for r in here_rows]
    assert [r["key"] for r in on_ray_rows] == [s.key for s in specs]


def test_both_policies_are_an_axis_and_a_bad_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["whatif", "--cluster", str(V6E), "--workload", str(BURSTS), "--workers", "0"]
    args += ["--duration-s", "600", "--output", "json", "--results", str(tmp_path / "r.jsonl")]
    assert main([*args, "--policy", "slice,ray"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["setting"], r["policy"]) for r in rows] == [
        ("as given", "slice"),
        ("as given", "ray"),
    ]
    assert main([*args, "--policy", "slice,kuberay"]) == 2
    assert "--policy" in capsys.readouterr().err
