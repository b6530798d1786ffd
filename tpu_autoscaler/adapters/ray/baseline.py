"""What the stock autoscaler does with the same snapshot: Ray 2.60's autoscaler v2
(`ResourceDemandScheduler` on the instances its reconciler would hold) and then Ray's
own `KubeRayProvider` writing its decision into the RayCluster.

This is the side-by-side reference for `plan --policy ray`, the simulator and the
benchmarks. Ray's code runs as installed; only the glue is ours: the request Ray's
reconciler would build from the snapshot (`baseline_request.py`), and what Ray's
provider and KubeRay make of the scheduler's reply (`baseline_reply.py`).

Its quirks are Ray's: per-host idle termination, `TPU-*-head` on every host, launches
of fewer than numOfHosts hosts dropped, one named pod removing its whole replica in
KubeRay >= 1.6. Two simplifications: an idle host Ray would drain first is named at
once (Ray drains it, then names it a round or two later), and Ray's memory of earlier
launches still unanswered (REQUESTED instances without pods) is not kept between
rounds."""

from __future__ import annotations

from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest

from tpu_autoscaler.adapters.ray.baseline_reply import as_kuberay_plan
from tpu_autoscaler.adapters.ray.baseline_request import HEAD_RESOURCE, reconciler_view
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.plan import Plan

__all__ = ["HEAD_RESOURCE", "ray_plan", "ray_request"]


def ray_plan(loaded: LoadedSnapshot) -> Plan:
    """The plan Ray 2.60 with KubeRay would carry out on `loaded`: an `UnguardedPlan`
    that brings the patch Ray's provider writes."""
    held = reconciler_view(loaded)
    reply = ResourceDemandScheduler(event_logger=None).schedule(held.request)
    return as_kuberay_plan(loaded, held, reply)


def ray_request(loaded: LoadedSnapshot) -> SchedulingRequest:
    """The `SchedulingRequest` Ray's v2 reconciler would build for this snapshot."""
    return reconciler_view(loaded).request
