"""Label selectors (IN, multi-value IN, NOT_IN, absent keys) in the policy and in the
GCS parsing, checked against oracles written here: the labels a slice of each group
carries are a table in this file, and matching is re-stated from Ray's scheduler
(`_satisfies_label_constraints`: a host without the key fails IN and passes NOT_IN)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from google.protobuf.json_format import MessageToDict
from hypothesis import given, settings
from hypothesis import strategies as st
from ray._private.label_utils import validate_label_selector
from ray.autoscaler.v2.scheduler import SchedulingNode, SchedulingNodeStatus
from ray.core.generated import autoscaler_pb2, common_pb2

from tests.factories import tpu_group
from tests.snapshots import (
    pending_replica,
    running_replica,
    shapes_for,
    slice_head_gang,
    snapshot,
)
from tpu_autoscaler.adapters.ray.state import from_message, parse_ray_state
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    ResourceDemand,
    selector_from_mapping,
    selector_matches,
)
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import ClusterSnapshot, Replica, ReplicaState

POD_TYPE = "ray.io/tpu-pod-type"
TOPOLOGY = "ray.io/tpu-topology"
ACCELERATOR = "ray.io/accelerator-type"
WORKER_ID = "ray.io/tpu-worker-id"
SLICE_NAME = "ray.io/tpu-slice-name"
NODE_GROUP = "ray.io/node-group"
POOL = "example.com/pool"
"""A label some groups set in their spec and others lack."""
ABSENT = "example.com/absent"
"""A label no host ever carries."""


@dataclass(frozen=True)
class SliceSpec:
    """One slice type and what its hosts carry, written out by hand (from BRIEF.md and
    Ray 2.60's tpu.py), not derived by the code under test."""

    generation: str
    topology: str
    chips_per_host: int | None
    pod_type: str
    accelerator: str
    hosts: int
    tpu_per_host: float

    @property
    def chips(self) -> int:
        return self.hosts * int(self.tpu_per_host)

    def slice_type(self) -> catalog.SliceType:
        generation = catalog.find_generation(self.generation)
        assert generation is not None
        return catalog.slice_type(generation, self.topology, self.chips_per_host)


SPECS = (
    SliceSpec("v6e", "4x4", None, "v6e-16", "TPU-V6E", 4, 4.0),
    SliceSpec("v6e", "2x4", 8, "v6e-8", "TPU-V6E", 1, 8.0),
    SliceSpec("v6e", "2x4", 4, "v6e-8", "TPU-V6E", 2, 4.0),
    SliceSpec("v5p", "2x2x2", None, "v5p-16", "TPU-V5P", 2, 4.0),
    SliceSpec("v4", "2x2x1", None, "v4-8", "TPU-V4", 1, 4.0),
    SliceSpec("tpu7x", "2x2x2", None, "v7x-16", "TPU-V7X", 2, 4.0),
)


@dataclass(frozen=True)
class Group:
    name: str
    spec: SliceSpec
    max_replicas: int
    pool: str | None

    def host_labels(self, index: int, slice_name: str | None) -> dict[str, str]:
        """What Ray reports for host `index` of one of this group's slices."""
        found = {
            NODE_GROUP: self.name,
            ACCELERATOR: self.spec.accelerator,
            TOPOLOGY: self.spec.topology,
            POD_TYPE: self.spec.pod_type,
            WORKER_ID: str(index),
        }
        if self.pool is not None:
            found[POOL] = self.pool
        if slice_name is not None:
            found[SLICE_NAME] = slice_name
        return found


def _in(key: str, *values: str) -> LabelConstraint:
    return LabelConstraint(key, "in", frozenset(values))


def _not_in(key: str, *values: str) -> LabelConstraint:
    return LabelConstraint(key, "not_in", frozenset(values))


def oracle_matches(selector: Sequence[LabelConstraint], host_labels: Mapping[str, str]) -> bool:
    for constraint in selector:
        present = constraint.key in host_labels
        if constraint.operator == "in":
            if not present or host_labels[constraint.key] not in constraint.values:
                return False
        elif present and host_labels[constraint.key] in constraint.values:
            return False
    return True


# --- generators ---------------------------------------------------------------------

VALUES: dict[str, list[str]] = {
    POD_TYPE: sorted({s.pod_type for s in SPECS} | {"v5p-2048"}),
    TOPOLOGY: sorted({s.topology for s in SPECS} | {"8x8"}),
    ACCELERATOR: sorted({s.accelerator for s in SPECS} | {"TPU-V3"}),
    WORKER_ID: ["0", "1", "2", "3"],
    NODE_GROUP: ["g0", "g1", "g2"],
    POOL: ["blue", "red"],
    ABSENT: ["a", "b"],
}


@st.composite
def selectors(draw: st.DrawFn, slice_names: Sequence[str] = ()) -> LabelSelector:
    """0-3 constraints on distinct keys, IN or NOT_IN, 1-3 values each."""
    pools = dict(VALUES)
    pools[SLICE_NAME] = sorted(set(slice_names) | {"gone-slice"})
    keys = draw(st.lists(st.sampled_from(sorted(pools)), max_size=3, unique=True))
    constraints = []
    for key in keys:
        values = draw(st.lists(st.sampled_from(pools[key]), min_size=1, max_size=3, unique=True))
        operator: Literal["in", "not_in"] = draw(st.sampled_from(["in", "not_in"]))
        constraints.append(LabelConstraint(key, operator, frozenset(values)))
    return tuple(constraints)


@st.composite
def groups_strategy(draw: st.DrawFn) -> tuple[Group, ...]:
    specs = draw(st.lists(st.sampled_from(SPECS), min_size=1, max_size=3))
    return tuple(
        Group(
            f"g{i}",
            spec,
            draw(st.integers(1, 3)),
            draw(st.sampled_from([None, "blue", "red"])),
        )
        for i, spec in enumerate(specs)
    )


def shapes_of(groups: Sequence[Group]) -> tuple[SliceShape, ...]:
    specs = []
    for g in groups:
        extra: dict[str, Any] = {"labels": {POOL: g.pool}} if g.pool else {}
        specs.append(tpu_group(g.name, g.spec.slice_type(), 0, g.max_replicas, **extra))
    return shapes_for(*specs)


@dataclass(frozen=True)
class World:
    """A generated cluster, and what the oracle knows of each usable host."""

    groups: tuple[Group, ...]
    snap: ClusterSnapshot
    usable_hosts: tuple[tuple[dict[str, str], float], ...]
    """Labels and free TPU of every running or pending host."""
    existing: dict[str, int]
    """Replicas per group that count toward maxReplicas."""

    def headroom(self, group: Group) -> int:
        return max(0, group.max_replicas - self.existing[group.name])

    def slice_names(self) -> list[str]:
        return [r.slice_name for r in self.snap.replicas if r.slice_name]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[tuple[Group, ...], tuple[SliceShape, ...], list[Replica]]:
    groups = draw(groups_strategy())
    shapes = shapes_of(groups)
    replicas: list[Replica] = []
    for group, shape in zip(groups, shapes, strict=True):
        for index in range(draw(st.integers(0, group.max_replicas))):
            kind = draw(st.sampled_from(["running", "running", "pending", "draining"]))
            if kind == "pending":
                replicas.append(pending_replica(shape, index, created_at_s=990.0))
                continue
            tpu = group.spec.tpu_per_host
            used = {
                h: {"TPU": draw(st.sampled_from([0.0, tpu / 2, tpu]))}
                for h in range(group.spec.hosts)
            }
            replica = running_replica(shape, index, idle_s=0.0, used=used)
            if kind == "draining":
                replica = replace(replica, state=ReplicaState.DRAINING)
            replicas.append(replica)
    return groups, shapes, replicas


def world_of(
    groups: tuple[Group, ...], shapes: tuple[SliceShape, ...], replicas: list[Replica], d: Demand
) -> World:
    by_name = {g.name: g for g in groups}
    hosts: list[tuple[dict[str, str], float]] = []
    existing = dict.fromkeys(by_name, 0)
    for replica in replicas:
        group = by_name[replica.group]
        existing[group.name] += 1
        if replica.state is ReplicaState.DRAINING:
            continue
        for i in range(group.spec.hosts):
            free = group.spec.tpu_per_host
            if replica.state is ReplicaState.RUNNING:
                free = replica.hosts[i].available["TPU"]
            hosts.append((group.host_labels(i, replica.slice_name), free))
    snap = snapshot(shapes, replicas, d)
    return World(groups, snap, tuple(hosts), existing)


def copies(free_tpu: float, tpu: float) -> int:
    return int(free_tpu // tpu)


def existing_copies(world: World, bundle_tpu: float, selector: LabelSelector) -> int:
    return sum(
        copies(free, bundle_tpu)
        for host_labels, free in world.usable_hosts
        if oracle_matches(selector, host_labels)
    )


def copies_per_new_replica(group: Group, bundle_tpu: float, selector: LabelSelector) -> int:
    """A slice not launched yet has every label but the slice name."""
    return sum(
        copies(group.spec.tpu_per_host, bundle_tpu)
        for i in range(group.spec.hosts)
        if oracle_matches(selector, group.host_labels(i, None))
    )


# --- matching itself ----------------------------------------------------------------


@st.composite
def labelled_hosts(draw: st.DrawFn) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True))
    return {k: draw(st.sampled_from(VALUES[k])) for k in keys}


