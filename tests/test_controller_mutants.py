"""Behaviour of the production round (`controller.Autoscaler.step`) pinned where
mutation testing found the suite silent: what a failed round returns and logs, how
many status writes one patch absorbs, the Event type of a failed apply, the loop and
decision timings, and a slice retired after a partial drain whose dead hosts the GCS
no longer lists."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from ray.core.generated import autoscaler_pb2

from tests.racing import WritesBeforePatches
from tests.test_controller import (
    SLICE_TASKS,
    SLICE_WORK,
    _cluster,
    _events,
    _flaky,
    _sample,
    _sim,
    _submit,
)
from tpu_autoscaler.adapters.kube.api import Unavailable
from tpu_autoscaler.adapters.kube.guarded import MAX_REPLANS
from tpu_autoscaler.adapters.ray.gcs import GcsUnavailable
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane.store import DEFAULT_GRACE_S, ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import PolicyConfig
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.controller import Autoscaler, Round, UnguardedPlan
from tpu_autoscaler.sim.cluster import SimulatedCluster


def _slices_replicas(sim: SimulatedCluster) -> int:
    spec = sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"]
    (replicas,) = [g["replicas"] for g in spec if g["groupName"] == "slices"]
    return int(replicas)


# --- conflicts ----------------------------------------------------------------------------


def test_a_round_lands_through_a_status_write_before_every_patch() -> None:
    """KubeRay at fleet scale (4,096 slices) writes the status after every reconcile
    while pods change, up to 100 times a second: one lands between every read and
    patch. The round's patch absorbs it with one patch guarded by the generation
    (before, each re-sent resourceVersion was stale again and the round failed)."""
    sim = _sim()
    kube = WritesBeforePatches(sim.store, 1_000, spec=False)
    sim.autoscaler.kube = kube  # type: ignore[assignment]
    _submit(sim, SLICE_WORK, duration=10_000)
    outcome = sim.autoscaler.step()
    assert (outcome.applied, outcome.rebases, outcome.replans) == (True, 1, 0)
    assert outcome.drains_refused == 0
    assert kube.patches == 2
    assert _sample(sim, "tpu_autoscaler_patch_conflicts_total") == 1
    assert _slices_replicas(sim) == 1


def test_a_round_whose_every_patch_meets_a_spec_edit_gives_up_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    kube = WritesBeforePatches(sim.store, 100, spec=True)
    sim.autoscaler.kube = kube  # type: ignore[assignment]
    _submit(sim, SLICE_WORK, duration=10_000)
    with caplog.at_level(logging.ERROR, logger="tpu_autoscaler"):
        outcome = sim.autoscaler.step()
    assert outcome.applied is False and outcome.plan is None
    assert outcome.replans == MAX_REPLANS == kube.patches
    assert outcome.error is not None and outcome.error.startswith("patch: ")
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith("round abandoned at patch: ")
    assert (record.operation, record.cluster) == ("patch", "default/ctl")  # type: ignore[attr-defined]
    assert _slices_replicas(sim) == 0
    # A conflict is no API error.
    assert not _sample(sim, "tpu_autoscaler_api_errors_total", api="kubernetes", operation="patch")


def test_a_round_that_cannot_read_returns_its_error_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    _flaky(sim).down = True
    with caplog.at_level(logging.ERROR, logger="tpu_autoscaler"):
        outcome = sim.autoscaler.step()
    assert (outcome.plan, outcome.applied, outcome.replans) == (None, False, 0)
    assert outcome.error == "read: raycluster: 503"
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "round abandoned at read: raycluster: 503"
    assert (record.operation, record.cluster) == ("read", "default/ctl")  # type: ignore[attr-defined]


def test_a_patch_that_may_not_have_landed_is_a_warning_event() -> None:
    sim = _sim()
    _flaky(sim).lose_patch_response = True
    _submit(sim, SLICE_WORK, duration=10_000)
    outcome = sim.autoscaler.step()
    assert not outcome.applied
    assert outcome.error == "patch: raycluster: connection dropped after the write"
    (failed,) = [e for e in sim.store.events if e["reason"] == events.APPLY_FAILED]
    assert failed["type"] == "Warning"
    assert failed["message"].startswith("could not apply the plan: ")


# --- timings ------------------------------------------------------------------------------


def test_the_loop_and_the_decision_are_timed_by_the_timer() -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=10_000)
    ticks = iter([100.0, 101.0, 103.5, 110.0])  # round start, decide start/end, round end
    sim.autoscaler.timer = lambda: next(ticks)
    outcome = sim.autoscaler.step()
    assert outcome.applied and outcome.decision_s == 2.5
    assert _sample(sim, "tpu_autoscaler_decision_seconds_sum") == 2.5
    assert _sample(sim, "tpu_autoscaler_loop_duration_seconds_sum") == 10.0


# --- a slice retired after a partial drain ---------------------------------------------


def _gcs_forgets_dead_nodes(sim: SimulatedCluster) -> None:
    """The GCS keeps a bounded cache of dead nodes: in a busy cluster the nodes of a
    drained host are soon gone from its state, as if they had never joined."""
    read = sim.gcs.get_cluster_resource_state
    dead = autoscaler_pb2.NodeStatus.Value("DEAD")

    def without_dead() -> bytes:
        reply = autoscaler_pb2.GetClusterResourceStateReply.FromString(read())
        nodes = reply.cluster_resource_state.node_states
        alive = [n for n in nodes if n.status != dead]
        del nodes[:]
        nodes.extend(alive)
        return reply.SerializeToString()

    sim.gcs.get_cluster_resource_state = without_dead  # type: ignore[method-assign]


def test_a_slice_retired_after_a_partial_drain_is_removed_when_its_work_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hosts 0 and 1 accept an idle drain, host 2 refuses (work arrived): the slice is
    broken and its other hosts are retired. When the work ends, the slice is removed
    whole at once, for the partial drain, even when the GCS no longer lists its dead
    hosts (the pods then look like a slice still coming up, which would otherwise
    wait out the provisioning timeout and start a backoff)."""
    sim = _sim()
    _gcs_forgets_dead_nodes(sim)
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 4, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 60)
    arrived = False
    messages: dict[str, str] = {}
    drain = sim.gcs.drain_node

    def work_arrives_at_host_2(node_id: str, reason: int, message: str, *args: Any) -> Any:
        nonlocal arrived
        node = next(n for n in sim.ray.nodes.values() if n.node_id.hex() == node_id)
        worker = node.labels[labels.RAY_TPU_WORKER_ID]
        messages.setdefault(worker, message)
        if worker == "2" and not arrived:
            arrived = True
            late = {"resources": {"TPU": 4}, "label_selector": {labels.RAY_TPU_WORKER_ID: "2"}}
            _submit(sim, {"task": late}, duration=30)
        return drain(node_id, reason, message, *args)

    sim.gcs.drain_node = work_arrives_at_host_2  # type: ignore[method-assign]
    sim.events.run_until(100.0)
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        while not arrived and sim.events.now_s < 400.0:
            sim.events.run_until(sim.events.now_s + 1.0)
    assert arrived
    (replica,) = [r for r in messages["0"].split() if r.startswith("slices-")]
    (retired,) = [r for r in caplog.records if "sibling refused" in r.getMessage()]
    assert retired.getMessage() == (
        "hosts drained before a sibling refused; the slice is retired whole as its work ends"
    )
    assert retired.levelno == logging.WARNING
    assert retired.replica == replica  # type: ignore[attr-defined]
    assert len(retired.drained) == 2 and len(retired.retired) == 2  # type: ignore[attr-defined]
    assert messages["0"] == messages["2"] != messages["3"]
    assert messages["0"].startswith(f"tpu-autoscaler: slice {replica} idle: all 4 hosts idle")
    assert messages["3"] == f"tpu-autoscaler: slice {replica} lost hosts to a drain"
    assert _slices_replicas(sim) == 1
    sim.events.run_until(sim.events.now_s + 25.0)
    assert _slices_replicas(sim) == 1  # the task (30 s) still runs on host 2
    sim.events.run_until(sim.events.now_s + 15.0)
    assert _slices_replicas(sim) == 0
    (removal,) = _events(sim.store, events.REMOVE)
    assert removal.endswith(
        ": 2 host(s) drained before a sibling refused; the rest retired and now without work"
    )
    assert _sample(sim, "tpu_autoscaler_replicas_removed_total", group="slices", cause="unhealthy")
    assert not _sample(sim, "tpu_autoscaler_replicas_removed_total", group="slices", cause="idle")
    sim.events.run_until(sim.events.now_s + DEFAULT_GRACE_S + 60.0)
    timeouts = {"group": "slices", "cause": "provisioning_timeout"}
    assert not _sample(sim, "tpu_autoscaler_replicas_removed_total", **timeouts)
    assert sim.metrics.busy_replicas_terminated == 0
    assert len(sim.ray.finished) == 5 and sim.violations == []


# --- drains -------------------------------------------------------------------------------


def _record_rounds(sim: SimulatedCluster) -> list[Round]:
    rounds: list[Round] = []
    step = sim.autoscaler.step

    def recording() -> Round:
        rounds.append(step())
        return rounds[-1]

    sim.autoscaler.step = recording  # type: ignore[method-assign]
    return rounds


def _two_idle_slices_soon(sim: SimulatedCluster) -> None:
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 8, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 60)


def test_a_gcs_outage_at_the_drain_abandons_the_round_and_removes_nothing() -> None:
    sim = _sim()
    rounds = _record_rounds(sim)
    _two_idle_slices_soon(sim)

    def gcs_down(*_: Any) -> Any:
        raise GcsUnavailable("GCS 127.0.0.1:6379: draining: deadline exceeded")

    sim.gcs.drain_node = gcs_down  # type: ignore[method-assign]
    sim.events.run_until(400.0)
    failed = [r for r in rounds if r.error is not None]
    assert failed, "no round reached a drain"
    assert all(
        (r.plan, r.applied, r.replans, r.error)
        == (None, False, 0, "drain: GCS 127.0.0.1:6379: draining: deadline exceeded")
        for r in failed
    )
    assert _slices_replicas(sim) == 2 and _events(sim.store, events.REMOVE) == []
    errors = {"api": "gcs", "operation": "drain"}
    assert _sample(sim, "tpu_autoscaler_api_errors_total", **errors) == len(failed)


def _one_slice_refuses_the_other_drains_into_a_spec_edit(
    sim: SimulatedCluster, refusal: str
) -> None:
    """Run until one of two idle slices drained: the first slice asked refuses its
    drain (with `refusal` as Ray's reason), the other accepts, and the patch that
    removes it meets a spec edit."""
    kube = WritesBeforePatches(sim.store, 0, spec=True)
    sim.autoscaler.kube = kube  # type: ignore[assignment]
    refusing: list[str] = []
    drained: list[str] = []
    drain = sim.gcs.drain_node

    def one_slice_refuses(node_id: str, *args: Any) -> tuple[bool, str]:
        node = next(n for n in sim.ray.nodes.values() if n.node_id.hex() == node_id)
        name = node.labels[labels.RAY_TPU_SLICE_NAME]
        refusing[:] = refusing or [name]
        if name == refusing[0]:
            return False, refusal
        if not drained:
            kube.times = 1  # the patch that removes this slice meets a spec edit
        drained.append(name)
        return drain(node_id, *args)

    sim.gcs.drain_node = one_slice_refuses  # type: ignore[method-assign]
    while not drained and sim.events.now_s < 400.0:
        sim.events.run_until(sim.events.now_s + 1.0)


def test_drains_refused_in_a_round_are_counted_across_its_re_plans() -> None:
    """Two idle slices: one refuses its drain, the other drains and its removal meets a
    spec edit; the re-planned round asks the first again, and is refused again."""
    sim = _sim()
    rounds = _record_rounds(sim)
    _two_idle_slices_soon(sim)
    _one_slice_refuses_the_other_drains_into_a_spec_edit(sim, "work arrived")
    last = rounds[-1]
    assert (last.applied, last.replans, last.drains_refused) == (True, 1, 2)
    assert _sample(sim, "tpu_autoscaler_drains_refused_total", group="slices") == 2
    assert _slices_replicas(sim) == 1


def test_a_slice_drained_before_a_re_plan_is_removed_in_it_as_idle() -> None:
    """The drained slice's removal meets a spec edit; by the re-plan its hosts have
    left Ray (and the GCS, here, no longer lists them, so the policy would take it for
    a slice coming up): it is removed in the re-planned round all the same, as idle.
    The refusing slice's Ray node gave no reason: it is reported as busy."""
    sim = _sim()
    _gcs_forgets_dead_nodes(sim)
    rounds = _record_rounds(sim)
    _two_idle_slices_soon(sim)
    _one_slice_refuses_the_other_drains_into_a_spec_edit(sim, "")
    last = rounds[-1]
    assert (last.applied, last.replans) == (True, 1)
    assert last.plan is not None
    (removal,) = last.plan.terminate
    assert removal.idle and "idle" in removal.reason
    assert _slices_replicas(sim) == 1
    cause = {"group": "slices", "cause": "idle"}
    assert _sample(sim, "tpu_autoscaler_replicas_removed_total", **cause) == 1
    refused = _events(sim.store, events.DRAIN_REFUSED)
    assert len(refused) == 2 and all(m.endswith("would not drain (busy)") for m in refused)


