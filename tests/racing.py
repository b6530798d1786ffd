"""A writer that races the autoscaler's patches on the simulated object store: what
the conflict tests of the controller and the guarded apply share."""

from __future__ import annotations

from typing import Any

from tpu_autoscaler.adapters.kube.api import JsonPatch
from tpu_autoscaler.controlplane.store import ObjectStore


class WritesBeforePatches:
    """The API server as seen by the autoscaler while another writer changes the
    RayCluster just before each of the autoscaler's next `times` patches."""

    def __init__(self, store: ObjectStore, times: int, spec: bool) -> None:
        self.store = store
        self.times = times
        self.spec = spec
        self.patches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        self.patches += 1
        if self.times > 0:
            self.times -= 1
            current = self.store.get_raycluster(namespace, name)
            if self.spec:  # a person edits the spec: the generation moves
                self.store.patch_raycluster(
                    namespace,
                    name,
                    [
                        {
                            "op": "replace",
                            "path": "/spec/workerGroupSpecs/0/maxReplicas",
                            "value": current["spec"]["workerGroupSpecs"][0]["maxReplicas"] + 1,
                        }
                    ],
                    None,
                )
            else:  # KubeRay writes the status: the generation stays
                # A new value each time: a write that changes nothing moves no version.
                status = {**current.get("status", {}), "readyWorkerReplicas": self.patches}
                self.store.update_raycluster_status(
                    namespace, name, status, current["metadata"]["resourceVersion"]
                )
        return self.store.patch_raycluster(namespace, name, operations, resource_version)
