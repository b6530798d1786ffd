"""How a worker group's capacity, as the plan states it (`Plan.capacity`: every group
not plainly available), reaches people: an Event on the RayCluster when a group's
status changes (never each round), per-group gauges, and for `ray status` the
launches that failed with their reason and the reason beside each host still waiting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from tpu_autoscaler.adapters.ray.gcs import FailedHosts
from tpu_autoscaler.core.capacity import CapacityStatus, GroupCapacity
from tpu_autoscaler.shell import events

STATUS_REASONS: Final = {
    CapacityStatus.AVAILABLE: events.CAPACITY_AVAILABLE,
    CapacityStatus.STOCKED_OUT: events.CAPACITY_STOCKED_OUT,
    CapacityStatus.BACKING_OFF: events.CAPACITY_BACKING_OFF,
    CapacityStatus.CHURNING: events.CAPACITY_CHURNING,
}
"""The Event reason that announces a group entering each status."""


def clock_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(capacity: GroupCapacity) -> str:
    """`stocked out since T: REASON`, `backing off until T: REASON`, ..., as one line."""
    words = str(capacity.status).replace("_", " ")
    if capacity.status is CapacityStatus.AVAILABLE:
        return words
    when = ""
    if capacity.until_s is not None and capacity.status is not CapacityStatus.STOCKED_OUT:
        when = f" until {clock_time(capacity.until_s)}"
    elif capacity.since_s is not None:
        when = f" since {clock_time(capacity.since_s)}"
    return f"{words}{when}" + (f": {capacity.reason}" if capacity.reason else "")


def by_group(capacity: Iterable[GroupCapacity], groups: Iterable[str]) -> dict[str, GroupCapacity]:
    """Every group's capacity: the plan's entry, else available."""
    stated = {c.group: c for c in capacity}
    return {g: stated.get(g, GroupCapacity(g, CapacityStatus.AVAILABLE)) for g in groups}


@dataclass(frozen=True)
class CapacityChange:
    group: str
    now: GroupCapacity

    @property
    def reason(self) -> str:
        return STATUS_REASONS[self.now.status]

    @property
    def warning(self) -> bool:
        return self.now.status is not CapacityStatus.AVAILABLE

    @property
    def message(self) -> str:
        if not self.warning:
            return f"worker group {self.group!r}: capacity available again"
        return f"worker group {self.group!r}: {describe(self.now)}"


def changes(
    announced: Mapping[str, CapacityStatus], now: Mapping[str, GroupCapacity]
) -> list[CapacityChange]:
    """The groups whose status differs from the one last `announced` (a group never
    announced was available), in group order."""
    return [
        CapacityChange(group, capacity)
        for group, capacity in sorted(now.items())
        if announced.get(group, CapacityStatus.AVAILABLE) is not capacity.status
    ]


def failed_launches(
    capacity: Iterable[GroupCapacity], hosts_per_replica: Mapping[str, int], now_s: float
) -> list[FailedHosts]:
    """One per group that is stocked out or backing off (a slice of it cannot be had
    now), since the status began."""
    return [
        FailedHosts(
            c.group,
            hosts_per_replica.get(c.group, 0),
            describe(c),
            c.since_s if c.since_s is not None else now_s,
            now_s,
        )
        for c in capacity
        if c.status in (CapacityStatus.STOCKED_OUT, CapacityStatus.BACKING_OFF)
    ]
