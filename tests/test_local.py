"""Local mode without starting Ray: how a pod becomes a `ray start` command and
environment, the timeline's lines, the one-per-machine lock, and bad input at the CLI
(exit 2, nothing started). `test_local_e2e.py` runs the real thing."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import factories
from tpu_autoscaler.cli import main
from tpu_autoscaler.controlplane import admitted_pod
from tpu_autoscaler.controlplane.real_kube import CACHE_ENV
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.local.kubernetes import KubernetesUnavailable
from tpu_autoscaler.local.processes import host_command, pod_environment
from tpu_autoscaler.local.session import AlreadyRunning, MachineLock, run_local
from tpu_autoscaler.local.timeline import HostView, Observation, RayNodeEnd, ReplicaView, changes
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

ROOT = Path(__file__).parent.parent

EXAMPLES = Path(__file__).parent.parent / "examples" / "clusters"


def _v6e_shape(**group_extra: Any) -> Any:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    cluster = factories.raycluster(
        factories.tpu_group("tpu", catalog.slice_type(v6e, "4x4"), **group_extra)
    )
    return derive_shapes(parse_raycluster(cluster, "test")).shapes[0]


def _flag(command: list[str], name: str) -> str | None:
    for part in command:
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
    return None


# --- a pod as `ray start` ------------------------------------------------------------------


def test_host_command_passes_the_groups_resources_and_leaves_tpu_identity_to_ray() -> None:
    shape = _v6e_shape(rayStartParams={"resources": '"{\\"spare\\": 2}"'})
    command = host_command(shape, "127.0.0.1:6379", Path("/tmp/h1"))
    assert command[1:3] == ["start", "--block"]
    assert _flag(command, "--address") == "127.0.0.1:6379"
    assert _flag(command, "--num-cpus") == "24"
    assert _flag(command, "--memory") == str(100 * 10**9)
    resources = json.loads(_flag(command, "--resources") or "{}")
    # KubeRay passes the google.com/tpu limit as TPU; Ray derives the rest (accelerator
    # type, slice name, TPU-v6e-16-head on worker 0) from the environment.
    assert resources == {"TPU": 4.0, "spare": 2.0}
    assert _flag(command, "--temp-dir") == "/tmp/h1"


def test_host_command_passes_own_labels_not_rays() -> None:
    shape = _v6e_shape(labels={"team": "rl", "ray.io/market-type": "spot"})
    assert shape.group_labels[labels.RAY_NODE_GROUP] == "tpu"  # Ray sets it from the env
    labels_flag = _flag(host_command(shape, "a:1", Path("/t")), "--labels")
    # ray.io/ keys of the group's own pass too, as KubeRay passes them.
    assert labels_flag == "ray.io/market-type=spot,team=rl"


def test_pod_environment_is_the_webhooks_tpu_identity() -> None:
    shape = _v6e_shape()
    pod = admitted_pod.worker_pod("c", "default", shape, 0, 2, "2026-12-02T00:00:00Z")
    env = pod_environment(pod)
    assert env[labels.ENV_TPU_WORKER_ID] == "2"
    assert env[labels.ENV_TPU_NAME] == "tpu-0"
    assert env[labels.ENV_TPU_ACCELERATOR_TYPE] == "v6e-16"
    assert env[labels.ENV_TPU_TOPOLOGY] == "4x4"
    assert env[labels.ENV_CLOUD_INSTANCE_ID] == pod["metadata"]["name"]


# --- the timeline -------------------------------------------------------------------------


def _slice(status: str | None, phase: str = "Running", busy_worker: int | None = None) -> Any:
    hosts = tuple(
        HostView(f"p{i}", i, phase, "RUNNING" if i == busy_worker else status) for i in range(4)
    )
    return ReplicaView("tpu", "tpu-0", hosts)


def test_timeline_launch_ready_drain_removal() -> None:
    empty = Observation(0.0)
    pending = Observation(1.0, {"r": _slice(None, "Pending")})
    running = Observation(9.0, {"r": _slice("IDLE")})
    ends = {f"n{i}": RayNodeEnd("tpu-0", i, "AUTOSCALER_DRAIN_IDLE") for i in range(4)}
    drained = Observation(80.0, {}, frozenset(), ends)

    launch = changes(empty, pending)
    assert [(e.kind, e.subject) for e in launch] == [("launch", "tpu-0")]
    assert "4 hosts 0:p0 1:p1 2:p2 3:p3" in launch[0].detail
    assert [e.kind for e in changes(pending, running)] == ["ready"]
    assert changes(running, running) == []
    gone = changes(running, drained)
    assert [(e.kind, e.detail) for e in gone] == [
        ("drain", "hosts 0,1,2,3: AUTOSCALER_DRAIN_IDLE"),
        ("removal", "4 hosts deleted, all idle or drained"),
    ]
    assert str(gone[0]).startswith("[   80.0s] drain      tpu-0  hosts 0,1,2,3")


def test_timeline_names_busy_hosts_removed_and_failed_hosts() -> None:
    busy = Observation(5.0, {"r": _slice("IDLE", busy_worker=1)})
    assert [e.detail for e in changes(busy, Observation(6.0))] == [
        "4 hosts deleted, 1 of them busy in Ray"
    ]
    failed_host = ReplicaView(
        "tpu", "tpu-0", (HostView("p0", 0, "Failed", "DEAD"), *_slice("IDLE").hosts[1:])
    )
    events = changes(busy, Observation(6.0, {"r": failed_host}))
    assert [(e.kind, e.detail) for e in events] == [("failed", "hosts 0:p0")]


def test_timeline_names_a_host_deleted_from_a_replica_that_stays() -> None:
    """A pod deleted by someone other than KubeRay (whose deletions take a replica
    out whole) leaves its replica incomplete: a `lost` line then, and the replica's
    removal later counts the hosts it still had."""
    busy = Observation(5.0, {"r": _slice("IDLE", busy_worker=1)})
    hosts = _slice("IDLE", busy_worker=1).hosts
    three = Observation(6.0, {"r": ReplicaView("tpu", "tpu-0", (hosts[0], *hosts[2:]))})
    assert [(e.kind, e.subject, e.detail) for e in changes(busy, three)] == [
        ("lost", "tpu-0", "hosts 1:p1: pod deleted, 3 of 4 hosts left, 1 of them busy in Ray")
    ]
    assert changes(three, three) == []
    assert [(e.kind, e.detail) for e in changes(three, Observation(9.0))] == [
        ("removal", "3 hosts deleted, all idle or drained")
    ]


def test_timeline_reports_new_infeasible_demand_once() -> None:
    first = Observation(1.0, {}, frozenset({"1 x {TPU: 64}"}))
    assert [(e.kind, e.subject) for e in changes(Observation(0.0), first)] == [
        ("infeasible", "1 x {TPU: 64}")
    ]
    assert changes(first, Observation(2.0, {}, frozenset({"1 x {TPU: 64}"}))) == []


def test_timeline_reports_draining_then_dead_as_one_drain() -> None:
    draining = Observation(1.0, {}, frozenset(), {"n": RayNodeEnd("s", 2, "DRAINING")})
    dead = Observation(2.0, {}, frozenset(), {"n": RayNodeEnd("s", 2, "AUTOSCALER_DRAIN_IDLE")})
    assert [e.detail for e in changes(Observation(0.0), draining)] == ["hosts 2: DRAINING"]
    assert changes(draining, dead) == []


# --- one local cluster per machine --------------------------------------------------------


def test_second_lock_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = MachineLock(path)
    first.acquire()
    first.record({"pid": 4242, "ray_address": "127.0.0.1:6379"})
    with pytest.raises(AlreadyRunning, match=r"pid 4242, Ray at 127.0.0.1:6379"):
        MachineLock(path).acquire()
    first.release()
    again = MachineLock(path)
    again.acquire()
    again.release()


def test_run_local_starts_nothing_while_another_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = MachineLock(path)
    holder.acquire()
    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    with pytest.raises(AlreadyRunning):
        run_local(cluster, "slice", 1.0, None, threading.Event(), lock=MachineLock(path))
    holder.release()
    assert not list(tmp_path.glob("tpua-*"))


# --- bad input ----------------------------------------------------------------------------


def test_local_rejects_a_manifest_without_tpu_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(factories.raycluster(factories.cpu_group("cpu"))))
    assert main(["local", "--cluster", str(path)]) == 2
    assert "no TPU worker group" in capsys.readouterr().err


def test_local_rejects_an_invalid_group_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    cluster["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cluster))
    assert main(["local", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tpu-v6e-group" in err and "numOfHosts" in err


def test_local_rejects_a_negative_provisioning_delay(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = str(EXAMPLES / "v6e-4x4-multihost.yaml")
    assert main(["local", "--cluster", manifest, "--provision-delay-s", "-1"]) == 2
    assert "--provision-delay-s" in capsys.readouterr().err


def test_real_kubernetes_without_binaries_says_how_and_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "no-binaries"))
    path = tmp_path / "lock"
    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    lock = MachineLock(path)  # held here, so only its release can free the file
    with pytest.raises(KubernetesUnavailable, match="make kube-binaries"):
        run_local(cluster, "slice", 1.0, None, threading.Event(), lock=lock, kubernetes="real")
    again = MachineLock(path)
    again.acquire()  # not left held by the failed start
    again.release()


def test_local_real_kubernetes_without_binaries_exits_1_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "no-binaries"))
    # A machine lock of its own: another `local` on this machine must not answer first.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    manifest = str(EXAMPLES / "v6e-4x4-multihost.yaml")
    assert main(["local", "--cluster", manifest, "--kubernetes", "real"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --kubernetes real: ") and "make kube-binaries" in line


def test_a_replica_whose_pods_kuberay_is_deleting_is_removed_whole_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KubeRay deletes a replica's pods one call at a time; a look between two calls
    saw the replica with the pods not yet deleted, and reported "2 hosts deleted"
    once they went (a real-Ray test failed so)."""
    from tpu_autoscaler.controlplane.world import REALISTIC
    from tpu_autoscaler.local.observer import Observer
    from tpu_autoscaler.sim.cluster import SimulatedCluster
    from tpu_autoscaler.sim.workload import parse_workload

    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    sim = SimulatedCluster(cluster, policy="slice", seed=0, world=REALISTIC)
    spg = {"topology": "4x4", "accelerator_version": "v6e", "head_reservation_timeout_s": None}
    sim.load(parse_workload([{"at": 0, "duration": 600, "slice_placement_group": spg}], "one"))
    sim.events.run_until(300.0)
    seen: list[Any] = []
    observer = Observer(
        sim.store, threading.RLock(), sim.operator, sim.namespace, sim.name, 0.0, seen.append
    )
    workers = [
        p
        for p in sim.store.list_pods(sim.namespace, {labels.KUBERAY_NODE_TYPE: "worker"})
        if p["metadata"]["labels"].get(labels.KUBERAY_GROUP) == "tpu-v6e-group"
    ]
    names = sorted(p["metadata"]["name"] for p in workers)
    monkeypatch.setattr(observer, "_read_gcs", lambda: ({n: "IDLE" for n in names}, [], {}))
    observer.observe()
    assert [e.kind for e in seen] == ["launch", "ready"]
    assert "tpu-v6e-group: 4 hosts" in seen[0].detail
    # KubeRay's deletion of the replica, two calls made of four.
    sim.operator.groups.deleting |= set(names)
    for name in names[:2]:
        sim.store.delete_pod(sim.namespace, name)
    observer.observe()
    for name in names[2:]:
        sim.store.delete_pod(sim.namespace, name)
    sim.operator.groups.deleting -= set(names)
    observer.observe()
    assert [(e.kind, e.detail) for e in seen[2:]] == [
        ("removal", "4 hosts deleted, all idle or drained")
    ]


