"""The slice policy on hand-made snapshots, including each upstream failure of
BRIEF.md as a regression test."""

from __future__ import annotations

from dataclasses import replace

from tests.factories import cpu_group, tpu_group
from tests.snapshots import (
    apply_plan,
    pending_replica,
    running_replica,
    shapes_for,
    slice_head_gang,
    slice_worker_gang,
    snapshot,
    v6e_16_shapes,
)
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    ClusterConstraint,
    Demand,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    selector_from_mapping,
)
from tpu_autoscaler.core.plan import GroupVerdict
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.snapshot import LaunchFailures, PolicyConfig, Replica, ReplicaState

V6E16 = selector_from_mapping({"ray.io/tpu-pod-type": "v6e-16"})


def tpu4(count: int = 1, selector: dict[str, str] | None = None) -> ResourceDemand:
    return ResourceDemand(Bundle({"TPU": 4.0}, selector_from_mapping(selector or {})), count)


# --- upstream failure 1: a busy slice is never removed -------------------------------------


def test_actor_on_host_one_keeps_the_whole_slice() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=30)
    busy = running_replica(shape, 0, idle_s=[100, 0, 100, 100], used={1: {"TPU": 4}})
    result = plan(snapshot((shape,), [busy]))
    assert result.terminate == ()


def test_all_idle_slice_goes_whole() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=30)
    idle = running_replica(shape, 0, idle_s=[100, 31, 100, 100])
    (removal,) = plan(snapshot((shape,), [idle])).terminate
    assert set(removal.pods) == {h.pod_name for h in idle.hosts}
    assert "idle" in removal.reason


def test_idle_slice_not_removed_before_timeout_nor_below_min() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=60)
    assert plan(snapshot((shape,), [running_replica(shape, 0, idle_s=59)])).terminate == ()
    (at_min,) = v6e_16_shapes(idle_timeout_s=60, min_replicas=1)
    result = plan(
        snapshot(
            (at_min,),
            [running_replica(at_min, 0, idle_s=600), running_replica(at_min, 1, idle_s=300)],
        )
    )
    assert [t.replica for t in result.terminate] == ["tpu-r0"]  # longest idle first, one kept


def test_idle_slice_needed_by_pending_demand_stays() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=30)
    idle = running_replica(shape, 0, idle_s=100)
    result = plan(
        snapshot((shape,), [idle], Demand(resources=(tpu4(2, {"ray.io/tpu-pod-type": "v6e-16"}),)))
    )
    assert result.terminate == () and result.launch == ()


# --- upstream failure 2: launches are whole replicas ------------------------------------------


def test_sub_slice_demand_launches_one_whole_replica() -> None:
    (shape,) = v6e_16_shapes()
    (launch,) = plan(snapshot((shape,), demand=Demand(resources=(tpu4(2),)))).launch
    assert (launch.group, launch.replicas) == ("tpu", 1)


def test_five_hosts_of_demand_launch_two_replicas() -> None:
    (shape,) = v6e_16_shapes()
    (launch,) = plan(snapshot((shape,), demand=Demand(resources=(tpu4(5),)))).launch
    assert launch.replicas == 2


# --- upstream failure 3 and 4: slice_placement_group scales up, head on worker 0 only ---------


def test_slice_placement_group_head_gang_launches_one_slice_per_bundle() -> None:
    (shape,) = v6e_16_shapes()
    for slices in (1, 2, 3):
        result = plan(snapshot((shape,), demand=Demand(gangs=(slice_head_gang("v6e-16", slices),))))
        (launch,) = result.launch
        assert launch.replicas == slices  # the head resource exists once per slice, not per host
        assert result.infeasible == () and result.waiting == ()