def test_every_host_of_each_idle_slice_is_drained_before_its_removal() -> None:
    sim = _sim()
    _two_idle_slices_soon(sim)
    sim.events.run_until(600.0)
    assert _slices_replicas(sim) == 0
    assert len(_events(sim.store, events.REMOVE)) == 2
    assert sim.gcs.drain_calls == 8
    assert sim.violations == []


def test_a_host_found_busy_when_the_gcs_is_re_read_keeps_the_slice_undrained() -> None:
    """Work lands on host 3 after the round read the GCS and before it drains: the GCS
    is read again just before draining, so no host is asked (an accepted drain cannot
    be taken back) and the slice stays whole."""
    sim = _sim()
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 4, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 60)
    sim.events.run_until(100.0)
    decide = sim.autoscaler.decide
    arrived = False

    def work_arrives_after_the_decision(loaded: LoadedSnapshot) -> Plan:
        nonlocal arrived
        decided = decide(loaded)
        if any(t.idle for t in decided.terminate) and not arrived:
            arrived = True
            late = {"resources": {"TPU": 4}, "label_selector": {labels.RAY_TPU_WORKER_ID: "3"}}
            _submit(sim, {"task": late}, duration=30)
        return decided

    sim.autoscaler.decide = work_arrives_after_the_decision
    while not _events(sim.store, events.DRAIN_REFUSED) and sim.events.now_s < 400.0:
        sim.events.run_until(sim.events.now_s + 1.0)
    (kept,) = [e for e in sim.store.events if e["reason"] == events.DRAIN_REFUSED]
    assert kept["type"] == "Normal"
    assert kept["message"].endswith("would not drain (busy when re-read)")
    assert sim.gcs.drain_calls == 0
    assert len(sim.ray.nodes) == 4 and _slices_replicas(sim) == 1


# --- plans that bring their own patch -----------------------------------------------------


def test_an_unguarded_plan_sends_its_own_patch_without_a_precondition() -> None:
    sim = _sim()
    kube = WritesBeforePatches(sim.store, 1, spec=True)
    sim.autoscaler.kube = kube  # type: ignore[assignment]
    op = {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}
    sim.autoscaler.decide = lambda _: UnguardedPlan(operations=(op,))
    outcome = sim.autoscaler.step()
    assert (outcome.applied, outcome.replans, outcome.rebases) == (True, 0, 0)
    assert kube.patches == 1
    assert _slices_replicas(sim) == 2


# --- reading ------------------------------------------------------------------------------


class _Corrupting:
    """The API server returning objects that break the schema."""

    def __init__(self, store: ObjectStore, cluster: bool, pod: bool) -> None:
        self.store = store
        self.cluster = cluster
        self.pod = pod

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        raw = self.store.get_raycluster(namespace, name)
        if self.cluster:
            raw["spec"]["workerGroupSpecs"][0]["maxReplicas"] = {"not": "a number"}
        return raw

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        pods = self.store.list_pods(namespace, selector)
        if self.pod and pods:
            pods[0]["metadata"]["labels"] = ["not", "a", "mapping"]
        return pods


@pytest.mark.parametrize(
    ("cluster", "pod", "where"),
    [(True, False, "raycluster default/ctl"), (False, True, "pods of default/ctl")],
)
def test_an_object_that_does_not_parse_abandons_the_read_naming_its_source(
    cluster: bool, pod: bool, where: str
) -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=10_000)
    sim.events.run_until(30.0)  # pods exist
    sim.autoscaler.kube = _Corrupting(sim.store, cluster, pod)  # type: ignore[assignment]
    sim.autoscaler.memory.observer.forget()  # a new process: nothing parsed yet
    outcome = sim.autoscaler.step()
    assert not outcome.applied
    assert outcome.error is not None and outcome.error.startswith("read: ")
    assert where in outcome.error


def test_pods_of_another_raycluster_in_the_namespace_are_not_counted() -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=10_000)
    sim.events.run_until(300.0)
    for pod in sim.store.list_pods("default", {labels.KUBERAY_CLUSTER: "ctl"}):
        meta = pod["metadata"]
        foreign_labels = {
            **meta["labels"],
            labels.KUBERAY_CLUSTER: "other",
            labels.KUBERAY_REPLICA_NAME: "slices-other",
        }
        foreign = {
            **pod,
            "metadata": {
                "name": f"other-{meta['name']}",
                "namespace": "default",
                "labels": foreign_labels,
                "creationTimestamp": meta.get("creationTimestamp"),
            },
        }
        sim.store.create_pod(foreign)
    outcome = sim.autoscaler.step()
    assert outcome.applied
    assert _sample(sim, "tpu_autoscaler_slices", group="slices", state="running") == 1
    assert _sample(sim, "tpu_autoscaler_slices", group="slices", state="pending") == 0


# --- what a round carries and passes on ---------------------------------------------------


def test_the_configured_provisioning_timeout_and_its_backoff_hold_across_rounds() -> None:
    """A slice slower to come than the configured provisioning timeout (not the
    default), GKE telling no stockout: it is removed at that timeout, and the group
    backs off before launching again."""
    config = PolicyConfig(provisioning_timeout_s=120.0)
    sim = SimulatedCluster(_cluster(), provisioning_delay=lambda _: 1000.0, policy_config=config)
    sim.events.run_until(0.0)
    seen: list[tuple[float, Round]] = []
    step = sim.autoscaler.step

    def recording() -> Round:
        seen.append((sim.events.now_s, step()))
        return seen[-1][1]

    sim.autoscaler.step = recording  # type: ignore[method-assign]
    retried = {"slice_placement_group": {**SLICE_WORK["slice_placement_group"], "retries": -1}}
    _submit(sim, retried, duration=10_000)
    sim.events.run_until(400.0)
    launches = [t for t, r in seen if r.plan is not None and r.plan.launch]
    timeouts = [
        t
        for t, r in seen
        if r.plan is not None and any(x.provisioning_timeout for x in r.plan.terminate)
    ]
    assert timeouts and timeouts[0] < launches[0] + config.provisioning_timeout_s + 15.0
    relaunch = next(t for t in launches if t > timeouts[0])
    assert relaunch >= timeouts[0] + config.backoff_base_s
    cause = {"group": "slices", "cause": "provisioning_timeout"}
    assert _sample(sim, "tpu_autoscaler_replicas_removed_total", **cause)


def test_a_told_stockout_keeps_the_launch_past_its_timeout_while_demand_waits() -> None:
    """No capacity at all: GKE's FailedScaleUp Events explain the wait, so the pending
    slice the demand waits on stays past the provisioning timeout, first in line for
    capacity, and nothing is launched beside it."""
    config = PolicyConfig(provisioning_timeout_s=120.0)
    sim = _sim(policy_config=config, capacity={"slices": 0})
    retried = {"slice_placement_group": {**SLICE_WORK["slice_placement_group"], "retries": -1}}
    _submit(sim, retried, duration=10_000)
    sim.events.run_until(400.0)
    removed = {"group": "slices", "cause": "provisioning_timeout"}
    assert not _sample(sim, "tpu_autoscaler_replicas_removed_total", **removed)
    assert _slices_replicas(sim) == 1
    sim.gke.set_capacity("slices", None)
    sim.events.run_until(600.0)
    assert not sim.ray.pending and sim.ray.running, "the slice came and the job runs"
    assert not _sample(sim, "tpu_autoscaler_replicas_removed_total", **removed)


def test_a_busy_slice_that_joined_long_ago_offers_what_ray_reports_free() -> None:
    """Hosts offer their total only while they settle after joining Ray: a slice that
    has been busy for minutes holds no more work, so more of it launches a slice."""
    sim = _sim()
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    work = {"count": 4, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}
    _submit(sim, work, duration=10_000)
    sim.events.run_until(300.0)
    assert _slices_replicas(sim) == 1
    _submit(sim, work, duration=10_000)
    sim.events.run_until(330.0)
    assert _slices_replicas(sim) == 2


