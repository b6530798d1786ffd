"""Differential: our reading of a RayCluster against Ray 2.60's own
(`_derive_autoscaling_config_from_ray_cr`, the config `ray kuberay-autoscaler` builds)
and KubeRay v1.7's refusals, on generated clusters: CPU, GPU, single- and multi-host TPU
groups; labels and resources in every place they can be written; quantities in every
notation; requests only, limits only, both.

For each cluster, as the API server stores it (the CRD's defaults applied):
- KubeRay refuses it (validation.go) or the TPU webhook does: we refuse it too
  (divergences `kuberay-refuses`, `webhook-refuses`: Ray's config would read it, but it
  never runs);
- else Ray's config raises: we refuse it too;
- else we read it, and per node type the resources of every host, labels, min/max
  workers (hosts), idle timeout, priority and upscaling equal Ray's, apart from the
  DIVERGENCES of `tpu_autoscaler/testing/ray_parity.py`, which docs/configuration.md
  lists with their reasons.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.catalog import SliceType
from tpu_autoscaler.testing.ray_parity import DIVERGENCES, judge

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
        group["numOfHosts"] = s.hosts + (1 if draw(RARELY) else 0)  # the webhook refuses
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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_our_reading_is_rays(cluster: dict[str, Any]) -> None:
    verdict = judge(cluster)
    by = [w for w in ("KubeRay", "webhook", "Ray's config") if w in verdict.why.split(" | ")[0]]
    # kuberay-refuses, webhook-refuses: refused by them, Ray's config or not.
    event(f"{verdict.outcome}{f' ({by[0]})' if by else ''}")
    assert verdict.outcome in ("same", "both refuse"), (verdict.outcome, verdict.why)
    # Only the documented divergences remain, each where it belongs.
    assert set(verdict.divergences) <= set(DIVERGENCES)
    for difference in verdict.differences:
        if difference.divergence == "head-resource-on-worker-0":
            assert "[host 0]" not in difference.where