@settings(max_examples=300, derandomize=True)
@given(selectors(), labelled_hosts())
def test_selector_matching_agrees_with_rays_rule(
    selector: LabelSelector, host_labels: dict[str, str]
) -> None:
    assert selector_matches(selector, host_labels) == oracle_matches(selector, host_labels)


def test_absent_key_fails_in_and_passes_not_in() -> None:
    host = {POD_TYPE: "v6e-16"}
    assert not LabelConstraint(ABSENT, "in", frozenset({"a"})).matches(host)
    assert LabelConstraint(ABSENT, "not_in", frozenset({"a"})).matches(host)
    assert not LabelConstraint(POD_TYPE, "not_in", frozenset({"v4-8", "v6e-16"})).matches(host)
    assert LabelConstraint(POD_TYPE, "in", frozenset({"v4-8", "v6e-16"})).matches(host)


def test_rays_dict_syntax_parses_to_constraints() -> None:
    """`label_selector={...}` values as Ray's own validator accepts them."""
    selector = {
        "market": "spot",
        "accelerator": "!GPU",
        "zone": "in(A123, B456, C789)",
        "tier": "!in(spot, on-demand)",
    }
    assert validate_label_selector(selector) is None
    assert set(selector_from_mapping(selector)) == {
        _in("market", "spot"),
        _not_in("accelerator", "GPU"),
        _in("zone", "A123", "B456", "C789"),
        _not_in("tier", "spot", "on-demand"),
    }


