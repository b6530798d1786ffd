"""GKE under the simulated cluster: a slice's VMs come up together after a delay, or
later while the shape is stocked out or its capacity is taken; its pods are bound then
and turn Running one by one, each raylet starting a few seconds after its pod runs;
a host fails, and with it its pod."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.sim.ray import SimRay

RAYLET_START_S = 4.0
"""From a pod Running to its raylet registered."""


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
        self.provisioned: dict[str, set[str]] = defaultdict(set)

    def slice_created(self, group: str, pods: list[str]) -> None:
        """KubeRay created a slice's pods: its VMs come up after the provisioning delay."""
        self.events.after(
            self.provisioning_delay(self.events), lambda: self._provision(group, pods)
        )

    def stockout(self, group: str, until_s: float) -> None:
        self.stockout_until[group] = until_s

    def set_capacity(self, group: str, slices: int | None) -> None:
        """GKE can hold `slices` slices of `group` from now on (None: unlimited); slices
        waiting for room try again within 30 s, as they always do."""
        if slices is None:
            self.capacity.pop(group, None)
        else:
            self.capacity[group] = slices

    def host_failure(self, group: str) -> None:
        """A running host of `group`, picked at random, fails: its raylet and its pod."""
        running = sorted(
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if p["status"]["phase"] == "Running"
        )
        if running:
            victim = self.events.random.choice(running)
            self.ray.remove_node(victim)
            self.store.set_pod_phase(self.namespace, victim, "Failed")

    def _provision(self, group: str, pods: list[str]) -> None:
        """A slice's VMs come up together, or not at all while the shape is stocked
        out; its pods are bound then and turn Running one by one (image pull, init
        containers), each raylet starting a few seconds after its pod runs."""
        if self.stockout_until.get(group, 0.0) > self.events.now_s:
            self.events.at(self.stockout_until[group], lambda: self._provision(group, pods))
            return
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["metadata"].get("deletionTimestamp") for p in stored):
            return  # deleted while it waited
        held = self.provisioned[group]
        held &= {
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if not p["metadata"].get("deletionTimestamp")
        }
        limit = self.capacity.get(group)
        if limit is not None and len(held) // len(pods) >= limit:
            self.events.after(30.0, lambda: self._provision(group, pods))
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
