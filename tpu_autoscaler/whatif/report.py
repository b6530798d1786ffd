"""What a sweep found, per setting: the mean over its seeds of what the simulator
measured (`sim/metrics.py`), which settings are on the Pareto front of idle
chip-hours against p95 wait, a table and a plot of the two.

Given a price per chip-hour for each group (`whatif/prices.py`), each setting also
costs its groups' chip-hours (busy, idle, and VMs up without a Ray node) at their
prices, and the front is then of cost against p95 wait."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_autoscaler.whatif.prices import ChipPrices, run_cost


@dataclass(frozen=True)
class SettingResult:
    label: str
    policy: str
    seeds: int
    idle_chip_hours: float
    busy_chip_hours: float
    unregistered_chip_hours: float | None
    """Chips of VMs up without a Ray node: booting, or drained or failed until their
    pods go (None: rows of an older tpu-autoscaler, which did not count them)."""
    wait_p50_s: float
    wait_p95_s: float
    unserved: float
    """Work still pending when the run ended."""
    launches: float
    flaps: float
    """Slices launched within the idle timeout of a removal in the same group."""
    failed: float
    """Slice head reservations that timed out: the user saw TimeoutError."""
    cost: float | None = None
    """The groups' chip-hours, busy, idle and unregistered, at their prices (None: not
    priced)."""
    pareto: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.label,
            "policy": self.policy,
            "seeds": self.seeds,
            "idle_chip_hours": self.idle_chip_hours,
            "busy_chip_hours": self.busy_chip_hours,
            "unregistered_chip_hours": self.unregistered_chip_hours,
            "wait_p50_s": self.wait_p50_s,
            "wait_p95_s": self.wait_p95_s,
            "unserved": self.unserved,
            "launches": self.launches,
            "flaps": self.flaps,
            "failed": self.failed,
            **({} if self.cost is None else {"cost": self.cost}),
            "pareto": self.pareto,
        }


def summarize(
    rows: Sequence[dict[str, Any]], prices: ChipPrices | None = None
) -> list[SettingResult]:
    """One result per (setting, policy), in the order first seen, the front marked:
    of idle chip-hours against p95 wait, or of cost against it given `prices`."""
    by_setting: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        label = " ".join(f"{k}={v}" for k, v in row["setting"]) or "as given"
        by_setting.setdefault((label, row["policy"]), []).append(row["summary"])
    results = [
        SettingResult(
            label=label,
            policy=policy,
            seeds=len(runs),
            idle_chip_hours=_mean(r["idle_chip_hours"] for r in runs),
            busy_chip_hours=_mean(r["busy_chip_hours"] for r in runs),
            unregistered_chip_hours=_mean_of_all(runs, "unregistered_chip_hours"),
            wait_p50_s=_mean(r["demand_wait_s"]["p50"] for r in runs),
            wait_p95_s=_mean(r["demand_wait_s"]["p95"] for r in runs),
            unserved=_mean(r["unsatisfied_at_end"] for r in runs),
            launches=_mean(r["slices_launched"] for r in runs),
            flaps=_mean(r["scale_flaps"] for r in runs),
            failed=_mean(r["reservations_failed"] for r in runs),
            cost=None if prices is None else _mean(run_cost(r, prices) for r in runs),
        )
        for (label, policy), runs in by_setting.items()
    ]
    front = pareto_front([(_spent(r), r.wait_p95_s) for r in results])
    return [SettingResult(**{**r.__dict__, "pareto": i in front}) for i, r in enumerate(results)]


def _spent(result: SettingResult) -> float:
    """What the front weighs against the wait: the cost if priced, else idle chip-hours."""
    return result.idle_chip_hours if result.cost is None else result.cost


def pareto_front(points: Sequence[tuple[float, float]]) -> set[int]:
    """Indexes of the points no other point beats on both coordinates (lower is
    better) while strictly beating on one."""
    return {
        i
        for i, (x, y) in enumerate(points)
        if not any(
            (ox <= x and oy <= y) and (ox < x or oy < y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
    }


def render_table(results: Sequence[SettingResult]) -> str:
    """A line per setting; a COST column when the results are priced."""
    priced = any(r.cost is not None for r in results)
    header = (
        "SETTING",
        "POLICY",
        "SEEDS",
        "IDLE CHIP-H",
        "BUSY CHIP-H",
        "UNREG CHIP-H",
        *(("COST",) if priced else ()),
        "WAIT P50 S",
        "WAIT P95 S",
        "UNSERVED",
        "LAUNCHES",
        "FLAPS",
        "FAILED",
        "PARETO",
    )
    rows = [header] + [
        (
            r.label,
            r.policy,
            str(r.seeds),
            f"{r.idle_chip_hours:.2f}",
            f"{r.busy_chip_hours:.2f}",
            "-" if r.unregistered_chip_hours is None else f"{r.unregistered_chip_hours:.2f}",
            *((f"{r.cost:.2f}" if r.cost is not None else "-",) if priced else ()),
            f"{r.wait_p50_s:.1f}",
            f"{r.wait_p95_s:.1f}",
            f"{r.unserved:g}",
            f"{r.launches:g}",
            f"{r.flaps:g}",
            f"{r.failed:g}",
            "*" if r.pareto else "",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def plot_pareto(results: Sequence[SettingResult], path: str, title: str) -> None:
    """Every setting as a point; the front joined and numbered, its settings listed
    under the axes (labels beside the points would overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = sorted((r for r in results if r.pareto), key=_spent)
    height_in = 6 + 0.16 * len(front)
    bottom = (0.16 * len(front) + 0.8) / height_in
    fig = plt.figure(figsize=(9, height_in))
    ax = fig.add_axes((0.1, bottom, 0.85, 0.93 - bottom))
    for policy, marker in (("slice", "o"), ("ray", "s")):
        mine = [r for r in results if r.policy == policy]
        if mine:
            ax.scatter(
                [_spent(r) for r in mine],
                [r.wait_p95_s for r in mine],
                marker=marker,
                color=["#e03131" if r.pareto else "#868e96" for r in mine],
                label=f"{policy} policy",
            )
    ax.plot(
        [_spent(r) for r in front],
        [r.wait_p95_s for r in front],
        color="#e03131",
        linewidth=1,
        label="Pareto front",
    )
    for n, r in enumerate(front, 1):
        ax.annotate(
            str(n),
            (_spent(r), r.wait_p95_s),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    priced = any(r.cost is not None for r in results)
    ax.set_xlabel(
        "cost of the chip-hours, busy, idle and unregistered (mean over seeds)"
        if priced
        else "idle chip-hours (mean over seeds)"
    )
    ax.set_ylabel("p95 wait for capacity, s (mean over seeds)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    listing = "\n".join(f"{n}: {r.label} ({r.policy})" for n, r in enumerate(front, 1))
    fig.text(0.02, 0.02, listing, fontsize=8, family="monospace", va="bottom")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(values: Any) -> float:
    return round(statistics.fmean(values), 2)


def _mean_of_all(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """The mean of `key` over the runs, or None if a run (of an older tpu-autoscaler)
    lacks it: a mean over some seeds would pass for one over all."""
    if any(key not in r for r in runs):
        return None
    return _mean(r[key] for r in runs)
