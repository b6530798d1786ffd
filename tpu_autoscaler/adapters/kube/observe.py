"""What one RayCluster and its pods look like now: read from the API and parsed into
the manifest model, as an informer would (an object whose resourceVersion has not
changed since the last read is not parsed again), and, for the controller, the Events
about pods that tell of capacity. The controller and Ray's provider wrappers read the
cluster through this one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpu_autoscaler.adapters.kube.api import ApiError, KubeApi
from tpu_autoscaler.adapters.kube.capacity_events import POD_EVENTS
from tpu_autoscaler.adapters.kube.pods import Pod, parse_pods
from tpu_autoscaler.core.labels import KUBERAY_CLUSTER
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.model import PodSpec, RayCluster


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
    parsed_pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    parsed_specs: dict[str, tuple[Any, PodSpec]] = field(default_factory=dict)
    """The spec of each pod parsed, by pod name, as listed and as parsed: a pod's
    spec mostly stays as it was when its status changes, and it was most of parsing
    a pod. A spec equal to the one listed before (compared in full, so any change to
    it is parsed) is that parse again. Kept as listed, which is safe while nobody
    changes a listed object in place: a real client decodes each list afresh, and
    the simulator's store makes a new version of a pod to change it
    (`Store._writable_pod`), as the (name, resourceVersion) memo also assumes."""

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def forget(self) -> None:
        self.parsed_cluster = None
        self.parsed_pods.clear()
        self.parsed_specs.clear()

    def read(self, api: KubeApi, events: bool = False) -> Observation:
        """Raises ApiError from the API and ManifestError (naming the object) for an
        object that does not parse. With `events`, the Events about pods too, best
        effort: a refused list is kept in `events_error`, not raised."""
        raw = api.get_raycluster(self.namespace, self.name)
        version = str(raw.get("metadata", {}).get("resourceVersion", ""))
        if self.parsed_cluster is None or self.parsed_cluster[0] != version or not version:
            self.parsed_cluster = (version, parse_raycluster(raw, f"raycluster {self.where}"))
        cluster = self.parsed_cluster[1]
        raw_pods = api.list_pods(self.namespace, {KUBERAY_CLUSTER: self.name})
        pods: list[Pod] = []
        seen: dict[tuple[str, str], Pod] = {}
        for raw_pod in raw_pods:
            meta = raw_pod.get("metadata", {})
            key = (str(meta.get("name")), str(meta.get("resourceVersion", "")))
            parsed = self.parsed_pods.get(key) if key[1] else None
            if parsed is None:
                parsed = self._parse(key[0], raw_pod)
            seen[key] = parsed
            pods.append(parsed)
        self.parsed_pods = seen
        if len(self.parsed_specs) > 2 * len(seen):  # pods gone, now and then
            names = {name for name, _ in seen}
            self.parsed_specs = {n: s for n, s in self.parsed_specs.items() if n in names}
        listed: list[dict[str, Any]] = []
        error: ApiError | None = None
        if events:
            try:
                listed = api.list_events(self.namespace, POD_EVENTS)
            except ApiError as exc:
                error = exc
        return Observation(raw, cluster, tuple(raw_pods), tuple(pods), tuple(listed), error)

    def _parse(self, name: str, raw_pod: dict[str, Any]) -> Pod:
        """The pod parsed, its spec as parsed before if listed the same before."""
        spec = raw_pod.get("spec")
        before = self.parsed_specs.get(name)
        if before is not None and spec is not None and before[0] == spec:
            # Given the parsed spec, the model takes it as it is (no re-validation).
            (parsed,) = parse_pods([{**raw_pod, "spec": before[1]}], f"pods of {self.where}")
        else:
            (parsed,) = parse_pods([raw_pod], f"pods of {self.where}")
        if spec is not None:
            self.parsed_specs[name] = (spec, parsed.spec)
        return parsed
