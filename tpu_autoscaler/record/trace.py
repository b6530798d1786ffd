"""A recorded history as a workload trace (`sim/workload.py`): each task, actor and
placement group that asked for capacity, arriving when it was submitted and running
as long as it ran once placed, and each `slice_placement_group` call (its head
groups, retried heads included, and the SPREAD group pinned to the heads' slices)
as one item. Work that ran inside a placement group is that group's, not new
demand: it says how long the group was used. What cannot be placed in a trace is
said in `notes`, never silently dropped."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.core import labels
from tpu_autoscaler.record.history import History, RecordedPlacementGroup, RecordedWork
from tpu_autoscaler.sim.workload import WorkItem, Workload

HEAD_RESOURCE = re.compile(r"^TPU-(?P<pod_type>.+)-head$")


@dataclass(frozen=True)
class SliceType:
    """What `slice_placement_group` was called with, found from the pod type."""

    topology: str
    accelerator_version: str
    default_bundle: dict[str, float]
    """The bundle Ray builds without `resources_per_bundle`: one per host."""


@dataclass
class RecordedTrace:
    workload: Workload
    start_ms: float
    """Unix ms of the trace's time 0: the first submission."""
    waits_s: list[float] = field(default_factory=list)
    """Submission to placement of each item that was placed, as it happened."""
    notes: list[str] = field(default_factory=list)


def trace_from_history(
    history: History, slice_types: Mapping[str, SliceType], resolution_s: float = 1.0
) -> RecordedTrace:
    """`slice_types` by pod type (`v6e-16`), from the cluster the history ran on.
    Times are rounded to `resolution_s`; items equal after rounding become one with
    a count."""
    notes: list[str] = []
    in_group: dict[str, list[RecordedWork]] = defaultdict(list)
    loose: list[RecordedWork] = []
    known_groups = {pg.id for pg in history.placement_groups}
    skipped: dict[str, int] = defaultdict(int)
    for work in history.work:
        if not work.resources:
            skipped["asked for no resources"] += 1
        elif work.placement_group_id is None:
            loose.append(work)
        elif work.placement_group_id in known_groups:
            in_group[work.placement_group_id].append(work)
        else:
            skipped["ran in a placement group the GCS no longer held"] += 1

    raw: list[tuple[float, float, dict[str, Any], float | None]] = []
    """(submitted ms, duration s, item kind and spec, placed ms)"""
    for work in loose:
        if work.started_ms is None:
            skipped[f"{work.kind}s never placed (still pending when recorded)"] += 1
            continue
        ended = work.ended_ms if work.ended_ms is not None else history.recorded_ms
        spec: dict[str, Any] = {"resources": work.resources}
        if work.label_selector:
            spec["label_selector"] = work.label_selector
        duration_s = (ended - work.started_ms) / 1000
        raw.append((work.submitted_ms, duration_s, {work.kind: spec}, work.started_ms))

    def used_until(pg: RecordedPlacementGroup) -> float | None:
        ends = [w.ended_ms or history.recorded_ms for w in in_group[pg.id]]
        if pg.state != "REMOVED":
            ends.append(history.recorded_ms)
        return max(ends, default=None)

    by_job: dict[str, list[RecordedPlacementGroup]] = defaultdict(list)
    for pg in sorted(history.placement_groups, key=lambda p: p.created_ms):
        by_job[pg.job_id].append(pg)
    for groups in by_job.values():
        heads: list[RecordedPlacementGroup] = []
        for pg in groups:
            if _pod_type_of_head(pg) is not None:
                heads.append(pg)
                continue
            if pg.placed_ms is None:
                skipped["placement groups never placed"] += 1
                heads = []
                continue
            end_ms = used_until(pg)
            if end_ms is None:
                skipped["placement groups removed with no work seen in them"] += 1
                heads = []
                continue
            duration_s = (end_ms - pg.placed_ms) / 1000
            slice_names = _pinned_slices(pg)
            if slice_names and heads:
                item, note = _slice_item(pg, heads, len(slice_names), slice_types)
                if item is None:
                    skipped[note] += 1
                else:
                    raw.append((heads[0].created_ms, duration_s, item, pg.placed_ms))
                heads = []
                continue
            spec = {"bundles": [b.resources for b in pg.bundles], "strategy": pg.strategy}
            if any(b.label_selector for b in pg.bundles):
                spec["bundle_label_selector"] = [b.label_selector for b in pg.bundles]
            raw.append((pg.created_ms, duration_s, {"placement_group": spec}, pg.placed_ms))
        if heads:
            skipped["slice head reservations never followed by their slices' group"] += 1

    start_ms = min((r[0] for r in raw), default=history.recorded_ms)
    counts: dict[str, int] = defaultdict(int)
    for submitted_ms, duration_s, item, _ in raw:
        at = _round((submitted_ms - start_ms) / 1000, resolution_s)
        duration = max(resolution_s, _round(duration_s, resolution_s))
        counts[json.dumps({"at": at, "duration": duration, **item}, sort_keys=True)] += 1
    items = []
    for key, count in counts.items():
        data = json.loads(key)
        if count > 1:
            data["count"] = count
        items.append(WorkItem.model_validate(data))
    items.sort(key=lambda i: (i.at, i.model_dump_json()))
    notes += [f"{n} {why}: left out" for why, n in sorted(skipped.items())]
    notes += history.losses.describe()
    waits = [(placed - submitted) / 1000 for submitted, _, _, placed in raw if placed]
    return RecordedTrace(Workload(items=items), start_ms, waits, notes)


def _pod_type_of_head(pg: RecordedPlacementGroup) -> str | None:
    if len(pg.bundles) != 1 or len(pg.bundles[0].resources) != 1:
        return None
    match = HEAD_RESOURCE.match(next(iter(pg.bundles[0].resources)))
    return match["pod_type"] if match else None


def _pinned_slices(pg: RecordedPlacementGroup) -> set[str]:
    """The slices a SPREAD group's bundles are pinned to, if every bundle is."""
    names = {b.label_selector.get(labels.RAY_TPU_SLICE_NAME) for b in pg.bundles}
    if pg.strategy != "SPREAD" or None in names:
        return set()
    return {n for n in names if n}


def _slice_item(
    workers: RecordedPlacementGroup,
    heads: list[RecordedPlacementGroup],
    num_slices: int,
    slice_types: Mapping[str, SliceType],
) -> tuple[dict[str, Any] | None, str]:
    pod_type = _pod_type_of_head(heads[-1])
    slice_type = slice_types.get(pod_type or "")
    if slice_type is None:
        return None, f"slice reservations of pod type {pod_type}, no group of the cluster has"
    spec: dict[str, Any] = {
        "topology": slice_type.topology,
        "accelerator_version": slice_type.accelerator_version,
    }
    if num_slices > 1:
        spec["num_slices"] = num_slices
    if workers.bundles[0].resources != slice_type.default_bundle:
        spec["resources_per_bundle"] = workers.bundles[0].resources
    timed_out = sum(1 for h in heads if h.placed_ms is None)
    if timed_out:
        # The caller started again after each TimeoutError: it retries.
        spec["retries"] = -1
    return {"slice_placement_group": spec}, ""


def _round(value: float, resolution: float) -> float:
    return round(round(value / resolution) * resolution, 6)
