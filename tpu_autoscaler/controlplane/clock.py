"""Virtual time: a clock that only moves when the event queue says so, and a seeded
random source, so a simulated day runs in seconds and every run repeats exactly."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple


class _Event(NamedTuple):
    """Ordered by time, then by when it was scheduled (unique): a tuple, compared in C,
    as the heap compares events some twenty times per event run (a dataclass's
    generated comparison made two tuples each time)."""

    at_s: float
    sequence: int
    action: Callable[[], None]
    observes: bool = False
    """Only looks at the world (a sampler): changes nothing anyone reads."""


_NEW_EVENT = tuple.__new__


class EventQueue:
    """Actions at virtual times; equal times run in the order they were scheduled."""

    def __init__(self, seed: int = 0, start_s: float = 0.0) -> None:
        self.now_s = start_s
        self.random = random.Random(seed)
        self._events: list[_Event] = []
        self._sequence = itertools.count()

    def at(self, at_s: float, action: Callable[[], None], observes: bool = False) -> None:
        """`observes`: the action only looks at the world (`changes_by`)."""
        now_s = self.now_s
        # The tuple made directly: `_Event(...)`'s generated `__new__` is a Python call,
        # on every event a run schedules (some fifty thousand at 1,024 slices).
        event = _NEW_EVENT(
            _Event, (now_s if now_s > at_s else at_s, next(self._sequence), action, observes)
        )
        heapq.heappush(self._events, event)

    def after(self, delay_s: float, action: Callable[[], None]) -> None:
        self.at(self.now_s + delay_s, action)

    def every(
        self,
        period_s: float,
        action: Callable[[], None],
        first_s: float | None = None,
        observes: bool = False,
    ) -> None:
        """Run `action` every `period_s` from `first_s` (default: one period from now),
        on a fixed grid: an action that lets time pass does not delay the next one."""

        def tick(at_s: float) -> None:
            action()
            self.at(at_s + period_s, lambda: tick(at_s + period_s), observes)

        start_s = self.now_s + period_s if first_s is None else first_s
        self.at(start_s, lambda: tick(start_s), observes)

    def changes_by(self, end_s: float) -> bool:
        """Whether an action due by `end_s` (those due now included) may change the
        world: one not marked as only observing it."""
        stack = [0] if self._events else []
        while stack:
            index = stack.pop()
            event = self._events[index]
            if event.at_s > end_s:
                continue  # a heap: every event below this one is later still
            if not event.observes:
                return True
            stack += [i for i in (2 * index + 1, 2 * index + 2) if i < len(self._events)]
        return False

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