def test_constraints_render_as_rays_dict_syntax_reads() -> None:
    """How plans and reports quote selectors: single IN as `key=value`, anything else
    with its operator and sorted values."""
    assert str(_in(POD_TYPE, "v6e-16")) == "ray.io/tpu-pod-type=v6e-16"
    assert str(_in(POD_TYPE, "v6e-8", "v4-8")) == "ray.io/tpu-pod-type in (v4-8,v6e-8)"
    assert str(_not_in(POD_TYPE, "v4-8")) == "ray.io/tpu-pod-type !in (v4-8)"
    assert str(_not_in(POD_TYPE, "v6e-8", "v4-8")) == "ray.io/tpu-pod-type !in (v4-8,v6e-8)"
    bundle = Bundle({"TPU": 4.0, "CPU": 1.0}, (_in(POD_TYPE, "v6e-16"), _not_in(WORKER_ID, "0")))
    assert (
        str(bundle)
        == "{CPU: 1, TPU: 4} if ray.io/tpu-pod-type=v6e-16, ray.io/tpu-worker-id !in (0)"
    )
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}), bundle))
    assert str(constraint) == f"request_resources({{TPU: 4}}, {bundle})"
    gang = GangDemand("pg7", (bundle, Bundle({"TPU": 4.0}), bundle), GangStrategy.STRICT_SPREAD)
    assert str(gang) == f"placement group pg7 (STRICT_SPREAD: 2 x {bundle}, 1 x {{TPU: 4}})"
    assert str(ResourceDemand(bundle, 3)) == f"3 x {bundle}"


# --- the policy: tasks and actors with generated selectors --------------------------


@st.composite
def task_worlds(draw: st.DrawFn) -> tuple[World, Bundle, int]:
    groups, shapes, replicas = draw(clusters())
    names = [r.slice_name for r in replicas if r.slice_name]
    selector = draw(selectors(names))
    tpu = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
    count = draw(st.integers(1, 14))
    bundle = Bundle({"TPU": tpu}, selector)
    return (
        world_of(groups, shapes, replicas, Demand((ResourceDemand(bundle, count),))),
        bundle,
        count,
    )


