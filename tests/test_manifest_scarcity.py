"""A group's scarcity settings (warm slices, cost, queued provisioning), read from its
pod template's annotations, and the refusals that name the annotation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import raycluster, tpu_group
from tests.test_shapes import shapes_of, v6e
from tpu_autoscaler.core.capacity import (
    COST_ANNOTATION,
    DEFAULT_SCARCITY,
    QUEUED_PROVISIONING_ANNOTATION,
    WARM_REPLICAS_ANNOTATION,
    ScarcitySettings,
)


def annotated(annotations: dict[str, str], max_replicas: int = 4) -> dict[str, Any]:
    group = tpu_group("spot", v6e(), max_replicas=max_replicas)
    group["template"].setdefault("metadata", {})["annotations"] = annotations
    return raycluster(group)


def test_no_annotations_mean_the_defaults() -> None:
    (shape,) = shapes_of(raycluster(tpu_group("spot", v6e()))).shapes
    assert shape.scarcity == DEFAULT_SCARCITY


def test_all_three_are_read() -> None:
    cluster = annotated(
        {
            WARM_REPLICAS_ANNOTATION: "2",
            COST_ANNOTATION: "0.4",
            QUEUED_PROVISIONING_ANNOTATION: "true",
            "other.example.com/kept": "x",
        }
    )
    (shape,) = shapes_of(cluster).shapes
    assert shape.scarcity == ScarcitySettings(warm_replicas=2, cost=0.4, queued_provisioning=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        (WARM_REPLICAS_ANNOTATION, "one", "whole number"),
        (WARM_REPLICAS_ANNOTATION, "-1", "whole number"),
        (WARM_REPLICAS_ANNOTATION, "5", "above maxReplicas 4"),
        (COST_ANNOTATION, "cheap", ">= 0"),
        (COST_ANNOTATION, "-2", ">= 0"),
        (COST_ANNOTATION, "nan", ">= 0"),
        (QUEUED_PROVISIONING_ANNOTATION, "yes", '"true" or "false"'),
    ],
)
def test_bad_values_are_refused_by_name(key: str, value: str, says: str) -> None:
    found = shapes_of(annotated({key: value}))
    assert found.shapes == ()
    (problem,) = [p for p in found.problems if p.severity == "error"]
    assert problem.path == f"spec.workerGroupSpecs[0].template.metadata.annotations[{key}]"
    assert says in problem.message and value in problem.message


def test_an_unknown_setting_of_ours_is_warned() -> None:
    found = shapes_of(annotated({"tpu-autoscaler.dev/warm-replica": "1"}))
    (shape,) = found.shapes
    assert shape.scarcity == DEFAULT_SCARCITY
    assert any("is not a setting" in w.message for w in shape.warnings)
