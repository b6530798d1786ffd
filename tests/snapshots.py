"""Cluster snapshots for policy tests: replicas whose hosts report what a real
Ray node of that slice would, with chosen usage and idle times."""

from __future__ import annotations

from collections.abc import Sequence

from tests.factories import raycluster, tpu_group
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.demand import (
    Bundle,
    Demand,
    GangDemand,
    GangStrategy,
    selector_from_mapping,
)
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    Host,
    LaunchFailures,
    Replica,
    ReplicaState,
)
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import derive_shapes


def shapes_for(*groups: dict[str, object], **options: object) -> tuple[SliceShape, ...]:
    shapes = derive_shapes(parse_raycluster(raycluster(*groups, **options), "test"))
    shapes.raise_for_errors()
    return shapes.shapes


def v6e_16_shapes(
    max_replicas: int = 4, min_replicas: int = 0, idle_timeout_s: int = 60
) -> tuple[SliceShape, ...]:
    s = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]
    return shapes_for(
        tpu_group("tpu", s, min_replicas, max_replicas, idleTimeoutSeconds=idle_timeout_s)
    )


def running_replica(
    shape: SliceShape,
    index: int,
    idle_s: Sequence[float] | float = 0.0,
    used: dict[int, dict[str, float]] | None = None,
    created_at_s: float = 0.0,
    state: ReplicaState = ReplicaState.RUNNING,
) -> Replica:
    """Replica `index` of `shape`, every host registered; `used[i]` is taken on host i."""
    name = f"{shape.group}-r{index}"
    slice_name = f"{shape.group}-{index}"
    idle = [idle_s] * shape.hosts_per_replica if isinstance(idle_s, int | float) else list(idle_s)
    hosts = []
    for i in range(shape.hosts_per_replica):
        total = shape.host_resources(i, slice_name if shape.tpu else None)
        available = dict(total)
        for resource, amount in (used or {}).get(i, {}).items():
            available[resource] -= amount
        hosts.append(
            Host(
                pod_name=f"{name}-h{i}",
                host_index=i,
                node_id=f"node-{name}-{i}",
                labels=shape.host_labels(i, slice_name if shape.tpu else None),
                total=total,
                available=available,
                idle_s=idle[i],
            )
        )
    return Replica(
        shape.group, name, state, tuple(hosts), created_at_s, slice_name if shape.tpu else None
    )


def pending_replica(shape: SliceShape, index: int, created_at_s: float) -> Replica:
    name = f"{shape.group}-r{index}"
    hosts = tuple(
        Host(pod_name=f"{name}-h{i}", host_index=i) for i in range(shape.hosts_per_replica)
    )
    return Replica(
        shape.group, name, ReplicaState.PENDING, hosts, created_at_s, f"{shape.group}-{index}"
    )


def slice_head_gang(pod_type: str, num_slices: int = 1, gang_id: str = "spg-head") -> GangDemand:
    """Stage one of slice_placement_group, as Ray 2.60 asks for it."""
    selector = selector_from_mapping({"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type})
    return GangDemand(gang_id, (Bundle({f"TPU-{pod_type}-head": 1.0}, selector),) * num_slices)


def slice_worker_gang(
    slice_name: str, hosts: int, chips: int, gang_id: str = "spg-workers"
) -> GangDemand:
    """Stage two: one {CPU: 1, TPU: chips} bundle per host, pinned to the reserved slice."""
    selector = selector_from_mapping({"ray.io/tpu-slice-name": slice_name})
    bundle = Bundle({"CPU": 1.0, "TPU": float(chips)}, selector)
    return GangDemand(gang_id, (bundle,) * hosts, GangStrategy.SPREAD)


def snapshot(
    shapes: tuple[SliceShape, ...],
    replicas: Sequence[Replica] = (),
    demand: Demand | None = None,
    now_s: float = 1000.0,
    launch_failures: dict[str, LaunchFailures] | None = None,
) -> ClusterSnapshot:
    return ClusterSnapshot(
        shapes, tuple(replicas), demand or Demand(), now_s, launch_failures or {}
    )


def apply_plan(snap: ClusterSnapshot, plan: Plan) -> ClusterSnapshot:
    """The snapshot after the shell carries out `plan` and before anything comes up."""
    return snap.after(plan)