def test_without_drain_before_removal_an_idle_slice_goes_without_drains() -> None:
    sim = _sim()
    sim.autoscaler.drain_before_removal = False
    _submit(
        sim,
        SLICE_TASKS
        | {"task": {"resources": {"TPU": 4}, "label_selector": {"ray.io/tpu-pod-type": "v6e-16"}}},
        60,
    )
    sim.events.run_until(600.0)
    assert _slices_replicas(sim) == 0
    assert sim.gcs.drain_calls == 0
    (removal,) = _events(sim.store, events.REMOVE)
    assert "idle" in removal


def test_a_slice_whose_raylet_died_is_removed_without_asking_the_rest_to_drain() -> None:
    """One host's Ray node dies while its pod still runs: the slice is unusable and is
    removed whole at once, although its other hosts are busy; no drain is asked of
    them (they would refuse, and the broken slice would stay)."""
    sim = _sim()
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 4, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 10_000)
    sim.events.run_until(300.0)
    pods = sorted(p["metadata"]["name"] for p in sim.store.list_pods("default", {}))
    victim = next(p for p in pods if p in sim.ray.nodes)
    sim.ray.remove_node(victim)
    sim.events.run_until(330.0)
    assert sim.gcs.drain_calls == 0
    (removal,) = _events(sim.store, events.REMOVE)
    assert victim in removal and "dead" in removal


def test_replicas_that_cannot_be_told_apart_are_explained_once_with_the_labels_to_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    _flaky(sim).strip_replica_labels = True
    _submit(sim, SLICE_WORK, duration=60)
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        sim.events.run_until(300.0)
    (said,) = [e for e in sim.store.events if e["reason"] == events.UNIDENTIFIED]
    assert said["type"] == "Warning"
    assert said["message"] == (
        "worker group 'slices': its pods carry neither ray.io/worker-group-replica-name "
        "nor the TPU webhook's replicaIndex (KubeRay < 1.6 or the feature gate off), so "
        "which pods form a slice is unknown: its replicas are never removed; scale-up "
        "continues in whole replicas"
    )
    (record,) = [r for r in caplog.records if "never removed" in r.getMessage()]
    assert record.getMessage() == said["message"]
    assert (record.reason, record.cluster) == (events.UNIDENTIFIED, "default/ctl")  # type: ignore[attr-defined]


# --- announcements ------------------------------------------------------------------------


def _announced(sim: SimulatedCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in sim.store.events if e["reason"] == reason]


def test_launches_and_removals_are_announced_as_normal_events_and_info_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    _two_idle_slices_soon(sim)
    with caplog.at_level(logging.INFO, logger="tpu_autoscaler"):
        sim.events.run_until(600.0)
    (launch,) = _announced(sim, events.LAUNCH)
    assert launch["type"] == "Normal"
    assert launch["message"].startswith("launching 2 replica(s) of slices (4 hosts each): ")
    (launched,) = [r for r in caplog.records if r.getMessage() == launch["message"]]
    assert launched.levelno == logging.INFO
    assert (launched.group, launched.replicas) == ("slices", 2)  # type: ignore[attr-defined]
    removals = _announced(sim, events.REMOVE)
    assert len(removals) == 2
    for removal in removals:
        assert removal["type"] == "Normal"
        assert removal["message"].startswith("removing replica slices-")
        pods = removal["message"].split("(pods ", 1)[1].split("): ", 1)[0].split(", ")
        assert len(pods) == 4 and all(p.startswith("ctl-slices-worker-") for p in pods)
        (removed,) = [r for r in caplog.records if r.getMessage() == removal["message"]]
        assert removed.levelno == logging.INFO
        assert removed.group == "slices"  # type: ignore[attr-defined]
        assert removed.replica in removal["message"]  # type: ignore[attr-defined]
    cause = {"group": "slices", "cause": "idle"}
    assert _sample(sim, "tpu_autoscaler_replicas_removed_total", **cause) == 2


def test_infeasible_demand_is_a_warning_event_and_line(caplog: pytest.LogCaptureFixture) -> None:
    sim = _sim()
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        _submit(sim, {"task": {"resources": {"TPU": 4, "CPU": 1000}}})
        sim.events.run_until(30.0)
    (event,) = _announced(sim, events.INFEASIBLE)
    assert event["type"] == "Warning"
    (line,) = [r for r in caplog.records if r.getMessage() == event["message"]]
    assert line.levelno == logging.WARNING
    assert line.reason == events.INFEASIBLE  # type: ignore[attr-defined]


