"""RayCluster manifests and hypothesis strategies for tests: valid by construction,
so a test can mutate one field and expect exactly that field to be blamed."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.catalog import SliceType


def container(
    cpu: str = "8",
    memory: str = "32G",
    tpu_chips: int | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if tpu_chips is not None:
        resources["google.com/tpu"] = str(tpu_chips)
    spec: dict[str, Any] = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return spec


def tpu_group(
    name: str,
    slice: SliceType,
    min_replicas: int = 0,
    max_replicas: int = 4,
    replicas: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    group: dict[str, Any] = {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "numOfHosts": slice.hosts,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [container(cpu="24", memory="100G", tpu_chips=slice.chips_per_host)],
                "nodeSelector": {
                    "cloud.google.com/gke-tpu-accelerator": slice.generation.gke_accelerators[0],
                    "cloud.google.com/gke-tpu-topology": slice.topology,
                },
            }
        },
    }
    group.update(extra)
    return group


def cpu_group(
    name: str, min_replicas: int = 0, max_replicas: int = 10, **extra: Any
) -> dict[str, Any]:
    group: dict[str, Any] = {
        "groupName": name,
        "replicas": min_replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "rayStartParams": {},
        "template": {"spec": {"containers": [container()]}},
    }
    group.update(extra)
    return group


def raycluster(
    *groups: dict[str, Any], name: str = "test", **autoscaler_options: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            # Ray >= 2.56, as every manifest of ours: KubeRay refuses a group priority below.
            "rayVersion": "2.60.0",
            "enableInTreeAutoscaling": True,
            # v2, as every manifest of ours: KubeRay refuses group idleTimeoutSeconds without it.
            "autoscalerOptions": {"version": "v2", **autoscaler_options},
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [container(cpu="4", memory="16G")]}},
            },
            "workerGroupSpecs": list(groups),
        },
    }


def clone(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)


ALL_SLICE_TYPES = catalog.all_slice_types()


def slice_types() -> st.SearchStrategy[SliceType]:
    return st.sampled_from(ALL_SLICE_TYPES)


@st.composite
def valid_clusters(draw: st.DrawFn) -> dict[str, Any]:
    """A valid RayCluster of 1-4 groups, TPU and CPU, with assorted optional fields."""
    count = draw(st.integers(1, 4))
    groups = []
    for index in range(count):
        name = f"group-{index}"
        min_replicas = draw(st.integers(0, 3))
        max_replicas = draw(st.integers(min_replicas, min_replicas + 5))
        extra: dict[str, Any] = {}
        if draw(st.booleans()):
            extra["idleTimeoutSeconds"] = draw(st.integers(0, 3600))
        if draw(st.booleans()):
            extra["labels"] = {"example.com/pool": f"pool-{index}"}
        if draw(st.integers(0, 3)) == 0:
            groups.append(cpu_group(name, min_replicas, max_replicas, **extra))
        else:
            groups.append(tpu_group(name, draw(slice_types()), min_replicas, max_replicas, **extra))
    options: dict[str, Any] = {}
    if draw(st.booleans()):
        options["idleTimeoutSeconds"] = draw(st.integers(0, 3600))
    if draw(st.booleans()):
        options["upscalingMode"] = draw(st.sampled_from(["Default", "Aggressive", "Conservative"]))
    return raycluster(*groups, **options)


def slice_of(generation: str, topology: str, hosts: int) -> SliceType:
    """The catalog's slice of `generation` and `topology` that has `hosts` hosts."""
    return next(
        s
        for s in ALL_SLICE_TYPES
        if (s.generation.name, s.topology, s.hosts) == (generation, topology, hosts)
    )
