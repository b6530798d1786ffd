"""One round of the autoscaler, the imperative shell around the pure policy: read the
RayCluster, its pods, the Events about pods and the GCS (dead nodes' reasons among
it: the capacity signals); plan;
drain every host of each idle replica; apply the plan as one patch guarded by the
resourceVersion it was made from; record Events and metrics; report to the GCS for
`ray status`.

Every round starts from what it reads, so a crash between two steps loses nothing
and repeats nothing: a patch either landed (the next read shows it) or did not (the
next plan makes it again). Launch ages come from pod creation times; the memory kept
between rounds that decides anything is the provisioning backoff, when each host was
first seen in Ray, and what was already announced. The rest (parses, replicas, the
pods that owe their raylet nothing, the hosts listed as starting) only spares a round
the work of what did not change since the last, and is safe to lose."""

from __future__ import annotations

import itertools
import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, cast

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, KubeApi
from tpu_autoscaler.adapters.kube.capacity_events import PREEMPTED_DEATH, parse_events
from tpu_autoscaler.adapters.kube.guarded import GuardedApply, Proposal
from tpu_autoscaler.adapters.kube.observe import Observation, Observer
from tpu_autoscaler.adapters.kube.patches import KeptPodNames, PodNames, plan_patch
from tpu_autoscaler.adapters.kube.pods import Registrations, ReplicaMemo
from tpu_autoscaler.adapters.kube.provreq_objects import (
    PROVISIONING_ENDED,
    PROVISIONING_REQUESTED,
    ProvisioningApi,
)
from tpu_autoscaler.adapters.kube.queued import QueuedProvisioning
from tpu_autoscaler.adapters.kube.queued_steps import QueuedSteps, QueuedView
from tpu_autoscaler.adapters.ray.gcs import (
    DeadNode,
    GcsApi,
    GcsUnavailable,
    read_dead_nodes,
    read_ray_state,
)
from tpu_autoscaler.adapters.ray.state import NodeMemory
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, assemble
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import plan as slice_plan
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.core.snapshot import (
    Host,
    LaunchFailures,
    PolicyConfig,
    Remade,
    Replica,
)
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.announcer import Announcer
from tpu_autoscaler.shell.drain import Drainer
from tpu_autoscaler.shell.metrics import AutoscalerMetrics
from tpu_autoscaler.shell.resizer import Resizer
from tpu_autoscaler.shell.taken_back import busy_though_named

log = logging.getLogger("tpu_autoscaler")

Decide = Callable[[LoadedSnapshot], Plan]


def decide_by_slices(loaded: LoadedSnapshot) -> Plan:
    return slice_plan(loaded.snapshot)


@dataclass(frozen=True, slots=True)
class UnguardedPlan(Plan):
    """A plan that brings the patch to write, sent as Ray's stock KubeRay provider sends
    it: no resourceVersion precondition, so never a conflict and never a re-plan. Only
    the stock comparison (`adapters/ray/baseline.py`) decides so; our plans stay guarded."""

    operations: tuple[dict[str, Any], ...] = ()


class _Abandoned(Exception):
    """A round given up before its patch: which step, and the error that ended it."""

    def __init__(self, operation: str, cause: Exception) -> None:
        super().__init__(operation, cause)
        self.operation = operation
        self.cause = cause


@dataclass(frozen=True)
class Round:
    """What one round did."""

    plan: Plan | None = None
    """The plan carried out (idle removals whose drain was refused taken out)."""
    applied: bool = False
    replans: int = 0
    drains_refused: int = 0
    decision_s: float = 0.0
    rebases: int = 0
    """Conflicts with status writes only, absorbed by sending the same patch again."""
    error: str | None = None


