"""Which group `labels` Ray accepts on a node: its label syntax
(`ray/_private/label_utils.py`), enforced at `ray start`, and the keys it keeps
for itself."""

from __future__ import annotations

import re

from tpu_autoscaler.core import labels
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import WorkerGroupSpec

_LABEL_PART = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"


_LABEL_NAME = re.compile(_LABEL_PART)


_LABEL_PREFIX = re.compile(rf"({_LABEL_PART})?(\.({_LABEL_PART})?)*")


def label_key_problem(key: str) -> str | None:
    """Why Ray would refuse `key` as a node label key, or None if it is fine."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _LABEL_PREFIX.fullmatch(prefix)):
        return f"prefix {prefix!r} is not a series of DNS labels separated by dots"
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return (
            f"name {name!r} is not 1-63 alphanumerics, '-', '_' or '.', "
            "starting and ending alphanumeric"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why Ray would refuse `value` as a node label value, or None if it is fine."""
    if value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
        return None
    return (
        f"value {value!r} is not at most 63 alphanumerics, '-', '_' or '.', "
        "starting and ending alphanumeric"
    )


def check_labels(spec: WorkerGroupSpec, found: GroupProblems) -> None:
    for key, value in (spec.labels or {}).items():
        if key.startswith(labels.RAY_RESERVED_LABEL_PREFIX):
            found.error(
                f"labels[{key}]",
                f"keys under {labels.RAY_RESERVED_LABEL_PREFIX} belong to Ray; use another prefix",
            )
        key_problem = label_key_problem(key)
        if key_problem:
            found.error(f"labels[{key}]", f"is not a valid label key: {key_problem}")
        value_problem = label_value_problem(value)
        if value_problem:
            found.error(f"labels[{key}]", f"is not a valid label value: {value_problem}")
