"""What one RayCluster and its pods look like now: read from the API and parsed into
the manifest model, as an informer would (an object whose resourceVersion has not
changed since the last read is not parsed again), and, for the controller, the Events
about pods that tell of capacity. The controller and Ray's provider wrappers read the
cluster through this one place."""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi, PodList
from tpu_autoscaler.adapters.kube.capacity_events import POD_EVENTS
from tpu_autoscaler.adapters.kube.pods import Pod, PodChanges, parse_pods
from tpu_autoscaler.core.labels import KUBERAY_CLUSTER
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.model import Container, RayCluster, RayClusterSpec

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})
"""What a pod without metadata reads as (one, not a dict made per pod read)."""

_NAME = operator.attrgetter("name")
_UNVERSIONED = object()
"""What stands in `Observer.last_listed` for a pod listed without a version: no
listed object is it, so such a pod is parsed at every read."""


@dataclass(frozen=True)
class Observation:
    """The RayCluster and every pod labelled as its own, raw and parsed, in the order
    the API listed them (pods being deleted included)."""

    raw: dict[str, Any]
    cluster: RayCluster
    raw_pods: tuple[dict[str, Any], ...]
    pods: tuple[Pod, ...]
    events: tuple[dict[str, Any], ...] = ()
    """The namespace's Events about pods, if asked for and readable."""
    events_error: ApiError | None = None
    """Why they could not be read (no `list` on `events` in the Role, an outage): the
    round goes on without capacity signals."""
    changes: PodChanges | None = None
    """How `pods` differ from the observer's read before."""

    @property
    def resource_version(self) -> str | None:
        version: str | None = self.raw.get("metadata", {}).get("resourceVersion")
        return version

    @property
    def generation(self) -> int | None:
        generation: int | None = self.raw.get("metadata", {}).get("generation")
        return generation


