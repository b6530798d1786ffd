"""Which RayCluster CRD the simulated API server applies, and its schema: KubeRay
v1.7.0's CustomResourceDefinition (loaded once from `crds/`), its served versions, each
version's `openAPIV3Schema`, and the step from a schema to a field's schema."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

CRD_FILE: Final = "rayclusters.ray.io.v1.7.0.json"
"""Under `tpu_autoscaler/controlplane/crds/`; `crds/README.md` says where it came from."""

GROUP: Final = "ray.io"
KIND: Final = "RayCluster"


@functools.cache
def definition() -> Mapping[str, Any]:
    """The CustomResourceDefinition, loaded once."""
    text = resources.files("tpu_autoscaler.controlplane").joinpath("crds", CRD_FILE).read_text()
    crd: dict[str, Any] = json.loads(text)
    return crd


def served_versions() -> list[str]:
    return [v["name"] for v in definition()["spec"]["versions"] if v.get("served")]


def served_version(name: str) -> Mapping[str, Any]:
    for version in definition()["spec"]["versions"]:
        if version["name"] == name and version.get("served"):
            return version  # type: ignore[no-any-return]
    raise KeyError(name)


def schema(version: str = "v1") -> Mapping[str, Any]:
    """The `openAPIV3Schema` of a served version."""
    return served_version(version)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def api_version_name(obj: Mapping[str, Any]) -> str:
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    return version if group == GROUP else ""


def child_schema(schema_: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    if schema_ is None:
        return None
    properties = schema_.get("properties", {})
    if key in properties:
        return properties[key]  # type: ignore[no-any-return]
    additional = schema_.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None
