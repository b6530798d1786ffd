"""Outdated replicas (launched from a configuration their group no longer has, Ray's
`launch_config_hash`) are replaced, as Ray 2.60 does when its launch config check is
on; instances of a node type configured no more are terminated. A slice in use stays."""

from __future__ import annotations

from dataclasses import replace

from ray.core.generated.instance_manager_pb2 import Instance, TerminationRequest

from tests.factories import cpu_group
from tests.ray_requests import launched, node_type, pending, request, running, terminated
from tests.snapshots import running_replica, shapes_for, snapshot, v6e_16_shapes
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.core.plan import RemovalCause
from tpu_autoscaler.core.policy import plan

OUTDATED = TerminationRequest.Cause.OUTDATED


def test_an_outdated_replica_is_removed_and_min_replicas_replace_it() -> None:
    (shape,) = shapes_for(cpu_group("cpu", 2, 5))
    old = replace(running_replica(shape, 0, used={0: {"CPU": 1.0}}), outdated=True)
    result = plan(snapshot((shape,), [old, running_replica(shape, 1)]))
    (removal,) = result.terminate
    assert (removal.replica, removal.cause) == (old.name, RemovalCause.OUTDATED)
    assert removal.reason == "launched from a configuration its group no longer has"
    assert [(x.group, x.replicas) for x in result.launch] == [("cpu", 1)]


def test_an_outdated_slice_in_use_stays_until_idle() -> None:
    (shape,) = v6e_16_shapes()
    busy = replace(running_replica(shape, 0, used={2: {"TPU": 4}}), outdated=True)
    assert plan(snapshot((shape,), [busy])).terminate == ()
    idle = replace(running_replica(shape, 0, idle_s=5.0), outdated=True)
    (removal,) = plan(snapshot((shape,), [idle])).terminate
    assert removal.cause is RemovalCause.OUTDATED and len(removal.pods) == 4


def _types(hash_: str = "new"):  # type: ignore[no-untyped-def]
    config = node_type("cpu", {"CPU": 1}, min_nodes=2, max_nodes=5)
    config.launch_config_hash = hash_
    return [config]


def _instance(instance_id: str, hash_: str):  # type: ignore[no-untyped-def]
    instance = running(instance_id, "cpu", {"CPU": 1.0})
    instance.im_instance.launch_config_hash = hash_
    return instance


def test_the_scheduler_replaces_an_instance_of_an_old_launch_config() -> None:
    instances = [_instance("old", "old"), _instance("current", "new")]
    reply = SliceScheduler(cluster=None).schedule(
        request(_types(), instances, disable_launch_config_check=False)
    )
    assert terminated(reply) == [("old", OUTDATED)]
    assert launched(reply) == {"cpu": 1}
    kept = SliceScheduler(cluster=None).schedule(
        request(_types(), instances, disable_launch_config_check=True)
    )
    assert terminated(kept) == [] and launched(kept) == {}


def test_the_scheduler_terminates_instances_of_a_type_configured_no_more() -> None:
    instances = [pending("gone", "retired", Instance.REQUESTED), _instance("a", "new")]
    instances.append(_instance("b", "new"))
    reply = SliceScheduler(cluster=None).schedule(
        request(_types(), instances, disable_launch_config_check=False)
    )
    assert terminated(reply) == [("gone", OUTDATED)]
