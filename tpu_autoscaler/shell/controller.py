"""One round of the autoscaler, the imperative shell around the pure policy: read the
RayCluster, its pods and the GCS; plan; drain every host of each idle replica; apply
the plan as one patch guarded by the resourceVersion it was made from; record Events
and metrics; report to the GCS for `ray status`.

Every round starts from what it reads, so a crash between two steps loses nothing
and repeats nothing: a patch either landed (the next read shows it) or did not (the
next plan makes it again). Launch ages come from pod creation times; the only memory
kept between rounds is the provisioning backoff and what was already announced."""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, JsonPatch, KubeApi
from tpu_autoscaler.adapters.kube.patches import plan_patch
from tpu_autoscaler.adapters.kube.pods import Pod, parse_pods
from tpu_autoscaler.adapters.ray.gcs import (
    GcsApi,
    GcsUnavailable,
    PendingHosts,
    StartingHost,
    autoscaling_state,
    drain_nodes,
    read_ray_state,
    retire_nodes,
)
from tpu_autoscaler.adapters.ray.state import RayState
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, assemble
from tpu_autoscaler.core.labels import KUBERAY_CLUSTER
from tpu_autoscaler.core.plan import Plan, Terminate
from tpu_autoscaler.core.policy import plan as slice_plan
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    LaunchFailures,
    PolicyConfig,
    Replica,
    ReplicaState,
)
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.model import RayCluster
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.metrics import SLICE_STATES, AutoscalerMetrics

log = logging.getLogger("tpu_autoscaler")

Decide = Callable[[LoadedSnapshot], Plan]
MAX_REPLANS = 3
MAX_REBASES = 5
"""Conflicts with status writes absorbed by one patch before the round re-plans."""
"""Conflicting patches in one round before it gives up until the next."""


def decide_by_slices(loaded: LoadedSnapshot) -> Plan:
    return slice_plan(loaded.snapshot)


@dataclass(frozen=True, slots=True)
class UnguardedPlan(Plan):
    """A plan that brings the patch to write, sent as Ray's stock KubeRay provider sends
    it: no resourceVersion precondition, so never a conflict and never a re-plan. Only
    the stock comparison (`baseline.py`) decides so; our plans stay guarded."""

    operations: tuple[dict[str, Any], ...] = ()


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
    """All a round carries to the next. Losing it (a restart) costs repeated
    announcements and a reset backoff; and a slice being retired after a partial
    drain is then taken for unhealthy and removed at once, work that arrived on it
    included (Ray retries tasks; the window is one round after a rare race)."""

    launch_failures: dict[str, LaunchFailures] = field(default_factory=dict)
    announced_infeasible: set[str] = field(default_factory=set)
    announced_problems: set[str] = field(default_factory=set)
    state_version: int = 0
    retiring: dict[str, Terminate] = field(default_factory=dict)
    """Replicas broken by a partial drain, to remove once no host has work."""
    drained: dict[str, Terminate] = field(default_factory=dict)
    """Idle removals whose every host accepted a drain, until the patch lands."""
    registered_at: dict[str, float] = field(default_factory=dict)
    """When each host (by pod name) was first seen in Ray."""
    parsed_cluster: tuple[str, RayCluster] | None = None
    parsed_pods: dict[tuple[str, str], Pod] = field(default_factory=dict)


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
    ) -> None:
        """`drain_before_removal`: drain every host of an idle replica through the GCS
        and remove it only if all accept (ours); Ray's stock plans drain host by host
        inside its own reconciler, so its baseline runs without."""
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
        self.memory = _Memory()

    # --- the round --------------------------------------------------------------------

    def step(self) -> Round:
        started = self.timer()
        try:
            return self._step()
        finally:
            self.metrics.loop_seconds.observe(self.timer() - started)

    def _step(self) -> Round:
        replans = refused = rebases = 0
        decision_s = 0.0
        while True:
            try:
                raw, loaded = self._read()
            except (ApiError, GcsUnavailable, ManifestError) as exc:
                return self._failed("read", exc, replans)
            self._announce_problems(raw, loaded)
            started = self.timer()
            decided = self._with_drained(self.decide(loaded), loaded)
            decision_s = self.timer() - started
            self.metrics.decision_seconds.observe(decision_s)
            try:
                decided, newly_refused = self._drain(raw, decided, loaded)
            except GcsUnavailable as exc:
                return self._failed("drain", exc, replans)
            refused += newly_refused
            if isinstance(decided, UnguardedPlan):
                operations, guard = list(decided.operations), None
            else:
                operations = plan_patch(loaded.cluster, decided, {p.name for p in loaded.pods})
                guard = loaded.cluster.metadata.resource_version
            if not operations:
                break
            try:
                rebases += self._patch_through_status_churn(raw, operations, guard)
                break
            except Conflict as exc:
                self.metrics.conflicts.inc()
                replans += 1
                log.info("patch conflict, re-reading", extra={"detail": str(exc)})
                if replans >= MAX_REPLANS:
                    return self._failed("patch", exc, replans)
            except ApiError as exc:
                # Maybe applied, maybe not: the next round's read tells, and the guard
                # on the resourceVersion keeps a repeat from applying twice.
                self._announce_failure(raw, exc)
                return self._failed("patch", exc, replans)
        self.memory.drained.clear()
        after = loaded.snapshot.after(decided)
        self.memory.launch_failures = dict(after.launch_failures)
        self._announce(raw, loaded, decided)
        self._measure(loaded, decided)
        self._report(loaded.ray, after, decided)
        return Round(decided, True, replans, refused, decision_s, rebases)

    def _patch_through_status_churn(
        self, raw: dict[str, Any], operations: JsonPatch, guard: str | None
    ) -> int:
        """Apply the patch guarded by `guard`; the number of conflicts absorbed. A
        conflict that only a status write caused (KubeRay writes the status whenever
        its pod counts change; the spec's generation stays) leaves the plan's change
        to the spec as right as it was: the same patch goes again, guarded by the new
        version, at most MAX_REBASES times. A spec that moved raises Conflict: re-plan."""
        generation = raw.get("metadata", {}).get("generation")
        for rebases in range(MAX_REBASES + 1):
            try:
                self.kube.patch_raycluster(self.namespace, self.name, operations, guard)
                return rebases
            except Conflict:
                if guard is None or generation is None or rebases == MAX_REBASES:
                    raise
                current = self.kube.get_raycluster(self.namespace, self.name)
                if current.get("metadata", {}).get("generation") != generation:
                    raise
                self.metrics.conflicts.inc()
                log.info("patch conflict with a status write, patching the new version")
                guard = current["metadata"]["resourceVersion"]
        raise AssertionError("unreachable")

    # --- read -------------------------------------------------------------------------

    def _read(self) -> tuple[dict[str, Any], LoadedSnapshot]:
        """The RayCluster, its pods and the GCS, parsed as an informer would: objects
        whose resourceVersion has not changed are not parsed again."""
        memory = self.memory
        raw = self.kube.get_raycluster(self.namespace, self.name)
        version = str(raw.get("metadata", {}).get("resourceVersion", ""))
        if memory.parsed_cluster is None or memory.parsed_cluster[0] != version or not version:
            memory.parsed_cluster = (version, parse_raycluster(raw, f"raycluster {self._where}"))
        cluster = memory.parsed_cluster[1]
        pods: list[Pod] = []
        seen: dict[tuple[str, str], Pod] = {}
        for raw_pod in self.kube.list_pods(self.namespace, {KUBERAY_CLUSTER: self.name}):
            meta = raw_pod.get("metadata", {})
            key = (str(meta.get("name")), str(meta.get("resourceVersion", "")))
            parsed = memory.parsed_pods.get(key) if key[1] else None
            if parsed is None:
                (parsed,) = parse_pods([raw_pod], f"pods of {self._where}")
            seen[key] = parsed
            pods.append(parsed)
        memory.parsed_pods = seen
        ray = read_ray_state(self.gcs)
        loaded = assemble(cluster, pods, ray, self.clock(), self.config)
        snapshot = replace(
            loaded.snapshot,
            replicas=self._with_registration_times(self._retiring_as_draining(loaded)),
            launch_failures=dict(memory.launch_failures),
        )
        return raw, replace(loaded, snapshot=snapshot)

    def _with_registration_times(self, replicas: tuple[Replica, ...]) -> tuple[Replica, ...]:
        """Each registered host with the time this autoscaler first saw it in Ray (the
        GCS reports no such time); hosts gone are forgotten."""
        now = self.clock()
        seen: dict[str, float] = {}
        updated = []
        for replica in replicas:
            hosts = []
            for host in replica.hosts:
                if host.registered:
                    seen[host.pod_name] = self.memory.registered_at.get(host.pod_name, now)
                    host = replace(host, registered_at_s=seen[host.pod_name])
                hosts.append(host)
            updated.append(replace(replica, hosts=tuple(hosts)))
        self.memory.registered_at = seen
        return tuple(updated)

    def _retiring_as_draining(self, loaded: LoadedSnapshot) -> tuple[Replica, ...]:
        """A replica some hosts of which accepted an idle drain before a sibling refused
        is broken: Ray 2.60 cannot take a drain back, and a drained host's pod stays
        up without a Ray node. Its other hosts were retired (no new work; their raylets
        exit when their work ends), so until then it counts as draining: no capacity,
        and not taken for unhealthy, which would kill the work that arrived."""
        retiring = self.memory.retiring
        if not retiring:
            return loaded.snapshot.replicas
        replicas = []
        for replica in loaded.snapshot.replicas:
            if replica.name in retiring and any(h.registered for h in replica.hosts):
                replica = replace(replica, state=ReplicaState.DRAINING)
            replicas.append(replica)
        for name in set(retiring) - {r.name for r in replicas}:
            del retiring[name]
        return tuple(replicas)

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"

    # --- drain ------------------------------------------------------------------------

    def _drain(
        self, raw: dict[str, Any], decided: Plan, loaded: LoadedSnapshot
    ) -> tuple[Plan, int]:
        """Drain every live host of each idle replica through the GCS before its pods
        are deleted; a replica any host of which refuses (work arrived) stays.

        Ray 2.60 has no way to take back an accepted idle drain: the raylet exits at
        once and its pod runs on without a Ray node. So the window is kept small (the
        GCS is read again just before), worker 0 goes first (slice heads and multi-host
        jobs land there, so it is the likeliest to refuse, before any harm is done), a
        replica whose hosts all accepted is removed even if the patch must be
        re-planned (`memory.drained`), and one a later host of which refused is retired
        whole once its work ends (`_retire`)."""
        removals = [t for t in decided.terminate if t.idle and t.replica not in self.memory.drained]
        if not self.drain_before_removal or not removals:
            return decided, 0
        fresh = {n.instance_id: n for n in read_ray_state(self.gcs).nodes if not n.dead}
        hosts = {r.name: r.hosts for r in loaded.snapshot.replicas}
        dropped: set[str] = set()
        for removal in removals:
            ordered = sorted(hosts.get(removal.replica, ()), key=lambda h: h.host_index)
            live = [fresh[h.pod_name] for h in ordered if h.pod_name in fresh]
            busy = next((n for n in live if n.status not in ("IDLE", "DRAINING")), None)
            if busy is not None:
                refusal = (busy.node_id, "busy when re-read")
            else:
                outcome = drain_nodes(
                    self.gcs,
                    [n.node_id for n in live],
                    f"tpu-autoscaler: slice {removal.replica} idle: {removal.reason}",
                )
                if outcome.complete:
                    self.memory.drained[removal.replica] = removal
                    continue
                refusal = outcome.refused[0]
                if outcome.accepted:
                    self._retire(removal, [n.node_id for n in live], outcome.accepted)
            dropped.add(removal.replica)
            self.metrics.drains_refused.labels(removal.group).inc()
            node, why = refusal
            message = (
                f"kept replica {removal.replica} of {removal.group}: node {node} "
                f"would not drain ({why or 'busy'})"
            )
            log.info(message, extra={"group": removal.group, "replica": removal.replica})
            self._event(raw, events.DRAIN_REFUSED, message, "Normal")
        kept = tuple(t for t in decided.terminate if t.replica not in dropped)
        return replace(decided, terminate=kept), len(dropped)

    def _retire(self, removal: Terminate, nodes: list[str], drained: tuple[str, ...]) -> None:
        rest = [n for n in nodes if n not in drained]
        retire_nodes(
            self.gcs, rest, f"tpu-autoscaler: slice {removal.replica} lost hosts to a drain"
        )
        self.memory.retiring[removal.replica] = replace(
            removal,
            idle=False,
            reason=f"{len(drained)} host(s) drained before a sibling refused; the rest retired "
            "and now without work",
        )
        log.warning(
            "hosts drained before a sibling refused; the slice is retired whole as its work ends",
            extra={"replica": removal.replica, "drained": list(drained), "retired": rest},
        )

    def _with_drained(self, decided: Plan, loaded: LoadedSnapshot) -> Plan:
        """Removals whose hosts all drained earlier in this round stay in a re-plan,
        and retired replicas whose hosts have all exited are removed. A replica already
        listed for deletion (the patch landed, its answer was lost) is not removed twice,
        and one still retiring counts as listed (`_retiring_as_draining`)."""
        owed = {**self.memory.retiring, **self.memory.drained}
        planned = {t.replica for t in decided.terminate}
        extra = tuple(
            owed[r.name]
            for r in loaded.snapshot.replicas
            if r.name in owed and r.name not in planned and r.state is not ReplicaState.DRAINING
        )
        return replace(decided, terminate=decided.terminate + extra) if extra else decided

    # --- announce ---------------------------------------------------------------------

    def _announce_problems(self, raw: dict[str, Any], loaded: LoadedSnapshot) -> None:
        """Invalid groups and groups whose replicas cannot be told apart: said once
        per distinct problem, in a log line and an Event; the group is left alone."""
        problems = {f"{events.INVALID_GROUP}: {p}" for p in loaded.shapes.errors}
        unidentified = sorted({r.group for r in loaded.snapshot.replicas if not r.identified})
        for group in unidentified:
            problems.add(
                f"{events.UNIDENTIFIED}: worker group {group!r}: its pods carry neither "
                "ray.io/worker-group-replica-name nor the TPU webhook's replicaIndex "
                "(KubeRay < 1.6 or the feature gate off), so which pods form a slice is "
                "unknown: its replicas are never removed; scale-up continues in whole replicas"
            )
        self.metrics.invalid_groups.set(len({p.group for p in loaded.shapes.errors}))
        for problem in sorted(problems - self.memory.announced_problems):
            reason, _, message = problem.partition(": ")
            log.warning(message, extra={"reason": reason, "cluster": self._where})
            self._event(raw, reason, message, "Warning")
        self.memory.announced_problems = problems

    def _announce(self, raw: dict[str, Any], loaded: LoadedSnapshot, decided: Plan) -> None:
        shapes = {s.group: s for s in loaded.snapshot.shapes}
        for launch in decided.launch:
            hosts = shapes[launch.group].hosts_per_replica if launch.group in shapes else 0
            message = (
                f"launching {launch.replicas} replica(s) of {launch.group} "
                f"({hosts} hosts each): {launch.reason}"
            )
            log.info(message, extra={"group": launch.group, "replicas": launch.replicas})
            self.metrics.launched.labels(launch.group).inc(launch.replicas)
            self._event(raw, events.LAUNCH, message, "Normal")
        for removal in decided.terminate:
            cause = (
                "idle"
                if removal.idle
                else "provisioning_timeout"
                if removal.provisioning_timeout
                else "unhealthy"
            )
            message = (
                f"removing replica {removal.replica} of {removal.group} "
                f"(pods {', '.join(removal.pods)}): {removal.reason}"
            )
            log.info(message, extra={"group": removal.group, "replica": removal.replica})
            self.metrics.removed.labels(removal.group, cause).inc()
            self._event(raw, events.REMOVE, message, "Normal")
        infeasible = {u.demand: u.reason for u in decided.infeasible}
        for demand in sorted(set(infeasible) - self.memory.announced_infeasible):
            message = f"{demand}: {infeasible[demand]}"
            log.warning(message, extra={"reason": events.INFEASIBLE})
            self._event(raw, events.INFEASIBLE, message, "Warning")
        self.memory.announced_infeasible = set(infeasible)

    def _announce_failure(self, raw: dict[str, Any], exc: Exception) -> None:
        self._event(raw, events.APPLY_FAILED, f"could not apply the plan: {exc}", "Warning")

    def _event(
        self, raw: dict[str, Any], reason: str, message: str, kind: events.EventType
    ) -> None:
        """Events are best effort: a failure to record one never stops a round."""
        try:
            self.kube.create_event(
                self.namespace, events.cluster_event(raw, reason, message, kind, self.clock())
            )
        except ApiError as exc:
            self.metrics.api_errors.labels("kubernetes", "create_event").inc()
            log.warning("could not record event", extra={"detail": str(exc)})

    def _failed(self, operation: str, exc: Exception, replans: int) -> Round:
        api = "gcs" if isinstance(exc, GcsUnavailable) else "kubernetes"
        if not isinstance(exc, ManifestError | Conflict):
            self.metrics.api_errors.labels(api, operation).inc()
        log.error(
            f"round abandoned at {operation}: {exc}",
            extra={"operation": operation, "cluster": self._where},
        )
        return Round(None, False, replans, error=f"{operation}: {exc}")

    # --- measure and report -------------------------------------------------------------

    def _measure(self, loaded: LoadedSnapshot, decided: Plan) -> None:
        metrics = self.metrics
        counts = Tally((r.group, r.state.value) for r in loaded.snapshot.replicas)
        metrics.slices.clear()
        for shape in loaded.snapshot.shapes:
            for state in SLICE_STATES:
                metrics.slices.labels(shape.group, state).set(counts[(shape.group, state)])
        metrics.pending_bundles.set(decided.bundles_unmet)
        metrics.infeasible.set(len(decided.infeasible))

    def _report(self, ray: RayState, after: ClusterSnapshot, decided: Plan) -> None:
        """`ray status` shows what Ray's own autoscaler would: launches asked for,
        hosts starting, demand no group can serve. Best effort, like Ray's."""
        shapes = {s.group: s for s in after.shapes}
        requested: Tally[str] = Tally()
        asked_at: dict[str, float] = {}
        starting: list[StartingHost] = []
        for replica in after.replicas:
            shape = shapes.get(replica.group)
            if shape is None:
                continue
            if replica.state is ReplicaState.REQUESTED:
                requested[replica.group] += shape.hosts_per_replica
                asked_at[replica.group] = min(
                    asked_at.get(replica.group, replica.created_at_s), replica.created_at_s
                )
            elif replica.state is ReplicaState.PENDING:
                starting.extend(
                    StartingHost(
                        replica.group,
                        h.pod_name,
                        f"slice {replica.slice_name or replica.name}: waiting for its hosts",
                    )
                    for h in replica.hosts
                    if not h.registered
                )
        memory = self.memory
        memory.state_version = max(memory.state_version + 1, int(self.clock() * 1000))
        state = autoscaling_state(
            ray,
            memory.state_version,
            [PendingHosts(g, n, asked_at[g]) for g, n in sorted(requested.items())],
            starting,
            [u.demand for u in decided.infeasible],
        )
        try:
            self.gcs.report_autoscaling_state(state.SerializeToString())
        except GcsUnavailable as exc:
            self.metrics.api_errors.labels("gcs", "report").inc()
            log.warning("could not report autoscaling state", extra={"detail": str(exc)})
