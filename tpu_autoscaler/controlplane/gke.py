"""What a container on a GKE TPU node runs with: the TPU device plugin's variables
(`github.com/ai-on-gke/tpu-device-plugin` at 4626a9f, `pkg/tpu/util/util.go`
`InitEnvs`, answered from `Allocate` in `pkg/tpu/plugin.go`) beneath the container's
own environment as the kubelet resolves it.

`TPU_ACCELERATOR_TYPE` and `TPU_TOPOLOGY` are the device plugin's: it derives them from
its node's `cloud.google.com/gke-tpu-accelerator` and `gke-tpu-topology` labels and
hands them to the kubelet when it allocates the chips, so they reach the container's
process but never the Pod object the API server stores (`kubectl get pod -o yaml` does
not show them, and neither does any pod listing an autoscaler reads). The kubelet
puts the device plugin's variables first and the container's `env` after them
(`GenerateRunContainerOptions`), and the runtime keeps the last of a name, so what
the pod spec sets wins: the webhook's `TPU_WORKER_ID` overrides the plugin's
single-host `0`.

A simulated node is made for its pod: it carries the labels the pod's node selector
asks for and as many chips as the pod requests."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, Final

from tpu_autoscaler.controlplane.webhook_hosts import chips_requested, requests_tpus
from tpu_autoscaler.core import labels

CURRENT_GENERATION: Final = re.compile(r"^tpu\d+[a-z]?$")
"""Accelerator labels from TPU7x on are the generation itself (`tpu7x`)."""
PAST_GENERATION: Final = re.compile(r"^tpu-v\d+([ep]?[a]?-slice)?((?:-lite)?-(device|podslice))?$")
KNOWN_GENERATIONS: Final = frozenset({"v3", "v4", "v5litepod", "v5p", "v6e", "tpu7x"})
METRICS_PORTS: Final = {1: "8431", 2: "8431,8432", 4: "8431,8432,8433,8434"} | {
    8: ",".join(str(8431 + i) for i in range(8))
}
"""`TPU_RUNTIME_METRICS_PORTS` by the node's chip count."""
CHIPS_PER_HOST_DIMENSIONS: Final = {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 4, 1)}
LITE_MAX_DIMENSION: Final = 16
"""A v5e/v6e dimension of 16 chips wraps around."""


class DevicePluginError(Exception):
    """`InitEnvs` failed: `Allocate` fails and the container does not start."""


def tpu_generation(accelerator: str) -> str:
    """`AcceleratorGen`: `tpu-v6e-slice` -> `v6e`, `tpu-v5-lite-podslice` -> `v5litepod`,
    `tpu7x` -> `tpu7x`."""
    if CURRENT_GENERATION.match(accelerator):
        return accelerator
    if not PAST_GENERATION.match(accelerator) or accelerator in (
        "tpu-v4-device",
        "tpu-v4-lite-podslice",
    ):
        raise DevicePluginError(f"invalid accelerator type: {accelerator}")
    generation = accelerator.split("-")[1]
    if "lite" in accelerator:
        generation += "lite"
    if generation.startswith("v5") and "podslice" in accelerator:
        generation += "pod"
    if generation not in KNOWN_GENERATIONS:
        # `tpu-v5-lite-device` ends here (`v5lite`): the plugin knows no such generation.
        raise DevicePluginError(f"invalid TPU generation: {generation}")
    return generation


def _dimensions(topology: str) -> tuple[int, ...]:
    try:
        dimensions = tuple(int(d) for d in topology.split("x"))
    except ValueError:
        raise DevicePluginError(f"invalid topology: {topology}") from None
    return (*dimensions, 1) if len(dimensions) == 2 else dimensions


def _chips(dimensions: tuple[int, ...]) -> int:
    chips = 1
    for dimension in dimensions:
        chips *= dimension
    return chips


def accelerator_type(generation: str, topology: str) -> str:
    """`convertAcceleratorType`: `<generation>-<TensorCores>`, one core per chip on
    v5e and v6e, two on the others (`tpu7x-16` for a TPU7x 2x2x2)."""
    chips = _chips(_dimensions(topology))
    cores_per_chip = 1 if "lite" in generation or generation == "v6e" else 2
    return f"{generation}-{chips * cores_per_chip}"


def _wrap(generation: str, dimensions: tuple[int, ...]) -> str:
    if generation in ("v3", "v4", "v5p", "tpu7x"):
        return ",".join(["true" if all(d >= 4 for d in dimensions) else "false"] * 3)
    return ",".join("true" if d == LITE_MAX_DIMENSION else "false" for d in dimensions)


def device_plugin_environment(
    accelerator: str, topology: str, chips_on_node: int, chips_allocated: int
) -> dict[str, str]:
    """`InitEnvs` for one container: what the plugin knows from its node's labels
    (`accelerator`, `topology`, `chips_on_node`) and the chips it allocates. Left out:
    `VBAR_CONTROL_SERVICE_URL` (the node's IP), `TPU_VISIBLE_CHIPS` (privileged
    containers with device spreading) and the NUMA hint, which depend on the machine.
    A dict of the caller's own: the variables are made once per node kind (every host
    of a slice asks the same), an error raised again on every ask."""
    return dict(_device_plugin_environment(accelerator, topology, chips_on_node, chips_allocated))


