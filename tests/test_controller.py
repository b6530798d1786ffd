"""The production round (`controller.Autoscaler`) in the simulated cluster: Events,
metrics and the GCS report; drains refused and taken; conflicts, lost responses and
outages of either API; a RayCluster edited to an invalid group while running; and a
crash at every step boundary of a scale-up and a scale-down."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.adapters.kube.api import JsonPatch, Unavailable
from tpu_autoscaler.adapters.kube.pods import timestamp_s
from tpu_autoscaler.adapters.ray.gcs import GcsUnavailable
from tpu_autoscaler.controlplane.store import DEFAULT_GRACE_S, ObjectStore
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.shell import events, readiness
from tpu_autoscaler.shell.controller import Autoscaler, Round, decide_by_slices
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import WorkItem

IDLE_TIMEOUT_S = 60


def _cluster() -> dict[str, Any]:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    return raycluster(
        tpu_group(
            "slices", catalog.slice_type(v6e, "4x4"), 0, 3, idleTimeoutSeconds=IDLE_TIMEOUT_S
        ),
        tpu_group(
            "singles", catalog.slice_type(v6e, "2x4", 8), 0, 3, idleTimeoutSeconds=IDLE_TIMEOUT_S
        ),
        name="ctl",
    )


def _sim(**kwargs: Any) -> SimulatedCluster:
    sim = SimulatedCluster(_cluster(), provisioning_delay=lambda _: 60.0, **kwargs)
    sim.events.run_until(0.0)
    return sim


def _submit(sim: SimulatedCluster, work: dict[str, Any], duration: float = 120.0) -> None:
    sim.submit(WorkItem.model_validate({"at": sim.events.now_s, "duration": duration, **work}))


SLICE_TASKS = {"count": 4, "task": {"resources": {"TPU": 4}}}
"""Four hosts' worth of work on the multi-host group only (8-chip singles fit too,
so pin them)."""
SLICE_WORK = {
    "slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"},
}


def _replicas(sim: SimulatedCluster, group: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for pod in sim.store.list_pods("default", {labels.KUBERAY_GROUP: group}):
        key = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_NAME, pod["metadata"]["name"])
        found.setdefault(key, []).append(pod["metadata"]["name"])
    return found


def _events(store: ObjectStore, reason: str) -> list[str]:
    return [e["message"] for e in store.events if e["reason"] == reason]


def _sample(sim: SimulatedCluster, name: str, **label_values: str) -> float | None:
    value: float | None = sim.autoscaler.metrics.registry.get_sample_value(name, label_values)
    return value


def test_a_launch_is_announced_measured_and_reported_to_the_gcs() -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK)
    sim.events.run_until(5.0)
    (launch,) = _events(sim.store, events.LAUNCH)
    assert "1 replica(s) of slices (4 hosts each)" in launch
    event = sim.store.events[0]
    assert event["involvedObject"]["kind"] == "RayCluster"
    assert event["involvedObject"]["name"] == "ctl"
    assert _sample(sim, "tpu_autoscaler_replicas_launched_total", group="slices") == 1
    # `ray status` reads the pending launch from the state the autoscaler reported.
    reported = sim.ray.autoscaling_state
    (pending,) = reported.pending_instance_requests
    assert (pending.ray_node_type_name, pending.count) == ("slices", 4)
    sim.events.run_until(10.0)  # KubeRay made the pods: hosts starting, not requested
    reported = sim.ray.autoscaling_state
    assert not reported.pending_instance_requests
    assert len(reported.pending_instances) == 4
    assert _sample(sim, "tpu_autoscaler_slices", group="slices", state="pending") == 1
    sim.events.run_until(200.0)
    assert _sample(sim, "tpu_autoscaler_slices", group="slices", state="running") == 1
    assert len(_events(sim.store, events.LAUNCH)) == 1


def test_infeasible_demand_is_announced_once_and_reported() -> None:
    sim = _sim()
    _submit(sim, {"task": {"resources": {"TPU": 4, "CPU": 1000}}})
    sim.events.run_until(30.0)
    (message,) = _events(sim.store, events.INFEASIBLE)
    assert "CPU: 1000" in message
    assert len(sim.ray.autoscaling_state.infeasible_resource_requests) == 1
    assert _sample(sim, "tpu_autoscaler_infeasible_demands") == 1
    assert _replicas(sim, "slices") == {} and _replicas(sim, "singles") == {}


def test_idle_replica_is_drained_worker_0_first_then_removed_whole() -> None:
    sim = _sim()
    _submit(
        sim,
        SLICE_TASKS
        | {"task": {"resources": {"TPU": 4}, "label_selector": {"ray.io/tpu-pod-type": "v6e-16"}}},
        duration=60,
    )
    calls: list[str] = []
    drain = sim.gcs.drain_node

    def recording(node_id: str, *args: Any) -> tuple[bool, str]:
        node = next(n for n in sim.ray.nodes.values() if n.node_id.hex() == node_id)
        calls.append(node.labels[labels.RAY_TPU_WORKER_ID])
        return drain(node_id, *args)

    sim.gcs.drain_node = recording  # type: ignore[method-assign]
    sim.events.run_until(600.0)
    assert _replicas(sim, "slices") == {}
    assert calls == ["0", "1", "2", "3"]
    (removal,) = _events(sim.store, events.REMOVE)
    assert "idle" in removal
    assert sim.violations == []


def test_work_arriving_mid_drain_finishes_and_the_slice_then_goes_whole() -> None:
    sim = _sim()
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 4, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 60)
    arrived = False
    drain = sim.gcs.drain_node

    def work_arrives_at_host_2(node_id: str, *args: Any) -> tuple[bool, str]:
        nonlocal arrived
        node = next(n for n in sim.ray.nodes.values() if n.node_id.hex() == node_id)
        if node.labels[labels.RAY_TPU_WORKER_ID] == "2" and not arrived:
            arrived = True  # between the autoscaler's read and this host's drain
            late = {"resources": {"TPU": 4}, "label_selector": {labels.RAY_TPU_WORKER_ID: "2"}}
            _submit(sim, {"task": late}, duration=30)
        return drain(node_id, *args)

    sim.gcs.drain_node = work_arrives_at_host_2  # type: ignore[method-assign]
    sim.events.run_until(100.0)
    before = _replicas(sim, "slices")
    assert len(before) == 1
    # The slice's pods turn Running one by one; all idle once the tasks end; drained
    # one idle timeout (60 s) later, when host 2 takes the task that just arrived.
    while not arrived and sim.events.now_s < 400.0:
        sim.events.run_until(sim.events.now_s + 1.0)
    assert arrived
    assert _replicas(sim, "slices") == before  # kept, every pod of it, while work runs
    (kept,) = _events(sim.store, events.DRAIN_REFUSED)
    assert "would not drain" in kept
    assert _sample(sim, "tpu_autoscaler_drains_refused_total", group="slices") == 1
    # Hosts 0 and 1 are gone from Ray (a drain cannot be taken back); host 3 was
    # retired with host 2, which keeps its task and takes nothing new.
    assert [n.labels[labels.RAY_TPU_WORKER_ID] for n in sim.ray.nodes.values()] == ["2"]
    sim.events.run_until(sim.events.now_s + 25.0)
    assert _replicas(sim, "slices") == before  # the task (30 s) still runs on host 2
    # The task ends; host 2 exits; the slice is deleted whole and its pods leave
    # after their grace period.
    sim.events.run_until(sim.events.now_s + 15.0 + DEFAULT_GRACE_S)
    assert _replicas(sim, "slices") == {}
    assert sim.metrics.busy_replicas_terminated == 0
    assert len(sim.ray.finished) == 5 and not sim.ray.pending
    assert sim.violations == []


class _Flaky:
    """The store behind a KubeApi that misbehaves on cue."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.before_patch: Callable[[], None] | None = None
        self.lose_patch_response = False
        self.down = False
        self.strip_replica_labels = False

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        if self.down:
            raise Unavailable("raycluster: 503")
        return self.store.get_raycluster(namespace, name)

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        pods = self.store.list_pods(namespace, selector)
        if self.strip_replica_labels:
            pods = [_without_replica_labels(p) for p in pods]
        return pods

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()
        result = self.store.patch_raycluster(namespace, name, operations, resource_version)
        if self.lose_patch_response:
            self.lose_patch_response = False
            raise Unavailable("raycluster: connection dropped after the write")
        return result

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.store.create_event(namespace, event)

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return self.store.list_events(namespace, field_selector)


