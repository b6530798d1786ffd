"""KubeRay v1.7.0's CustomResourceDefinitions (RayCluster, RayJob, RayService, kept
under `crds/` as KubeRay ships them) as a Kubernetes 1.20 API server accepts them.

KubeRay generates its CRDs with controller-gen 0.16, for current API servers. A 1.20
server (the real one the `kube_real` tests run,
built by `make kube-binaries`) refuses them as they are, so `for_kube_1_20` makes two
edits, and only these two, in every served version's `openAPIV3Schema`:

1. `default: ""` is dropped wherever it appears (146 string fields of the RayCluster
   CRD, 212 of RayJob's, 146 of RayService's; zero values that Go's `omitempty` leaves
   out anyway). 1.20 reads an empty-string default as null and refuses each one:
   `...default: Invalid value: "null": in body must be of type string: "null"`.
2. A list-map key (a name in `x-kubernetes-list-map-keys`) whose only guarantee of a
   value was that default becomes `required` in the list's `items`; without, 1.20
   refuses it: `Required value: this property is in x-kubernetes-list-map-keys, so it
   must have a default or be a required property`. These are the `name` of
   `imagePullSecrets` in every pod template (4 keys in the RayCluster CRD, 6 in
   RayJob's, 4 in RayService's).

Nothing else changes. What a 1.20 server then enforces differently from a current
one: it ignores `x-kubernetes-validations` (CEL rules, alpha in 1.23; two fields of
the RayCluster v1 schema have them, see `crd_rules.cel_rules`), which it drops when it
decodes the CRD; and an `imagePullSecrets` entry without a `name` is refused instead
of given the name "". Everything else KubeRay's schema says (types, enums, pruning,
the other defaults, list-map uniqueness, the status subresource) is enforced."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

KUBERAY_VERSION: Final = "v1.7.0"
CRD_FILES: Final = {
    "RayCluster": f"rayclusters.ray.io.{KUBERAY_VERSION}.json",
    "RayJob": f"rayjobs.ray.io.{KUBERAY_VERSION}.json",
    "RayService": f"rayservices.ray.io.{KUBERAY_VERSION}.json",
}


@dataclass(frozen=True)
class Edits:
    """What `for_kube_1_20` changed: the JSON paths (within the CRD document) of the
    defaults dropped and of the list-map keys made required."""

    defaults_dropped: tuple[str, ...]
    keys_required: tuple[str, ...]


def kuberay_crd(kind: str) -> dict[str, Any]:
    """KubeRay's CRD for `kind` (RayCluster, RayJob or RayService), unchanged."""
    text = resources.files("tpu_autoscaler.controlplane").joinpath("crds", CRD_FILES[kind])
    document: dict[str, Any] = json.loads(text.read_text())
    return document


def for_kube_1_20(crd: Mapping[str, Any]) -> tuple[dict[str, Any], Edits]:
    """A copy of `crd` with the two edits described in this module's docstring."""
    edited = copy.deepcopy(dict(crd))
    dropped: list[str] = []
    required: list[str] = []
    for index, version in enumerate(edited["spec"]["versions"]):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is not None:
            root = f"/spec/versions/{index}/schema/openAPIV3Schema"
            for path, node in _walk(schema, root):
                _edit(node, path, dropped, required)
    return edited, Edits(tuple(dropped), tuple(required))


def kuberay_crds_for_kube_1_20() -> list[dict[str, Any]]:
    """RayCluster, RayJob and RayService, edited for a 1.20 API server."""
    return [for_kube_1_20(kuberay_crd(kind))[0] for kind in CRD_FILES]


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object under `node`, children after their parent."""
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from _walk(child, f"{path}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _walk(child, f"{path}/{index}")


def _edit(node: dict[str, Any], path: str, dropped: list[str], required: list[str]) -> None:
    """Edit 2 on a list-map whose keys default to "" (before edit 1 reaches the keys,
    which are its children), then edit 1 on the node itself."""
    if node.get("x-kubernetes-list-type") == "map":
        items = node.get("items") or {}
        properties = items.get("properties") or {}
        for key in node.get("x-kubernetes-list-map-keys") or []:
            keyed = properties.get(key) or {}
            if keyed.get("default") == "" and key not in items.get("required", []):
                items.setdefault("required", []).append(key)
                required.append(f"{path}/items/properties/{key}")
    if "default" in node and node["default"] == "" and _is_schema(node):
        del node["default"]
        dropped.append(f"{path}/default")


def _is_schema(node: Mapping[str, Any]) -> bool:
    """A schema object, not a `properties` map that happens to have a field named
    `default` (none in KubeRay's CRDs, whose such fields would be objects anyway)."""
    return isinstance(node.get("type"), str) or "x-kubernetes-int-or-string" in node
