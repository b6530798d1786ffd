"""What one round does for the queued groups (`tpu-autoscaler.dev/queued-provisioning`),
decided from what it read and the policy's plan, with no I/O. The policy's launch of
N slices of a queued group becomes, instead of `replicas += N`:

- requests outstanding for them: one ProvisioningRequest + PodTemplate per gang the
  launch names (`Launch.gangs`: k slices needed at once, so one request for k slices'
  hosts, which GKE grants whole or not at all) and one per other slice. Missing ones
  are created, excess ones deleted (the newest that are not provisioned first) once
  they have been in excess for `EXCESS_GRACE_S`: the policy's count dips for a round
  as new hosts settle, and a request deleted loses its place in GKE's queue. A
  request counts toward a wanted gang or slice of its own size only;
- one provisioned request bound per group per round: the group template's consume
  annotations set to its name and `replicas` raised by its slices, in the one guarded
  patch, so KubeRay creates those replicas' pods consuming it. KubeRay stamps one
  template on every replica, so the next request is bound only once every pod of the
  previous one exists (the pods keep the annotation they were created with);
- a request whose pods are all scheduled has served its purpose and is deleted, as
  is one that ended (Failed, BookingExpired, CapacityRevoked: a capacity signal).

Every round starts from what it reads: the requests, the template's annotation and
the pods' are the memory, and the patch that binds is the only write that raises
`replicas`, so a crash between two writes leaves nothing that the next round does
not finish or remove: a gang's slices are raised together or not at all."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tpu_autoscaler.adapters.kube.api import JsonPatch
from tpu_autoscaler.adapters.kube.provreq_objects import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    QUEUED_CLASS,
    QueuedRequest,
)
from tpu_autoscaler.core.capacity import CapacitySignal
from tpu_autoscaler.core.plan import Launch, Plan
from tpu_autoscaler.core.units import Replicas

EXCESS_GRACE_S = 30.0
"""How long a request stays unwanted by the plan before it is deleted."""


@dataclass(frozen=True)
class Consumers:
    """The live pods (not being deleted) that carry one request's consume annotation."""

    created: int = 0
    scheduled: int = 0
    """Of those, bound to a node (`spec.nodeName`)."""


@dataclass(frozen=True)
class QueuedView:
    """What a round read about queued provisioning."""

    requests: tuple[QueuedRequest, ...]
    templates: frozenset[str]
    """Names of our PodTemplates."""
    consumers: Mapping[str, Consumers]
    """By request name."""
    bound: Mapping[str, str]
    """By queued group: the request its template's consume annotation names."""
    group_index: Mapping[str, int]
    """Each queued group's index in `workerGroupSpecs`."""
    hosts: Mapping[str, int]
    """Hosts per slice of each queued group."""
    now_s: float = 0.0
    excess_since: Mapping[str, float] = field(default_factory=dict)
    """Requests in excess of the plan at the last rounds, since when (a round's memory;
    lost, the grace starts again)."""

    def slices(self, request: QueuedRequest) -> int:
        """The slices `request` asks for (0 if its hosts make no whole number of the
        group's slices now: it then serves no launch)."""
        per_slice = self.hosts.get(request.group, 0)
        if per_slice <= 0 or request.hosts % per_slice:
            return 0
        return request.hosts // per_slice


@dataclass(frozen=True)
class QueuedSteps:
    """The round's writes besides the plan's own patch."""

    bind: Mapping[str, str] = field(default_factory=dict)
    """Group -> the provisioned request its next replicas consume (replicas + the
    request's slices)."""
    create: tuple[tuple[str, str, int], ...] = ()
    """(group, request name, slices) to create, PodTemplate first."""
    delete_requests: tuple[str, ...] = ()
    delete_templates: tuple[str, ...] = ()
    signals: tuple[CapacitySignal, ...] = ()
    """One per request that ended this round or before (deleted now)."""
    excess_since: Mapping[str, float] = field(default_factory=dict)
    """Requests in excess and kept for their grace, since when."""


