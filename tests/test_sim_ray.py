"""The simulated Ray against Ray 2.60 itself: label selectors parsed and matched as the
raylet does (checked against Ray's own matcher), tasks placed by the hybrid policy,
`slice_placement_group` reserving heads one slice after another with a timeout, the
head node, and idleness as the raylet counts it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from ray._raylet import node_labels_match_selector  # type: ignore[attr-defined]
from ray.core.generated import autoscaler_pb2, common_pb2, gcs_pb2

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.adapters.kube.pods import parse_pods, replicas_of
from tpu_autoscaler.adapters.ray.gcs import IDLE_TERMINATION, PREEMPTION, read_dead_nodes
from tpu_autoscaler.adapters.ray.state import from_message
from tpu_autoscaler.controlplane import admitted_pod
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.selectors import parse_selector, selector_matches
from tpu_autoscaler.core import catalog, labels
from tpu_autoscaler.core.demand import GangStrategy
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes
from tpu_autoscaler.sim import gcs_state
from tpu_autoscaler.sim.cluster import SimulatedCluster
from tpu_autoscaler.sim.ray import HEAD_GROUP, HEAD_NODE_RESOURCE, SimRay, _node_id
from tpu_autoscaler.sim.ray_model import Bundle, Node, Work
from tpu_autoscaler.sim.remote import SimGcs, Wire
from tpu_autoscaler.sim.slice_pg import SlicePlacementGroupRun
from tpu_autoscaler.sim.workload import SlicePlacementGroupSpec, WorkItem, parse_workload

NOT_IN = common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_NOT_IN")
IN = common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN")


def _v6e(topology: str, chips_per_host: int | None = None) -> catalog.SliceType:
    v6e = catalog.find_generation("v6e")
    assert v6e is not None
    return catalog.slice_type(v6e, topology, chips_per_host)


def _shapes(*groups: dict[str, Any]) -> dict[str, SliceShape]:
    parsed = parse_raycluster(raycluster(*groups), "t")
    return {s.group: s for s in derive_shapes(parsed).shapes}


class World:
    """A SimRay on an event queue, with slices added by hand (no autoscaler)."""

    def __init__(self, seed: int = 0, head_cpus: float = 4.0) -> None:
        self.events = EventQueue(seed)
        self.ray = SimRay(lambda: self.events.now_s, self.events.after, self.events.random)
        self.ray.add_head("t-head-abcde", {"CPU": head_cpus})
        self.shapes = _shapes(
            tpu_group("slices", _v6e("4x4"), 0, 8), tpu_group("singles", _v6e("2x4", 8), 0, 8)
        )
        self.replicas = 0

    def add_slice(self, group: str = "slices") -> list[str]:
        shape = self.shapes[group]
        pods = []
        for host in range(shape.hosts_per_replica):
            pod = admitted_pod.worker_pod("t", "default", shape, self.replicas, host, "")
            self.ray.add_node(pod, shape, host)
            pods.append(pod["metadata"]["name"])
        self.replicas += 1
        return pods

    def task(self, resources: dict[str, float], selector: dict[str, str] | None = None) -> Work:
        work = Work(
            self.ray.new_id("task"), [Bundle(resources, selector or {})], 1e6, self.events.now_s
        )
        self.ray.submit(work)
        return work

    def node_of(self, work: Work) -> str:
        return work.placement[0][0]


# --- label selectors -------------------------------------------------------------------

KEYS = st.sampled_from(["ray.io/tpu-pod-type", "ray.io/tpu-worker-id", "zone"])
VALUES = st.sampled_from(["v6e-16", "v6e-8", "0", "1", "a", ""])


@st.composite
def selector_values(draw: st.DrawFn) -> str:
    values = draw(st.lists(VALUES.filter(bool), min_size=1, max_size=3))
    joiner = draw(st.sampled_from([",", ", "]))
    body = f"in({joiner.join(values)})" if draw(st.booleans()) else values[0]
    return ("!" if draw(st.booleans()) else "") + body


@given(
    node_labels=st.dictionaries(KEYS, VALUES.filter(bool), max_size=3),
    selector=st.dictionaries(KEYS, selector_values(), max_size=3),
)
def test_selectors_match_exactly_as_rays_own_matcher(
    node_labels: dict[str, str], selector: dict[str, str]
) -> None:
    """Absent keys (IN fails, NOT_IN passes), negation and `in(a, b)` with its
    untrimmed " b" agree with the raylet's C++ on every generated case."""
    ours = selector_matches(parse_selector(selector), node_labels)
    assert ours == node_labels_match_selector(node_labels, selector)