def _without_replica_labels(pod: dict[str, Any]) -> dict[str, Any]:
    copy = {**pod, "metadata": {**pod["metadata"]}}
    copy["metadata"]["labels"] = {
        k: v
        for k, v in pod["metadata"]["labels"].items()
        if k
        not in (
            labels.KUBERAY_REPLICA_NAME,
            labels.WEBHOOK_REPLICA_INDEX,
            labels.KUBERAY_HOST_INDEX,
        )
    }
    return copy


def _flaky(sim: SimulatedCluster) -> _Flaky:
    flaky = _Flaky(sim.store)
    sim.autoscaler.kube = flaky
    return flaky


def test_a_conflicting_write_is_re_read_and_re_planned() -> None:
    sim = _sim()
    flaky = _flaky(sim)
    flaky.before_patch = lambda: sim.store.edit_raycluster(
        "default", "ctl", [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}]
    )
    _submit(sim, SLICE_WORK, duration=10_000)
    sim.events.run_until(5.0)
    assert sim.metrics.conflicts == 1
    assert _sample(sim, "tpu_autoscaler_patch_conflicts_total") == 1
    sim.events.run_until(300.0)
    assert len(_replicas(sim, "slices")) == 1
    assert sim.metrics.slices_launched == 1


def test_a_status_write_between_read_and_patch_is_absorbed_without_re_planning() -> None:
    sim = _sim()
    flaky = _flaky(sim)

    def kuberay_writes_status() -> None:
        current = sim.store.get_raycluster("default", "ctl")
        status = {**current.get("status", {}), "readyWorkerReplicas": 7}
        sim.store.update_raycluster_status(
            "default", "ctl", status, current["metadata"]["resourceVersion"]
        )

    flaky.before_patch = kuberay_writes_status
    _submit(sim, SLICE_WORK, duration=10_000)
    outcome = sim.autoscaler.step()
    assert outcome.applied and outcome.rebases == 1 and outcome.replans == 0
    assert _sample(sim, "tpu_autoscaler_patch_conflicts_total") == 1
    spec = sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"]
    assert [g["replicas"] for g in spec if g["groupName"] == "slices"] == [1]


def test_a_spec_write_between_read_and_patch_is_re_planned() -> None:
    sim = _sim()
    flaky = _flaky(sim)
    flaky.before_patch = lambda: sim.store.patch_raycluster(
        "default",
        "ctl",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/maxReplicas", "value": 5}],
        None,
    )
    _submit(sim, SLICE_WORK, duration=10_000)
    outcome = sim.autoscaler.step()
    # The spec write re-plans (a status write after it, as KubeRay makes for the new
    # maxWorkerReplicas while the round reads again, is only sent again on).
    assert outcome.applied and outcome.replans == 1 and outcome.rebases <= 1
    assert (
        sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"][0]["maxReplicas"]
        == 5
    )


def test_a_lost_patch_response_is_not_applied_twice() -> None:
    sim = _sim()
    flaky = _flaky(sim)
    flaky.lose_patch_response = True
    _submit(sim, SLICE_WORK, duration=10_000)
    sim.events.run_until(5.0)
    assert sim.last_plan is None  # the round ended in an error...
    assert _sample(sim, "tpu_autoscaler_api_errors_total", api="kubernetes", operation="patch")
    sim.events.run_until(300.0)
    assert len(_replicas(sim, "slices")) == 1  # ...but the write had landed, once
    assert sim.metrics.slices_launched == 1
    (failed,) = _events(sim.store, events.APPLY_FAILED)
    assert "connection dropped" in failed