def test_head_gang_uses_an_idle_whole_slice_but_not_a_partly_busy_one() -> None:
    (shape,) = v6e_16_shapes()
    idle = running_replica(shape, 0)
    partly_busy = running_replica(shape, 1, used={2: {"TPU": 4}})
    result = plan(
        snapshot((shape,), [partly_busy, idle], Demand(gangs=(slice_head_gang("v6e-16", 2),)))
    )
    (launch,) = result.launch
    assert launch.replicas == 1  # one from the idle slice, one new; never the busy one


def test_stage_two_counts_against_its_slice_and_launches_nothing() -> None:
    (shape,) = v6e_16_shapes()
    reserved = running_replica(shape, 0, used={0: {"TPU-v6e-16-head": 1}})
    demand = Demand(gangs=(slice_worker_gang("tpu-0", 4, 4),))
    result = plan(snapshot((shape,), [reserved], demand))
    assert result.launch == () and result.infeasible == () and result.bundles_placed == 4
    busy = running_replica(shape, 0, used={i: {"TPU": 4} for i in range(4)})
    result = plan(snapshot((shape,), [busy], demand))
    assert result.launch == () and result.infeasible == ()
    (waiting,) = result.waiting
    assert waiting.reason == (
        "waits for slice tpu-0 of tpu: its 4 hosts hold the placement group once their "
        "work ends, busy now"
    )
    assert [g.group for g in waiting.groups] == ["tpu"]
    assert [g.verdict for g in waiting.groups] == [GroupVerdict.BUSY]
    assert result.bundles_unmet == 4


def test_stage_two_larger_than_its_busy_slice_is_infeasible_not_waiting() -> None:
    (shape,) = v6e_16_shapes()
    busy = running_replica(shape, 0, used={i: {"TPU": 4} for i in range(4)})
    for gang in (slice_worker_gang("tpu-0", 5, 4), slice_worker_gang("tpu-0", 4, 8)):
        result = plan(snapshot((shape,), [busy], Demand(gangs=(gang,))))
        assert result.launch == () and result.waiting == ()
        (item,) = result.infeasible
        assert "no group can ever serve it" in item.reason


def test_stage_two_for_a_vanished_slice_is_infeasible() -> None:
    (shape,) = v6e_16_shapes()
    result = plan(snapshot((shape,), demand=Demand(gangs=(slice_worker_gang("gone-7", 4, 4),))))
    assert result.launch == ()
    (item,) = result.infeasible
    assert "gone-7" in item.reason


def test_seed_bundle_label_selector_placement_group() -> None:
    (shape,) = v6e_16_shapes()
    gang = GangDemand("pg", (Bundle({"TPU": 4.0}, V6E16),) * 4, GangStrategy.SPREAD)
    (launch,) = plan(snapshot((shape,), demand=Demand(gangs=(gang,)))).launch
    assert launch.replicas == 1


# --- choosing groups ---------------------------------------------------------------------


def _v6e(topology: str, chips: int | None = None) -> catalog.SliceType:
    return catalog.slice_type(catalog.find_generation("v6e"), topology, chips)  # type: ignore[arg-type]


def test_fewest_chips_wins() -> None:
    shapes = shapes_for(
        tpu_group("big", _v6e("4x8")), tpu_group("small", _v6e("2x4", 4)), cpu_group("cpu")
    )
    (launch,) = plan(snapshot(shapes, demand=Demand(resources=(tpu4(2),)))).launch
    assert launch.group == "small"
    (launch,) = plan(
        snapshot(shapes, demand=Demand(resources=(ResourceDemand(Bundle({"CPU": 2.0}), 3),)))
    ).launch
    assert launch.group == "cpu"


def test_priority_breaks_ties() -> None:
    shapes = shapes_for(tpu_group("a", _v6e("4x4")), tpu_group("b", _v6e("4x4"), priority=5))
    (launch,) = plan(snapshot(shapes, demand=Demand(resources=(tpu4(1),)))).launch
    assert launch.group == "b"


