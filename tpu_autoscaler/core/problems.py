"""What is wrong with input from outside (a manifest, a snapshot, a trace): every
problem found, each naming the object and field and saying what would be valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a manifest: where, in which group, and what would be valid."""

    path: str
    message: str
    group: str | None = None
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"worker group {self.group!r}: " if self.group is not None else ""
        return f"{self.severity}: {where}{self.path}: {self.message}"

    def to_json(self) -> dict[str, str | None]:
        return {
            "severity": self.severity,
            "group": self.group,
            "path": self.path,
            "message": self.message,
        }


class ManifestError(Exception):
    """Input that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems
