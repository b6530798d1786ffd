"""The conformance harness's pieces (benchmarks/conformance_ray_scheduler.py) without
Ray's test file, which CI does not have: the stand-in for ResourceDemandScheduler
builds our scheduler from a SchedulingRequest alone and compares it with Ray's; a
reach into Ray's internals is told apart; the table calls an empty-reply pass an
accident."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ray.autoscaler.v2.scheduler import NodeTypeConfig, SchedulingRequest
from ray.autoscaler.v2.utils import ResourceRequestUtil
from ray.core.generated.autoscaler_pb2 import ClusterResourceConstraint

HARNESS = Path(__file__).resolve().parent.parent / "benchmarks" / "conformance_ray_scheduler.py"


@pytest.fixture(scope="module")
def harness() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("conformance_ray_scheduler", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _request(**resources: float) -> SchedulingRequest:
    return SchedulingRequest(
        disable_launch_config_check=True,
        node_type_configs={
            "cpu": NodeTypeConfig(
                name="cpu", resources={"CPU": 4}, min_worker_nodes=0, max_worker_nodes=2
            )
        },
        resource_requests=ResourceRequestUtil.group_by_count(
            [ResourceRequestUtil.make(dict(resources))]
        ),
    )


def test_the_stand_in_is_our_scheduler_built_from_the_request_alone(harness: Any) -> None:
    harness.PROBE = harness.Probe()
    scheduler = harness.SliceSchedulerAsRay(event_logger=None)

    reply = scheduler.schedule(_request(CPU=1))

    assert [(r.instance_type, r.count) for r in reply.to_launch] == [("cpu", 1)]
    assert scheduler.inner.last_plan is not None  # our policy decided, not Ray's
    assert (harness.PROBE.schedule_calls, harness.PROBE.decided) == (1, 1)
    assert harness.PROBE.same_as_ray == 1


def test_a_difference_from_ray_is_recorded_call_by_call(harness: Any) -> None:
    harness.PROBE = harness.Probe()
    scheduler = harness.RayWithOursAside()

    reply = scheduler.schedule(_request(CPU=1))
    scheduler.schedule(_request(GPU=1))  # infeasible for both: the same decision

    assert [(r.instance_type, r.count) for r in reply.to_launch] == [("cpu", 1)]
    assert (harness.PROBE.schedule_calls, harness.PROBE.same_as_ray) == (2, 2)
    ours = {"launch": {"cpu": 2}, "terminate": [], "infeasible": {"requests": 0}}
    ray = {"launch": {"cpu": 1}, "terminate": [], "infeasible": {"requests": 1}}
    assert harness.difference(ours, ray) == (
        "launch {'cpu': 2} (Ray {'cpu': 1}), infeasible requests 0 (Ray 1)"
    )


def test_reaching_into_rays_scheduler_is_not_applicable(harness: Any) -> None:
    harness.PROBE = harness.Probe()
    with pytest.raises(harness.NotApplicable):
        _ = harness.SliceSchedulerAsRay._sched_best_node
    with pytest.raises(harness.NotApplicable):
        _ = harness.EmptyReplyScheduler()._event_logger
    with pytest.raises(AttributeError):
        _ = harness.SliceSchedulerAsRay._no_such_thing
    assert harness.PROBE.private == {"_sched_best_node", "_event_logger"}


def test_an_old_copys_min_bundles_reaches_the_renamed_field(harness: Any) -> None:
    build = harness.min_bundles_compat(ClusterResourceConstraint)
    bundles = ResourceRequestUtil.group_by_count([ResourceRequestUtil.make({"CPU": 1})])
    assert len(build(min_bundles=bundles).resource_requests) == 1


def test_the_table_calls_a_pass_an_empty_reply_also_passes_an_accident(harness: Any) -> None:
    calls = {"schedule_calls": 1, "same_as_ray": 1, "differences": []}
    runs = {
        "ray": {"f::a": {"outcome": "passed"}, "f::b": {"outcome": "passed"}},
        "ours": {
            "f::a": {"outcome": "passed", **calls},
            "f::b": {"outcome": "failed", "message": "line 3: assert 1 == 2", **calls},
        },
        "empty": {"f::a": {"outcome": "passed", **calls}, "f::b": {"outcome": "failed", **calls}},
        "compare": {"f::a": calls, "f::b": {**calls, "same_as_ray": 0}},
    }

    a, b = harness.rows_of(runs)

    assert (a.ours, a.accident, a.same) == ("pass", True, "1/1")
    assert (b.ours, b.gap, b.same, b.note) == ("FAIL", True, "0/1", "line 3: assert 1 == 2")
    assert "Ray passes 2, ours 1 (1 of them by accident)" in harness.totals_of([a, b]).render()
