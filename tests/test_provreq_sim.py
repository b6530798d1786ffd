"""Queued provisioning in the simulator: GKE's lifecycle of a ProvisioningRequest
(`controlplane/provreq_lifecycle.py`) condition by condition, and whole runs where
our autoscaler obtains a queued group's slices through requests: every slice whole
(its pods placed the moment they exist, never Pending for capacity) beside a plain
group whose pods wait, failures read back as capacity signals, and a restart of the
autoscaler between its writes losing nothing."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.queued_faults import failing_writes_and_restarts
from tests.test_sim import V6E
from tpu_autoscaler.adapters.kube.provreq_objects import CONSUME_ANNOTATION, provisioning_request
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.provreq_lifecycle import (
    ProvisioningRequestController,
    QueueTimings,
)
from tpu_autoscaler.controlplane.provreq_store import ProvisioningObjects
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.capacity import QUEUED_PROVISIONING_ANNOTATION, CapacityProblem
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.shell.controller import decide_by_slices
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import parse_workload

NS = "default"


# --- the lifecycle, on its own --------------------------------------------------------


class Broker:
    """GKE's capacity as a switch: `free` slices to reserve."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.held: set[str] = set()
        self.revoked: list[str] = []

    def try_reserve(self, group: str, request: str, hosts: int) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        self.held.add(request)
        return True

    def reserved(self, request: str) -> bool:
        return request in self.held

    def release(self, request: str) -> None:
        if request in self.held:
            self.held.discard(request)
            self.free += 1

    def revoke(self, request: str) -> None:
        self.revoked.append(request)
        self.release(request)


def _world(
    free: int, **timings: Any
) -> tuple[EventQueue, ProvisioningObjects, ProvisioningRequestController, Broker]:
    events = EventQueue(seed=0)
    objects = ProvisioningObjects(ObjectStore(events))
    broker = Broker(free)
    fixed = QueueTimings(**{"queue_delay": lambda e: 60.0, **timings})
    controller = ProvisioningRequestController(events, objects, NS, broker, fixed)
    raw = yaml.safe_load(V6E.read_text())
    objects.create_pod_template(
        NS,
        {
            "metadata": {"name": "r"},
            "template": {"metadata": {"labels": {labels.KUBERAY_GROUP: "g"}}, "spec": {}},
        },
    )
    objects.create_provisioning_request(NS, provisioning_request("r", raw, "g", 4))
    return events, objects, controller, broker


def _conditions(objects: ProvisioningObjects) -> dict[str, str]:
    request = objects.request(NS, "r")
    assert request is not None
    return {c["type"]: c["status"] for c in request.get("status", {}).get("conditions", [])}


def test_accepted_then_provisioned_after_the_queueing_delay_when_capacity_exists() -> None:
    events, objects, controller, broker = _world(free=1)
    events.run_until(1)
    assert _conditions(objects) == {}
    events.run_until(3)
    assert _conditions(objects) == {"Accepted": "True"}
    events.run_until(59)
    assert "Provisioned" not in _conditions(objects)
    events.run_until(61)
    assert _conditions(objects) == {"Accepted": "True", "Provisioned": "True"}
    assert broker.held == {"r"} and controller.provisioned == ["r"]


def test_under_stockout_it_waits_then_fails_past_its_timeout() -> None:
    events, objects, _, broker = _world(free=0, fail_after_s=600.0)
    events.run_until(590)
    assert _conditions(objects) == {"Accepted": "True"}
    broker.free = 0
    events.run_until(700)
    assert _conditions(objects)["Failed"] == "True" and "Provisioned" not in _conditions(objects)


def test_capacity_that_returns_in_time_is_granted() -> None:
    events, objects, _, broker = _world(free=0, fail_after_s=600.0)
    events.run_until(300)
    broker.free = 1
    events.run_until(340)
    assert _conditions(objects).get("Provisioned") == "True"


@pytest.mark.parametrize("consumed", [False, True])
def test_booking_expires_ten_minutes_after_provisioning_unless_consumed(consumed: bool) -> None:
    events, objects, _, broker = _world(free=1)
    events.run_until(61)
    if consumed:
        broker.held.discard("r")  # its pods took the nodes
    events.run_until(60 + 599)
    assert "BookingExpired" not in _conditions(objects)
    events.run_until(60 + 601)
    assert ("BookingExpired" in _conditions(objects)) is not consumed
    assert broker.held == set()


def test_revoked_capacity_is_said_and_taken_back() -> None:
    events, objects, controller, broker = _world(free=1)
    events.run_until(61)
    controller.revoke("r")
    assert _conditions(objects)["CapacityRevoked"] == "True"
    assert broker.revoked == ["r"] and broker.held == set()