def test_max_replicas_overflow_is_reported_not_dropped() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    result = plan(snapshot((shape,), demand=Demand(resources=(tpu4(12),))))
    assert result.launch[0].replicas == 2
    (waiting,) = result.waiting
    assert waiting.demand.startswith("4 x") and "maxReplicas 2" in waiting.reason
    assert result.bundles_placed == 8 and result.bundles_unmet == 4


def test_unknown_pod_type_and_oversized_bundles_are_infeasible() -> None:
    (shape,) = v6e_16_shapes()
    demand = Demand(
        resources=(
            tpu4(1, {"ray.io/tpu-pod-type": "v5p-32"}),
            ResourceDemand(Bundle({"TPU": 8.0}), 1),
        )
    )
    result = plan(snapshot((shape,), demand=demand))
    assert result.launch == ()
    reasons = " | ".join(u.reason for u in result.infeasible)
    assert "v5p-32" in reasons and "TPU: 4, the bundle needs 8" in reasons


def test_min_replicas_are_launched() -> None:
    (shape,) = v6e_16_shapes(min_replicas=2)
    (launch,) = plan(snapshot((shape,))).launch
    assert launch.replicas == 2 and "minReplicas" in launch.reason


def test_conservative_upscaling() -> None:
    shapes = shapes_for(
        tpu_group("tpu", _v6e("4x4"), max_replicas=10), upscalingMode="Conservative"
    )
    (shape,) = shapes
    cold = plan(snapshot(shapes, demand=Demand(resources=(tpu4(20),))))
    assert cold.launch[0].replicas == 1 and cold.waiting
    busy = [running_replica(shape, i, used={h: {"TPU": 4} for h in range(4)}) for i in range(3)]
    warm = plan(snapshot(shapes, busy, Demand(resources=(tpu4(20),))))
    assert warm.launch[0].replicas == 3


def test_request_resources_keeps_and_launches_capacity() -> None:
    (shape,) = v6e_16_shapes(idle_timeout_s=30)
    idle = running_replica(shape, 0, idle_s=100)
    constraint = ClusterConstraint((Bundle({"TPU": 4.0}),) * 8)
    result = plan(snapshot((shape,), [idle], Demand(constraints=(constraint,))))
    assert result.terminate == ()
    assert result.launch[0].replicas == 1


# --- health ------------------------------------------------------------------------------


def test_dead_host_removes_the_replica_whole_and_demand_replaces_it() -> None:
    (shape,) = v6e_16_shapes()
    broken = running_replica(shape, 0)
    hosts = list(broken.hosts)
    hosts[2] = replace(broken.hosts[2], dead=True)
    broken = replace(broken, hosts=tuple(hosts))
    result = plan(snapshot((shape,), [broken], Demand(resources=(tpu4(4),))))
    (removal,) = result.terminate
    assert len(removal.pods) == 4 and "dead" in removal.reason
    assert result.launch[0].replicas == 1


def test_missing_host_removes_replica() -> None:
    (shape,) = v6e_16_shapes()
    short = replace(running_replica(shape, 0), hosts=running_replica(shape, 0).hosts[:3])
    (removal,) = plan(snapshot((shape,), [short])).terminate
    assert "3 of 4" in removal.reason and len(removal.pods) == 3


def test_provisioning_timeout_removes_and_backs_off() -> None:
    (shape,) = v6e_16_shapes()
    stuck = pending_replica(shape, 0, created_at_s=0)
    snap = snapshot((shape,), [stuck], Demand(resources=(tpu4(4),)), now_s=901)
    result = plan(snap)
    (removal,) = result.terminate
    assert "provisioning timeout" in removal.reason
    assert result.launch == ()
    assert result.waiting and "backs off" in result.waiting[0].reason
    later = plan(apply_plan(snap, result))
    assert later.launch == () and later.waiting
    after_backoff = apply_plan(snap, result)
    # The 30 s base backoff, stretched by up to 20 % jitter.
    relaunch = plan(replace(after_backoff, now_s=901 + 30 * 1.2))
    assert relaunch.launch[0].replicas == 1


