"""In-place pod resize in the stock comparison (`baseline.py`): the IPPR specs and
per-pod statuses Ray 2.60's `KubeRayProvider` hands its scheduler each round, read by
Ray's own `KubeRayIPPRProvider` from the RayCluster and the pods as listed, and the
resizes of the scheduler's reply (`to_ippr`) as plan elements. Ray sends a resize only
for a pod whose raylet is known (`IPPRStatus.has_resize_request_to_send`), which
`to_ippr` already filters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.ippr_provider import (
    KubeRayIPPRProvider,
)
from ray.autoscaler.v2.schema import IPPRSpecs, IPPRStatus

from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.plan import Resize
from tpu_autoscaler.core.resize import CPU, MEMORY


def ippr_view(
    raycluster: Mapping[str, Any], pods: Iterable[Pod]
) -> tuple[IPPRSpecs, dict[str, IPPRStatus]]:
    """Ray's IPPR specs for `raycluster` and its statuses of `pods` (no GCS or API
    calls: both readers are pure)."""
    reader = KubeRayIPPRProvider(gcs_client=None, k8s_api_client=None)
    reader.validate_and_set_ippr_specs(dict(raycluster))
    reader.sync_ippr_status_from_pods(
        [p.model_dump(by_alias=True, exclude_none=True) for p in pods]
    )
    return reader.get_ippr_specs(), reader.get_ippr_statuses()


def ray_resizes(to_ippr: Iterable[IPPRStatus], pods: Iterable[Pod]) -> tuple[Resize, ...]:
    """The scheduler's resize requests, one `Resize` per pod (single-host groups: the
    replica is the pod)."""
    groups = {p.name: p.metadata.labels.get(labels.KUBERAY_GROUP, "") for p in pods}
    return tuple(
        Resize(
            groups.get(status.cloud_instance_id, ""),
            status.cloud_instance_id,
            status.cloud_instance_id,
            {CPU: float(status.current_cpu), MEMORY: float(status.current_memory)},
            {CPU: float(status.desired_cpu), MEMORY: float(status.desired_memory)},
            "Ray: resized in place to its group's ray.io/ippr maximum",
        )
        for status in to_ippr
    )
