"""How does the GKE TPU webhook (`github.com/ai-on-gke/kuberay-tpu-webhook`, `main.go`
at ef658db) count TPUs and hosts? The chips a pod's containers request, the hosts a
topology has at that many chips per host, and, for a pod KubeRay did not number, which
replica and worker id the webhook gives it from the pods it has seen. Its own reading
of a pod, not ours (nothing here calls `tpu_autoscaler.manifest.shapes`); the
admission itself is `controlplane/webhook.py`."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from kubernetes.utils.quantity import parse_quantity

from tpu_autoscaler.core import labels

KUBERAY_CREATED_BY_LABEL: Final = "app.kubernetes.io/created-by"
WATCHED_POD_LABELS: Final = {
    labels.KUBERAY_NODE_TYPE: "worker",
    KUBERAY_CREATED_BY_LABEL: "kuberay-operator",
}
"""The webhook's pod informer lists only these pods (`tweakListOptionsFunc`)."""


class WebhookGoError(Exception):
    """An error inside the webhook's Go code (it logs it and answers 403)."""


def _quantity(resources: Mapping[str, Any] | None, kind: str) -> Decimal:
    value = ((resources or {}).get(kind) or {}).get(labels.GKE_TPU_RESOURCE)
    return Decimal(0) if value is None else _parsed_quantity(type(value).__name__, value)


@functools.lru_cache(maxsize=256)
def _parsed_quantity(_: str, value: Any) -> Decimal:
    """`parse_quantity`, once per value (and type: `4` and `"4"` are kept apart) of the
    few a cluster's pods carry: the webhook reads each pod's TPU requests some
    fifteen times. A Decimal is immutable, so the one made is handed out."""
    return Decimal(parse_quantity(value))


def requests_tpus(containers: Iterable[Mapping[str, Any]]) -> bool:
    """`containerRequestingTPUs`: a non-zero `google.com/tpu` limit or request."""
    # Loops rather than `any` over `_quantity`: asked several times per pod created
    # (the webhook, the kubelet), the generator's steps were most of it.
    for container in containers:
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            value = (resources.get(kind) or {}).get(labels.GKE_TPU_RESOURCE)
            if value is not None and _parsed_quantity(type(value).__name__, value) != 0:
                return True
    return False


def chips_requested(containers: Iterable[Mapping[str, Any]]) -> int:
    """`getNumTPUChipsRequested`: per container the request, else the limit, rounded up
    as `Quantity.Value()` rounds; summed over the pod."""
    total = 0
    for container in containers:
        resources = container.get("resources")
        chips = _quantity(resources, "requests") or _quantity(resources, "limits")
        total += math.ceil(chips) if chips > 0 else math.floor(chips)
    return total


_GO_INT = re.compile(r"[+-]?[0-9]+")


def go_atoi(text: str) -> int:
    if not _GO_INT.fullmatch(text):
        raise WebhookGoError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


@functools.lru_cache(maxsize=256)
def hosts_from_topology(topology: str, chips_per_host: int) -> int:
    """`getNumTPUHostsFromTopology`: chips of the topology integer-divided by chips per
    host, at least 1. Kept per topology and chips (a pure function of the few a
    cluster's pods carry, asked for every pod created; an error is not kept)."""
    if topology == "":
        raise WebhookGoError("TPU topology not specified")
    chips = 1
    for dimension in topology.split("x"):
        chips *= go_atoi(dimension)
    if chips_per_host == 0:
        raise WebhookGoError("runtime error: integer divide by zero")
    quotient = abs(chips) // abs(chips_per_host)  # Go's int32 division truncates toward 0
    return max(quotient if (chips < 0) == (chips_per_host < 0) else -quotient, 1)


def env_var(container: Mapping[str, Any], name: str) -> tuple[str, bool]:
    """`getEnvironmentVariable`: (value, set), where a `valueFrom` counts as set with an
    empty value and an empty `value` does not count."""
    for var in container.get("env") or []:
        if var.get("name") == name:
            if var.get("value"):
                return str(var["value"]), True
            if var.get("valueFrom") is not None:
                return "", True
    return "", False


def env_vars(container: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """`env_var` of every name the container's `env` sets, from one walk of it: the
    webhook asks a container for some ten variables while its env stays as it is."""
    found: dict[str, tuple[str, bool]] = {}
    for var in container.get("env") or []:
        name = var.get("name")
        if type(name) is not str or name in found:
            continue  # `env_var` asks for strings; the first that counts as set wins
        if var.get("value"):
            found[name] = (str(var["value"]), True)
        elif var.get("valueFrom") is not None:
            found[name] = ("", True)
    return found


def tpu_containers_of(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's containers that request TPUs, in order."""
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if requests_tpus([c])]


def slice_hosts(
    cluster: str, group: str, namespace: str, existing_pods: Iterable[Mapping[str, Any]]
) -> dict[int, list[int]]:
    """`getSliceToTPUHosts`: replica index -> host indices of the group's pods the webhook
    has labelled (`replicaIndex`), terminating ones left out, as its informer lists them."""
    found: dict[int, list[int]] = {}
    for pod in existing_pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        watched = {
            **WATCHED_POD_LABELS,
            labels.KUBERAY_CLUSTER: cluster,
            labels.KUBERAY_GROUP: group,
        }
        if meta.get("namespace") != namespace or any(
            pod_labels.get(k) != v for k, v in watched.items()
        ):
            continue
        if meta.get("deletionTimestamp"):
            continue
        if not requests_tpus((pod.get("spec") or {}).get("containers") or []):
            return found  # the Go code stops at the first pod without TPUs
        replica_label = pod_labels.get(labels.WEBHOOK_REPLICA_INDEX, "")
        if replica_label == "":
            continue
        try:
            replica = go_atoi(replica_label.split("-")[-1])
        except WebhookGoError:
            replica = 0
        tpu_containers = tpu_containers_of(pod)
        for container in tpu_containers:
            worker_id, _ = env_var(container, labels.ENV_TPU_WORKER_ID)
            if worker_id == "":
                raise WebhookGoError("existing TPU worker missing TPU_WORKER_ID")
            try:
                host = go_atoi(worker_id) // len(tpu_containers)
            except WebhookGoError:
                continue
            found.setdefault(replica, []).append(host)
            break
    return found


def next_replica_index(hosts_by_replica: Mapping[int, Sequence[int]], num_hosts: int) -> int:
    """`getReplicaIndex`: the lowest replica still short of hosts, else the number of
    replicas seen (not the lowest free index: with replicas 1 and 2 left, a new
    single-host pod joins index 2 again)."""
    short = [r for r, hosts in hosts_by_replica.items() if len(hosts) < num_hosts]
    return min(short) if short else len(hosts_by_replica)


def next_worker_id(hosts_by_replica: Mapping[int, Sequence[int]], replica_index: int) -> int:
    """`getNextWorkerID`: the lowest host index not yet taken in the replica."""
    worker_id = 0
    last = 0
    for position, host in enumerate(sorted(hosts_by_replica.get(replica_index, []))):
        if position == 0:
            last = host
        elif host == last:
            raise WebhookGoError(
                "Identical TPU_WORKER_ID assigned to multiple TPU workers in slice"
            )
        if host != worker_id:
            break
        last = host
        worker_id += 1
    return worker_id
