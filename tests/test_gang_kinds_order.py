"""`GangKinds.in_order`: gangs in kind order, then by id, then as given; the kinds'
buckets sorted apart give the order one sort of every gang would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tpu_autoscaler.core.demand import Bundle, GangDemand, GangStrategy
from tpu_autoscaler.core.policy.gangs import GangKinds

KINDS = [
    ((Bundle({"TPU-v6e-16-head": 1.0}),), GangStrategy.PACK),
    ((Bundle({"TPU": 4.0}),) * 4, GangStrategy.SPREAD),
    ((Bundle({"TPU": 4.0}),) * 2, GangStrategy.STRICT_SPREAD),
    ((Bundle({"CPU": 1.0}),) * 2, GangStrategy.SPREAD),
    # Another kind in the same order (its text reads alike): the two kinds' gangs
    # are ordered together, by id, then as given.
    ((Bundle({"CPU": 1.0 + 1e-9}),) * 2, GangStrategy.SPREAD),
]


@given(st.lists(st.tuples(st.integers(0, len(KINDS) - 1), st.sampled_from("abcde"))))
def test_gangs_come_in_kind_order_then_by_id_then_as_given(
    picks: list[tuple[int, str]],
) -> None:
    gangs = tuple(GangDemand(gang_id, *KINDS[kind]) for kind, gang_id in picks)
    kinds = GangKinds()

    ordered = kinds.in_order(gangs)

    reference = GangKinds()
    expected = sorted(
        range(len(gangs)),
        key=lambda i: (reference.order(gangs[i], reference.of(gangs[i])), gangs[i].gang_id, i),
    )
    assert [g for _, g in ordered] == [gangs[i] for i in expected]
    assert all(kind == kinds.of(g) for kind, g in ordered)
    assert [id(g) for _, g in ordered] == [id(gangs[i]) for i in expected]


@given(
    st.lists(st.tuples(st.integers(0, len(KINDS) - 1), st.sampled_from("abcde")), max_size=12),
    st.lists(st.integers(0, 11), max_size=12),
)
def test_gangs_served_again_come_as_a_fresh_sort_would_order_them(
    picks: list[tuple[int, str]], chosen: list[int]
) -> None:
    """A pass serves what it deferred again: a part of the demand's order (taken as
    it is) or any other list of its gangs (sorted) comes out as sorting it afresh."""
    gangs = tuple(GangDemand(gang_id, *KINDS[kind]) for kind, gang_id in picks)
    kinds = GangKinds()
    ordered = [g for _, g in kinds.in_order(gangs)]
    indexes = [i for i in chosen if i < len(ordered)]
    in_order_part = [ordered[i] for i in sorted(set(indexes))]
    any_list = [ordered[i] for i in indexes]  # out of order, repeats

    for again in (in_order_part, any_list):
        fresh = GangKinds()
        expected = fresh.in_order(again)
        got = kinds.in_order(again)
        assert [id(g) for _, g in got] == [id(g) for _, g in expected]
        assert [kind for kind, _ in got] == [kinds.of(g) for _, g in expected]