def test_backoff_grows_exponentially_and_caps() -> None:
    config = PolicyConfig(backoff_base_s=10, backoff_cap_s=100, backoff_jitter=0.0)
    assert [config.backoff_until(LaunchFailures(n, 0)) for n in (1, 2, 3, 4, 5, 9)] == [
        10,
        20,
        40,
        80,
        100,
        100,
    ]


def test_pending_replica_capacity_is_used_before_launching() -> None:
    (shape,) = v6e_16_shapes()
    coming = pending_replica(shape, 0, created_at_s=990)
    result = plan(snapshot((shape,), [coming], Demand(resources=(tpu4(4),))))
    assert result.launch == () and result.bundles_placed == 4


def test_unknown_groups_are_left_alone() -> None:
    (shape,) = v6e_16_shapes()
    stray = running_replica(shape, 0, idle_s=10_000)
    other = shapes_for(cpu_group("cpu"))
    result = plan(snapshot(other, [stray]))
    assert result.terminate == ()


def test_plan_is_deterministic_and_explains_itself() -> None:
    (shape,) = v6e_16_shapes()
    snap = snapshot(
        (shape,), demand=Demand(resources=(tpu4(5),), gangs=(slice_head_gang("v6e-16", 1),))
    )
    first, second = plan(snap), plan(snap)
    assert first == second
    assert all(launch.reason for launch in first.launch)
    assert first.to_json()["launch"][0]["group"] == "tpu"
    assert "launch" in first.render_text()


def test_draining_replicas_count_against_max_but_serve_nothing() -> None:
    (shape,) = v6e_16_shapes(max_replicas=1)
    draining = replace(running_replica(shape, 0), state=ReplicaState.DRAINING)
    result = plan(snapshot((shape,), [draining], Demand(resources=(tpu4(1),))))
    assert result.launch == () and result.waiting


def test_demand_being_placed_on_a_host_that_just_joined_is_not_counted_twice() -> None:
    """Ray reports pending demand later than it places it: a slice that just came up
    shows 8 of its 16 TPU taken by tasks the GCS still lists as pending. Counting both
    launched a second slice on real raylets; while the hosts settle, their total is
    what they can take."""
    (shape,) = v6e_16_shapes()
    demand = Demand(resources=(ResourceDemand(Bundle({"TPU": 1.0}), 16),))
    half_taken = running_replica(shape, 0, used={0: {"TPU": 4.0}, 1: {"TPU": 4.0}})

    def joined(seconds_ago: float) -> Replica:
        hosts = tuple(replace(h, registered_at_s=1000.0 - seconds_ago) for h in half_taken.hosts)
        return replace(half_taken, hosts=hosts)

    settling = plan(snapshot((shape,), [joined(3.0)], demand))
    assert settling.launch == () and settling.bundles_placed == 16
    settled = plan(snapshot((shape,), [joined(30.0)], demand))
    (launch,) = settled.launch  # now the use is taken for real: 8 TPU short
    assert launch.replicas == 1
    unknown = plan(snapshot((shape,), [half_taken], demand))  # a snapshot file: no times
    assert len(unknown.launch) == 1


def test_a_slice_coming_up_as_its_provisioning_timeout_passes_is_given_time_to_join() -> None:
    """Its pods turn Running one by one: a slice whose capacity came just before the
    timeout (a stockout ended) has hosts in Ray and others about to join."""
    (shape,) = v6e_16_shapes()
    up = running_replica(shape, 0)
    coming = replace(
        up,
        state=ReplicaState.PENDING,
        created_at_s=0.0,
        hosts=tuple(
            replace(h, registered_at_s=895.0) if h.host_index < 2 else replace(h, node_id=None)
            for h in up.hosts
        ),
    )
    assert plan(snapshot((shape,), [coming], now_s=905.0)).terminate == ()
    (late,) = plan(snapshot((shape,), [coming], now_s=1196.0)).terminate  # 895 + 300
    assert late.provisioning_timeout
    nobody_joined = replace(coming, hosts=tuple(replace(h, node_id=None) for h in up.hosts))
    assert plan(snapshot((shape,), [nobody_joined], now_s=905.0)).terminate != ()