def test_outages_change_nothing_and_the_next_round_catches_up() -> None:
    sim = _sim()
    flaky = _flaky(sim)
    # The outage outlasts Ray's 100 s head timeout once provisioning is added: the
    # caller retries the reservation, as Ray Train does, so the demand is still there.
    retried = {"slice_placement_group": {**SLICE_WORK["slice_placement_group"], "retries": -1}}
    _submit(sim, retried, duration=10_000)
    flaky.down = True
    sim.events.run_until(20.0)
    assert _replicas(sim, "slices") == {} and sim.store.events == []
    flaky.down = False
    read = sim.gcs.get_cluster_resource_state

    def gcs_down() -> bytes:
        raise GcsUnavailable("GCS 127.0.0.1:6379: reading cluster state: deadline exceeded")

    sim.gcs.get_cluster_resource_state = gcs_down  # type: ignore[method-assign]
    sim.events.run_until(30.0)
    assert _replicas(sim, "slices") == {}
    sim.gcs.get_cluster_resource_state = read  # type: ignore[method-assign]
    sim.events.run_until(300.0)
    assert len(_replicas(sim, "slices")) == 1
    errors = sim.autoscaler.metrics.registry.get_sample_value
    assert errors("tpu_autoscaler_api_errors_total", {"api": "kubernetes", "operation": "read"})
    assert errors("tpu_autoscaler_api_errors_total", {"api": "gcs", "operation": "read"})


def test_a_group_edited_invalid_is_reported_and_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=10_000)
    sim.events.run_until(300.0)
    slices_before = _replicas(sim, "slices")
    assert len(slices_before) == 1
    # A person sets numOfHosts to 3 on the 4x4 group (it needs 4), while it runs.
    index = next(
        i
        for i, g in enumerate(
            sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"]
        )
        if g["groupName"] == "slices"
    )
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        sim.store.edit_raycluster(
            "default",
            "ctl",
            [{"op": "replace", "path": f"/spec/workerGroupSpecs/{index}/numOfHosts", "value": 3}],
        )
        _submit(
            sim,
            {
                "count": 2,
                "actor": {
                    "resources": {"TPU": 8},
                    "label_selector": {"ray.io/tpu-pod-type": "v6e-8"},
                },
            },
            duration=10_000,
        )
        _submit(sim, SLICE_WORK)  # more for the broken group: it must not scale
        sim.events.run_until(600.0)
    (invalid,) = _events(sim.store, events.INVALID_GROUP)
    assert "'slices'" in invalid and "numOfHosts" in invalid
    assert any("numOfHosts" in r.getMessage() for r in caplog.records)
    assert _replicas(sim, "slices") == slices_before
    assert len(_replicas(sim, "singles")) == 2  # the other group keeps scaling
    assert _sample(sim, "tpu_autoscaler_invalid_worker_groups") == 1


def test_replicas_that_cannot_be_told_apart_are_never_removed_but_scale_up_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _sim()
    flaky = _flaky(sim)
    flaky.strip_replica_labels = True
    _submit(sim, SLICE_WORK, duration=60)
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        sim.events.run_until(900.0)
    assert len(_replicas(sim, "slices")) == 1  # launched whole, never removed
    (said,) = _events(sim.store, events.UNIDENTIFIED)
    assert "'slices'" in said and "never removed" in said
    assert any("never removed" in r.getMessage() for r in caplog.records)


# --- crash and restart ----------------------------------------------------------------


class _Crash(BaseException):
    """The process dies: nothing after this point of the round happens."""


