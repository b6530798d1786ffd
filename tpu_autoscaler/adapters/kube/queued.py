"""Queued provisioning in the controller's round: read our ProvisioningRequests, their
PodTemplates and which pods consume them; turn ended requests into capacity signals
for the policy; after the policy's plan, bind, create and delete as `queued_steps`
decides. The RayCluster patch (with the binding) goes first, then the request
writes, each on its own: one that fails is left to the next round, which starts from
what it reads (`queued_steps` says why nothing partial survives)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, JsonPatch, NotFound
from tpu_autoscaler.adapters.kube.provreq_objects import (
    CLUSTER_LABEL,
    CONSUME_ANNOTATION,
    ProvisioningApi,
    parse_request,
    pod_template,
    provisioning_request,
    request_name,
)
from tpu_autoscaler.adapters.kube.queued_steps import (
    Consumers,
    QueuedSteps,
    QueuedView,
    binding_operations,
    decide,
    launches_carried,
)
from tpu_autoscaler.core.capacity import CapacitySignal
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.shape import SliceShape

log = logging.getLogger("tpu_autoscaler")


@dataclass
class QueuedProvisioning:
    """One RayCluster's queued groups. `recent` keeps each ended request's signal
    after the request is deleted, for `hold_s` (the policy's `stockout_hold_s`), and
    `excess_since` when each unwanted request became so: the only memory; losing it
    (a restart) forgets failures older than one round and restarts the grace."""

    api: ProvisioningApi
    namespace: str
    cluster: str
    hold_s: float = 600.0
    recent: dict[str, CapacitySignal] = field(default_factory=dict)
    excess_since: dict[str, float] = field(default_factory=dict)

    def read(
        self,
        cluster_raw: Mapping[str, Any],
        raw_pods: Sequence[Mapping[str, Any]],
        shapes: Sequence[SliceShape],
        now_s: float,
    ) -> QueuedView | None:
        """What the queued groups look like now; None if no group is queued (nothing
        is listed then)."""
        queued = {s.group: s for s in shapes if s.scarcity.queued_provisioning}
        if not queued:
            return None
        selector = {CLUSTER_LABEL: self.cluster}
        try:
            listed = self.api.list_provisioning_requests(self.namespace, selector)
        except NotFound as exc:
            groups = ", ".join(sorted(queued))
            raise ApiError(
                f"{exc}: groups {groups} ask for queued provisioning but this cluster "
                "serves no ProvisioningRequest API (autoscaling.x-k8s.io/v1; GKE "
                "queued provisioning, docs/queued-provisioning.md)"
            ) from exc
        requests = [parse_request(r) for r in listed]
        templates = self.api.list_pod_templates(self.namespace, selector)
        index: dict[str, int] = {}
        bound: dict[str, str] = {}
        for i, spec in enumerate(cluster_raw["spec"]["workerGroupSpecs"]):
            group = spec.get("groupName", "")
            if group in queued:
                index[group] = i
                meta = (spec.get("template") or {}).get("metadata") or {}
                named = (meta.get("annotations") or {}).get(CONSUME_ANNOTATION)
                if named:
                    bound[group] = named
        return QueuedView(
            requests=tuple(r for r in requests if r.group in queued),
            templates=frozenset(t["metadata"]["name"] for t in templates),
            consumers=_consumers(raw_pods),
            bound=bound,
            group_index=index,
            hosts={g: int(s.hosts_per_replica) for g, s in queued.items()},
            now_s=now_s,
            excess_since=dict(self.excess_since),
        )

    def signals(self, view: QueuedView | None, now_s: float) -> tuple[CapacitySignal, ...]:
        """Signals of requests that ended, now or within `hold_s`."""
        if view is not None:
            for signal in decide(view, Plan()).signals:
                self.recent[signal.source] = signal
        self.recent = {k: s for k, s in self.recent.items() if now_s - s.at_s <= self.hold_s}
        return tuple(self.recent.values())

    def steps(self, view: QueuedView, plan: Plan) -> QueuedSteps:
        return decide(view, plan, lambda group, i: request_name(self.cluster, group, view.now_s, i))

    def carried(self, view: QueuedView, plan: Plan, steps: QueuedSteps) -> tuple[Plan, JsonPatch]:
        """The plan as the RayCluster patch carries it, and the binding operations."""
        return launches_carried(plan, view, steps), binding_operations(view, steps)

    def carry_out(
        self, cluster_raw: Mapping[str, Any], view: QueuedView, steps: QueuedSteps
    ) -> int:
        """Delete and create as `steps` says, after the RayCluster patch landed; the
        number of writes that failed (each left to the next round)."""
        self.excess_since = dict(steps.excess_since)
        failed = 0
        for name in steps.delete_requests:
            failed += self._try(
                lambda n=name: self.api.delete_provisioning_request(self.namespace, n)
            )
        for name in steps.delete_templates:
            failed += self._try(lambda n=name: self.api.delete_pod_template(self.namespace, n))
        for group, name in steps.create:
            template = pod_template(name, cluster_raw, group)
            request = provisioning_request(name, cluster_raw, group, view.hosts[group])
            if self._try(lambda t=template: self.api.create_pod_template(self.namespace, t)):
                failed += 1
                continue
            failed += self._try(
                lambda r=request: self.api.create_provisioning_request(self.namespace, r)
            )
        return failed

    def _try(self, write: Any) -> int:
        try:
            write()
        except NotFound:
            return 0  # already gone: what a delete wanted
        except ApiError as exc:
            log.warning(f"queued provisioning: {exc}", extra={"cluster": self.cluster})
            return 1
        return 0


def _consumers(raw_pods: Sequence[Mapping[str, Any]]) -> dict[str, Consumers]:
    counts: dict[str, Consumers] = {}
    for pod in raw_pods:
        meta = pod.get("metadata") or {}
        name = (meta.get("annotations") or {}).get(CONSUME_ANNOTATION)
        if not name or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            continue
        seen = counts.get(name, Consumers())
        scheduled = bool((pod.get("spec") or {}).get("nodeName"))
        counts[name] = Consumers(seen.created + 1, seen.scheduled + int(scheduled))
    return counts
