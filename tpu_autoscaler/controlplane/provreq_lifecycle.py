"""GKE's handling of `queued-provisioning.gke.io` ProvisioningRequests in the
simulated control plane, as cluster-autoscaler's API (`types.go`, FAQ
"ProvisioningRequest") and GKE's flex-start documentation describe it:

- `Accepted=True` shortly after the request is created;
- `Provisioned=True` after the queueing delay, once capacity exists for all of it at
  once (the capacity is then held for it); retried while it does not;
- `Failed=True` if it could not be provisioned within `fail_after_s`;
- `BookingExpired=True` if no pod consumed it within `booking_s` (10 minutes) of
  being provisioned, the capacity released;
- `CapacityRevoked=True` when the capacity is taken back (`revoke`, a fault).

The capacity itself, whole slices of a group, is GKE's (`sim/provisioning.py`,
`CapacityBroker`); the group of a request is the `ray.io/group` label of the
PodTemplate it refers to. Condition reasons and messages are this model's own words,
not GKE's (which it does not document)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.provreq_store import ProvisioningObjects
from tpu_autoscaler.core import labels


class CapacityBroker(Protocol):
    def try_reserve(self, group: str, request: str) -> bool: ...

    def reserved(self, request: str) -> bool: ...

    def release(self, request: str) -> None: ...

    def revoke(self, request: str) -> None: ...


def default_queue_delay(events: EventQueue) -> float:
    """Seconds from a request accepted to its first try for capacity: 60-180 s."""
    return events.random.uniform(60.0, 180.0)


@dataclass(frozen=True)
class QueueTimings:
    accept_s: float = 2.0
    queue_delay: Callable[[EventQueue], float] = field(default=default_queue_delay)
    retry_s: float = 30.0
    """Between tries for capacity while there is none."""
    fail_after_s: float = 1800.0
    booking_s: float = 600.0


class ProvisioningRequestController:
    """Drives every ProvisioningRequest of `objects` in `namespace` through its life."""

    def __init__(
        self,
        events: EventQueue,
        objects: ProvisioningObjects,
        namespace: str,
        capacity: CapacityBroker,
        timings: QueueTimings | None = None,
    ) -> None:
        self.events = events
        self.objects = objects
        self.namespace = namespace
        self.capacity = capacity
        self.timings = timings or QueueTimings()
        self.created_s: dict[str, float] = {}
        self.provisioned: list[str] = []
        """Requests granted, in order."""
        objects.watchers.append(self.on_change)

    def on_change(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "ProvisioningRequest":
            return
        name = obj["metadata"]["name"]
        if obj["metadata"].get("deletionTimestamp"):
            self.capacity.release(name)  # cancelled: the capacity it held is free
        elif name not in self.created_s:
            self.created_s[name] = self.events.now_s
            self.events.after(self.timings.accept_s, lambda: self._accept(name))
            delay_s = self.timings.queue_delay(self.events)
            self.events.after(delay_s, lambda: self._attempt(name))

    def revoke(self, name: str) -> None:
        """GKE takes a granted request's capacity back."""
        if self._set(name, "CapacityRevoked", "CapacityRevoked", "capacity was revoked"):
            self.capacity.revoke(name)

    def _accept(self, name: str) -> None:
        self._set(name, "Accepted", "Accepted", "queued for capacity")

    def _attempt(self, name: str) -> None:
        request = self.objects.request(self.namespace, name)
        if request is None or _settled(request):
            return
        if self.events.now_s - self.created_s[name] >= self.timings.fail_after_s:
            waited = f"{self.timings.fail_after_s:.0f}s"
            self._set(name, "Failed", "ResourcePoolExhausted", f"no capacity within {waited}")
            return
        group = self._group(request)
        if group is not None and self.capacity.try_reserve(group, name):
            self._set(name, "Provisioned", "Provisioned", "capacity provisioned for all pods")
            self.provisioned.append(name)
            self.events.after(self.timings.booking_s, lambda: self._expire(name))
        else:
            self.events.after(self.timings.retry_s, lambda: self._attempt(name))

    def _expire(self, name: str) -> None:
        if self.capacity.reserved(name):
            message = f"not consumed within {self.timings.booking_s:.0f}s"
            if self._set(name, "BookingExpired", "BookingExpired", message):
                self.capacity.release(name)

    def _group(self, request: dict[str, Any]) -> str | None:
        pod_sets = request["spec"]["podSets"]
        template = self.objects.template(self.namespace, pod_sets[0]["podTemplateRef"]["name"])
        if template is None:
            return None
        meta = (template.get("template") or {}).get("metadata") or {}
        group = (meta.get("labels") or {}).get(labels.KUBERAY_GROUP)
        return str(group) if group else None

    def _set(self, name: str, kind: str, reason: str, message: str) -> bool:
        """Set condition `kind` True (others kept); False if the request is gone."""
        request = self.objects.request(self.namespace, name)
        if request is None:
            return False
        conditions = [
            c for c in (request.get("status") or {}).get("conditions") or [] if c["type"] != kind
        ]
        conditions.append(
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                # metav1.Time: whole seconds on the wire.
                "lastTransitionTime": rfc3339(float(int(self.events.now_s))).replace(
                    ".000000Z", "Z"
                ),
            }
        )
        self.objects.replace_request_status(self.namespace, name, {"conditions": conditions})
        return True


def _settled(request: dict[str, Any]) -> bool:
    ends = {"Failed", "BookingExpired", "CapacityRevoked", "Provisioned"}
    return any(
        c["type"] in ends and c["status"] == "True"
        for c in (request.get("status") or {}).get("conditions") or []
    )
