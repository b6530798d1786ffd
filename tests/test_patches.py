"""Plans as RayCluster patches: counts and pods of a group change together."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import cpu_group, raycluster, tpu_group
from tpu_autoscaler.adapters.kube.patches import KeptPodNames, PodNames, plan_patch
from tpu_autoscaler.adapters.kube.pods import Pod, parse_pods
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.plan import Launch, Plan, Terminate
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState
from tpu_autoscaler.core.units import Replicas
from tpu_autoscaler.manifest.loading import parse_raycluster


def _cluster() -> dict[str, object]:
    s = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]
    return raycluster(cpu_group("cpu", 1, 4), tpu_group("tpu", s, 1, 4, replicas=0))


def test_launch_and_removal_in_one_patch() -> None:
    cluster = parse_raycluster(_cluster(), "t")
    plan = Plan(
        launch=(Launch("tpu", Replicas(2), "demand"),),
        terminate=(Terminate("cpu", "r1", ("cpu-a",), "idle"),),
    )
    ops = plan_patch(cluster, plan)
    assert ops == [
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 0},
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/scaleStrategy",
            "value": {"workersToDelete": ["cpu-a"]},
        },
        # replicas 0 is below minReplicas 1: KubeRay runs 1, so 2 more make 3.
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 3},
    ]
    store = ObjectStore()
    created = store.create_raycluster(_cluster())
    patched = store.patch_raycluster("default", "test", ops, created["metadata"]["resourceVersion"])
    assert patched["spec"]["workerGroupSpecs"][1]["replicas"] == 3


def test_noop_plan_patches_nothing() -> None:
    assert plan_patch(parse_raycluster(_cluster(), "t"), Plan()) == []


def test_pods_still_waiting_for_deletion_stay_listed() -> None:
    raw = _cluster()
    spec = raw["spec"]["workerGroupSpecs"][1]  # type: ignore[index]
    spec["replicas"] = 2
    spec["scaleStrategy"] = {"workersToDelete": ["tpu-a0", "tpu-a1", "gone-0"]}
    cluster = parse_raycluster(raw, "t")
    plan = Plan(terminate=(Terminate("tpu", "b", ("tpu-b0", "tpu-b1"), "idle"),))
    ops = plan_patch(cluster, plan, existing_pods={"tpu-a0", "tpu-a1", "tpu-b0", "tpu-b1"})
    doomed = next(op["value"]["workersToDelete"] for op in ops if op["path"].endswith("Strategy"))
    # KubeRay has not yet deleted replica a; dropping it would strand its pods.
    assert doomed == ["tpu-a0", "tpu-a1", "tpu-b0", "tpu-b1"]


def test_removing_more_replicas_than_counted_sets_zero_not_below() -> None:
    """Found by the fallback machine: KubeRay read `replicas: 2`, our patch lowered it to
    1 naming a preempted replica's pods, and KubeRay replaced that replica anyway; two
    pending replicas then timed out together and the patch said `replicas: -1`, which
    KubeRay's own parse (and ours) refuses."""
    raw = _cluster()
    raw["spec"]["workerGroupSpecs"][1]["replicas"] = 1  # type: ignore[index]
    cluster = parse_raycluster(raw, "t")
    plan = Plan(
        terminate=(
            Terminate("tpu", "a", ("tpu-a0",), "timed out"),
            Terminate("tpu", "b", ("tpu-b0",), "timed out"),
        )
    )
    ops = plan_patch(cluster, plan, existing_pods={"tpu-a0", "tpu-b0"})
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 0} in ops


