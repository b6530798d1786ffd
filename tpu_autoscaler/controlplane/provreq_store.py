"""ProvisioningRequests and PodTemplates in the simulated API server, beside the
RayClusters and pods of `store.ObjectStore` (whose resourceVersions, uids and
creation stamps they share): create, list by label, get, delete, and the status
writes of the controller that plays GKE (`provreq_lifecycle.py`). A request is
admitted by cluster-autoscaler's CRD (`provreq_crd.py`), so a write the real API
server would refuse is refused here too. `ProvisioningApi` is what the adapter uses;
this class and `adapters/kube/provreq_client.py` provide it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from tpu_autoscaler.adapters.kube.api import Conflict, NotFound
from tpu_autoscaler.controlplane import provreq_crd
from tpu_autoscaler.controlplane.store import ObjectStore

Key = tuple[str, str]


class ProvisioningObjects:
    """The two kinds, kept for `store`; `on_change(kind, obj)` hears every write."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._requests: dict[Key, dict[str, Any]] = {}
        self._templates: dict[Key, dict[str, Any]] = {}
        self.watchers: list[Callable[[str, dict[str, Any]], None]] = []
        self.requests_created = 0

    # --- ProvisioningApi --------------------------------------------------------------

    def list_provisioning_requests(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        return _listed(self._requests, namespace, selector)

    def create_provisioning_request(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        request = provreq_crd.admit(_namespaced(obj, namespace))
        stored = self._create(self._requests, request, "ProvisioningRequest")
        self.requests_created += 1
        return stored

    def delete_provisioning_request(self, namespace: str, name: str) -> None:
        self._delete(self._requests, namespace, name, "ProvisioningRequest")

    def list_pod_templates(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        return _listed(self._templates, namespace, selector)

    def create_pod_template(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        template = _namespaced(obj, namespace)
        template.setdefault("apiVersion", "v1")
        template.setdefault("kind", "PodTemplate")
        return self._create(self._templates, template, "PodTemplate")

    def delete_pod_template(self, namespace: str, name: str) -> None:
        self._delete(self._templates, namespace, name, "PodTemplate")

    # --- what GKE's controller reads and writes ------------------------------------------

    def request(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self._requests.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def template(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self._templates.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def replace_request_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A write of the status subresource, admitted by the CRD (its conditions must
        be well formed `metav1.Condition`s)."""
        current = self._requests.get((namespace, name))
        if current is None:
            raise NotFound(f"provisioningrequest {namespace}/{name}")
        stored = provreq_crd.admit_status({**current, "status": dict(status)}, current)
        self.store._stamp(stored)
        self._requests[(namespace, name)] = stored
        self._notify("ProvisioningRequest", stored)
        return copy.deepcopy(stored)

    # --- plumbing ------------------------------------------------------------------------

    def _create(
        self, kept: dict[Key, dict[str, Any]], obj: dict[str, Any], kind: str
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (meta["namespace"], meta.get("name", ""))
        if not key[1]:
            raise NotFound(f"{kind.lower()} without a name")
        if key in kept:
            raise Conflict(f"{kind.lower()} {key[0]}/{key[1]} already exists")
        self.store._created(obj)
        self.store._stamp(obj)
        kept[key] = obj
        self._notify(kind, obj)
        return copy.deepcopy(obj)

    def _delete(
        self, kept: dict[Key, dict[str, Any]], namespace: str, name: str, kind: str
    ) -> None:
        gone = kept.pop((namespace, name), None)
        if gone is None:
            raise NotFound(f"{kind.lower()} {namespace}/{name}")
        gone["metadata"]["deletionTimestamp"] = "deleted"
        self._notify(kind, gone)

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        for watcher in list(self.watchers):
            watcher(kind, obj)


def _namespaced(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    copied = copy.deepcopy(dict(obj))
    copied.setdefault("metadata", {})["namespace"] = namespace
    return copied


def _listed(
    kept: Mapping[Key, dict[str, Any]], namespace: str, selector: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    wanted = dict(selector or {})
    return [
        copy.deepcopy(obj)
        for (ns, _), obj in sorted(kept.items())
        if ns == namespace
        and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
    ]