def test_selectors_parse_operators_and_values_as_ray() -> None:
    parsed = {c.key: (c.operator, c.values) for c in parse_selector(
        {"a": "!v6e-16", "b": "in(x,y)", "c": "!in(x, y)", "d": "z"}
    )}  # fmt: skip
    assert parsed == {
        "a": ("not_in", frozenset({"v6e-16"})),
        "b": ("in", frozenset({"x", "y"})),
        "c": ("not_in", frozenset({"x", " y"})),
        "d": ("in", frozenset({"z"})),
    }


def test_workload_rejects_selectors_ray_rejects() -> None:
    bad = [
        {"at": 0, "duration": 5, "task": {"resources": {"TPU": 4}, "label_selector": {"k": "in()"}}}
    ]
    with pytest.raises(Exception, match="label_selector"):
        parse_workload(bad, "t")


def _cluster_with_two_pod_types() -> dict[str, Any]:
    cluster: dict[str, Any] = yaml.safe_load(
        yaml.safe_dump(
            raycluster(
                tpu_group("slices", _v6e("4x4"), 0, 2, idleTimeoutSeconds=60),
                tpu_group("singles", _v6e("2x4", 8), 0, 2, idleTimeoutSeconds=60),
                name="mixed",
            )
        )
    )
    return cluster


def test_not_in_selector_never_lands_on_that_pod_type_and_is_reported_as_not_in() -> None:
    sim = SimulatedCluster(_cluster_with_two_pod_types(), seed=1)
    selector = {labels.RAY_TPU_POD_TYPE: "!v6e-16"}
    sim.submit(
        WorkItem.model_validate(
            {"at": 0, "duration": 600, "count": 3,
             "task": {"resources": {"TPU": 4}, "label_selector": selector}}
        )
    )  # fmt: skip
    constraints = [
        c
        for r in sim.ray.state().pending_resource_requests
        for s in r.request.label_selectors
        for c in s.label_constraints
    ]
    assert [(c.label_key, c.operator, list(c.label_values)) for c in constraints] == [
        (labels.RAY_TPU_POD_TYPE, NOT_IN, ["v6e-16"])
    ]
    # A v6e-16 slice comes up too (for this IN task): the NOT_IN work must avoid it.
    sim.submit(
        WorkItem.model_validate(
            {"at": 0, "duration": 600,
             "task": {"resources": {"TPU": 4},
                      "label_selector": {labels.RAY_TPU_POD_TYPE: "v6e-16"}}}
        )
    )  # fmt: skip
    summary = sim.run(900)
    done = sim.ray.finished + list(sim.ray.running.values())
    placed = [w for w in done if w.bundles[0].selector == selector]
    assert len(placed) == 3 and summary["unsatisfied_at_end"] == 0
    for work in placed:
        pod = work.placement[0][0]
        node = sim.ray.nodes.get(pod) or sim.ray.dead[pod]
        assert node.labels[labels.RAY_TPU_POD_TYPE] == "v6e-8"


# --- the hybrid policy ---------------------------------------------------------------------


def test_tasks_go_to_the_local_node_until_it_is_half_used() -> None:
    world = World(head_cpus=4.0)
    workers = world.add_slice("singles") + world.add_slice("singles")
    # Make a worker sort before the head, so only local-first can choose the head.
    assert min(world.ray.nodes[w].node_id for w in workers) < world.ray.head.node_id  # type: ignore[union-attr]
    first, second = world.task({"CPU": 1}), world.task({"CPU": 1})
    assert world.node_of(first) == world.node_of(second) == "t-head-abcde"
    # 2 of 4 CPUs used: the head's utilization (0.5) is no longer below the threshold.
    third = world.task({"CPU": 1})
    assert world.node_of(third) in workers