def test_a_deleted_request_frees_what_it_held() -> None:
    events, objects, _, broker = _world(free=1)
    events.run_until(61)
    objects.delete_provisioning_request(NS, "r")
    assert broker.held == set() and broker.free == 1


# --- whole runs ------------------------------------------------------------------------

QUEUED, PLAIN = "queued", "plain"


def two_groups() -> dict[str, Any]:
    """A v6e 4x4 group with queued provisioning, and a v5e 4x4 group without."""
    raw: dict[str, Any] = yaml.safe_load(V6E.read_text())
    queued = raw["spec"]["workerGroupSpecs"][0]
    plain = copy.deepcopy(queued)
    queued["groupName"] = QUEUED
    queued["template"]["metadata"] = {"annotations": {QUEUED_PROVISIONING_ANNOTATION: "true"}}
    plain["groupName"] = PLAIN
    plain["template"]["spec"]["nodeSelector"][labels.GKE_TPU_ACCELERATOR_SELECTOR] = (
        "tpu-v5-lite-podslice"
    )
    raw["spec"]["workerGroupSpecs"].append(plain)
    for spec in raw["spec"]["workerGroupSpecs"]:
        spec["maxReplicas"] = 3
    return raw


def slice_gang(
    pod_type: str, count: int = 1, at: float = 0, duration: float = 900
) -> dict[str, Any]:
    return {
        "at": at,
        "duration": duration,
        "count": count,
        "placement_group": {
            "strategy": "STRICT_SPREAD",
            "bundles": [{"TPU": 4}] * 4,
            "bundle_label_selector": [{labels.RAY_TPU_POD_TYPE: pod_type}] * 4,
        },
    }


