"""KubeRay's CRDs edited for a Kubernetes 1.20 API server (`controlplane.kube120`): the
two edits and nothing else. The real server's side is tests/realkube."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpu_autoscaler.controlplane import crd_schema, kube120


def _defaults(node: Any) -> int:
    if isinstance(node, dict):
        own = 1 if node.get("default") == "" and isinstance(node.get("type"), str) else 0
        return own + sum(_defaults(v) for v in node.values())
    if isinstance(node, list):
        return sum(_defaults(v) for v in node)
    return 0


def _pointer(document: Any, path: str) -> Any:
    for part in path.strip("/").split("/"):
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


@pytest.mark.parametrize(
    ("kind", "dropped", "required"),
    [("RayCluster", 146, 4), ("RayJob", 212, 6), ("RayService", 146, 4)],
)
def test_the_edits_drop_every_empty_default_and_require_the_keys_that_had_one(
    kind: str, dropped: int, required: int
) -> None:
    original = kube120.kuberay_crd(kind)
    edited, edits = kube120.for_kube_1_20(original)
    assert (len(edits.defaults_dropped), len(edits.keys_required)) == (dropped, required)
    assert _defaults(original) == dropped and _defaults(edited) == 0
    for path in edits.defaults_dropped:
        assert _pointer(original, path) == ""
    for path in edits.keys_required:
        items, _, key = path.rpartition("/properties/")
        assert key == "name" and items.endswith("/imagePullSecrets/items")
        assert key in _pointer(edited, items)["required"]
        assert key not in _pointer(original, items).get("required", [])
    assert kube120.for_kube_1_20(edited)[1] == kube120.Edits((), ())


def test_nothing_else_changes() -> None:
    original = kube120.kuberay_crd("RayCluster")
    edited, edits = kube120.for_kube_1_20(original)
    restored = json.loads(json.dumps(edited))
    for path in edits.defaults_dropped:
        parent, _, _ = path.rpartition("/")
        _pointer(restored, parent)["default"] = ""
    for path in edits.keys_required:
        items, _, key = path.rpartition("/properties/")
        node = _pointer(restored, items)
        node["required"].remove(key)
        if not node["required"]:
            del node["required"]
    assert json.dumps(restored, sort_keys=True) == json.dumps(original, sort_keys=True)


def test_the_raycluster_crd_is_the_one_the_simulator_validates_with() -> None:
    assert kube120.kuberay_crd("RayCluster") == crd_schema.definition()
    assert kube120.CRD_FILES["RayCluster"] == crd_schema.CRD_FILE
