"""Label selector fallbacks (Ray 2.60: a task's `label_selector` then its
`fallback_strategy`, sent as the request's list of selectors): a host matching any
of them may take it; existing capacity first, earlier selectors preferred; what must
be launched goes to a group matching the earliest selector one can launch for."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from ray.autoscaler.v2.utils import ResourceRequestUtil
from ray.core.generated.common_pb2 import LabelSelectorOperator

from tests.factories import cpu_group
from tests.ray_requests import launched, node_type, request
from tests.snapshots import running_replica, shapes_for, snapshot
from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand, selector_from_mapping
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.units import Replicas

POOL = "example.com/pool"


def _shapes():  # type: ignore[no-untyped-def]
    return shapes_for(
        cpu_group("a", 0, 4, labels={POOL: "a"}), cpu_group("b", 0, 4, labels={POOL: "b"})
    )


def _task(*pools: str, count: int = 1) -> Demand:
    first, *rest = [selector_from_mapping({POOL: p}) for p in pools]
    return Demand(resources=(ResourceDemand(Bundle({"CPU": 1.0}, first, tuple(rest)), count),))


def _launches(result) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return sorted((x.group, x.replicas) for x in result.launch)


def test_a_fallback_serves_when_no_group_offers_the_first_selector() -> None:
    result = plan(snapshot(_shapes(), demand=_task("nowhere", "b")))
    assert _launches(result) == [("b", 1)]
    assert result.infeasible == () and result.waiting == ()


def test_the_first_selector_is_preferred_when_both_can_launch() -> None:
    assert _launches(plan(snapshot(_shapes(), demand=_task("a", "b")))) == [("a", 1)]


def test_a_fallback_group_launches_when_the_first_is_at_max() -> None:
    a, b = _shapes()
    result = plan(snapshot((replace(a, max_replicas=Replicas(0)), b), demand=_task("a", "b")))
    assert _launches(result) == [("b", 1)]


def test_existing_capacity_matching_a_fallback_is_used_before_launching() -> None:
    a, b = _shapes()
    result = plan(snapshot((a, b), [running_replica(b, 0)], _task("a", "b")))
    assert result.launch == () and result.bundles_placed == 1


def test_no_selector_any_group_offers_is_infeasible_naming_them() -> None:
    result = plan(snapshot(_shapes(), demand=_task("x", "y", count=2)))
    (unmet,) = result.infeasible
    assert result.launch == ()
    assert "not example.com/pool=x" in unmet.reason and "not example.com/pool=y" in unmet.reason
    assert unmet.copies == 2


def test_the_scheduler_reads_every_selector_of_a_request() -> None:
    types = [node_type("a", {"CPU": 1}), node_type("b", {"CPU": 1})]
    types[1].labels[POOL] = "b"
    IN = LabelSelectorOperator.LABEL_OPERATOR_IN
    task = ResourceRequestUtil.make(
        {"CPU": 1}, label_selectors=[[(POOL, IN, ["nowhere"])], [(POOL, IN, ["b"])]]
    )
    reply = SliceScheduler(cluster=None).schedule(request(types, tasks=[task]))
    assert launched(reply) == {"b": 1}
    assert list(reply.infeasible_resource_requests) == []


@settings(max_examples=200, deadline=None)
@given(
    pools=st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True),
    wanted=st.lists(st.sampled_from("abcd"), min_size=1, max_size=3),
    count=st.integers(1, 40),
)
def test_with_fallbacks_infeasible_only_if_every_selector_alone_is(
    pools: list[str], wanted: list[str], count: int
) -> None:
    shapes = shapes_for(*(cpu_group(p, 0, 2, labels={POOL: p}) for p in pools))
    with_fallbacks = plan(snapshot(shapes, demand=_task(*wanted, count=count)))
    alone = [plan(snapshot(shapes, demand=_task(w, count=count))) for w in wanted]
    assert bool(with_fallbacks.infeasible) == all(r.infeasible for r in alone)
    assert with_fallbacks.bundles_placed + with_fallbacks.bundles_unmet == count
    first_launching = next((r for r in alone if r.launch), None)
    if first_launching is not None:
        # What the earliest launchable selector launches alone, and more only for what
        # its groups' limits leave over (Ray spills it to the fallbacks' groups).
        mine, theirs = dict(_launches(with_fallbacks)), dict(_launches(first_launching))
        assert all(mine.get(group, 0) >= n for group, n in theirs.items())
        if not first_launching.waiting:
            assert mine == theirs