def decide(
    view: QueuedView, plan: Plan, name_for: Callable[[str, int], str] = lambda g, i: f"{g}-{i}"
) -> QueuedSteps:
    """The steps for every queued group; `name_for(group, i)` names the i-th request
    created this round (the caller makes names unique over time)."""
    bind: dict[str, str] = {}
    create: list[tuple[str, str, int]] = []
    delete: list[str] = []
    excess_since: dict[str, float] = {}
    signals = []
    for request in view.requests:
        if request.ended is not None:
            _, message, at_s = request.ended
            assert request.problem is not None
            source = f"ProvisioningRequest {request.name}"
            signals.append(CapacitySignal(request.group, request.problem, at_s, message, source))
            delete.append(request.name)
    for group in sorted(view.group_index):
        live = [r for r in view.requests if r.group == group and r.ended is None]
        current = view.bound.get(group)
        in_flight = False
        waiting: list[QueuedRequest] = []
        for request in live:
            consumers = view.consumers.get(request.name, Consumers())
            if consumers.created and consumers.scheduled >= request.hosts:
                delete.append(request.name)  # served: its pods hold its nodes
            elif request.name == current:
                in_flight = in_flight or consumers.created < request.hosts
            elif consumers.created:
                continue  # bound before: its pods are still being scheduled
            else:
                waiting.append(request)
        kept, excess, missing = _matched(view, waiting, _wanted_slices(plan, group))
        granted = [r for r in kept if r.provisioned]
        if granted and not in_flight:
            bind[group] = granted[0].name
        for request in excess:
            since = view.excess_since.get(request.name, view.now_s)
            if view.now_s - since >= EXCESS_GRACE_S:
                delete.append(request.name)
            else:
                excess_since[request.name] = since
        create += [(group, name_for(group, len(create) + i), n) for i, n in enumerate(missing)]
    orphans = sorted(view.templates - {r.name for r in view.requests})
    return QueuedSteps(
        bind=bind,
        create=tuple(create),
        delete_requests=tuple(delete),
        delete_templates=tuple(sorted(set(delete) & view.templates)) + tuple(orphans),
        signals=tuple(signals),
        excess_since=excess_since,
    )


def _wanted_slices(plan: Plan, group: str) -> list[int]:
    """The requests `plan`'s launches of `group` want, by slices, largest first: one
    per gang, one per other slice."""
    wanted: list[int] = []
    for launch in plan.launch:
        if launch.group == group:
            gangs = [int(g) for g in launch.gangs]
            wanted += gangs + [1] * (launch.replicas - sum(gangs))
    return sorted(wanted, reverse=True)


def _matched(
    view: QueuedView, waiting: list[QueuedRequest], wanted: list[int]
) -> tuple[list[QueuedRequest], list[QueuedRequest], list[int]]:
    """Waiting requests matched to the wanted sizes in `_queue_position` order: those
    kept (in that order), those in excess, and the sizes no request has yet."""
    pool = sorted(waiting, key=_queue_position)
    kept: list[QueuedRequest] = []
    missing: list[int] = []
    for size in wanted:
        found = next((r for r in pool if view.slices(r) == size), None)
        if found is None:
            missing.append(size)
        else:
            pool.remove(found)
            kept.append(found)
    kept.sort(key=_queue_position)
    return kept, pool, missing


def _queue_position(request: QueuedRequest) -> tuple[bool, float, str]:
    """Provisioned first (their capacity is held), then by place in GKE's queue."""
    return (not request.provisioned, request.created_s, request.name)


def launches_carried(plan: Plan, view: QueuedView, steps: QueuedSteps) -> Plan:
    """`plan` as the RayCluster patch carries it: a queued group's launches replaced
    by its binding (the bound request's slices, one gang if several; or none)."""
    queued = set(view.group_index)
    launch = [kept for kept in plan.launch if kept.group not in queued]
    by_name = {r.name: r for r in view.requests}
    for group, name in sorted(steps.bind.items()):
        slices = Replicas(view.slices(by_name[name]))
        gangs = (slices,) if slices > 1 else ()
        reason = "provisioning request granted" + (f" for {slices} slices" if gangs else "")
        launch.append(Launch(group, slices, reason, gangs))
    return replace(plan, launch=tuple(launch))


def binding_operations(view: QueuedView, steps: QueuedSteps) -> JsonPatch:
    """Set each bound group's template consume annotations to its request."""
    operations: JsonPatch = []
    for group, name in sorted(steps.bind.items()):
        path = f"/spec/workerGroupSpecs/{view.group_index[group]}/template/metadata/annotations"
        for key, value in ((CONSUME_ANNOTATION, name), (CLASS_ANNOTATION, QUEUED_CLASS)):
            operations.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
    return operations


def _escape(key: str) -> str:
    """A JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