# --- the kubelet's side of a deletion -------------------------------------------------------


class _RecordedRay:
    """A Ray process of a pod that records the signals its pod's deletion sends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.signals: list[str] = []
        self.process = types.SimpleNamespace(poll=lambda: 0)

    def terminate(self) -> None:
        self.signals.append("SIGTERM")

    def kill(self) -> None:
        self.signals.append("SIGKILL")

    def group_alive(self) -> bool:
        return "SIGKILL" not in self.signals

    def exited(self) -> bool:
        return False


def test_a_pod_deleted_by_anyone_has_its_ray_stopped_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever deletes a worker pod, the kubelet stops its container: a person's
    graceful `kubectl delete pod`, one removed at once, as KubeRay's own deletions
    (told first through `pods_deleted`, and not stopped twice). A pod only written to
    keeps its Ray."""
    from tpu_autoscaler.controlplane.clock import EventQueue
    from tpu_autoscaler.controlplane.store import ObjectStore
    from tpu_autoscaler.local import hosts as local_hosts

    started: dict[str, _RecordedRay] = {}

    def start(name: str, *args: Any) -> _RecordedRay:
        started[name] = _RecordedRay(name)
        return started[name]

    monkeypatch.setattr(local_hosts.RayProcess, "start", start)
    events = EventQueue()
    store = ObjectStore(events)
    shape = _v6e_shape()
    names = []
    for index in range(4):
        pod = admitted_pod.worker_pod("c", "default", shape, 0, index, "2026-12-02T00:00:00Z")
        names.append(store.create_pod(pod)["metadata"]["name"])
        store.bind_pod("default", names[-1], f"node-{index}")
    hosts = local_hosts.PodHosts(store, events, "default", {shape.group: shape}, {}, tmp_path, 5.0)
    store.watchers.append(hosts.on_store_change)
    hosts.replica_created(shape.group, "r0", names)
    events.run_until(5.0)
    assert sorted(hosts.running) == sorted(names) == sorted(started)

    store.set_pod_phase("default", names[0], "Running")  # a write, not a deletion
    store.delete_pod("default", names[1])  # a person's, graceful: stays listed terminating
    store.delete_pod("default", names[2], grace_s=0)  # a person's, at once
    hosts.pods_deleted([names[3]], requested=True)  # KubeRay's: told, then deleted
    store.delete_pod("default", names[3])
    assert {n: started[n].signals for n in names} == {
        names[0]: [],
        names[1]: ["SIGTERM"],
        names[2]: ["SIGTERM"],
        names[3]: ["SIGTERM"],
    }
    assert list(hosts.running) == [names[0]]
    hosts.finish_stopping(time.time() + local_hosts.STOP_GRACE_S + 1.0)
    assert [started[n].signals for n in names[1:]] == [["SIGTERM", "SIGKILL"]] * 3
    assert hosts.stopping == []