def test_spread_threshold_counts_only_cpu_memory_and_object_store() -> None:
    world = World(head_cpus=4.0)
    world.add_slice("singles")
    pod = next(iter(world.ray.nodes))
    for _ in range(2):
        world.task({"TPU": 4})  # all 8 TPUs of the one host, no CPU
    assert world.ray.nodes[pod].score() == 0.0
    world.task({"CPU": 1})
    assert world.ray.nodes[pod].score() == 0.0


def _top_k_placements(seed: int) -> list[str]:
    world = World(seed=seed)
    for _ in range(9):
        world.add_slice("singles")
    # 10 nodes: k = max(1, int(10 x 0.2)) = 2. TPU work skips the head (no TPUs).
    return [world.node_of(world.task({"TPU": 1})) for _ in range(12)]


def test_top_k_random_pick_among_the_best_nodes_is_seeded() -> None:
    world = World()
    for _ in range(9):
        world.add_slice("singles")
    by_id = sorted(world.ray.nodes.values(), key=lambda n: n.node_id)
    placements = _top_k_placements(seed=5)
    assert set(placements) == {by_id[0].pod, by_id[1].pod}  # the best two, both used
    assert placements == _top_k_placements(seed=5)
    assert any(_top_k_placements(seed=s) != placements for s in range(6, 10))


def test_draining_nodes_take_no_tasks_and_unplaceable_tasks_wait() -> None:
    world = World(head_cpus=0.0)
    (pod,) = world.add_slice("singles")
    world.ray.nodes[pod].drain()
    work = world.task({"TPU": 1})
    assert work.placed_s is None and world.ray.pending == [work]


# --- the head node --------------------------------------------------------------------------


def test_head_node_is_reported_and_takes_cpu_work_without_a_launch() -> None:
    sim = SimulatedCluster(_cluster_with_two_pod_types(), seed=2)
    head = sim.ray.head
    assert head is not None and head.pod.startswith("mixed-head-") and head.pod == sim.head_pod
    assert head.total["CPU"] == 4.0 and head.total[HEAD_NODE_RESOURCE] == 1.0
    state = sim.ray.state()
    reported = next(n for n in state.node_states if n.instance_id == head.pod)
    assert reported.ray_node_type_name == HEAD_GROUP
    assert reported.labels[labels.RAY_NODE_GROUP] == HEAD_GROUP
    sim.submit(
        WorkItem.model_validate({"at": 0, "duration": 300, "task": {"resources": {"CPU": 1}}})
    )
    summary = sim.run(400)
    assert summary["slices_launched"] == 0 and summary["unsatisfied_at_end"] == 0


def test_adapters_ignore_the_head_node_for_replicas() -> None:
    sim = SimulatedCluster(_cluster_with_two_pod_types(), seed=2)
    sim.submit(
        WorkItem.model_validate({"at": 0, "duration": 900, "task": {"resources": {"TPU": 8}}})
    )
    sim.run(400)
    ray_state = from_message(sim.ray.state())
    assert sim.head_pod in ray_state.node_for_pod()
    cluster = parse_raycluster(sim.store.get_raycluster("default", "mixed"), "t")
    pods = parse_pods(sim.store.list_pods("default", {labels.KUBERAY_CLUSTER: "mixed"}))
    replicas = replicas_of(cluster, derive_shapes(cluster), pods, ray_state.node_for_pod(), 400)
    hosts = [h.pod_name for r in replicas for h in r.hosts]
    assert sim.head_pod not in hosts and len(hosts) == 1


# --- slice_placement_group ------------------------------------------------------------------


def _spg(world: World, failures: list[float], **spec: Any) -> SlicePlacementGroupRun:
    run = SlicePlacementGroupRun(
        world.ray,
        world.events.after,
        SlicePlacementGroupSpec.model_validate(
            {"topology": "4x4", "accelerator_version": "v6e", **spec}
        ),
        600.0,
        world.events.now_s,
        on_timeout=lambda: failures.append(world.events.now_s),
    )
    run.start()
    world.events.run_until(world.events.now_s)
    return run


def _pending_heads(world: World) -> list[Work]:
    return [w for w in world.ray.pending if w.bundles[0].resources.get("TPU-v6e-16-head")]


