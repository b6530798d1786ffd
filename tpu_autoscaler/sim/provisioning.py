"""GKE under the simulated cluster: a slice's VMs come up together after a delay, or
later while the shape is stocked out, over quota or its capacity is taken (each failed
attempt told as GKE's cluster-autoscaler tells it, a FailedScaleUp Event on each of the
slice's pods); its pods are bound then and turn Running one by one, each raylet
starting a few seconds after its pod runs; a host fails, or its spot VM is preempted
(the kubelet fails its pod as a node shutdown does), and with it its pod."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpu_autoscaler.adapters.kube.provreq_objects import CONSUME_ANNOTATION
from tpu_autoscaler.controlplane import gke, gke_events
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.ray import SimRay

RAYLET_START_S = 4.0
"""From a pod Running to its raylet registered."""
NODES_READY_S = 2.0
"""From a pod created to bound, on nodes a granted ProvisioningRequest holds."""
SCALE_UP_RETRY_S = 300.0
"""How long cluster-autoscaler waits after a failed scale-up before it tries (and
fails, and says so) again: its first backoff (`InitialNodeGroupBackoffDuration`),
which upstream doubles up to 30 minutes; kept at the first here."""
CAPACITY_RETRY_S = 30.0
"""How soon a slice beyond a group's `capacity` is tried again."""


@dataclass(frozen=True, eq=False)
class LingeringSlice:
    """A slice's VMs kept after its pods went, until `until_s` (cluster-autoscaler's
    scale-down delay): billed, and taken by the next slice of its group and size."""

    group: str
    hosts: int
    until_s: float


def default_provisioning_delay(events: EventQueue) -> float:
    """Seconds from pods created to a slice's VMs up: 60-180 s, uniform."""
    return events.random.uniform(60.0, 180.0)