@dataclass
class _Memory:
    """What the reading side carries from round to round (the drainer and the
    announcer keep their own). Losing all of it (a restart) costs repeated
    announcements and a reset backoff; and a slice being retired after a partial
    drain is then taken for unhealthy and removed at once, work that arrived on it
    included (Ray retries tasks; the window is one round after a rare race)."""

    observer: Observer
    """What was parsed at which resourceVersion."""
    launch_failures: dict[str, LaunchFailures] = field(default_factory=dict)
    capacity_returned_s: dict[str, float] = field(default_factory=dict)
    """`ClusterSnapshot.capacity_returned_s`: a preempted or broken replica that came
    up after a stockout still answers it once it is gone."""
    registered_at: dict[str, float] = field(default_factory=dict)
    """When each host (by pod name) was first seen in Ray: the registered hosts of the
    replicas in `registered`."""
    registered_holders: dict[str, int] = field(default_factory=dict)
    """How many replicas in `registered` hold each host of `registered_at`."""
    ray_nodes: NodeMemory = field(default_factory=NodeMemory)
    """What was parsed from which node message."""
    replicas: ReplicaMemo = field(default_factory=ReplicaMemo)
    """The replicas made at the last read, from what."""
    registered: dict[int, tuple[Replica, Replica, tuple[tuple[str, float], ...]]] = field(
        default_factory=dict
    )
    """The last read's replicas, by `id()`, with their registration times added, and
    those times by pod (the memory holds each replica, so an `id` is not reused)."""
    registered_read: tuple[Replica, ...] = ()
    """The last read's replicas in the order given (each one of `registered`)."""
    registered_timed: tuple[Replica, ...] = ()
    """Them with their times, as handed back."""
    registered_places: dict[int, int] = field(default_factory=dict)
    """How many places of `registered_read` each replica of `registered` takes."""


_HOST_REGISTERED_AT = Remade(Host, "registered_at_s")
_REPLICA_HOSTS = Remade(Replica, "hosts")
_WITH_TIMES = itemgetter(1)
_NONE = itertools.repeat(None)


def _hand_over_registrations(
    memory: _Memory,
    gone: Iterable[tuple[Replica, Replica, tuple[tuple[str, float], ...]]],
    made: Iterable[tuple[Replica, Replica, tuple[tuple[str, float], ...]]],
) -> None:
    """The registration times of the pods of replicas `gone` let go (a pod held by
    another replica still stays) and those of replicas `made` taken in."""
    holders, registered_at = memory.registered_holders, memory.registered_at
    for _, _, times in gone:
        for pod, _ in times:
            holders[pod] -= 1
            if not holders[pod]:
                del holders[pod], registered_at[pod]
    for _, _, times in made:
        for pod, at_s in times:
            holders[pod] = holders.get(pod, 0) + 1
            registered_at[pod] = at_s


