"""What a sweep's chips cost: a price per chip-hour for each worker group
(`whatif --price GROUP=PRICE`), applied to a run's chip-hours by group: busy, idle,
and those of VMs up without a Ray node (booting, or drained or failed until their pods
go), which GKE bills as much as the others.

Groups are priced apart because that is where the money differs: a spot group's chips
cost a fraction of an on-demand group's, so a setting that leaves spot chips idle can
cost less than one that leaves fewer on-demand chips idle, which idle chip-hours
alone cannot tell. Only TPU chips are counted (the simulator's chip-hours); a group
without TPUs needs no price. The prices are applied to the results file's chip-hours,
so other prices need no rerun."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tpu_autoscaler.core.problems import ManifestError, Problem

ChipPrices = Mapping[str, float]
"""Price of one chip-hour by worker group, in the user's currency."""


class UnpricedResults(ValueError):
    """Results that cannot be priced: rows without chip-hours by group (written
    before the simulator kept busy and unregistered chips per group), or chips of a
    group with no price."""


def parse_prices(specs: Sequence[str], chips_per_host: Mapping[str, int]) -> ChipPrices | None:
    """`GROUP=PRICE` each, checked against the manifest's worker groups and their chips
    per host (`chips_per_host`, every group's): one price per group, a finite number
    of 0 or more, and one for every group with TPU chips once any is given. None for
    no prices. Every problem found is named, on its own `--price`."""
    if not specs:
        return None
    problems: list[Problem] = []
    prices: dict[str, float] = {}
    for spec in specs:
        where = f"--price {spec}"
        group, sep, raw = spec.partition("=")
        group = group.strip()
        if not sep or not group or not raw.strip():
            problems.append(Problem(where, "give GROUP=PRICE, the price of one chip-hour"))
            continue
        if group not in chips_per_host:
            known = ", ".join(chips_per_host)
            problems.append(Problem(where, f"no worker group {group!r}; groups: {known}"))
            continue
        try:
            price = float(raw)
        except ValueError:
            problems.append(Problem(where, f"{raw.strip()!r} is not a number"))
            continue
        if not math.isfinite(price) or price < 0:
            problems.append(Problem(where, f"{raw.strip()!r}: give a finite price of 0 or more"))
        elif group in prices:
            problems.append(Problem(where, f"group {group!r} is priced twice"))
        else:
            prices[group] = price
    if problems:
        raise ManifestError(problems)
    unpriced = [g for g, chips in chips_per_host.items() if chips and g not in prices]
    if unpriced:
        raise ManifestError(
            [
                Problem("--price", f"no price for group {g!r}, whose hosts have TPU chips")
                for g in unpriced
            ]
        )
    return prices


BILLED_BY_GROUP = (
    "busy_chip_hours_by_group",
    "idle_chip_hours_by_group",
    "unregistered_chip_hours_by_group",
)
"""The chip-hours by group a run's summary reports that GKE bills."""


def run_cost(summary: Mapping[str, Any], prices: ChipPrices) -> float:
    """One run's chip-hours by group, busy, idle and unregistered, at the group's
    price."""
    billed: list[Mapping[str, float]] = []
    for key in BILLED_BY_GROUP:
        hours = summary.get(key)
        if hours is None:
            raise UnpricedResults(
                "a result has no chip-hours by group (written by an older "
                "tpu-autoscaler): rerun with a new --results file"
            )
        billed.append(hours)
    cost = 0.0
    for hours in billed:
        for group, chip_hours in hours.items():
            if not chip_hours:
                continue
            price = prices.get(group)
            if price is None:
                raise UnpricedResults(f"group {group!r} has chip-hours but no price")
            cost += chip_hours * price
    return cost
