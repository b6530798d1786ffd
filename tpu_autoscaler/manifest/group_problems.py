"""The problems found in one group (a worker group or the head), with manifest paths
relative to it."""

from __future__ import annotations

from tpu_autoscaler.core.problems import Problem


class GroupProblems:
    """Collects the problems of one worker group with paths relative to it."""

    def __init__(self, index: int, group: str, prefix: str | None = None) -> None:
        self.prefix = prefix or f"spec.workerGroupSpecs[{index}]"
        self.group = group
        self.found: list[Problem] = []

    def error(self, field_path: str, message: str) -> None:
        self.found.append(Problem(f"{self.prefix}.{field_path}", message, self.group))

    def warn(self, field_path: str, message: str) -> None:
        self.found.append(Problem(f"{self.prefix}.{field_path}", message, self.group, "warning"))

    @property
    def has_errors(self) -> bool:
        return any(p.severity == "error" for p in self.found)