class _Dying:
    """Counts the autoscaler's calls to Kubernetes and the GCS; dies at call `at`."""

    def __init__(self, target: Any, counter: list[int], at: int | None) -> None:
        self.target = target
        self.counter = counter
        self.at = at

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.counter[0] += 1
            if self.counter[0] == self.at:
                raise _Crash(name)
            return method(*args, **kwargs)

        return call


def _run_with_crash(
    at: int | None, scenario: Callable[[SimulatedCluster], None]
) -> tuple[Counter[str], int, int, list[str]]:
    """Run `scenario` with the autoscaler dying at its `at`-th API call and a new
    process (no memory) taking over at the next period."""
    sim = _sim()
    counter = [0]
    crashed = []

    def fresh(dies_at: int | None) -> Autoscaler:
        return Autoscaler(
            _Dying(sim.store, counter, dies_at),
            _Dying(sim.gcs, counter, dies_at),
            "default",
            "ctl",
            clock=lambda: sim.events.now_s,
            decide=decide_by_slices,
        )

    class Supervisor:
        """Restarts the autoscaler, memory lost, when its process dies."""

        def __init__(self) -> None:
            self.process = fresh(at)

        def step(self) -> Round:
            try:
                return self.process.step()
            except _Crash as crash:
                crashed.append(str(crash))
                self.process = fresh(None)
                return Round()

    sim.autoscaler = Supervisor()  # type: ignore[assignment]
    scenario(sim)
    final = Counter(
        pod["metadata"]["labels"][labels.KUBERAY_GROUP]
        for pod in sim.store.list_pods("default", {labels.KUBERAY_CLUSTER: "ctl"})
    )
    assert len(crashed) == (at is not None and at <= counter[0])
    return final, sim.metrics.slices_launched, counter[0], sim.violations


def _scale_up_then_down(sim: SimulatedCluster) -> None:
    _submit(sim, SLICE_WORK, duration=100)
    sim.events.run_until(150.0)  # scale-up done, work running
    sim.events.run_until(600.0)  # work over; idle past the timeout: scale-down


def test_a_crash_at_any_step_boundary_converges_to_the_same_cluster() -> None:
    expected, launched, calls, violations = _run_with_crash(None, _scale_up_then_down)
    assert expected == Counter() and launched == 1 and violations == []
    # The calls of the rounds that launch and remove: every boundary between two steps.
    for at in range(1, calls + 1):
        final, launched_here, _, violations = _run_with_crash(at, _scale_up_then_down)
        assert final == expected, at
        assert launched_here == 1, at  # nothing repeated
        assert violations == [], at


def test_a_crash_mid_scale_up_launches_once() -> None:
    def hold(sim: SimulatedCluster) -> None:
        _submit(sim, SLICE_WORK, duration=10_000)
        sim.events.run_until(400.0)

    expected, _, calls, _ = _run_with_crash(None, hold)
    assert expected == Counter({"slices": 4})
    for at in range(1, min(calls, 12) + 1):
        final, launched, _, _ = _run_with_crash(at, hold)
        assert final == expected and launched == 1, at


