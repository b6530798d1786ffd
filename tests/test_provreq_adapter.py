"""The adapter's decisions for queued groups (`adapters/kube/queued_steps.py`), one
round at a time from what the round read: requests kept at the plan's count, one
granted request bound per group per round and only once the previous one's pods all
exist, served and ended requests deleted (ended ones as capacity signals), excess
ones after a grace, orphaned PodTemplates removed; and the binding as a patch the
RayCluster CRD accepts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_sim import V6E
from tpu_autoscaler.adapters.kube.api import ApiError, NotFound
from tpu_autoscaler.adapters.kube.patches import plan_patch
from tpu_autoscaler.adapters.kube.provreq_objects import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    QUEUED_CLASS,
    QueuedRequest,
    parse_request,
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
from tpu_autoscaler.controlplane import provreq_crd
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
    slices: int = 1,
) -> QueuedRequest:
    return QueuedRequest(name, group, slices * HOSTS, created_s, provisioned, ended)


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


def launch(n: int, gangs: tuple[int, ...] = ()) -> Plan:
    sizes = tuple(Replicas(k) for k in gangs)
    return Plan(launch=(Launch(G, Replicas(n), "demand", sizes),)) if n else Plan()


def test_a_launch_asks_for_one_request_per_slice_and_raises_no_replicas() -> None:
    steps = decide(view(), launch(2), lambda g, i: f"{g}-new-{i}")
    assert steps.create == ((G, f"{G}-new-0", 1), (G, f"{G}-new-1", 1))
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
    assert steps.delete_requests == ("a",) and steps.create == ((G, "fresh", 1),)
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


# --- gangs of slices: one request for all of a gang's slices ------------------------------


def test_a_gang_of_slices_asks_for_one_request_of_all_its_hosts() -> None:
    steps = decide(view(), launch(3, gangs=(2,)), lambda g, i: f"r-{i}")
    assert steps.create == ((G, "r-0", 2), (G, "r-1", 1))
    assert launches_carried(launch(3, gangs=(2,)), view(), steps).launched(G) == 0


def test_a_request_counts_only_toward_a_wanted_gang_or_slice_of_its_size() -> None:
    singles = view(req("a"), req("b"))
    steps = decide(singles, launch(2, gangs=(2,)), lambda g, i: "whole")
    assert steps.create == ((G, "whole", 2),) and set(steps.excess_since) == {"a", "b"}
    whole = view(req("w", slices=2))
    assert decide(whole, launch(2, gangs=(2,))).create == ()
    steps = decide(whole, launch(2), lambda g, i: f"one-{i}")
    assert steps.create == ((G, "one-0", 1), (G, "one-1", 1)) and set(steps.excess_since) == {"w"}


def test_a_granted_gang_request_raises_replicas_by_all_its_slices_at_once() -> None:
    current = view(req("single", 15, provisioned=True), req("gang", 10, provisioned=True, slices=2))
    plan = launch(3, gangs=(2,))
    steps = decide(current, plan)
    assert steps.bind == {G: "gang"} and steps.create == () and steps.excess_since == {}
    (carried,) = launches_carried(plan, current, steps).launch
    assert carried.replicas == 2 and carried.gangs == (2,)


def test_a_gang_request_not_yet_granted_raises_nothing() -> None:
    current = view(req("gang", 10, slices=2))
    plan = launch(2, gangs=(2,))
    steps = decide(current, plan)
    assert steps.bind == {} and steps.create == () and steps.delete_requests == ()
    assert launches_carried(plan, current, steps).launched(G) == 0


def test_a_gang_request_is_in_flight_until_every_pod_of_every_slice_exists() -> None:
    gang = req("gang", 10, provisioned=True, slices=2)
    granted = req("next", 20, provisioned=True)
    for created in (1, HOSTS, 2 * HOSTS - 1):
        current = view(gang, granted, bound="gang", consumers={"gang": Consumers(created)})
        assert decide(current, launch(1)).bind == {}, created
    done = view(gang, granted, bound="gang", consumers={"gang": Consumers(2 * HOSTS)})
    assert decide(done, launch(1)).bind == {G: "next"}


def test_a_gang_request_is_served_once_every_pod_of_every_slice_is_scheduled() -> None:
    gang = req("gang", provisioned=True, slices=2)
    one_slice_placed = view(gang, consumers={"gang": Consumers(2 * HOSTS, HOSTS)})
    assert decide(one_slice_placed, Plan()).delete_requests == ()
    placed = view(gang, consumers={"gang": Consumers(2 * HOSTS, 2 * HOSTS)})
    assert decide(placed, Plan()).delete_requests == ("gang",)


def test_a_request_of_no_whole_number_of_slices_serves_no_launch() -> None:
    odd = QueuedRequest("odd", G, HOSTS + 1, 0.0, True, None)
    steps = decide(view(odd), launch(1), lambda g, i: "fresh")
    assert steps.bind == {} and steps.create == ((G, "fresh", 1),)


def test_a_gangs_request_is_admitted_by_the_crd_and_its_binding_by_the_raycluster_crd() -> None:
    """What `carry_out` writes for a two-slice gang passes cluster-autoscaler's CRD
    (one pod set, count = 2 x hosts), reads back as two slices, and the binding is
    one RayCluster patch raising replicas by two with the consume annotations."""
    store = ObjectStore()
    created = store.create_raycluster(_cluster_with_queued_group())
    objects = ProvisioningObjects(store)
    queued = QueuedProvisioning(objects, "default", created["metadata"]["name"])
    plan = launch(2, gangs=(2,))
    empty = view()
    steps = decide(empty, plan, lambda g, i: "gang-r")
    assert queued.carry_out(created, empty, steps) == 0
    (written,) = objects.list_provisioning_requests("default")
    assert provreq_crd.validate(written) == []
    assert written["spec"]["podSets"] == [{"podTemplateRef": {"name": "gang-r"}, "count": 8}]
    assert [t["metadata"]["name"] for t in objects.list_pod_templates("default")] == ["gang-r"]
    read = parse_request(written)
    assert read.hosts == 2 * HOSTS and view(read).slices(read) == 2

    granted = view(replace(read, group=G, provisioned=True))
    steps = decide(granted, plan)
    cluster = parse_raycluster(created, "t")
    carried = launches_carried(plan, granted, steps)
    operations = plan_patch(cluster, carried) + binding_operations(granted, steps)
    version = created["metadata"]["resourceVersion"]
    patched = store.patch_raycluster("default", created["metadata"]["name"], operations, version)
    group = patched["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 2
    assert group["template"]["metadata"]["annotations"][CONSUME_ANNOTATION] == "gang-r"


def test_a_gangs_ended_request_is_one_signal_and_the_gang_asked_for_again_whole() -> None:
    revoked = req("gang", slices=2, ended=("CapacityRevoked", "CapacityRevoked: taken", 7.0))
    steps = decide(view(revoked), launch(2, gangs=(2,)), lambda g, i: "again")
    (signal,) = steps.signals
    assert signal.problem == CapacityProblem.PREEMPTED and signal.group == G
    assert steps.delete_requests == ("gang",) and steps.create == ((G, "again", 2),)


@settings(max_examples=200, deadline=None)
@given(
    outstanding=st.lists(
        st.tuples(st.integers(1, 3), st.booleans(), st.integers(0, 50)), max_size=6
    ),
    gangs=st.lists(st.integers(2, 3), max_size=3),
    singles=st.integers(0, 3),
)
def test_requests_match_the_plans_gangs_and_slices_size_for_size(
    outstanding: list[tuple[int, bool, int]], gangs: list[int], singles: int
) -> None:
    """Whatever is outstanding: the requests kept and created are exactly one per
    wanted gang and one per other slice, each of its size; none of a size still
    wanted is left in excess; at most one provisioned request of a wanted size is
    bound, raising replicas by its slices."""
    requests = [
        req(f"r{i}", created_s, provisioned, slices=slices)
        for i, (slices, provisioned, created_s) in enumerate(outstanding)
    ]
    current = view(*requests)
    plan = launch(sum(gangs) + singles, gangs=tuple(gangs))
    steps = decide(current, plan, lambda g, i: f"new-{i}")
    size = {r.name: current.slices(r) for r in requests}
    wanted = sorted(gangs + [1] * singles)
    kept = [size[r.name] for r in requests if r.name not in steps.excess_since]
    assert sorted(kept + [n for _, _, n in steps.create]) == wanted
    assert not {size[name] for name in steps.excess_since} & {n for _, _, n in steps.create}
    assert steps.delete_requests == ()  # nothing served, ended or past its grace
    carried = launches_carried(plan, current, steps).launched(G)
    if steps.bind:
        (bound,) = [r for r in requests if r.name == steps.bind[G]]
        assert bound.provisioned and carried == size[bound.name] and size[bound.name] in wanted
    else:
        assert carried == 0
        assert not any(r.provisioned and r.name not in steps.excess_since for r in requests)