@dataclass
class Observer:
    """Reads one RayCluster; remembers what it parsed at which resourceVersion. Losing
    the memory (a new process) costs parsing again, nothing else. The API is passed
    to each read, so whoever holds the observer may swap its client."""

    namespace: str
    name: str
    parsed_cluster: tuple[str, RayCluster] | None = None
    cluster_spec: tuple[Any, RayCluster] | None = None
    """The RayCluster's spec as last listed, and the parse it was part of: a version
    whose spec is listed the same (compared in full, so any change to it is parsed)
    takes that parse's spec as it is (`_parse_cluster`). Most new versions of a
    RayCluster are the operator's status writes, which leave the spec as it was; and
    the spec (the pod templates) was most of parsing one. Right against a real API
    server, whose every get decodes a new object: the spec is compared by content,
    never by identity or version. Kept as listed, which is safe while nobody changes
    a listed object in place (as `parsed_pods`)."""
    parsed_pods: dict[str, tuple[str, Any, Pod]] = field(default_factory=dict)
    """Each pod parsed, by name, with the resourceVersion and the spec it was listed
    with (pods gone stay until the next prune). A pod's spec mostly stays as it was
    when its status changes, and it was most of parsing a pod: a spec equal to the one
    listed before (compared in full, so any change to it is parsed) is that parse
    again, and so are containers equal to those listed before (`_parse`). Kept as
    listed, which is safe while nobody changes a listed object in place: a real
    client decodes each list afresh, and the simulator's store makes a new version
    of a pod to change it (`Store._writable_pod`), as the (name, resourceVersion)
    lookup also assumes."""
    last_listed: tuple[Sequence[object], Sequence[Pod]] = ((), ())
    """The last read's pod objects as listed (an unversioned one's place held by an
    object no pod is), and their parses: a pod listed as the very object listed last
    read is that parse again, known without a look inside it (`_pods_of`). Safe
    because a listed pod is never changed in place (`KubeApi.list_pods`): the
    simulated store makes a new object to change a pod, and a real client decodes
    every list afresh, so its objects are new at every read and take the (name,
    resourceVersion) way (`parsed_pods`), which this only spares a look-up. Holds
    the last list only: the objects it compares stay alive, so no `id` is recycled
    under it, and no older version is kept from being freed."""

    names: list[str] | None = None
    """The names of the pods of `last_listed`, in order, while its list is a
    `PodList` (which tells what changed since) without an unversioned pod: a new
    list's changes are placed among them by name (`_pods_told`)."""
    read_token: object = field(default_factory=object)
    """Stands for the last read in `PodChanges` (a new one at every read)."""

    sibling: tuple[list[Any], tuple[Container, ...]] | None = None
    """The containers of the last pod parsed whole, as listed and as parsed: a pod
    first listed (a new replica's) mostly has the containers of the pods before it
    but for a few env entries (the TPU webhook's), so the parts of its containers
    listed the same as these (compared in full: any difference is parsed) are these
    parsed parts (`_with_sibling_parts`)."""

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def forget(self) -> None:
        self.parsed_cluster = None
        self.cluster_spec = None
        self.parsed_pods.clear()
        self.last_listed = ((), ())
        self.names = None
        self.read_token = object()
        self.sibling = None

    def read(self, api: KubeApi, events: bool = False) -> Observation:
        """Raises ApiError from the API and ManifestError (naming the object) for an
        object that does not parse. With `events`, the Events about pods too, best
        effort: a refused list is kept in `events_error`, not raised."""
        raw = api.get_raycluster(self.namespace, self.name)
        version = str(raw.get("metadata", {}).get("resourceVersion", ""))
        if self.parsed_cluster is None or self.parsed_cluster[0] != version or not version:
            self.parsed_cluster = (version, self._parse_cluster(raw))
        cluster = self.parsed_cluster[1]
        raw_pods = api.list_pods(self.namespace, {KUBERAY_CLUSTER: self.name})
        since = self.read_token
        pods, changed = self._pods_of(raw_pods)
        self.read_token = token = object()
        changes = PodChanges(since, token, None if changed is None else tuple(changed))
        listed: list[dict[str, Any]] = []
        error: ApiError | None = None
        if events:
            try:
                listed = api.list_events(self.namespace, POD_EVENTS)
            except ApiError as exc:
                error = exc
        return Observation(
            raw, cluster, tuple(raw_pods), tuple(pods), tuple(listed), error, changes
        )

    def _parse_cluster(self, raw: dict[str, Any]) -> RayCluster:
        """The RayCluster parsed, its spec as parsed before if listed the same before
        (`cluster_spec`); the spec is kept as listed for the next version."""
        spec = raw.get("spec")
        kept = self.cluster_spec
        listed = raw
        if kept is not None and isinstance(spec, dict) and isinstance(kept[0], dict):
            # Given a parsed model, the model takes it as it is (no re-validation).
            if kept[0] == spec:
                listed = {**raw, "spec": kept[1].spec}
            else:
                listed = {**raw, "spec": _with_parsed_parts(spec, kept[0], kept[1].spec)}
        cluster = parse_raycluster(listed, f"raycluster {self.where}")
        self.cluster_spec = (spec, cluster) if isinstance(spec, dict) else None
        return cluster

    def _pods_of(
        self, raw_pods: Sequence[dict[str, Any]]
    ) -> tuple[list[Pod], list[tuple[str, Pod | None, Pod | None]] | None]:
        """Each listed pod parsed, a parse kept where the pod is unchanged; and the
        pods whose parse is not the last read's, with it then and now (None if not
        known: then every pod is to be looked at).

        A list that tells what changed since the last one (`PodList`, the simulated
        store's) is the last read's pods but for those changes, placed by name
        (`_pods_told`): a Python step for each change, none for the other pods.

        Found by object first, in C on the addresses of the listed objects alone,
        never their contents: in the simulator most pods of a large cluster are the
        very objects listed last round, and reading every pod's name and version (a
        cache miss or more a pod) was much of a round. While as many pods are listed
        as last time, each is compared with the object listed in its place; otherwise
        looked up by `id` among the last list's. The others (a new object: a pod that
        changed, or any pod of a real client's list) by (name, resourceVersion), a
        Python step each."""
        last_raw, last_pods = self.last_listed
        if isinstance(raw_pods, PodList) and self.names is not None:
            told = raw_pods.changed_since(last_raw)
            if told is not None:
                found = self._pods_told(raw_pods, told)
                if found is not None:
                    return found
        keyed: list[object] = list(raw_pods)
        if len(last_raw) == len(raw_pods):
            pods: list[Pod | None] = list(last_pods)
            new_objects = map(operator.is_not, raw_pods, last_raw)
        else:
            # The last list's objects are alive (held in `last_listed`), so an object
            # listed now under the `id` of one of them is that very object.
            by_id = dict(zip(map(id, last_raw), last_pods, strict=True))
            pods = list(map(by_id.get, map(id, raw_pods)))
            new_objects = map(operator.is_, pods, itertools.repeat(None))
        changed: list[tuple[str, Pod | None, Pod | None]] | None = None
        if len(last_raw) == len(raw_pods):
            changed = []
        all_versioned = True
        for at in itertools.compress(itertools.count(), new_objects):
            pods[at], versioned = self._pod_by_version(raw_pods[at])
            if not versioned:
                keyed[at] = _UNVERSIONED  # never matches: parsed at every read
                all_versioned = False
            if changed is not None:
                pod, before = cast(Pod, pods[at]), last_pods[at]
                if pod is not before:
                    if pod.name != before.name:
                        changed = None  # not the same pods: not told
                    else:
                        changed.append((pod.name, before, pod))
        self._prune(pods)
        parsed = cast(list[Pod], pods)
        if isinstance(raw_pods, PodList) and all_versioned:
            # The list itself, to ask what changed since (`PodList.changed_since`).
            self.last_listed = (raw_pods, parsed)
            self.names = list(map(_NAME, parsed))
        else:
            self.last_listed = (keyed, parsed)
            self.names = None
        return parsed, changed

    def _prune(self, pods: Sequence[Pod | None]) -> None:
        """The parses of pods no longer listed let go, now and then."""
        if len(self.parsed_pods) > 2 * len(pods):
            names = set(map(_NAME, pods))
            self.parsed_pods = {n: p for n, p in self.parsed_pods.items() if n in names}

    def _pods_told(
        self, raw_pods: PodList, told: Sequence[tuple[str, bool]]
    ) -> tuple[list[Pod], list[tuple[str, Pod | None, Pod | None]]] | None:
        """The pods of a list that told what changed since the last (`told`: each
        pod's name, whether listed after the change): the last read's parses, by
        name, but for the pods come, gone or written, parsed (by resourceVersion, as
        ever). Safe as far as the list tells every change: the simulated store
        records each pod it takes in, lets go or stores anew in a kept list as it
        does it (`ObjectStore.list_pods`), as a watch from the last list's version
        would; a real client's list tells nothing and is walked. None (the list
        walked) if the changes do not fit the last list (a name told gone that was
        not listed, a pod listed in another place than its name's)."""
        last_pods = self.last_listed[1]
        names = list(cast(list[str], self.names))
        pods: list[Pod | None] = list(last_pods)
        before: dict[str, Pod | None] = {}
        for name, listed in told:
            at = bisect.bisect_left(names, name)
            present = at < len(names) and names[at] == name
            if name not in before:
                before[name] = pods[at] if present else None
            if not listed:
                if not present:
                    return None
                del names[at], pods[at]
            elif not present:
                names.insert(at, name)
                pods.insert(at, None)
        if len(names) != len(raw_pods):
            return None
        changed: list[tuple[str, Pod | None, Pod | None]] = []
        for name, was in before.items():
            at = bisect.bisect_left(names, name)
            pod: Pod | None = None
            if at < len(names) and names[at] == name:
                raw_pod = raw_pods[at]
                if raw_pod.get("metadata", _NO_METADATA).get("name") != name:
                    return None
                pod, versioned = self._pod_by_version(raw_pod)
                if not versioned:
                    return None  # walked, which keeps it parsed at every read
                pods[at] = pod
            if pod is not was:
                changed.append((name, was, pod))
        self._prune(pods)
        parsed = cast(list[Pod], pods)
        self.last_listed = (raw_pods, parsed)
        self.names = names
        return parsed, changed

    def _pod_by_version(self, raw_pod: dict[str, Any]) -> tuple[Pod, bool]:
        """The pod parsed, or its parse at the same (name, resourceVersion): the API
        server gives every write to a pod a new resourceVersion (etcd's revision), on
        a real server as in the simulated one, so the same (name, version) is the same
        content, however the list was decoded. A pod listed without a version is
        parsed at every read (the flag says whether it had one)."""
        meta = raw_pod.get("metadata", _NO_METADATA)
        name = meta.get("name")
        version = meta.get("resourceVersion")
        kept = self.parsed_pods.get(name)
        if kept is None or kept[0] != version or not version:
            kept = self.parsed_pods[name] = (
                version,
                raw_pod.get("spec"),
                self._parse(raw_pod, kept),
            )
        return kept[2], bool(version)

    def _parse(self, raw_pod: dict[str, Any], before: tuple[str, Any, Pod] | None) -> Pod:
        """The pod parsed, its spec as parsed before if listed the same before, else its
        containers as parsed before if they are listed the same (a pod bound to a
        node: its spec changed in `nodeName` alone, and the containers were most of
        parsing it). Compared in full, so any change to them is parsed."""
        spec = raw_pod.get("spec")
        whole = True  # its containers parsed from what was listed
        if before is not None and isinstance(spec, dict) and isinstance(before[1], dict):
            # Given parsed models, the model takes them as they are (no re-validation).
            if before[1] == spec:
                raw_pod = {**raw_pod, "spec": before[2].spec}
                whole = False
            elif "containers" in spec and spec["containers"] == before[1].get("containers"):
                raw_pod = {**raw_pod, "spec": {**spec, "containers": before[2].spec.containers}}
                whole = False
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if whole and self.sibling is not None and isinstance(containers, list):
            parts = self._with_sibling_parts(containers, *self.sibling)
            if parts is not containers:
                raw_pod = {**raw_pod, "spec": {**cast(dict[str, Any], spec), "containers": parts}}
        (parsed,) = parse_pods([raw_pod], f"pods of {self.where}")
        if whole and isinstance(containers, list):
            self.sibling = (containers, tuple(parsed.spec.containers))
        return parsed

    @staticmethod
    def _with_sibling_parts(
        containers: list[Any], listed: list[Any], parsed: tuple[Container, ...]
    ) -> list[Any]:
        """`containers` with each part listed the same as in `listed` (the same
        container of another pod) put in as it was parsed there: a whole container, or
        its resources and env entries. The same pod as parsing every part: a model is
        made the same from the same content, and the model takes a parsed part as it
        is. A part listed otherwise (or not a mapping) is left to be parsed, so a bad
        one is refused naming it as ever. `containers` itself if nothing is the same."""
        found: list[Any] = []
        any_found = False
        for at, container in enumerate(containers):
            if at >= len(listed) or at >= len(parsed) or not isinstance(container, dict):
                found.append(container)
                continue
            before, model = listed[at], parsed[at]
            if container == before:
                found.append(model)
                any_found = True
                continue
            if not isinstance(before, dict):
                found.append(container)
                continue
            changed = dict(container)
            resources = container.get("resources")
            if isinstance(resources, dict) and resources == before.get("resources"):
                changed["resources"] = model.resources
                any_found = True
            env, env_before = container.get("env"), before.get("env")
            if (
                isinstance(env, list)
                and isinstance(env_before, list)
                and len(env_before) == len(model.env)
            ):
                entries = model.env
                changed["env"] = [
                    entries[place]
                    if place < len(env_before)
                    and isinstance(entry, dict)
                    and entry == env_before[place]
                    else entry
                    for place, entry in enumerate(env)
                ]
                any_found = True
            found.append(changed)
        return found if any_found else containers