@settings(max_examples=250, derandomize=True)
@given(task_worlds())
def test_tasks_go_only_where_their_selector_allows(case: tuple[World, Bundle, int]) -> None:
    world, bundle, count = case
    tpu, selector = bundle.resources["TPU"], bundle.selector
    result = plan(world.snap)
    on_existing = existing_copies(world, tpu, selector)
    per_replica = {g.name: copies_per_new_replica(g, tpu, selector) for g in world.groups}
    can_launch = {g.name for g in world.groups if per_replica[g.name]}
    launchable = sum(world.headroom(g) * per_replica[g.name] for g in world.groups)
    wanted = max(0, count - on_existing)
    servable = min(count, on_existing + launchable)
    launched = {launch.group: launch.replicas for launch in result.launch}

    assert result.terminate == ()
    assert set(launched) <= can_launch, (launched, can_launch)
    assert result.bundles_placed == servable, (result, on_existing, launchable)
    assert result.bundles_unmet == count - servable
    if not can_launch and servable < count:
        assert result.infeasible and not result.waiting, result
    if can_launch:
        assert not result.infeasible, result
    # No launched replica is spare: without any one of them, less demand would fit.
    launched_copies = sum(n * per_replica[g] for g, n in launched.items())
    for g in launched:
        assert launched_copies - per_replica[g] < min(wanted, launchable)
    if len(can_launch) == 1:
        (only,) = can_launch
        group = next(g for g in world.groups if g.name == only)
        expected = min(world.headroom(group), math.ceil(wanted / per_replica[only]))
        assert launched.get(only, 0) == expected


# --- the policy: placement groups with a selector per bundle ------------------------


@st.composite
def gang_worlds(draw: st.DrawFn) -> tuple[World, GangDemand]:
    groups, shapes, replicas = draw(clusters())
    names = [r.slice_name for r in replicas if r.slice_name]
    bundles = tuple(
        Bundle({"TPU": draw(st.sampled_from([1.0, 4.0, 8.0]))}, draw(selectors(names)))
        for _ in range(draw(st.integers(1, 4)))
    )
    gang = GangDemand("pg", bundles, draw(st.sampled_from(list(GangStrategy))))
    return world_of(groups, shapes, replicas, Demand(gangs=(gang,))), gang


def _gang_checks(world: World, gang: GangDemand, result: Plan) -> None:
    def anywhere(bundle: Bundle) -> set[str]:
        """Groups whose new slices could hold the bundle alone; "" for existing hosts."""
        tpu = bundle.resources["TPU"]
        found = {g.name for g in world.groups if copies_per_new_replica(g, tpu, bundle.selector)}
        if existing_copies(world, tpu, bundle.selector):
            found.add("")
        return found

    homes = [anywhere(b) for b in gang.bundles]
    launched = {launch.group for launch in result.launch}
    size = len(gang.bundles)
    assert result.bundles_placed + result.bundles_unmet == size
    assert result.bundles_placed in (0, size)
    if not all(homes):
        # A bundle no host can ever hold: the gang is reported and launches nothing.
        assert launched == set() and result.bundles_unmet == size and result.infeasible
    assert launched <= set().union(*homes), (launched, homes)


@settings(max_examples=250, derandomize=True)
@given(gang_worlds())
def test_gang_bundles_launch_only_groups_their_selectors_allow(
    case: tuple[World, GangDemand],
) -> None:
    world, gang = case
    _gang_checks(world, gang, plan(world.snap))


# --- focused cases ------------------------------------------------------------------


def _group(name: str, spec: SliceSpec, max_replicas: int = 4, **extra: Any) -> dict[str, Any]:
    return tpu_group(name, spec.slice_type(), 0, max_replicas, **extra)


V6E_16, V6E_8_ONE_HOST, V6E_8_TWO_HOSTS, V5P_16, V4_8, V7X_16 = SPECS


def _launched(result: Plan) -> dict[str, int]:
    return {launch.group: launch.replicas for launch in result.launch}


def test_not_in_keeps_the_cheapest_group_out() -> None:
    shapes = shapes_for(_group("v4", V4_8), _group("v6e", V6E_16))
    tasks = ResourceDemand(Bundle({"TPU": 4.0}, (_not_in(POD_TYPE, "v4-8", "v5p-2048"),)), 1)
    assert _launched(plan(snapshot(shapes, demand=Demand((tasks,))))) == {"v6e": 1}
    # Past the exhaustive search's size too.
    tasks = replace(tasks, count=12)
    assert _launched(plan(snapshot(shapes, demand=Demand((tasks,))))) == {"v6e": 3}


def test_not_in_the_only_pod_type_launches_nothing_and_is_infeasible() -> None:
    shapes = shapes_for(_group("v6e", V6E_16))
    for count in (1, 12):
        tasks = ResourceDemand(Bundle({"TPU": 4.0}, (_not_in(POD_TYPE, "v6e-16"),)), count)
        result = plan(snapshot(shapes, demand=Demand((tasks,))))
        assert result.launch == () and result.bundles_unmet == count
        assert result.infeasible and not result.waiting


