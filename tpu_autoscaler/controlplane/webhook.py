"""What do the GKE TPU webhooks (`github.com/ai-on-gke/kuberay-tpu-webhook`, `main.go`
at ef658db, May 2026) answer when a RayCluster or a pod is created, and how does
kube-apiserver report it? Rule for rule, as pure functions: the webhook's own reading
of a RayCluster and a pod, not ours (nothing here calls
`tpu_autoscaler.manifest.shapes`), so the simulator gets a second opinion on every TPU
shape.

Two webhooks, as `deployments/*-webhook-cfg.yaml` register them:
- validating, RayCluster **CREATE only** (`validateRayCluster`): a TPU worker group
  whose `numOfHosts` differs from topology chips / chips per pod
  (`controlplane/webhook_hosts.py`) is denied; an update is never seen, so a later
  edit to 3 hosts on a 4x4 is stored.
- mutating, Pod CREATE of pods labelled `app.kubernetes.io/name: kuberay`
  (`mutatePod`): a pod requesting `google.com/tpu` is patched
  (`controlplane/webhook_patches.py`) with its replica index and `TPU_WORKER_ID` (from
  KubeRay's `ray.io/worker-group-replica-index` and `ray.io/replica-host-index` labels
  when both are set, else from the webhook's own bookkeeping over the pods it has
  seen: `getReplicaIndex`, `getNextWorkerID`, and the legacy `replicaIndex` label),
  `TPU_NAME`, multi-host DNS, node-pool affinity, MegaScale variables and the device
  plugin address.

How kube-apiserver reports the webhook's answers (k8s.io/apiserver
`webhook/errors.ToStatusErr` and the dispatchers): a denial is HTTP 400,
`admission webhook "<name>" denied the request: <message>`; an error inside the
webhook (it answers HTTP 403) fails the write closed with HTTP 500,
`Internal error occurred: failed calling webhook "<name>": failed to call webhook:
<the webhook's text>`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from tpu_autoscaler.adapters.kube.api import ApiError, Rejected
from tpu_autoscaler.controlplane.json_copy import json_copy
from tpu_autoscaler.controlplane.json_patch import apply_operation
from tpu_autoscaler.controlplane.webhook_hosts import (
    WebhookGoError,
    chips_requested,
    hosts_from_topology,
    requests_tpus,
)
from tpu_autoscaler.controlplane.webhook_patches import mutation_patches
from tpu_autoscaler.core import labels

VALIDATING_WEBHOOK: Final = "raycluster-kuberay-tpu-webhook.ray-system.svc"
MUTATING_WEBHOOK: Final = "kuberay-tpu-webhook.ray-system.svc"

KUBERAY_APP_NAME_LABEL: Final = "app.kubernetes.io/name"
MUTATED_POD_LABELS: Final = {KUBERAY_APP_NAME_LABEL: "kuberay"}
"""The mutating webhook's `objectSelector`: other pods never reach it."""

TOPOLOGY_MISMATCH: Final = "Number of workers in worker group not equal to specified topology"


class WebhookDenied(Rejected):
    """The webhook answered `allowed: false`."""

    status = 400

    def __init__(self, webhook: str, message: str) -> None:
        super().__init__(f'admission webhook "{webhook}" denied the request: {message}')


class WebhookFailed(ApiError):
    """The webhook answered with an HTTP error; the write fails closed."""

    status = 500

    def __init__(self, webhook: str, answer: str) -> None:
        super().__init__(
            f'Internal error occurred: failed calling webhook "{webhook}": '
            f"failed to call webhook: {answer}"
        )


# --- RayCluster validation ------------------------------------------------------------


def _workers_match_topology(group: Mapping[str, Any]) -> bool:
    """`checkWorkersMatchTopology`."""
    num_hosts = int(group.get("numOfHosts") or 0)
    if num_hosts == 0:
        raise WebhookGoError("workerGroupSpec NumOfHosts not set")
    pod_spec = (group.get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or []
    if not containers:
        raise WebhookGoError("Container path not specified")
    if requests_tpus(containers):
        topology = (pod_spec.get("nodeSelector") or {}).get(labels.GKE_TPU_TOPOLOGY_SELECTOR, "")
        if topology == "":
            raise WebhookGoError("TPU topology not specified")
        chips_per_host = chips_requested(containers)
        if chips_per_host == 0:
            raise WebhookGoError("Container does not set TPU limits")
        if hosts_from_topology(topology, chips_per_host) != num_hosts:
            return False
    return True


def denial(raycluster: Mapping[str, Any]) -> str | None:
    """`validateRayCluster`: the message of a denied RayCluster CREATE, None if allowed.
    Groups whose containers request no TPUs pass; an error inside the webhook raises
    `WebhookFailed`."""
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    for group in groups:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        if containers and not requests_tpus(containers):
            continue
        try:
            matches = _workers_match_topology(group)
        except WebhookGoError:
            raise WebhookFailed(VALIDATING_WEBHOOK, "Failed to validate RayCluster") from None
        if not matches:
            return TOPOLOGY_MISMATCH
    return None


def admit_raycluster_create(raycluster: Mapping[str, Any]) -> None:
    """The validating webhook on a RayCluster CREATE: `WebhookDenied` (400) or
    `WebhookFailed` (500) as kube-apiserver reports them. Updates never reach it."""
    message = denial(raycluster)
    if message is not None:
        raise WebhookDenied(VALIDATING_WEBHOOK, message)


# --- pod mutation ----------------------------------------------------------------------


def pod_patches(
    pod: Mapping[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`mutatePod`: the JSON patch the webhook answers for a pod CREATE, given the pods
    its informer lists (`existing_pods`; it filters them as the informer does). Raises
    `WebhookFailed` where the Go code returns an error."""
    try:
        # Walked only for a pod without KubeRay's indexes (never with the gate on):
        # listing every stored pod per pod created was a large cluster's square.
        return mutation_patches(pod, existing_pods)
    except WebhookGoError:
        raise WebhookFailed(MUTATING_WEBHOOK, "Failed to mutate Pod") from None


def mutate_pod(
    pod: Mapping[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """The pod as stored after the mutating webhook, as the webhook sees a pod admission
    request: the pod KubeRay POSTs (no RayCluster; only its labels, node selector and
    containers) and the pods of its informer. A pod outside the webhook's
    `objectSelector` is returned unchanged. A copy of its own: `pod` stays as it was."""
    return mutate_own_pod(json_copy(dict(pod)), existing_pods)


def mutate_own_pod(
    pod: dict[str, Any], existing_pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """`mutate_pod` of a pod its caller hands over (the API server storing a create
    the caller made for that call alone): patched in place, no copy of it made, and
    the patch's values, which `mutation_patches` makes anew for each pod, stored as
    made rather than copied again. Returns `pod`."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    if any(pod_labels.get(k) != v for k, v in MUTATED_POD_LABELS.items()):
        return pod
    for operation in pod_patches(pod, existing_pods):  # all made before any applies
        apply_operation(pod, operation, copy_value=False)
    return pod