def test_a_local_cluster_tells_its_hosts_of_every_pod_change(tmp_path: Path) -> None:
    """The wiring the test above assumes: the cluster's `PodHosts` watches its store,
    so a pod deleted by anyone reaches it."""
    from tpu_autoscaler.local.cluster import LocalCluster

    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    local = LocalCluster(cluster, tmp_path)
    try:
        assert local.hosts.on_store_change in local.store.watchers
    finally:
        local.kubernetes.stop()


def test_a_kubelet_failure_is_told_once_and_then_forgotten(tmp_path: Path) -> None:
    """A removal the API server refused reaches the timeline as one `kubernetes` line,
    and the cluster keeps nothing of it after (a server down for hours refuses one a
    second)."""
    from tpu_autoscaler.local.cluster import LocalCluster
    from tpu_autoscaler.local.timeline import ScalingEvent

    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    local = LocalCluster(cluster, tmp_path)
    failures = ["pod default/w-1: the kubelet's DELETE failed (ApiError: 503)"]
    told: list[ScalingEvent] = []
    try:
        local.kubernetes.take_kubelet_failures = lambda: failures  # type: ignore[method-assign]
        local.observer.emit = told.append  # type: ignore[method-assign]
        local.observer.tick = lambda now: None  # type: ignore[method-assign]
        local.tick()
        failures = []
        local.tick()
    finally:
        local.kubernetes.stop()
    assert [(e.kind, e.subject, e.detail) for e in told] == [
        ("kubernetes", "kubelet", "pod default/w-1: the kubelet's DELETE failed (ApiError: 503)")
    ]