@functools.lru_cache(maxsize=256)
def _device_plugin_environment(
    accelerator: str, topology: str, chips_on_node: int, chips_allocated: int
) -> tuple[tuple[str, str], ...]:
    generation = tpu_generation(accelerator)
    ports = METRICS_PORTS.get(chips_on_node)
    if ports is None:
        raise DevicePluginError(f"invalid value for acceleratorCount: {chips_on_node}")
    env = {"TPU_SKIP_MDS_QUERY": "true", "TPU_RUNTIME_METRICS_PORTS": ports}
    dimensions: tuple[int, ...] = ()
    if topology:
        dimensions = _dimensions(topology)
        env[labels.ENV_TPU_TOPOLOGY] = topology
        env[labels.ENV_TPU_ACCELERATOR_TYPE] = accelerator_type(generation, topology)
    if topology and (accelerator.endswith("slice") or "tpu7x" in accelerator):
        per_host = CHIPS_PER_HOST_DIMENSIONS.get(chips_allocated)
        if per_host is None:
            raise DevicePluginError(f"invalid chip count for {generation}: {chips_allocated}")
        host_bounds = ",".join(str(d // c) for d, c in zip(dimensions, per_host, strict=True))
        chip_bounds = ",".join(str(c) for c in per_host)
        wrap = _wrap(generation, dimensions)
        if generation in ("v4", "v5p", "tpu7x") and all(d >= 4 for d in dimensions):
            env["ENABLE_ICI_RESILIENCY"] = "true"
        env |= {
            "TPU_TOPOLOGY_ALT": "false",
            "ALT": "false",
            "TPU_TOPOLOGY_WRAP": wrap,
            "WRAP": wrap,
            "HOST_BOUNDS": host_bounds,
            "TPU_HOST_BOUNDS": host_bounds,
            "CHIPS_PER_HOST_BOUNDS": chip_bounds,
            "TPU_CHIPS_PER_HOST_BOUNDS": chip_bounds,
        }
    if chips_on_node == _chips(dimensions) and generation != "tpu7x":
        # One VM holds the whole slice; TPU7x leaves these to the workload.
        env[labels.ENV_TPU_WORKER_ID] = "0"
        env["TPU_WORKER_HOSTNAMES"] = "localhost"
    return tuple(env.items())


# --- the kubelet --------------------------------------------------------------------------

_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _field(pod: Mapping[str, Any], path: str) -> str:
    """A `fieldRef` as the kubelet resolves it for a running pod."""
    meta = pod.get("metadata") or {}
    if path.startswith(_FIELD_LABEL_PREFIXES):  # the pattern is tried only where it may match
        keyed = _FIELD_LABEL.match(path)
        if keyed:
            return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    part, _, member = path.partition(".")
    if path not in _SIMPLE_FIELDS:
        return ""
    holder = meta if part == "metadata" else (pod.get(part) or {})
    return str(holder.get(member) or "")


_SIMPLE_FIELDS: Final = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.podIP",
    }
)
"""The `fieldRef` paths read from one member of the pod's metadata, spec or status."""
_FIELD_LABEL_PREFIXES: Final = ("metadata.labels[", "metadata.annotations[")


def _expand(value: str, defined: Mapping[str, str]) -> str:
    """`$(NAME)` of a variable defined earlier in the container's env; `$$` is a `$`;
    anything else is kept as written."""

    if "$" not in value:
        return value  # no reference to expand (most values)

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, value)


def spec_environment(pod: Mapping[str, Any], container_index: int = 0) -> dict[str, str]:
    """The container's own `env` as the kubelet resolves it: `fieldRef`s read from the
    pod, `$(NAME)` references expanded, the last of a name kept. Other `valueFrom`
    sources (secrets, config maps, resource fields) are left out: nothing here has them."""
    container = (pod.get("spec") or {}).get("containers", [])[container_index]
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = _expand(str(var["value"] or ""), env)
        elif "fieldRef" in (var.get("valueFrom") or {}):
            env[var["name"]] = _field(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
    return env


def container_environment(pod: Mapping[str, Any], container_index: int = 0) -> dict[str, str]:
    """What the process in the pod's container (the Ray container by default) finds in
    its environment once the pod runs on its node: the TPU device plugin's variables
    if it requests TPUs, overridden by the container's own."""
    spec = pod.get("spec") or {}
    container = spec.get("containers", [])[container_index]
    environment: dict[str, str] = {}
    if requests_tpus([container]):
        selector = spec.get("nodeSelector") or {}
        chips = chips_requested([container])
        environment.update(
            device_plugin_environment(
                selector.get(labels.GKE_TPU_ACCELERATOR_SELECTOR, ""),
                selector.get(labels.GKE_TPU_TOPOLOGY_SELECTOR, ""),
                chips_on_node=chips,
                chips_allocated=chips,
            )
        )
    environment.update(spec_environment(pod, container_index))
    return environment
