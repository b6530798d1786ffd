"""The simulated API server and GCS hand the autoscaler shortcuts a real one never
does: a pod unchanged since the last list is the very object listed then, a pod list
tells which pods changed since an earlier one (`PodList`), an unchanged RayCluster or
reply is the same object. The autoscaler's memos take them (found by identity, changes
told), and the simulated runs that test it all go through them. A real client decodes
every answer afresh, so production reads by content alone (resourceVersions, bytes).

These runs hold that the two paths decide alike: the same workloads with every answer
decoded afresh, as a real client gets them, make the same writes at the same simulated
times, record the same Events and end with the same summary. A memo right only for the
simulator's objects (kept across a change the content shows, or a change told but not
seen in the content) differs here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from tests.test_sim_quiet import random_runs, recorded
from tpu_autoscaler.adapters.kube.api import KubeApi
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core.snapshot import PolicyConfig
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.workload import Workload, load_workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    ("v6e-4x4-multihost", "seed-slice-placement-group"),
    ("v6e-4x4-multihost", "busy-slice"),
    ("rl-disaggregated", "rl-rollouts"),
    ("v6e-4x4-queued", "queued-provisioning"),
    ("v6e-4x4-multihost", "scarce-two-slice-gang-returns"),
    ("v6e-4x4-multihost", "spot-preemption-storm"),
    ("v6e-4x4-spot-and-on-demand", "spot-churn"),
    ("v6e-4x4-warm", "warm-buffer"),
]
"""Slice placement groups, work arriving on busy slices, two groups, queued
provisioning, a gang's slice returned, preemptions, churn, a warm buffer: pods
created, bound, failed and deleted, nodes joining, idling and dying."""


def _decoded(answer: Any) -> Any:
    """What a client that decodes the wire gets: new objects, a plain list."""
    return json.loads(json.dumps(answer))


class DecodedKube:
    """The simulated API server as a real client meets it: every answer decoded
    afresh (`KubeApi`)."""

    def __init__(self, store: ObjectStore | None = None) -> None:
        self.store = store

    def of(self, clock: EventQueue) -> ObjectStore:
        """The simulated cluster's store, made for it (its `store` factory)."""
        self.store = ObjectStore(clock)
        return self.store

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return _decoded(method(*args, **kwargs))

        return call


def _decode_the_gcs(sim: SimulatedCluster) -> None:
    """The GCS's replies as new bytes, its node infos as new messages, at every call."""
    gcs = sim.gcs
    state, infos = gcs.get_cluster_resource_state, gcs.get_all_node_info

    def get_cluster_resource_state() -> bytes:
        return bytes(bytearray(state()))

    def get_all_node_info(*args: Any, **kwargs: Any) -> dict[bytes, Any]:
        return {
            bytes(bytearray(key)): type(info).FromString(info.SerializeToString())
            for key, info in infos(*args, **kwargs).items()
        }

    gcs.get_cluster_resource_state = get_cluster_resource_state  # type: ignore[method-assign]
    gcs.get_all_node_info = get_all_node_info  # type: ignore[method-assign]


def _run(
    cluster: dict[str, Any],
    workload: Workload,
    decoded: bool,
    config: PolicyConfig | None = None,
) -> dict[str, Any]:
    """Everything a run decided and measured."""
    kube = DecodedKube()
    sim = SimulatedCluster(
        cluster,
        seed=5,
        capacity=workload.provisioning.capacity,
        policy_config=config,
        store=kube.of,
        autoscaler_kube=kube if decoded else None,
        # Quiet rounds are left out only on the simulator's own objects; they change
        # nothing (tests/test_sim_quiet.py), and here both runs plan every round.
        skip_quiet_rounds=False,
    )
    if decoded:
        _decode_the_gcs(sim)
    return recorded(sim, workload)


def _assert_same(
    cluster: dict[str, Any], workload: Workload, config: PolicyConfig | None = None
) -> dict[str, Any]:
    objects = _run(cluster, workload, False, config)
    decoded = _run(cluster, workload, True, config)
    for key in objects:
        assert decoded[key] == objects[key], key
    return objects


@pytest.mark.parametrize(("cluster_name", "workload_name"), EXAMPLES)
def test_every_answer_decoded_afresh_decides_as_the_simulator_s_objects(
    cluster_name: str, workload_name: str
) -> None:
    cluster = yaml.safe_load((ROOT / f"examples/clusters/{cluster_name}.yaml").read_text())
    workload = load_workload(str(ROOT / f"examples/workloads/{workload_name}.yaml"))
    assert _assert_same(cluster, workload)["summary"]["slices_launched"] > 0


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(random_runs())
def test_random_traces_decoded_afresh_decide_as_the_simulator_s_objects(
    run: tuple[dict[str, Any], Workload, PolicyConfig],
) -> None:
    """The quiet-round test's random traces (`random_runs`)."""
    _assert_same(*run)


def test_a_decoded_list_is_a_plain_list_of_new_objects() -> None:
    """The premise: the wrapper takes every shortcut away."""
    cluster = yaml.safe_load((ROOT / "examples/clusters/v6e-4x4-multihost.yaml").read_text())
    store = ObjectStore()
    store.create_raycluster(cluster)
    kube: KubeApi = DecodedKube(store)
    namespace = cluster["metadata"].get("namespace", "default")
    name = cluster["metadata"]["name"]
    first = kube.get_raycluster(namespace, name)
    again = kube.get_raycluster(namespace, name)
    assert first == again and first is not again
    assert type(kube.list_pods(namespace)) is list