class Autoscaler:
    def __init__(
        self,
        kube: KubeApi,
        gcs: GcsApi,
        namespace: str,
        name: str,
        *,
        clock: Callable[[], float] = time.time,
        config: PolicyConfig | None = None,
        metrics: AutoscalerMetrics | None = None,
        decide: Decide = decide_by_slices,
        drain_before_removal: bool = True,
        timer: Callable[[], float] = time.perf_counter,
        provisioning: ProvisioningApi | None = None,
    ) -> None:
        """`drain_before_removal`: drain every host of an idle replica through the GCS
        and remove it only if all accept (ours); Ray's stock plans drain host by host
        inside its own reconciler, so its baseline runs without. `provisioning`: where
        ProvisioningRequests live, for groups with queued provisioning (none: such
        groups are scaled by `replicas` alone, as without the annotation)."""
        self.kube = kube
        self.gcs = gcs
        self.namespace = namespace
        self.name = name
        self.clock = clock
        self.config = config or PolicyConfig()
        self.metrics = metrics or AutoscalerMetrics()
        self.decide = decide
        self.drain_before_removal = drain_before_removal
        self.timer = timer
        self.memory = _Memory(observer=Observer(namespace, name))
        self.announcer = Announcer(self, namespace, self._where)
        self.drainer = Drainer(self, self.announcer.event)
        self.queued = (
            QueuedProvisioning(provisioning, namespace, name, self.config.stockout_hold_s)
            if provisioning is not None
            else None
        )
        self.resizer = Resizer(kube, gcs, namespace, clock)
        self.pod_names = KeptPodNames()
        """The names of the pods read, for the patch (safe to lose)."""

    # --- the round --------------------------------------------------------------------

    def step(self) -> Round:
        started = self.timer()
        try:
            return self._step()
        finally:
            self.metrics.loop_seconds.observe(self.timer() - started)

    def _step(self) -> Round:
        refused = 0
        decision_s = 0.0
        loaded: LoadedSnapshot | None = None
        raw: dict[str, Any] = {}
        queued: tuple[QueuedView, QueuedSteps] | None = None
        taken_back: tuple[Replica, ...] = ()

        def propose() -> Proposal[Plan]:
            nonlocal refused, decision_s, loaded, raw, queued, taken_back
            try:
                observed, loaded = self._read()
                view = self._read_queued(observed, loaded)
            except (ApiError, GcsUnavailable, ManifestError) as exc:
                raise _Abandoned("read", exc) from exc
            if view is not None:
                loaded = self._with_queued_signals(loaded, view)
            raw = observed.raw
            self.announcer.problems(observed.raw, loaded)
            started = self.timer()
            decided = self.drainer.with_owed(self.decide(self.resizer.planned_on(loaded)), loaded)
            decision_s = self.timer() - started
            self.metrics.decision_seconds.observe(decision_s)
            try:
                if self.drain_before_removal:
                    decided, newly_refused = self.drainer.drain(observed.raw, decided, loaded)
                    refused += newly_refused
            except GcsUnavailable as exc:
                raise _Abandoned("drain", exc) from exc
            if isinstance(decided, UnguardedPlan):
                return Proposal(observed.raw, decided, list(decided.operations), guarded=False)
            existing = PodNames(loaded.pods, self.pod_names)
            taken_back = busy_though_named(loaded, self.drainer.retiring)
            if view is None or self.queued is None:
                operations = plan_patch(loaded.cluster, decided, existing, taken_back)
                return Proposal(observed.raw, decided, operations)
            steps = self.queued.steps(view, decided)
            queued = (view, steps)
            carried, binding = self.queued.carried(view, decided, steps)
            operations = plan_patch(loaded.cluster, carried, existing, taken_back) + binding
            return Proposal(observed.raw, decided, operations)

        applier = GuardedApply(self.kube, self.namespace, self.name, self.metrics.conflicts.inc)
        try:
            proposal = applier.apply(propose)
        except _Abandoned as abandoned:
            return self._failed(abandoned.operation, abandoned.cause, applier.replans)
        except Conflict as exc:
            return self._failed("patch", exc, applier.replans)
        except ApiError as exc:
            # Maybe applied, maybe not: the next round's read tells, and the guard
            # on the resourceVersion keeps a repeat from applying twice.
            self.announcer.failure(raw, exc)
            return self._failed("patch", exc, applier.replans)
        assert loaded is not None
        decided = proposal.decision
        for replica in taken_back:
            message = (
                f"kept {replica.group} replica {replica.name}: it came up and took work after"
                " it was named for deletion, before KubeRay deleted it"
            )
            log.warning(message)
            self.announcer.event(raw, events.REMOVAL_TAKEN_BACK, message, "Warning")
        self.drainer.landed()
        self.resizer.sync(loaded)
        self.resizer.carry_out(loaded, decided.resize)
        announced = decided
        if queued is not None and self.queued is not None:
            announced = self._carry_out_queued(raw, proposal.raw, decided, *queued)
        after = loaded.snapshot.after(decided)
        self.memory.launch_failures = dict(after.launch_failures)
        if loaded.snapshot.capacity_signals:
            # Only a signal older than the launch can be answered by it, and such a
            # signal is in the snapshot by then: without one, nothing needs walking.
            self.memory.capacity_returned_s = after.capacity_returned()
        else:
            self.memory.capacity_returned_s = dict(after.capacity_returned_s)
        self.announcer.decisions(raw, loaded, announced)
        self.announcer.came_up(raw, loaded.snapshot)
        self.announcer.measure(loaded, decided)
        self.announcer.report(loaded.ray, after, decided)
        self.announcer.capacity(raw, loaded, decided)
        return Round(decided, True, applier.replans, refused, decision_s, applier.rebases)

    # --- read -------------------------------------------------------------------------

    def _read(self) -> tuple[Observation, LoadedSnapshot]:
        """The RayCluster and its pods (parsed as an informer would), and the GCS."""
        observed = self.memory.observer.read(self.kube, events=True)
        self.announcer.signals_read("kubernetes", "list_events", observed.events_error)
        ray = read_ray_state(self.gcs, self.memory.ray_nodes)
        now_s = self.clock()
        events = parse_events(observed.events)
        dead = self._preempted_nodes()
        # The hosts are made with their registration times (the time is read after
        # the dead nodes, which take a call to the GCS): `_with_registration_times`
        # then finds them right and copies no host.
        registrations = Registrations(self.memory.registered_at, self.clock())
        loaded = assemble(
            observed.cluster,
            list(observed.pods),
            ray,
            now_s,
            self.config,
            events,
            dead,
            self.memory.replicas,
            registrations,
            observed.changes,
        )
        replicas = self.drainer.retiring_as_draining(loaded)
        snapshot = replace(
            loaded.snapshot,
            replicas=self._with_registration_times(replicas, registrations.now_s),
            launch_failures=dict(self.memory.launch_failures),
            capacity_returned_s=dict(self.memory.capacity_returned_s),
        )
        return observed, replace(loaded, snapshot=snapshot)

    def _carry_out_queued(
        self,
        raw: dict[str, Any],
        proposed: dict[str, Any],
        decided: Plan,
        view: QueuedView,
        steps: QueuedSteps,
    ) -> Plan:
        """The request writes after the patch, announced; the plan as carried (a
        queued group's launch is announced when a granted request is bound, not
        every round it waits)."""
        assert self.queued is not None
        failed = self.queued.carry_out(proposed, view, steps)
        if failed:
            self.metrics.api_errors.labels("kubernetes", "provisioning").inc(failed)
        for group, name, slices in steps.create:
            what = "one slice" if slices == 1 else f"{slices} slices at once"
            message = f"asked GKE for {what} of {group}: ProvisioningRequest {name}"
            self.announcer.event(raw, PROVISIONING_REQUESTED, message, "Normal")
        for signal in steps.signals:
            message = f"{signal.source} of {signal.group} deleted: {signal.message}"
            self.announcer.event(raw, PROVISIONING_ENDED, message, "Warning")
        return self.queued.carried(view, decided, steps)[0]

    def _read_queued(self, observed: Observation, loaded: LoadedSnapshot) -> QueuedView | None:
        if self.queued is None:
            return None
        return self.queued.read(
            observed.raw, observed.raw_pods, loaded.shapes.shapes, loaded.snapshot.now_s
        )

    def _with_queued_signals(self, loaded: LoadedSnapshot, view: QueuedView) -> LoadedSnapshot:
        """Ended ProvisioningRequests as capacity signals, beside any others read."""
        assert self.queued is not None
        signals = self.queued.signals(view, loaded.snapshot.now_s)
        snapshot = replace(
            loaded.snapshot,
            capacity_signals=loaded.snapshot.capacity_signals + signals,
        )
        return replace(loaded, snapshot=snapshot)

    def _with_registration_times(
        self, replicas: tuple[Replica, ...], now: float | None = None
    ) -> tuple[Replica, ...]:
        """Each registered host with the time this autoscaler first saw it in Ray (the
        GCS reports no such time); hosts gone are forgotten.

        A replica read as last round (the same object, `ReplicaMemo`) is last round's
        again, times and all, without a look at its hosts: its hosts are the same, each
        registered one was seen last round and given its time then, and that time is
        what `registered_at` holds for it now (a time is only ever set when a host is
        first seen). Only new or changed replicas are walked host by host, and
        `registered_at` changes only by the hosts of the replicas gone or changed since
        last round (taken out) and of those new or changed (put in): it stays the hosts
        of the replicas in `registered`, counted in `registered_holders`, so a pod
        in two replicas stays while one holds it. Nothing is changed until every new
        time is worked out, so a read that fails leaves last round's memory whole.

        `assemble` makes the hosts with these times already (`Registrations`, read
        from `registered_at` before it changes here, at the same `now`), so a new
        replica is mostly walked, not copied; one made otherwise (the drainer's) is
        given its times here. `now`: the time a host first seen is given (the clock's
        if not given)."""
        if now is None:
            now = self.clock()
        memory = self.memory
        if replicas and len(replicas) == len(memory.registered_read):
            return self._registration_times_again(replicas, now)
        last = memory.registered
        registered_at = memory.registered_at
        # Each replica's entry of last round, found in C: an `id` among `last`'s keys
        # is that very replica (`last` holds its replicas, so no other object alive
        # has the `id` of one); a Python step only for the others.
        ids = list(map(id, replicas))
        found = list(map(last.get, ids))
        made: dict[int, tuple[Replica, Replica, tuple[tuple[str, float], ...]]] = {}
        idled = memory.replicas.idled()
        for at in itertools.compress(itertools.count(), map(operator.is_, found, _NONE)):
            replica = replicas[at]
            entry = made.get(ids[at])
            if entry is None:
                entry = made[ids[at]] = self._entry_of(replica, idled, registered_at, now)
            found[at] = entry
        entries = cast(list[tuple[Replica, Replica, tuple[tuple[str, float], ...]]], found)
        kept = dict(zip(ids, entries, strict=True))
        gone = (
            [last[key] for key in last.keys() - kept.keys()]
            if len(kept) - len(made) < len(last)
            else []
        )
        _hand_over_registrations(memory, gone, made.values())
        memory.registered = kept
        memory.registered_read = replicas
        memory.registered_timed = timed = tuple(map(_WITH_TIMES, entries))
        memory.registered_places = Counter(ids)
        return timed

    def _registration_times_again(
        self, replicas: tuple[Replica, ...], now: float
    ) -> tuple[Replica, ...]:
        """`_with_registration_times` for as many replicas as last round: only the
        places holding another object than last round's are looked at (found in C),
        so a round costs the replicas that changed. A replica leaves `registered`
        when its last place goes (`registered_places` counts them: one moved to
        another place, or read twice, stays) and joins when first placed; the same
        entries, times and holders as worked out for every replica."""
        memory = self.memory
        last, registered_at = memory.registered, memory.registered_at
        before = memory.registered_read
        places = list(itertools.compress(itertools.count(), map(operator.is_not, replicas, before)))
        if not places:
            memory.registered_read = replicas
            return memory.registered_timed
        made: dict[int, tuple[Replica, Replica, tuple[tuple[str, float], ...]]] = {}
        idled = memory.replicas.idled()
        for at in places:
            key = id(replicas[at])
            if key not in last and key not in made:
                made[key] = self._entry_of(replicas[at], idled, registered_at, now)
        # Every new time worked out: the memory changes from here on.
        counts = memory.registered_places
        for at in places:
            key = id(replicas[at])
            counts[key] = counts.get(key, 0) + 1
        last.update(made)
        gone = []
        for at in places:
            key = id(before[at])
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
                gone.append(last.pop(key))
        _hand_over_registrations(memory, gone, made.values())
        timed = list(memory.registered_timed)
        for at in places:
            timed[at] = last[id(replicas[at])][1]
        memory.registered_read = replicas
        memory.registered_timed = tuple(timed)
        return memory.registered_timed

    def _entry_of(
        self,
        replica: Replica,
        idled: dict[int, tuple[Replica, Replica]],
        registered_at: dict[str, float],
        now: float,
    ) -> tuple[Replica, Replica, tuple[tuple[str, float], ...]]:
        """`_registration_entry`, without a look at the hosts of a replica that one of
        last round's became with some hosts' idle times alone (`ReplicaMemo.idled`):
        it has that one's hosts, registered as they were, so if that one took its
        times as made (kept as read), so does this one, and the same times: they
        stay in `registered_at` while last round's replica holds its pods, and it
        does until this round's entries are all worked out."""
        idled_from = idled.get(id(replica))
        if idled_from is not None and idled_from[0] is replica:
            kept = self.memory.registered.get(id(idled_from[1]))
            if kept is not None and kept[0] is idled_from[1] and kept[1] is kept[0]:
                return replica, replica, kept[2]
        return self._registration_entry(replica, registered_at, now)

    @staticmethod
    def _registration_entry(
        replica: Replica, registered_at: dict[str, float], now: float
    ) -> tuple[Replica, Replica, tuple[tuple[str, float], ...]]:
        """A new or changed replica, with its registered hosts' times (the time a host
        was first seen, `now` if it is new) and those times by pod."""
        hosts = []
        known = []
        retimed = False
        for host in replica.hosts:
            if host.registered:
                at_s = registered_at.get(host.pod_name, now)
                known.append((host.pod_name, at_s))
                if host.registered_at_s != at_s:
                    host = _HOST_REGISTERED_AT(host, at_s)
                    retimed = True
            hosts.append(host)
        # A replica none of whose hosts takes a new time (none registered, say)
        # is kept as is: the same content.
        with_times: Replica = _REPLICA_HOSTS(replica, tuple(hosts)) if retimed else replica
        return replica, with_times, tuple(known)

    def _preempted_nodes(self) -> list[DeadNode]:
        """The GCS's dead nodes that were preempted; none this round if it will not say
        (the round, which read its state, goes on)."""
        try:
            dead = read_dead_nodes(self.gcs, [PREEMPTED_DEATH])
        except GcsUnavailable as exc:
            self.announcer.signals_read("gcs", "read_dead_nodes", exc)
            return []
        self.announcer.signals_read("gcs", "read_dead_nodes", None)
        return dead

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _failed(self, operation: str, exc: Exception, replans: int) -> Round:
        api = "gcs" if isinstance(exc, GcsUnavailable) else "kubernetes"
        if not isinstance(exc, ManifestError | Conflict):
            self.metrics.api_errors.labels(api, operation).inc()
        log.error(
            f"round abandoned at {operation}: {exc}",
            extra={"operation": operation, "cluster": self._where},
        )
        return Round(None, False, replans, error=f"{operation}: {exc}")
