"""What kube-apiserver stores from a ProvisioningRequest write, or why it refuses it:
cluster-autoscaler's ProvisioningRequest CustomResourceDefinition (`crds/`, group
`autoscaling.x-k8s.io`, served as `v1` and `v1beta1`, status subresource) applied by
the same machinery as the RayCluster CRD (`crd.py`): decoded (pruned, defaulted),
the status as the subresource allows, then the OpenAPI v3 schema, list-map keys and
the CRD's `self == oldSelf` rules (the spec is immutable). The simulated API server
admits every ProvisioningRequest through `admit`; unit tests validate what the
adapter writes against the same schema."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

from tpu_autoscaler.controlplane.crd_decode import decode_against
from tpu_autoscaler.controlplane.crd_errors import FieldError, Invalid
from tpu_autoscaler.controlplane.crd_openapi import errors_against
from tpu_autoscaler.controlplane.crd_rules import cel_errors_against, list_errors

CRD_FILE: Final = "provisioningrequests.autoscaling.x-k8s.io.cluster-autoscaler-1.35.2.json"
"""Under `crds/`; `crds/README.md` says where it came from."""
GROUP: Final = "autoscaling.x-k8s.io"
KIND: Final = "ProvisioningRequest"
PLURAL: Final = "provisioningrequests"
VERSION: Final = "v1"


@functools.cache
def definition() -> Mapping[str, Any]:
    text = resources.files("tpu_autoscaler.controlplane").joinpath("crds", CRD_FILE).read_text()
    crd: dict[str, Any] = json.loads(text)
    return crd


def schema(version: str = VERSION) -> Mapping[str, Any] | None:
    """The `openAPIV3Schema` of a served version; None if `version` is not served."""
    for served in definition()["spec"]["versions"]:
        if served["name"] == version and served.get("served"):
            root: Mapping[str, Any] = served["schema"]["openAPIV3Schema"]
            return root
    return None


def _version(obj: Mapping[str, Any]) -> str:
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    return version if group == GROUP else ""


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors kube-apiserver finds in a decoded ProvisioningRequest."""
    root = schema(_version(obj))
    errors: list[FieldError] = []
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", "Invalid value", obj.get("kind", ""), f"must be {KIND}"))
    if root is None:
        errors.append(
            FieldError(
                "apiVersion", "Invalid value", obj.get("apiVersion", ""), f"must be {GROUP}/v1"
            )
        )
    if errors or root is None:
        return errors
    meta = obj.get("metadata")
    if not (isinstance(meta, Mapping) and meta.get("name")):
        errors.append(
            FieldError("metadata.name", "Required value", "", "name or generateName is required")
        )
    errors += errors_against(obj, root)
    errors += list_errors(obj, root, "")
    errors += cel_errors_against(obj, old, root)
    return errors


def admit(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ProvisioningRequest as stored from a write of its main resource: decoded,
    no status on create and the stored one on update, validated; `Invalid` if refused."""
    stored = decode_against(obj, schema(_version(obj))).object
    stored.pop("status", None)
    if old is not None and "status" in old:
        stored["status"] = copy.deepcopy(old["status"])
    return _checked(stored, old)


def admit_status(obj: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """The ProvisioningRequest as stored from a write of its status subresource: the
    stored object with only the (decoded) status taken from `obj`, validated."""
    decoded = decode_against(obj, schema(_version(obj))).object
    stored = copy.deepcopy(dict(old))
    stored["status"] = decoded.get("status", {})
    return _checked(stored, old)


def _checked(stored: dict[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
    errors = validate(stored, old)
    if errors:
        name = str((stored.get("metadata") or {}).get("name", ""))
        raise Invalid(name, errors, GROUP, KIND)
    return stored