def test_heads_are_reserved_one_slice_after_another() -> None:
    world = World()
    world.add_slice()
    failures: list[float] = []
    run = _spg(world, failures, num_slices=2)
    # The first head took the one slice; only then is the second head asked for.
    assert len(run.heads) == 1 and len(_pending_heads(world)) == 1
    (pending,) = _pending_heads(world)
    assert len(pending.bundles) == 1 and pending.bundles[0].selector == {
        labels.RAY_TPU_WORKER_ID: "0",
        labels.RAY_TPU_POD_TYPE: "v6e-16",
    }
    world.events.run_until(50)
    world.add_slice()
    world.events.run_until(51)
    assert run.workers is not None and run.workers.placed_s == 50
    names = {b.selector[labels.RAY_TPU_SLICE_NAME] for b in run.workers.bundles}
    assert names == {"slices-0", "slices-1"} and len(run.workers.bundles) == 8
    assert all(b.resources == {"CPU": 1.0, "TPU": 4.0} for b in run.workers.bundles)
    assert failures == []


def _head_work(world: World) -> Work:
    selector = {labels.RAY_TPU_WORKER_ID: "0", labels.RAY_TPU_POD_TYPE: "v6e-16"}
    work = Work(
        world.ray.new_id("head"), [Bundle({"TPU-v6e-16-head": 1.0}, selector)], 1e6,
        world.events.now_s, GangStrategy.PACK, finishes=False,
    )  # fmt: skip
    world.ray.submit(work)
    return work


def test_a_head_takes_the_first_free_slice_in_node_order_whichever_freed_first() -> None:
    """Placement looks only at the nodes with the head resource free when they are
    fewer than those under the head's labels, and still takes the first in order."""
    world = World()
    firsts = [world.add_slice()[0] for _ in range(4)]
    heads = [_head_work(world) for _ in range(4)]
    assert [world.node_of(h) for h in heads] == firsts
    world.ray.remove(heads[3])
    world.ray.remove(heads[1])  # two of four free: slice 3's freed first
    assert world.node_of(_head_work(world)) == firsts[1]
    assert world.node_of(_head_work(world)) == firsts[3]
    assert _head_work(world).placed_s is None


def test_a_head_not_placed_in_time_is_removed_with_the_heads_already_held() -> None:
    world = World()
    (first_host, *_) = world.add_slice()
    failures: list[float] = []
    run = _spg(world, failures, num_slices=2)
    assert world.ray.nodes[first_host].available["TPU-v6e-16-head"] == 0.0
    world.events.run_until(99)
    assert failures == [] and len(_pending_heads(world)) == 1
    world.events.run_until(101)
    assert failures == [100.0] and world.ray.pending == [] and run.workers is None
    assert world.ray.nodes[first_host].available["TPU-v6e-16-head"] == 1.0
    world.events.run_until(1000)
    assert failures == [100.0]  # no retries: the program has failed


def test_retries_start_the_reservation_again_and_stop_when_spent() -> None:
    world = World()
    failures: list[float] = []
    _spg(world, failures, retries=2, head_reservation_timeout_s=60)
    world.events.run_until(1000)
    assert failures == [60.0, 120.0, 180.0] and world.ray.pending == []


def test_single_host_topology_skips_the_heads() -> None:
    world = World()
    world.add_slice("singles")
    failures: list[float] = []
    run = _spg(world, failures, topology="2x4", num_slices=1)
    assert run.heads == [] and run.workers is not None and run.workers.placed_s == 0.0
    assert [b.selector for b in run.workers.bundles] == [{}]
    assert run.workers.bundles[0].resources == {"CPU": 1.0, "TPU": 8.0}


def test_slice_placement_group_spec_validates_its_new_fields() -> None:
    with pytest.raises(Exception, match="head_reservation_timeout_s"):
        SlicePlacementGroupSpec.model_validate(
            {"topology": "4x4", "accelerator_version": "v6e", "head_reservation_timeout_s": 0}
        )
    with pytest.raises(Exception, match="retries"):
        SlicePlacementGroupSpec.model_validate(
            {"topology": "4x4", "accelerator_version": "v6e", "retries": -2}
        )


# --- idleness ---------------------------------------------------------------------------------