def test_absent_key_passes_not_in_and_fails_in_on_new_slices() -> None:
    shapes = shapes_for(_group("plain", V4_8), _group("blue", V6E_16, labels={POOL: "blue"}))
    for count in (1, 12):
        # Only "blue" carries the key: IN needs it, NOT_IN of another value accepts both.
        wants_blue = ResourceDemand(Bundle({"TPU": 4.0}, (_in(POOL, "blue", "red"),)), count)
        assert set(_launched(plan(snapshot(shapes, demand=Demand((wants_blue,)))))) == {"blue"}
        not_red = ResourceDemand(Bundle({"TPU": 4.0}, (_not_in(POOL, "red"),)), count)
        result = plan(snapshot(shapes, demand=Demand((not_red,))))
        # 12 copies: plain, room for four one-copy slices, ties with one blue slice for
        # those four on chips; blue needs fewer slices and takes all twelve, as the
        # exhaustive search does for eight. Plain is still an option.
        if count == 1:
            assert _launched(result) == {"plain": 1}
        else:
            assert _launched(result) == {"blue": 3}
            assert "also possible: plain" in result.launch[0].reason
        absent = ResourceDemand(Bundle({"TPU": 4.0}, (_in(ABSENT, "a"),)), count)
        result = plan(snapshot(shapes, demand=Demand((absent,))))
        assert result.launch == () and result.infeasible


def test_a_bundle_pinned_to_a_full_slice_never_lands_on_a_new_one() -> None:
    shapes = shapes_for(_group("tpu", V6E_16))
    (shape,) = shapes
    full = running_replica(shape, 0, used={i: {"TPU": 4.0} for i in range(4)})
    roomy = running_replica(shape, 1, used={0: {"TPU": 4.0}})
    for count in (1, 12):
        pinned = ResourceDemand(Bundle({"TPU": 4.0}, (_in(SLICE_NAME, "tpu-0"),)), count)
        result = plan(snapshot(shapes, [full, roomy], Demand((pinned,))))
        assert result.launch == () and result.bundles_unmet == count
    # Multi-value IN: the slice with room serves it, nothing is launched.
    either = ResourceDemand(Bundle({"TPU": 4.0}, (_in(SLICE_NAME, "tpu-0", "tpu-1"),)), 3)
    result = plan(snapshot(shapes, [full, roomy], Demand((either,))))
    assert result.launch == () and result.bundles_placed == 3


def test_a_bundle_pinned_to_a_vanished_slice_is_reported_as_such() -> None:
    """The slice a bundle names is gone (or draining): say so, not "no group offers it"."""
    shapes = shapes_for(_group("tpu", V6E_16))
    draining = replace(running_replica(shapes[0], 0), state=ReplicaState.DRAINING)
    pinned = Bundle({"TPU": 4.0}, (_in(SLICE_NAME, "tpu-0", "gone-slice"),))
    for d in (Demand((ResourceDemand(pinned, 2),)), Demand(gangs=(GangDemand("pg", (pinned,)),))):
        result = plan(snapshot(shapes, [draining], d))
        assert result.launch == () and not result.waiting
        (item,) = result.infeasible
        assert "gone-slice, tpu-0, which does not exist" in item.reason


def test_a_new_slice_launched_for_one_selector_does_not_serve_another() -> None:
    """First fit (over 10 bundles): bundles selecting v4 must not fill the room left on
    new v6e slices, which the later v6e bundles need."""
    shapes = shapes_for(_group("v6e", V6E_8_ONE_HOST), _group("v4", V4_8))
    big = ResourceDemand(Bundle({"TPU": 2.0}, (_in(POD_TYPE, "v6e-8"),)), 11)
    for_v4 = ResourceDemand(Bundle({"TPU": 1.0}, (_in(POD_TYPE, "v4-8"),)), 2)
    for_v6e = ResourceDemand(Bundle({"TPU": 1.0}, (_in(POD_TYPE, "v6e-8"),)), 2)
    result = plan(snapshot(shapes, demand=Demand((big, for_v4, for_v6e))))
    assert _launched(result) == {"v6e": 3, "v4": 1}
    assert result.bundles_placed == 15


def test_in_and_not_in_of_the_same_values_are_told_apart() -> None:
    """First fit remembers which hosts match each selector: `IN (v4-8)` and
    `NOT_IN (v4-8)` name the same key and values and must still not share hosts."""
    shapes = shapes_for(_group("v6e", V6E_8_ONE_HOST), _group("v4", V4_8))
    on_v4 = ResourceDemand(Bundle({"TPU": 1.0}, (_in(POD_TYPE, "v4-8"),)), 11)
    off_v4 = ResourceDemand(Bundle({"TPU": 1.0}, (_not_in(POD_TYPE, "v4-8"),)), 11)
    result = plan(snapshot(shapes, demand=Demand((on_v4, off_v4))))
    assert _launched(result) == {"v4": 3, "v6e": 2}
    assert result.bundles_placed == 22