def test_a_real_servers_kubelet_failures_are_handed_over_once() -> None:
    from types import SimpleNamespace

    from tpu_autoscaler.local.kubernetes import RealKubernetes

    real = object.__new__(RealKubernetes)
    real.store = SimpleNamespace(kubelet_failures=["one", "two"])  # type: ignore[assignment]
    assert real.take_kubelet_failures() == ["one", "two"]
    assert real.take_kubelet_failures() == []


def test_kubernetes_goes_on_while_the_timeline_waits_for_a_stalled_gcs(tmp_path: Path) -> None:
    """The timeline's GCS reads wait up to 5 s each while the GCS stalls: the world
    (the operator, the kubelet's removals) steps on meanwhile, on its own thread."""
    import threading

    from tpu_autoscaler.local.cluster import LocalCluster

    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    local = LocalCluster(cluster, tmp_path)
    observing, gcs_back = threading.Event(), threading.Event()
    steps_while_stalled = threading.Semaphore(0)

    def stalled_read(now: float) -> None:
        observing.set()
        gcs_back.wait(timeout=30)

    world_tick = local.tick_world

    def counted_tick() -> None:
        world_tick()
        if observing.is_set() and not gcs_back.is_set():
            steps_while_stalled.release()

    local.observer.tick = stalled_read  # type: ignore[method-assign]
    local.tick_world = counted_tick  # type: ignore[method-assign]
    stop = threading.Event()
    runner = threading.Thread(target=local.run, args=(stop,))
    runner.start()
    try:
        assert observing.wait(timeout=30)
        assert all(steps_while_stalled.acquire(timeout=30) for _ in range(3))
    finally:
        stop.set()
        gcs_back.set()
        runner.join(timeout=30)
        local.kubernetes.stop()
    assert not runner.is_alive()


def test_a_failing_timeline_stops_local_saying_why(tmp_path: Path) -> None:
    """An error observing the cluster is not lost with its thread: `run` returns it."""
    import threading

    from tpu_autoscaler.local.cluster import LocalCluster

    cluster = yaml.safe_load((EXAMPLES / "v6e-4x4-multihost.yaml").read_text())
    local = LocalCluster(cluster, tmp_path)

    def broken(now: float) -> None:
        raise KeyError("status")

    local.observer.tick = broken  # type: ignore[method-assign]
    stop = threading.Event()
    deadline = threading.Timer(30.0, stop.set)  # a `run` that missed it returns None then
    deadline.start()
    try:
        why = local.run(stop)
    finally:
        deadline.cancel()
        local.kubernetes.stop()
    assert why == "observing the cluster failed: KeyError('status')"
