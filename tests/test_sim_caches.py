"""What the simulator and the autoscaler keep from one step to the next instead of
reading everything again equals what reading everything again gives, at every moment
of runs with preemptions, stockouts, churn, gangs and warm slices: the operator's pod
cache (`controlplane/kuberay_cache.py`) and which of the pods it deleted are still
stored, the replicas the autoscaler's read reuses
(`adapters/kube/pods.py` ReplicaMemo), the sampler's slice states, the simulated Ray
scheduler's indexes of its nodes by label and of its queue, the sampler's chips of VMs
up without a Ray node, and the simulated GCS's
state, built from each node's kept parts (`sim/gcs_state.py`), followed from the
ledger of the nodes that changed, and the dead nodes it lists (`SimRay.get_all_node_info`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.core.generated import gcs_pb2

from tpu_autoscaler.adapters import snapshot_file
from tpu_autoscaler.adapters.kube import pods as pod_adapter
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.snapshot import Replica
from tpu_autoscaler.sim import gcs_state
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.ray_model import Node, Work
from tpu_autoscaler.sim.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent
DEAD = gcs_pb2.GcsNodeInfo.DEAD
RUNS = [
    ("v6e-4x4-spot-and-on-demand", "spot-churn"),
    ("v6e-4x4-multihost", "spot-preemption-storm"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang-returns"),
    ("v6e-4x4-warm", "warm-buffer"),
    ("v6e-4x4-queued", "queued-provisioning"),
]
CHECK_EVERY_S = 1.3
"""Off the 5 s grid of the rounds and samples, so checks fall between their steps."""


def _cache_as_listed(sim: SimulatedCluster) -> dict[str, Any]:
    """The operator's cache in plain terms, and the same from listing the store."""
    cache = sim.operator.groups.cache
    cached = {
        "groups": {
            group: (
                {replica: sorted(pods) for replica, pods in held.replicas.items()},
                sorted(held.terminated),
                sorted(held.pods),
                dict(sorted(held.first_of.items())),
            )
            for group, held in cache.groups.items()
        },
        "running": cache.running_workers,
        "ready": cache.ready_workers,
    }
    listed_groups: dict[str, tuple[dict[str, list[str]], list[str], list[str]]] = {}
    # Each replica's first pod by name: the one whose index label KubeRay reads.
    running = ready = 0
    for pod in sim.store.list_pods(sim.namespace, {labels.KUBERAY_CLUSTER: sim.name}):
        meta = pod["metadata"]
        name = meta["name"]
        group = meta["labels"].get(labels.KUBERAY_GROUP)
        if group is not None:
            replicas, terminated, names = listed_groups.setdefault(group, ({}, [], []))
            names.append(name)
            if pod["status"]["phase"] in ("Failed", "Succeeded"):
                terminated.append(name)
            replica = meta["labels"].get(labels.KUBERAY_REPLICA_NAME)
            if replica is not None:
                replicas.setdefault(replica, []).append(name)
        worker = meta["labels"].get(labels.KUBERAY_NODE_TYPE) == "worker"
        if worker and pod["status"]["phase"] == "Running":
            running += 1
            ready += not meta.get("deletionTimestamp")
    listed = {
        "groups": {
            group: (
                {r: sorted(p) for r, p in replicas.items()},
                sorted(t),
                sorted(n),
                {r: min(p) for r, p in sorted(replicas.items())},
            )
            for group, (replicas, t, n) in listed_groups.items()
        },
        "running": running,
        "ready": ready,
    }
    return {"cached": cached, "listed": listed}


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {state: n for state, n in counts.items() if n}


Chips = tuple[int, int, list[tuple[str, int]], list[tuple[str, int]]]


def _chips(sim: SimulatedCluster) -> Chips:
    """The sampler's kept chips busy, idle, idle by group and busy by group, the
    groups' order too."""
    busy, idle, idle_by_group, busy_by_group = sim.sampler._chips()
    return busy, idle, list(idle_by_group.items()), list(busy_by_group.items())


def _chips_walked(sim: SimulatedCluster) -> Chips:
    busy, idle, idle_by_group, busy_by_group = sim.sampler.chips_from_nodes()
    return busy, idle, list(idle_by_group.items()), list(busy_by_group.items())


