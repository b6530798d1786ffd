"""The snapshot file `plan` reads and `snapshot` writes: one YAML or JSON document
with the RayCluster (as `kubectl get raycluster -o yaml` prints it), its pods (a
PodList or a list), the namespace's Events about pods (an EventList or a list, as
`kubectl get events --field-selector involvedObject.kind=Pod -o yaml` prints them:
the capacity signals are read from them), Ray's `ClusterResourceState` as protobuf
JSON, and `now`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tpu_autoscaler.adapters.kube.capacity_events import CoreEvent, capacity_signals
from tpu_autoscaler.adapters.kube.pods import (
    Pod,
    PodChanges,
    Registrations,
    ReplicaMemo,
    fixed_hosts,
    parse_pods,
    replicas_of,
    timestamp_s,
)
from tpu_autoscaler.adapters.ray.gcs import DeadNode
from tpu_autoscaler.adapters.ray.state import RayState, parse_ray_state
from tpu_autoscaler.core.demand import Demand
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.snapshot import ClusterSnapshot, PolicyConfig
from tpu_autoscaler.manifest.loading import format_path, load_documents, parse_raycluster, read_text
from tpu_autoscaler.manifest.model import RayCluster
from tpu_autoscaler.manifest.objects import EMBEDDED_SPEC, cluster_source
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes


class SnapshotFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    raycluster: dict[str, Any]
    pods: list[dict[str, Any]] | dict[str, Any] = Field(default_factory=list)
    events: list[CoreEvent] = Field(default_factory=list)
    ray_state: dict[str, Any] = Field(default_factory=dict)
    now: datetime | None = None

    @field_validator("events", mode="before")
    @classmethod
    def _event_list_items(cls, value: Any) -> Any:
        """An EventList (`kubectl get events -o yaml`) is read as its items."""
        if isinstance(value, dict) and "items" in value:
            return value["items"] or []
        return value


@dataclass(frozen=True)
class LoadedSnapshot:
    cluster: RayCluster
    shapes: ClusterShapes
    pods: list[Pod]
    ray: RayState
    snapshot: ClusterSnapshot


def load_snapshot(source: str, config: PolicyConfig | None = None) -> LoadedSnapshot:
    documents = load_documents(read_text(source), source)
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ManifestError(
            [Problem(source, "must hold one mapping with raycluster, pods, ray_state, now")]
        )
    return build_snapshot(documents[0], source, config)


def build_snapshot(
    data: dict[str, Any], source: str, config: PolicyConfig | None = None
) -> LoadedSnapshot:
    try:
        parsed = SnapshotFile.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(
            [
                Problem(f"{source}: {format_path(tuple(e['loc']))}", str(e["msg"]))
                for e in exc.errors()
            ]
        ) from None
    cluster = _snapshot_cluster(parsed.raycluster, f"{source}: raycluster")
    items = parsed.pods.get("items") or [] if isinstance(parsed.pods, dict) else parsed.pods
    pods = parse_pods(items, f"{source}: pods")
    ray = (
        parse_ray_state(parsed.ray_state, f"{source}: ray_state")
        if parsed.ray_state
        else RayState((), Demand())
    )
    now_s = _now(parsed, cluster, pods, source)
    return assemble(cluster, pods, ray, now_s, config, parsed.events)


def _snapshot_cluster(obj: dict[str, Any], where: str) -> RayCluster:
    """The snapshot's RayCluster; a RayJob or RayService there is read as the cluster it
    embeds, the way `validate` reads it."""
    if obj.get("kind") not in EMBEDDED_SPEC:
        return parse_raycluster(obj, where)
    found = cluster_source(obj, where)
    if found.raycluster is None:
        raise ManifestError([Problem(where, found.describe())])
    try:
        return parse_raycluster(found.raycluster, where)
    except ManifestError as exc:
        raise ManifestError([found.locate(p) for p in exc.problems]) from None


def assemble(
    cluster: RayCluster,
    pods: list[Pod],
    ray: RayState,
    now_s: float,
    config: PolicyConfig | None = None,
    events: Sequence[CoreEvent] = (),
    dead: Sequence[DeadNode] = (),
    memo: ReplicaMemo | None = None,
    registrations: Registrations | None = None,
    changes: PodChanges | None = None,
) -> LoadedSnapshot:
    """The policy's snapshot from parsed Kubernetes objects (the Events about pods
    among them) and Ray state (the dead nodes the GCS lists among it). `memo`: the
    replicas of the last read, to make again only those that changed.
    `registrations`: when the registered hosts were first seen (none: not known).
    `changes`: how `pods` differ from the read before (`Observation.changes`), so
    the memo looks at those alone."""
    shapes = derive_shapes(cluster) if memo is None else memo.shapes_of(cluster, derive_shapes)
    nodes = ray.node_for_pod() if memo is None else memo.nodes_by_pod(ray)
    replicas = replicas_of(cluster, shapes, pods, nodes, now_s, memo, registrations, changes)
    if memo is None:
        fixed = fixed_hosts(cluster, pods, nodes, replicas)
    else:
        # The memo knows the pods no replica holds (and, below, those that failed),
        # kept from read to read: a walk of every pod for each was much of a round.
        fixed = fixed_hosts(cluster, memo.unheld, nodes, ())
    snapshot = ClusterSnapshot(
        shapes.shapes,
        replicas,
        ray.demand,
        now_s,
        config=config or PolicyConfig(),
        fixed_hosts=fixed,
        capacity_signals=capacity_signals(
            events,
            pods,
            [s.group for s in shapes.shapes],
            dead,
            cluster.metadata.name or None,
            failed=memo.failed if memo is not None else None,
        ),
    )
    return LoadedSnapshot(cluster, shapes, pods, ray, snapshot)


def _now(parsed: SnapshotFile, cluster: RayCluster, pods: list[Pod], source: str) -> float:
    if parsed.now is not None:
        return parsed.now.timestamp()
    stamps = [timestamp_s(p.metadata.creation_timestamp) for p in pods]
    stamps.append(timestamp_s(cluster.metadata.creation_timestamp))
    known = [s for s in stamps if s is not None]
    if not known:
        raise ManifestError(
            [Problem(f"{source}: now", "is missing and no pod or cluster has a timestamp")]
        )
    return max(known)
