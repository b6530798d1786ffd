"""A whole simulated TPU cluster on a virtual clock: the Kubernetes object store,
the KubeRay operator, GKE provisioning (delays, stockouts, host failures), Ray, a
workload, and an autoscaler (ours, or Ray 2.60's with KubeRay's arithmetic) that
reads the cluster through the production adapters and writes it by JSON patch."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Literal

from tpu_autoscaler.adapters.kube.pods import timestamp_s
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane import gke
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import REALISTIC, WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import GangStrategy
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import PolicyConfig
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.resources import head_resources
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell.controller import Autoscaler, decide_by_slices
from tpu_autoscaler.sim.metrics import Metrics, Timeline
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Bundle, Work
from tpu_autoscaler.sim.remote import AutoscalerApi, SimGcs, Wire
from tpu_autoscaler.sim.slice_pg import SlicePlacementGroupRun
from tpu_autoscaler.sim.workload import WorkItem, Workload

Policy = Literal["slice", "ray"]
AUTOSCALER_PERIOD_S = 5.0
SAMPLE_PERIOD_S = 5.0
RAYLET_START_S = 4.0
LIVENESS_FAILURE_S = 600.0
"""KubeRay's default liveness probe: every 5 s, 120 failures allowed."""


def default_provisioning_delay(events: EventQueue) -> float:
    """Seconds from pods created to a slice's VMs up: 60-180 s, uniform."""
    return events.random.uniform(60.0, 180.0)


def _ray_plan(loaded: LoadedSnapshot) -> Plan:
    """Ray 2.60's own decision, imported only when asked for (it loads Ray's autoscaler)."""
    from tpu_autoscaler.adapters.ray.baseline import ray_plan

    return ray_plan(loaded)


