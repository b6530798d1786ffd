"""Which slice shape a Ray node type describes, when there is no RayCluster to derive
it from: the `TPU-{pod_type}-head` resource (which Ray's KubeRay config reader puts
on every host) or the `ray.io/tpu-*` labels name the slice, and the `TPU` resource
per host says how many hosts it has. Ray's counts are hosts; the shape's replicas."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.catalog import CatalogError, SliceType
from tpu_autoscaler.core.problems import Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Hosts, Replicas, TpuResource

_HEAD_RESOURCE = re.compile(r"^TPU-(?P<pod_type>.+)-head$")


def shape_from_node_type(config: Any, idle_timeout_s: float | None) -> SliceShape:
    """The slice shape a Ray `NodeTypeConfig` describes. Its counts are hosts
    (`min_worker_nodes = minReplicas x numOfHosts`); the shape's are replicas."""
    resources = {str(k): float(v) for k, v in config.resources.items()}
    node_labels = {str(k): str(v) for k, v in config.labels.items()}
    warnings: list[Problem] = []
    tpu = slice_type_of(resources, node_labels, warnings, config.name)
    per_chip = 1
    tpu_per_host = TpuResource(0.0)
    group_labels = dict(node_labels)
    group_labels[labels.RAY_NODE_GROUP] = config.name
    if tpu is not None:
        tpu_per_host = TpuResource(resources.get(labels.TPU_RESOURCE, float(tpu.chips_per_host)))
        per_chip = max(1, round(tpu_per_host / tpu.chips_per_host))
        resources[labels.TPU_RESOURCE] = tpu_per_host
        # Ray adds these per host (the head on worker 0 only); the shape adds them back.
        for key in list(resources):
            if _HEAD_RESOURCE.match(key) or key.startswith(labels.ACCELERATOR_TYPE_RESOURCE_PREFIX):
                del resources[key]
        group_labels.update(tpu.static_labels())
    hosts = tpu.hosts if tpu is not None else 1
    timeout = config.idle_timeout_s if config.idle_timeout_s is not None else idle_timeout_s
    return SliceShape(
        group=config.name,
        hosts_per_replica=Hosts(hosts),
        min_replicas=Replicas(math.ceil(config.min_worker_nodes / hosts)),
        max_replicas=Replicas(config.max_worker_nodes // hosts),
        # Ray's v2 scheduler terminates nothing for idleness without a timeout.
        idle_timeout_s=float(timeout) if timeout is not None else math.inf,
        upscaling_mode="Default",
        priority=int(config.priority or 0),
        resources_per_host=resources,
        group_labels=group_labels,
        tpu=tpu,
        tpu_per_host=tpu_per_host,
        tpu_resource_per_chip=per_chip,
        warnings=tuple(warnings),
    )


def slice_type_of(
    resources: Mapping[str, float],
    node_labels: Mapping[str, str],
    warnings: list[Problem] | None = None,
    group: str | None = None,
) -> SliceType | None:
    """The TPU slice a node type's resources and labels describe, or None (not TPU).
    The pod type comes from `TPU-{pod_type}-head` or `ray.io/tpu-pod-type`, the
    topology from `ray.io/tpu-topology` (else the squarest one of that many chips),
    the chips per host from the `TPU` resource."""
    pod_type = node_labels.get(labels.RAY_TPU_POD_TYPE)
    for key in resources:
        match = _HEAD_RESOURCE.match(key)
        if match:
            pod_type = match.group("pod_type")
    topology = node_labels.get(labels.RAY_TPU_TOPOLOGY)
    spelling = pod_type or node_labels.get(labels.RAY_ACCELERATOR_TYPE)
    generation = catalog.find_generation(spelling) if spelling else None
    if generation is None:
        return None
    try:
        if topology is None:
            if pod_type is None or not pod_type.rsplit("-", 1)[-1].isdecimal():
                return None
            chips = int(pod_type.rsplit("-", 1)[-1]) // generation.tensorcores_per_chip
            candidates = [t for t in generation.sorted_topologies() if _chips(t) == chips]
            if not candidates:
                return None
            topology = min(candidates, key=lambda t: (_aspect(t), t))
            if len(candidates) > 1 and warnings is not None:
                warnings.append(
                    Problem(
                        "labels",
                        f"{pod_type} may be any of {', '.join(candidates)}; assuming "
                        f"{topology}; set {labels.RAY_TPU_TOPOLOGY} to say",
                        group,
                        "warning",
                    )
                )
        options = generation.valid_chips_per_host(topology)
        tpu = resources.get(labels.TPU_RESOURCE)
        chips_per_host = generation.default_chips_per_host(topology)
        if tpu is not None:
            fits = [
                c
                for per_chip in sorted({1, generation.logical_devices_per_chip})
                for c in options
                if math.isclose(c * per_chip, tpu)
            ]
            if fits:
                chips_per_host = fits[0]
        return catalog.slice_type(generation, topology, chips_per_host)
    except CatalogError:
        return None


def _chips(topology: str) -> int:
    return int(catalog.chips_in_topology(topology))


def _aspect(topology: str) -> float:
    dims = [int(d) for d in topology.split("x")]
    return max(dims) / min(dims)
