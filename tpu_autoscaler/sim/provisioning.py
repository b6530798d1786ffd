"""GKE under the simulated cluster: a slice's VMs come up together after a delay, or
later while the shape is stocked out, over quota or its capacity is taken (each failed
attempt told as GKE's cluster-autoscaler tells it, a FailedScaleUp Event on each of the
slice's pods); its pods are bound then and turn Running one by one, each raylet
starting a few seconds after its pod runs; a host fails, or its spot VM is preempted
(the kubelet fails its pod as a node shutdown does), and with it its pod."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from tpu_autoscaler.controlplane import gke, gke_events
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.ray import SimRay

RAYLET_START_S = 4.0
"""From a pod Running to its raylet registered."""
SCALE_UP_RETRY_S = 300.0
"""How long cluster-autoscaler waits after a failed scale-up before it tries (and
fails, and says so) again: its first backoff (`InitialNodeGroupBackoffDuration`),
which upstream doubles up to 30 minutes; kept at the first here."""
CAPACITY_RETRY_S = 30.0
"""How soon a slice beyond a group's `capacity` is tried again."""


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
    ) -> None:
        """`capacity`: how many slices of a group GKE can hold at once (unlimited if
        absent); a slice beyond it waits, as under a stockout."""
        self.events = events
        self.store = store
        self.namespace = namespace
        self.shapes = shapes
        self.ray = ray
        self.world = world
        self.ray_seen = ray_seen
        self.provisioning_delay = provisioning_delay
        self.capacity = dict(capacity or {})
        self.stockout_until: dict[str, float] = {}
        self.quota_until: dict[str, float] = {}
        """Until when a group's slices cannot be had for want of capacity, or of quota."""
        self.provisioned: dict[str, set[str]] = defaultdict(set)

    def slice_created(self, group: str, pods: list[str]) -> None:
        """KubeRay created a slice's pods: its VMs come up after the provisioning delay."""
        self.events.after(
            self.provisioning_delay(self.events), lambda: self._provision(group, pods)
        )

    def stockout(self, group: str, until_s: float) -> None:
        self.stockout_until[group] = until_s

    def quota(self, group: str, until_s: float) -> None:
        self.quota_until[group] = until_s

    def host_failure(self, group: str) -> None:
        """A running host of `group`, picked at random, fails: its raylet and its pod."""
        victim = self._running_host(group)
        if victim is not None:
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
            self.ray.remove_node(
                victim, gke_events.PREEMPTED_DEATH_REASON, gke_events.PREEMPTED_DEATH_MESSAGE
            )
            self.store.set_pod_phase(
                self.namespace,
                victim,
                "Failed",
                gke_events.NODE_SHUTDOWN_REASON,
                gke_events.NODE_SHUTDOWN_MESSAGE,
            )
        self.preemption_storm(group, until_s, mean_interval_s)

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

    def _provision(self, group: str, pods: list[str]) -> None:
        """A slice's VMs come up together, or not at all while the shape is stocked
        out; its pods are bound then and turn Running one by one (image pull, init
        containers), each raylet starting a few seconds after its pod runs."""
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["metadata"].get("deletionTimestamp") for p in stored):
            return  # deleted while it waited
        until_s, short = max(
            (self.stockout_until.get(group, 0.0), "stockout"),
            (self.quota_until.get(group, 0.0), "quota"),
        )
        if until_s > self.events.now_s:
            self._scale_up_failed(pods, gke_events.SCALE_UP_REASONS[short])
            retry_s = min(until_s, self.events.now_s + SCALE_UP_RETRY_S)
            self.events.at(retry_s, lambda: self._provision(group, pods))
            return
        held = self.provisioned[group]
        held &= {
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if not p["metadata"].get("deletionTimestamp")
        }
        limit = self.capacity.get(group)
        if limit is not None and len(held) // len(pods) >= limit:
            self._scale_up_failed(pods, gke_events.SCALE_UP_REASONS["stockout"])
            self.events.after(CAPACITY_RETRY_S, lambda: self._provision(group, pods))
            return
        held.update(pods)
        for index, pod in enumerate(pods):
            self.store.bind_pod(self.namespace, pod, f"gke-{pod}-node-{index}")
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
            self.ray.add_node(pod, self.shapes[group], host)
            self.ray_seen.add(pod_name)