class SimulatedCluster:
    def __init__(
        self,
        raycluster: Mapping[str, Any],
        policy: Policy = "slice",
        seed: int = 0,
        multi_host_indexing: bool = True,
        provisioning_delay: Callable[[EventQueue], float] = default_provisioning_delay,
        policy_config: PolicyConfig | None = None,
        capacity: Mapping[str, int] | None = None,
        world: WorldModel = REALISTIC,
    ) -> None:
        """`capacity`: how many slices of a group GKE can hold at once (unlimited if
        absent); a slice beyond it waits, as under a stockout. `world`: how
        unforgiving Kubernetes, KubeRay and GKE are (`controlplane/world.py`)."""
        self.events = EventQueue(seed)
        self.world = world
        self.seed = seed
        self.policy = policy
        self.policy_config = policy_config or PolicyConfig()
        self.store = ObjectStore(self.events)
        created = self.store.create_raycluster(raycluster)
        self.namespace = created["metadata"]["namespace"]
        self.name = created["metadata"]["name"]
        shapes = derive_shapes(parse_raycluster(created, "simulator"))
        self.shapes: dict[str, SliceShape] = {s.group: s for s in shapes.shapes}
        self.metrics = Metrics()
        self.timeline = Timeline()
        self.ray = SimRay(lambda: self.events.now_s, self.events.after, self.events.random)
        # KubeRay's head pod, `<cluster>-head-<5 random chars>`; its raylet is up first.
        self.head_pod = f"{self.name}-head-{hashlib.sha1(self.name.encode()).hexdigest()[:5]}"
        self.ray.add_head(self.head_pod, head_resources(parse_raycluster(created, "simulator")))
        self.operator = KubeRayOperator(
            self.store,
            self.events,
            self.namespace,
            self.name,
            multi_host_indexing,
            on_replica_created=self._replica_created,
            on_pods_deleted=self._pods_deleted,
            world=world,
        )
        self.provisioning_delay = provisioning_delay
        self.stockout_until: dict[str, float] = {}
        self.capacity = dict(capacity or {})
        self.provisioned: dict[str, set[str]] = defaultdict(set)
        self.removals: dict[str, list[float]] = defaultdict(list)
        self.last_plan: Plan | None = None
        self.ray_seen: set[str] = set()
        """Pods whose raylet has registered at some point."""
        self.violations: list[str] = []
        """Removals of hosts not yet idle for their timeout (the invariant tests check)."""
        wire = Wire(self.events)
        self.gcs = SimGcs(self.ray, self._raylet_drained, wire, world.gcs_call_latency_s)
        self.api = AutoscalerApi(self.store, wire, world.autoscaler_call_latency_s)
        self.autoscaler = Autoscaler(
            self.api,
            self.gcs,
            self.namespace,
            self.name,
            clock=lambda: self.events.now_s,
            config=self.policy_config,
            decide=decide_by_slices if policy == "slice" else _ray_plan,
            drain_before_removal=policy == "slice",
        )
        self.store.watchers.append(self.operator.on_store_change)
        self.operator.reconcile()
        if world.demand_report_period_s > 0:
            # Off the autoscaler's grid, as raylets and the autoscaler keep their own time.
            self.events.every(world.demand_report_period_s, self.ray.report_demand, first_s=0.37)
        self.events.every(AUTOSCALER_PERIOD_S, self.autoscale)
        self.events.every(SAMPLE_PERIOD_S, self._sample, first_s=0.0)

    # --- Kubernetes events ----------------------------------------------------------------

    def _replica_created(self, group: str, replica: str, pods: list[str]) -> None:
        self.metrics.slices_launched += 1
        shape = self.shapes[group]
        removed = self.removals.get(group, [])
        if removed and self.events.now_s - removed[-1] < shape.idle_timeout_s:
            self.metrics.scale_flaps += 1
        self.events.after(
            self.provisioning_delay(self.events), lambda: self._provision(group, pods)
        )

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

    def _raylet_drained(self, pod: str) -> None:
        """Ray 2.60 (measured): a raylet that accepts a drain exits at once or, if it
        has work, once that ends; `ray start --block` stays up, so the pod runs on with
        no Ray node until KubeRay's liveness probe fails it (about 600 s), and with
        `restartPolicy: Never` (autoscaler v2) KubeRay then deletes its replica."""
        node = self.ray.nodes.get(pod)
        if node is None:
            return
        if node.busy:
            node.exit_when_idle = True
            return
        now = self.events.now_s
        idle_s = now - (node.idle_since_s or now)
        retired = node.exit_when_idle  # its work ended: not an idle removal
        if not retired and idle_s < self.shapes[node.group].idle_timeout_s - 1e-6:
            self.violations.append(f"t={now:.0f}: {pod} drained after {idle_s:.0f}s idle")
        self.removals[node.group].append(now)
        self.ray.remove_node(pod)
        self.events.after(LIVENESS_FAILURE_S, lambda: self._liveness_failed(pod))

    def _liveness_failed(self, pod: str) -> None:
        stored = self.store.pod(self.namespace, pod)
        if stored is not None and pod not in self.ray.nodes:
            self.store.set_pod_phase(self.namespace, pod, "Failed")

    def _pods_deleted(self, pods: list[str], requested: bool) -> None:
        """Pods KubeRay is deleting: `requested` through workersToDelete (the
        autoscaler's decision), else because their replica was unhealthy or incomplete."""
        busy_replicas = set()
        now = self.events.now_s
        if requested and self._cancels_a_launch(pods):
            self.metrics.launches_cancelled += 1
            self.violations.append(f"t={now:.0f}: launch of {sorted(pods)} taken back")
        for pod in pods:
            node = self.ray.nodes.get(pod)
            if node is not None and requested:
                if node.busy:
                    busy_replicas.add(self._replica_of(pod))
                elif (
                    now - (node.idle_since_s or now) < self.shapes[node.group].idle_timeout_s - 1e-6
                ):
                    idle_s = now - (node.idle_since_s or now)
                    self.violations.append(f"t={now:.0f}: {pod} removed after {idle_s:.0f}s idle")
                self.removals[node.group].append(now)
            self.ray.remove_node(pod)
        self.metrics.busy_replicas_terminated += len(busy_replicas)

    def _cancels_a_launch(self, pods: list[str]) -> bool:
        stored = [self.store.pod(self.namespace, p) for p in pods]
        if any(p is None or p["status"]["phase"] == "Failed" for p in stored):
            return False
        if any(p in self.ray_seen for p in pods):
            return False
        created = [
            timestamp_s(p["metadata"].get("creationTimestamp")) or 0.0
            for p in stored
            if p is not None
        ]
        timeout_s = self.policy_config.provisioning_timeout_s
        return bool(created) and self.events.now_s - min(created) < timeout_s - 1e-6

    def _replica_of(self, pod: str) -> str:
        node = self.ray.nodes.get(pod) or self.ray.dead.get(pod)
        if node is not None and labels.RAY_TPU_SLICE_NAME in node.labels:
            return node.labels[labels.RAY_TPU_SLICE_NAME]
        return pod

    # --- faults ---------------------------------------------------------------------------

    def host_failure(self, group: str) -> None:
        running = sorted(
            p["metadata"]["name"]
            for p in self.store.list_pods(self.namespace, {labels.KUBERAY_GROUP: group})
            if p["status"]["phase"] == "Running"
        )
        if running:
            victim = self.events.random.choice(running)
            self.ray.remove_node(victim)
            self.store.set_pod_phase(self.namespace, victim, "Failed")

    def stockout(self, group: str, until_s: float) -> None:
        self.stockout_until[group] = until_s

    # --- the autoscaler -------------------------------------------------------------------

    def autoscale(self) -> None:
        outcome = self.autoscaler.step()
        self.metrics.decision_s.append(outcome.decision_s)
        self.metrics.conflicts += outcome.replans + outcome.rebases
        if not outcome.applied:
            self.metrics.rounds_failed += 1
            self.metrics.conflicts_unabsorbed += outcome.replans + outcome.rebases
        self.metrics.drains_refused += outcome.drains_refused
        self.last_plan = outcome.plan

    # --- workload --------------------------------------------------------------------------

    def submit(self, item: WorkItem) -> None:
        for copy_index in range(item.count):
            self._submit_one(item, copy_index)

    def _submit_one(self, item: WorkItem, copy_index: int) -> None:
        now = self.events.now_s
        ray = self.ray
        if item.task is not None or item.actor is not None:
            spec = item.task or item.actor
            assert spec is not None
            bundle = Bundle(dict(spec.resources), dict(spec.label_selector))
            ray.submit(Work(ray.new_id("task"), [bundle], item.duration, now))
        elif item.placement_group is not None:
            pg = item.placement_group
            selectors = pg.bundle_label_selector or [{}] * len(pg.bundles)
            bundles = [Bundle(dict(b), dict(s)) for b, s in zip(pg.bundles, selectors, strict=True)]
            ray.submit(
                Work(ray.new_id("pg"), bundles, item.duration, now, GangStrategy(pg.strategy))
            )
        elif item.slice_placement_group is not None:
            self._submit_slice_placement_group(item)

    def _submit_slice_placement_group(self, item: WorkItem) -> None:
        """Ray 2.60's `slice_placement_group`, heads one slice after another with a
        timeout each (`sim/slice_pg.py`)."""
        assert item.slice_placement_group is not None
        SlicePlacementGroupRun(
            self.ray,
            self.events.after,
            item.slice_placement_group,
            item.duration,
            self.events.now_s,
            on_timeout=self._reservation_failed,
        ).start()

    def _reservation_failed(self) -> None:
        self.metrics.reservations_failed += 1

    # --- running and measuring --------------------------------------------------------------

    def load(self, workload: Workload) -> None:
        for item in workload.items:
            self.events.at(item.at, self._submitter(item))
        for fault in workload.faults:
            if fault.host_failure is not None:
                self.events.at(fault.at, self._failer(fault.host_failure.group))
            elif fault.stockout is not None:
                self.events.at(fault.at, self._stocker(fault.stockout.group, fault.stockout.until))

    def _submitter(self, item: WorkItem) -> Callable[[], None]:
        return lambda: self.submit(item)

    def _failer(self, group: str) -> Callable[[], None]:
        return lambda: self.host_failure(group)

    def _stocker(self, group: str, until_s: float) -> Callable[[], None]:
        return lambda: self.stockout(group, until_s)

    def run(self, until_s: float) -> dict[str, Any]:
        self.events.run_until(until_s)
        for work in self.ray.finished + list(self.ray.running.values()):
            if work.placed_s is not None and not work.work_id.startswith("spg-head"):
                self.metrics.demand_waits_s.append(work.placed_s - work.submitted_s)
        return self.metrics.summary(
            self.policy, self.seed, self.events.now_s, len(self.ray.pending), self.world.name
        )

    def _replica_state(self, shape: SliceShape, replica: str, members: list[dict[str, Any]]) -> str:
        """pending (being created, or coming up), running (every host in Ray),
        terminating (KubeRay deletes it whole), or partial: it holds chips but cannot
        run a slice-wide job and will not become whole by itself (a host missing or
        failed, or a host whose raylet left while others of the slice still run Ray;
        all of them gone is a drained slice about to be deleted)."""
        if any(p["metadata"].get("deletionTimestamp") for p in members):
            return "terminating"
        if replica in self.operator.creating or any(
            p["metadata"]["name"] in self.operator.creating for p in members
        ):
            return "pending"
        names = [p["metadata"]["name"] for p in members]
        up = sum(1 for n in names if n in self.ray.nodes)
        if up == shape.hosts_per_replica == len(members):
            return "running"
        if (
            len(members) < shape.hosts_per_replica
            or any(p["status"]["phase"] == "Failed" for p in members)
            or (up > 0 and any(n in self.ray_seen and n not in self.ray.nodes for n in names))
        ):
            return "partial"
        return "pending"

    def _sample(self) -> None:
        pods = self.store.list_pods(self.namespace, {labels.KUBERAY_CLUSTER: self.name})
        replicas: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            meta = pod["metadata"]["labels"]
            shape = self.shapes.get(meta[labels.KUBERAY_GROUP])
            key = (
                meta.get(labels.KUBERAY_REPLICA_NAME)
                or (
                    shape is not None
                    and shape.hosts_per_replica > 1
                    and meta.get(labels.WEBHOOK_REPLICA_INDEX)
                )
                or pod["metadata"]["name"]
            )
            replicas[(meta[labels.KUBERAY_GROUP], key)].append(pod)
        states: dict[str, int] = defaultdict(int)
        for (group, replica), members in replicas.items():
            shape = self.shapes.get(group)
            if shape is None:
                continue
            state = self._replica_state(shape, replica, members)
            if state == "partial":
                self.metrics.partial_slice_seconds += SAMPLE_PERIOD_S
            states[state] += 1
        busy = idle = 0
        for node in self.ray.nodes.values():
            chips = self.shapes[node.group].chips_per_host
            if node.busy:
                busy += chips
            else:
                idle += chips
        self.metrics.busy_chip_seconds += busy * SAMPLE_PERIOD_S
        self.metrics.idle_chip_seconds += idle * SAMPLE_PERIOD_S
        timeline = self.timeline
        timeline.t_s.append(self.events.now_s)
        for state in ("pending", "running", "partial"):
            timeline.slices[state].append(states[state])
        timeline.chips_busy.append(busy)
        timeline.chips_idle.append(idle)
        timeline.pending.append(len(self.ray.pending))
