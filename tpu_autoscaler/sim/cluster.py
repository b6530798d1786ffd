"""A whole simulated TPU cluster on a virtual clock: the Kubernetes object store,
the KubeRay operator, GKE provisioning (delays, stockouts, quotas, host failures,
preemption storms, each told in the Events and pod status GKE leaves), Ray, a
workload, and an autoscaler (ours, or Ray 2.60's with KubeRay's arithmetic) that
reads the cluster through the production adapters and writes it by JSON patch.

This module wires them together, runs the autoscaler's rounds and judges each host
that goes; GKE is `sim/provisioning.py`, Ray `sim/ray.py`, the workload's drivers
`sim/driver.py`, the autoscaler's remote calls `sim/remote.py`, and what a run
measured `sim/sampling.py` and `sim/metrics.py`."""

from __future__ import annotations

import gc
import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

from tpu_autoscaler.adapters.kube.api import KubeApi
from tpu_autoscaler.adapters.kube.pods import timestamp_s
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.kuberay import KubeRayOperator
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.controlplane.world import REALISTIC, WorldModel
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, PolicyConfig
from tpu_autoscaler.manifest.head import head_resources
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.shell.controller import Autoscaler, decide_by_slices
from tpu_autoscaler.sim import driver
from tpu_autoscaler.sim.metrics import Metrics, Timeline
from tpu_autoscaler.sim.provisioning import GkeProvisioning, default_provisioning_delay
from tpu_autoscaler.sim.queued import QueuedWorld, QueueTimings
from tpu_autoscaler.sim.quiet import Fingerprint, QuietRounds, may_be_quiet, round_calls_s
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.remote import AutoscalerApi, SimGcs, Wire
from tpu_autoscaler.sim.sampling import SAMPLE_PERIOD_S, Sampler
from tpu_autoscaler.sim.workload import Fault, WorkItem, Workload

Policy = Literal["slice", "ray"]
AUTOSCALER_PERIOD_S = 5.0
LIVENESS_FAILURE_S = 600.0
"""KubeRay's default liveness probe: every 5 s, 120 failures allowed."""


COLLECT_AFTER_GROWTH = 2_000_000
"""Objects the cyclic collector tracks, made and not freed since its last pass, past
which a run with the collector off collects all the same (a 1,024-slice burst grows
by about 385,000, of them 89,000 cyclic garbage)."""


@contextmanager
def _without_the_cyclic_collector() -> Iterator[None]:
    """A run keeps many objects for long (stored pod versions, parsed pods, Ray nodes,
    their messages), and Python's cyclic collector walks them again and again: at
    1,024 slices its passes were a fifth of the run's CPU time, and with fewer full
    passes still about 7% (151 young and middle passes, 0.5 s). Yet a run makes
    little cyclic garbage (the policy's scratch slots of replicas gone, some closures:
    89,000 objects in a 1,024-slice burst, 3,720 simulated s), and reference counting
    frees everything else as it goes. So the collector is off while a run goes and
    back as it was after it; `autoscale` collects all the same once a run has grown
    by `COLLECT_AFTER_GROWTH` objects, which bounds what the cycles hold."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _collect_if_grown() -> None:
    """Collects the young and middle generations only: what the run made since the
    last collection, survivors then promoted to the old one. A full collection walks
    everything the run keeps (at 4,096 slices two of them took 2.8 CPU s, these 1.7,
    finding the same garbage); a cycle reaching back into the old generation waits for
    the collector's own passes after the run."""
    if not gc.isenabled() and gc.get_count()[0] > COLLECT_AFTER_GROWTH:
        gc.collect(1)


def _ray_plan(loaded: LoadedSnapshot) -> Plan:
    """Ray 2.60's own decision, imported only when asked for (it loads Ray's autoscaler)."""
    from tpu_autoscaler.adapters.ray.baseline import ray_plan

    return ray_plan(loaded)


