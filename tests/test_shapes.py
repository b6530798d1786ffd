"""Slice shapes derived from RayCluster manifests, and the validation rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import clone, cpu_group, raycluster, slice_types, tpu_group, valid_clusters
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.manifest.loading import load_raycluster, parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

EXAMPLES = Path(__file__).parent.parent / "examples" / "clusters"


def shapes_of(obj: dict[str, Any]) -> ClusterShapes:
    return derive_shapes(parse_raycluster(obj, "test"))


def v6e(topology: str = "4x4", chips_per_host: int | None = None) -> SliceType:
    gen = catalog.find_generation("v6e")
    assert gen is not None
    return catalog.slice_type(gen, topology, chips_per_host)


# --- the examples -------------------------------------------------------------------


def test_seed_v6e_example() -> None:
    shapes = derive_shapes(load_raycluster(str(EXAMPLES / "v6e-4x4-multihost.yaml")))
    assert shapes.problems == ()
    (shape,) = shapes.shapes
    assert shape.hosts_per_replica == 4
    assert shape.chips_per_replica == 16
    assert shape.tpu_per_host == 4
    assert shape.head_resource == "TPU-v6e-16-head"
    assert shape.resources_per_host["CPU"] == 24
    assert shape.resources_per_host["memory"] == 100e9
    assert shape.idle_timeout_s == 60
    assert shape.host_resources(0)["TPU-v6e-16-head"] == 1
    assert all("TPU-v6e-16-head" not in shape.host_resources(i) for i in (1, 2, 3))
    assert shape.host_labels(3)[labels.RAY_TPU_WORKER_ID] == "3"
    assert shape.host_labels(3)[labels.RAY_NODE_GROUP] == "tpu-v6e-group"


def test_seed_tpu7x_example_counts_devices() -> None:
    shapes = derive_shapes(load_raycluster(str(EXAMPLES / "tpu7x-2x2x2-per-device.yaml")))
    assert shapes.problems == ()
    (shape,) = shapes.shapes
    assert (shape.hosts_per_replica, shape.chips_per_host, shape.tpu_per_host) == (2, 4, 8)
    assert shape.tpu_resource_per_chip == 2
    assert shape.head_resource == "TPU-v7x-16-head"
    assert shape.group_labels[labels.RAY_TPU_POD_TYPE] == "v7x-16"
    assert shape.group_labels[labels.RAY_ACCELERATOR_TYPE] == "TPU-V7X"


def test_single_host_example() -> None:
    (shape,) = derive_shapes(load_raycluster(str(EXAMPLES / "v6e-2x4-singlehost.yaml"))).shapes
    assert (shape.hosts_per_replica, shape.chips_per_host, shape.tpu.pod_type) == (1, 8, "v6e-8")  # type: ignore[union-attr]


def test_cpu_beside_tpu_example() -> None:
    shapes = derive_shapes(load_raycluster(str(EXAMPLES / "cpu-and-tpu.yaml")))
    assert shapes.problems == ()
    cpu, tpu = shapes.shapes
    assert cpu.tpu is None and cpu.hosts_per_replica == 1 and cpu.chips_per_replica == 0
    assert labels.RAY_TPU_POD_TYPE not in cpu.group_labels
    assert cpu.idle_timeout_s == 300  # the group's own timeout wins
    assert tpu.idle_timeout_s == 60
    assert tpu.upscaling_mode == "Conservative"
    assert tpu.priority == 10
    assert tpu.group_labels["example.com/pool"] == "tpu"
    assert cpu.resources_per_host["memory"] == 32 * 1024**3


# --- properties ----------------------------------------------------------------------


@given(valid_clusters())
def test_generated_valid_manifests_validate(obj: dict[str, Any]) -> None:
    shapes = shapes_of(obj)
    assert shapes.errors == ()
    assert [s.group for s in shapes.shapes] == [
        g["groupName"] for g in obj["spec"]["workerGroupSpecs"]
    ]
    for shape, group in zip(shapes.shapes, obj["spec"]["workerGroupSpecs"], strict=True):
        assert shape.hosts_per_replica == group.get("numOfHosts", 1)
        assert shape.min_replicas <= shape.max_replicas
        if shape.tpu is not None:
            assert shape.hosts_per_replica * shape.chips_per_host == shape.tpu.chips
            assert shape.host_resources(0)[shape.tpu.head_resource] == 1


def _mutate_num_of_hosts(group: dict[str, Any], s: SliceType) -> None:
    group["numOfHosts"] = s.hosts + 1


def _mutate_drop_topology(group: dict[str, Any], s: SliceType) -> None:
    del group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]


def _mutate_drop_accelerator(group: dict[str, Any], s: SliceType) -> None:
    del group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"]


def _mutate_unknown_accelerator(group: dict[str, Any], s: SliceType) -> None:
    group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] = (
        "tpu-v9-slice"
    )


def _mutate_unknown_topology(group: dict[str, Any], s: SliceType) -> None:
    group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = "3x5"


def _mutate_min_above_max(group: dict[str, Any], s: SliceType) -> None:
    group["minReplicas"] = group["maxReplicas"] + 1


def _mutate_chips_not_dividing(group: dict[str, Any], s: SliceType) -> None:
    for table in group["template"]["spec"]["containers"][0]["resources"].values():
        table["google.com/tpu"] = "3"


def _mutate_invalid_label_key(group: dict[str, Any], s: SliceType) -> None:
    # KubeRay refuses a key whose prefix is not a lowercase DNS subdomain.
    group["labels"] = {"Example.com/zone": "a"}


MUTATIONS = [
    (_mutate_num_of_hosts, "numOfHosts"),
    (_mutate_drop_topology, "gke-tpu-topology"),
    (_mutate_drop_accelerator, "gke-tpu-accelerator"),
    (_mutate_unknown_accelerator, "gke-tpu-accelerator"),
    (_mutate_unknown_topology, "gke-tpu-topology"),
    (_mutate_min_above_max, "minReplicas"),
    (_mutate_chips_not_dividing, "google.com/tpu"),
    (_mutate_invalid_label_key, "labels"),
]


@given(slice_types(), st.sampled_from(MUTATIONS), st.integers(0, 2))
def test_mutated_manifest_fails_naming_group_and_field(
    s: SliceType, mutation: Any, position: int
) -> None:
    mutate, field = mutation
    good = [tpu_group(f"ok-{i}", s) for i in range(2)] + [cpu_group("cpu")]
    bad = tpu_group("broken", s)
    mutate(bad, s)
    groups = list(good)
    groups.insert(position, bad)
    shapes = shapes_of(raycluster(*groups))
    assert shapes.errors, "the mutation must be caught"
    assert all(p.group == "broken" for p in shapes.errors)
    assert any(field in p.path for p in shapes.errors)
    assert all(f"spec.workerGroupSpecs[{position}]" in p.path for p in shapes.errors)
    # The other groups keep their shapes: an invalid group never blocks the rest.
    assert sorted(x.group for x in shapes.shapes) == ["cpu", "ok-0", "ok-1"]


# --- individual rules ----------------------------------------------------------------


def test_num_of_hosts_error_says_what_is_valid() -> None:
    group = tpu_group("g", v6e())
    group["numOfHosts"] = 2
    (problem,) = shapes_of(raycluster(group)).errors
    assert "set numOfHosts: 4" in problem.message
    assert str(problem).startswith("error: worker group 'g': spec.workerGroupSpecs[0].numOfHosts")


def test_two_by_four_on_two_four_chip_hosts() -> None:
    shape = shapes_of(raycluster(tpu_group("g", v6e("2x4", 4)))).shapes[0]
    assert (shape.hosts_per_replica, shape.chips_per_host) == (2, 4)


def test_duplicate_group_names() -> None:
    shapes = shapes_of(raycluster(tpu_group("g", v6e()), cpu_group("g")))
    (problem,) = shapes.errors
    assert problem.path == "spec.workerGroupSpecs[1].groupName"
    assert [s.group for s in shapes.shapes] == ["g"]


def test_tpu_limit_and_request_must_agree() -> None:
    group = tpu_group("g", v6e())
    group["template"]["spec"]["containers"][0]["resources"]["requests"]["google.com/tpu"] = "8"
    (problem,) = shapes_of(raycluster(group)).errors
    assert "differ" in problem.message


def test_tpu_request_alone_is_enough() -> None:
    group = tpu_group("g", v6e())
    del group["template"]["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"]
    assert shapes_of(raycluster(group)).shapes[0].chips_per_host == 4


def test_missing_cpu_is_an_error_unless_given_elsewhere() -> None:
    group = cpu_group("c")
    for table in group["template"]["spec"]["containers"][0]["resources"].values():
        del table["cpu"]
    (problem,) = shapes_of(raycluster(clone(group))).errors
    assert "num-cpus" in problem.message
    group["rayStartParams"] = {"num-cpus": "3"}
    assert shapes_of(raycluster(group)).shapes[0].resources_per_host["CPU"] == 3


def test_group_resources_field_wins() -> None:
    group = tpu_group(
        "g", v6e(), resources={"CPU": "2", "TPU": "8", "memory": "1Gi", "my-res": "3"}
    )
    shapes = shapes_of(raycluster(group))
    shape = shapes.shapes[0]
    assert shape.resources_per_host["CPU"] == 2
    assert shape.resources_per_host["memory"] == 1024**3
    assert shape.resources_per_host["my-res"] == 3
    assert shape.tpu_per_host == 8


def test_resources_in_both_places_refused_as_kuberay_does() -> None:
    group = tpu_group("g", v6e(), resources={"my-res": "3"})
    group["rayStartParams"] = {"resources": '"{\\"other\\": 1}"'}
    (problem,) = shapes_of(raycluster(group)).errors
    assert problem.path == "spec.workerGroupSpecs[0].resources"
    assert "KubeRay refuses" in problem.message and "both" in problem.message


def test_ray_start_params_custom_resources() -> None:
    group = tpu_group("g", v6e(), rayStartParams={"resources": '"{\\"TPU\\": 4, \\"spot\\": 1}"'})
    shape = shapes_of(raycluster(group)).shapes[0]
    assert shape.resources_per_host["spot"] == 1
    assert shape.tpu_per_host == 4


def test_bad_ray_start_params_resources() -> None:
    group = tpu_group("g", v6e(), rayStartParams={"resources": "{TPU: eight}"})
    (problem,) = shapes_of(raycluster(group)).errors
    assert problem.path.endswith("rayStartParams.resources")


def test_resource_per_chip_without_override_warns() -> None:
    s = catalog.slice_type(catalog.find_generation("tpu7x"), "2x2x2")  # type: ignore[arg-type]
    group = tpu_group("g", s)
    group["template"]["spec"]["containers"][0]["env"] = [
        {"name": "RAY_TPU_RESOURCE_PER_CHIP", "value": "2"}
    ]
    shapes = shapes_of(raycluster(group))
    assert shapes.errors == ()
    (warning,) = shapes.warnings
    assert "TPU: 8" in warning.message
    assert shapes.shapes[0].tpu_per_host == 4


def test_bad_resource_per_chip() -> None:
    group = tpu_group("g", v6e())
    group["template"]["spec"]["containers"][0]["env"] = [
        {"name": "RAY_TPU_RESOURCE_PER_CHIP", "value": "0"}
    ]
    (problem,) = shapes_of(raycluster(group)).errors
    assert "RAY_TPU_RESOURCE_PER_CHIP" in problem.path


def test_idle_timeout_precedence() -> None:
    with_group = tpu_group("a", v6e(), idleTimeoutSeconds=30)
    without = tpu_group("b", v6e())
    shapes = shapes_of(raycluster(with_group, without, idleTimeoutSeconds=90))
    assert [s.idle_timeout_s for s in shapes.shapes] == [30, 90]
    assert shapes_of(raycluster(tpu_group("c", v6e()))).shapes[0].idle_timeout_s == 60


def test_tpu_selectors_without_tpu_request_warn() -> None:
    group = cpu_group("c")
    group["template"]["spec"]["nodeSelector"] = {"cloud.google.com/gke-tpu-topology": "4x4"}
    shapes = shapes_of(raycluster(group))
    assert shapes.errors == () and len(shapes.warnings) == 1


def test_type_errors_name_the_group() -> None:
    group = tpu_group("typed", v6e())
    group["numOfHosts"] = "four"
    with pytest.raises(ManifestError) as caught:
        parse_raycluster(raycluster(cpu_group("cpu"), group), "m.yaml")
    (problem,) = caught.value.problems
    assert problem.group == "typed"
    assert "spec.workerGroupSpecs[1].numOfHosts" in problem.path


def test_unknown_fields_are_kept() -> None:
    obj = raycluster(tpu_group("g", v6e(), futureField={"x": 1}))
    obj["spec"]["someNewThing"] = True
    cluster = parse_raycluster(obj, "m")
    dumped = cluster.model_dump(exclude_unset=True)
    assert dumped["spec"]["someNewThing"] is True
    assert dumped["spec"]["workerGroupSpecs"][0]["futureField"] == {"x": 1}


def test_a_group_idle_timeout_without_autoscaler_v2_is_refused_as_kuberay_refuses_it() -> None:
    group = tpu_group("slices", v6e(), 0, 2, idleTimeoutSeconds=30)
    v1 = raycluster(group, version="v1")
    (problem,) = shapes_of(v1).errors
    assert problem.path == "spec.workerGroupSpecs[0].idleTimeoutSeconds"
    assert "autoscalerOptions.version: v2" in problem.message
    assert not shapes_of(raycluster(clone(group))).errors  # the factory's v2
    by_env = raycluster(clone(group), version="v1")
    head = by_env["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [{"name": "RAY_enable_autoscaler_v2", "value": "true"}]
    assert not shapes_of(by_env).errors
