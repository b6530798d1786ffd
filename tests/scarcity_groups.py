"""Worker groups with scarcity annotations, and the two groups of one v6e 4x4 shape
the fallback tests use: spot (higher priority, cheaper) and on-demand."""

from __future__ import annotations

from typing import Any

from tests.factories import tpu_group
from tests.snapshots import shapes_for
from tpu_autoscaler.core import catalog
from tpu_autoscaler.core.capacity import COST_ANNOTATION, WARM_REPLICAS_ANNOTATION
from tpu_autoscaler.core.shape import SliceShape

V6E_4X4 = catalog.slice_type(catalog.find_generation("v6e"), "4x4")  # type: ignore[arg-type]


def annotated(
    group: dict[str, Any], warm: int | None = None, cost: float | None = None
) -> dict[str, Any]:
    """`group` with the warm-replicas and cost annotations on its pod template."""
    annotations: dict[str, str] = {}
    if warm is not None:
        annotations[WARM_REPLICAS_ANNOTATION] = str(warm)
    if cost is not None:
        annotations[COST_ANNOTATION] = str(cost)
    group["template"].setdefault("metadata", {})["annotations"] = annotations
    return group


def spot_and_on_demand(
    spot_priority: int = 10,
    spot_cost: float | None = 1.0,
    on_demand_cost: float | None = 3.0,
    on_demand_priority: int = 10,
    max_replicas: int = 4,
) -> tuple[SliceShape, ...]:
    """Two groups of one v6e 4x4 shape, spot first in the RayCluster."""
    return shapes_for(
        annotated(
            tpu_group("spot", V6E_4X4, 0, max_replicas, priority=spot_priority), cost=spot_cost
        ),
        annotated(
            tpu_group("on-demand", V6E_4X4, 0, max_replicas, priority=on_demand_priority),
            cost=on_demand_cost,
        ),
    )
