"""What kube-apiserver stores from a RayCluster write, or why it refuses it: KubeRay
v1.7.0's RayCluster CustomResourceDefinition applied as kube-apiserver applies it
(k8s.io/apiextensions-apiserver and kube-openapi), in three steps:

1. decode (`crd_decode`): metadata cut to ObjectMeta, unknown fields pruned, nulls
   that are neither nullable nor defaulted dropped, defaults applied.
2. prepare (`registry/customresource/strategy.go`, here): with the status subresource,
   a create cannot set `status` and an update of the main resource keeps the stored one.
3. validate (here): apiVersion, kind and name; the OpenAPI v3 schema as kube-openapi
   judges and words it (`crd_openapi`); `x-kubernetes-list-type` map/set uniqueness and
   the CRD's `x-kubernetes-validations`, CEL modelled rule by rule (`crd_rules`).

The CRD itself and its schemas are in `crd_schema`, the wording of field errors in
`crd_errors`. Not modelled: validation ratcheting of unchanged fields on update (it
only ever forgives), ObjectMeta's label and annotation syntax, and int-or-string
`anyOf` alternatives ranked by match count (the first alternative's errors are reported).

A rejected write raises `Rejected` with kube-apiserver's message, e.g.
`RayCluster.ray.io "c" is invalid: spec.workerGroupSpecs[0].replicas: Invalid value:
"string": spec.workerGroupSpecs[0].replicas in body must be of type integer: "string"`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tpu_autoscaler.controlplane.crd_decode import decode
from tpu_autoscaler.controlplane.crd_errors import FieldError, Invalid
from tpu_autoscaler.controlplane.crd_openapi import schema_errors
from tpu_autoscaler.controlplane.crd_rules import cel_errors, list_errors
from tpu_autoscaler.controlplane.crd_schema import (
    GROUP,
    KIND,
    api_version_name,
    schema,
    served_version,
    served_versions,
)
from tpu_autoscaler.controlplane.json_copy import json_copy


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors kube-apiserver finds in a decoded RayCluster (`old`: the stored
    object, on update)."""
    version = api_version_name(obj)
    errors: list[FieldError] = []
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", "Invalid value", obj.get("kind", ""), f"must be {KIND}"))
    if version not in served_versions():
        errors.append(
            FieldError(
                "apiVersion", "Invalid value", obj.get("apiVersion", ""), f"must be {GROUP}/v1"
            )
        )
    if errors:
        return errors
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name:
        errors.append(
            FieldError("metadata.name", "Required value", "", "name or generateName is required")
        )
    elif name in (".", "..") or "/" in name or "%" in name:
        errors.append(FieldError("metadata.name", "Invalid value", name, _segment_problem(name)))
    errors += schema_errors(obj, version)
    errors += list_errors(obj, schema(version), "")
    errors += cel_errors(obj, old, version)
    return errors


def _segment_problem(name: str) -> str:
    if name in (".", ".."):
        return f"may not be '{name}'"
    return "may not contain '/'" if "/" in name else "may not contain '%'"


def _has_status_subresource(version: str) -> bool:
    try:
        return "status" in served_version(version).get("subresources", {})
    except KeyError:
        return False


def admit(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None = None, owned: bool = False
) -> dict[str, Any]:
    """The RayCluster as kube-apiserver stores it from this write: decoded (pruned and
    defaulted), its status as the status subresource allows (none on create, the
    stored one on update), validated. `old` is the stored object on update; a write
    the apiserver refuses raises `Invalid` (a `Rejected`) with its message. `owned`:
    `obj` is handed over, decoded in place (`crd_decode.decode_against`)."""
    stored = decode(obj, owned).object
    if _has_status_subresource(api_version_name(stored)):
        stored.pop("status", None)
        if old is not None and "status" in old:
            stored["status"] = json_copy(old["status"])
    errors = validate(stored, old)
    if errors:
        meta = stored.get("metadata")
        name = meta.get("name", "") if isinstance(meta, Mapping) else ""
        raise Invalid(str(name), errors)
    return stored


def admit_status(obj: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """The RayCluster as kube-apiserver stores a write to its status subresource
    (`statusStrategy.PrepareForUpdate`): the stored object with only the status taken
    from `obj` (decoded: pruned and defaulted; none if `obj` has none), validated."""
    decoded = decode(obj).object
    stored = copy.deepcopy(dict(old))
    if "status" in decoded:
        stored["status"] = decoded["status"]
    else:
        stored.pop("status", None)
    errors = validate(stored, old)
    if errors:
        raise Invalid(str(stored.get("metadata", {}).get("name", "")), errors)
    return stored