def _status(world: World, pod: str) -> Any:
    return next(n for n in world.ray.state().node_states if n.instance_id == pod)


def test_a_bundle_held_with_nothing_running_keeps_its_node_busy() -> None:
    world = World()
    (pod,) = world.add_slice("singles")
    assert _status(world, pod).status == autoscaler_pb2.NodeStatus.IDLE
    assert _status(world, pod).idle_duration_ms >= 1  # the raylet rounds up
    group = Work("pg", [Bundle({"TPU": 8})], 1e6, 0.0, GangStrategy.PACK)
    world.ray.submit(group)
    world.events.run_until(500)
    assert _status(world, pod).status == autoscaler_pb2.NodeStatus.RUNNING
    world.ray.remove(group)
    world.events.run_until(530)
    reported = _status(world, pod)
    assert reported.status == autoscaler_pb2.NodeStatus.IDLE
    assert reported.idle_duration_ms == 30_000  # from the group's removal, not the start


def test_work_waiting_for_room_takes_it_in_queue_order() -> None:
    """When a node gains room, the work queued first takes it, whichever way the
    scheduler finds the waiting work that could use the node (here the first by a
    label it requires, the second requiring none)."""
    world = World(head_cpus=0.0)
    (pod,) = world.add_slice("singles")
    pod_type = world.ray.nodes[pod].labels[labels.RAY_TPU_POD_TYPE]
    blocker = Work("blocker", [Bundle({"TPU": 8})], 50.0, 0.0, GangStrategy.PACK)
    world.ray.submit(blocker)
    pinned = Work(
        "pinned", [Bundle({"TPU": 8}, {labels.RAY_TPU_POD_TYPE: pod_type})], 50.0, 0.0,
        GangStrategy.PACK,
    )  # fmt: skip
    anywhere = Work("anywhere", [Bundle({"TPU": 8})], 50.0, 0.0, GangStrategy.PACK)
    world.ray.submit(pinned)
    world.ray.submit(anywhere)
    assert world.ray.pending == [pinned, anywhere]
    world.events.run_until(60.0)  # the blocker ends: the node has room for one
    assert world.node_of(pinned) == pod
    assert world.ray.pending == [anywhere]


def test_a_placement_group_pinned_to_the_head_by_label_places_there() -> None:
    """The head is a node like any other for a bundle that selects it by label (no
    worker has the head's group)."""
    world = World(head_cpus=2.0)
    world.add_slice("singles")
    work = Work(
        "on-head", [Bundle({"CPU": 1}, {labels.RAY_NODE_GROUP: HEAD_GROUP})], 50.0, 0.0,
        GangStrategy.SPREAD,
    )  # fmt: skip
    world.ray.submit(work)
    assert world.node_of(work) == "t-head-abcde"


def test_work_without_gpus_avoids_gpu_nodes_while_others_have_room() -> None:
    world = World(head_cpus=0.0)
    ids = sorted(["gpu-a", "cpu-b", "gpu-c", "cpu-d"], key=lambda p: _node_id(p))
    for pod in ids:
        total = {"CPU": 1.0, **({"GPU": 1.0} if pod.startswith("gpu") else {})}
        world.ray.nodes[pod] = Node(pod, "g", {}, dict(total), dict(total), 0.0, _node_id(pod))
    placed = [world.node_of(world.task({"CPU": 1})) for _ in range(4)]
    assert sorted(placed[:2]) == ["cpu-b", "cpu-d"]  # GPU nodes only once the others are full
    assert sorted(placed[2:]) == ["gpu-a", "gpu-c"]


def test_a_task_retried_after_its_node_died_runs_its_whole_duration_again() -> None:
    """Ray retries a task whose node died, from the start: the retry ends a full duration
    after it is placed again, not when the lost run would have ended."""
    world = World(head_cpus=0.0)
    (first,) = world.add_slice("singles")
    work = Work("task", [Bundle({"TPU": 8})], 100.0, 0.0)
    world.ray.submit(work)
    assert world.node_of(work) == first
    world.events.run_until(60)
    world.ray.remove_node(first)
    assert work.placed_s is None and world.ray.pending == [work]
    world.events.run_until(70)
    (second,) = world.add_slice("singles")
    assert world.node_of(work) == second and work.placed_s == 70.0
    world.events.run_until(169)  # past t=100, when the lost run would have ended
    assert world.ray.running == {"task": work} and not world.ray.finished
    assert world.ray.nodes[second].busy
    world.events.run_until(170)
    assert world.ray.finished == [work] and not world.ray.running
    assert not world.ray.nodes[second].busy


