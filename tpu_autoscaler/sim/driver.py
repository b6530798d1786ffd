"""A workload's items as the drivers of its jobs submit them to the simulated Ray:
tasks and actors (one bundle each), placement groups, and `slice_placement_group`
calls (`sim/slice_pg.py`), each item as many times as it counts."""

from __future__ import annotations

from collections.abc import Callable

from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.core.demand import GangStrategy
from tpu_autoscaler.sim.ray import SimRay
from tpu_autoscaler.sim.ray_model import Bundle, Work
from tpu_autoscaler.sim.slice_pg import SlicePlacementGroupRun
from tpu_autoscaler.sim.workload import WorkItem


def submit(
    ray: SimRay, events: EventQueue, item: WorkItem, on_reservation_failed: Callable[[], None]
) -> None:
    """`item`, now; `on_reservation_failed`: a slice head reservation timed out."""
    for _ in range(item.count):
        _submit_one(ray, events, item, on_reservation_failed)


def _submit_one(
    ray: SimRay, events: EventQueue, item: WorkItem, on_reservation_failed: Callable[[], None]
) -> None:
    now = events.now_s
    if item.task is not None or item.actor is not None:
        spec = item.task or item.actor
        assert spec is not None
        bundle = Bundle(dict(spec.resources), dict(spec.label_selector))
        ray.submit(Work(ray.new_id("task"), [bundle], item.duration, now))
    elif item.placement_group is not None:
        pg = item.placement_group
        selectors = pg.bundle_label_selector or [{}] * len(pg.bundles)
        bundles = [Bundle(dict(b), dict(s)) for b, s in zip(pg.bundles, selectors, strict=True)]
        ray.submit(Work(ray.new_id("pg"), bundles, item.duration, now, GangStrategy(pg.strategy)))
    elif item.slice_placement_group is not None:
        # Ray 2.60's `slice_placement_group`, heads one slice after another with a
        # timeout each.
        SlicePlacementGroupRun(
            ray,
            events.after,
            item.slice_placement_group,
            item.duration,
            events.now_s,
            on_timeout=on_reservation_failed,
        ).start()
