"""Ray's limits through our `SliceScheduler`: `max_num_nodes` (the head among them)
and each type's `max_worker_nodes` (the head counting toward its own type) bound
launches, and instances above them are terminated with Ray's causes."""

from __future__ import annotations

from ray.autoscaler.v2.utils import ResourceRequestUtil
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind, TerminationRequest

from tests.ray_requests import launched, node_type, pending, request, running, terminated
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler

PER_TYPE = TerminationRequest.Cause.MAX_NUM_NODE_PER_TYPE
GLOBAL = TerminationRequest.Cause.MAX_NUM_NODES
CPU1 = {"CPU": 1.0}


def _instances() -> list:  # type: ignore[type-arg]
    return [
        pending("p", "small"),
        running("idle", "small", CPU1, idle_ms=5000),
        running("half", "big", {"CPU": 2.0}, {"CPU": 1.0}),
        running("full", "big", {"CPU": 2.0}, {"CPU": 0.0}),
    ]


def test_instances_above_a_types_max_go_pending_first_then_least_used() -> None:
    types = [node_type("small", CPU1, max_nodes=0), node_type("big", {"CPU": 2}, max_nodes=1)]
    reply = SliceScheduler(cluster=None).schedule(request(types, _instances()))
    assert terminated(reply) == [("half", PER_TYPE), ("idle", PER_TYPE), ("p", PER_TYPE)]


def test_instances_above_max_num_nodes_go_and_the_head_counts() -> None:
    types = [node_type("small", CPU1), node_type("big", {"CPU": 2})]
    head = running("head", "head", {"CPU": 4.0}, kind=NodeKind.HEAD)
    reply = SliceScheduler(cluster=None).schedule(
        request(types, [head, *_instances()], max_num_nodes=3)
    )
    # 1 head + 4 workers, 3 allowed: the pending one, then the idle one.
    assert terminated(reply) == [("idle", GLOBAL), ("p", GLOBAL)]


def test_launches_stop_at_max_num_nodes() -> None:
    tasks = [ResourceRequestUtil.make(CPU1)] * 5
    reply = SliceScheduler(cluster=None).schedule(
        request([node_type("small", CPU1)], tasks=tasks, max_num_nodes=2)
    )
    assert launched(reply) == {"small": 2}


def test_the_head_counts_toward_its_own_types_max() -> None:
    head = running("head", "shared", CPU1, kind=NodeKind.HEAD)
    workers = [pending("w1", "shared"), pending("w2", "shared", Instance.QUEUED)]
    types = [node_type("shared", CPU1, max_nodes=2)]
    reply = SliceScheduler(cluster=None).schedule(request(types, [head, *workers]))
    assert [cause for _, cause in terminated(reply)] == [PER_TYPE]
    assert terminated(reply)[0][0] in ("w1", "w2")
    tasks = [ResourceRequestUtil.make(CPU1)] * 3
    reply = SliceScheduler(cluster=None).schedule(request(types, [head], tasks=tasks))
    assert launched(reply) == {"shared": 1}