def test_a_newer_slice_past_its_timeout_under_a_busy_slices_name_waits_for_that_work() -> None:
    """KubeRay reused a replica name: the read keeps both slices as one replica, which
    KubeRay deletes whole. The newer slice never came; removing it would delete the
    busy older one, so the pair stays (no backoff: it holds no chips) until the older
    slice is idle."""
    (shape,) = v6e_16_shapes()
    older = running_replica(shape, 0, used={2: {"TPU": 4.0}}, created_at_s=-600.0)
    newer = pending_replica(shape, 1, created_at_s=0.0)
    pair = replace(
        older,
        state=ReplicaState.PENDING,
        hosts=older.hosts + tuple(replace(h, pod_name=f"{h.pod_name}-b") for h in newer.hosts),
        created_at_s=0.0,
    )
    busy = plan(snapshot((shape,), [pair], Demand(resources=(tpu4(4),)), now_s=901.0))
    assert busy.terminate == ()
    assert busy.launch and not busy.waiting  # the group does not back off

    def idle_for(seconds: float) -> Replica:
        hosts = tuple(replace(h, available=h.total, idle_s=seconds) for h in pair.hosts)
        return replace(pair, hosts=hosts)

    # Just idle: it waits out the idle timeout, as an idle slice would.
    assert plan(snapshot((shape,), [idle_for(5.0)], now_s=901.0)).terminate == ()
    idle = idle_for(shape.idle_timeout_s + 1)
    (gone,) = plan(snapshot((shape,), [idle], now_s=901.0)).terminate
    assert gone.provisioning_timeout and len(gone.pods) == 8


def test_idle_removal_takes_whole_slices_and_known_replicas_only() -> None:
    """A replica name holding two whole slices (KubeRay reused it) goes whole once all
    eight hosts are idle; one holding a slice and a half, or whose pods are not known to
    form a slice, never goes for idleness."""
    (shape,) = v6e_16_shapes()
    one = running_replica(shape, 0, idle_s=10_000)
    pair = replace(
        one, hosts=one.hosts + tuple(replace(h, pod_name=f"{h.pod_name}-b") for h in one.hosts)
    )
    (gone,) = plan(snapshot((shape,), [pair])).terminate
    assert len(gone.pods) == 8 and gone.idle
    slice_and_a_half = replace(pair, hosts=pair.hosts[:6])
    assert plan(snapshot((shape,), [slice_and_a_half])).terminate == ()
    unknown = replace(one, identified=False)
    assert plan(snapshot((shape,), [unknown])).terminate == ()
    other = replace(running_replica(shape, 1, idle_s=10_000), name="tpu-r9")
    (gone,) = plan(snapshot((shape,), [unknown, other])).terminate
    assert gone.replica == "tpu-r9"


def test_a_slice_with_a_host_not_registered_with_ray_does_not_go_for_idleness() -> None:
    """A snapshot (a file, or a read racing a raylet's restart) may list a running
    replica one host of which has no Ray node: Ray does not call it idle, so neither
    does the policy, whatever idle time the others report. (Found unpinned by the
    planspeed mutation run: `all` for `any` stayed green.)"""
    (shape,) = v6e_16_shapes()
    one = running_replica(shape, 0, idle_s=10_000)
    assert [t.replica for t in plan(snapshot((shape,), [one])).terminate] == [one.name]
    for missing in range(shape.hosts_per_replica):
        hosts = tuple(
            replace(h, node_id=None) if i == missing else h for i, h in enumerate(one.hosts)
        )
        result = plan(snapshot((shape,), [replace(one, hosts=hosts)]))
        assert not any(t.idle for t in result.terminate), missing


