"""The seed scenarios under `run`'s code path against a real kube-apiserver 1.20.2:
the production `Autoscaler` with the project's `KubernetesApi`, whose only credential
is a token of a ServiceAccount holding the documented Role, and the simulated Ray
(`SimRay`) as its GCS. KubeRay, the TPU webhook, GKE's provisioning and the kubelet's
pod phases are the simulator's, acting as controllers on the real server
(`controlplane/real_store.py`): the pods, bindings, phases, deletions and RayCluster
status writes all happen there.

Time: the simulation's clock, started at the machine's time, is advanced by the test;
the server runs in real time. Conflicts are forced: just before the first patch of
every round that patches, another writer updates the RayCluster's status on the
server (as KubeRay does whenever its counts change), so the server answers 409; the
operator's own status writes race the rounds too. Each scenario counts the 409s the
server returned to the autoscaler and shows every round still landed.

Checked as on the simulated server (tests/test_controller.py, test_run.py,
test_sim_stateful.py): after every simulated second, the real server's pod list holds
no partial replica (one missing pods is being created by KubeRay, or all its pods are
terminating); launches are counted once; no busy host is removed and none before its
idle timeout (the simulation judges each removal); no launch is taken back (every pod
the autoscaler named for deletion had joined Ray)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from tests.realkube.service_account import (
    SERVICE_ACCOUNT,
    Exchange,
    documented_rbac,
    grant,
    record_requests,
)
from tests.test_controller import IDLE_TIMEOUT_S, SLICE_WORK, _cluster, _submit
from tpu_autoscaler.adapters.kube.api import JsonPatch, KubeApi
from tpu_autoscaler.adapters.kube.client import KubernetesApi
from tpu_autoscaler.controlplane.clock import rfc3339
from tpu_autoscaler.controlplane.real_kube import RealKube
from tpu_autoscaler.controlplane.real_server import ServerCalls
from tpu_autoscaler.controlplane.real_store import ServerBackedStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.shell import events
from tpu_autoscaler.sim.cluster import SimulatedCluster

pytestmark = pytest.mark.kube_real

CLUSTER = "ctl"
GROUP = "slices"
HOSTS = 4
PROVISIONING_S = 60.0
STEP_S = 1.0
"""Simulated seconds between two looks at the real server's pods."""


class StatusWriteBeforeEachRound:
    """The autoscaler's Kubernetes API while another writer updates the RayCluster's
    status on the real server between the autoscaler's read of the cluster and the
    first patch it makes from that read (the resend after the conflict, made from a
    re-read of the RayCluster alone, goes through untouched)."""

    def __init__(self, kube: KubeApi, writer: ServerCalls) -> None:
        self.kube = kube
        self.writer = writer
        self.raced = 0
        self._armed = False

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        return self.kube.get_raycluster(namespace, name)

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        self._armed = True  # a whole read: the round's plan is made from it
        return self.kube.list_pods(namespace, selector)

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.kube.create_event(namespace, event)

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return self.kube.list_events(namespace, field_selector)

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        if self._armed:
            self._armed = False
            self.raced += 1
            current = self.writer.get(self.writer.raycluster_path(name))
            # KubeRay's status carries the time of its last update: always a change.
            status = {**current.get("status", {}), "lastUpdateTime": rfc3339(1e9 + self.raced)}
            self.writer.put(
                self.writer.raycluster_path(name, "status"), {**current, "status": status}
            )
        return self.kube.patch_raycluster(namespace, name, operations, resource_version)


