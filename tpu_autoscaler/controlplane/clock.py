"""Virtual time: a clock that only moves when the event queue says so, and a seeded
random source, so a simulated day runs in seconds and every run repeats exactly."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(order=True)
class _Event:
    at_s: float
    sequence: int
    action: Callable[[], None] = field(compare=False)


class EventQueue:
    """Actions at virtual times; equal times run in the order they were scheduled."""

    def __init__(self, seed: int = 0, start_s: float = 0.0) -> None:
        self.now_s = start_s
        self.random = random.Random(seed)
        self._events: list[_Event] = []
        self._sequence = itertools.count()

    def at(self, at_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, _Event(max(at_s, self.now_s), next(self._sequence), action))

    def after(self, delay_s: float, action: Callable[[], None]) -> None:
        self.at(self.now_s + delay_s, action)

    def every(
        self, period_s: float, action: Callable[[], None], first_s: float | None = None
    ) -> None:
        """Run `action` every `period_s` from `first_s` (default: one period from now),
        on a fixed grid: an action that lets time pass does not delay the next one."""

        def tick(at_s: float) -> None:
            action()
            self.at(at_s + period_s, lambda: tick(at_s + period_s))

        start_s = self.now_s + period_s if first_s is None else first_s
        self.at(start_s, lambda: tick(start_s))

    def run_until(self, end_s: float) -> None:
        while self._events and self._events[0].at_s <= end_s:
            event = heapq.heappop(self._events)
            self.now_s = event.at_s
            event.action()
        self.now_s = max(self.now_s, end_s)

    @property
    def pending(self) -> int:
        return len(self._events)


def rfc3339(seconds: float) -> str:
    """A Kubernetes timestamp for a time in seconds since the epoch."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