def test_not_in_on_gang_bundles_excludes_a_group_for_the_whole_gang() -> None:
    """2 x 4 TPUs kept off v6e: packed they need one 8-TPU host, which only v6e has,
    so the pack can never be served; spread they take two v4 slices."""
    shapes = shapes_for(_group("v6e", V6E_8_ONE_HOST), _group("v4", V4_8))
    bundle = Bundle({"TPU": 4.0}, (_not_in(ACCELERATOR, "TPU-V6E"),))
    pack = GangDemand("pg", (bundle, bundle), GangStrategy.STRICT_PACK)
    result = plan(snapshot(shapes, demand=Demand(gangs=(pack,))))
    assert result.launch == () and result.infeasible
    spread = GangDemand("pg", (bundle, bundle), GangStrategy.STRICT_SPREAD)
    assert _launched(plan(snapshot(shapes, demand=Demand(gangs=(spread,))))) == {"v4": 2}


# --- slice heads ---------------------------------------------------------------------


def test_a_slice_head_reserves_its_whole_slice() -> None:
    """Stage one holds every TPU of the slice it takes: a task needing TPUs then
    launches a slice of its own instead of landing on the reserved one."""
    shapes = shapes_for(_group("tpu", V6E_16))
    (shape,) = shapes
    idle = running_replica(shape, 0)
    task = ResourceDemand(Bundle({"TPU": 4.0}), 1)
    result = plan(snapshot(shapes, [idle], Demand((task,), (slice_head_gang("v6e-16"),))))
    assert _launched(result) == {"tpu": 1}
    assert result.bundles_placed == 2


def test_two_slice_heads_need_two_slices() -> None:
    shapes = shapes_for(_group("tpu", V6E_16))
    (shape,) = shapes
    heads = (slice_head_gang("v6e-16", gang_id="a"), slice_head_gang("v6e-16", gang_id="b"))
    assert _launched(plan(snapshot(shapes, demand=Demand(gangs=heads)))) == {"tpu": 2}
    idle = running_replica(shape, 0)
    assert _launched(plan(snapshot(shapes, [idle], Demand(gangs=heads)))) == {"tpu": 1}
    # A head and stage two of another slice: the head may not take the reserved slice.
    reserved = running_replica(shape, 0, used={0: {"TPU-v6e-16-head": 1.0}})
    stage_two = GangDemand(
        "b-workers", (Bundle({"CPU": 1.0, "TPU": 4.0}, (_in(SLICE_NAME, "tpu-0"),)),) * 4
    )
    result = plan(snapshot(shapes, [reserved], Demand(gangs=(heads[0], stage_two))))
    assert _launched(result) == {"tpu": 1} and result.bundles_placed == 5


def test_slice_head_selectors_choose_the_slice() -> None:
    shapes = shapes_for(_group("a", V6E_16), _group("b", V6E_16, labels={POOL: "blue"}))
    head = Bundle(
        {"TPU-v6e-16-head": 1.0},
        (_in(WORKER_ID, "0"), _in(POD_TYPE, "v6e-16"), _not_in(POOL, "red", "green")),
    )
    blue = Bundle(head.resources, (*head.selector[:2], _in(POOL, "blue")))
    not_blue = Bundle(head.resources, (*head.selector[:2], _not_in(POOL, "blue")))
    for bundle, group in ((blue, "b"), (not_blue, "a")):
        result = plan(snapshot(shapes, demand=Demand(gangs=(GangDemand("h", (bundle,)),))))
        assert _launched(result) == {group: 1}
    # The head resource is on worker 0 only: a head selecting another worker never fits.
    elsewhere = Bundle(head.resources, (_not_in(WORKER_ID, "0"),))
    result = plan(snapshot(shapes, demand=Demand(gangs=(GangDemand("h", (elsewhere,)),))))
    assert result.launch == () and result.infeasible


def test_slice_head_selectors_choose_among_idle_slices() -> None:
    """An idle slice the head's selector excludes is not taken: a matching one is launched."""
    shapes = shapes_for(_group("a", V6E_16), _group("b", V6E_16, labels={POOL: "blue"}))
    idle_a = running_replica(shapes[0], 0)
    base = (_in(WORKER_ID, "0"), _in(POD_TYPE, "v6e-16"))
    for constraint in (_in(POOL, "blue"), _not_in(NODE_GROUP, "a", "c")):
        head = GangDemand("h", (Bundle({"TPU-v6e-16-head": 1.0}, (*base, constraint)),))
        result = plan(snapshot(shapes, [idle_a], Demand(gangs=(head,))))
        assert _launched(result) == {"b": 1}, constraint
    head = GangDemand("h", (Bundle({"TPU-v6e-16-head": 1.0}, (*base, _not_in(POOL, "blue"))),))
    result = plan(snapshot(shapes, [idle_a], Demand(gangs=(head,))))
    assert result.launch == () and result.bundles_placed == 1


