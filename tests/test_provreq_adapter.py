"""The adapter's decisions for queued groups (`adapters/kube/queued_steps.py`), one
round at a time from what the round read: requests kept at the plan's count, one
granted request bound per group per round and only once the previous one's pods all
exist, served and ended requests deleted (ended ones as capacity signals), excess
ones after a grace, orphaned PodTemplates removed; and the binding as a patch the
RayCluster CRD accepts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from tests.test_sim import V6E
from tpu_autoscaler.adapters.kube.api import ApiError, NotFound
from tpu_autoscaler.adapters.kube.patches import plan_patch
from tpu_autoscaler.adapters.kube.provreq_objects import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    QUEUED_CLASS,
    QueuedRequest,
)
from tpu_autoscaler.adapters.kube.queued import QueuedProvisioning
from tpu_autoscaler.adapters.kube.queued_steps import (
    EXCESS_GRACE_S,
    Consumers,
    QueuedView,
    binding_operations,
    decide,
    launches_carried,
)
from tpu_autoscaler.controlplane.provreq_store import ProvisioningObjects
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core.capacity import CapacityProblem
from tpu_autoscaler.core.plan import Launch, Plan
from tpu_autoscaler.core.units import Replicas
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes

G = "tpu-v6e-group"
HOSTS = 4


def req(
    name: str,
    created_s: float = 0.0,
    provisioned: bool = False,
    ended: tuple[str, str, float] | None = None,
    group: str = G,
) -> QueuedRequest:
    return QueuedRequest(name, group, HOSTS, created_s, provisioned, ended)


def view(
    *requests: QueuedRequest,
    consumers: Mapping[str, Consumers] | None = None,
    bound: str | None = None,
    templates: tuple[str, ...] | None = None,
    now_s: float = 100.0,
    excess_since: Mapping[str, float] | None = None,
) -> QueuedView:
    return QueuedView(
        requests=requests,
        templates=frozenset(templates if templates is not None else [r.name for r in requests]),
        consumers=dict(consumers or {}),
        bound={G: bound} if bound else {},
        group_index={G: 0},
        hosts={G: HOSTS},
        now_s=now_s,
        excess_since=dict(excess_since or {}),
    )


def launch(n: int) -> Plan:
    return Plan(launch=(Launch(G, Replicas(n), "demand"),)) if n else Plan()


def test_a_launch_asks_for_one_request_per_slice_and_raises_no_replicas() -> None:
    steps = decide(view(), launch(2), lambda g, i: f"{g}-new-{i}")
    assert steps.create == ((G, f"{G}-new-0"), (G, f"{G}-new-1"))
    assert steps.bind == {} and steps.delete_requests == ()
    assert launches_carried(launch(2), view(), steps).launched(G) == 0


def test_outstanding_requests_count_toward_the_launch() -> None:
    steps = decide(view(req("a"), req("b")), launch(3))
    assert len(steps.create) == 1 and steps.delete_requests == () and steps.bind == {}


def test_the_oldest_granted_request_is_bound_with_one_replica() -> None:
    current = view(req("new", 50, provisioned=True), req("old", 10, provisioned=True), req("w", 5))
    steps = decide(current, launch(3))
    assert steps.bind == {G: "old"} and steps.create == () and steps.delete_requests == ()
    assert launches_carried(launch(3), current, steps).launched(G) == 1


def test_nothing_is_bound_while_the_previous_requests_pods_are_being_created() -> None:
    granted = req("next", 20, provisioned=True)
    in_flight = req("prev", 10, provisioned=True)
    for created in range(HOSTS):
        current = view(in_flight, granted, bound="prev", consumers={"prev": Consumers(created)})
        assert decide(current, launch(1)).bind == {}, created
    done = view(in_flight, granted, bound="prev", consumers={"prev": Consumers(HOSTS)})
    assert decide(done, launch(1)).bind == {G: "next"}


def test_a_bound_template_naming_a_deleted_request_blocks_nothing() -> None:
    current = view(req("next", provisioned=True), bound="gone")
    assert decide(current, launch(1)).bind == {G: "next"}


def test_a_request_whose_pods_are_all_scheduled_is_deleted_with_its_template() -> None:
    served = view(req("a", provisioned=True), consumers={"a": Consumers(HOSTS, HOSTS)})
    steps = decide(served, Plan())
    assert steps.delete_requests == ("a",) and steps.delete_templates == ("a",)
    scheduling = view(req("a", provisioned=True), consumers={"a": Consumers(HOSTS, HOSTS - 1)})
    assert decide(scheduling, Plan()).delete_requests == ()


def test_an_ended_request_is_a_signal_and_is_deleted_whatever_the_plan() -> None:
    failed = req("a", ended=("Failed", "Failed: X: no capacity", 42.0))
    steps = decide(view(failed), launch(1), lambda g, i: "fresh")
    assert steps.delete_requests == ("a",) and steps.create == ((G, "fresh"),)
    (signal,) = steps.signals
    assert signal.group == G and signal.problem == CapacityProblem.STOCKOUT
    assert signal.at_s == 42.0 and "ProvisioningRequest a" in signal.source


def test_excess_requests_go_after_their_grace_the_ungranted_newest_first() -> None:
    current = view(req("granted", 30, provisioned=True), req("old", 10), req("new", 20))
    steps = decide(current, launch(1))
    # The granted one is bound; the rest are excess, kept for now.
    assert steps.bind == {G: "granted"} and steps.delete_requests == ()
    assert set(steps.excess_since) == {"old", "new"}
    later = view(
        req("old", 10),
        req("new", 20),
        now_s=100 + EXCESS_GRACE_S,
        excess_since={"new": 100.0},
    )
    steps = decide(later, launch(1))
    assert steps.delete_requests == ("new",) and steps.excess_since == {}
    assert decide(later, Plan()).excess_since == {"old": 100 + EXCESS_GRACE_S}


def test_orphaned_pod_templates_are_deleted() -> None:
    steps = decide(view(req("a"), templates=("a", "left-by-a-crash")), launch(1))
    assert steps.delete_templates == ("left-by-a-crash",) and steps.create == ()


def _cluster_with_queued_group() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(V6E.read_text())
    template = raw["spec"]["workerGroupSpecs"][0]["template"]
    template["metadata"] = {"annotations": {"tpu-autoscaler.dev/queued-provisioning": "true"}}
    return raw


def test_the_binding_is_one_patch_the_raycluster_crd_accepts() -> None:
    store = ObjectStore()
    created = store.create_raycluster(_cluster_with_queued_group())
    cluster = parse_raycluster(created, "t")
    current = view(req("r-1", provisioned=True))
    steps = decide(current, launch(2), lambda g, i: f"r-new-{i}")
    carried = launches_carried(launch(2), current, steps)
    operations = plan_patch(cluster, carried) + binding_operations(current, steps)
    version = created["metadata"]["resourceVersion"]
    patched = store.patch_raycluster("default", created["metadata"]["name"], operations, version)
    group = patched["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 1
    annotations = group["template"]["metadata"]["annotations"]
    assert annotations[CONSUME_ANNOTATION] == "r-1"
    assert annotations[CLASS_ANNOTATION] == QUEUED_CLASS
    assert annotations["tpu-autoscaler.dev/queued-provisioning"] == "true"


def test_signals_outlive_their_deleted_request_for_the_hold() -> None:
    queued = QueuedProvisioning(ProvisioningObjects(ObjectStore()), "default", "c", hold_s=600)
    failed = req("a", ended=("Failed", "no capacity", 42.0))
    assert [s.source for s in queued.signals(view(failed), 50.0)] == ["ProvisioningRequest a"]
    assert len(queued.signals(view(), 42.0 + 600)) == 1
    assert queued.signals(view(), 42.0 + 601) == ()


class NoProvisioningApi(ProvisioningObjects):
    def list_provisioning_requests(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        raise NotFound("provisioningrequests.autoscaling.x-k8s.io: 404")


def test_a_cluster_without_the_api_is_named_in_the_error() -> None:
    store = ObjectStore()
    raw = store.create_raycluster(_cluster_with_queued_group())
    shapes = derive_shapes(parse_raycluster(raw, "t")).shapes
    queued = QueuedProvisioning(NoProvisioningApi(store), "default", "c")
    with pytest.raises(ApiError, match="groups tpu-v6e-group ask for queued provisioning"):
        queued.read(raw, [], shapes, 0.0)
    plain = derive_shapes(parse_raycluster(yaml.safe_load(V6E.read_text()), "t")).shapes
    assert queued.read(raw, [], plain, 0.0) is None  # no queued group: nothing listed
