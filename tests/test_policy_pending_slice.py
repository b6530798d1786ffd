"""A pending replica whose pods exist (their slice name is known) but none of whose
hosts has joined Ray yet: its hosts count at full capacity with the labels Ray will
give them, the slice name among them, so work pinned to that slice waits there."""

from __future__ import annotations

from tests.snapshots import snapshot, v6e_16_shapes
from tpu_autoscaler.core import labels
from tpu_autoscaler.core.demand import Bundle, Demand, ResourceDemand
from tpu_autoscaler.core.demand import selector_from_mapping as selector
from tpu_autoscaler.core.policy import plan
from tpu_autoscaler.core.snapshot import Host, Replica, ReplicaState


def test_work_pinned_to_a_slice_whose_pods_have_not_joined_waits_on_it() -> None:
    (shape,) = v6e_16_shapes(max_replicas=4)
    pods = tuple(Host(f"tpu-0-pod-{i}", i) for i in range(shape.hosts_per_replica))
    pending = Replica("tpu", "tpu-0", ReplicaState.PENDING, pods, 990.0, slice_name="slice-a")
    pinned = Bundle({"TPU": 4.0}, selector({labels.RAY_TPU_SLICE_NAME: "slice-a"}))
    demand = Demand(resources=(ResourceDemand(pinned, shape.hosts_per_replica),))

    result = plan(snapshot((shape,), [pending], demand))

    assert result.launch == ()
    assert result.bundles_placed == shape.hosts_per_replica
    assert result.bundles_unmet == 0
    assert result.infeasible == () and result.waiting == ()
