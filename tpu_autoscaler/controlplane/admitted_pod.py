"""A worker pod as the API server stores it, made without one: KubeRay's POST
(`kuberay_pod.py`) from its group's template, or from a group made for a shape when no
RayCluster is at hand, named as KubeRay and the API server would name it (here
deterministically), admitted by the GKE TPU webhook (`webhook.py`) given the pods it
already lists. The same chain as the simulated operator's pods through the store's
admission, so snapshots and tests hold the pods the simulator would make."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from tpu_autoscaler.controlplane import kuberay_pod, webhook
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape


def pod_name(cluster: str, group: str, replica_index: int, host_index: int, serial: int = 0) -> str:
    """KubeRay's `<cluster>-<group>-worker-<5 chars>`, deterministic here; `serial`
    tells apart pods that reuse a replica index after a deletion."""
    key = f"{cluster}/{group}/{replica_index}/{host_index}/{serial}"
    # KubeRay retries a clashing random suffix; a longer hash avoids clashes here.
    return f"{cluster}-{group}-worker-{_suffix(key, serial)}"


def replica_name(group: str, replica_index: int, serial: int = 0) -> str:
    """KubeRay's unique `<group>-<5 chars>` replica name, deterministic here."""
    key = f"{group}/{replica_index}/{serial}"
    return f"{group}-{_suffix(key, serial)}"


def _suffix(key: str, serial: int) -> str:
    """Five characters, as KubeRay's, for fixed scenarios; ten once a simulator creates
    thousands of pods, so that names never clash."""
    return hashlib.sha1(key.encode()).hexdigest()[: 5 if serial == 0 else 10]


def slice_name(group: str, replica_index: int) -> str:
    """The webhook's `TPU_NAME`: `<group>-<replica index>`."""
    return f"{group}-{replica_index}"


def group_template(shape: SliceShape) -> dict[str, Any]:
    """A worker group spec for `shape` when no RayCluster is at hand: a Ray container
    requesting the host's chips and the node selector the TPU webhook reads."""
    container: dict[str, Any] = {"name": "ray-worker", "image": "rayproject/ray:2.60.0"}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if shape.tpu is not None:
        chips = {labels.GKE_TPU_RESOURCE: str(shape.chips_per_host)}
        container["resources"] = {"limits": dict(chips), "requests": dict(chips)}
        pod_spec["nodeSelector"] = {
            labels.GKE_TPU_ACCELERATOR_SELECTOR: shape.tpu.generation.gke_accelerators[0],
            labels.GKE_TPU_TOPOLOGY_SELECTOR: shape.tpu.topology,
        }
    return {
        "groupName": shape.group,
        "numOfHosts": int(shape.hosts_per_replica),
        "template": {"spec": pod_spec},
    }


def admitted_pod(
    posted: Mapping[str, Any],
    name: str,
    created: str,
    existing: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """What the API server stores for a pod KubeRay POSTs: named (from its
    generateName), stamped, mutated by the TPU webhook given the pods it lists, Pending."""
    pod = copy.deepcopy(dict(posted))
    pod["metadata"] = {"name": name, **pod["metadata"], "creationTimestamp": created}
    pod = webhook.mutate_pod(pod, existing)
    pod["status"] = {"phase": "Pending"}
    return pod


def worker_pod(
    cluster: str,
    namespace: str,
    shape: SliceShape,
    replica_index: int,
    host_index: int,
    created: str,
    phase: str = "Running",
    serial: int = 0,
    name: str | None = None,
    replica: str | None = None,
    multi_host_indexing: bool = True,
    raycluster: Mapping[str, Any] | None = None,
    existing: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A worker pod as stored, made by the same chain as in the simulator: KubeRay's
    `buildWorkerPod` (`controlplane/kuberay_pod.py`) from the group in `raycluster` (or one
    made for `shape`), then the TPU webhook's mutation given the pods it already lists
    (`existing`: the single-host and gate-off index fallback counts them). A Running pod
    is bound to a node. `name` and `replica` (KubeRay's random names) default to
    deterministic ones; without `multi_host_indexing` (the KubeRay feature gate off)
    KubeRay sets no replica labels and only the webhook's `replicaIndex` ties a pod to
    its slice. GKE's `TPU_ACCELERATOR_TYPE` and `TPU_TOPOLOGY` are not in the pod:
    `controlplane/gke.py` adds them to the container's environment."""
    if raycluster is None:
        raycluster = {"metadata": {"name": cluster, "namespace": namespace}, "spec": {}}
        group = group_template(shape)
    else:
        group = next(
            g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == shape.group
        )
    multi_host = shape.hosts_per_replica > 1
    posted = kuberay_pod.build_worker_pod(
        raycluster,
        group,
        (replica or replica_name(shape.group, replica_index, serial)) if multi_host else None,
        replica_index,
        host_index,
        multi_host_indexing,
    )
    name = name or pod_name(cluster, shape.group, replica_index, host_index, serial)
    pod = admitted_pod(posted, name, created, existing)
    pod["status"]["phase"] = phase
    if phase == "Running":
        pod["spec"]["nodeName"] = f"node-of-{name}"
    return pod
