"""`whatif --price GROUP=PRICE`: prices checked against the manifest's groups, a run's
chip-hours charged at its groups' prices, and the front of cost against p95 wait,
which can differ from the front of idle chip-hours where groups' prices differ."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tpu_autoscaler.cli import main
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.whatif.prices import UnpricedResults, parse_prices, run_cost
from tpu_autoscaler.whatif.report import render_table, summarize
from tpu_autoscaler.whatif.sweep import read_results

ROOT = Path(__file__).parent.parent
SPOT = ROOT / "examples/clusters/v6e-4x4-spot-and-on-demand.yaml"
CHURN = ROOT / "examples/workloads/spot-churn.yaml"
CHIPS = {"spot": 4, "on-demand": 4, "cpu": 0}


def test_prices_are_read_per_group() -> None:
    prices = parse_prices(["spot=1.2", "on-demand= 3"], CHIPS)
    assert prices == {"spot": 1.2, "on-demand": 3.0}
    assert parse_prices([], CHIPS) is None


def test_a_group_without_tpu_chips_needs_no_price_but_may_have_one() -> None:
    assert parse_prices(["spot=1", "on-demand=3"], CHIPS) == {"spot": 1.0, "on-demand": 3.0}
    assert parse_prices(["spot=1", "on-demand=3", "cpu=0"], CHIPS) == {
        "spot": 1.0,
        "on-demand": 3.0,
        "cpu": 0.0,
    }


@pytest.mark.parametrize(
    ("specs", "where", "says"),
    [
        (["spot"], "--price spot", "give GROUP=PRICE"),
        (["=1", "on-demand=3"], "--price =1", "give GROUP=PRICE"),
        (["spot=", "on-demand=3"], "--price spot=", "give GROUP=PRICE"),
        (["gpu=1", "spot=1", "on-demand=3"], "--price gpu=1", "no worker group 'gpu'"),
        (["spot=cheap", "on-demand=3"], "--price spot=cheap", "'cheap' is not a number"),
        (["spot=1=2", "on-demand=3"], "--price spot=1=2", "'1=2' is not a number"),
        (["spot=-1", "on-demand=3"], "--price spot=-1", "finite price of 0 or more"),
        (["spot=inf", "on-demand=3"], "--price spot=inf", "finite price of 0 or more"),
        (["spot=nan", "on-demand=3"], "--price spot=nan", "finite price of 0 or more"),
        (["spot=1", "spot=2", "on-demand=3"], "--price spot=2", "priced twice"),
        (["spot=1"], "--price", "no price for group 'on-demand'"),
    ],
)
def test_a_bad_price_is_named(specs: list[str], where: str, says: str) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_prices(specs, CHIPS)
    problems = raised.value.problems
    assert [(p.path, says in p.message) for p in problems] == [(where, True)], problems


def test_every_bad_price_is_named_at_once() -> None:
    with pytest.raises(ManifestError) as raised:
        parse_prices(["spot", "tpu=1", "spot=x", "on-demand=-2"], CHIPS)
    problems = raised.value.problems
    assert [p.path for p in problems] == [
        "--price spot",
        "--price tpu=1",
        "--price spot=x",
        "--price on-demand=-2",
    ]
    assert problems[1].message == "no worker group 'tpu'; groups: spot, on-demand, cpu"


def _summary(
    busy: dict[str, float],
    idle: dict[str, float],
    p95: float,
    unregistered: dict[str, float] | None = None,
) -> dict[str, Any]:
    unregistered = unregistered or {}
    return {
        "idle_chip_hours": round(sum(idle.values()), 2),
        "busy_chip_hours": round(sum(busy.values()), 2),
        "unregistered_chip_hours": round(sum(unregistered.values()), 2),
        "busy_chip_hours_by_group": busy,
        "idle_chip_hours_by_group": idle,
        "unregistered_chip_hours_by_group": unregistered,
        "demand_wait_s": {"p50": 0.0, "p95": p95},
        "unsatisfied_at_end": 0,
        "slices_launched": 1,
        "scale_flaps": 0,
        "reservations_failed": 0,
    }


def test_a_run_costs_its_groups_chip_hours_busy_idle_and_unregistered_at_their_prices() -> None:
    summary = _summary({"spot": 10.0, "on-demand": 2.0}, {"spot": 4.0, "on-demand": 1.0}, 60)
    assert run_cost(summary, {"spot": 1.0, "on-demand": 3.0}) == pytest.approx(14.0 + 9.0)
    # VMs up without a Ray node (booting, drained, failed) are billed as much.
    summary["unregistered_chip_hours_by_group"] = {"spot": 0.5, "on-demand": 0.25}
    assert run_cost(summary, {"spot": 1.0, "on-demand": 3.0}) == pytest.approx(24.25)
    with pytest.raises(UnpricedResults, match="'cpu' has chip-hours but no price"):
        run_cost(_summary({}, {}, 60, {"cpu": 1.0}), {"spot": 1.0})
    # A group with no chip-hours needs no price, and the groups after it still count.
    assert run_cost(_summary({"spot": 2.0}, {"on-demand": 0.0}, 60), {"spot": 0.5}) == 1.0
    assert run_cost(_summary({"on-demand": 0.0, "spot": 2.0}, {}, 60), {"spot": 0.5}) == 1.0


def test_results_that_cannot_be_priced_say_why() -> None:
    for key in ("busy_chip_hours_by_group", "unregistered_chip_hours_by_group"):
        older = _summary({"spot": 1.0}, {}, 60)
        del older[key]
        with pytest.raises(UnpricedResults, match="older tpu-autoscaler"):
            run_cost(older, {"spot": 1.0})
    with pytest.raises(UnpricedResults, match="'on-demand' has chip-hours but no price"):
        run_cost(_summary({"on-demand": 1.0}, {}, 60), {"spot": 1.0})
    with pytest.raises(UnpricedResults, match="'on-demand' has chip-hours but no price"):
        run_cost(_summary({}, {"on-demand": 1.0}, 60), {"spot": 1.0})


def test_priced_the_front_is_of_cost_and_can_differ_from_the_idle_chip_hours_one() -> None:
    def row(setting: str, seed: int, summary: dict[str, Any]) -> dict[str, Any]:
        return {"setting": [["k", setting]], "policy": "slice", "seed": seed, "summary": summary}

    busy = {"spot": 5.0, "on-demand": 5.0}
    # Same wait: "spot" leaves 4 spot chip-hours idle, "on-demand" 2 on-demand ones.
    rows = [
        row("spot", 0, _summary(busy, {"spot": 4.0}, 100.0)),
        row("spot", 1, _summary(busy, {"spot": 2.0}, 100.0)),
        row("on-demand", 0, _summary(busy, {"on-demand": 2.0}, 100.0)),
    ]
    unpriced = summarize(rows)
    assert [(r.label, r.cost, r.pareto) for r in unpriced] == [
        ("k=spot", None, False),
        ("k=on-demand", None, True),
    ]
    priced = summarize(rows, {"spot": 1.0, "on-demand": 3.0})
    # The mean over seeds: (5 + 15 + 4) and (5 + 15 + 2) for spot, 5 + 15 + 6 on-demand.
    assert [(r.label, r.cost, r.pareto) for r in priced] == [
        ("k=spot", 23.0, True),
        ("k=on-demand", 26.0, False),
    ]
    assert [r.idle_chip_hours for r in priced] == [r.idle_chip_hours for r in unpriced]
    assert "COST" not in render_table(unpriced)
    header, first, second = (
        re.split(r"\s{2,}", line) for line in render_table(priced).splitlines()
    )
    assert header[3:7] == ["IDLE CHIP-H", "BUSY CHIP-H", "UNREG CHIP-H", "COST"]
    assert (first[0], first[6], first[-1]) == ("k=spot", "23.00", "*")
    assert (second[0], second[6]) == ("k=on-demand", "26.00")
    assert len(second) == len(header) - 1  # off the front: no mark, nothing after FAILED
    assert [r.to_json()["cost"] for r in priced] == [23.0, 26.0]
    assert all("cost" not in r.to_json() for r in unpriced)


def test_the_table_and_json_name_every_figure() -> None:
    busy = {"spot": 5.0}
    summary = _summary(busy, {}, 90.0, {"spot": 0.25})
    row = {"setting": [], "policy": "ray", "seed": 0, "summary": summary}
    (unpriced,) = summarize([row])
    (priced,) = summarize([row], {"spot": 2.0})
    assert unpriced.to_json() == {
        "setting": "as given",
        "policy": "ray",
        "seeds": 1,
        "idle_chip_hours": 0.0,
        "busy_chip_hours": 5.0,
        "unregistered_chip_hours": 0.25,
        "wait_p50_s": 0.0,
        "wait_p95_s": 90.0,
        "unserved": 0.0,
        "launches": 1.0,
        "flaps": 0.0,
        "failed": 0.0,
        "pareto": True,
    }
    assert priced.to_json() == {**unpriced.to_json(), "cost": 10.5}
    newer = {**row, "seed": 1, "summary": summary | {"idle_chip_hours": 1}}
    del row["summary"]["unregistered_chip_hours"]  # as an older tpu-autoscaler wrote it
    (older,) = summarize([row, newer])  # a mean of one seed's would pass for both's
    assert older.unregistered_chip_hours is None and older.idle_chip_hours == 0.5
    table = render_table([priced, unpriced, older])
    lines = [re.split(r"\s{2,}", line) for line in table.splitlines()]
    waits_on = ["0.0", "90.0", "0", "1", "0", "0", "*"]
    assert lines == [
        [
            *("SETTING", "POLICY", "SEEDS", "IDLE CHIP-H", "BUSY CHIP-H", "UNREG CHIP-H"),
            *("COST", "WAIT P50 S", "WAIT P95 S", "UNSERVED", "LAUNCHES", "FLAPS", "FAILED"),
            "PARETO",
        ],
        ["as given", "ray", "1", "0.00", "5.00", "0.25", "10.50", *waits_on],
        ["as given", "ray", "1", "0.00", "5.00", "0.25", "-", *waits_on],
        ["as given", "ray", "2", "0.50", "5.00", "-", "-", *waits_on],
    ]


def test_whatif_cli_prices_each_groups_chips_from_the_runs_it_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    args = ["whatif", "--cluster", str(SPOT), "--workload", str(CHURN), "--workers", "0"]
    args += ["--vary", "on-demand.maxReplicas=1,2", "--output", "json"]
    args += ["--results", str(results), "--plot", str(tmp_path / "p.png")]
    assert main([*args, "--price", "spot=1", "--price", "on-demand=3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    kept = list(read_results(results).values())
    assert len(rows) == 2 and len(kept) == 2
    for row, run in zip(rows, kept, strict=True):
        busy = run["summary"]["busy_chip_hours_by_group"]
        idle = run["summary"]["idle_chip_hours_by_group"]
        unregistered = run["summary"]["unregistered_chip_hours_by_group"]
        assert busy["spot"] > 0 and busy["on-demand"] > 0  # both groups ran work
        assert unregistered["spot"] > 0 and unregistered["on-demand"] > 0  # both booted
        spot = busy["spot"] + idle.get("spot", 0.0) + unregistered["spot"]
        on_demand = busy["on-demand"] + idle.get("on-demand", 0.0) + unregistered["on-demand"]
        assert row["cost"] == pytest.approx(round(1 * spot + 3 * on_demand, 2))
    assert (tmp_path / "p.png").stat().st_size > 0
    # Other prices from the same results: nothing runs again, the costs follow.
    assert main([*args, "--price", "spot=0", "--price", "on-demand=1"]) == 0
    repriced = json.loads(capsys.readouterr().out)
    for row, run in zip(repriced, kept, strict=True):
        on_demand = run["summary"]["busy_chip_hours_by_group"]["on-demand"]
        on_demand += run["summary"]["idle_chip_hours_by_group"].get("on-demand", 0)
        on_demand += run["summary"]["unregistered_chip_hours_by_group"]["on-demand"]
        assert row["cost"] == pytest.approx(round(on_demand, 2))
    assert len(results.read_text().splitlines()) == 2


def test_whatif_cli_refuses_bad_prices_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    args = ["whatif", "--cluster", str(SPOT), "--workload", str(CHURN), "--workers", "0"]
    args += ["--results", str(results)]
    assert main([*args, "--price", "spot=1"]) == 2
    assert "no price for group 'on-demand'" in capsys.readouterr().err
    assert main([*args, "--price", "spot=1", "--price", "ondemand=3"]) == 2
    assert "--price ondemand=3: no worker group 'ondemand'" in capsys.readouterr().err
    assert not results.exists()


def test_whatif_cli_refuses_to_price_older_results_it_would_reuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    args = ["whatif", "--cluster", str(SPOT), "--workload", str(CHURN), "--workers", "0"]
    args += ["--results", str(results), "--output", "json"]
    assert main(args) == 0
    capsys.readouterr()
    row = json.loads(results.read_text())
    del row["summary"]["busy_chip_hours_by_group"]  # as an older tpu-autoscaler wrote it
    results.write_text(json.dumps(row) + "\n")
    assert main([*args, "--price", "spot=1", "--price", "on-demand=3"]) == 2
    err = capsys.readouterr().err
    assert f"--results {results}" in err and "rerun with a new --results file" in err
