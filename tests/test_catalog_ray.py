"""The catalog against Ray 2.60's own code: if Ray changes a table, a name or a
label, these fail instead of the autoscaler silently disagreeing with Ray."""

from __future__ import annotations

import pytest
import ray._raylet
from hypothesis import given
from hypothesis import strategies as st
from ray._private.accelerators import tpu as ray_tpu
from ray._private.label_utils import validate_label_key, validate_label_value
from ray.autoscaler._private.kuberay import utils as kuberay_utils
from ray.util import tpu as ray_util_tpu

from tests.factories import ALL_SLICE_TYPES
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.catalog import GENERATIONS, SliceType
from tpu_autoscaler.manifest.node_labels import ray_key_problem, ray_value_problem


def test_label_keys_match_ray() -> None:
    assert labels.RAY_ACCELERATOR_TYPE == ray._raylet.RAY_NODE_ACCELERATOR_TYPE_KEY
    assert labels.RAY_TPU_SLICE_NAME == ray._raylet.RAY_NODE_TPU_SLICE_NAME_KEY
    assert labels.RAY_TPU_WORKER_ID == ray._raylet.RAY_NODE_TPU_WORKER_ID_KEY
    assert labels.RAY_TPU_TOPOLOGY == ray._raylet.RAY_NODE_TPU_TOPOLOGY_KEY
    assert labels.RAY_TPU_POD_TYPE == ray._raylet.RAY_NODE_TPU_POD_TYPE_KEY
    assert labels.RAY_NODE_GROUP == ray._raylet.RAY_NODE_GROUP_KEY
    assert labels.ENV_TPU_NAME == ray_tpu.GKE_TPU_NAME_ENV_VAR
    assert labels.ENV_TPU_WORKER_ID == ray_tpu.GKE_TPU_WORKER_ID_ENV_VAR
    assert labels.ENV_TPU_ACCELERATOR_TYPE == ray_tpu.GKE_TPU_ACCELERATOR_TYPE_ENV_VAR
    assert labels.ENV_TPU_TOPOLOGY == ray_tpu.GKE_TPU_TOPOLOGY_ENV_VAR
    assert labels.ENV_TPU_RESOURCE_PER_CHIP == ray_tpu.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR


@pytest.mark.parametrize("generation", GENERATIONS, ids=lambda g: g.name)
def test_topologies_match_ray(generation: catalog.Generation) -> None:
    assert generation.topologies == ray_tpu.VALID_TPU_TOPOLOGY[generation.ray_version]
    assert generation.ray_version in ray_tpu.VALID_TPU_TYPES


@pytest.mark.parametrize("generation", GENERATIONS, ids=lambda g: g.name)
def test_generation_facts_match_ray(generation: catalog.Generation) -> None:
    assert generation.tensorcores_per_chip == ray_tpu.get_tpu_cores_per_chip(generation.ray_version)
    assert set(generation.host_chip_sizes) <= set(ray_tpu.TPU_VALID_CHIP_OPTIONS)
    for topology in generation.topologies:
        assert generation.default_chips_per_host(topology) == ray_tpu.get_chips_per_host(
            topology, generation.ray_version
        )


def test_gke_accelerators_match_ray() -> None:
    ours = {value: gen.ray_version for gen in GENERATIONS for value in gen.gke_accelerators}
    assert ours == kuberay_utils.gke_tpu_accelerator_to_generation


@pytest.mark.parametrize(
    "s", ALL_SLICE_TYPES, ids=lambda s: f"{s.pod_type}-{s.topology}-{s.chips_per_host}c"
)
def test_slice_facts_match_ray(s: SliceType) -> None:
    assert s.chips == ray_tpu.get_num_chips_from_topology(s.topology)
    assert s.pod_type == ray_tpu.infer_tpu_pod_type_from_topology(
        s.topology, s.generation.accelerator_type
    )
    assert s.pod_type == kuberay_utils.tpu_node_selectors_to_type(
        s.topology, s.generation.gke_accelerators[0]
    )
    assert s.pod_type == ray_tpu.normalize_tpu_accelerator_type(s.gke_accelerator_type)
    assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(s.gke_accelerator_type)
    # What slice_placement_group asks for: one bundle per host of chips_per_host TPUs.
    workers, bundle = ray_util_tpu.get_tpu_worker_resources(
        s.topology,
        s.generation.accelerator_type,
        chips_per_vm=s.chips_per_host,
        tpu_resource_per_chip=1,
    )
    assert workers == s.hosts
    assert bundle["TPU"] == s.chips_per_host


@pytest.mark.parametrize(
    "s", ALL_SLICE_TYPES, ids=lambda s: f"{s.pod_type}-{s.topology}-{s.chips_per_host}c"
)
def test_host_labels_and_resources_match_what_ray_derives(
    s: SliceType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start Ray's TPU detection with the env a GKE pod of this slice gets, and compare."""
    manager = ray_tpu.TPUAcceleratorManager
    for worker_id in sorted({0, 1 % s.hosts, s.hosts - 1}):
        monkeypatch.setenv(labels.ENV_TPU_NAME, "grp-0")
        monkeypatch.setenv(labels.ENV_TPU_WORKER_ID, str(worker_id))
        monkeypatch.setenv(labels.ENV_TPU_ACCELERATOR_TYPE, s.gke_accelerator_type)
        monkeypatch.setenv(labels.ENV_TPU_TOPOLOGY, s.topology)
        ray_labels = dict(manager.get_current_node_accelerator_labels())
        ray_labels[labels.RAY_ACCELERATOR_TYPE] = manager.get_current_node_accelerator_type()
        assert ray_labels == s.host_labels(worker_id, slice_name="grp-0")
        ray_resources = dict(manager.get_current_node_additional_resources() or {})
        ray_resources[f"accelerator_type:{manager.get_current_node_accelerator_type()}"] = 1
        assert ray_resources == s.host_extra_resources(worker_id, slice_name="grp-0")


_label_text = st.text(alphabet="abcXYZ019-_./", max_size=70)


@given(_label_text)
def test_label_key_syntax_matches_ray(key: str) -> None:
    assert (ray_key_problem(key) is None) == (validate_label_key(key) is None)


@given(_label_text)
def test_label_value_syntax_matches_ray(value: str) -> None:
    try:
        validate_label_value(value)
        ray_ok = True
    except ValueError:
        ray_ok = False
    assert (ray_value_problem(value) is None) == ray_ok