def test_a_node_removed_retries_each_work_on_it_once_in_running_order() -> None:
    """A gang retried after one of its nodes died and placed again on a node it held
    before is on that node once: when that node dies too, the gang is retried once
    (the scheduler's per-node index keeps the older placement's entry). Work on a
    removed node is retried in the order it was running."""
    world = World(head_cpus=0.0)
    (a,) = world.add_slice("singles")
    (b,) = world.add_slice("singles")
    gang = Work("gang", [Bundle({"TPU": 8}), Bundle({"TPU": 8})], 1e6, 0.0, GangStrategy.SPREAD)
    world.ray.submit(gang)
    assert sorted(pod for pod, _ in gang.placement) == sorted([a, b])
    world.ray.remove_node(b)
    assert world.ray.pending == [gang]
    (c,) = world.add_slice("singles")
    assert sorted(pod for pod, _ in gang.placement) == sorted([a, c])
    _, hit = world.ray.scheduler.remove_node(a)
    assert hit == [gang] and world.ray.pending == [gang] and not world.ray.running
    (d,) = world.add_slice("singles")
    assert sorted(pod for pod, _ in gang.placement) == sorted([c, d])
    world.ray.remove(gang)
    first, second = world.task({"TPU": 4}), world.task({"TPU": 4})
    assert world.node_of(first) == world.node_of(second)
    _, hit = world.ray.scheduler.remove_node(world.node_of(first))
    assert hit == [first, second]


def _state_made_anew(world: World) -> bytes:
    """The GCS's reply with every part made anew: no node's parts, and no state's
    parts kept (the kept state goes on afterwards, as if not looked at)."""
    for node in [*world.ray.scheduler.live_nodes(), *world.ray.dead.values()]:
        node.cached_fixed = node.cached_changing = node.cached_dead = None
    kept = world.ray.gcs_parts
    world.ray.gcs_parts = gcs_state.KeptState()
    try:
        return world.ray.get_cluster_resource_state()
    finally:
        world.ray.gcs_parts = kept


def test_the_gcs_state_from_kept_parts_equals_the_state_made_anew() -> None:
    """Each node's serialized parts are kept until what they are made of changes, each
    writer bumping its version: its use, its status (a busy node draining for a
    preemption keeps its use; an idle one accepts an idle-termination drain), its
    totals (an in-place resize), its death."""
    world = World(head_cpus=0.0)
    pods = world.add_slice("slices") + world.add_slice("singles")
    work = world.task({"TPU": 4})
    gcs = SimGcs(world.ray, on_drained=lambda pod: None, wire=Wire(world.events))
    idle = next(p for p in pods[:-1] if p not in (world.node_of(work), pods[1]))

    def node_id(pod: str) -> str:
        return world.ray.nodes[pod].node_id.hex()

    steps = [
        lambda: None,
        lambda: world.events.run_until(30.0),  # idle durations grow
        lambda: gcs.drain_node(node_id(world.node_of(work)), PREEMPTION, "preempted", 0),
        lambda: world.ray.remove(work),  # its node idle (and still draining)
        lambda: world.ray.drain_node(node_id(idle), IDLE_TERMINATION, "idle", 0),
        lambda: gcs.resize_raylet_resource_instances(node_id(pods[-1]), {"TPU": 4.0}),
        lambda: world.ray.remove_node(pods[1]),  # dead, listed with its ids only
        lambda: world.ray.remove_node(pods[-1]),
    ]
    seen = set()
    for step in steps:
        step()
        kept = world.ray.get_cluster_resource_state()
        assert kept == _state_made_anew(world)
        seen.add(kept)
    assert len(seen) == len(steps)


