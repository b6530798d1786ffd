"""In-place pod resizes carried out as Ray 2.60's `KubeRayIPPRProvider` carries them
out: a JSON patch to the pod's `resize` subresource, then `ray.io/ippr-status` on the
pod with the raylet and the time it was sent; once the kubelet reports the new size,
the raylet is told through the GCS (`ResizeRayletResourceInstances`, Ray's
`sync_with_raylets`) and the record's `resizing-at` is cleared. Until then the policy
counts the pod at the size asked for (`PodSize.resizing`).

An API server without the subresource (Kubernetes < 1.33, e.g. 1.20) answers 404 (and
one that does not allow it, 403): resizing is then off for the life of the process
and the policy is given shapes without resize bounds, so demand launches pods as it
would without the annotation."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import compress, repeat
from operator import is_not, not_

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi, NotFound
from tpu_autoscaler.adapters.kube.pod_size import RESIZE_CONDITIONS
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.adapters.kube.resize import ippr_status, resize_operations
from tpu_autoscaler.adapters.ray.gcs import GcsApi, GcsUnavailable
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.plan import Resize
from tpu_autoscaler.core.resize import CPU, IPPR_STATUS_ANNOTATION, MEMORY
from tpu_autoscaler.core.snapshot import Host

log = logging.getLogger(__name__)


class Resizer:
    def __init__(self, kube: KubeApi, gcs: GcsApi, namespace: str, clock: Callable[[], float]):
        self.kube = kube
        self.gcs = gcs
        self.namespace = namespace
        self.clock = clock
        self.supported = True
        """False once the API server had no `pods/resize` subresource."""
        self.owe_nothing: dict[int, Pod] = {}
        """Pods (by `id`, each held so its `id` is not reused) whose raylet `sync` owes
        nothing by what the pod itself says: no resize recorded, none under way, or the
        kubelet not done. A parsed pod is never changed in place (a frozen model, kept
        by the `Observer` only while its resourceVersion stays), so the same object
        says the same again; a pod changed in any way (its record written, its resize
        applied) is a new object and is looked at afresh. Nothing else goes into the
        verdict, so no round's outcome (a failed or abandoned one, a re-plan) can make
        it wrong, and an empty memory (a restart) only looks at every pod again."""
        self.read_last: list[Pod | None] = []
        """Last round's pods in the order read, each that owed nothing then (None in the
        place of one that owed): a pod in the same place now is passed over too."""

    def planned_on(self, loaded: LoadedSnapshot) -> LoadedSnapshot:
        """What the policy is given: without resize bounds where resizing is off."""
        if self.supported or not any(s.resize for s in loaded.snapshot.shapes):
            return loaded
        shapes = tuple(replace(s, resize=None) for s in loaded.snapshot.shapes)
        return replace(loaded, snapshot=replace(loaded.snapshot, shapes=shapes))

    def carry_out(self, loaded: LoadedSnapshot, resizes: Iterable[Resize]) -> None:
        resizes = tuple(resizes)
        if not resizes or not self.supported:
            return  # most rounds resize nothing: no maps of every pod and host for them
        pods = {p.name: p for p in loaded.pods}
        nodes = {h.pod_name: h.node_id for r in loaded.snapshot.replicas for h in r.hosts}
        for resize in resizes:
            pod = pods.get(resize.pod)
            if pod is None or not self.supported:
                continue
            try:
                self.kube.resize_pod(
                    self.namespace, pod.name, resize_operations(pod, resize.resources_to)
                )
            except ApiError as exc:
                gone = isinstance(exc, NotFound) and pod.name not in self._listed()
                if exc.transient or gone:
                    log.warning(
                        "pod %s: resize to %s failed: %s", pod.name, resize.resources_to, exc
                    )
                    continue
                # No pods/resize (Kubernetes < 1.33: 404) or not allowed (403): off for
                # good, else the demand it was for would wait forever.
                self.supported = False
                log.warning(
                    "pod %s: the API server refused an in-place resize (%s); in-place "
                    "resize is off, demand launches pods instead",
                    pod.name,
                    exc,
                )
                continue
            log.info("pod %s: resizing in place: %s", pod.name, resize.reason)
            self._record(pod, nodes.get(pod.name), int(self.clock()))

    def sync(self, loaded: LoadedSnapshot) -> None:
        """Tell each raylet whose pod the kubelet finished resizing its new size. A pod
        read as last round (the same object) that owed nothing then owes nothing now
        (`owe_nothing`, `read_last`): only new or changed pods are looked at, and the
        others are passed over in C (a Python step for each was ~0.6 ms a round at
        4,096 pods)."""
        owe_nothing = self.owe_nothing
        hosts: dict[str, Host] | None = None
        pods = loaded.pods
        last = self.read_last
        if len(last) < len(pods):
            last = [*last, *repeat(None, len(pods) - len(last))]
        # First by place, in C: most pods are where they were, the same objects. A pod
        # added or gone moves those after it; `owe_nothing` finds those by `id` (it holds
        # its pods, so no other pod has the `id` of one of them), also in C.
        moved = list(compress(pods, map(is_not, pods, last)))
        owed: list[Pod] = []
        for pod in compress(moved, map(not_, map(owe_nothing.__contains__, map(id, moved)))):
            raylet = _raylet_owed(pod)
            if raylet is None:
                owe_nothing[id(pod)] = pod
                continue
            owed.append(pod)  # looked at again next round, wherever it is
            if hosts is None:
                hosts = _hosts_by_pod(loaded)
            size = _applied_size(hosts.get(pod.name))
            if size is None:
                continue
            try:
                self.gcs.resize_raylet_resource_instances(raylet, size)
            except GcsUnavailable as exc:
                log.warning("pod %s: telling its raylet of the resize failed: %s", pod.name, exc)
                continue
            self._record(pod, raylet, None)
        if owed:  # rare: a resize under way
            owing = set(map(id, owed))
            self.read_last = [None if id(pod) in owing else pod for pod in pods]
        else:
            self.read_last = list(pods)
        if len(owe_nothing) > 2 * len(pods):  # pods gone: let them go
            self.owe_nothing = {id(p): p for p in pods if owe_nothing.get(id(p)) is p}

    def _record(self, pod: Pod, raylet: str | None, resizing_at_s: int | None) -> None:
        try:
            self.kube.annotate_pod(
                self.namespace, pod.name, ippr_status(raylet, resizing_at_s, _recorded(pod))
            )
        except ApiError as exc:
            log.warning("pod %s: recording the resize failed: %s", pod.name, exc)

    def _listed(self) -> set[str]:
        try:
            return {p["metadata"]["name"] for p in self.kube.list_pods(self.namespace)}
        except ApiError:
            return set()


def _recorded(pod: Pod) -> dict[str, object]:
    raw = pod.metadata.annotations.get(IPPR_STATUS_ANNOTATION)
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _applied(pod: Pod) -> bool:
    """The kubelet reports the spec's resources and no resize is pending."""
    if any(c.type in RESIZE_CONDITIONS and c.status == "True" for c in pod.status.conditions):
        return False
    container = pod.spec.containers[0] if pod.spec.containers else None
    status = next(
        (s for s in pod.status.container_statuses or () if container and s.name == container.name),
        None,
    )
    return (
        container is not None
        and status is not None
        and status.resources is not None
        and status.resources.requests == container.resources.requests
        and status.resources.limits == container.resources.limits
    )


def _raylet_owed(pod: Pod) -> str | None:
    """The raylet to tell of the pod's new size, by the pod alone: a resize recorded
    as under way (`resizing-at`) for a raylet, and the kubelet done with it."""
    if not pod.metadata.annotations.get(IPPR_STATUS_ANNOTATION):
        return None  # nothing recorded (`_recorded` is empty): no resize under way
    recorded = _recorded(pod)
    raylet = recorded.get("raylet-id")
    if recorded.get("resizing-at") is None or not raylet or not _applied(pod):
        return None
    return str(raylet)


def _hosts_by_pod(loaded: LoadedSnapshot) -> dict[str, Host]:
    """Every replica's hosts by pod, the first where a pod is in several (as a scan
    for it finds)."""
    hosts: dict[str, Host] = {}
    for replica in loaded.snapshot.replicas:
        for host in replica.hosts:
            hosts.setdefault(host.pod_name, host)
    return hosts


def _applied_size(host: Host | None) -> dict[str, float] | None:
    if host is None or host.size is None:
        return None
    return {CPU: host.size.cpu, MEMORY: host.size.memory_bytes}
