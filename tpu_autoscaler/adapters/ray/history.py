"""A Ray cluster's history read from its GCS, as Ray's State API reads it (the
dashboard's `StateDataSourceClient`, here in this process on the GCS address, so no
dashboard is needed): task attempts job by job, actors, placement groups, and the
raylets that came up as slice worker 0. Each reply is reduced to
`record/history.py`'s records before the next is read, and each read is capped at
`limit` entries, so memory stays bounded by the limit, not the history."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import Any

from tpu_autoscaler.core import labels
from tpu_autoscaler.record.history import (
    History,
    Losses,
    RecordedBundle,
    RecordedPlacementGroup,
    RecordedWork,
    slices_up,
)


class Progress:
    """One line on stderr, rewritten in place on a terminal; a line per step otherwise."""

    def __init__(self, total: int, what: str, enabled: bool = True) -> None:
        self.total, self.what, self.done, self.enabled = total, what, 0, enabled
        self.tty = sys.stderr.isatty()

    def step(self, detail: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"{self.what} [{bar}] {self.done}/{self.total} {detail}"
        print(
            f"\r{line}\x1b[K" if self.tty else line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


def read_history(
    gcs_address: str, limit: int = 100_000, timeout_s: int = 30, progress: bool = True
) -> History:
    return asyncio.run(_read(gcs_address, limit, timeout_s, progress))


async def _read(gcs_address: str, limit: int, timeout_s: int, progress: bool) -> History:
    import time

    from ray._private.grpc_utils import init_grpc_channel
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.util.state.state_manager import StateDataSourceClient

    gcs = GcsClient(address=gcs_address)
    channel = init_grpc_channel(gcs_address, asynchronous=True)
    source: Any = StateDataSourceClient(channel, gcs)
    try:
        recorded_ms = time.time() * 1000
        jobs = [job.job_id for job in await source.get_job_info(timeout=timeout_s) if job.job_id]
        bar = Progress(len(jobs) + 3, "record", progress)
        work: list[RecordedWork] = []
        creations: dict[str, tuple[float | None, float | None]] = {}
        dropped = truncated = 0
        for job_id in jobs:
            reply = await source.get_all_task_info(
                timeout=timeout_s,
                limit=limit,
                filters=[("job_id", "=", job_id)],
                exclude_driver=True,
            )
            tasks, created = _task_attempts(reply.events_by_task)
            work += tasks
            creations.update(created)
            # The drop counter is the GCS's, not the job's: the largest seen is the loss.
            dropped = max(dropped, reply.num_status_task_events_dropped)
            truncated += reply.num_truncated
            bar.step(f"job {job_id}: {len(reply.events_by_task)} task attempts")
        actors = await source.get_all_actor_info(timeout=timeout_s, limit=limit)
        work += _actors(actors.actor_table_data, creations)
        bar.step(f"{len(actors.actor_table_data)} actors")
        groups = await source.get_all_placement_group_info(timeout=timeout_s, limit=limit)
        placement_groups = _placement_groups(groups.placement_group_table_data)
        bar.step(f"{len(placement_groups)} placement groups")
        nodes = gcs.get_all_node_info(timeout=timeout_s)
        started = [(dict(node.labels), float(node.start_time_ms)) for node in nodes.values()]
        launches = _slice_launches(started)
        ups = slices_up(
            (
                node_labels.get(labels.RAY_TPU_SLICE_NAME, ""),
                node_labels.get(labels.RAY_TPU_WORKER_ID, ""),
                start_ms,
            )
            for node_labels, start_ms in started
        )
        bar.step(f"{sum(len(v) for v in launches.values())} slices came up")
        bar.close()
        losses = Losses(
            task_events_dropped=dropped,
            tasks_truncated=truncated,
            actors_truncated=max(0, actors.total - len(actors.actor_table_data)),
            placement_groups_truncated=max(0, groups.total - len(placement_groups)),
        )
        return History(
            recorded_ms=recorded_ms,
            work=work,
            placement_groups=placement_groups,
            slice_launches_ms=launches,
            slices_up=ups,
            losses=losses,
        )
    finally:
        await source._client_session.close()


def _task_attempts(
    events: Iterable[Any],
) -> tuple[list[RecordedWork], dict[str, tuple[float | None, float | None]]]:
    """Normal task attempts as work; for each actor, when its creation task was
    submitted and started (the actor table keeps neither)."""
    from ray.util.state.common import protobuf_to_task_state_dict

    tasks: list[RecordedWork] = []
    creations: dict[str, tuple[float | None, float | None]] = {}
    for message in events:
        task = protobuf_to_task_state_dict(message)
        if task["creation_time_ms"] is None:
            continue
        if task["type"] == "ACTOR_CREATION_TASK":
            creations[task["actor_id"]] = (task["creation_time_ms"], task["start_time_ms"])
        elif task["type"] == "NORMAL_TASK":
            tasks.append(
                RecordedWork(
                    kind="task",
                    id=task["task_id"],
                    job_id=task["job_id"],
                    name=task.get("func_or_class_name") or "",
                    resources=task.get("required_resources") or {},
                    label_selector=task.get("label_selector") or {},
                    placement_group_id=task.get("placement_group_id"),
                    submitted_ms=task["creation_time_ms"],
                    started_ms=task["start_time_ms"],
                    ended_ms=task["end_time_ms"],
                )
            )
    return tasks, creations


def _actors(
    table: Iterable[Any], creations: dict[str, tuple[float | None, float | None]]
) -> list[RecordedWork]:
    """Actors with the times their creation task recorded; without those events (lost),
    the actor table's own start time stands for both submission and placement."""
    found = []
    for actor in table:
        actor_id = actor.actor_id.hex()
        submitted, started = creations.get(actor_id, (None, None))
        start_ms = float(actor.start_time) or None
        if submitted is None:
            if start_ms is None:
                continue  # never created, and no event says when it was asked for
            submitted = start_ms
        found.append(
            RecordedWork(
                kind="actor",
                id=actor_id,
                job_id=actor.job_id.hex(),
                name=actor.class_name,
                resources=dict(actor.required_resources),
                label_selector=dict(actor.label_selector),
                placement_group_id=actor.placement_group_id.hex() or None,
                submitted_ms=submitted,
                started_ms=started or start_ms,
                ended_ms=float(actor.end_time) or None,
            )
        )
    return found


