"""Which of the RayCluster schema's own rules a decoded write breaks: list uniqueness
by `x-kubernetes-list-type` map and set (`listtype/validation.go`), and the
`x-kubernetes-validations` CEL rules. CEL is not evaluated: the three rules KubeRay
v1.7.0 declares are modelled one by one (`cel_rule`); a rule not modelled is listed
by `unmodelled_rules`."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from tpu_autoscaler.controlplane.crd_errors import OMITTED, FieldError, join_path
from tpu_autoscaler.controlplane.crd_schema import child_schema, schema

_ATOMS: Final = frozenset({str, int, float, bool, type(None)})


def list_errors(value: Any, schema_: Mapping[str, Any] | None, path: str) -> Iterator[FieldError]:
    if schema_ is None:
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield from list_errors(child, child_schema(schema_, key), join_path(path, key))
    elif isinstance(value, list):
        list_type = schema_.get("x-kubernetes-list-type")
        if list_type == "set":
            for index in _second_occurrences(value):
                yield FieldError(f"{path}[{index}]", "Duplicate value", value[index])
        elif list_type == "map":
            yield from _map_list_errors(value, schema_.get("x-kubernetes-list-map-keys", []), path)
        items = schema_.get("items")
        if not isinstance(items, Mapping):
            return
        if set(map(type, value)) <= _ATOMS:
            return  # no lists under atoms (a long `workersToDelete` holds strings): in C
        for index, item in enumerate(value):
            yield from list_errors(item, items, f"{path}[{index}]")


def _second_occurrences(values: Sequence[Any]) -> list[int]:
    """`validateListSet`: the index of each value's second occurrence."""
    seen: dict[str, int] = {}
    found = []
    for index, value in enumerate(values):
        key = json.dumps(value, sort_keys=True)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:
            found.append(index)
    return found


def _map_list_errors(items: list[Any], keys: Sequence[str], path: str) -> Iterator[FieldError]:
    for index, item in enumerate(items):
        if item is not None and not isinstance(item, dict):
            yield FieldError(
                f"{path}[{index}]",
                "Invalid value",
                item,
                "must be an object for an array of list-type map",
            )
            return
    entries = [{k: item[k] for k in keys if k in item} for item in items if item is not None]
    for index in _second_occurrences(entries):
        yield FieldError(f"{path}[{index}]", "Duplicate value", entries[index])


CelRule = Callable[[Any, Any], bool]
"""(self, oldSelf; absent oldSelf is `_ABSENT`) -> the rule holds."""

_ABSENT: Final = object()


def _immutable(value: Any, old: Any) -> bool:
    return old is _ABSENT or value == old


def _one_of(rule: str) -> CelRule | None:
    match = re.fullmatch(r"self in (\[.*\])", rule)
    if match is None:
        return None
    try:
        allowed = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return lambda value, _old: value in allowed


def cel_rule(rule: str) -> CelRule | None:
    """The Python model of a CEL rule, None if not modelled. Transition rules (those
    reading `oldSelf`) hold on create and whenever the old object lacks the field,
    as the apiserver skips them then."""
    if rule == "self == oldSelf":
        return _immutable
    return _one_of(rule)


def cel_rules(version: str = "v1") -> list[tuple[str, str, str]]:
    """Every `x-kubernetes-validations` rule: (path, rule, message)."""
    return rules_of(schema(version))


RULES_KEPT = 16
_RULES_FOUND: dict[int, tuple[Mapping[str, Any], tuple[tuple[str, str, str], ...]]] = {}
"""`rules_of` each schema it walked, by the schema's identity (the schema held, so the
identity is not reused): a schema is loaded once and only read, and walking all of
the RayCluster's (some 3,000 members) on every write was a tenth of what a patch cost."""


def rules_of(root: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every `x-kubernetes-validations` rule under the schema `root`."""
    walked = _RULES_FOUND.get(id(root))
    if walked is None or walked[0] is not root:
        walked = (root, tuple(_walk_rules(root)))
        if len(_RULES_FOUND) >= RULES_KEPT:
            _RULES_FOUND.clear()  # schemas made on the fly (tests): not held forever
        _RULES_FOUND[id(root)] = walked
    return list(walked[1])


def _walk_rules(root: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []

    def walk(schema_: Mapping[str, Any], path: str) -> None:
        for rule in schema_.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule.get("message", "")))
        for key, child in schema_.get("properties", {}).items():
            walk(child, join_path(path, key))
        for key in ("items", "additionalProperties"):
            if isinstance(schema_.get(key), Mapping):
                walk(schema_[key], f"{path}[*]" if key == "items" else f"{path}.*")

    walk(root, "")
    return found


def unmodelled_rules(version: str = "v1") -> list[tuple[str, str, str]]:
    return [r for r in cel_rules(version) if cel_rule(r[1]) is None]


def cel_errors(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, version: str
) -> Iterator[FieldError]:
    return cel_errors_against(new, old, schema(version))


def cel_errors_against(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, root: Mapping[str, Any]
) -> Iterator[FieldError]:
    """The modelled `x-kubernetes-validations` rules of the schema `root` that fail."""
    for path, rule, message in rules_of(root):
        if "*" in path:
            continue  # none in v1.7.0: rules sit on plain properties
        check = cel_rule(rule)
        value = _lookup(new, path)
        if check is None or value is _ABSENT:
            continue
        previous = _lookup(old, path) if old is not None else _ABSENT
        if not check(value, previous):
            shown = OMITTED if isinstance(value, dict | list) else value
            yield FieldError(path, "Invalid value", shown, message or f"failed rule: {rule}")


def _lookup(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, Mapping) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj
