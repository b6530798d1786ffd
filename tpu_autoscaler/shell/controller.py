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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, KubeApi
from tpu_autoscaler.adapters.kube.guarded import GuardedApply, Proposal
from tpu_autoscaler.adapters.kube.observe import Observation, Observer
from tpu_autoscaler.adapters.kube.patches import plan_patch
from tpu_autoscaler.adapters.ray.gcs import (
    GcsApi,
    GcsUnavailable,
    read_ray_state,
)
from tpu_autoscaler.adapters.ray.state import NodeMemory
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, assemble
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import plan as slice_plan
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.core.snapshot import (
    LaunchFailures,
    PolicyConfig,
    Replica,
)
from tpu_autoscaler.shell.announcer import Announcer
from tpu_autoscaler.shell.drain import Drainer
from tpu_autoscaler.shell.metrics import AutoscalerMetrics

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
    registered_at: dict[str, float] = field(default_factory=dict)
    """When each host (by pod name) was first seen in Ray."""
    ray_nodes: NodeMemory = field(default_factory=NodeMemory)
    """What was parsed from which node message."""


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
        self.memory = _Memory(observer=Observer(namespace, name))
        self.announcer = Announcer(self, namespace, self._where)
        self.drainer = Drainer(self, self.announcer.event)

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

        def propose() -> Proposal[Plan]:
            nonlocal refused, decision_s, loaded, raw
            try:
                observed, loaded = self._read()
            except (ApiError, GcsUnavailable, ManifestError) as exc:
                raise _Abandoned("read", exc) from exc
            raw = observed.raw
            self.announcer.problems(observed.raw, loaded)
            started = self.timer()
            decided = self.drainer.with_owed(self.decide(loaded), loaded)
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
            existing = {p.name for p in loaded.pods}
            return Proposal(observed.raw, decided, plan_patch(loaded.cluster, decided, existing))

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
        self.drainer.landed()
        after = loaded.snapshot.after(decided)
        self.memory.launch_failures = dict(after.launch_failures)
        self.announcer.decisions(raw, loaded, decided)
        self.announcer.measure(loaded, decided)
        self.announcer.report(loaded.ray, after, decided)
        return Round(decided, True, applier.replans, refused, decision_s, applier.rebases)

    # --- read -------------------------------------------------------------------------

    def _read(self) -> tuple[Observation, LoadedSnapshot]:
        """The RayCluster and its pods (parsed as an informer would), and the GCS."""
        observed = self.memory.observer.read(self.kube)
        ray = read_ray_state(self.gcs, self.memory.ray_nodes)
        loaded = assemble(observed.cluster, list(observed.pods), ray, self.clock(), self.config)
        snapshot = replace(
            loaded.snapshot,
            replicas=self._with_registration_times(self.drainer.retiring_as_draining(loaded)),
            launch_failures=dict(self.memory.launch_failures),
        )
        return observed, replace(loaded, snapshot=snapshot)

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
