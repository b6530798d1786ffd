"""Which requests to the simulated API server go wrong, and how: faults injected to
exercise the client's retries and their safety (an error status, a connection dropped
before or after the store applied the request, or a handler held until released so
that the client times out first), each taken by the first request it matches; and the
requests received and in flight."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal["status", "drop_before", "drop_after", "slow"]

SLOW_HANDLER_LIMIT_S = 30.0
"""A held handler proceeds by itself after this long, so a test that forgets to
release it leaves no thread behind for good."""


@dataclass(frozen=True, eq=False)
class Fault:
    """What to do to the next request whose method is `method` (None: any) and whose
    path and query contain `path`. Build one with `status`, `drop_before`,
    `drop_after` or `slow`."""

    kind: FaultKind
    method: str | None = None
    path: str = ""
    code: int = 500
    released: threading.Event = field(default_factory=threading.Event, repr=False)

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or self.method == method) and self.path in target


def status(code: int, method: str | None = None, path: str = "") -> Fault:
    """Answer with `code` and a `Status` body; the store is not touched."""
    return Fault("status", method, path, code)


def drop_before(method: str | None = None, path: str = "") -> Fault:
    """Close the connection without an answer; the store is not touched."""
    return Fault("drop_before", method, path)


def drop_after(method: str | None = None, path: str = "") -> Fault:
    """Apply the request to the store, then close the connection without an answer:
    the client cannot tell this from `drop_before`."""
    return Fault("drop_after", method, path)


def slow(method: str | None = None, path: str = "") -> Fault:
    """Hold the request until `ApiServer.release_slow`, then apply it and answer (to a
    client that has usually given up by then)."""
    return Fault("slow", method, path)


class Traffic:
    """The requests an `ApiServer` received and has in flight, and the faults queued for
    the next ones. Thread-safe: every handler thread begins and ends here."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        """(method, path with query) of every request received, oldest first."""
        self._faults: deque[Fault] = deque()
        self._held: list[Fault] = []
        self._in_flight = 0
        self._state = threading.Condition()

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each request takes the first queued fault it matches."""
        with self._state:
            self._faults.extend(faults)

    @property
    def pending_faults(self) -> int:
        with self._state:
            return len(self._faults)

    def release_slow(self) -> None:
        """Let every request held by a `slow` fault so far proceed."""
        with self._state:
            held, self._held = self._held, []
        for fault in held:
            fault.released.set()

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is being handled (held ones included); False if
        `timeout_s` passed first."""
        with self._state:
            return self._state.wait_for(lambda: self._in_flight == 0, timeout_s)

    def begin(self, method: str, target: str) -> Fault | None:
        with self._state:
            self.requests.append((method, target))
            self._in_flight += 1
            fault = next((f for f in self._faults if f.matches(method, target)), None)
            if fault is not None:
                self._faults.remove(fault)
                if fault.kind == "slow":
                    self._held.append(fault)
            return fault

    def end(self) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()
