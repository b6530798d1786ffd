"""How the simulated API server answers requests about pods
(`/api/v1/namespaces/NS/pods[/NAME]`) as kube-apiserver 1.20 does: a list by label
selector, read at the store's newest version; a pod's GET; and its DELETE with a grace
period (DeleteOptions in the body or the query) and a resourceVersion precondition."""

from __future__ import annotations

import json

from tpu_autoscaler.adapters.kube.api import NotFound
from tpu_autoscaler.controlplane import label_selectors
from tpu_autoscaler.controlplane.apiserver_replies import Reply, error
from tpu_autoscaler.controlplane.store import ObjectStore


def list_pods(store: ObjectStore, namespace: str, selector_text: str) -> Reply:
    try:
        requirements = label_selectors.parse(selector_text)
    except ValueError as exc:
        return error(400, str(exc))
    keys = [r.key for r in requirements]
    if all(r.operator in ("=", "==") for r in requirements) and len(set(keys)) == len(keys):
        # Equality only: the store's kept lists answer.
        items = store.list_pods(namespace, {r.key: r.values[0] for r in requirements})
    else:
        items = store.select_pods(
            namespace, lambda labels: all(r.matches(labels) for r in requirements)
        )
    # A list is read at etcd's current revision, whatever it selected (Ray's KubeRay
    # provider reads it; a watch may start from it).
    meta = {"resourceVersion": str(store.version)}
    # A typed list's items carry no apiVersion or kind (shallow copies: read-only).
    items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
    return Reply(200, {"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items})


def get_pod(store: ObjectStore, namespace: str, name: str) -> Reply:
    pod = store.pod(namespace, name)
    if pod is None:
        return _not_found(name)
    return Reply(200, pod)


def delete_pod(
    store: ObjectStore, namespace: str, name: str, query: dict[str, list[str]], body: bytes
) -> Reply:
    """The pod as the deletion left it (200, whether it is gone or terminating), after
    the precondition in the DeleteOptions is checked (409 naming both versions)."""
    try:
        options = json.loads(body) if body.strip() else {}
        if not isinstance(options, dict):
            raise ValueError("DeleteOptions is a JSON object")
        grace = options.get("gracePeriodSeconds")
        if "gracePeriodSeconds" in query:
            grace = int(query["gracePeriodSeconds"][0])
        if grace is not None and not isinstance(grace, int):
            raise ValueError(f"gracePeriodSeconds: {grace!r} is not an integer")
    except ValueError as exc:
        return error(400, str(exc))
    pod = store.pod(namespace, name)
    if pod is None:
        return _not_found(name)
    wanted = (options.get("preconditions") or {}).get("resourceVersion")
    stored = pod["metadata"].get("resourceVersion")
    if wanted is not None and wanted != stored:
        message = (
            f'Operation cannot be fulfilled on Pod "{name}": the ResourceVersion in the '
            f"precondition ({wanted}) does not match the ResourceVersion in record ({stored}). "
            "The object might have been modified"
        )
        return error(409, message, None, {"name": name, "kind": "Pod"})
    try:
        return Reply(200, store.delete_pod_now(namespace, name, grace))
    except NotFound:
        return _not_found(name)


def _not_found(name: str) -> Reply:
    return error(404, f'pods "{name}" not found', None, {"name": name, "kind": "pods"})
