"""How kube-apiserver applies a JSON patch (RFC 6902, evanphx/json-patch v4) to a stored
object: one operation at a time, in place, refusing an operation that does not apply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpu_autoscaler.adapters.kube.api import Conflict, Rejected
from tpu_autoscaler.controlplane.json_copy import json_copy


def apply_operation(
    document: dict[str, Any], operation: Mapping[str, Any], copy_value: bool = True
) -> None:
    """One RFC 6902 operation on `document` in place (add, replace, remove, test, copy,
    move), as kube-apiserver's json-patch (evanphx/json-patch v4) applies it: every step of the
    path must exist (`add` creates only the last member), `remove` needs its target,
    list indexes must be in range; a patch that does not apply is refused (422). One
    leniency of v4 is kept because Ray's stock provider relies on it: `replace` of a
    missing object member sets it (Ray replaces `scaleStrategy`, which manifests
    often omit).

    The value added or replaced is a copy (the caller's patch stays its own), unless
    `copy_value` is False: the caller made the value for this operation alone and
    hands it over."""
    op = operation["op"]
    path = operation["path"]
    if op in ("copy", "move"):
        source = operation["from"]
        value = _resolve(document, source, op)
        if op == "move":
            apply_operation(document, {"op": "remove", "path": source})
        apply_operation(document, {"op": "add", "path": path, "value": value})
        return
    parts = _PATHS.get(path)
    if parts is None:
        parts = _parts(path)
    parent: Any = document
    for part in parts[:-1]:
        # A plain dict's member looked up inline: a pod's creation applies eight.
        parent = parent.get(part) if type(parent) is dict else _child(parent, part)
        if parent is None:
            raise Rejected(f"{op} operation does not apply: doc is missing path: {path}")
    last = parts[-1]
    if op == "test":
        value = _child(parent, last)
        if value != operation["value"]:
            raise Conflict(f"test failed at {path}: {value!r} != {operation['value']!r}")
    elif op == "add":
        if isinstance(parent, list):
            index = len(parent) if last == "-" else _index(last, len(parent) + 1, op, path)
            parent.insert(index, _value(operation, copy_value))
        else:
            parent[last] = _value(operation, copy_value)
    elif op in ("replace", "remove"):
        exists = _child(parent, last) is not None or (isinstance(parent, dict) and last in parent)
        if not exists and (op == "remove" or isinstance(parent, list)):
            raise Rejected(f"{op} operation does not apply: doc is missing key: {path}")
        if isinstance(parent, list):
            index = _index(last, len(parent), op, path)
            if op == "replace":
                parent[index] = _value(operation, copy_value)
            else:
                del parent[index]
        elif op == "replace":
            parent[last] = _value(operation, copy_value)
        else:
            del parent[last]
    else:
        raise Rejected(f"unsupported patch operation {op!r}")


_PATHS: dict[str, list[str]] = {}
"""Each path's members, by path, kept for the few paths patches name over and over
(the TPU webhook's eight per pod created); read only."""
PATHS_KEPT = 256


def _parts(path: str) -> list[str]:
    """The members `path` names (a JSON pointer: `~1` is `/`, `~0` is `~`), kept."""
    parts = path.lstrip("/").split("/")
    if "~" in path:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in parts]
    if len(_PATHS) >= PATHS_KEPT:
        _PATHS.clear()
    _PATHS[path] = parts
    return parts


def _value(operation: Mapping[str, Any], copy_value: bool) -> Any:
    return json_copy(operation["value"]) if copy_value else operation["value"]


def _resolve(document: Any, path: str, op: str) -> Any:
    """The value at `path` (a copy/move's `from`), which must exist."""
    value = document
    for part in (p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdecimal() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise Rejected(f"{op} operation does not apply: doc is missing from path: {path}")
    return json_copy(value)


def _child(parent: Any, part: str) -> Any:
    if isinstance(parent, dict):
        return parent.get(part)
    if isinstance(parent, list) and part.isdecimal() and int(part) < len(parent):
        return parent[int(part)]
    return None


def _index(part: str, limit: int, op: str, path: str) -> int:
    if not part.isdecimal() or int(part) >= limit:
        raise Rejected(f"{op} operation does not apply: index out of range: {path}")
    return int(part)