def test_existing_pods_are_named_from_the_pods_of_the_round() -> None:
    """`PodNames` gathers the names of its own pods when first asked (and only then):
    a round's names are never an earlier round's."""
    raw = _cluster()
    spec = raw["spec"]["workerGroupSpecs"][1]  # type: ignore[index]
    spec["replicas"] = 2
    spec["scaleStrategy"] = {"workersToDelete": ["tpu-a0", "tpu-a1"]}
    cluster = parse_raycluster(raw, "t")
    plan = Plan(terminate=(Terminate("tpu", "b", ("tpu-b0",), "idle"),))

    def doomed(existing: PodNames) -> list[str]:
        ops = plan_patch(cluster, plan, existing)
        return list(next(op["value"]["workersToDelete"] for op in ops if "Strategy" in op["path"]))

    def pods(*names: str) -> list[Pod]:
        return parse_pods([{"metadata": {"name": n}} for n in names], "t")

    untouched = PodNames(pods("tpu-a0"))
    assert plan_patch(cluster, Plan(), untouched) == [] and "names" not in vars(untouched)
    assert doomed(PodNames(pods("tpu-a0", "tpu-a1", "tpu-b0"))) == ["tpu-a0", "tpu-a1", "tpu-b0"]
    assert doomed(PodNames(pods("tpu-a1", "tpu-b0"))) == ["tpu-a1", "tpu-b0"]
    assert doomed(PodNames(pods("tpu-b0"))) == ["tpu-b0"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans()), max_size=10),
        min_size=1,
        max_size=8,
    )
)
def test_kept_pod_names_are_the_names_of_the_pods_of_the_round(
    rounds: list[list[tuple[str, bool]]],
) -> None:
    """Each round lists pods by name, each read as before (the same object) or anew
    (a new object: a new resourceVersion, or a pod of that name created again); the
    names kept are always those gathered anew. Seen red with gone pods never let go."""
    kept = KeptPodNames()
    last: dict[str, Pod] = {}
    for listed in rounds:
        pods = []
        for name, as_before in listed:
            pod = last.get(name) if as_before else None
            pods.append(pod or parse_pods([{"metadata": {"name": name}}], "t")[0])
        last = {pod.name: pod for pod in pods}
        assert set(PodNames(pods, kept)) == set(PodNames(pods)) == {n for n, _ in listed}
        assert len(kept.pods) == len({id(p) for p in pods})


def test_kept_pod_names_follow_a_list_changed_in_place() -> None:
    """A caller's list of pods changed in place between two asks (the same list, as
    long, another pod at a place): the names are the new list's. Seen red with the
    last call's list kept as given rather than copied (told apart by identity from
    itself, it was taken for unchanged)."""
    kept = KeptPodNames()
    pods = parse_pods([{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}], "t")
    assert set(kept.names_of(pods)) == {"a", "b"}
    assert set(kept.names_of(pods)) == {"a", "b"}  # the same again: by identity
    pods[1] = parse_pods([{"metadata": {"name": "c"}}], "t")[0]
    assert set(kept.names_of(pods)) == {"a", "c"}


def test_a_replica_taken_back_leaves_workers_to_delete_and_counts_again() -> None:
    """A replica named earlier that came up busy: its pods leave workersToDelete (the
    others named stay), and `replicas` counts it again, with or without the plan
    touching its group."""
    raw = _cluster()
    spec = raw["spec"]["workerGroupSpecs"][1]  # type: ignore[index]
    spec["replicas"] = 1
    spec["scaleStrategy"] = {"workersToDelete": ["tpu-a0", "tpu-a1", "tpu-b0", "tpu-b1"]}
    cluster = parse_raycluster(raw, "t")
    busy = Replica("tpu", "b", ReplicaState.DRAINING, (Host("tpu-b0", 0), Host("tpu-b1", 1)))
    existing = {"tpu-a0", "tpu-a1", "tpu-b0", "tpu-b1"}
    alone = plan_patch(cluster, Plan(), existing, (busy,))
    assert alone == [
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 2},
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/1/scaleStrategy",
            "value": {"workersToDelete": ["tpu-a0", "tpu-a1"]},
        },
    ]
    plan = Plan(terminate=(Terminate("tpu", "c", ("tpu-c0", "tpu-c1"), "idle"),))
    both = plan_patch(cluster, plan, existing | {"tpu-c0", "tpu-c1"}, (busy,))
    # One back, one away: the count stays 1.
    assert both == [
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/1/scaleStrategy",
            "value": {"workersToDelete": ["tpu-a0", "tpu-a1", "tpu-c0", "tpu-c1"]},
        }
    ]
