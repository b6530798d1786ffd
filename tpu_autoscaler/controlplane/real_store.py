"""What do the simulated controllers (the KubeRay operator, the TPU webhook, GKE's
provisioning and the kubelet's pod phases) see and change when the cluster lives in a
real kube-apiserver? `ServerBackedStore` is their `ObjectStore`, kept as their
informer cache of one namespace, with every write sent to the real server first:

- a pod KubeRay creates is mutated by the TPU webhook model (the real server has no
  such webhook) and POSTed; a deletion is a DELETE, whose answer says whether the pod
  went at once (unbound, or stopped) or keeps its `deletionTimestamp` for its grace
  period, after which the kubelet's DELETE with grace 0 removes it; a binding is a
  POST to `pods/NAME/binding`; a phase is a merge patch of `pods/NAME/status`;
- the kubelet stops every pod it sees terminating, whoever deleted it and however the
  cache learnt of it (the operator's DELETE answered, or a relist: a person's DELETE,
  or the operator's whose answer was lost), its grace period counted from then; its
  DELETE is made on the uid it saw, and one the server refuses or never answers is
  recorded in `kubelet_failures` and tried again `KUBELET_RETRY_S` later, the pod kept;
- a RayCluster status is a PUT of `rayclusters/NAME/status` carrying the
  resourceVersion the operator read, as KubeRay's `Status().Update` does, so it meets
  409 when anyone wrote since, and moves the version under everyone else;
- the cache then holds what the server answered (its resourceVersion, uid, times), and
  watchers hear of it as they hear of the store's own writes.

Other writers (the autoscaler's patches, a person, a test) reach the cache when it
`resync`s: it lists the namespace's RayClusters and pods every `RESYNC_PERIOD_S` of the
simulation's clock (an informer that relists rather than watches, so the virtual clock,
not the network, decides when the operator learns of a change) and tells watchers what
changed. A refused write raises the server's error and changes nothing in the cache.

Times: the server stamps creation and deletion with the machine's clock, the
controllers run on the simulation's (which the tests advance faster), so pod ages read
from the server run ahead of the simulation's once it has been advanced."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from urllib3.exceptions import HTTPError

from tpu_autoscaler.adapters.kube.api import ApiError, Conflict, NotFound
from tpu_autoscaler.controlplane import crd, webhook
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.real_server import ServerCalls
from tpu_autoscaler.controlplane.store import Key, ObjectStore, event_identity

RESYNC_PERIOD_S = 1.0
"""Simulated seconds between two relists of the server."""
KUBELET_RETRY_S = 1.0
"""Simulated seconds before the kubelet tries again a removal that failed."""
RESYNC_PHASE_S = 0.5
"""Relists fall half a period off whole seconds, away from the autoscaler's grid (every
5 s), as a watch event would come some time after the write that caused it."""
STATUS_ONLY = ("status", "resourceVersion", "managedFields")
"""What a status write changes; any other change is news to a spec watcher."""


class ServerBackedStore(ObjectStore):
    """The object store of one namespace of a real API server (`api_client`): reads
    from the cache, writes through the server, resynced on `clock`."""

    def __init__(
        self,
        clock: EventQueue,
        api_client: client.ApiClient,
        namespace: str,
        resync_period_s: float = RESYNC_PERIOD_S,
    ) -> None:
        super().__init__(clock)
        self.clock: EventQueue = clock
        self.server = ServerCalls(api_client, namespace)
        self.namespace = namespace
        self.kubelet_failures: list[str] = []
        """Every removal the kubelet tried and the server refused or never answered, in
        order (each tried again `KUBELET_RETRY_S` later)."""
        self._stopping: dict[str, tuple[str, float]] = {}
        """The pods the kubelet is stopping, by name: the uid it saw terminating and
        when its next removal is due."""
        self.resync()
        clock.every(resync_period_s, self.resync, first_s=clock.now_s + RESYNC_PHASE_S)

    # --- RayClusters ---------------------------------------------------------------------

    def create_raycluster(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POSTed after the TPU webhook's validation of creates (on the object as the
        CRD's defaults leave it); the server's schema does the rest."""
        raycluster = copy.deepcopy(dict(obj))
        raycluster.setdefault("metadata", {})["namespace"] = self.namespace
        webhook.admit_raycluster_create(crd.admit(raycluster, None))
        created = self.server.post(self.server.raycluster_path(), raycluster)
        self._mirror_raycluster(created)
        return copy.deepcopy(created)

    def patch_raycluster(
        self,
        namespace: str,
        name: str,
        operations: list[dict[str, Any]],
        resource_version: str | None,
    ) -> dict[str, Any]:
        """A JSON patch, made a precondition on `resource_version` as the autoscaler's
        client makes it (the version replaced first)."""
        self._check(namespace)
        guard = [{"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}]
        patch = (guard if resource_version is not None else []) + list(operations)
        patched = self.server.json_patch(self.server.raycluster_path(name), patch)
        self._mirror_raycluster(patched)
        return copy.deepcopy(patched)

    def update_raycluster(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._check(namespace)
        updated = self.server.put(self.server.raycluster_path(name), dict(obj))
        self._mirror_raycluster(updated)
        return copy.deepcopy(updated)

    def update_raycluster_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """KubeRay's `Status().Update`: the cached object with the new status, at the
        version the operator read."""
        current = self.get_raycluster(namespace, name)
        current["status"] = copy.deepcopy(status)
        current["metadata"]["resourceVersion"] = resource_version
        return self.replace_raycluster_status(namespace, name, current)

    def write_raycluster_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        """Through the server, as `update_raycluster_status`."""
        self.update_raycluster_status(namespace, name, status, resource_version)

    def replace_raycluster_status(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._check(namespace)
        updated = self.server.put(self.server.raycluster_path(name, "status"), dict(obj))
        self._mirror_raycluster(updated)
        return copy.deepcopy(updated)

    # --- Pods ----------------------------------------------------------------------------

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Through the TPU webhook's mutation (it reads the cached pods, as its informer
        lists them), then POSTed; the server defaults and stamps it."""
        obj = copy.deepcopy(dict(pod))
        self._check(obj["metadata"].get("namespace", self.namespace))
        obj = webhook.mutate_pod(obj, self._pods.values())
        # The server sets these itself (a pod is created Pending, at its own time).
        obj["metadata"].pop("creationTimestamp", None)
        obj.pop("status", None)
        created = self.server.post(self.server.pod_path(), obj)
        self._mirror_pod(created)
        return copy.deepcopy(created)

    def store_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """`create_pod`: through the server too."""
        return self.create_pod(pod)

    def bind_pod(self, namespace: str, name: str, node_name: str) -> None:
        """The scheduler's binding (`spec.nodeName` is set through it only)."""
        self._check(namespace)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        self.server.post(self.server.pod_path(name, "binding"), binding)
        self._mirror_pod(self.server.get(self.server.pod_path(name)))

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, reason: str = "", message: str = ""
    ) -> None:
        """The kubelet's status update; a pod that runs is bound first, as the store's
        shortcut assumes. A `reason` (the node shutting down) comes with its message
        and the Ready condition turned False."""
        status: dict[str, Any] = {"phase": phase}
        if reason:
            ready = {
                "type": "Ready",
                "status": "False",
                "lastTransitionTime": rfc3339(self.clock.now_s),
            }
            status |= {"reason": reason, "message": message, "conditions": [ready]}
        self.set_pod_status(namespace, name, status)

    def set_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """The kubelet's merge of `status` (phase, podIP, container states) into the
        pod's; bound first if it is to run."""
        self._check(namespace)
        cached = self.pod(namespace, name)
        running = status.get("phase") == "Running"
        if running and cached is not None and not cached["spec"].get("nodeName"):
            self.bind_pod(namespace, name, f"node-of-{name}")
        patch = {"status": dict(status)}
        self._mirror_pod(self.server.merge_patch(self.server.pod_path(name, "status"), patch))

    def delete_pod(self, namespace: str, name: str, grace_s: float | None = None) -> bool:
        """True if this call started the deletion. The server decides how: at once (the
        answer's grace is 0) or gracefully (the pod keeps its `deletionTimestamp`; the
        kubelet, seeing it in the answer, removes it once its grace period has passed on
        the simulation's clock). `grace_s`: the grace period asked for (None: the pod's
        own)."""
        self._check(namespace)
        cached = self.pod(namespace, name)
        if cached is None:
            raise NotFound(f"pod {namespace}/{name}")
        if cached["metadata"].get("deletionTimestamp"):
            return False
        try:
            answer = self.server.delete(
                self.server.pod_path(name),
                grace_period_s=None if grace_s is None else int(grace_s),
            )
        except NotFound:
            self._remove_pod(namespace, name)
            raise
        grace_s = int(answer["metadata"].get("deletionGracePeriodSeconds") or 0)
        if grace_s <= 0:
            self._remove_pod(namespace, name)
            return True
        self._mirror_pod(answer)
        return True

    def _kubelet_sees(self, served: dict[str, Any]) -> None:
        """The kubelet's watch: a pod terminating on the server (in a DELETE's answer or
        a relist) is stopped once its grace period has passed from now, unless its
        removal is due already (sooner) for that very pod."""
        meta = served["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        name, uid = str(meta["name"]), str(meta.get("uid", ""))
        due_s = self.clock.now_s + float(meta.get("deletionGracePeriodSeconds") or 0)
        stopping = self._stopping.get(name)
        if stopping is not None and stopping[0] == uid and stopping[1] <= due_s:
            return
        self._stop_at(name, uid, due_s)

    def _stop_at(self, name: str, uid: str, due_s: float) -> None:
        self._stopping[name] = (uid, due_s)
        self.clock.at(due_s, lambda: self._containers_stopped(name, uid, due_s))

    def _containers_stopped(self, name: str, uid: str, due_s: float) -> None:
        """The kubelet, once a deleted pod's containers have stopped: DELETE at once,
        on the uid it saw terminating. Gone already (404), or the name another pod's
        now (409 on the uid), is as good; any other failure is recorded and the
        removal tried again, the pod kept (the server still holds it)."""
        if self._stopping.get(name) != (uid, due_s):
            return  # removed meanwhile, or a sooner removal took its place
        try:
            self.server.delete(self.server.pod_path(name), grace_period_s=0, uid=uid or None)
        except (NotFound, Conflict):
            pass
        except (ApiError, client.ApiException, HTTPError) as exc:
            retry_s = self.clock.now_s + KUBELET_RETRY_S
            self.kubelet_failures.append(
                f"pod {self.namespace}/{name}: the kubelet's DELETE failed "
                f"({type(exc).__name__}: {exc}); trying again in {KUBELET_RETRY_S:g} s"
            )
            self._stop_at(name, uid, retry_s)
            return
        self._stopping.pop(name, None)
        self._remove_pod(self.namespace, name, uid or None)

    def _remove_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        super()._remove_pod(namespace, name, uid)
        if name in self._stopping and self.pod(namespace, name) is None:
            del self._stopping[name]  # gone from the server: nothing left to stop

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self._check(namespace)
        body = copy.deepcopy(event)
        body.setdefault("metadata", {})["namespace"] = namespace
        self.events.append(self.server.post(self.server.events_path(), body))

    def _event_seen_again(
        self, namespace: str, seen: dict[str, Any], again: dict[str, Any]
    ) -> None:
        """The recorder's update of a repeated Event: a PUT of the counted copy."""
        path = f"{self.server.events_path()}/{seen['metadata']['name']}"
        answer = self.server.put(path, again)
        at = next(i for i, e in enumerate(self.events) if e is seen)
        self.events[at] = answer
        self._recorded[(namespace, *event_identity(answer))] = answer

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self._check(namespace)
        query = [("fieldSelector", field_selector)] if field_selector else None
        items: list[dict[str, Any]] = self.server.get(self.server.events_path(), query)["items"]
        return items

    # --- the cache -----------------------------------------------------------------------

    def resync(self) -> None:
        """The namespace's RayClusters and pods as the server holds them now; watchers
        hear of each that changed, appeared or went."""
        listed = self.server.get(self.server.raycluster_path())
        for raycluster in listed.get("items") or []:
            self._mirror_raycluster(raycluster)
        pods = self.server.get(self.server.pod_path()).get("items") or []
        served = {(self.namespace, p["metadata"]["name"]) for p in pods}
        for key in [k for k in self._pods if k not in served]:
            self._remove_pod(*key)
        for pod in pods:
            self._mirror_pod(pod)

    def _mirror_raycluster(self, served: dict[str, Any]) -> None:
        served.setdefault("kind", "RayCluster")
        served.setdefault("apiVersion", "ray.io/v1")
        key = (self.namespace, served["metadata"]["name"])
        cached = self._rayclusters.get(key)
        if cached is not None and _version(cached) == _version(served):
            return
        self._rayclusters[key] = copy.deepcopy(served)
        kind = "RayCluster/status" if _status_only(cached, served) else "RayCluster"
        self._notify(kind, self._rayclusters[key])

    def _mirror_pod(self, served: dict[str, Any]) -> None:
        served.setdefault("kind", "Pod")
        served.setdefault("apiVersion", "v1")
        self._kubelet_sees(served)
        key: Key = (self.namespace, served["metadata"]["name"])
        cached = self._pods.get(key)
        if cached is not None:
            if _version(cached) == _version(served):
                return
            self._index(key, cached, add=False)
        self._pods[key] = copy.deepcopy(served)
        self._index(key, self._pods[key], add=True)
        self._notify("Pod", self._pods[key])

    def _check(self, namespace: str) -> None:
        if namespace != self.namespace:
            raise NotFound(f"namespace {namespace}: this store mirrors {self.namespace}")


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _status_only(cached: Mapping[str, Any] | None, served: Mapping[str, Any]) -> bool:
    """Only the status (and the version) moved: KubeRay's spec watcher does not care."""
    if cached is None:
        return False

    def rest(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in obj["metadata"].items() if k not in STATUS_ONLY}
        return {**{k: v for k, v in obj.items() if k not in STATUS_ONLY}, "metadata": meta}

    return rest(cached) == rest(served)