class GkeProvisioning:
    """Slices' VMs and their pods' lifecycle up to a registered raylet, for the pods of
    `namespace` in `store`; `ray_seen` collects the pods whose raylet registered."""

    def __init__(
        self,
        events: EventQueue,
        store: ObjectStore,
        namespace: str,
        shapes: Mapping[str, SliceShape],
        ray: SimRay,
        world: WorldModel,
        ray_seen: set[str],
        provisioning_delay: Callable[[EventQueue], float] = default_provisioning_delay,
        capacity: Mapping[str, int] | None = None,
        raylet_started: Callable[[str], None] | None = None,
        scale_down_delay_s: float = 0.0,
    ) -> None:
        """`capacity`: how many slices of a group GKE can hold at once (unlimited if
        absent); a slice beyond it waits, as under a stockout. `raylet_started`: told
        each pod whose raylet registered. `scale_down_delay_s`: how long a slice's
        VMs stay once its pods are gone, if none of them failed or was reclaimed
        (GKE replaces a multi-host slice's VMs whole); a slice of the group and size
        created meanwhile is bound to them at once, whatever the stockouts, quota or
        capacity."""
        self.events = events
        self.store = store
        self.namespace = namespace
        self.shapes = shapes
        self.ray = ray
        self.world = world
        self.ray_seen = ray_seen
        self.raylet_started = raylet_started
        self.provisioning_delay = provisioning_delay
        self.capacity = dict(capacity or {})
        self.stockout_until: dict[str, float] = {}
        self.quota_until: dict[str, float] = {}
        """Until when a group's slices cannot be had for want of capacity, or of quota."""
        self.provisioned: dict[str, set[str]] = defaultdict(set)
        self.queued = {g for g, s in shapes.items() if s.scarcity.queued_provisioning}
        """Groups whose node pools grow only through ProvisioningRequests (queued
        provisioning): a pod of theirs is placed only on the nodes of the request it
        consumes."""
        self.reservations: dict[str, tuple[str, int]] = {}
        """Granted requests not wholly consumed yet (request -> group and the slices
        it still holds): capacity held."""
        self.consumed: dict[str, list[str]] = {}
        """Requests whose pods took their nodes: request -> pods."""
        self.vms_up: set[str] = set()
        """Pods whose VM is up and billed: from bound to their node until GCE reclaims
        it (a spot preemption, a request's capacity taken back) or the pod is gone
        (then its slice's VMs may be kept a while: `lingering`). A failed host's VM
        stays billed until its pod goes. Each change comes with a write of its pod,
        which is how the sampler hears of it."""
        self.scale_down_delay_s = scale_down_delay_s
        self.lingering: list[LingeringSlice] = []
        """Slices' VMs kept after their pods went, oldest first."""
        self._slice_of: dict[str, tuple[str, ...]] = {}
        """Each pod bound to a VM, until no VM of its slice is up: the pods its slice's
        VMs were brought up for."""
        self._vms_lost: set[str] = set()
        """Pods whose VM failed or was reclaimed: their slice's VMs are not kept."""
        store.watchers.append(self._on_store_change)

    def slice_created(self, group: str, pods: list[str]) -> None:
        """KubeRay created a slice's pods: its VMs come up after the provisioning delay
        or, in a queued group, at once on the nodes of the granted request the pods
        consume (never, without one: they stay Pending)."""
        kept = self._lingering_slice(group, len(pods))
        if kept is not None:
            self.lingering.remove(kept)
            self.provisioned[group].update(pods)
            self.events.after(NODES_READY_S, lambda: self._bind(group, pods))
            return
        if group in self.queued:
            request = self._consumed_request(pods)
            held_group, held = self.reservations.get(request or "", ("", 0))
            if request is not None and held_group == group:
                if held > 1:
                    self.reservations[request] = (group, held - 1)
                else:
                    del self.reservations[request]
                self.consumed.setdefault(request, []).extend(pods)
                self.provisioned[group].update(pods)
                self.events.after(NODES_READY_S, lambda: self._bind(group, pods))
            return
        self.events.after(
            self.provisioning_delay(self.events), lambda: self._provision(group, pods)
        )

    # --- capacity for ProvisioningRequests (`controlplane/provreq_lifecycle.py`) ----------

    def try_reserve(self, group: str, request: str, hosts: int) -> bool:
        """Hold the slices of `group` that `hosts` pods fill for `request` if GKE has
        them all now: all or none."""
        if self._refused_until(group)[0] > self.events.now_s:
            return False
        slices = -(-hosts // int(self.shapes[group].hosts_per_replica))
        limit = self.capacity.get(group)
        reserved = sum(n for g, n in self.reservations.values() if g == group)
        if limit is not None and self._held_slices(group) + reserved + slices > limit:
            return False
        self.reservations[request] = (group, slices)
        return True

    def reserved(self, request: str) -> bool:
        return request in self.reservations

    def release(self, request: str) -> None:
        self.reservations.pop(request, None)

    def revoke(self, request: str) -> None:
        """The request's capacity is taken back: its reservation, or the nodes its pods
        run on (the pods fail)."""
        self.release(request)
        for pod in self.consumed.pop(request, []):
            stored = self.store.pod(self.namespace, pod)
            if stored is not None and not stored["metadata"].get("deletionTimestamp"):
                self._vm_lost(pod)
                self.vms_up.discard(pod)
                self.ray.remove_node(pod)
                self.store.set_pod_phase(self.namespace, pod, "Failed")

    def _on_store_change(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A pod gone from the store takes its VM with it, or, once the last of its
        slice's pods is gone, leaves its slice's VMs for the scale-down delay."""
        if kind != "Pod":
            return
        name = obj["metadata"]["name"]
        slice_pods = self._slice_of.get(name)
        if slice_pods is None or self.store.pod(self.namespace, name) is not None:
            return
        self.vms_up.discard(name)
        if any(pod in self.vms_up for pod in slice_pods):
            return
        for pod in slice_pods:
            self._slice_of.pop(pod, None)
        lost = not self._vms_lost.isdisjoint(slice_pods)
        self._vms_lost.difference_update(slice_pods)
        group = obj["metadata"].get("labels", {}).get(labels.KUBERAY_GROUP, "")
        if lost or self.scale_down_delay_s <= 0 or group in self.queued:
            return
        kept = LingeringSlice(group, len(slice_pods), self.events.now_s + self.scale_down_delay_s)
        self.lingering.append(kept)
        self.events.at(kept.until_s, lambda: self._scaled_down(kept))

    def _scaled_down(self, kept: LingeringSlice) -> None:
        if kept in self.lingering:
            self.lingering.remove(kept)

    def _lingering_slice(self, group: str, hosts: int) -> LingeringSlice | None:
        return next((k for k in self.lingering if (k.group, k.hosts) == (group, hosts)), None)

    def _vm_lost(self, pod: str) -> None:
        """The VM under `pod` failed or was reclaimed: its slice's VMs are not kept."""
        if pod in self._slice_of:
            self._vms_lost.add(pod)

    def _consumed_request(self, pods: list[str]) -> str | None:
        stored = self.store.pod(self.namespace, pods[0]) if pods else None
        annotations = (stored or {}).get("metadata", {}).get("annotations") or {}
        name = annotations.get(CONSUME_ANNOTATION)
        return str(name) if name else None

    def _held_slices(self, group: str) -> int:
        held = self.provisioned[group]
        held &= {
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if not p["metadata"].get("deletionTimestamp")
        }
        return len(held) // int(self.shapes[group].hosts_per_replica)

    def stockout(self, group: str, until_s: float) -> None:
        self.stockout_until[group] = until_s

    def set_capacity(self, group: str, slices: int | None) -> None:
        """GKE can hold `slices` slices of `group` from now on (None: unlimited); slices
        waiting for room try again within 30 s, as they always do."""
        if slices is None:
            self.capacity.pop(group, None)
        else:
            self.capacity[group] = slices

    def quota(self, group: str, until_s: float) -> None:
        self.quota_until[group] = until_s

    def _refused_until(self, group: str) -> tuple[float, str]:
        """Until when GKE refuses `group` new slices, and why: "stockout" or "quota"."""
        return max(
            (self.stockout_until.get(group, 0.0), "stockout"),
            (self.quota_until.get(group, 0.0), "quota"),
        )

    def host_failure(self, group: str) -> None:
        """A running host of `group`, picked at random, fails: its raylet and its pod."""
        victim = self._running_host(group)
        if victim is not None:
            self._vm_lost(victim)
            self.ray.remove_node(victim, gke_events.FAILED_DEATH_REASON)
            self.store.set_pod_phase(self.namespace, victim, "Failed")

    def preemption_storm(self, group: str, until_s: float, mean_interval_s: float) -> None:
        """Running hosts of `group` are preempted until `until_s`, one at a time, at
        exponentially distributed intervals of `mean_interval_s` on average."""
        at_s = self.events.now_s + self.events.random.expovariate(1.0 / mean_interval_s)
        if at_s < until_s:
            self.events.at(at_s, lambda: self._preempt(group, until_s, mean_interval_s))

    def _preempt(self, group: str, until_s: float, mean_interval_s: float) -> None:
        """A spot VM reclaimed: its raylet dies for preemption and the kubelet's
        graceful node shutdown fails its pod (KubeRay then replaces the slice whole)."""
        victim = self._running_host(group)
        if victim is not None:
            self._reclaim(victim)
        self.preemption_storm(group, until_s, mean_interval_s)

    def _reclaim(self, pod: str) -> None:
        """GCE reclaims the spot VM under `pod`: its raylet dies for preemption and
        the kubelet's graceful node shutdown fails the pod."""
        self._vm_lost(pod)
        self.vms_up.discard(pod)
        self.ray.remove_node(
            pod, gke_events.PREEMPTED_DEATH_REASON, gke_events.PREEMPTED_DEATH_MESSAGE
        )
        self.store.set_pod_phase(
            self.namespace,
            pod,
            "Failed",
            gke_events.NODE_SHUTDOWN_REASON,
            gke_events.NODE_SHUTDOWN_MESSAGE,
        )

    def _running_host(self, group: str) -> str | None:
        running = sorted(
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if p["status"]["phase"] == "Running"
        )
        return self.events.random.choice(running) if running else None

    def _scale_up_failed(self, pods: list[str], reason: str) -> None:
        """GKE's cluster-autoscaler could not add the slice's VMs: a FailedScaleUp
        Event on each of its pods (a repeat counts on the first)."""
        message = gke_events.failed_scale_up_message(reason)
        for name in pods:
            pod = self.store.pod(self.namespace, name)
            if pod is not None:
                event = gke_events.failed_scale_up(pod, message, self.events.now_s)
                self.store.record_event(self.namespace, event)

    def preempt_slice(self, group: str) -> list[str]:
        """A running slice of `group`, picked at random, is preempted: all its hosts'
        raylets and pods go at once (GCE reclaims a spot slice whole). Returns its pods."""
        slices: dict[str, list[str]] = defaultdict(list)
        for pod in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group}):
            if pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp"):
                meta = pod["metadata"]
                replica = meta["labels"].get(labels.KUBERAY_REPLICA_NAME, meta["name"])
                slices[replica].append(meta["name"])
        if not slices:
            return []
        victims = sorted(slices[self.events.random.choice(sorted(slices))])
        for name in victims:
            self._reclaim(name)
        return victims

    def _provision(self, group: str, pods: list[str]) -> None:
        """A slice's VMs come up together, or not at all while the shape is stocked
        out; its pods are bound then and turn Running one by one (image pull, init
        containers), each raylet starting a few seconds after its pod runs."""
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["metadata"].get("deletionTimestamp") for p in stored):
            return  # deleted while it waited
        until_s, short = self._refused_until(group)
        if until_s > self.events.now_s:
            self._scale_up_failed(pods, gke_events.SCALE_UP_REASONS[short])
            retry_s = min(until_s, self.events.now_s + SCALE_UP_RETRY_S)
            self.events.at(retry_s, lambda: self._provision(group, pods))
            return
        limit = self.capacity.get(group)
        if limit is not None and self._held_slices(group) >= limit:
            self._scale_up_failed(pods, gke_events.SCALE_UP_REASONS["stockout"])
            self.events.after(CAPACITY_RETRY_S, lambda: self._provision(group, pods))
            return
        self.provisioned[group].update(pods)
        self._bind(group, pods)

    def _bind(self, group: str, pods: list[str]) -> None:
        slice_pods = tuple(pods)
        for index, pod in enumerate(pods):
            stored = self.store.pod(self.namespace, pod)
            if stored is None or stored["metadata"].get("deletionTimestamp"):
                continue
            self.store.bind_pod(self.namespace, pod, f"gke-{pod}-node-{index}")
            self.vms_up.add(pod)
            self._slice_of[pod] = slice_pods
            stagger_s = self.events.random.uniform(0.0, self.world.running_stagger_s)
            self.events.after(stagger_s, self._runner(group, pod))

    def _runner(self, group: str, pod: str) -> Callable[[], None]:
        return lambda: self._pod_running(group, pod)

    def _pod_running(self, group: str, pod: str) -> None:
        stored = self.store.pod(self.namespace, pod)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return
        self.store.set_pod_phase(self.namespace, pod, "Running")
        self.events.after(RAYLET_START_S, lambda: self._start_raylets(group, [pod]))

    def _start_raylets(self, group: str, pods: list[str]) -> None:
        for pod_name in pods:
            pod = self.store.pod(self.namespace, pod_name)
            if (
                pod is None
                or pod["status"]["phase"] != "Running"
                or pod["metadata"].get("deletionTimestamp")
            ):
                continue
            # Ray reads its TPU identity from the process's environment: the webhook's
            # variables in the pod and, on a TPU node, the device plugin's beneath them.
            try:
                env = gke.container_environment(pod)
            except gke.DevicePluginError:
                # The kubelet fails a pod whose devices cannot be allocated.
                self.store.set_pod_phase(self.namespace, pod_name, "Failed")
                continue
            host = int(
                env.get(
                    labels.ENV_TPU_WORKER_ID,
                    pod["metadata"]["labels"].get(labels.KUBERAY_HOST_INDEX, "0"),
                )
            )
            self.ray.add_node(pod, self.shapes[group], host, env)
            self.ray_seen.add(pod_name)
            if self.raylet_started is not None:
                self.raylet_started(pod_name)
