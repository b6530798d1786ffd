"""Differential: our reading of a RayCluster against Ray 2.60's own
(`_derive_autoscaling_config_from_ray_cr`, the config `ray kuberay-autoscaler` builds)
and KubeRay v1.7's refusals, on generated clusters: CPU, GPU, single- and multi-host TPU
groups; labels and resources in every place they can be written; quantities in every
notation; requests only, limits only, both.

For each cluster, as the API server stores it (the CRD's defaults applied):
- KubeRay refuses it (validation.go): we refuse it too;
- else Ray's config raises: we refuse it too;
- else we read it, and per node type the resources, labels, min/max workers (hosts),
  idle timeout, priority and upscaling equal Ray's, apart from DIVERGENCES, which
  docs/configuration.md lists with their reasons.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)

from tpu_autoscaler.controlplane import crd
from tpu_autoscaler.controlplane.kuberay_validation import spec_error
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

DIVERGENCES = {
    "head-resource-on-worker-0": "TPU-{pod_type}-head is on worker 0 of each slice only; "
    "Ray's node type puts it on every host",
    "raylet-derived-resources": "we add the accelerator_type:TPU-* resource the raylet "
    "advertises once started; Ray's config has only what the manifest says",
    "raylet-derived-labels": "we add ray.io/node-group and the static ray.io/tpu-* labels "
    "the raylet derives at start; Ray's config has the group's own labels only",
    "kuberay-refuses": "a cluster KubeRay refuses (InvalidRayClusterSpec) never runs; we "
    "refuse it, Ray's config reads it anyway",
}

# --- KubeRay's label syntax (apimachinery IsQualifiedName / IsValidLabelValue), which
# the simulator's KubeRay model leaves out; written here from the Go source.
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _kuberay_label_ok(key: str, value: str) -> bool:
    parts = key.split("/")
    if len(parts) > 2 or not parts[-1] or len(parts[-1]) > 63 or not _NAME.fullmatch(parts[-1]):
        return False
    if len(parts) == 2 and (len(parts[0]) > 253 or not _SUBDOMAIN.fullmatch(parts[0])):
        return False
    return len(value) <= 63 and (value == "" or bool(_NAME.fullmatch(value)))


def kuberay_refuses(stored: dict[str, Any]) -> bool:
    spec = stored["spec"]
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    labels_bad = any(
        not _kuberay_label_ok(k, v) for g in groups for k, v in (g.get("labels") or {}).items()
    )
    return labels_bad or spec_error(stored) is not None


# --- Generated clusters.
CPUS = st.sampled_from(["1", "2", "500m", "1500m", "0.5", "2.5", "2e0", "1e1", 4, "8"])
MEMORY = st.sampled_from(
    ["512Mi", "2Gi", "2G", "1.5Gi", "1e9", "2147483648", "100M", "4Ki", 1073741824, "0.5Gi"]
)
START_INTS = st.sampled_from(["1", "3", "8", "0"])
START_NOT_INT = st.sampled_from(["1.5", "500m", "2Gi"])
GOOD_LABEL_KEYS = st.sampled_from(
    [
        "ray.io/market-type",
        "ray.io/region",
        "ray.io/accelerator-type",
        "cpu-family",
        "example.com/zone",
    ]
)
BAD_LABEL_KEYS = st.sampled_from(
    [
        "Example.com/zone",  # KubeRay refuses a capital in the prefix; Ray accepts it
        "a..b/x",  # KubeRay refuses an empty segment; Ray accepts it
        "x" * 64 + ".com/k",  # KubeRay accepts a 64-character segment; Ray refuses it
        "/k",  # both refuse an empty prefix
        "-bad",  # both refuse
    ]
)
LABEL_VALUES = st.sampled_from(["spot", "on-demand", "A100", "", "us-central2"])
BAD_LABEL_VALUES = st.sampled_from(["bad value", "v" * 64, "-v"])
RARELY = st.integers(0, 14).map(lambda n: n == 7)
"""True one time in 15: for what KubeRay or Ray refuse, so most clusters get compared."""
CONTAINER_PLACES = ["limits", "requests", "both", "differ"]
TPU_SLICES = [
    catalog.slice_type(catalog.find_generation(gen), topo, chips)  # type: ignore[arg-type]
    for gen, topo, chips in [
        ("v6e", "2x4", 8),
        ("v6e", "2x2", 4),
        ("v6e", "4x4", 4),
        ("v5p", "2x2x2", 4),
        ("v4", "2x2x4", 4),
        ("v5e", "2x4", 4),
    ]
]


def _place(
    draw: st.DrawFn,
    group: dict[str, Any],
    style: str,
    names: tuple[str, str, str],
    value: Any,
) -> None:
    """Writes one resource at a drawn place: container limits/requests, or (by the
    group's style) the group's top-level `resources` or rayStartParams, or nowhere."""
    ray_name, start, k8s = names
    place = draw(
        st.sampled_from([*CONTAINER_PLACES, style, "none" if draw(st.booleans()) else style])
    )
    container = group["template"]["spec"]["containers"][0]["resources"]
    if place in ("limits", "both", "differ"):
        container.setdefault("limits", {})[k8s] = value
    if place in ("requests", "both"):
        container.setdefault("requests", {})[k8s] = value
    if place == "differ":
        container.setdefault("requests", {})[k8s] = draw(CPUS if k8s == "cpu" else MEMORY)
    if place == "group":
        group.setdefault("resources", {})[ray_name] = str(value)
    if place == "start":
        group["rayStartParams"][start] = draw(
            st.one_of(START_INTS, START_NOT_INT) if draw(st.integers(0, 4)) == 0 else START_INTS
        )


@st.composite
def node_group(draw: st.DrawFn, name: str, is_head: bool) -> dict[str, Any]:
    group: dict[str, Any] = {
        "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray", "image": "r", "resources": {}}]}},
    }
    # Where the Ray resources are written besides the container: the top-level `resources`
    # or rayStartParams; now and then both, which KubeRay refuses.
    style = draw(st.sampled_from(["group", "start"]))
    if draw(RARELY):
        style = draw(st.sampled_from(["group", "start"]))
        other = "start" if style == "group" else "group"
        _place(draw, group, other, ("CPU", "num-cpus", "cpu"), draw(CPUS))
    _place(draw, group, style, ("CPU", "num-cpus", "cpu"), draw(CPUS))
    _place(draw, group, style, ("memory", "memory", "memory"), draw(MEMORY))
    kind = "cpu" if is_head else draw(st.sampled_from(["cpu", "gpu", "tpu"]))
    container = group["template"]["spec"]["containers"][0]["resources"]
    if kind == "gpu":
        key = draw(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu"]))
        count = draw(st.sampled_from(["1", "2", 4]))
        for table in draw(st.sampled_from([("limits",), ("requests",), ("limits", "requests")])):
            container.setdefault(table, {})[key] = count
    if kind == "tpu":
        s: SliceType = draw(st.sampled_from(TPU_SLICES))
        for table in draw(st.sampled_from([("limits",), ("requests",), ("limits", "requests")])):
            container.setdefault(table, {})["google.com/tpu"] = draw(
                st.sampled_from([str(s.chips_per_host), s.chips_per_host])
            )
        group["template"]["spec"]["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": s.generation.gke_accelerators[0],
            "cloud.google.com/gke-tpu-topology": s.topology,
        }
        group["numOfHosts"] = s.hosts
        if draw(st.booleans()):
            override = draw(st.sampled_from([s.chips_per_host, 2 * s.chips_per_host]))
            if style == "group":
                group.setdefault("resources", {})["TPU"] = str(override)
            else:
                group["rayStartParams"]["resources"] = f'"{{\\"TPU\\": {override}}}"'
    if draw(st.booleans()):
        custom = draw(
            st.sampled_from(
                ['"{\\"spot\\": 1}"', '"{\\"spot\\": 2}"', '"{\\"spot\\": 1.5}"', '{"spot": 1}']
            )
        )
        if style == "group":
            group.setdefault("resources", {})["spot"] = draw(st.sampled_from(["1", "2.5", "3k"]))
        elif "resources" not in group["rayStartParams"]:
            group["rayStartParams"]["resources"] = custom
    if draw(st.booleans()):
        group["labels"] = draw(st.dictionaries(GOOD_LABEL_KEYS, LABEL_VALUES, max_size=3))
        if draw(RARELY):
            group["labels"][draw(BAD_LABEL_KEYS)] = draw(LABEL_VALUES)
        if draw(RARELY):
            group["labels"][draw(GOOD_LABEL_KEYS)] = draw(BAD_LABEL_VALUES)
    if draw(RARELY):
        group["rayStartParams"]["labels"] = "cpu-family=intel"
    if not is_head:
        group["groupName"] = name
        low = draw(st.integers(0, 3))
        if draw(st.integers(0, 5)):  # sometimes left to the CRD's defaults
            group["minReplicas"] = low
            group["maxReplicas"] = low + draw(st.integers(0, 5))
        if draw(st.booleans()):
            group["idleTimeoutSeconds"] = draw(st.sampled_from([0, 30, 600]))
        if draw(RARELY):
            group["priority"] = draw(st.integers(0, 3))
    return group


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    options: dict[str, Any] = {}
    if draw(st.booleans()):
        options["idleTimeoutSeconds"] = draw(st.sampled_from([0, 45, 300]))
    if not draw(RARELY):
        options["version"] = "v2"
    if draw(st.booleans()):
        options["upscalingMode"] = draw(st.sampled_from(["Default", "Aggressive", "Conservative"]))
    spec: dict[str, Any] = {}
    if draw(st.integers(0, 3)):
        spec["rayVersion"] = draw(st.sampled_from(["2.60.0", "2.52.0", "nightly"]))
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "gen", "namespace": "default"},
        "spec": {
            **spec,
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": options,
            "headGroupSpec": draw(node_group("headgroup", True)),
            "workerGroupSpecs": [draw(node_group(f"g{i}", False)) for i in range(count)],
        },
    }


def ray_reading(stored: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return _derive_autoscaling_config_from_ray_cr(stored)
    except Exception:  # Ray's refusal: the autoscaler raises and stops
        return None


def check_same_reading(ours: ClusterShapes, ray: dict[str, Any]) -> None:
    """Equal per node type, apart from the DIVERGENCES named inline."""
    types = ray["available_node_types"]
    assert ours.head is not None
    head = types["headgroup"]
    assert ours.head.resources == head["resources"]
    assert _without_derived(ours.head.labels, {"ray.io/node-group"}, head["labels"])
    for shape in ours.shapes:
        node_type = types[shape.group]
        host0 = shape.host_resources(0)
        # raylet-derived-resources: the accelerator type the raylet will advertise.
        mine = {k: v for k, v in host0.items() if not k.startswith("accelerator_type:")}
        assert mine == node_type["resources"], shape.group
        if shape.tpu is not None and shape.hosts_per_replica > 1:
            # head-resource-on-worker-0: the other hosts lack it; Ray gives it to all.
            assert shape.tpu.head_resource not in shape.host_resources(1)
        derived = {"ray.io/node-group"}
        if shape.tpu is not None:
            derived |= set(shape.tpu.static_labels())
        assert _without_derived(shape.group_labels, derived, node_type["labels"]), shape.group
        assert shape.min_replicas * shape.hosts_per_replica == node_type["min_workers"]
        assert shape.max_replicas * shape.hosts_per_replica == node_type["max_workers"]
        idle_s = node_type.get("idle_timeout_s", ray["idle_timeout_minutes"] * 60)
        assert shape.idle_timeout_s == idle_s
        assert shape.priority == node_type.get("priority", 0)
    assert (ours.shapes[0].upscaling_mode == "Conservative") == (ray["upscaling_speed"] == 1)


def _without_derived(ours: Any, derived: set[str], rays: dict[str, str]) -> bool:
    """raylet-derived-labels: ours are Ray's plus labels the raylet derives."""
    extra = set(ours) - set(rays)
    return extra <= derived and all(ours[k] == v for k, v in rays.items())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_our_reading_is_rays(cluster: dict[str, Any]) -> None:
    stored = crd.admit(cluster)
    ours = derive_shapes(parse_raycluster(cluster, "generated"))
    ray = ray_reading(stored)
    if kuberay_refuses(stored):  # kuberay-refuses
        event("KubeRay refuses")
        assert ours.errors, "KubeRay refuses this cluster; we read it"
    elif ray is None:
        event("Ray refuses")
        assert ours.errors, "Ray's config refuses this cluster; we read it"
    else:
        event("both read: compared")
        assert not ours.errors, [str(p) for p in ours.errors]
        check_same_reading(ours, ray)