class SimulatedCluster:
    """One simulated cluster, wired up: `load` a workload, `run` it, read the summary."""

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
        scale_down_delay_s: float = 0.0,
        store: Callable[[EventQueue], ObjectStore] = ObjectStore,
        autoscaler_kube: KubeApi | None = None,
        start_s: float = 0.0,
        skip_quiet_rounds: bool = True,
        queue_timings: QueueTimings | None = None,
    ) -> None:
        """`capacity`: how many slices of a group GKE can hold at once (unlimited if
        absent); a slice beyond it waits, as under a stockout. `world`: how
        unforgiving Kubernetes, KubeRay and GKE are (`controlplane/world.py`).
        `scale_down_delay_s`: how long a slice's VMs outlive its pods
        (`GkeProvisioning`). `store`: the controllers' object store on the clock (the
        simulated API server by default; `controlplane/real_store.py` for a real
        one); `autoscaler_kube`: what the autoscaler's client reaches (the store by
        default); `start_s`: the clock's first reading (a real server's timestamps
        need the machine's time);
        `skip_quiet_rounds`: leave out rounds that could only repeat the last one
        (`sim/quiet.py`; our policy on the simulated API server only);
        `queue_timings`: how GKE treats the ProvisioningRequests of queued groups."""
        self.events = EventQueue(seed, start_s)
        self.world = world
        self.seed = seed
        self.policy = policy
        self.policy_config = policy_config or PolicyConfig()
        self.store = store(self.events)
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
        self.ray_seen: set[str] = set()
        """Pods whose raylet has registered at some point."""
        self.gke = GkeProvisioning(
            self.events,
            self.store,
            self.namespace,
            self.shapes,
            self.ray,
            world,
            self.ray_seen,
            provisioning_delay,
            capacity,
            raylet_started=lambda pod: self.metrics.raylet_started(pod, self.events.now_s),
            scale_down_delay_s=scale_down_delay_s,
        )
        self.queued = QueuedWorld.wire(self, queue_timings)
        self.removals: dict[str, list[float]] = defaultdict(list)
        self.last_plan: Plan | None = None
        self.violations: list[str] = []
        """Removals of hosts not yet idle for their timeout (the invariant tests check)."""
        wire = Wire(self.events)
        self.gcs = SimGcs(self.ray, self._raylet_drained, wire, world.gcs_call_latency_s)
        self.api = AutoscalerApi(
            autoscaler_kube or self.store, wire, world.autoscaler_call_latency_s
        )
        self.autoscaler = self.new_autoscaler_process()
        self._wired = self.autoscaler
        self.planned_from: ClusterSnapshot | None = None
        self.quiet = QuietRounds(
            self._read_fingerprint,
            # What a skipped round's calls would have let happen while it read.
            lambda now_s: self.events.changes_by(now_s + round_calls_s(world)),
            enabled=skip_quiet_rounds
            and policy == "slice"
            and type(self.store) is ObjectStore
            and autoscaler_kube is None,
        )
        self.sampler = Sampler(
            lambda: self.events.now_s,
            self.store,
            self.namespace,
            self.name,
            self.shapes,
            self.operator,
            self.ray,
            self.ray_seen,
            self.metrics,
            self.timeline,
            self.gke.vms_up,
            self.gke.lingering,
        )
        self.store.watchers.append(self.operator.on_store_change)
        self._had_a_node_when_named: dict[str, bool] = {}
        """Each pod named in workersToDelete: whether it had a Ray node when first named
        (the autoscaler's decision landed)."""
        self.store.watchers.append(self._note_named)
        self.operator.reconcile()
        if world.demand_report_period_s > 0:
            # Off the autoscaler's grid, as raylets and the autoscaler keep their own time.
            self.events.every(
                world.demand_report_period_s, self.ray.report_demand, first_s=start_s + 0.37
            )
        self.events.every(AUTOSCALER_PERIOD_S, self.autoscale)
        self.events.every(SAMPLE_PERIOD_S, self.sampler.sample, first_s=start_s, observes=True)

    # --- slices launched and hosts removed, each removal judged ---------------------------

    def _replica_created(self, group: str, replica: str, pods: list[str]) -> None:
        self.metrics.replica_created(group, pods, self.events.now_s)
        shape = self.shapes[group]
        removed = self.removals.get(group, [])
        if removed and self.events.now_s - removed[-1] < shape.idle_timeout_s:
            self.metrics.scale_flaps += 1
        self.gke.slice_created(group, pods)

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

    def _note_named(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "RayCluster" or obj["metadata"].get("name") != self.name:
            return
        for group in obj["spec"].get("workerGroupSpecs") or []:
            for pod in (group.get("scaleStrategy") or {}).get("workersToDelete") or []:
                if pod not in self._had_a_node_when_named:
                    self._had_a_node_when_named[pod] = pod in self.ray.nodes

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
                    # A raylet that joined after the autoscaler named its pod: KubeRay,
                    # waiting for earlier deletions to end, acted after the slice came
                    # (a launch timing out as it arrives); no decision removed it idle.
                    and self._had_a_node_when_named.get(pod, True)
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
        if self._lost_a_host(stored):
            return False
        created = [
            timestamp_s(p["metadata"].get("creationTimestamp")) or 0.0
            for p in stored
            if p is not None
        ]
        # A gang's slice still pending past the gang arrival bound is given back.
        config = self.policy_config
        timeout_s = min(config.provisioning_timeout_s, config.gang_arrival_bound_s)
        return bool(created) and self.events.now_s - min(created) < timeout_s - 1e-6

    def _lost_a_host(self, stored: list[dict[str, Any] | None]) -> bool:
        """The pods' replica, made whole once, lacks a pod: one of its hosts failed or
        was preempted and is gone already (a Failed pod has nothing to wait for), so
        removing the rest takes back no launch. Found by the fallback state machine: a
        spot host preempted the moment it ran, its siblings still Pending."""
        pods = [p for p in stored if p is not None]
        if not pods:
            return False
        meta = pods[0]["metadata"]["labels"]
        replica = meta.get(labels.KUBERAY_REPLICA_NAME)
        if replica is None or replica in self.operator.creating:
            return False
        listed = self.store.list_pods(self.namespace, {labels.KUBERAY_REPLICA_NAME: replica})
        return len(listed) < self.shapes[meta[labels.KUBERAY_GROUP]].hosts_per_replica

    def _replica_of(self, pod: str) -> str:
        node = self.ray.nodes.get(pod) or self.ray.dead.get(pod)
        if node is not None and labels.RAY_TPU_SLICE_NAME in node.labels:
            return node.labels[labels.RAY_TPU_SLICE_NAME]
        return pod

    # --- faults ---------------------------------------------------------------------------

    def host_failure(self, group: str) -> None:
        self.gke.host_failure(group)

    def stockout(self, group: str, until_s: float) -> None:
        self.gke.stockout(group, until_s)

    def preemption(self, group: str) -> None:
        """GCE reclaims one running slice of `group` whole; the adapters read it back
        (the raylets' death reason, the pods' node-shutdown status) as PREEMPTED."""
        self.gke.preempt_slice(group)

    def quota(self, group: str, until_s: float) -> None:
        self.gke.quota(group, until_s)

    def preemption_storm(self, group: str, until_s: float, mean_interval_s: float) -> None:
        self.gke.preemption_storm(group, until_s, mean_interval_s)

    # --- the autoscaler -------------------------------------------------------------------

    def autoscale(self) -> None:
        _collect_if_grown()
        began_s = self.events.now_s
        own = self._own_autoscaler()
        if own and self.quiet.skip(began_s):
            return
        self.planned_from = None
        started = time.perf_counter()
        outcome = self.autoscaler.step()
        planned_from = self.planned_from
        # Whether the round settled matters only to a round that may have been quiet
        # (`QuietRounds.ran` makes nothing of any other), and asking walks every node.
        settled = (
            own
            and planned_from is not None
            and outcome.plan is not None
            and may_be_quiet(planned_from, outcome.plan)
            and not (
                self.autoscaler.drainer.retiring
                or self.autoscaler.drainer.drained
                or outcome.replans
                or outcome.rebases
                or outcome.drains_refused
                or any(n.exit_when_idle for n in self.ray.nodes.values())
            )
        )
        self.quiet.ran(began_s, planned_from if settled else None, outcome.plan)
        self.metrics.decision_s.append(outcome.decision_s)
        self.metrics.conflicts += outcome.replans + outcome.rebases
        if not outcome.applied:
            self.metrics.rounds_failed += 1
            self.metrics.conflicts_unabsorbed += outcome.replans + outcome.rebases
        self.metrics.drains_refused += outcome.drains_refused
        self.last_plan = outcome.plan
        self.metrics.rounds_wall_s += time.perf_counter() - started

    def new_autoscaler_process(self) -> Autoscaler:
        """The autoscaler as this cluster wires it, with no memory at all: the first
        one, or a process that took over from one that died (a test's restart, which
        then plans every round: `_own_autoscaler`)."""
        return Autoscaler(
            self.api,
            self.gcs,
            self.namespace,
            self.name,
            clock=lambda: self.events.now_s,
            config=self.policy_config,
            decide=self._decide_by_slices if self.policy == "slice" else _ray_plan,
            drain_before_removal=self.policy == "slice",
            provisioning=self.queued.objects if self.queued is not None else None,
        )

    def _own_autoscaler(self) -> bool:
        """The autoscaler as wired here: not one a test swapped in, nor one whose
        clients or round it rewired (only then do the store and the GCS say all it
        reads, and is `planned_from` its snapshot)."""
        autoscaler = self.autoscaler
        return (
            autoscaler is self._wired
            and autoscaler.kube is self.api
            and autoscaler.gcs is self.gcs
            and autoscaler.decide == self._decide_by_slices
            and "step" not in vars(autoscaler)
        )

    def _decide_by_slices(self, loaded: LoadedSnapshot) -> Plan:
        self.planned_from = loaded.snapshot
        return decide_by_slices(loaded)

    def _read_fingerprint(self) -> Fingerprint:
        return self.store.version, self.ray.state_key()

    # --- workload --------------------------------------------------------------------------

    def submit(self, item: WorkItem) -> None:
        driver.submit(self.ray, self.events, item, self._reservation_failed)

    def _reservation_failed(self) -> None:
        self.metrics.reservations_failed += 1

    # --- running and measuring --------------------------------------------------------------

    @classmethod
    def for_workload(
        cls,
        raycluster: Mapping[str, Any],
        workload: Workload,
        policy: Policy,
        seed: int,
        world: WorldModel,
    ) -> SimulatedCluster:
        """A cluster that behaves as the trace's `provisioning` says (its delay, its
        slices' host stagger, its capacity, its VMs' scale-down delay), with the
        trace loaded: what `simulate` and `whatif` run."""
        provisioning = workload.provisioning
        delay = provisioning.delay_s
        sim = cls(
            raycluster,
            policy,
            seed,
            provisioning_delay=lambda events: events.random.uniform(delay.min, delay.max),
            capacity=provisioning.capacity,
            world=provisioning.applied_to(world),
            scale_down_delay_s=provisioning.scale_down_delay_s,
        )
        sim.load(workload)
        return sim

    def load(self, workload: Workload) -> None:
        for item in workload.items:
            self.events.at(item.at, self._submitter(item))
        for fault in workload.faults:
            self.events.at(fault.at, self._fault(fault))

    def _submitter(self, item: WorkItem) -> Callable[[], None]:
        return lambda: self.submit(item)

    def _fault(self, fault: Fault) -> Callable[[], None]:
        if fault.stockout is not None:
            return partial(self.stockout, fault.group, fault.stockout.until)
        if fault.quota is not None:
            return partial(self.quota, fault.group, fault.quota.until)
        if fault.preemption_storm is not None:
            storm = fault.preemption_storm
            return partial(self.preemption_storm, fault.group, storm.until, storm.mean_interval_s)
        if fault.preemption is not None:
            return partial(self.preemption, fault.group)
        if fault.capacity is not None:
            return partial(self.gke.set_capacity, fault.group, fault.capacity.slices)
        return partial(self.host_failure, fault.group)

    def run(self, until_s: float) -> dict[str, Any]:
        with _without_the_cyclic_collector():
            self.events.run_until(until_s)
        for work in self.ray.finished + list(self.ray.running.values()):
            if work.placed_s is not None and not work.work_id.startswith("spg-head"):
                self.metrics.demand_waits_s.append(work.placed_s - work.submitted_s)
        return self.metrics.summary(
            self.policy, self.seed, self.events.now_s, len(self.ray.pending), self.world.name
        )