def _scheduler_indexes(sim: SimulatedCluster) -> dict[str, Any]:
    """The simulated Ray scheduler's indexes as kept, and as made from its nodes and
    its queue: the worker nodes with some of each resource free; the worker nodes
    under each label in `nodes`' order; the pending work, by kind,
    in queue order, each under a label that each of its bundles requires exactly (a
    node without it cannot hold the bundle), or among the work looked at whatever
    grew if a bundle requires none."""
    scheduler = sim.ray.scheduler
    by_label: dict[tuple[str, str], list[str]] = {}
    for node in scheduler.nodes.values():
        for label in node.labels.items():
            by_label.setdefault(label, []).append(node.pod)
    queued = sorted(scheduler._queued.values(), key=lambda entry: entry[0])
    queues = [*scheduler._queued_anywhere.values()] + [
        queue for by_kind in scheduler._queued_under.values() for queue in by_kind.values()
    ]

    def current(place: int, work: Work) -> bool:
        entry = scheduler._queued.get(id(work))
        return entry is not None and entry[1] is work and entry[0] == place

    def covered(work: Work) -> bool:
        """Each of its bundles has it queued, at its place, under its kind: under a
        label the bundle requires exactly, or under none if it requires none."""
        place = scheduler._queued[id(work)][0]

        def holds(queue: Any) -> bool:
            return queue is not None and any(p == place and w is work for p, w in queue.heap)

        return all(
            any(
                holds(scheduler._queued_under.get(label, {}).get(work.kind))
                for label in bundle.required_labels
            )
            if bundle.required_labels
            else holds(scheduler._queued_anywhere.get(work.kind))
            for bundle in work.distinct_bundles
        )

    scheduler._follow_room()
    room: dict[str, set[str]] = {}
    for node in scheduler.nodes.values():
        for key, free in node.available.items():
            if free > 0:
                room.setdefault(key, set()).add(node.pod)
    return {
        "cached": {
            "room": {key: set(held) for key, held in scheduler._room.items() if held},
            "by_label": {label: list(u) for label, u in scheduler._by_label.items() if u},
            "queue": [id(work) for _, work, _ in queued],
            "covered": [True for _ in scheduler.pending],
            "live": [queue.live for queue in queues],
            "empty queues": sum(not queue.live for queue in queues),
        },
        "listed": {
            "room": room,
            "by_label": by_label,
            "queue": [id(work) for work in scheduler.pending],
            "covered": [covered(work) for work in scheduler.pending],
            "live": [sum(current(p, w) for p, w in queue.heap) for queue in queues],
            "empty queues": 0,
        },
    }


def _gcs_state_kept_equals_made_anew(sim: SimulatedCluster) -> bool:
    """Whether the simulated GCS's reply from the parts it kept (each node's, and
    the last state's, `gcs_state.KeptState`) is the reply made with every part made
    anew."""
    kept_state = sim.ray.get_cluster_resource_state()
    kept_parts = sim.ray.gcs_parts
    for node in [*sim.ray.scheduler.live_nodes(), *sim.ray.dead.values()]:
        node.cached_fixed = node.cached_changing = node.cached_dead = None
    sim.ray.gcs_parts = gcs_state.KeptState()
    made_anew = sim.ray.get_cluster_resource_state()
    sim.ray.gcs_parts = kept_parts  # what it kept goes on, as if not looked at
    return made_anew == kept_state


def _dead_infos_kept_equal_made_anew(sim: SimulatedCluster) -> bool:
    """Whether the dead nodes the simulated GCS lists (`SimRay.get_all_node_info`,
    from the list and the infos it kept) are those made anew from the dead nodes: the
    newest not live again, oldest first, each with its death."""
    kept = sim.ray.get_all_node_info(state_filter=DEAD)
    made_anew = {}
    for pod, node in gcs_state.newest(sim.ray.dead):
        if pod not in sim.ray.nodes:
            info = gcs_pb2.GcsNodeInfo(
                node_id=node.node_id, state=DEAD, instance_id=pod, node_type_name=node.group
            )
            info.end_time_ms = int((node.died_at_s or 0.0) * 1000)
            info.death_info.reason = info.death_info.Reason.Value(
                node.death_reason or "UNSPECIFIED"
            )
            info.death_info.reason_message = node.death_message
            made_anew[node.node_id] = info
    return list(kept.items()) == list(made_anew.items())


