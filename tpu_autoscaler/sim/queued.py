"""Queued provisioning in the simulated cluster: where ProvisioningRequests and
PodTemplates live (`controlplane/provreq_store.py`), GKE's controller of their
lifecycle (`controlplane/provreq_lifecycle.py`) on the capacity of `sim/provisioning.py`,
and what a run measured of it. Wired only when a group opts in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpu_autoscaler.controlplane.provreq_lifecycle import (
    ProvisioningRequestController,
    QueueTimings,
)
from tpu_autoscaler.controlplane.provreq_store import ProvisioningObjects

if TYPE_CHECKING:
    from tpu_autoscaler.sim.cluster import SimulatedCluster

__all__ = ["QueueTimings", "QueuedWorld"]


@dataclass
class QueuedWorld:
    objects: ProvisioningObjects
    controller: ProvisioningRequestController

    @staticmethod
    def wire(cluster: SimulatedCluster, timings: QueueTimings | None) -> QueuedWorld | None:
        """The queued world of `cluster`, if any of its groups is queued."""
        if not cluster.gke.queued:
            return None
        objects = ProvisioningObjects(cluster.store)
        controller = ProvisioningRequestController(
            cluster.events, objects, cluster.namespace, cluster.gke, timings
        )
        return QueuedWorld(objects, controller)