def _with_parsed_parts(
    spec: dict[str, Any], listed: dict[str, Any], parsed: RayClusterSpec
) -> dict[str, Any]:
    """`spec` with its head group and each worker group's pod template listed the same
    as in `listed` (the spec of the version before, whose parse is `parsed`) put in as
    parsed there: the autoscaler's own writes change a group's replicas and removal
    marks, not its template, which is most of parsing it. The same cluster as parsing
    every part: a model is made the same from the same content, and the model takes
    a parsed part as it is. A part listed otherwise (or not a mapping) is parsed, so
    a bad one is refused naming it as ever."""
    found = dict(spec)
    head = spec.get("headGroupSpec")
    if isinstance(head, dict) and head == listed.get("headGroupSpec"):
        found["headGroupSpec"] = parsed.head_group_spec
    groups, groups_before = spec.get("workerGroupSpecs"), listed.get("workerGroupSpecs")
    models = parsed.worker_group_specs
    if (
        isinstance(groups, list)
        and isinstance(groups_before, list)
        and len(groups_before) == len(models)
    ):
        found["workerGroupSpecs"] = [
            {**group, "template": models[at].template}
            if at < len(groups_before)
            and isinstance(group, dict)
            and isinstance(group.get("template"), dict)
            and isinstance(groups_before[at], dict)
            and group["template"] == groups_before[at].get("template")
            else group
            for at, group in enumerate(groups)
        ]
    return found
