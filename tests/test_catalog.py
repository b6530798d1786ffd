"""Properties of the slice catalog that hold for every generation and topology."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import ALL_SLICE_TYPES, slice_types
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.catalog import CatalogError, SliceType


@given(slice_types())
def test_hosts_times_chips_per_host_is_topology_chips(s: SliceType) -> None:
    assert s.hosts * s.chips_per_host == catalog.chips_in_topology(s.topology)
    assert s.hosts >= 1


@given(slice_types())
def test_pod_type_counts_cores(s: SliceType) -> None:
    gen, size = s.pod_type.rsplit("-", 1)
    assert gen == s.generation.ray_version
    assert int(size) == s.chips * s.generation.tensorcores_per_chip
    assert s.head_resource == f"TPU-{s.pod_type}-head"


@given(slice_types(), st.data())
def test_host_labels_carry_worker_id_and_only_host_zero_has_head(
    s: SliceType, data: st.DataObject
) -> None:
    worker_id = data.draw(st.integers(0, s.hosts - 1))
    host = s.host_labels(worker_id, slice_name="slice-a")
    assert host[labels.RAY_TPU_WORKER_ID] == str(worker_id)
    assert host[labels.RAY_TPU_POD_TYPE] == s.pod_type
    assert host[labels.RAY_TPU_TOPOLOGY] == s.topology
    assert host[labels.RAY_TPU_SLICE_NAME] == "slice-a"
    resources = s.host_extra_resources(worker_id, slice_name="slice-a")
    assert (s.head_resource in resources) == (worker_id == 0)
    assert resources["slice-a"] == 1.0


@given(slice_types())
def test_exactly_one_head_per_slice(s: SliceType) -> None:
    heads = [w for w in range(min(s.hosts, 64)) if s.head_resource in s.host_extra_resources(w)]
    assert heads == [0]


def test_worker_id_outside_slice_is_refused() -> None:
    s = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]
    with pytest.raises(CatalogError):
        s.host_labels(4)


@pytest.mark.parametrize(
    ("generation", "topology", "chips_per_host", "hosts", "pod_type"),
    [
        ("v6e", "4x4", 4, 4, "v6e-16"),
        ("v6e", "2x4", 8, 1, "v6e-8"),
        ("v6e", "2x4", 4, 2, "v6e-8"),
        ("v6e", "1x1", 1, 1, "v6e-1"),
        ("v5e", "2x2", 4, 1, "v5litepod-4"),
        ("v5p", "2x2x2", 4, 2, "v5p-16"),
        ("v4", "2x2x1", 4, 1, "v4-8"),
        ("tpu7x", "2x2x2", 4, 2, "v7x-16"),
        ("tpu7x", "4x4x4", 4, 16, "v7x-128"),
    ],
)
def test_known_slices(
    generation: str, topology: str, chips_per_host: int, hosts: int, pod_type: str
) -> None:
    gen = catalog.find_generation(generation)
    assert gen is not None
    s = catalog.slice_type(gen, topology, chips_per_host)
    assert (s.hosts, s.pod_type) == (hosts, pod_type)


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("v6e", "v6e"),
        ("TPU-V6E", "v6e"),
        ("v6e-16", "v6e"),
        ("v5e", "v5e"),
        ("v5litepod", "v5e"),
        ("TPU-V5LITEPOD", "v5e"),
        ("tpu7x", "tpu7x"),
        ("v7x", "tpu7x"),
        ("TPU-V7X", "tpu7x"),
        ("tpu7x-16", "tpu7x"),
        ("V5P", "v5p"),
    ],
)
def test_find_generation_accepts_every_spelling(spelling: str, name: str) -> None:
    found = catalog.find_generation(spelling)
    assert found is not None and found.name == name


def test_find_generation_unknown() -> None:
    assert catalog.find_generation("v9z") is None


def test_invalid_topology_and_host_size_say_what_is_valid() -> None:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    with pytest.raises(CatalogError, match=r"valid: 1x1, 2x2, 2x4"):
        catalog.slice_type(v6e, "3x3")
    with pytest.raises(CatalogError, match=r"valid chips per host: 4"):
        catalog.slice_type(v6e, "4x4", 8)
    with pytest.raises(CatalogError, match="not of the form"):
        catalog.chips_in_topology("4by4")


def test_catalog_is_complete() -> None:
    names = {s.generation.name for s in ALL_SLICE_TYPES}
    assert names == {"v4", "v5e", "v5p", "v6e", "tpu7x"}
    # Every generation has a single-host slice and a multi-host one.
    for name in names:
        hosts = {s.hosts for s in ALL_SLICE_TYPES if s.generation.name == name}
        assert 1 in hosts and max(hosts) > 1
