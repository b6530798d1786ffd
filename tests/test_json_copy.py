"""`json_copy` makes the copy `copy.deepcopy` makes of a JSON document: equal, nothing
shared with the original, and a member reachable by two paths one member of the copy
(a pod built in Python may share one; the committed snapshots' YAML shows it)."""

from __future__ import annotations

import copy
import random
from typing import Any

from tpu_autoscaler.controlplane.json_copy import json_copy


def _tree(rng: random.Random, shared: list[Any], depth: int = 0) -> Any:
    roll = rng.random()
    if shared and roll < 0.15:
        return rng.choice(shared)
    if depth > 3 or roll < 0.4:
        return rng.choice(["a", 1, 2.5, True, None, (1, "t")])
    if roll < 0.7:
        made: Any = {f"k{i}": _tree(rng, shared, depth + 1) for i in range(rng.randrange(4))}
    else:
        made = [_tree(rng, shared, depth + 1) for _ in range(rng.randrange(4))]
    shared.append(made)
    return made


def _shape(value: Any, seen: dict[int, int]) -> Any:
    """`value` with each container numbered in the order first met: equal shapes share
    the same members the same way."""
    if isinstance(value, dict | list):
        if id(value) in seen:
            return ("again", seen[id(value)])
        seen[id(value)] = len(seen)
        members = value.items() if isinstance(value, dict) else enumerate(value)
        return (type(value).__name__, [(k, _shape(v, seen)) for k, v in members])
    return value


def _containers(value: Any, found: set[int]) -> set[int]:
    if isinstance(value, dict | list) and id(value) not in found:
        found.add(id(value))
        for member in value.values() if isinstance(value, dict) else value:
            _containers(member, found)
    return found


def test_json_copy_is_deepcopys_copy() -> None:
    rng = random.Random(3)
    for _ in range(300):
        tree = _tree(rng, [])
        ours, theirs = json_copy(tree), copy.deepcopy(tree)
        assert ours == tree
        assert _shape(ours, {}) == _shape(theirs, {}) == _shape(tree, {})
        assert not _containers(ours, set()) & _containers(tree, set())
