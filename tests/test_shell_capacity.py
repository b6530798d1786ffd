"""How a group's capacity in the plan reaches people: an Event on the RayCluster when
its status changes (not each round), per-group gauges, and `ray status` (as Ray
2.60's own formatter prints what we report) with the failing launches and the reason
beside each waiting host. The plans' `capacity` is written here by hand: the policy
fills it elsewhere."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from ray.autoscaler.v2.schema import Stats
from ray.autoscaler.v2.utils import ClusterStatusFormatter, ClusterStatusParser
from ray.core.generated import autoscaler_pb2

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.adapters.kube.api import Unavailable
from tpu_autoscaler.adapters.ray.gcs import GcsUnavailable
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.capacity import CapacityStatus, GroupCapacity
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.shell import events
from tpu_autoscaler.shell.capacity import clock_time
from tpu_autoscaler.shell.controller import Autoscaler, decide_by_slices
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import WorkItem

STOCKED_OUT = GroupCapacity(
    "slices", CapacityStatus.STOCKED_OUT, since_s=100.0, reason="GCE out of resources (Event)"
)
BACKING_OFF = GroupCapacity(
    "slices", CapacityStatus.BACKING_OFF, since_s=100.0, until_s=700.0, reason="2 launches failed"
)
CHURNING = GroupCapacity("singles", CapacityStatus.CHURNING, since_s=50.0, until_s=1850.0)


class Script:
    """The policy's plans with `capacity` replaced by the next entry of a script."""

    def __init__(self, *rounds: tuple[GroupCapacity, ...]) -> None:
        self.rounds = list(rounds)
        self.last: tuple[GroupCapacity, ...] = ()

    def __call__(self, loaded: LoadedSnapshot) -> Plan:
        if self.rounds:
            self.last = self.rounds.pop(0)
        return replace(decide_by_slices(loaded), capacity=self.last)


def _sim(script: Callable[[LoadedSnapshot], Plan]) -> SimulatedCluster:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    cluster = raycluster(
        tpu_group("slices", catalog.slice_type(v6e, "4x4"), 0, 3, idleTimeoutSeconds=60),
        tpu_group("singles", catalog.slice_type(v6e, "2x4", 8), 0, 3, idleTimeoutSeconds=60),
        name="cap",
    )
    sim = SimulatedCluster(cluster, provisioning_delay=lambda _: 60.0)
    sim.autoscaler.decide = script
    return sim


def _capacity_events(sim: SimulatedCluster) -> list[tuple[str, str, str]]:
    reasons = {
        events.CAPACITY_STOCKED_OUT,
        events.CAPACITY_BACKING_OFF,
        events.CAPACITY_CHURNING,
        events.CAPACITY_AVAILABLE,
    }
    return [
        (e["reason"], e["type"], e["message"])
        for e in sim.store.events
        if e["reason"] in reasons and e["involvedObject"]["kind"] == "RayCluster"
    ]


def test_an_event_is_recorded_when_a_groups_status_changes_and_only_then() -> None:
    script = Script((), (STOCKED_OUT,), (STOCKED_OUT,), (BACKING_OFF, CHURNING), (BACKING_OFF,), ())
    sim = _sim(script)
    for _ in range(8):  # the script's six rounds, then two more like the last
        assert sim.autoscaler.step().applied
    at = clock_time
    assert _capacity_events(sim) == [
        (
            "CapacityStockedOut",
            "Warning",
            f"worker group 'slices': stocked out since {at(100.0)}: GCE out of resources (Event)",
        ),
        # One round's changes in group order.
        ("CapacityChurning", "Warning", f"worker group 'singles': churning until {at(1850.0)}"),
        (
            "CapacityBackingOff",
            "Warning",
            f"worker group 'slices': backing off until {at(700.0)}: 2 launches failed",
        ),
        ("CapacityAvailable", "Normal", "worker group 'singles': capacity available again"),
        ("CapacityAvailable", "Normal", "worker group 'slices': capacity available again"),
    ]


def test_a_restarted_autoscaler_announces_a_short_group_again_once() -> None:
    sim = _sim(Script((STOCKED_OUT,)))
    sim.autoscaler.step()
    sim.autoscaler = Autoscaler(
        sim.autoscaler.kube,
        sim.autoscaler.gcs,
        sim.namespace,
        sim.name,
        clock=lambda: sim.events.now_s,
        decide=Script((STOCKED_OUT,)),
    )
    sim.autoscaler.step()
    sim.autoscaler.step()
    assert [r for r, _, _ in _capacity_events(sim)] == ["CapacityStockedOut"] * 2


def _gauges(sim: SimulatedCluster, group: str) -> dict[str, float | None]:
    registry = sim.autoscaler.metrics.registry
    found: dict[str, float | None] = {
        str(status): registry.get_sample_value(
            "tpu_autoscaler_group_capacity", {"group": group, "status": str(status)}
        )
        for status in CapacityStatus
    }
    for bound in ("since", "until"):
        found[bound] = registry.get_sample_value(
            f"tpu_autoscaler_group_capacity_{bound}_timestamp_seconds", {"group": group}
        )
    return found


