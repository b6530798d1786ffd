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
