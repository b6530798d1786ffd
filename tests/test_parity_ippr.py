"""Drop-in parity with in-place pod resize: on a RayCluster of single-host CPU and GPU
groups, some named in its `ray.io/ippr` annotation, our plan launches, terminates and
resizes what Ray 2.60's own scheduler does when given the IPPR specs and pod statuses
its `KubeRayProvider` reads (`baseline.ray_plan`; Ray's `KubeRayIPPRProvider` reads
them from the same RayCluster and pods). Pods are at their template size, already
grown to the maximum, resized by Kubernetes but not yet synced to their raylet, or
past a failed resize; demand is tasks and actors without TPUs.

Settled plans (docs/design.md): Ray is run again on the cluster its plan leaves until
it launches nothing. KubeRay creates a launched replica's pod within a round, so the
pods of Ray's launches are listed (Pending, no raylet yet) in those rounds; Ray counts
a pod without a raylet at its maximum (it may grow), as we count hosts not up yet."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler

from tests.test_parity_properties import (
    IDLE_TIMEOUT_S,
    _group,
    _raycluster,
    launches,
    ray_launches,
    terminations,
)
from tpu_autoscaler.adapters.ray.baseline import ray_plan, ray_request
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.adapters.snapshot_file import build_snapshot
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.shell.controller import decide_by_slices
from tpu_autoscaler.testing.scenarios import SnapshotBuilder

GIB = 2**30
SIZES = ((1, 0), (2, 0), (4, 0), (8, 4))
"""(CPUs, GPUs) of a generated group's pod; 4 GiB of memory per CPU."""
MAX_CPUS = (2, 4, 8, 16)


def ippr_annotation(max_cpus: Mapping[str, int]) -> str:
    groups = {
        name: {"max-cpu": str(cpus), "max-memory": f"{4 * cpus}Gi", "resize-timeout": 300}
        for name, cpus in max_cpus.items()
    }
    return json.dumps({"groups": groups})


def set_pod_size(
    builder: SnapshotBuilder, cpus: float, recorded: Mapping[str, Any] | None = None
) -> None:
    """The last pod built, resized by Kubernetes to `cpus` (4 GiB each) with its raylet
    told (or not: `recorded` is then its `ray.io/ippr-status`)."""
    pod = builder.pods[-1]
    container = pod["spec"]["containers"][0]
    size = {"cpu": f"{cpus:g}", "memory": f"{4 * cpus:g}Gi"}
    container["resources"]["requests"].update(size)
    container["resources"]["limits"].update(size)
    pod["status"]["containerStatuses"] = [
        {
            "name": container["name"],
            "ready": True,
            "state": {"running": {"startedAt": "2026-12-02T11:00:00Z"}},
            "resources": {"requests": size, "limits": dict(size)},
        }
    ]
    if recorded is not None:
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations["ray.io/ippr-status"] = json.dumps(recorded)
        return
    node = builder.state.node_states[-1]
    for name, amount in (("CPU", float(cpus)), ("memory", 4.0 * cpus * GIB)):
        used = node.total_resources[name] - node.available_resources.get(name, 0.0)
        node.total_resources[name] = amount
        node.available_resources[name] = amount - used


