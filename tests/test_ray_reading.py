"""The reading rules of `manifest/ray_resources.py`, `manifest/node_labels.py` and
`manifest/head.py`, one example each, with who refuses and why; the differential
property test (`test_manifest_vs_ray.py`) checks them all against Ray at once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import cpu_group, raycluster, tpu_group
from tpu_autoscaler.core import catalog
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

V6E_4X4 = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]


def shapes_of(obj: dict[str, Any]) -> ClusterShapes:
    return derive_shapes(parse_raycluster(obj, "test"))


def only_error(obj: dict[str, Any]) -> str:
    (problem,) = shapes_of(obj).errors
    return str(problem)


def worker(group: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    group["template"]["spec"]["containers"][0]["resources"] = resources
    return group


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"limits": {"cpu": "1500m", "memory": "2Gi"}}, {"CPU": 2, "memory": 2 * 1024**3}),
        ({"requests": {"cpu": "0.5", "memory": "2G"}}, {"CPU": 1, "memory": 2e9}),
        ({"limits": {"cpu": "1e1"}, "requests": {"cpu": "2"}}, {"CPU": 10}),  # limits win
        ({"limits": {"cpu": 4, "amd.com/gpu": "2"}}, {"CPU": 4, "GPU": 2}),
        ({"requests": {"cpu": "2", "nvidia.com/gpu": 1}}, {"CPU": 2, "GPU": 1}),
    ],
)
def test_container_quantities_read_as_ray_reads_them(
    resources: dict[str, Any], expected: dict[str, float]
) -> None:
    (shape,) = shapes_of(raycluster(worker(cpu_group("c"), resources))).shapes
    assert dict(shape.resources_per_host) == expected


def test_group_resources_rounded_up_and_exclusive_for_custom() -> None:
    group = cpu_group("c", resources={"CPU": "2.5", "memory": "1Gi", "spot": "1500m"})
    (shape,) = shapes_of(raycluster(group)).shapes
    assert dict(shape.resources_per_host) == {"CPU": 3, "memory": 1024**3, "spot": 2}


@pytest.mark.parametrize("param", ["num-cpus", "num-gpus", "memory"])
def test_ray_start_params_take_whole_numbers_only(param: str) -> None:
    group = cpu_group("c", rayStartParams={param: "1.5"})
    message = only_error(raycluster(group))
    assert f"rayStartParams.{param}" in message and "whole number" in message


@pytest.mark.parametrize("raw", ['"{\\"spot\\": 1.5}"', '{"spot": 1}', '"{spot: 1}"'])
def test_ray_start_params_resources_as_ray_parses_them(raw: str) -> None:
    message = only_error(raycluster(cpu_group("c", rayStartParams={"resources": raw})))
    assert "rayStartParams.resources" in message and "Ray's autoscaler" in message


def test_tpu_written_on_a_cpu_group_is_kept() -> None:
    (shape,) = shapes_of(raycluster(cpu_group("c", resources={"TPU": "4"}))).shapes
    assert shape.resources_per_host["TPU"] == 4 and shape.tpu is None


@pytest.mark.parametrize(
    ("key", "who"),
    [
        ("Example.com/zone", "KubeRay refuses the RayCluster: invalid label key"),
        ("a..b/zone", "KubeRay refuses the RayCluster: invalid label key"),
        ("/zone", "KubeRay refuses the RayCluster: invalid label key"),
        ("x" * 64 + ".com/zone", "Ray refuses the label: Invalid label key prefix"),
    ],
)
def test_label_keys_refused_by_whoever_refuses_them(key: str, who: str) -> None:
    assert who in only_error(raycluster(cpu_group("c", labels={key: "a"})))


def test_ray_io_labels_accepted_and_override_what_ray_derives() -> None:
    group = tpu_group(
        "t", V6E_4X4, labels={"ray.io/market-type": "spot", "ray.io/tpu-topology": "2x8"}
    )
    shapes = shapes_of(raycluster(group))
    (shape,) = shapes.shapes
    assert shape.group_labels["ray.io/market-type"] == "spot"
    assert shape.group_labels["ray.io/tpu-topology"] == "2x8"  # the raylet keeps yours
    (warning,) = shapes.warnings
    assert "overrides the '4x4'" in warning.message


def test_ray_start_params_labels_refused_as_kuberay_does() -> None:
    message = only_error(raycluster(cpu_group("c", rayStartParams={"labels": "a=b"})))
    assert "rayStartParams.labels" in message and "top-level Labels field" in message


def test_head_read_like_a_group() -> None:
    cluster = raycluster(cpu_group("c"))
    head = cluster["spec"]["headGroupSpec"]
    head["resources"] = {"CPU": "0", "memory": "1Gi"}
    head["labels"] = {"ray.io/region": "us-central2"}
    shapes = shapes_of(cluster)
    assert shapes.head is not None
    assert shapes.head.resources == {"CPU": 0, "memory": 1024**3}
    assert shapes.head.labels["ray.io/region"] == "us-central2"
    worker(head, {})
    del head["resources"]
    message = only_error(cluster)
    assert message.startswith("error: worker group 'headgroup': spec.headGroupSpec.template")


@pytest.mark.parametrize(
    ("ray_version", "version", "refused"),
    [(None, "v2", "rayVersion is not"), ("2.52.0", "v2", "minimum is 2.56.0"),
     ("2.60.0", "v1", "autoscaler v2"), ("2.60.0", "v2", None)],
)  # fmt: skip
def test_priority_needs_ray_2_56_and_v2(
    ray_version: str | None, version: str, refused: str | None
) -> None:
    cluster = raycluster(cpu_group("c", priority=2))
    cluster["spec"]["autoscalerOptions"]["version"] = version
    cluster["spec"].pop("rayVersion")
    if ray_version:
        cluster["spec"]["rayVersion"] = ray_version
    shapes = shapes_of(cluster)
    if refused is None:
        assert shapes.errors == () and shapes.shapes[0].priority == 2
    else:
        assert refused in only_error(cluster) and "KubeRay refuses" in only_error(cluster)


def test_a_lower_case_standard_name_in_resources_is_read_as_ray_reads_it_and_warned() -> None:
    shapes = shapes_of(raycluster(cpu_group("c", resources={"CPU": "1", "cpu": "2"})))
    assert shapes.shapes[0].resources_per_host["cpu"] == 2  # Ray's config: a custom resource
    (warning,) = shapes.warnings
    assert warning.path.endswith("resources[cpu]") and "write CPU" in warning.message
