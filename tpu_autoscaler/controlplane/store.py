"""A Kubernetes API server for the simulator: RayClusters and Pods with
resourceVersions, JSON patches guarded by the version (a stale write is a
Conflict), a status subresource, label-selected lists, admission by the TPU
webhook's rules, graceful pod deletion, and watchers that the simulated operator
reconciles on."""

from __future__ import annotations

import bisect
import itertools
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tpu_autoscaler.adapters.kube.api import Conflict, NotFound, PodList, Rejected
from tpu_autoscaler.controlplane import crd, pod_defaults, webhook
from tpu_autoscaler.controlplane.clock import EventQueue, rfc3339
from tpu_autoscaler.controlplane.json_copy import json_copy
from tpu_autoscaler.controlplane.json_patch import apply_operation

Key = tuple[str, str]

Selection = tuple[tuple[str, str], ...]

LISTS_KEPT = 64
"""Distinct pod lists kept up to date (a caller listing by unique labels would
otherwise make every pod change walk an ever longer list)."""

MANAGER = "tpu-autoscaler-sim"
"""The field manager named in a stored object's `managedFields`."""

UID_NAMESPACE = uuid.UUID("6f1c2a52-5d1e-4c8e-9a55-2b0c1f3e7d10")
"""uids are uuid5 names in this namespace (of kind, object and a counter): unique
and the same in every run, so a seeded run records the same Events."""

EVENT_TTL_S = 3600.0
"""kube-apiserver's `--event-ttl` default: an Event goes an hour after its last write."""
DEFAULT_GRACE_S = 30.0
"""A pod's `terminationGracePeriodSeconds` when its spec does not set one."""


