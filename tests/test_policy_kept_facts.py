"""What the policy keeps on a replica object between plans (`Replica.memo`): adapters
hand it the same object while the replica does not change, so a fact kept on it must
not depend on anything else. The same objects planned at another time or under another
shape plan as fresh ones do."""

from __future__ import annotations

from dataclasses import replace

from tests.snapshots import (
    pending_replica,
    running_replica,
    slice_head_gang,
    snapshot,
    v6e_16_shapes,
)
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.snapshot import ClusterSnapshot, PolicyConfig, Replica

SETTLE_S = PolicyConfig().registration_settle_s
JOINED_S = 1000.0


def _busy_slice_just_joined() -> Replica:
    """A running slice whose every TPU is taken, its hosts joined Ray at JOINED_S."""
    (shape,) = v6e_16_shapes()
    replica = running_replica(shape, 0, used={i: {"TPU": 4.0} for i in range(4)})
    hosts = tuple(replace(h, registered_at_s=JOINED_S) for h in replica.hosts)
    return replace(replica, hosts=hosts)


def _fresh(snap: ClusterSnapshot) -> ClusterSnapshot:
    """The same snapshot with new replica objects: nothing kept on them."""
    return replace(snap, replicas=tuple(replace(r) for r in snap.replicas))


def test_a_slice_planned_while_settling_offers_what_ray_reports_once_settled() -> None:
    """Settling, its hosts offer their total: four {TPU: 4} tasks fit on them. Settled,
    they offer what Ray reports free (nothing): a slice launches. Either way round on
    the same replica object, each plan is the plan of a fresh one."""
    shapes = v6e_16_shapes()
    replica = _busy_slice_just_joined()
    demand = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 4),))
    settling = snapshot(shapes, [replica], demand, now_s=JOINED_S + SETTLE_S - 1)
    settled = snapshot(shapes, [replica], demand, now_s=JOINED_S + SETTLE_S)

    assert plan(_fresh(settling)).launch == ()
    assert [launch.replicas for launch in plan(_fresh(settled)).launch] == [1]
    for snap in (settling, settled, settling, settled):
        assert plan(snap) == plan(_fresh(snap))


def test_a_pending_slice_planned_under_a_changed_shape_offers_the_new_shape() -> None:
    """A slice not up yet offers what its shape says; the same replica object under a
    shape with more CPU per host offers that CPU (a CPU task that did not fit now
    fits, and nothing launches for it)."""
    (shape,) = v6e_16_shapes()
    cpus = shape.resources_per_host["CPU"]
    bigger = replace(shape, resources_per_host={**shape.resources_per_host, "CPU": cpus + 8})
    replica = pending_replica(shape, 0, created_at_s=990.0)
    demand = Demand(resources=(ResourceDemand(Bundle({"CPU": cpus + 4}), 1),))
    before = snapshot((shape,), [replica], demand)
    after = snapshot((bigger,), [replica], demand)

    assert plan(before).bundles_unmet == 1
    assert plan(after) == plan(_fresh(after))
    assert plan(after).bundles_unmet == 0
    assert plan(after).launch == ()


def test_a_slice_a_plan_placed_on_is_whole_again_for_the_next_plan() -> None:
    """The scratch hosts of a replica are kept on it between plans (`KeptReplica`). A
    plan that claims an idle slice for a slice head (every TPU of it held for the
    workers' gang) leaves it whole for the next plan on the same objects: there, four
    {TPU: 4} tasks fit on it and nothing launches, as for fresh objects."""
    (shape,) = v6e_16_shapes()
    replica = running_replica(shape, 0, idle_s=30.0)
    claimed = Demand(gangs=(slice_head_gang("v6e-16"),))
    tasks = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 4),))
    first = snapshot((shape,), [replica], claimed)
    second = snapshot((shape,), [replica], tasks)

    assert plan(first).bundles_placed == 1
    assert plan(first).launch == ()
    assert plan(second).launch == ()
    assert plan(second).bundles_placed == 4
    for snap in (first, second, first, second):
        assert plan(snap) == plan(_fresh(snap))


def test_a_whole_running_slice_checked_again_under_a_shape_of_more_hosts_is_partial() -> None:
    """A running slice with every host alive passes the health check at any time, and
    the check keeps that on the replica (`health.SOUND_HOSTS`), for as many hosts as it
    has: the same object under a shape of more hosts per replica is a partial slice
    and goes, as a fresh one does."""
    (shape,) = v6e_16_shapes()
    replica = running_replica(shape, 0)
    wider = replace(shape, hosts_per_replica=shape.hosts_per_replica * 2)
    whole = snapshot((shape,), [replica], now_s=5000.0)
    partial = snapshot((wider,), [replica], now_s=5000.0)

    assert plan(whole).terminate == ()
    assert [t.replica for t in plan(partial).terminate] == [replica.name]
    for snap in (whole, partial, whole):
        assert plan(snap) == plan(_fresh(snap))


def test_a_build_takes_the_last_builds_pieces_only_for_the_replicas_that_stayed() -> None:
    """A build takes the pieces the last build that began with the same replica took,
    for the replicas that follow it still (`scratch._LastBuild`), and no further: the
    second slice, busy now, is a new object and offers nothing; the third, the same
    object after it, offers what it did. Eight {TPU: 4} tasks fit on the three idle
    slices; with the second busy, one slice launches, as for fresh objects."""
    (shape,) = v6e_16_shapes()
    first, second, third = (running_replica(shape, i, created_at_s=float(i)) for i in range(3))
    busy = running_replica(shape, 1, used={i: {"TPU": 4.0} for i in range(4)}, created_at_s=1.0)
    tasks = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 12),))
    idle = snapshot((shape,), [first, second, third], tasks, now_s=5000.0)
    one_busy = snapshot((shape,), [first, busy, third], tasks, now_s=5000.0)

    assert plan(idle).launch == ()
    assert [launch.replicas for launch in plan(one_busy).launch] == [1]
    for snap in (idle, one_busy, idle, one_busy):
        assert plan(snap) == plan(_fresh(snap))


def test_the_same_slices_planned_under_a_longer_settling_time_offer_their_total() -> None:
    """Whether a slice is settling depends on the configuration's settling time too:
    the same objects, settled under the default and settling under a longer one, offer
    what Ray reports (a slice launches for four {TPU: 4} tasks), then their total
    (nothing launches), as fresh objects do, in either order."""
    shapes = v6e_16_shapes()
    replica = _busy_slice_just_joined()
    demand = Demand(resources=(ResourceDemand(Bundle({"TPU": 4.0}), 4),))
    settled = snapshot(shapes, [replica], demand, now_s=JOINED_S + SETTLE_S)
    longer = replace(settled, config=replace(settled.config, registration_settle_s=SETTLE_S + 1))

    assert [launch.replicas for launch in plan(_fresh(settled)).launch] == [1]
    assert plan(_fresh(longer)).launch == ()
    for snap in (settled, longer, settled, longer):
        assert plan(snap) == plan(_fresh(snap))