def _placement_groups(table: Iterable[Any]) -> list[RecordedPlacementGroup]:
    from ray.core.generated import gcs_pb2

    strategy = gcs_pb2.PlacementGroupTableData.DESCRIPTOR.fields_by_name["strategy"].enum_type
    state = gcs_pb2.PlacementGroupTableData.DESCRIPTOR.fields_by_name["state"].enum_type
    found = []
    for pg in table:
        created_ms = int(pg.stats.creation_request_received_ns) / 1e6 or float(
            pg.placement_group_creation_timestamp_ms
        )
        latency_us = int(pg.stats.end_to_end_creation_latency_us)
        found.append(
            RecordedPlacementGroup(
                id=pg.placement_group_id.hex(),
                job_id=pg.creator_job_id.hex(),
                strategy=strategy.values_by_number[pg.strategy].name,
                bundles=[
                    RecordedBundle(
                        resources=dict(b.unit_resources), label_selector=dict(b.label_selector)
                    )
                    for b in pg.bundles
                ],
                state=state.values_by_number[pg.state].name,
                created_ms=created_ms,
                placed_ms=created_ms + latency_us / 1000 if latency_us > 0 else None,
            )
        )
    return found


def _slice_launches(started: Iterable[tuple[dict[str, str], float]]) -> dict[str, list[float]]:
    """Start times of each raylet that came up as worker 0 of a slice, by pod type,
    given every node's labels and start ms: one per slice launched (a slice's name is
    reused, its worker 0 never is)."""
    launches: dict[str, list[float]] = {}
    for node_labels, start_ms in started:
        if node_labels.get(labels.RAY_TPU_WORKER_ID) == "0":
            pod_type = node_labels.get(labels.RAY_TPU_POD_TYPE, "")
            launches.setdefault(pod_type, []).append(start_ms)
    return {k: sorted(v) for k, v in sorted(launches.items())}
