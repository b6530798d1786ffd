"""What kube-apiserver's decode leaves of a RayCluster write
(`customresource_handler.go`, `unstructuredSchemaCoercer.apply`): the root `metadata`
cut down to ObjectMeta's fields; every field the structural schema does not declare
pruned (`pruning/algorithm.go`: `x-kubernetes-preserve-unknown-fields` keeps them,
`apiVersion`/`kind`/`metadata` of the root and of embedded resources are never
pruned); nulls that are neither `nullable` nor defaulted dropped
(`PruneNonNullableNullsWithoutDefaults`); then `default`s applied
(`defaulting/algorithm.go`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tpu_autoscaler.controlplane.crd_errors import join_path
from tpu_autoscaler.controlplane.crd_schema import api_version_name, child_schema, schema
from tpu_autoscaler.controlplane.json_copy import json_copy

OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
"""metav1.ObjectMeta's JSON fields: the rest of a CR's `metadata` is dropped on decode."""

_META_FIELDS: Final = frozenset({"apiVersion", "kind", "metadata"})


@dataclass(frozen=True)
class Decoded:
    object: dict[str, Any]
    unknown_fields: tuple[str, ...]
    """The pruned fields' paths, as kube-apiserver's `unknown field` warnings name them."""


def decode(obj: Mapping[str, Any], owned: bool = False) -> Decoded:
    """`obj` as kube-apiserver decodes a RayCluster from a request body (`owned`: see
    `decode_against`)."""
    try:
        root = schema(api_version_name(obj))
    except KeyError:
        root = None
    return decode_against(obj, root, owned)


def decode_against(
    obj: Mapping[str, Any], root: Mapping[str, Any] | None, owned: bool = False
) -> Decoded:
    """`obj` decoded under a CRD's `openAPIV3Schema` `root` (None: metadata only).
    `obj` stays as it was, unless `owned`: the caller made it for this call alone (the
    store's copy of a write) and hands it over, and it is decoded in place rather than
    copied once more (a RayCluster's templates are most of a write's copying)."""
    decoded = dict(obj) if owned else json_copy(dict(obj))
    unknown: list[str] = []
    meta = decoded.get("metadata")
    if isinstance(meta, dict):
        for key in sorted(set(meta) - OBJECT_META_FIELDS):
            unknown.append(f"metadata.{key}")
            del meta[key]
    if root is None:
        return Decoded(decoded, ())
    _prune(decoded, root, "", unknown, embedded=True)
    _drop_non_nullable_nulls(decoded, root)
    _apply_defaults(decoded, root)
    return Decoded(decoded, tuple(sorted(unknown)))


def _prune(
    value: Any, schema_: Mapping[str, Any] | None, path: str, unknown: list[str], embedded: bool
) -> None:
    preserve = schema_ is not None and schema_.get("x-kubernetes-preserve-unknown-fields", False)
    if isinstance(value, dict):
        if schema_ is None:
            unknown.extend(join_path(path, k) for k in value)
            value.clear()
            return
        has_additional = isinstance(schema_.get("additionalProperties"), Mapping)
        for key in list(value):
            if embedded and key in _META_FIELDS:
                continue
            if key in schema_.get("properties", {}) or has_additional:
                child = child_schema(schema_, key)
                _prune(
                    value[key],
                    child,
                    join_path(path, key),
                    unknown,
                    bool(child and child.get("x-kubernetes-embedded-resource")),
                )
            elif not preserve:
                unknown.append(join_path(path, key))
                del value[key]
    elif isinstance(value, list):
        items = schema_.get("items") if schema_ is not None else None
        if preserve and items is None:
            return
        item_schema = items if isinstance(items, Mapping) else None
        embedded_item = bool(item_schema and item_schema.get("x-kubernetes-embedded-resource"))
        # Only containers have fields to prune (a long `workersToDelete` holds strings).
        for index in _containers(value):
            _prune(value[index], item_schema, f"{path}[{index}]", unknown, embedded_item)


def _drop_non_nullable_nulls(value: Any, schema_: Mapping[str, Any] | None) -> None:
    if isinstance(value, dict):
        for key in list(value):
            child = child_schema(schema_, key)
            if (
                value[key] is None
                and child is not None
                and not child.get("nullable", False)
                and "default" not in child
            ):
                del value[key]
            else:
                _drop_non_nullable_nulls(value[key], child)
    elif isinstance(value, list):
        items = schema_.get("items") if schema_ is not None else None
        for index in _containers(value):
            _drop_non_nullable_nulls(value[index], items if isinstance(items, Mapping) else None)


def _apply_defaults(value: Any, schema_: Mapping[str, Any] | None) -> None:
    if schema_ is None:
        return
    if isinstance(value, dict):
        for key, prop in schema_.get("properties", {}).items():
            if "default" in prop and (
                key not in value or (value[key] is None and not prop.get("nullable", False))
            ):
                value[key] = copy.deepcopy(prop["default"])
        additional = schema_.get("additionalProperties")
        for key in list(value):
            if key in schema_.get("properties", {}):
                _apply_defaults(value[key], schema_["properties"][key])
            elif isinstance(additional, Mapping):
                if _defaults_null(value[key], additional):
                    value[key] = copy.deepcopy(additional["default"])
                _apply_defaults(value[key], additional)
    elif isinstance(value, list):
        items = schema_.get("items")
        if isinstance(items, Mapping):
            if "default" in items:
                for index, item in enumerate(value):
                    if _defaults_null(item, items):
                        value[index] = copy.deepcopy(items["default"])
            for index in _containers(value):
                _apply_defaults(value[index], items)


_ATOMS: Final = frozenset({str, int, float, bool, type(None)})


def _containers(items: list[Any]) -> list[int]:
    """The indexes of the dicts and lists among `items` (the three walks change
    nothing in anything else), none if all are JSON atoms, found in C: a long
    `workersToDelete` holds strings, each a Python step before."""
    if set(map(type, items)) <= _ATOMS:
        return []
    return [index for index, item in enumerate(items) if isinstance(item, dict | list)]


def _defaults_null(value: Any, schema_: Mapping[str, Any]) -> bool:
    return value is None and not schema_.get("nullable", False) and "default" in schema_