# --- minReplicas -----------------------------------------------------------------------


def test_draining_replicas_do_not_count_toward_min_replicas() -> None:
    shapes = shapes_for(tpu_group("tpu", V6E_16.slice_type(), 1, 3, idleTimeoutSeconds=60))
    (shape,) = shapes
    draining = replace(running_replica(shape, 0), state=ReplicaState.DRAINING)
    result = plan(snapshot(shapes, [draining]))
    assert _launched(result) == {"tpu": 1}
    assert "minReplicas" in result.launch[0].reason
    # With one healthy replica besides the draining one, the healthy one is the minimum:
    # idle as it is, it stays.
    idle = running_replica(shape, 1, idle_s=1000.0)
    result = plan(snapshot(shapes, [draining, idle]))
    assert result.launch == () and result.terminate == ()


# --- the fewest chips ------------------------------------------------------------------


def test_fewest_chips_beat_fewest_replicas() -> None:
    """One v6e-16 slice holds the demand, but several v4-8 slices hold it in fewer chips."""
    shapes = shapes_for(_group("v6e", V6E_16), _group("v4", V4_8))
    small = ResourceDemand(Bundle({"TPU": 4.0}), 2)  # exhaustive search: 8 chips, not 16
    assert _launched(plan(snapshot(shapes, demand=Demand((small,))))) == {"v4": 2}
    large = ResourceDemand(Bundle({"TPU": 1.0}), 12)  # first fit: 12 chips, not 16
    assert _launched(plan(snapshot(shapes, demand=Demand((large,))))) == {"v4": 3}
    gang = GangDemand("pg", (Bundle({"TPU": 1.0}),) * 12, GangStrategy.SPREAD)
    assert _launched(plan(snapshot(shapes, demand=Demand(gangs=(gang,))))) == {"v4": 3}


def test_exhaustive_search_tries_each_groups_new_hosts() -> None:
    """New hosts of two groups are not interchangeable even at the same host index:
    the 5-CPU bundle goes first, fails on the v6e host beside the 8-TPU one, and must
    then be tried on the v4 host (one of each, 12 chips; not two v6e, 16 chips)."""
    shapes = shapes_for(_group("v6e", V6E_8_ONE_HOST), _group("v4", V4_8))
    anywhere = ResourceDemand(Bundle({"TPU": 4.0, "CPU": 5.0}), 1)
    v6e_only = ResourceDemand(Bundle({"TPU": 8.0}, (_in(POD_TYPE, "v6e-8"),)), 1)
    result = plan(snapshot(shapes, demand=Demand((anywhere, v6e_only))))
    assert _launched(result) == {"v6e": 1, "v4": 1}
    assert "exhaustive search" in result.launch[0].reason


# --- the GCS's ClusterResourceState into selectors ------------------------------------

_OPERATORS = {
    "in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_IN"),
    "not_in": common_pb2.LabelSelectorOperator.Value("LABEL_OPERATOR_NOT_IN"),
}


def _proto_selector(selector: LabelSelector) -> Any:
    return common_pb2.LabelSelector(
        label_constraints=[
            common_pb2.LabelSelectorConstraint(
                label_key=c.key, operator=_OPERATORS[c.operator], label_values=sorted(c.values)
            )
            for c in selector
        ]
    )


def _proto_request(resources: Mapping[str, float], *selectors: LabelSelector) -> Any:
    return autoscaler_pb2.ResourceRequest(
        resources_bundle=dict(resources), label_selectors=[_proto_selector(s) for s in selectors]
    )


def _rays_verdict(request: Any, host_labels: Mapping[str, str]) -> bool:
    """Whether Ray 2.60's own scheduler lets a node with `host_labels` take `request`."""
    node = SchedulingNode(
        node_type="any",
        total_resources={},
        available_resources={},
        labels=dict(host_labels),
        status=SchedulingNodeStatus.SCHEDULABLE,
    )
    return bool(node._satisfies_label_constraints([request]) > 0)


