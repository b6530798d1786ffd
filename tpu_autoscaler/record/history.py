"""What `record` reads from Ray's GCS, reduced to what a workload trace needs: each
task, actor and placement group with its times, resources and label selectors, and
what the GCS no longer held. `adapters/ray/history.py` builds it from the GCS;
`record/trace.py` turns it into a trace. Tests build it from small fixtures."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecordedWork(_Strict):
    """A task attempt or an actor: one bundle of demand. Times are Unix ms."""

    kind: Literal["task", "actor"]
    id: str
    job_id: str
    name: str = ""
    resources: dict[str, float]
    label_selector: dict[str, str] = Field(default_factory=dict)
    """Ray's dict syntax: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    placement_group_id: str | None = None
    submitted_ms: float
    started_ms: float | None = None
    """Placed and running (a task) or scheduled onto a node (an actor)."""
    ended_ms: float | None = None


class RecordedBundle(_Strict):
    resources: dict[str, float]
    label_selector: dict[str, str] = Field(default_factory=dict)


class RecordedPlacementGroup(_Strict):
    id: str
    job_id: str
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
    bundles: list[RecordedBundle] = Field(min_length=1)
    state: Literal["PENDING", "PREPARED", "CREATED", "REMOVED", "RESCHEDULING"]
    created_ms: float
    placed_ms: float | None = None
    """All bundles placed; None if it never was."""


class Losses(_Strict):
    """What the GCS did not give: the trace is short of this much of the history."""

    task_events_dropped: int = 0
    """Task attempts whose status events the GCS dropped: past
    `RAY_task_events_max_num_task_in_gcs` (default 100,000) or from a worker's full
    buffer. Their tasks are missing from the trace."""
    tasks_truncated: int = 0
    """Task attempts the GCS held but did not send, past the read limit."""
    actors_truncated: int = 0
    """Past the read limit. Dead actors beyond
    `RAY_maximum_gcs_destroyed_actor_cached_count` the GCS forgets without a count."""
    placement_groups_truncated: int = 0

    @property
    def any(self) -> bool:
        return any(
            (
                self.task_events_dropped,
                self.tasks_truncated,
                self.actors_truncated,
                self.placement_groups_truncated,
            )
        )

    def describe(self) -> list[str]:
        lines = []
        if self.task_events_dropped:
            lines.append(
                f"{self.task_events_dropped} task attempts lost: the GCS dropped their "
                "events (RAY_task_events_max_num_task_in_gcs, default 100000, keeps the "
                "newest); the trace lacks them, most likely the oldest"
            )
        for count, what in (
            (self.tasks_truncated, "task attempts"),
            (self.actors_truncated, "actors"),
            (self.placement_groups_truncated, "placement groups"),
        ):
            if count:
                lines.append(f"{count} {what} not read: past --limit; raise it to read them")
        return lines


class SliceUp(_Strict):
    """One launch of a slice, as its hosts' raylets came up in Ray."""

    slice_name: str
    hosts_started_ms: list[float]
    """In start order."""

    @property
    def spread_s(self) -> float:
        """Seconds from the first host's raylet starting to the last's."""
        return round((self.hosts_started_ms[-1] - self.hosts_started_ms[0]) / 1000, 3)


class SliceLaunch(_Strict):
    """A replica launched, as the autoscaler told it once the replica came up whole
    (its `ReplicaUp` Event on the RayCluster): Kubernetes knows when a slice's pods
    were created, Ray does not."""

    slice_name: str
    replica: str
    group: str
    first_pod_created_ms: float


class History(_Strict):
    recorded_ms: float
    """When the history was read: work still running is cut off here."""
    work: list[RecordedWork] = Field(default_factory=list)
    placement_groups: list[RecordedPlacementGroup] = Field(default_factory=list)
    slice_launches_ms: dict[str, list[float]] = Field(default_factory=dict)
    """Start of each raylet that came up as a slice's worker 0, by pod type: one per
    slice launched, as far as the GCS still remembers dead nodes
    (`RAY_maximum_gcs_dead_node_cached_count`)."""
    slices_up: list[SliceUp] = Field(default_factory=list)
    """Each launch of a slice, with its hosts' raylet start times: how spread out a
    slice's hosts come up (`slices_up`)."""
    slices_launched: list[SliceLaunch] = Field(default_factory=list)
    """Read from Kubernetes, not the GCS: the autoscaler's `ReplicaUp` Events, which
    the API server keeps an hour by default (`--event-ttl`)."""
    losses: Losses = Field(default_factory=Losses)


def slices_up(hosts: Iterable[tuple[str, str, float]]) -> list[SliceUp]:
    """Each launch of a slice, given every TPU host as (slice name, worker id, start
    ms). A slice's name is reused by later launches: a worker id met again under that
    name starts the next launch. Hosts without a slice name (CPU, the head) are left
    out."""
    launches: dict[str, list[dict[str, float]]] = {}
    for slice_name, worker_id, start_ms in sorted(hosts, key=lambda host: host[2]):
        if not slice_name:
            continue
        seen = launches.setdefault(slice_name, [{}])
        if worker_id in seen[-1]:
            seen.append({})
        seen[-1][worker_id] = start_ms
    return sorted(
        (
            SliceUp(slice_name=name, hosts_started_ms=sorted(starts.values()))
            for name, incarnations in launches.items()
            for starts in incarnations
        ),
        key=lambda up: (up.hosts_started_ms[0], up.slice_name),
    )


def launches_up(
    launches: Iterable[SliceLaunch], ups: Iterable[SliceUp]
) -> list[tuple[SliceLaunch, SliceUp]]:
    """Each launch with its slice as it came up in Ray, in launch order: a slice is the
    latest launch's under its name whose pods were created by the time its first host
    started (a name is reused by later launches, and a launch whose slice Ray has
    forgotten must not take a later launch's). A launch with no slice is left out."""
    by_name: dict[str, list[SliceLaunch]] = {}
    for launch in sorted(launches, key=lambda launch: launch.first_pod_created_ms):
        by_name.setdefault(launch.slice_name, []).append(launch)
    paired = []
    for up in sorted(ups, key=lambda u: u.hosts_started_ms[0]):
        earlier = by_name.get(up.slice_name, [])
        created_ms = [launch.first_pod_created_ms for launch in earlier]
        latest = bisect.bisect_right(created_ms, up.hosts_started_ms[0]) - 1
        if latest >= 0:
            paired.append((earlier.pop(latest), up))
    return sorted(paired, key=lambda pair: pair[0].first_pod_created_ms)
