"""`health.check` on its own: which replicas go as broken or timed out, with which cause
and reason, and how long each group backs off (from the snapshot's earlier failures,
jittered by the group's name)."""

from __future__ import annotations

from dataclasses import replace

from tests.snapshots import pending_replica, running_replica, snapshot, v6e_16_shapes
from tests.test_policy_gang_arrival import BOUND_S, _gang_snapshot
from tpu_autoscaler.core.plan import RemovalCause
from tpu_autoscaler.core.policy import health
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import (
    LaunchFailures,
    PolicyConfig,
    Replica,
    ReplicaState,
)

CONFIG = PolicyConfig()
TIMEOUT_S = CONFIG.provisioning_timeout_s


def _shape() -> SliceShape:
    (shape,) = v6e_16_shapes(max_replicas=8)
    return shape


def _check(replicas: list[Replica], now_s: float, **failures: LaunchFailures) -> health.Health:
    shape = _shape()
    snap = snapshot((shape,), replicas, now_s=now_s, launch_failures=failures)
    return health.check(snap, {shape.group: shape})


def _dead_host(index: int, *dead: int) -> Replica:
    replica = running_replica(_shape(), index)
    hosts = tuple(replace(h, dead=h.host_index in dead) for h in replica.hosts)
    return replace(replica, hosts=hosts)


def test_a_dead_host_takes_its_slice_as_unhealthy_without_backing_off() -> None:
    checked = _check([_dead_host(0, 1, 2)], now_s=1000.0)
    (removal,) = checked.removals
    assert removal.cause is RemovalCause.UNHEALTHY
    assert removal.reason.startswith("host(s) tpu-r0-h1, tpu-r0-h2 dead")
    assert removal.pods == tuple(f"tpu-r0-h{i}" for i in range(4))
    assert checked.backoff_until == {} and checked.timed_out == frozenset()


def test_a_timed_out_launch_backs_off_from_the_groups_earlier_failures() -> None:
    now = 100.0 + TIMEOUT_S + 1.0
    earlier = LaunchFailures(2, 50.0)
    checked = _check([pending_replica(_shape(), 0, created_at_s=100.0)], now, tpu=earlier)
    (removal,) = checked.removals
    assert removal.cause is RemovalCause.PROVISIONING_TIMEOUT
    assert (
        removal.reason
        == f"pending {TIMEOUT_S + 1:.0f}s, past the {TIMEOUT_S:.0f}s provisioning timeout"
    )
    assert checked.timed_out == {"tpu-r0"}
    # The third failure: base x 4, with the jitter the group's name picks.
    third = LaunchFailures.one_more(earlier, now)
    assert third.count == 3
    assert checked.backoff_until == {"tpu": CONFIG.backoff_until(third, "tpu")}
    assert CONFIG.backoff_until(third, "tpu") != CONFIG.backoff_until(third, "")


def test_replicas_passed_over_do_not_end_the_check() -> None:
    draining = replace(running_replica(_shape(), 0), state=ReplicaState.DRAINING)
    unknown = replace(pending_replica(_shape(), 1, created_at_s=0.0), identified=False)
    late = pending_replica(_shape(), 2, created_at_s=0.0)
    checked = _check([draining, unknown, late], now_s=TIMEOUT_S + 1.0)
    assert [t.replica for t in checked.removals] == ["tpu-r2"]


def _clashed_pair(busy: bool, idle_s: float = 5.0) -> Replica:
    """Two slices under one replica name: the older up, the newer pending. Busy: Ray
    holds the slice's head resource (one unit; Ray leaves a resource with none free out
    of `available`); `idle_s`: how long Ray reports the older slice's hosts idle (0:
    not idle, as with work that takes no resource)."""
    older = running_replica(_shape(), 0, idle_s=idle_s, created_at_s=-600.0)
    if busy:
        head = older.hosts[0]
        assert head.total.get("TPU-v6e-16-head") == 1.0
        free = {r: v for r, v in head.available.items() if r != "TPU-v6e-16-head"}
        older = replace(older, hosts=(replace(head, available=free), *older.hosts[1:]))
    newer = pending_replica(_shape(), 1, created_at_s=0.0)
    hosts = older.hosts + tuple(replace(h, pod_name=f"{h.pod_name}-b") for h in newer.hosts)
    return replace(older, state=ReplicaState.PENDING, hosts=hosts, created_at_s=0.0)