def test_removals_stay_right_while_earlier_names_linger_in_workers_to_delete() -> None:
    """KubeRay never clears workersToDelete, and the pods it names stay listed for
    their grace period: a later removal keeps the names of pods still terminating,
    and the replica count is right throughout."""
    sim = _sim()
    pinned = {"ray.io/tpu-pod-type": "v6e-16"}
    _submit(sim, {"count": 8, "task": {"resources": {"TPU": 4}, "label_selector": pinned}}, 5000)
    sim.events.run_until(300.0)
    replicas = _replicas(sim, "slices")
    assert len(replicas) == 2 and all(
        p in sim.ray.nodes for pods in replicas.values() for p in pods
    )

    def work_on(pods: list[str]) -> list[Any]:
        return [w for w in sim.ray.running.values() if any(p in pods for p, _ in w.placement)]

    first, second = (sorted(pods) for pods in replicas.values())
    for work in work_on(first):
        sim.ray._finish(work)  # the first slice's work ends now, the second's 10 s later
    sim.events.run_until(sim.events.now_s + 10.0)
    for work in work_on(second):
        sim.ray._finish(work)
    lists: list[list[str]] = []
    while len(lists) < 2 and sim.events.now_s < 600.0:
        sim.events.run_until(sim.events.now_s + 1.0)
        spec = sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"][0]
        named = sorted(spec.get("scaleStrategy", {}).get("workersToDelete") or [])
        if named and (not lists or named != lists[-1]):
            lists.append(named)
            assert spec["replicas"] == 2 - len(lists)
    assert lists[0] == first
    # The first slice's pods were still terminating: kept, with the second's added.
    assert lists[1] == sorted(first + second)
    sim.events.run_until(sim.events.now_s + 60.0)
    spec = sim.store.get_raycluster("default", "ctl")["spec"]["workerGroupSpecs"][0]
    assert spec["replicas"] == 0 and _replicas(sim, "slices") == {}
    assert len(_events(sim.store, events.REMOVE)) == 2
    assert sim.metrics.busy_replicas_terminated == 0 and sim.violations == []


def _told_up(sim: SimulatedCluster) -> list[dict[str, Any]]:
    return [e for e in sim.store.events if e["reason"] == events.REPLICA_UP]


def test_a_slice_that_came_up_is_told_once_with_its_pods_creation_and_hosts_times() -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=600)
    sim.events.run_until(200.0)
    (told,) = _told_up(sim)
    ((replica, pod_names),) = _replicas(sim, "slices").items()
    pods = [sim.store.pod("default", name) for name in pod_names]
    created_s = min(timestamp_s(p["metadata"]["creationTimestamp"]) or 0.0 for p in pods)
    notes = told["metadata"]["annotations"]
    assert notes[readiness.REPLICA_ANNOTATION] == replica
    assert notes[readiness.GROUP_ANNOTATION] == "slices"
    (container,) = pods[0]["spec"]["containers"]
    (tpu_name,) = [e["value"] for e in container["env"] if e["name"] == "TPU_NAME"]
    assert notes[readiness.SLICE_ANNOTATION] == tpu_name
    assert float(notes[readiness.CREATED_ANNOTATION]) == created_s
    up_s = float(notes[readiness.UP_AFTER_ANNOTATION])
    # Provisioning 60 s, each pod Running up to the world's stagger later, its raylet
    # 4 s more, seen by the next round (every 5 s).
    assert 64.0 <= up_s <= 60.0 + sim.world.running_stagger_s + 4.0 + 5.0 + 1.0
    assert f"{len(pods)} host(s) registered with Ray {up_s:.0f} s after" in told["message"]
    # Told by the round that first saw the last host registered (Events' times are
    # whole seconds).
    assert abs((timestamp_s(told["lastTimestamp"]) or 0.0) - (created_s + up_s)) <= 1.0
    count = _sample(sim, "tpu_autoscaler_replica_up_seconds_count", group="slices")
    total = _sample(sim, "tpu_autoscaler_replica_up_seconds_sum", group="slices")
    assert count == 1 and total is not None and abs(total - up_s) < 0.001
    sim.events.run_until(400.0)
    assert len(_told_up(sim)) == 1


def test_a_restarted_autoscaler_tells_only_the_slices_that_come_up_after_it_started() -> None:
    sim = _sim()
    _submit(sim, SLICE_WORK, duration=900)
    sim.events.run_until(200.0)
    assert len(_told_up(sim)) == 1
    sim.autoscaler = sim.new_autoscaler_process()  # no memory: the first slice looks new
    _submit(sim, SLICE_WORK, duration=900)
    sim.events.run_until(400.0)
    told = _told_up(sim)
    assert len(told) == 2
    replicas = [e["metadata"]["annotations"][readiness.REPLICA_ANNOTATION] for e in told]
    assert len(set(replicas)) == 2 and set(replicas) == set(_replicas(sim, "slices"))
