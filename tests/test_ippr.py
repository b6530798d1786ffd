"""In-place pod resize (`ray.io/ippr`): the annotation read as Ray 2.60 reads it (and
refused where Ray refuses it, or where a TPU slice would be resized); a pod's size and
resize state as Ray's `KubeRayIPPRProvider` reads them; the resize patch as Ray writes
it; hand-checked decisions; and the whole chain in the simulated cluster, where a
running pod grows instead of a second pod launching."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.ippr_provider import (
    KubeRayIPPRProvider,
    _get_ippr_status_from_pod,
)

from tests.factories import container, cpu_group, raycluster, tpu_group
from tests.test_parity_ippr import GIB, ippr_annotation, set_pod_size
from tests.test_parity_properties import _group, _raycluster
from tpu_autoscaler.adapters.kube.api import NotFound
from tpu_autoscaler.adapters.kube.pod_size import pod_size
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.adapters.kube.resize import resize_operations
from tpu_autoscaler.adapters.ray.baseline_ippr import ippr_view
from tpu_autoscaler.adapters.snapshot_file import build_snapshot
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.resize import ResizeBounds
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell.controller import decide_by_slices
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import WorkItem
from tpu_autoscaler.testing.scenarios import SnapshotBuilder


def _annotated(cluster: dict[str, Any], annotation: str) -> dict[str, Any]:
    cluster["metadata"]["annotations"] = {"ray.io/ippr": annotation}
    return cluster


def _cpu_cluster(**group: Any) -> dict[str, Any]:
    return raycluster(
        cpu_group("cpu", template={"spec": {"containers": [container("2", "8Gi")]}}, **group)
    )


def _ours(cluster: dict[str, Any]) -> tuple[ResizeBounds | None, list[str]]:
    shapes = derive_shapes(parse_raycluster(cluster, "test"))
    shape = shapes.shape("cpu")
    return (shape.resize if shape else None), [str(p) for p in shapes.errors]


def _rays(cluster: dict[str, Any]) -> Any:
    reader = KubeRayIPPRProvider(gcs_client=None, k8s_api_client=None)
    reader.validate_and_set_ippr_specs(copy.deepcopy(cluster))
    return reader.get_ippr_specs().groups.get("cpu")


def test_bounds_are_read_as_ray_reads_them() -> None:
    cluster = _annotated(
        _cpu_cluster(),
        # JSON Schema's integers include 90.0, as Ray's jsonschema check takes them.
        json.dumps(
            {"groups": {"cpu": {"max-cpu": 6, "max-memory": "24Gi", "resize-timeout": 90.0}}}
        ),
    )
    bounds, errors = _ours(cluster)
    rays = _rays(cluster)
    assert not errors
    assert bounds == ResizeBounds(rays.max_cpu, rays.max_memory, rays.resize_timeout)
    assert bounds.max_memory_bytes == 24 * GIB


BAD = {
    "not JSON": ("{groups", None),
    "a key missing": (json.dumps({"groups": {"cpu": {"max-cpu": "4"}}}), None),
    "timeout not an integer": (
        json.dumps({"groups": {"cpu": {"max-cpu": 4, "max-memory": 1, "resize-timeout": "9"}}}),
        None,
    ),
    "timeout with a fraction": (
        json.dumps({"groups": {"cpu": {"max-cpu": 4, "max-memory": 1, "resize-timeout": 9.5}}}),
        None,
    ),
    "num-cpus in rayStartParams": (ippr_annotation({"cpu": 4}), {"num-cpus": "2"}),
    "memory in rayStartParams": (ippr_annotation({"cpu": 4}), {"memory": "100"}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_ray_refuses_is_an_error_naming_the_field(case: str) -> None:
    annotation, start_params = BAD[case]
    cluster = _annotated(_cpu_cluster(), annotation)
    if start_params:
        cluster["spec"]["workerGroupSpecs"][0]["rayStartParams"] = start_params
    with pytest.raises((ValueError, jsonschema.ValidationError)):  # each round: no scaling
        _rays(cluster)
    bounds, errors = _ours(cluster)
    assert bounds is None and errors
    assert any("ippr" in e or "rayStartParams" in e for e in errors), errors


def test_a_resize_policy_that_restarts_and_missing_requests_are_refused() -> None:
    cluster = _annotated(_cpu_cluster(), ippr_annotation({"cpu": 4}))
    spec = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    spec["resizePolicy"] = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    del spec["resources"]["requests"]["cpu"]
    with pytest.raises(ValueError):
        _rays(cluster)
    _, errors = _ours(cluster)
    assert any("resizePolicy[0].restartPolicy" in e for e in errors), errors
    assert any("requests[cpu]" in e for e in errors), errors


def test_tpu_slices_never_resize() -> None:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    for topology, hosts in (("4x4", 4), ("2x4", 1)):
        group = tpu_group(
            "cpu", catalog.slice_type(v6e, topology, 8 // hosts if hosts == 1 else 4), 0, 2
        )
        cluster = _annotated(raycluster(group), ippr_annotation({"cpu": 16}))
        bounds, errors = _ours(cluster)
        assert bounds is None
        assert any("only single-host groups without TPUs" in e for e in errors), errors


def test_an_unknown_group_is_ignored_with_a_warning() -> None:
    cluster = _annotated(_cpu_cluster(), ippr_annotation({"elsewhere": 4}))
    shapes = derive_shapes(parse_raycluster(cluster, "test"))
    assert not shapes.errors and shapes.shape("cpu").resize is None  # type: ignore[union-attr]
    assert any("names no worker group" in str(p) for p in shapes.warnings)


# --- a pod's size, and the patch -------------------------------------------------------


@st.composite
def resized_pods(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A RayCluster with one resizable group and one of its pods in some resize state."""
    cpus = draw(st.sampled_from([1, 2, 4]))
    cluster = _raycluster([_group("group-0", cpus, 0, 2)], 0)
    cluster["metadata"]["annotations"] = {"ray.io/ippr": ippr_annotation({"group-0": 8})}
    builder = SnapshotBuilder(cluster)
    builder.replica("group-0", 0)
    state = draw(st.sampled_from(["template", "grown", "unsynced", "applying", "failed", "capped"]))
    if state == "grown":
        set_pod_size(builder, 8)
    elif state == "unsynced":
        set_pod_size(
            builder,
            draw(st.sampled_from([4, 8])),
            {"resizing-at": 4_000_000_000, "raylet-id": "ab"},
        )
    elif state == "failed":
        set_pod_size(builder, cpus, {"last-failed-at": 1_700_000_000})
    elif state == "capped":
        set_pod_size(builder, cpus, {"suggested-max-cpu": 3.0})
    elif state == "applying":  # the spec asks for 8 CPUs, the kubelet still has `cpus`
        set_pod_size(builder, cpus, {"raylet-id": "ab"})  # (resized by someone else)
        resources = builder.pods[-1]["spec"]["containers"][0]["resources"]
        for kind in ("requests", "limits"):
            resources[kind] = {"cpu": "8", "memory": "32Gi"}
        condition = {"type": "PodResizeInProgress", "status": "True"}
        builder.pods[-1]["status"]["conditions"] = [condition]
    if draw(st.booleans()):  # limits above requests: Burstable, the gap kept
        spec = builder.pods[-1]["spec"]["containers"][0]["resources"]
        spec["requests"] = {**spec["requests"], "cpu": str(float(spec["limits"]["cpu"]) / 2)}
        for status in builder.pods[-1]["status"].get("containerStatuses", []):
            applied = status["resources"]
            applied["requests"] = {
                **applied["requests"],
                "cpu": str(float(applied["limits"]["cpu"]) / 2),
            }
    return cluster, builder.pods[-1]