def test_each_group_has_gauges_of_its_status_and_bounds() -> None:
    sim = _sim(Script((BACKING_OFF,), ()))
    sim.autoscaler.step()
    assert _gauges(sim, "slices") == {
        "available": 0.0,
        "stocked_out": 0.0,
        "backing_off": 1.0,
        "churning": 0.0,
        "since": 100.0,
        "until": 700.0,
    }
    assert _gauges(sim, "singles") == {
        "available": 1.0,
        "stocked_out": 0.0,
        "backing_off": 0.0,
        "churning": 0.0,
        "since": 0.0,
        "until": 0.0,
    }
    sim.autoscaler.step()  # capacity back
    assert _gauges(sim, "slices")["available"] == 1.0
    assert _gauges(sim, "slices")["backing_off"] == 0.0
    assert _gauges(sim, "slices")["until"] == 0.0


def _ray_status(sim: SimulatedCluster) -> str:
    """What `ray status -v` prints from the state we reported (Ray 2.60's parser and
    formatter, on the GCS's cluster state and our autoscaling state)."""
    reply = autoscaler_pb2.GetClusterStatusReply()
    reply.autoscaling_state.CopyFrom(sim.ray.autoscaling_state)
    state = autoscaler_pb2.GetClusterResourceStateReply.FromString(
        sim.gcs.get_cluster_resource_state()
    )
    reply.cluster_resource_state.CopyFrom(state.cluster_resource_state)
    status = ClusterStatusParser.from_get_cluster_status_reply(reply, Stats())
    return ClusterStatusFormatter.format(status, verbose=True)


def test_ray_status_shows_failing_launches_and_why_hosts_wait() -> None:
    sim = _sim(Script((), (STOCKED_OUT, CHURNING)))
    work = {"slice_placement_group": {"topology": "4x4", "accelerator_version": "v6e"}}
    sim.submit(WorkItem.model_validate({"at": 0, "duration": 600, **work}))
    sim.events.run_until(5.0)  # a round: one slice launched, capacity plainly available
    assert "(no failures)" in _ray_status(sim)
    sim.events.run_until(10.0)  # KubeRay made its pods; the next round says stocked out
    shown = _ray_status(sim)
    failures = shown[shown.index("Recent failures:") :]
    assert " slices: LaunchFailed (latest_attempt: " in failures
    why = f"stocked out since {clock_time(100.0)}: GCE out of resources (Event)"
    attempt = datetime.fromtimestamp(100.0).strftime("%H:%M:%S")  # Ray prints local time
    assert f"LaunchFailed (latest_attempt: {attempt}) - {why}" in failures  # -v adds the why
    # Each waiting host, in "Pending:", with the why (`ray status` lowercases it).
    assert shown.lower().count(f"waiting for its hosts; {why.lower()}") == 4
    reported = sim.ray.autoscaling_state
    (failed,) = reported.failed_instance_requests
    assert (failed.ray_node_type_name, failed.count, failed.start_ts) == ("slices", 4, 100)
    waiting = [p.details for p in reported.pending_instances]
    assert len(waiting) == 4
    assert all(
        d.endswith(f"; stocked out since {clock_time(100.0)}: GCE out of resources (Event)")
        for d in waiting
    )
    # A churning group still launches: no failure is listed for it.
    assert [f.ray_node_type_name for f in reported.failed_instance_requests] == ["slices"]


def _events_forbidden(sim: SimulatedCluster) -> None:
    def forbidden(namespace: str, field_selector: str | None = None) -> list[dict[str, Any]]:
        raise Unavailable('events is forbidden: cannot list resource "events"')

    sim.store.list_events = forbidden  # type: ignore[method-assign]


def _gcs_silent_on_nodes(sim: SimulatedCluster) -> None:
    def silent(*args: Any, **kwargs: Any) -> dict[bytes, Any]:
        raise GcsUnavailable("GCS 127.0.0.1:6379: reading nodes: deadline exceeded")

    sim.gcs.get_all_node_info = silent  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("break_it", "api", "operation"),
    [
        (_events_forbidden, "kubernetes", "list_events"),
        (_gcs_silent_on_nodes, "gcs", "read_dead_nodes"),
    ],
    ids=["events", "dead-nodes"],
)
def test_a_source_of_signals_that_cannot_be_read_costs_only_its_signals(
    caplog: pytest.LogCaptureFixture,
    break_it: Callable[[SimulatedCluster], None],
    api: str,
    operation: str,
) -> None:
    sim = _sim(Script())
    break_it(sim)
    with caplog.at_level(logging.WARNING, logger="tpu_autoscaler"):
        rounds = [sim.autoscaler.step() for _ in range(3)]
    assert all(r.applied for r in rounds)
    value = sim.autoscaler.metrics.registry.get_sample_value(
        "tpu_autoscaler_api_errors_total", {"api": api, "operation": operation}
    )
    assert value == 3
    lines = [r for r in caplog.records if "no capacity signals" in r.getMessage()]
    assert len(lines) == 1, "said once, not each round"
    assert lines[0].getMessage().startswith(f"cannot {operation.replace('_', ' ')}")
