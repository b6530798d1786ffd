"""Gangs of one kind left unserved for one reason are one line of the plan: the first
one tried and the rest, deferred together after it (`Outcome.defer_gangs`), are
reported together, naming every request they stand for."""

from __future__ import annotations

from tests.snapshots import snapshot, v6e_16_shapes
from tpu_autoscaler.core import exact
from tpu_autoscaler.core.demand import Bundle, Demand, DemandRef, GangDemand, GangStrategy
from tpu_autoscaler.core.demand import selector_from_mapping as selector
from tpu_autoscaler.core.policy import plan

HOSTS = 4
PINNED = Bundle({"TPU": 4.0}, selector({"ray.io/tpu-pod-type": "v6e-16"}))


def test_alike_gangs_waiting_or_infeasible_are_one_line_each_with_every_request() -> None:
    (shape,) = v6e_16_shapes(max_replicas=2)
    slices = tuple(
        GangDemand(f"pg-{i}", (PINNED,) * HOSTS, GangStrategy.STRICT_SPREAD, DemandRef("gang", i))
        for i in range(5)
    )
    gpus = tuple(
        GangDemand(f"gpu-{i}", (Bundle({"GPU": 1.0}),) * 2, GangStrategy.PACK, DemandRef("gang", i))
        for i in range(5, 8)
    )
    assert len(slices) * HOSTS > exact.MAX_BUNDLES  # served by `gangs.py`

    result = plan(snapshot((shape,), [], Demand(gangs=slices + gpus)))

    assert [launch.replicas for launch in result.launch] == [2]
    (waiting,) = result.waiting
    assert waiting.demand.startswith("3 placement groups (STRICT_SPREAD: 4 x {TPU: 4} if ")
    assert waiting.demand.endswith("e.g. pg-2, pg-3, pg-4")
    assert waiting.refs == tuple(DemandRef("gang", i) for i in (2, 3, 4))
    (infeasible,) = result.infeasible
    assert infeasible.demand == "3 placement groups (PACK: 2 x {GPU: 1}), e.g. gpu-5, gpu-6, gpu-7"
    assert infeasible.refs == tuple(DemandRef("gang", i) for i in (5, 6, 7))
    assert result.bundles_unmet == 3 * HOSTS + 3 * 2
