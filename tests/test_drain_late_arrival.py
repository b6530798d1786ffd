"""A replica planned away for a provisioning timeout whose hosts join Ray between the
round's read and its patch: the slice came, work may be landing on it, so the round
keeps it (and the gang siblings given back for its lateness); the next round looks
again. On a real cluster the window is the round's reads and plan; in the simulated
slow API server it is seconds."""

from __future__ import annotations

from dataclasses import replace

from tests.test_controller import _events, _replicas, _sim, _submit
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.plan import Plan, RemovalCause, Terminate
from tpu_autoscaler.core.snapshot import ReplicaState
from tpu_autoscaler.shell import events
from tpu_autoscaler.sim.cluster import SimulatedCluster

PINNED = {
    "count": 4,
    "task": {"resources": {"TPU": 4}, "label_selector": {"ray.io/tpu-pod-type": "v6e-16"}},
}


def _pending_slice_joins_after_the_decision(sim: SimulatedCluster, sibling: bool) -> None:
    """The next round's plan removes a pending slice for a provisioning timeout (and,
    with `sibling`, another replica as the gang's slice given back for it); then the
    pending slice's raylets start."""
    decide = sim.autoscaler.decide
    shape = sim.shapes["slices"]

    def decide_then_hosts_join(loaded: LoadedSnapshot) -> Plan:
        decided = decide(loaded)
        replicas = [r for r in loaded.snapshot.replicas if r.group == "slices"]
        late = next(r for r in replicas if r.state is ReplicaState.PENDING)
        removals = [
            Terminate(
                "slices",
                late.name,
                tuple(h.pod_name for h in late.hosts),
                "pending too long",
                RemovalCause.PROVISIONING_TIMEOUT,
            )
        ]
        if sibling:
            other = next(r for r in replicas if r.name != late.name)
            pods = tuple(h.pod_name for h in other.hosts)
            removals.append(
                Terminate("slices", other.name, pods, "gang", RemovalCause.GANG_INCOMPLETE)
            )
        for host in late.hosts:
            pod = sim.store.pod("default", host.pod_name)
            assert pod is not None
            sim.ray.add_node(pod, shape, int(pod["metadata"]["labels"][labels.KUBERAY_HOST_INDEX]))
        sim.autoscaler.decide = decide
        return replace(decided, terminate=tuple(removals))

    sim.autoscaler.decide = decide_then_hosts_join


def test_a_slice_whose_hosts_join_while_it_times_out_is_kept() -> None:
    sim = _sim()
    _submit(sim, PINNED, duration=600)
    sim.events.run_until(20.0)
    (launched,) = _replicas(sim, "slices")
    _pending_slice_joins_after_the_decision(sim, sibling=False)
    sim.events.run_until(30.0)
    (kept,) = _events(sim.store, events.DRAIN_REFUSED)
    assert kept.startswith(f"kept replica {launched} of slices: host(s) ")
    assert "joined Ray while it was being removed (pending too long)" in kept
    (event,) = [e for e in sim.store.events if e["reason"] == events.DRAIN_REFUSED]
    assert event["type"] == "Normal"
    refused = sim.autoscaler.metrics.drains_refused.labels("slices")._value.get()
    assert refused == 1
    assert list(_replicas(sim, "slices")) == [launched]
    assert sim.violations == []


def test_the_gang_slice_given_back_for_a_late_one_that_came_stays_too() -> None:
    sim = _sim()
    _submit(sim, {**PINNED, "count": 8}, duration=600)
    sim.events.run_until(20.0)
    launched = set(_replicas(sim, "slices"))
    assert len(launched) == 2
    _pending_slice_joins_after_the_decision(sim, sibling=True)
    sim.events.run_until(30.0)
    assert len(_events(sim.store, events.DRAIN_REFUSED)) == 1
    assert set(_replicas(sim, "slices")) == launched
    assert sim.gcs.drain_calls == 0
