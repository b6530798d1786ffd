"""Which requests the differential test (test_differential.py) generates: the names,
labels and label selectors its steps use, the spec changes and statuses it writes, the
guards it puts on a write, and the Hypothesis strategies of a step and of the closing
watch. A selector is the test's own (key, operator, values), read by the documented
semantics, never by the simulator's parser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.realkube.endpoints import JSON_PATCH, MERGE_PATCH

CLUSTERS = ("c0", "c1")
PODS = ("p0", "p1", "p2")
KEYS = ("app", "tier")
VALUES = ("a", "b")
LAST = "zz-last"
"""The object created after a sequence, whose ADDED event ends the watch read."""

Guard = tuple[str, int]
"""("none", _), ("current", _): the object's newest version seen, ("seen", k): the k-th
version seen on that server (stale, or by chance current), ("empty", _)."""

guards = st.tuples(
    st.sampled_from(["none", "current", "current", "seen", "empty"]), st.integers(0, 9)
)

labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)


@dataclass(frozen=True)
class Selector:
    """A label selector as the test means it: (key, operator, values) requirements, read
    here by the documented semantics, independently of the simulator's parser."""

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]

    def __repr__(self) -> str:
        return repr(self.text)

    @property
    def text(self) -> str:
        parts = []
        for key, operator, values in self.requirements:
            if operator in ("in", "notin"):
                parts.append(f"{key} {operator} ({','.join(values)})")
            elif operator == "exists":
                parts.append(key)
            elif operator == "!":
                parts.append(f"!{key}")
            else:
                parts.append(f"{key}{operator}{values[0]}")
        return ",".join(parts)

    def selects(self, pod_labels: dict[str, str]) -> bool:
        return all(_holds(pod_labels.get(k), op, values) for k, op, values in self.requirements)


def _holds(value: str | None, operator: str, values: tuple[str, ...]) -> bool:
    if operator in ("=", "=="):
        return value == values[0]
    if operator == "!=":
        return value != values[0]
    if operator == "in":
        return value in values
    if operator == "notin":
        return value not in values
    if operator == "exists":
        return value is not None
    return value is None  # "!"


@st.composite
def selectors(draw: st.DrawFn) -> Selector:
    """A label selector of one or two requirements, each operator of equality and sets."""
    requirements = []
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from((*KEYS, "gone")))
        values = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True))
        operator = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!"]))
        requirements.append((key, operator, tuple(values)))
    return Selector(tuple(requirements))


SPEC_CHANGES: list[tuple[str, Any]] = [
    ("/spec/workerGroupSpecs/0/replicas", 1),
    ("/spec/workerGroupSpecs/0/replicas", 2),
    ("/spec/workerGroupSpecs/0/replicas", "two"),
    ("/spec/rayVersion", "2.61.0"),
    ("/spec/autoscalerOptions/idleTimeoutSeconds", 120),
    ("/spec/autoscalerOptions/upscalingMode", "Sideways"),
    ("/spec/unknownField", 1),
    ("/metadata/labels", {"app": "a"}),
]
STATUSES: list[dict[str, Any]] = [
    {"state": "ready"},
    {"state": "suspended", "availableWorkerReplicas": 2},
    {"desiredWorkerReplicas": 1, "unknownField": 1},
    {"state": 3},
]

steps = st.one_of(
    st.tuples(st.just("create_cluster"), st.sampled_from(CLUSTERS)),
    st.tuples(
        st.just("create_pod"),
        st.sampled_from(PODS),
        labels,
        st.booleans(),
        st.sampled_from([None, 0, 20]),
    ),
    st.tuples(st.just("get_cluster"), st.sampled_from(CLUSTERS)),
    st.tuples(st.just("get_pod"), st.sampled_from(PODS)),
    st.tuples(st.just("list_pods"), st.one_of(st.none(), selectors())),
    st.tuples(
        st.just("patch"),
        st.sampled_from(CLUSTERS),
        st.sampled_from([JSON_PATCH, MERGE_PATCH]),
        st.sampled_from(range(len(SPEC_CHANGES))),
        guards,
    ),
    st.tuples(
        st.just("status"),
        st.sampled_from(CLUSTERS),
        st.sampled_from(["PUT", MERGE_PATCH, JSON_PATCH]),
        st.sampled_from(range(len(STATUSES))),
        guards,
    ),
    st.tuples(
        st.just("delete_pod"),
        st.sampled_from(PODS),
        st.sampled_from([None, 0, 5, 40]),
        guards,
    ),
)

watches = st.tuples(
    st.sampled_from(["pods", "rayclusters"]), st.integers(0, 4), st.one_of(st.none(), selectors())
)