def test_demand_lands_on_the_oldest_idle_slice_first_and_the_newer_one_goes() -> None:
    """The scratch capacity lists running replicas oldest first, whatever their names
    (`scratch._in_world_order`): the slice head takes the older slice, and the newer,
    idle past its timeout, is removed."""
    shapes = v6e_16_shapes(idle_timeout_s=60)
    (shape,) = shapes
    newer = running_replica(shape, 0, idle_s=600.0, created_at_s=100.0)
    older = running_replica(shape, 1, idle_s=600.0, created_at_s=50.0)
    result = plan(snapshot(shapes, [newer, older], Demand(gangs=(slice_head_gang("v6e-16"),))))

    assert result.bundles_placed == 1
    assert [t.replica for t in result.terminate] == [newer.name]


def test_of_slices_created_at_once_demand_lands_on_the_first_by_name() -> None:
    """Running replicas created at the same time are listed by name (the scratch
    sorts by creation time alone only while no two share one): the slice head takes
    the first by name, whichever the snapshot lists first, and the other goes idle."""
    shapes = v6e_16_shapes(idle_timeout_s=60)
    (shape,) = shapes
    first = running_replica(shape, 0, idle_s=600.0, created_at_s=50.0)
    second = running_replica(shape, 1, idle_s=600.0, created_at_s=50.0)
    assert first.name < second.name
    for listed in ([second, first], [first, second]):
        result = plan(snapshot(shapes, listed, Demand(gangs=(slice_head_gang("v6e-16"),))))
        assert result.bundles_placed == 1
        assert [t.replica for t in result.terminate] == [second.name]


def test_a_settling_slice_whose_head_is_placed_stays_its_stage_twos() -> None:
    """Found in the realistic world (36 of 64 slice placement groups): a slice whose
    first hosts just joined offers their total (`registration_settle_s`), so the head
    Ray placed on it looked free; a pending head of another placement group took it,
    the stage two pinned to it was served after the heads and found nothing: reported
    "no group can ever serve it", and no slice was launched for the head left over."""
    (shape,) = v6e_16_shapes(max_replicas=3)
    now = 1000.0
    settling = running_replica(shape, 0, used={0: {"TPU-v6e-16-head": 1.0}})
    settling = replace(
        settling,
        state=ReplicaState.PENDING,
        hosts=tuple(
            replace(h, registered_at_s=now - 2.0)
            if h.host_index in (0, 3)
            else replace(h, node_id=None, labels={}, total={}, available={})
            for h in settling.hosts
        ),
    )  # hosts 0 and 3 joined 2 s ago, the head on host 0; 1 and 2 not up yet
    coming = pending_replica(shape, 1, created_at_s=now - 60.0)
    demand = Demand(
        gangs=(
            slice_head_gang("v6e-16", gang_id="spg-head-a"),
            slice_head_gang("v6e-16", gang_id="spg-head-b"),
            slice_worker_gang(settling.slice_name or "", 4, 4, gang_id="spg-workers"),
        )
    )
    result = plan(snapshot((shape,), [settling, coming], demand, now_s=now))
    assert result.infeasible == ()
    # One head on the slice coming, one on a slice launched now; the stage two on its own.
    assert result.launched("tpu") == 1


def test_draining_replicas_count_against_max_replicas_until_gone() -> None:
    """A replica being drained still has its pods until KubeRay deletes them; launching
    in its place before then would take the group past maxReplicas."""
    (shape,) = v6e_16_shapes(max_replicas=4)
    heads = Demand(gangs=tuple(slice_head_gang("v6e-16", gang_id=f"h{i}") for i in range(4)))
    for draining, launched in ((1, 3), (2, 2), (3, 1)):
        replicas = [running_replica(shape, i, state=ReplicaState.DRAINING) for i in range(draining)]
        assert plan(snapshot((shape,), replicas, heads)).launched("tpu") == launched