def _state_with(preferred: LabelSelector, fallback: LabelSelector | None) -> Any:
    """Every place a selector travels in a ClusterResourceState: tasks, a placement
    group (its bundle selector; the legacy `requests` field says otherwise) and
    request_resources; the fallback selector second, as Ray sends it."""
    selectors = (preferred,) if fallback is None else (preferred, fallback)
    request = _proto_request({"TPU": 4.0}, *selectors)
    legacy = _proto_request({"TPU": 4.0}, (_in(ABSENT, "legacy"),))
    return autoscaler_pb2.ClusterResourceState(
        pending_resource_requests=[autoscaler_pb2.ResourceRequestByCount(request=request, count=2)],
        pending_gang_resource_requests=[
            autoscaler_pb2.GangResourceRequest(
                requests=[legacy],
                details="pg1:SPREAD|PENDING",
                bundle_selectors=[autoscaler_pb2.BundleSelector(resource_requests=[request] * 2)],
            )
        ],
        cluster_resource_constraints=[
            autoscaler_pb2.ClusterResourceConstraint(
                resource_requests=[autoscaler_pb2.ResourceRequestByCount(request=request, count=1)]
            )
        ],
    )


def _parsed_bundles(demand: Demand) -> list[Bundle]:
    return (
        [r.bundle for r in demand.resources]
        + [b for g in demand.gangs for b in g.bundles]
        + [b for c in demand.constraints for b in c.bundles]
    )


@settings(max_examples=200, derandomize=True)
@given(selectors(["s-0", "s-1"]), st.none() | selectors(), labelled_hosts())
def test_gcs_selectors_parse_to_the_preferred_selector(
    preferred: LabelSelector, fallback: LabelSelector | None, host_labels: dict[str, str]
) -> None:
    state = _state_with(preferred, fallback)
    from_proto = from_message(state).demand
    from_json = parse_ray_state(MessageToDict(state, preserving_proto_field_name=True)).demand
    assert from_json == from_proto
    bundles = _parsed_bundles(from_proto)
    assert len(bundles) == 4
    alone = _proto_request({"TPU": 4.0}, preferred)
    for bundle in bundles:
        assert bundle.resources == {"TPU": 4.0}
        assert sorted(bundle.selector, key=repr) == sorted(preferred, key=repr)
        # The policy plans for the preferred selector only: it matches where Ray would
        # place the request if that selector were its only one.
        assert selector_matches(bundle.selector, host_labels) == _rays_verdict(alone, host_labels)


def test_gcs_in_and_not_in_with_several_values() -> None:
    preferred = (_in(POD_TYPE, "v6e-16", "v6e-8"), _not_in(WORKER_ID, "1", "2"))
    state = _state_with(preferred, (_in(POD_TYPE, "v4-8"),))
    (task, *_) = _parsed_bundles(from_message(state).demand)
    assert set(task.selector) == set(preferred)
    assert selector_matches(task.selector, {POD_TYPE: "v6e-8", WORKER_ID: "0"})
    assert selector_matches(task.selector, {POD_TYPE: "v6e-16"})
    assert not selector_matches(task.selector, {POD_TYPE: "v6e-16", WORKER_ID: "2"})
    assert not selector_matches(task.selector, {POD_TYPE: "v4-8", WORKER_ID: "0"})


def test_gcs_selector_with_an_unknown_operator_matches_no_host() -> None:
    """Ray's scheduler fails a constraint whose operator it does not know; dropping it
    would let the policy launch for demand that Ray never places."""
    request = autoscaler_pb2.ResourceRequest(
        resources_bundle={"TPU": 4.0},
        label_selectors=[
            common_pb2.LabelSelector(
                label_constraints=[
                    common_pb2.LabelSelectorConstraint(label_key=POD_TYPE, label_values=["v4-8"])
                ]
            )
        ],
    )
    state = autoscaler_pb2.ClusterResourceState(
        pending_resource_requests=[autoscaler_pb2.ResourceRequestByCount(request=request, count=1)]
    )
    (task,) = from_message(state).demand.resources
    for host in ({POD_TYPE: "v4-8"}, {POD_TYPE: "v6e-16"}, {}):
        assert not selector_matches(task.bundle.selector, host)
        assert not _rays_verdict(request, host)


def test_gcs_gang_without_bundle_selectors_reads_its_legacy_requests() -> None:
    request = _proto_request({"TPU": 4.0}, (_not_in(POD_TYPE, "v4-8"),))
    state = autoscaler_pb2.ClusterResourceState(
        pending_gang_resource_requests=[
            autoscaler_pb2.GangResourceRequest(requests=[request] * 3, details="pg9:PACK|PENDING")
        ]
    )
    (gang,) = from_message(state).demand.gangs
    assert gang.gang_id == "pg9" and len(gang.bundles) == 3
    assert gang.bundles[0].selector == (_not_in(POD_TYPE, "v4-8"),)