def test_the_gcs_state_follows_raylets_gone_and_back_between_reads() -> None:
    """The kept state follows the nodes that changed (the scheduler's ledger): a
    raylet that leaves and joins again between two reads (its pod's node now last
    in order), a pod's node replaced where it stands, a node that died as another
    joined (as many nodes as before), a node gone past the ledger (by hand), a dead
    one back as another goes without dying (as many nodes and dead ones): each
    read is the state made anew, and the dead nodes' infos list the dead nodes not
    live again."""
    world = World(head_cpus=0.0)
    pods = world.add_slice("slices") + world.add_slice("singles")
    shape = world.shapes["slices"]

    def rejoin(pod: str, host: int) -> None:
        manifest = admitted_pod.worker_pod("t", "default", shape, 0, host, "")
        assert manifest["metadata"]["name"] == pod
        world.ray.add_node(manifest, shape, host)

    steps = [
        lambda: None,
        lambda: (world.ray.remove_node(pods[1]), rejoin(pods[1], 1)),  # gone and back
        lambda: rejoin(pods[2], 2),  # replaced where it stands
        lambda: world.ray.remove_node(pods[0]),  # dead, listed
        lambda: rejoin(pods[0], 0),  # back: no longer listed dead
        lambda: (world.ray.remove_node(pods[4]), world.add_slice("singles")),  # as many
        lambda: world.ray.scheduler.nodes.pop(pods[3]),  # past the ledger
        lambda: world.ray.remove_node(pods[2]),
        # back from the dead as another node goes (not dead): as many nodes and dead
        lambda: (rejoin(pods[2], 2), world.ray.scheduler.remove_node(pods[1])),
        lambda: world.events.run_until(20.0),
    ]
    for step in steps:
        step()
        dead_infos = world.ray.get_all_node_info(state_filter=gcs_pb2.GcsNodeInfo.DEAD)
        assert world.ray.get_cluster_resource_state() == _state_made_anew(world)
        listed = [n.instance_id for n in dead_infos.values()]
        assert listed == [p for p in world.ray.dead if p not in world.ray.nodes]
        state = world.ray.state()
        assert [n.instance_id for n in state.node_states] == [
            "t-head-abcde",
            *world.ray.nodes,
            *listed,
        ]


def test_a_node_written_without_a_version_bump_reads_as_it_was() -> None:
    """A node's kept part is reused while its version stays: a write to its use that
    skips `Node.changed` leaves the GCS reporting it as it was, which the comparison
    with the state made anew sees (here and all through runs,
    `tests/test_sim_caches.py`); with the bump, the state is current."""
    world = World(head_cpus=0.0)
    (pod,) = world.add_slice("singles")
    before = world.ray.get_cluster_resource_state()
    node = world.ray.nodes[pod]
    node.available["TPU"] -= 4.0
    stale = world.ray.get_cluster_resource_state()
    assert stale == before and stale != _state_made_anew(world)
    node.available["TPU"] -= 4.0
    node.changed()
    current = world.ray.get_cluster_resource_state()
    assert current != before and current == _state_made_anew(world)


def test_dead_nodes_read_for_a_reason_are_those_that_died_for_it() -> None:
    """`read_dead_nodes` with reasons lists the dead nodes that died for one of them,
    oldest first, with their death; without, every dead node."""
    world = World(head_cpus=0.0)
    pods = world.add_slice("singles") + world.add_slice("singles") + world.add_slice("singles")
    gcs = SimGcs(world.ray, on_drained=lambda pod: None, wire=Wire(world.events))
    world.ray.remove_node(pods[0])  # died unexpectedly
    for pod in pods[1:]:
        gcs.drain_node(world.ray.nodes[pod].node_id.hex(), PREEMPTION, f"preempted {pod}", 0)
        world.ray.remove_node(pod, world.ray.nodes[pod].death_reason, f"preempted {pod}")
    preempted = read_dead_nodes(gcs, ["AUTOSCALER_DRAIN_PREEMPTED"])
    assert [(d.pod, d.reason, d.message) for d in preempted] == [
        (pod, "AUTOSCALER_DRAIN_PREEMPTED", f"preempted {pod}") for pod in pods[1:]
    ]
    assert [d.pod for d in read_dead_nodes(gcs)] == pods
    assert read_dead_nodes(gcs, ["UNEXPECTED_TERMINATION"]) == []