class _NoEvents:
    """The API server refusing Events (RBAC, quota): everything else works."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        raise Unavailable("events: 403 forbidden")


def test_an_event_that_cannot_be_recorded_is_counted_and_logged_and_the_round_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    sim.autoscaler.kube = _NoEvents(sim.store)  # type: ignore[assignment]
    _round_stands_with_one_error_counted(
        sim,
        caplog,
        ("kubernetes", "create_event"),
        "could not record event",
        "events: 403 forbidden",
    )


def _round_stands_with_one_error_counted(
    sim: SimulatedCluster,
    caplog: pytest.LogCaptureFixture,
    api_operation: tuple[str, str],
    message: str,
    detail: str,
) -> None:
    """A round whose side call (an Event, the GCS report) fails: the patch lands, the
    error is counted once under (api, operation) and logged once as a warning."""
    _submit(sim, SLICE_WORK, duration=10_000)
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        outcome = sim.autoscaler.step()
    assert outcome.applied and _slices_replicas(sim) == 1
    api, operation = api_operation
    errors = {"api": api, "operation": operation}
    assert _sample(sim, "tpu_autoscaler_api_errors_total", **errors) == 1
    (line,) = [r for r in caplog.records if r.getMessage() == message]
    assert line.levelno == logging.WARNING
    assert line.detail == detail  # type: ignore[attr-defined]


# --- what `ray status` is told -------------------------------------------------------------


def test_ray_status_is_told_every_host_asked_for_and_every_host_starting() -> None:
    sim = _sim()
    _two_idle_slices_soon(sim)  # two slices at once
    sim.autoscaler.step()
    (pending,) = sim.ray.autoscaling_state.pending_instance_requests
    assert (pending.ray_node_type_name, pending.count) == ("slices", 8)
    sim.events.run_until(10.0)  # KubeRay made the pods
    starting = sim.ray.autoscaling_state.pending_instances
    assert len(starting) == 8
    names = {
        p["metadata"]["name"]: next(
            e["value"] for e in p["spec"]["containers"][0]["env"] if e["name"] == "TPU_NAME"
        )
        for p in sim.store.list_pods("default", {labels.KUBERAY_GROUP: "slices"})
    }
    for instance in starting:
        assert instance.details == f"slice {names[instance.instance_id]}: waiting for its hosts"


def test_state_versions_keep_increasing_within_a_second_and_across_a_restart() -> None:
    sim = _sim()
    versions = []
    sim.autoscaler.clock = lambda: 0.0
    for _ in range(3):  # rounds within one millisecond
        sim.autoscaler.step()
        versions.append(sim.ray.autoscaling_state.autoscaler_state_version)
    sim.autoscaler.clock = lambda: sim.events.now_s
    sim.events.run_until(60.0)
    versions.append(sim.ray.autoscaling_state.autoscaler_state_version)
    restarted = Autoscaler(
        sim.autoscaler.kube,
        sim.autoscaler.gcs,
        "default",
        "ctl",
        clock=lambda: sim.events.now_s,
        config=sim.policy_config,
    )
    restarted.step()  # a new process: no memory of the versions reported
    versions.append(sim.ray.autoscaling_state.autoscaler_state_version)
    assert versions == sorted(set(versions))


def test_a_report_the_gcs_cannot_take_is_counted_and_the_round_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()

    def gcs_down(_: bytes) -> None:
        raise GcsUnavailable("GCS 127.0.0.1:6379: reporting: deadline exceeded")

    sim.gcs.report_autoscaling_state = gcs_down  # type: ignore[method-assign]
    _round_stands_with_one_error_counted(
        sim,
        caplog,
        ("gcs", "report"),
        "could not report autoscaling state",
        "GCS 127.0.0.1:6379: reporting: deadline exceeded",
    )


def test_an_autoscaler_made_with_defaults_drains_an_idle_slice_before_removing_it() -> None:
    sim = _sim()
    sim.autoscaler = Autoscaler(
        sim.autoscaler.kube, sim.autoscaler.gcs, "default", "ctl", clock=lambda: sim.events.now_s
    )
    _two_idle_slices_soon(sim)
    sim.events.run_until(600.0)
    assert _slices_replicas(sim) == 0
    assert sim.gcs.drain_calls == 8
