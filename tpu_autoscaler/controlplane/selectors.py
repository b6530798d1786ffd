"""Label selectors as Ray 2.60 reads them: the dict a user passes (`label_selector=`,
`bundle_label_selector=`) parsed the way the raylet and the GCS parse it
(`LabelSelector::ParseLabelSelectorValue` in `src/ray/common/scheduling/label_selector.cc`)
and matched the way `NodeResources::NodeLabelMatchesConstraint` matches it.

Written independently of `tpu_autoscaler.core.demand` (the policy's reading), so the
simulator is a second opinion on it. Ray's quirks are kept: `in(a, b)` is not
trimmed (its second value is " b", which no label equals), `in()` has no values.
Validation is Ray's own Python check (`ray._private.label_utils`), as `.options()`
runs it before a task or placement group is submitted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ray._private.label_utils import validate_label_selector


@dataclass(frozen=True, slots=True)
class Constraint:
    """`key IN values` or `key NOT_IN values`: a node without `key` fails IN and
    passes NOT_IN."""

    key: str
    operator: Literal["in", "not_in"]
    values: frozenset[str]

    def matches(self, node_labels: Mapping[str, str]) -> bool:
        present = self.key in node_labels and node_labels[self.key] in self.values
        return present if self.operator == "in" else not present


Selector = tuple[Constraint, ...]


def parse_selector(selector: Mapping[str, str]) -> Selector:
    """One constraint per key, in key order (the GCS's is a hash map's: unordered)."""
    return tuple(_parse_value(key, raw) for key, raw in sorted(selector.items()))


def _parse_value(key: str, raw: str) -> Constraint:
    negated = raw.startswith("!")
    text = raw[1:] if negated else raw
    operator: Literal["in", "not_in"] = "not_in" if negated else "in"
    if not (text.startswith("in(") and text.endswith(")")):
        return Constraint(key, operator, frozenset({text}))
    text = text[3:-1]
    values: set[str] = set()
    while text:
        token, comma, text = text.partition(",")
        values.add(token)
        if not comma:
            break
    return Constraint(key, operator, frozenset(values))


def selector_matches(selector: Selector, node_labels: Mapping[str, str]) -> bool:
    return all(c.matches(node_labels) for c in selector)


def selector_problem(selector: Mapping[str, str]) -> str | None:
    """Why Ray would refuse this selector at submission, or None."""
    problem = validate_label_selector(dict(selector))
    return None if problem is None else str(problem)