@dataclass
class RealRun:
    """A simulated cluster whose Kubernetes is the real server, and what it records."""

    sim: SimulatedCluster
    store: ServerBackedStore
    racer: StatusWriteBeforeEachRound
    sent: list[Exchange]
    """Every request of the autoscaler's client (its service account's) and its status."""
    admin: ServerCalls
    started_real_s: float
    named_for_deletion: set[str]

    def advance(self, seconds: float) -> None:
        """Run the simulation `seconds` further, checking the server's pods after each
        simulated `STEP_S`."""
        end = self.sim.events.now_s + seconds
        while self.sim.events.now_s < end - 1e-9:
            self.sim.events.run_until(min(end, self.sim.events.now_s + STEP_S))
            self.check()

    def pods(self) -> list[dict[str, Any]]:
        query = [("labelSelector", f"{labels.KUBERAY_CLUSTER}={CLUSTER}")]
        items: list[dict[str, Any]] = self.admin.get(self.admin.pod_path(), query)["items"]
        return items

    def replicas(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in self.pods():
            pod_labels = pod["metadata"]["labels"]
            if pod_labels.get(labels.KUBERAY_GROUP) == GROUP:
                found[pod_labels[labels.KUBERAY_REPLICA_NAME]].append(pod)
        return dict(found)

    def spec(self) -> dict[str, Any]:
        raycluster = self.admin.get(self.admin.raycluster_path(CLUSTER))
        group: dict[str, Any] = next(
            g for g in raycluster["spec"]["workerGroupSpecs"] if g["groupName"] == GROUP
        )
        return group

    def check(self) -> None:
        """The invariants, on the real server's pods and the simulation's judgements."""
        for replica, pods in self.replicas().items():
            whole = len(pods) == HOSTS
            terminating = all(p["metadata"].get("deletionTimestamp") for p in pods)
            assert whole or terminating or replica in self.sim.operator.creating, (
                f"partial replica {replica} on the server: {[p['metadata']['name'] for p in pods]}"
            )
        named = set(self.spec().get("scaleStrategy", {}).get("workersToDelete") or [])
        self.named_for_deletion |= named
        assert named <= self.sim.ray_seen, f"a launch taken back: {named - self.sim.ray_seen}"
        assert self.sim.metrics.busy_replicas_terminated == 0
        assert self.sim.violations == []

    def server_events(self, reason: str) -> list[dict[str, Any]]:
        items = self.admin.get(self.admin.events_path())["items"]
        return [e for e in items if e["reason"] == reason and e["source"].get("component")]

    def patches(self) -> list[Exchange]:
        return [x for x in self.sent if x.method == "PATCH"]

    def conflicts_returned(self) -> int:
        """409s the server answered the autoscaler's patches with."""
        return sum(1 for x in self.patches() if x.status == 409)

    def assert_every_round_landed(self) -> None:
        assert self.sim.metrics.rounds_failed == 0
        assert self.sim.metrics.conflicts_unabsorbed == 0
        # Every forced conflict came back as a 409, and each was followed by a patch
        # that the server took.
        assert self.conflicts_returned() >= self.racer.raced > 0
        statuses = [x.status for x in self.patches()]
        assert statuses[-1] == 200 and set(statuses) <= {200, 409}, statuses


@pytest.fixture
def real_run(
    real_kube: RealKube,
    admin: client.ApiClient,
    namespace: str,
    account_client: Callable[[str], client.ApiClient],
    request: pytest.FixtureRequest,
) -> Iterator[RealRun]:
    role, binding = documented_rbac(namespace, SERVICE_ACCOUNT)
    account = account_client(grant(admin, real_kube, role, binding))
    sent = record_requests(account)
    admin_calls = ServerCalls(admin, namespace)
    racer = StatusWriteBeforeEachRound(KubernetesApi(account), admin_calls)
    stores: list[ServerBackedStore] = []

    def store(clock: Any) -> ServerBackedStore:
        stores.append(ServerBackedStore(clock, admin, namespace))
        return stores[-1]

    started = time.time()
    cluster = _cluster()
    cluster["metadata"]["namespace"] = namespace
    sim = SimulatedCluster(
        cluster,
        provisioning_delay=lambda _: PROVISIONING_S,
        store=store,
        autoscaler_kube=racer,
        start_s=started,
    )
    sim.events.run_until(started)
    run = RealRun(sim, stores[0], racer, sent, admin_calls, started, set())
    yield run
    # What the server answered, for the junit report (`--junitxml`).
    operator_409s = run.store.server.answers[("PUT", "rayclusters/status", 409)]
    request.node.user_properties += [
        ("status_writes_forced", racer.raced),
        ("autoscaler_patches_409", run.conflicts_returned()),
        ("autoscaler_patches", len(run.patches())),
        ("operator_status_writes_409", operator_409s),
        ("simulated_s", round(sim.events.now_s - started, 1)),
        ("real_s", round(time.time() - started, 1)),
    ]


def _running(pods: list[dict[str, Any]]) -> bool:
    return all(p["status"]["phase"] == "Running" and p["spec"].get("nodeName") for p in pods)


def test_a_slice_placement_group_from_empty_launches_one_whole_slice(real_run: RealRun) -> None:
    run = real_run
    assert run.replicas() == {}
    _submit(run.sim, SLICE_WORK, duration=10_000)
    run.advance(200.0)
    (pods,) = run.replicas().values()
    assert len(pods) == HOSTS and _running(pods)
    assert run.spec()["replicas"] == 1
    assert run.sim.metrics.slices_launched == 1
    assert len(run.server_events(events.LAUNCH)) == 1
    assert not run.sim.ray.pending  # both stages of the placement group placed
    run.assert_every_round_landed()


def test_a_busy_slice_is_kept_past_its_idle_timeout(real_run: RealRun) -> None:
    run = real_run
    on_host_1 = {"resources": {"TPU": 4}, "label_selector": {labels.RAY_TPU_WORKER_ID: "1"}}
    _submit(run.sim, {"actor": on_host_1}, duration=10_000)
    run.advance(120.0)
    (before,) = run.replicas().values()
    assert _running(before)
    run.advance(IDLE_TIMEOUT_S * 4)  # three of four hosts idle all along
    (after,) = run.replicas().values()
    assert sorted(p["metadata"]["name"] for p in after) == sorted(
        p["metadata"]["name"] for p in before
    )
    assert not any(p["metadata"].get("deletionTimestamp") for p in after)
    assert run.spec()["replicas"] == 1 and run.named_for_deletion == set()
    assert run.sim.metrics.slices_launched == 1
    run.assert_every_round_landed()


def test_an_idle_slice_is_removed_whole_in_one_guarded_patch(real_run: RealRun) -> None:
    run = real_run
    _submit(run.sim, SLICE_WORK, duration=60)
    run.advance(120.0)
    (pods,) = run.replicas().values()
    names = sorted(p["metadata"]["name"] for p in pods)
    run.advance(IDLE_TIMEOUT_S + 120.0)  # the work ends, the slice idles, is removed
    landed = [x for x in run.patches() if x.status == 200]
    removal = [x for x in landed if any("scaleStrategy" in op["path"] for op in x.body)]
    (patch,) = removal
    guard, *operations = patch.body
    # The version it planned on, or, when a status write of KubeRay's came between
    # (a 409 first), the generation it planned on (`adapters/kube/guarded.py`).
    assert guard["op"] == "test"
    if guard["path"] != "/metadata/resourceVersion":
        assert guard["path"] == "/metadata/generation"
        assert any(x.status == 409 for x in run.patches())
    changed = {op["path"].rsplit("/", 1)[-1]: op["value"] for op in operations}
    assert changed.keys() == {"replicas", "scaleStrategy"} and changed["replicas"] == 0
    assert sorted(changed["scaleStrategy"]["workersToDelete"]) == names
    run.advance(60.0)  # the pods' grace period (30 s) passes; the kubelet removes them
    assert run.replicas() == {}
    assert run.spec()["replicas"] == 0
    assert run.sim.metrics.slices_launched == 1
    assert len(run.server_events(events.REMOVE)) == 1
    run.assert_every_round_landed()


def test_two_slices_launch_one_after_the_other(real_run: RealRun) -> None:
    run = real_run
    # Ray Train retries a head reservation that times out (100 s): the second slice
    # is launched only once the first is up and holds its head.
    spg = {**SLICE_WORK["slice_placement_group"], "num_slices": 2, "retries": -1}
    _submit(run.sim, {"slice_placement_group": spg}, duration=10_000)
    run.advance(400.0)
    replicas = run.replicas()
    assert len(replicas) == 2 and all(len(p) == HOSTS and _running(p) for p in replicas.values())
    assert run.spec()["replicas"] == 2
    assert run.sim.metrics.slices_launched == 2
    assert len(run.server_events(events.LAUNCH)) == 2
    assert not run.sim.ray.pending
    run.assert_every_round_landed()