@pytest.mark.parametrize(("cluster_name", "workload_name"), RUNS)
def test_what_is_kept_between_steps_equals_what_reading_again_gives(
    cluster_name: str, workload_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = yaml.safe_load((ROOT / f"examples/clusters/{cluster_name}.yaml").read_text())
    workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
    reused: list[int] = []
    made_again = pod_adapter.replicas_of

    def both_ways(*args: Any) -> tuple[Replica, ...]:
        """The replicas with the autoscaler's memo, checked against those made anew
        (with the same registration times: a kept replica's are those it would take)."""
        *inputs, memo, registrations, _changes = args
        kept = {id(r) for r in memo.made} if memo is not None else set()
        with_memo = made_again(*args)
        assert with_memo == made_again(*inputs, None, registrations)
        reused.append(sum(id(r) in kept for r in with_memo))
        return with_memo

    monkeypatch.setattr(snapshot_file, "replicas_of", both_ways)
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    checks = 0
    unregistered_seen: list[bool] = []

    def check() -> None:
        nonlocal checks
        seen = _cache_as_listed(sim)
        assert seen["cached"] == seen["listed"], sim.events.now_s
        groups = sim.operator.groups
        for group, expected in groups._expected_deletions.items():
            stored = {n for n in expected if sim.store.pod(sim.namespace, n) is not None}
            assert groups._expected_stored[group] == stored, sim.events.now_s
        counted = _nonzero(sim.sampler._replica_states())
        assert _nonzero(sim.sampler.count_from_pods()) == counted, sim.events.now_s
        assert _chips(sim) == _chips_walked(sim), sim.events.now_s
        unregistered = sim.sampler._unregistered_by_group()  # after the slice states
        assert unregistered == sim.sampler.unregistered_from_pods(), sim.events.now_s
        unregistered_seen.append(bool(unregistered))
        indexes = _scheduler_indexes(sim)
        assert indexes["cached"] == indexes["listed"], sim.events.now_s
        assert _dead_infos_kept_equal_made_anew(sim), sim.events.now_s  # before a read
        assert _gcs_state_kept_equals_made_anew(sim), sim.events.now_s
        checks += 1

    sim.events.every(CHECK_EVERY_S, check, observes=True)
    sim.load(workload)
    sim.run(workload.last_end_s + 1800.0)
    assert checks > 1000
    assert sum(reused) > 0  # the memo was used, not only filled
    assert any(unregistered_seen) and not all(unregistered_seen)


def test_the_gcs_state_check_sees_a_node_written_without_a_version_bump(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above goes red when a node's use, status or idleness is written
    without `Node.changed` (here no writer bumps the version): the state from the kept
    parts then still shows the node as it was."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/spot-preemption-storm.yaml"))
    monkeypatch.setattr(Node, "changed", lambda self, fixed=False: None)
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    stale_at_s: list[float] = []

    def check() -> None:
        if not _gcs_state_kept_equals_made_anew(sim):
            stale_at_s.append(sim.events.now_s)

    sim.events.every(CHECK_EVERY_S, check, observes=True)
    sim.load(workload)
    sim.run(workload.last_end_s)
    assert stale_at_s


def test_kept_slice_states_move_with_what_no_store_write_tells() -> None:
    """The sampler's kept slice states move with what it reads besides the store: a
    replica KubeRay is creating counts pending; a raylet that registered for the
    first time and left between two samples (the nodes as they were) leaves its
    slice partial. Each as counted again from the pods."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    workload = load_workload(str(ROOT / "examples/workloads/seed-slice-placement-group.yaml"))
    sim = SimulatedCluster(cluster, seed=5, capacity=workload.provisioning.capacity)
    sim.load(workload)
    sampler = sim.sampler
    step_s = 0.0
    while not sampler._replica_states().get("running"):
        step_s += 5.0
        assert step_s < 3600.0, "no slice ran"
        sim.events.run_until(step_s)

    def counted() -> dict[str, int]:
        kept = _nonzero(sampler._replica_states())
        assert kept == _nonzero(sampler.count_from_pods()), sim.events.now_s
        return kept

    before = counted()
    replica = next(r for r, state in sampler._state.items() if state == "running")
    creating = sim.operator.groups.creating
    creating.add(replica[1])
    assert counted()["pending"] == before.get("pending", 0) + 1
    creating.discard(replica[1])
    assert counted() == before

    host = next(iter(sampler._members[replica]))
    assert _chips(sim) == _chips_walked(sim)
    del sim.ray.scheduler.nodes[host]
    assert _chips(sim) == _chips_walked(sim)  # a node gone by hand, past the ledger
    counted()
    assert sampler._unregistered_by_group() == sampler.unregistered_from_pods() != {}
    sim.ray_seen.discard(host)  # not yet registered: the slice is still coming up
    coming_up = counted()
    assert coming_up["pending"] == before.get("pending", 0) + 1
    sim.ray_seen.add(host)  # registered and gone since the last sample
    assert counted()["partial"] == coming_up.get("partial", 0) + 1