@settings(max_examples=200, deadline=None)
@given(case=resized_pods())
def test_a_pods_size_and_resize_patch_are_rays(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    cluster, raw_pod = case
    specs, _ = ippr_view(cluster, [])
    spec = specs.groups["group-0"]
    theirs, resources = _get_ippr_status_from_pod(spec, copy.deepcopy(raw_pod))
    pod = Pod.model_validate(raw_pod)
    bounds = ResizeBounds(spec.max_cpu, spec.max_memory, spec.resize_timeout)
    ours = pod_size(pod, bounds, now_s=1_700_000_000 + 10)
    assert ours is not None and theirs is not None
    assert (ours.cpu, ours.memory_bytes) == (theirs.current_cpu, theirs.current_memory)
    assert (ours.desired_cpu, ours.desired_memory_bytes) == (
        theirs.desired_cpu,
        theirs.desired_memory,
    )
    assert ours.can_grow(bounds) == theirs.can_resize_up()
    assert ours.grown(bounds) == {"CPU": theirs.max_cpu(), "memory": theirs.max_memory()}
    # The patch: Ray's provider, to the same target.
    theirs.queue_resize_request(desired_cpu=theirs.max_cpu(), desired_memory=theirs.max_memory())
    writer = KubeRayIPPRProvider(gcs_client=None, k8s_api_client=None)
    writer._container_resources[theirs.cloud_instance_id] = resources
    assert resize_operations(pod, ours.grown(bounds)) == writer._make_ippr_patch(theirs)


# --- decisions, hand-checked -------------------------------------------------------------


def _snapshot(max_cpu: int, used_cpu: float, tasks: list[tuple[float, int]]) -> Any:
    cluster = _raycluster([_group("cpu", 1, 0, 5)], 0)
    cluster["metadata"]["annotations"] = {"ray.io/ippr": ippr_annotation({"cpu": max_cpu})}
    builder = SnapshotBuilder(cluster).head()
    builder.replica("cpu", 0, used={0: {"CPU": used_cpu}} if used_cpu else None)
    for cpus, count in tasks:
        builder.tasks({"CPU": cpus}, count=count)
    return build_snapshot(builder.build(), "test")


def test_a_bundle_larger_than_the_pod_grows_it_instead_of_being_infeasible() -> None:
    plan = decide_by_slices(_snapshot(4, 0.0, [(3.0, 1)]))
    assert not plan.launch and not plan.infeasible
    (resize,) = plan.resize
    assert dict(resize.resources_from) == {"CPU": 1.0, "memory": 4.0 * GIB}
    assert dict(resize.resources_to) == {"CPU": 4.0, "memory": 16.0 * GIB}  # the maximum
    assert "{CPU: 3}" in resize.reason


def test_what_the_grown_pod_cannot_hold_launches_one_pod_counted_at_its_maximum() -> None:
    # 1 CPU used of 1; grown to 4 it holds the 3-CPU task; the 1-CPU tasks go on one
    # new pod (4 CPUs once grown), not two template-size pods.
    plan = decide_by_slices(_snapshot(4, 1.0, [(3.0, 1), (1.0, 2)]))
    assert [(x.group, x.replicas) for x in plan.launch] == [("cpu", 1)]
    assert len(plan.resize) == 1 and not plan.infeasible


def test_beyond_the_maximum_is_still_infeasible() -> None:
    plan = decide_by_slices(_snapshot(4, 0.0, [(6.0, 1)]))
    assert not plan.resize and not plan.launch
    assert len(plan.infeasible) == 1


def test_demand_that_fits_as_is_resizes_nothing() -> None:
    plan = decide_by_slices(_snapshot(4, 0.0, [(1.0, 1)]))
    assert not plan.resize and not plan.launch


# --- the whole chain, simulated ----------------------------------------------------------


def test_a_running_pod_grows_in_place_and_its_raylet_takes_the_work() -> None:
    cluster = _annotated(_cpu_cluster(), ippr_annotation({"cpu": 8}))
    cluster["spec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": "0"}  # work goes to pods
    sim = SimulatedCluster(cluster, provisioning_delay=lambda _: 30.0)
    sim.events.run_until(0.0)
    task = {"task": {"resources": {"CPU": 2}}}
    sim.submit(WorkItem.model_validate({"at": 0.0, "duration": 3000.0, **task}))
    sim.events.run_until(200.0)
    (pod,) = sim.store.list_pods("default", {"ray.io/group": "cpu"})
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"
    # Three more 2-CPU tasks: the pod grows to 8 CPUs; no second pod.
    sim.submit(WorkItem.model_validate({"at": 200.0, "duration": 3000.0, "count": 3, **task}))
    sim.events.run_until(400.0)
    pods = sim.store.list_pods("default", {"ray.io/group": "cpu"})
    assert len(pods) == 1
    resources = pods[0]["spec"]["containers"][0]["resources"]
    assert float(resources["limits"]["cpu"]) == 8.0
    recorded = json.loads(pods[0]["metadata"]["annotations"]["ray.io/ippr-status"])
    assert recorded["resizing-at"] is None  # the raylet was told
    (node,) = [n for n in sim.ray.nodes.values() if n.group == "cpu"]
    assert node.total["CPU"] == 8.0
    assert len(sim.ray.running) == 4 and not sim.ray.pending


def test_without_the_resize_subresource_resizing_turns_off_and_pods_launch() -> None:
    cluster = _annotated(_cpu_cluster(), ippr_annotation({"cpu": 8}))
    cluster["spec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": "0"}
    sim = SimulatedCluster(cluster, provisioning_delay=lambda _: 30.0)

    def no_subresource(namespace: str, name: str, operations: Any) -> dict[str, Any]:
        raise NotFound(f"pods {name}/resize")  # kube-apiserver < 1.33 (1.20: 404)

    sim.store.resize_pod = no_subresource  # type: ignore[method-assign]
    sim.events.run_until(0.0)
    task = {"task": {"resources": {"CPU": 2}}}
    sim.submit(WorkItem.model_validate({"at": 0.0, "duration": 3000.0, **task}))
    sim.events.run_until(200.0)
    sim.submit(WorkItem.model_validate({"at": 200.0, "duration": 3000.0, "count": 3, **task}))
    sim.events.run_until(600.0)
    assert not sim.autoscaler.resizer.supported
    pods = sim.store.list_pods("default", {"ray.io/group": "cpu"})
    assert len(pods) == 4  # one 2-CPU pod per task, as without the annotation
    assert len(sim.ray.running) == 4