class ObjectStore:
    def __init__(self, clock: EventQueue | None = None) -> None:
        """With a `clock`, a bound pod's deletion is graceful as kube-apiserver makes it:
        the pod keeps a `deletionTimestamp` and stays listed for its grace period.
        Without, every deletion is immediate (an API server with no kubelets)."""
        self.clock = clock
        self._rayclusters: dict[Key, dict[str, Any]] = {}
        self._pods: dict[Key, dict[str, Any]] = {}
        self._listed: dict[tuple[str, Selection], _Listing] = {}
        """The pods each recent list selected, in order, kept up to date as pods come
        and go (the operator lists a group's pods on every pod change, and sorting and
        filtering every pod each time was much of a large run) and as they change
        (`_pod_writes`). A pod's labels are fixed once it is stored."""
        self._pod_writes: list[Key] = []
        """The pods given a new version in place of their last (`_writable_pod`), in
        order: what a kept list is behind by (`_Listing.synced`). Cleared now and then
        (`_forget_writes`), the kept lists brought up to date then."""
        self._versions = itertools.count(1)
        self.version = 0
        """The newest resourceVersion given (etcd's revision: a list is read at it)."""
        self._uids = itertools.count(1)
        self.watchers: list[Callable[[str, dict[str, Any]], None]] = []
        self.events: list[dict[str, Any]] = []
        """core/v1 Events recorded, oldest first (expired ones too: see `list_events`)."""
        self._recorded: dict[tuple[Any, ...], dict[str, Any]] = {}
        """Each Event `record_event` made, by what makes a repeat of it."""
        self._events_replaced = 0
        """How many times a stored Event was replaced by a new version (`events` is
        otherwise only appended to)."""
        self._selected_events: dict[tuple[str, str], _EventSelection] = {}
        """What each recent `list_events` selected, with when each was written, kept
        up to date as Events are appended (the controller lists them every round, and
        testing every Event ever written each time was much of a large run)."""

    # --- RayClusters -------------------------------------------------------------

    def create_raycluster(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Stored as kube-apiserver stores a create: pruned, defaulted and validated by
        the CRD's schema (no status), then passed by the TPU webhook."""
        raycluster = json_copy(dict(obj))
        meta = raycluster.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta.get("name", ""))
        if key in self._rayclusters:
            raise Conflict(f"raycluster {key[0]}/{key[1]} exists")
        raycluster = self._admit(raycluster, None)
        meta = raycluster["metadata"]
        meta["generation"] = 1
        self._created(raycluster)
        self._stamp(raycluster)
        self._rayclusters[key] = raycluster
        self._notify("RayCluster", raycluster)
        return json_copy(raycluster)

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        return json_copy(self.raycluster(namespace, name))

    def raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored RayCluster itself, read-only, as `pod` gives a pod: every write
        stores a new version. For the simulated controllers, which read it on every
        reconcile and every pod they create (copying its templates each time was a
        tenth of a large run)."""
        try:
            return self._rayclusters[(namespace, name)]
        except KeyError:
            raise NotFound(f"raycluster {namespace}/{name}") from None

    def patch_raycluster(
        self,
        namespace: str,
        name: str,
        operations: list[dict[str, Any]],
        resource_version: str | None,
    ) -> dict[str, Any]:
        """Apply a JSON patch (RFC 6902 add/replace/remove/test) if the object is still
        at `resource_version` (None: unconditionally); all or nothing. The result is
        stored as the CRD's schema leaves it (pruned, defaulted, the stored status
        kept) or refused (`Rejected`); the TPU webhook does not see updates. A patch
        that leaves the object as stored (a value set to what it was, a field that is
        pruned) stores nothing: the resourceVersion stays and watchers hear nothing,
        as kube-apiserver's etcd3 storage skips a write of unchanged bytes."""
        current = self._rayclusters.get((namespace, name))
        if current is None:
            raise NotFound(f"raycluster {namespace}/{name}")
        if (
            resource_version is not None
            and current["metadata"]["resourceVersion"] != resource_version
        ):
            raise Conflict(
                f"raycluster {namespace}/{name} is at {current['metadata']['resourceVersion']}, "
                f"not {resource_version}"
            )
        patched = json_copy(current)
        for operation in operations:
            apply_operation(patched, operation)
        patched.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
            "resourceVersion"
        ]
        return self._update_raycluster((namespace, name), current, patched)

    def update_raycluster(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]:
        """`PUT .../rayclusters/NAME` (or a patch the API server has applied): `obj`
        replaces the stored RayCluster if its `metadata.resourceVersion` is the stored
        one (a Conflict if not), stored as `patch_raycluster` stores it."""
        current = self._stored_at_version(namespace, name, obj)
        return self._update_raycluster((namespace, name), current, json_copy(dict(obj)))

    def _update_raycluster(
        self, key: Key, current: dict[str, Any], patched: dict[str, Any]
    ) -> dict[str, Any]:
        patched = self._admit(patched, current)
        meta = patched["metadata"]
        # rest.BeforeUpdate: the generation, uid and creationTimestamp are the stored ones.
        for field in ("generation", "uid", "creationTimestamp", "managedFields"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        meta["namespace"], meta["name"] = key
        if patched.get("spec") != current.get("spec"):
            meta["generation"] = current["metadata"].get("generation", 1) + 1
        if patched == current:
            # etcd3's GuaranteedUpdate: an object that encodes as the stored one is not
            # written, keeps its resourceVersion and makes no watch event.
            return json_copy(current)
        self._stamp(patched)
        self._rayclusters[key] = patched
        self._notify("RayCluster", patched)
        return json_copy(patched)

    def update_raycluster_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """`PUT .../rayclusters/NAME/status` as an operator sends it: guarded by the
        version it read, so it conflicts with any write since, and moving the version
        under every other writer. Watchers hear `RayCluster/status`, which a
        controller filtering on generation changes (KubeRay's) does not reconcile on."""
        return json_copy(self._write_status(namespace, name, status, resource_version))

    def write_raycluster_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        """`update_raycluster_status` for a writer that reads no answer and hands
        `status` over (the simulated operator, on every status change, with a status
        it made for this write and keeps nothing of): neither the copy of the whole
        RayCluster it answers with nor a copy of `status` is made. What `status`
        shares with the stored status (its conditions) is stored, never changed."""
        self._write_status(namespace, name, status, resource_version, owned=True)

    def _write_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str,
        owned: bool = False,
    ) -> dict[str, Any]:
        """The status write; answers the stored version itself (read-only). `owned`:
        `status` is handed over, stored as it is."""
        current = self._rayclusters.get((namespace, name))
        if current is None:
            raise NotFound(f"raycluster {namespace}/{name}")
        if current["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(
                f"raycluster {namespace}/{name} is at {current['metadata']['resourceVersion']}, "
                f"not {resource_version}"
            )
        # The rest is shared with the version it replaces: stored objects are never
        # changed in place (every write copies) and handed out only to be read.
        if current.get("status") == status:
            return current  # nothing to store, as with patch_raycluster
        updated = {**current, "metadata": dict(current["metadata"])}
        updated["status"] = status if owned else json_copy(status)
        self._stamp(updated)
        self._rayclusters[(namespace, name)] = updated
        self._notify("RayCluster/status", updated)
        return updated

    def replace_raycluster_status(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]:
        """`PUT` or `PATCH .../rayclusters/NAME/status` as kube-apiserver serves it: `obj`
        (the whole RayCluster) guarded by its resourceVersion; only its status is kept,
        pruned and validated by the CRD's schema. Watchers hear `RayCluster/status`."""
        current = self._stored_at_version(namespace, name, obj)
        updated = crd.admit_status(obj, current)
        if updated == current:
            return json_copy(current)
        self._stamp(updated)
        self._rayclusters[(namespace, name)] = updated
        self._notify("RayCluster/status", updated)
        return json_copy(updated)

    def list_rayclusters(self, namespace: str) -> list[dict[str, Any]]:
        """The stored RayClusters of `namespace` by name (read-only, as `list_pods`)."""
        return [obj for key, obj in sorted(self._rayclusters.items()) if key[0] == namespace]

    def raycluster_keys(self) -> list[Key]:
        return list(self._rayclusters)

    def pod_keys(self) -> list[Key]:
        return list(self._pods)

    def edit_raycluster(
        self, namespace: str, name: str, operations: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A person's `kubectl edit`: an unguarded update. The TPU webhook validates
        creates only, so an edit that breaks a TPU shape (3 hosts on a 4x4) is stored
        and so are later writes to that RayCluster; the CRD's schema still applies."""
        return self.patch_raycluster(namespace, name, operations, None)

    def _stored_at_version(
        self, namespace: str, name: str, obj: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The stored RayCluster, if `obj` carries its resourceVersion: NotFound before
        the version is compared, as GuaranteedUpdate reads the object first."""
        current = self._rayclusters.get((namespace, name))
        if current is None:
            raise NotFound(f"raycluster {namespace}/{name}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if current["metadata"]["resourceVersion"] != version:
            raise Conflict(
                f"raycluster {namespace}/{name} is at {current['metadata']['resourceVersion']}, "
                f"not {version}"
            )
        return current

    def _admit(self, raycluster: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
        """kube-apiserver's admission of a RayCluster write (`stored`: the object it
        updates): decoded and validated by the CRD, then, on create only, the TPU
        webhook (after schema validation, as validating admission runs). `raycluster`
        is this write's own copy (of the caller's object, or of the stored one
        patched), handed over to be decoded in place: copying it once more was a
        third of a patch's cost."""
        admitted = crd.admit(raycluster, stored, owned=True)
        if stored is None:
            webhook.admit_raycluster_create(admitted)
        return admitted

    # --- Pods ----------------------------------------------------------------------

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Stored as kube-apiserver stores a create: through the TPU webhook's mutation
        (its objectSelector picks KubeRay's pods), which reads the pods stored so far as
        its informer lists them. A denial or a failing webhook stores nothing. The
        caller's pod stays its own, and so does the answer: each is copied."""
        return json_copy(self.store_pod(json_copy(dict(pod))))

    def store_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """`create_pod` for the simulated operator, without its copies: `pod` is
        stored itself, so the caller hands it over (it built the pod for this one call
        and keeps nothing of it), and the answer is the stored pod, read-only as with
        `list_pods` (the operator only reads it). Copying each pod in, as the webhook
        saw it, and out was a tenth of a large cluster's world."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if key in self._pods:
            raise Conflict(f"pod {key[0]}/{key[1]} exists")
        obj = webhook.mutate_own_pod(pod, self._pods.values())
        pod_defaults.default_pod(obj)
        self._created(obj)
        self._stamp(obj)
        self._pods[key] = obj
        self._index(key, obj, add=True)
        self._notify("Pod", obj)
        return obj

    def list_pods(
        self, namespace: str, selector: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The stored pods themselves, not copies (copying every pod on every list
        is most of a run): callers only read them, and the store changes a pod by
        storing a new version, so a list keeps what it saw, as a client's would. A new
        list at every call, copied in C from the one kept for the selection, which is
        brought up to date by the pods written since it was last (a look-up of each
        of those in the kept keys; most pods of a large cluster do not change from
        one list to the next, and looking every one up was much of a round). The
        list tells which pods changed since an earlier one of its selection
        (`PodList`: the kept list's record of its changes, begun anew when it grows
        long or the writes are forgotten), so a reader need not compare every pod."""
        selection = (namespace, tuple(sorted((selector or {}).items())))
        listing = self._listed.get(selection)
        if listing is None:
            keys = sorted(k for k, pod in self._pods.items() if _selects(selection, k, pod))
            listing = _Listing(keys, [self._pods[k] for k in keys], len(self._pod_writes), [])
            if len(self._listed) >= LISTS_KEPT:
                del self._listed[next(iter(self._listed))]
            self._listed[selection] = listing
        elif listing.synced < len(self._pod_writes):
            self._sync(listing)
        if len(listing.log) > 4 * len(listing.keys) + 1024:
            listing.log = []  # lists taken before are read afresh by their readers
        return PodList(listing.pods, listing.log, len(listing.log))

    def _sync(self, listing: _Listing) -> None:
        """The kept list with the stored version of each pod written since it was
        synced (a pod written is found among its keys by bisection; one not among
        them is not selected, or gone: `_index` takes pods in and out)."""
        keys, pods, log = listing.keys, listing.pods, listing.log
        for key in self._pod_writes[listing.synced :]:
            at = bisect.bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                pods[at] = self._pods[key]
                log.append((key[1], True))
        listing.synced = len(self._pod_writes)

    def _written(self, key: Key) -> None:
        """A stored pod replaced by a new version: the kept lists are behind by it."""
        self._pod_writes.append(key)
        if len(self._pod_writes) > 4 * len(self._pods) + 1024:
            self._forget_writes()

    def _forget_writes(self) -> None:
        """Every kept list brought up to date, the writes then forgotten (each list
        afresh from its keys: the log is longer than the pods stored many times over)."""
        for listing in self._listed.values():
            listing.pods = [self._pods[k] for k in listing.keys]
            listing.synced = 0
            listing.log = []  # its changes untold: lists taken before are read afresh
        self._pod_writes.clear()

    def select_pods(
        self, namespace: str, matches: Callable[[Mapping[str, str]], bool]
    ) -> list[dict[str, Any]]:
        """The stored pods of `namespace` whose labels `matches` (a set-based selector's
        test), by name; read-only, as with `list_pods`."""
        return [
            pod
            for key, pod in sorted(self._pods.items())
            if key[0] == namespace and matches(pod["metadata"].get("labels", {}))
        ]

    def _index(self, key: Key, pod: dict[str, Any], add: bool) -> None:
        """`pod`, stored under `key`, into the kept lists that select it (`add`), or out."""
        for selection, listing in self._listed.items():
            if _selects(selection, key, pod):
                at = bisect.bisect_left(listing.keys, key)
                if add:
                    listing.keys.insert(at, key)
                    listing.pods.insert(at, pod)
                else:
                    del listing.keys[at], listing.pods[at]
                listing.log.append((key[1], add))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored pod (read-only, as with `list_pods`)."""
        return self._pods.get((namespace, name))

    def _writable_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A new version of a stored pod to change: pods already handed out by
        `list_pods` stay as they were read, as a client's copies would."""
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name}")
        fresh: dict[str, Any] = dict(pod)
        for part in ("metadata", "spec", "status"):
            if part in pod:
                fresh[part] = dict(pod[part])
        self._pods[(namespace, name)] = fresh
        self._written((namespace, name))
        return fresh

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, reason: str = "", message: str = ""
    ) -> None:
        """The kubelet's status update; `reason` and `message` say why a pod failed."""
        pod = self._writable_pod(namespace, name)
        pod["status"]["phase"] = phase
        if reason:
            ready = {
                "type": "Ready",
                "status": "False",
                "lastTransitionTime": rfc3339(self._now_s()),
            }
            pod["status"] |= {"reason": reason, "message": message, "conditions": [ready]}
        if phase == "Running":
            pod["spec"].setdefault("nodeName", f"node-of-{name}")  # a running pod is bound
        self._stamp(pod)
        self._notify("Pod", pod)

    def resize_pod(
        self, namespace: str, name: str, operations: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """`PATCH pods/NAME/resize` (Kubernetes >= 1.33): only containers' resources may
        change (`Rejected` otherwise). The simulated kubelet applies it at once: the
        container statuses report the new resources, no resize condition is left."""
        pod = self._writable_pod(namespace, name)
        patched = json_copy(pod)
        for operation in operations:
            if not re.fullmatch(r"/spec/containers/\d+/resources(/.*)?", operation.get("path", "")):
                raise Rejected(f"pod {namespace}/{name} resize: only resources may change")
            apply_operation(patched, operation)
        pod["spec"] = patched["spec"]
        pod["status"]["containerStatuses"] = [
            {"name": c.get("name", ""), "resources": json_copy(c.get("resources", {}))}
            for c in pod["spec"].get("containers", [])
        ]
        self._stamp(pod)
        self._notify("Pod", pod)
        return json_copy(pod)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pod = self._writable_pod(namespace, name)
        pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), **annotations}
        self._stamp(pod)
        self._notify("Pod", pod)

    def bind_pod(self, namespace: str, name: str, node_name: str) -> None:
        """The scheduler placed the pod on a node (`spec.nodeName`)."""
        pod = self._writable_pod(namespace, name)
        pod["spec"]["nodeName"] = node_name
        self._stamp(pod)
        self._notify("Pod", pod)

    def delete_pod(self, namespace: str, name: str, grace_s: float | None = None) -> bool:
        """Delete as kube-apiserver does (see `delete_pod_now`); True if this call
        started the deletion (the pod was not terminating already)."""
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name}")
        started = not pod["metadata"].get("deletionTimestamp")
        self._delete_pod(namespace, name, grace_s)
        return started

    def delete_pod_now(
        self, namespace: str, name: str, grace_s: float | None = None
    ) -> dict[str, Any]:
        """`DELETE .../pods/NAME` as kube-apiserver 1.20 serves it (rest.BeforeDelete and
        the pod strategy's CheckGracefulDelete), answering the pod as it answers: the
        grace period asked for (default: the pod's terminationGracePeriodSeconds) is 0
        for a pod not bound to a node or whose containers have stopped; the pod is
        written with a `deletionTimestamp` that far ahead and its
        `deletionGracePeriodSeconds`, and removed at once (a second version) when that
        is 0. A running pod stays listed, its kubelet stopping it, for its grace
        period; deleting it again can only shorten that (the timestamp moves back by
        the difference), else nothing changes. Without a clock every deletion is
        immediate (no kubelet would ever finish one)."""
        return json_copy(self._delete_pod(namespace, name, grace_s))

    def _delete_pod(self, namespace: str, name: str, grace_s: float | None) -> dict[str, Any]:
        """`delete_pod_now`, answering the pod's version it wrote (or found), not a
        copy: stored versions are never changed, and `delete_pod` needs no answer."""
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name}")
        meta = pod["metadata"]
        last_grace_s = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and last_grace_s:
            if grace_s is None or grace_s >= last_grace_s:
                return pod  # pending: only a shorter period is taken
            due_s = _seconds(meta["deletionTimestamp"]) - last_grace_s + grace_s
        else:
            if grace_s is None:
                grace_s = float(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
            stopped = pod.get("status", {}).get("phase") in ("Failed", "Succeeded")
            if self.clock is None or stopped or not pod["spec"].get("nodeName"):
                grace_s = 0
            due_s = self._now_s() + grace_s
        pod = self._writable_pod(namespace, name)
        meta = pod["metadata"]
        meta["deletionTimestamp"] = rfc3339(due_s)
        meta["deletionGracePeriodSeconds"] = int(grace_s)
        self._stamp(pod)
        self._notify("Pod", pod)
        answer = pod
        if grace_s <= 0:
            self._remove_pod(namespace, name)
        elif self.clock is not None:
            uid = meta.get("uid")
            self.clock.at(due_s, lambda: self._remove_pod(namespace, name, uid))
        return answer

    def _remove_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        """The pod's deletion from storage (a version of its own, as etcd's delete has);
        `uid`: only if it is still that pod (not one created since under its name)."""
        stored = self._pods.get((namespace, name))
        if stored is None or (uid is not None and stored["metadata"].get("uid") != uid):
            return
        pod = self._writable_pod(namespace, name)
        del self._pods[(namespace, name)]
        self._index((namespace, name), pod, add=False)
        if "deletionTimestamp" not in pod["metadata"]:  # a graceful one is stamped already
            pod["metadata"]["deletionTimestamp"] = rfc3339(self._now_s())
        self._stamp(pod)
        self._notify("Pod", pod)

    def _now_s(self) -> float:
        return self.clock.now_s if self.clock is not None else 0.0

    # --- Events ------------------------------------------------------------------------

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        obj = json_copy(event)
        obj.setdefault("metadata", {})["namespace"] = namespace
        self._created(obj)
        self._stamp(obj)
        self.events.append(obj)

    def record_event(self, namespace: str, event: dict[str, Any]) -> None:
        """Record an Event as client-go's recorder does (`EventCorrelator`): one like
        an Event already recorded (the same object, reason, message and source) counts
        once more with a new `lastTimestamp` instead of being recorded again."""
        like = (namespace, *event_identity(event))
        seen = self._recorded.get(like)
        if seen is not None:
            again = {**seen, "count": int(seen.get("count") or 1) + 1}
            again["lastTimestamp"] = event.get("lastTimestamp", seen.get("lastTimestamp"))
            self._event_seen_again(namespace, seen, again)
            return
        self.create_event(namespace, event)
        self._recorded[like] = self.events[-1]

    def _event_seen_again(
        self, namespace: str, seen: dict[str, Any], again: dict[str, Any]
    ) -> None:
        """Stored as a new version, as a pod is: a list taken before keeps what it saw."""
        again["metadata"] = dict(seen["metadata"])
        self._stamp(again)
        at = next(i for i, e in enumerate(self.events) if e is seen)
        self.events[at] = again
        self._events_replaced += 1
        self._recorded[(namespace, *event_identity(again))] = again

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The namespace's Events, oldest first, those `field_selector` selects
        (equality on dotted fields: `involvedObject.kind=Pod,reason=FailedScaleUp`);
        with a clock, those written within `EVENT_TTL_S` only, as etcd expires them.
        The stored Events themselves, as `list_pods` gives pods: callers only read."""
        key = (namespace, field_selector or "")
        selection = self._selected_events.get(key)
        if selection is None or selection.replaced != self._events_replaced:
            selection = _EventSelection(self._events_replaced, 0, [])
            if len(self._selected_events) >= LISTS_KEPT:
                del self._selected_events[next(iter(self._selected_events))]
            self._selected_events[key] = selection
        if selection.scanned < len(self.events):
            wanted = _field_requirements(field_selector or "")
            selection.selected += [
                (_written_s(e), e)
                for e in self.events[selection.scanned :]
                if e["metadata"].get("namespace") == namespace
                and all(_dotted(e, path) == value for path, value in wanted)
            ]
            selection.scanned = len(self.events)
        oldest_s = self._now_s() - EVENT_TTL_S if self.clock is not None else None
        return [
            e for written_s, e in selection.selected if oldest_s is None or written_s >= oldest_s
        ]

    # --- plumbing --------------------------------------------------------------------

    def _created(self, obj: dict[str, Any]) -> None:
        """The system fields kube-apiserver fills in on create (`FillObjectMetaSystemFields`
        and the field manager): a uid, the creationTimestamp (seconds), and
        `managedFields` naming the creator's fields (simplified: lists are atomic, and
        later writers are not recorded)."""
        meta = obj["metadata"]
        kind = obj.get("kind", "")
        name = f"{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}/{next(self._uids)}"
        meta["uid"] = str(uuid.uuid5(UID_NAMESPACE, name))
        now_s = self.clock.now_s if self.clock is not None else time.time()
        # One the simulated controllers give (the same clock, finer) is kept.
        if not meta.get("creationTimestamp"):
            stamp = datetime.fromtimestamp(int(now_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["creationTimestamp"] = stamp
        fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
        fields["metadata"] = {k: v for k, v in meta.items() if k in ("labels", "annotations")}
        meta["managedFields"] = [
            {
                "manager": MANAGER,
                "operation": "Update",
                "apiVersion": obj.get("apiVersion", "v1"),
                "time": meta["creationTimestamp"],
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(fields),
            }
        ]

    def _stamp(self, obj: dict[str, Any]) -> None:
        self.version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        for watcher in list(self.watchers):
            watcher(kind, obj)


def _fields_v1(value: Any) -> dict[str, Any]:
    """A FieldsV1 set of the members of `value`: `f:<name>` per object member (lists and
    scalars are leaves, told apart by their type first: most members of a pod are)."""
    if type(value) is not dict and not isinstance(value, Mapping):
        return {}
    fields: dict[str, Any] = {}
    for key, child in value.items():
        kind = type(child)
        if kind is dict:
            if child:  # an empty object is no field
                fields[f"f:{key}"] = _fields_v1(child)
        elif kind in _JSON_LEAVES:
            fields[f"f:{key}"] = {}
        elif child != {}:
            fields[f"f:{key}"] = _fields_v1(child)
    return fields


_JSON_LEAVES = frozenset({str, int, float, bool, type(None), list})
"""Types whose FieldsV1 set is empty for certain (others are asked `isinstance`)."""


def event_identity(event: Mapping[str, Any]) -> tuple[Any, ...]:
    involved = event.get("involvedObject") or {}
    return (
        involved.get("kind"),
        involved.get("name"),
        involved.get("uid"),
        event.get("reason"),
        event.get("message"),
        event.get("type"),
        (event.get("source") or {}).get("component"),
    )


@dataclass
class _Listing:
    """The pods one label selection selected in one namespace: their keys, sorted, and
    the stored version of each as of the first `synced` of `ObjectStore._pod_writes`,
    and the record of its changes (`PodList.log`): each pod come, gone or written in
    it, by name (the namespace is the selection's), in the order the list took them."""

    keys: list[Key]
    pods: list[dict[str, Any]]
    synced: int
    log: list[tuple[str, bool]]


@dataclass
class _EventSelection:
    """The Events one field selector selected in one namespace, each with when it was
    written, from the first `scanned` of `ObjectStore.events`; valid while no stored
    Event has been replaced since (`replaced`)."""

    replaced: int
    scanned: int
    selected: list[tuple[float, dict[str, Any]]]


def _field_requirements(selector: str) -> list[tuple[str, str]]:
    """`a.b=v,c=w` as (path, value) pairs; `==` is `=`. Other operators are refused."""
    requirements = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        path, equals, value = term.replace("==", "=").partition("=")
        if not equals or path.endswith("!"):
            raise ValueError(f"field selector {term!r}: only equality is served here")
        requirements.append((path.strip(), value.strip()))
    return requirements


def _dotted(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _written_s(event: Mapping[str, Any]) -> float:
    stamp = event.get("lastTimestamp") or event["metadata"].get("creationTimestamp")
    return _seconds(stamp) if stamp else 0.0


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _selects(selection: tuple[str, Selection], key: Key, pod: Mapping[str, Any]) -> bool:
    namespace, selector = selection
    pod_labels = pod["metadata"].get("labels", {})
    return key[0] == namespace and all(pod_labels.get(k) == v for k, v in selector)