@st.composite
def ippr_snapshots(draw: st.DrawFn, crowded: bool = False) -> dict[str, Any]:
    """Groups of `SIZES` (`crowded`: a small CPU group first, every CPU group resizable
    and its replicas mostly busy, so demand often needs growth)."""
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3, unique=True))
    if crowded:
        first = draw(st.sampled_from(SIZES[:2]))
        sizes = [first, *(x for x in sizes if x != first)]
    groups = [
        _group(f"group-{i}", cpus, gpus, draw(st.integers(1, 4)))
        for i, (cpus, gpus) in enumerate(sizes)
    ]
    max_cpus = {
        g["groupName"]: draw(st.sampled_from([m for m in MAX_CPUS if m > cpus]))
        for g, (cpus, gpus) in zip(groups, sizes, strict=True)
        if not gpus and (crowded or draw(st.integers(0, 3)))
    }
    raycluster = _raycluster(groups, draw(st.sampled_from([0, 2])))
    raycluster["metadata"]["annotations"] = {"ray.io/ippr": ippr_annotation(max_cpus)}
    builder = SnapshotBuilder(raycluster)
    builder.head(used={"CPU": 2.0} if draw(st.booleans()) else None)
    for index, group in enumerate(groups):
        name = group["groupName"]
        cpus = sizes[index][0]
        for replica in range(draw(st.integers(0, group["maxReplicas"]))):
            busy = draw(st.integers(0, 3)) > 0 if crowded else draw(st.booleans())
            used = {0: {"CPU": float(cpus)}} if busy else None
            idle_s = 0.0 if used else draw(st.sampled_from([0.0, 30.0, 2.0 * IDLE_TIMEOUT_S]))
            builder.replica(name, replica, used=used, idle_s=idle_s)
            if name not in max_cpus:
                continue
            state = draw(st.sampled_from(["template", "grown", "unsynced", "failed"]))
            if state == "grown":
                set_pod_size(builder, max_cpus[name])
            elif state == "unsynced":
                set_pod_size(
                    builder, max_cpus[name], {"resizing-at": 1_700_000_000, "raylet-id": "ab"}
                )
            elif state == "failed":
                set_pod_size(builder, cpus, {"last-failed-at": 1_700_000_000})
    shapes = [{"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 3.0}, {"CPU": 6.0}, {"CPU": 12.0}, {"GPU": 1.0}]
    for resources in draw(st.lists(st.sampled_from(shapes), min_size=1, max_size=3)):
        builder.tasks(resources, count=draw(st.integers(1, 5)))
    if draw(st.booleans()):
        bundles = draw(st.lists(st.sampled_from(shapes[:4]), min_size=1, max_size=3))
        builder.placement_group("pg", bundles, draw(st.sampled_from(["PACK", "SPREAD"])))
    return builder.build()


def resizes(plan: Plan) -> set[tuple[str, tuple[tuple[str, float], ...]]]:
    return {(x.pod, tuple(sorted(x.resources_to.items()))) for x in plan.resize}


RAY_ROUNDS = 4


def ray_settled_launches(raw: Mapping[str, Any], first: Plan) -> Counter[str]:
    """Ray's launches over rounds; the pods of its launches listed, Pending."""
    raw = copy.deepcopy(dict(raw))
    total: Counter[str] = Counter()
    # Pods are named after their index: each new one past every index used so far.
    ever = Counter(p["metadata"]["labels"].get("ray.io/group") for p in raw["pods"]["items"])
    plan = first
    for _ in range(RAY_ROUNDS):
        launched = ray_launches(plan)
        if not launched:
            break
        total += launched
        gone = terminations(plan)
        builder = SnapshotBuilder(raw["raycluster"])
        builder.pods = [p for p in raw["pods"]["items"] if p["metadata"]["name"] not in gone]
        builder.state.ParseFromString(build_snapshot(raw, "parity").ray.message.SerializeToString())
        kept = [n for n in builder.state.node_states if n.instance_id not in gone]
        del builder.state.node_states[:]
        builder.state.node_states.extend(kept)
        for group in raw["raycluster"]["spec"]["workerGroupSpecs"]:
            name = group["groupName"]
            count = sum(
                1 for p in builder.pods if p["metadata"]["labels"].get("ray.io/group") == name
            )
            builder.replica_counts[name] = count
            for index in range(launched[name]):
                builder.replica(name, ever[name] + index, running=False)
            ever[name] += launched[name]
        raw = builder.build()
        plan = ray_plan(build_snapshot(raw, "parity"))
    return total


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw=st.one_of(ippr_snapshots(), ippr_snapshots(crowded=True)))
def test_with_in_place_resize_we_launch_terminate_and_resize_as_ray(raw: dict[str, Any]) -> None:
    loaded = build_snapshot(raw, "parity")
    ours = decide_by_slices(loaded)
    theirs = ray_plan(loaded)
    texts = (ours.render_text(), theirs.render_text())
    event(f"resizes: {min(len(theirs.resize), 2)}")
    event(f"launches: {min(sum(ray_launches(theirs).values()), 2)}")
    assert terminations(ours) == terminations(theirs), texts
    assert resizes(ours) == resizes(theirs), texts
    if launches(ours) != ray_launches(theirs):
        assert launches(ours) == ray_settled_launches(raw, theirs), texts


def _queued(reply: Any) -> set[tuple[str, float, int]]:
    return {(s.cloud_instance_id, s.desired_cpu, s.desired_memory) for s in reply.to_ippr}


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw=ippr_snapshots(crowded=True))
def test_slice_scheduler_queues_the_resizes_rays_scheduler_queues(raw: dict[str, Any]) -> None:
    """Through Ray's own interface (`SliceScheduler` in place of Ray's scheduler, in
    Ray's reconciler): the same `SchedulingRequest`, the same `to_ippr`."""
    loaded = build_snapshot(raw, "parity")
    theirs = ResourceDemandScheduler(event_logger=None).schedule(ray_request(loaded))
    ours = SliceScheduler(clock=lambda: loaded.snapshot.now_s).schedule(ray_request(loaded))
    event(f"resizes: {min(len(theirs.to_ippr), 2)}")
    assert _queued(ours) == _queued(theirs)