class PodTimes:
    """When each pod was created and bound, heard from the store."""

    def __init__(self, sim: SimulatedCluster) -> None:
        self.sim = sim
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.group: dict[str, str] = {}
        self.consumes: dict[str, str] = {}
        sim.store.watchers.append(self.heard)

    def heard(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "Pod":
            return
        meta = obj["metadata"]
        name = meta["name"]
        group = meta.get("labels", {}).get(labels.KUBERAY_GROUP)
        if group not in (QUEUED, PLAIN):
            return
        self.group[name] = group
        self.created.setdefault(name, self.sim.events.now_s)
        if obj["spec"].get("nodeName"):
            self.bound.setdefault(name, self.sim.events.now_s)
        consumed = (meta.get("annotations") or {}).get(CONSUME_ANNOTATION)
        if consumed:
            self.consumes[name] = consumed

    def longest_unbound_s(self, group: str) -> float:
        end = self.sim.events.now_s
        return max(
            (self.bound.get(p, end) - t for p, t in self.created.items() if self.group[p] == group),
            default=0.0,
        )


def _run(
    faults: list[dict[str, Any]],
    until_s: float,
    timings: QueueTimings | None = None,
    seed: int = 3,
    before: Callable[[SimulatedCluster], None] = lambda sim: None,
) -> tuple[SimulatedCluster, PodTimes, dict[str, Any]]:
    trace = parse_workload(
        {"items": [slice_gang("v6e-16", 2), slice_gang("v5litepod-16", 2)], "faults": faults},
        "t",
    )
    sim = SimulatedCluster(
        two_groups(), seed=seed, capacity={QUEUED: 2, PLAIN: 1}, queue_timings=timings
    )
    times = PodTimes(sim)
    before(sim)
    sim.load(trace)
    return sim, times, sim.run(until_s)


STOCKOUT = [
    {"at": 0, "stockout": {"group": QUEUED, "until": 900}},
    {"at": 0, "stockout": {"group": PLAIN, "until": 900}},
]


@pytest.mark.parametrize("seed", [3, 4])
def test_a_queued_group_gets_whole_slices_while_a_plain_groups_pods_wait(seed: int) -> None:
    """Both groups stocked out for 15 minutes, then room for two queued slices and one
    plain one; two one-slice gangs each. The plain group's pods sit Pending for
    capacity (its second slice for the whole first job); the queued group's pods
    exist only once GKE granted their request and are placed at once, four per
    request, the two requests bound one after the other."""
    sim, times, summary = _run(STOCKOUT, 3600, seed=seed)
    assert summary["unsatisfied_at_end"] == 0
    assert times.longest_unbound_s(PLAIN) > 900
    assert 0 < times.longest_unbound_s(QUEUED) <= 5
    queued_pods = [p for p, g in times.group.items() if g == QUEUED]
    assert len(queued_pods) == 8
    per_request: dict[str, int] = defaultdict(int)
    for pod in queued_pods:
        per_request[times.consumes[pod]] += 1
    assert sorted(per_request.values()) == [4, 4]
    assert sim.queued is not None
    assert sorted(per_request) == sorted(sim.queued.controller.provisioned)
    # Announced once per request asked for and once per slice bound, not every round.
    reasons = [(e["reason"], e["message"]) for e in sim.store.events]
    launches = [m for r, m in reasons if r == "LaunchReplicas" and f"of {QUEUED} (" in m]
    assert len(launches) == 2
    asked = [m for r, m in reasons if r == "ProvisioningRequested"]
    assert len(asked) == sim.queued.objects.requests_created == 2
    # Nothing is left behind once the work is done.
    assert sim.queued.objects.list_provisioning_requests(NS) == []
    assert sim.queued.objects.list_pod_templates(NS) == []


def test_requests_wait_for_capacity_and_replicas_stay_put_meanwhile() -> None:
    sim, _, _ = _run(STOCKOUT, 600)
    assert sim.queued is not None
    requests = sim.queued.objects.list_provisioning_requests(NS)
    assert len(requests) == 2
    assert all(r["spec"]["podSets"][0]["count"] == 4 for r in requests)
    spec = sim.store.get_raycluster(NS, sim.name)["spec"]["workerGroupSpecs"][0]
    assert spec["groupName"] == QUEUED and spec["replicas"] == 0
    assert sim.store.list_pods(NS, {labels.KUBERAY_GROUP: QUEUED}) == []


def test_a_request_failed_under_stockout_reaches_the_policy_as_a_signal() -> None:
    seen: list[tuple[Any, ...]] = []

    def spy(sim: SimulatedCluster) -> None:
        def decide(loaded: LoadedSnapshot) -> Plan:
            seen.append(loaded.snapshot.capacity_signals)
            return decide_by_slices(loaded)

        sim.autoscaler.decide = decide

    faults = [{"at": 0, "stockout": {"group": QUEUED, "until": 3000}}]
    # A failure at ~600 s stocks the group out for `stockout_hold_s` (600 s): no new
    # request until ~1200 s; by 1400 s a fresh one is out.
    sim, _, _ = _run(faults, 1400, QueueTimings(fail_after_s=600.0), before=spy)
    every = {s for round_signals in seen for s in round_signals}
    # The plain group's pods meet the stockout too: GKE's FailedScaleUp Events.
    assert all(s.source.startswith("Event FailedScaleUp") for s in every if s.group != QUEUED)
    signals = {s for s in every if s.group == QUEUED}
    assert signals and {s.problem for s in signals} == {CapacityProblem.STOCKOUT}
    assert all(s.source.startswith("ProvisioningRequest ") for s in signals)
    # The failed requests are gone; once the hold passed, the demand asked for fresh ones.
    assert sim.queued is not None
    failed = {s.source.removeprefix("ProvisioningRequest ") for s in signals}
    names = {r["metadata"]["name"] for r in sim.queued.objects.list_provisioning_requests(NS)}
    assert names and not names & failed
    ended = [e["message"] for e in sim.store.events if e["reason"] == "ProvisioningRequestEnded"]
    assert len(ended) == len(failed) and all("no capacity" in m for m in ended)


def test_a_restart_or_a_failed_write_between_steps_loses_nothing() -> None:
    """Every 10th request write fails after its PodTemplate was created, and the
    autoscaler restarts (all memory lost) every 7 rounds: the queued group still
    gets its slices whole, and no PodTemplate outlives its request."""

    def flaky(sim: SimulatedCluster) -> None:
        failing_writes_and_restarts(sim, fail_every=10, restart_every=7)

    sim, times, summary = _run(STOCKOUT, 3600, before=flaky)
    assert summary["unsatisfied_at_end"] == 0
    assert times.longest_unbound_s(QUEUED) <= 5
    assert sim.queued is not None
    assert sim.queued.objects.list_pod_templates(NS) == []


def test_without_a_granted_request_a_queued_groups_pods_are_never_placed() -> None:
    """`replicas` raised as for any other group (as Ray's stock autoscaler would):
    GKE grows a queued-provisioning node pool only for requests, so those pods stay
    Pending (what docs/queued-provisioning.md warns of)."""
    sim = SimulatedCluster(two_groups(), seed=3)
    times = PodTimes(sim)
    operations = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]
    sim.store.patch_raycluster(NS, sim.name, operations, None)
    sim.run(600)
    queued = [p for p, g in times.group.items() if g == QUEUED]
    assert len(queued) == 4 and not any(p in times.bound for p in queued)
