"""How unforgiving the simulated world is: the timings of the Kubernetes API server,
the KubeRay operator and GKE that decide which races an autoscaler meets.

The realistic world is the default everywhere (`simulate`, the tests, `local`): KubeRay
creates a replica's pods one POST at a time, deleted pods stay listed for their grace
period, pods of a slice turn Running one by one, and the operator writes the
RayCluster status as counts change. The ideal world makes all of that instant and
atomic; it exists only to compare against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WorldName = Literal["realistic", "ideal"]


@dataclass(frozen=True, slots=True)
class WorldModel:
    name: WorldName
    pod_create_latency_s: float
    """One pod POST by KubeRay, through the TPU webhook (a 64-host slice: seconds)."""
    api_call_latency_s: float
    """Any other call the operator makes (a DELETE, a status update)."""
    deletion_grace_s: float
    """A deleted pod's `terminationGracePeriodSeconds`: how long it stays listed."""
    running_stagger_s: float
    """Once a slice's node pool is up, each pod turns Running up to this much later
    (image pull, KubeRay's `wait-gcs-ready` init container)."""
    status_writes: bool
    """KubeRay writes the RayCluster status whenever its counts or conditions change."""
    requeue_s: float
    """KubeRay's unconditional requeue after a successful reconcile."""
    demand_report_period_s: float
    """How often the GCS hears the raylets' pending work (0: always current); node
    resources are current, so work just placed counts as used and as still pending."""
    autoscaler_call_latency_s: float
    """One API call of the autoscaler: the world moves on meanwhile, so KubeRay can
    write the status between the autoscaler's read and its patch."""
    gcs_call_latency_s: float
    """One GCS call of the autoscaler (read the cluster state, drain one node,
    report): Ray places work meanwhile, between the drains of one slice too."""


REALISTIC = WorldModel(
    name="realistic",
    pod_create_latency_s=0.05,
    api_call_latency_s=0.01,
    deletion_grace_s=30.0,
    running_stagger_s=20.0,
    status_writes=True,
    requeue_s=300.0,
    demand_report_period_s=1.0,
    autoscaler_call_latency_s=0.05,
    gcs_call_latency_s=0.02,
)
IDEAL = WorldModel(
    name="ideal",
    pod_create_latency_s=0.0,
    api_call_latency_s=0.0,
    deletion_grace_s=0.0,
    running_stagger_s=0.0,
    status_writes=False,
    requeue_s=0.0,
    demand_report_period_s=0.0,
    autoscaler_call_latency_s=0.0,
    gcs_call_latency_s=0.0,
)
WORLDS: dict[str, WorldModel] = {w.name: w for w in (REALISTIC, IDEAL)}