def test_a_busy_clashed_pair_waits_and_the_check_goes_on() -> None:
    late = pending_replica(_shape(), 2, created_at_s=0.0)
    checked = _check([_clashed_pair(busy=True), late], now_s=TIMEOUT_S + 1.0)
    assert [t.replica for t in checked.removals] == ["tpu-r2"]
    just_idle = _check([_clashed_pair(busy=False)], now_s=TIMEOUT_S + 1.0)
    assert just_idle.removals == ()  # its idle timeout first, as for an idle slice
    long_idle = _clashed_pair(busy=False, idle_s=_shape().idle_timeout_s + 1)
    idle = _check([long_idle], now_s=TIMEOUT_S + 1.0)
    assert [t.replica for t in idle.removals] == ["tpu-r0"]
    not_idle = _check([_clashed_pair(busy=False, idle_s=0.0)], now_s=TIMEOUT_S + 1.0)
    assert not_idle.removals == ()


def test_a_lone_slice_half_up_and_busy_still_goes_past_its_joining_timeout() -> None:
    """Only a pair waits for its busy half: one slice that never came up whole is a
    failed launch even if Ray put work on the hosts that joined."""
    up = running_replica(_shape(), 0, used={0: {"TPU": 4.0}})
    half = replace(
        up,
        state=ReplicaState.PENDING,
        hosts=tuple(
            replace(h, registered_at_s=100.0) if h.host_index < 2 else replace(h, node_id=None)
            for h in up.hosts
        ),
    )
    (removal,) = _check([half], now_s=TIMEOUT_S + 1.0).removals
    assert removal.cause is RemovalCause.PROVISIONING_TIMEOUT


def test_earlier_failures_keep_only_known_groups_backing_off_until_their_end() -> None:
    failures = LaunchFailures(1, 1000.0)
    until = CONFIG.backoff_until(failures, "tpu")
    assert _check([], now_s=1000.0, tpu=failures).backoff_until == {"tpu": until}
    assert _check([], now_s=until, tpu=failures).backoff_until == {}
    assert _check([], now_s=1000.0, gone=failures).backoff_until == {}


def test_a_timeout_this_pass_outranks_the_earlier_backoff() -> None:
    now = TIMEOUT_S + 1.0
    earlier = LaunchFailures(1, now - 1.0)  # still backing off from it
    checked = _check([pending_replica(_shape(), 0, created_at_s=0.0)], now, tpu=earlier)
    again = CONFIG.backoff_until(LaunchFailures.one_more(earlier, now), "tpu")
    assert checked.backoff_until == {"tpu": again}
    assert again > CONFIG.backoff_until(earlier, "tpu")


def test_a_gangs_late_slice_backs_its_group_off_from_earlier_failures() -> None:
    snap = replace(_gang_snapshot(now_s=BOUND_S), launch_failures={"tpu": LaunchFailures(3, 0.0)})
    checked = health.check(snap, {s.group: s for s in snap.shapes})
    late = LaunchFailures(4, BOUND_S)
    assert checked.backoff_until == {"tpu": CONFIG.backoff_until(late, "tpu")}
    given_back = [t for t in checked.removals if t.cause is RemovalCause.GANG_INCOMPLETE]
    assert given_back and not any(t.provisioning_timeout for t in given_back)


def test_creation_and_settling_end_at_their_timeouts() -> None:
    young = replace(pending_replica(_shape(), 0, created_at_s=0.0), last_pod_created_at_s=100.0)
    limit = 100.0 + CONFIG.creation_timeout_s
    assert health.being_created(young, CONFIG, limit - 0.5)
    assert not health.being_created(young, CONFIG, limit)
    joined = replace(
        young, hosts=(replace(young.hosts[0], node_id="n0", registered_at_s=0.0), *young.hosts[1:])
    )
    assert not health.being_created(joined, CONFIG, 101.0)
    settle = CONFIG.registration_settle_s
    assert health.settling(joined, CONFIG, settle - 0.5)
    assert not health.settling(joined, CONFIG, settle)
