"""Which RayCluster does a manifest describe? A RayCluster itself, the cluster a
RayJob creates (`spec.rayClusterSpec`), the one a RayService runs
(`spec.rayClusterConfig`), or none: a RayJob that names an existing cluster
(`spec.clusterSelector`), or a snapshot file, which `plan` reads.

KubeRay names the cluster of a RayJob `<job>-<5 random chars>` and that of a RayService
`<service>-<5 random chars>`; offline we call it by its owner's name, which is what a
user searches for. Problems found in the embedded cluster are reported at their path
in the file the user wrote (`spec.rayClusterSpec.workerGroupSpecs[0]...`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tpu_autoscaler.core.problems import ManifestError, Problem

OwnerKind = Literal["RayCluster", "RayJob", "RayService"]

EMBEDDED_SPEC: dict[str, str] = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}
"""Where each owner keeps the RayCluster spec it creates."""

SNAPSHOT_KEYS = frozenset({"raycluster", "pods", "ray_state", "now"})
"""The top-level keys of a snapshot file (`adapters/snapshot_file.py`)."""

RAYJOB_CLUSTER_SELECTOR_KEY = "ray.io/cluster"
"""The clusterSelector key naming the existing cluster (KubeRay `RayJobClusterSelectorKey`)."""


@dataclass(frozen=True, slots=True)
class ClusterSource:
    """The RayCluster a manifest describes, and where in the manifest it was found."""

    kind: OwnerKind
    name: str
    namespace: str
    spec_path: str
    """Path of the RayCluster spec in the file: `spec`, `spec.rayClusterSpec`, ..."""
    raycluster: dict[str, Any] | None
    """The RayCluster object to read; None when a RayJob selects an existing cluster."""
    selected_cluster: str | None = None
    """The existing cluster a RayJob's clusterSelector names."""

    def describe(self) -> str:
        """One line saying which object and which cluster were read."""
        where = f"{self.kind} {self.namespace}/{self.name}"
        if self.raycluster is None:
            return (
                f"{where} runs on the existing RayCluster {self.selected_cluster!r} "
                "(spec.clusterSelector); it brings no cluster to check: validate that "
                "RayCluster's manifest instead"
            )
        if self.kind == "RayCluster":
            return f"{where}"
        return f"{where}: the RayCluster in {self.spec_path}"

    def locate(self, problem: Problem) -> Problem:
        """`problem` with its `spec.` path moved under the embedded spec's path."""
        if self.spec_path == "spec":
            return problem
        for prefix in ("spec.", "spec["):
            if problem.path.startswith(prefix):
                path = self.spec_path + problem.path[len("spec") :]
                return Problem(path, problem.message, problem.group, problem.severity)
        marker = ": spec"
        if marker in problem.path:
            head, _, rest = problem.path.partition(marker)
            path = f"{head}: {self.spec_path}{rest}"
            return Problem(path, problem.message, problem.group, problem.severity)
        return problem


def pick_cluster_source(documents: list[Any], source: str) -> ClusterSource:
    """The one RayCluster, RayJob or RayService among `documents`, as a ClusterSource."""
    owners = [
        d
        for d in documents
        if isinstance(d, dict) and d.get("kind") in ("RayCluster", *EMBEDDED_SPEC)
    ]
    if not owners:
        raise ManifestError([_nothing_to_read(documents, source)])
    if len(owners) > 1:
        names = ", ".join(f"{d.get('kind')} {_meta(d).get('name')}" for d in owners)
        raise ManifestError(
            [Problem(source, f"holds {len(owners)} clusters ({names}); give one per file")]
        )
    return cluster_source(owners[0], source)


def cluster_source(obj: dict[str, Any], source: str) -> ClusterSource:
    """The cluster `obj` (a RayCluster, RayJob or RayService) describes."""
    kind: OwnerKind = obj["kind"]
    meta = _meta(obj)
    # With only a generateName the server picks the name; offline the prefix stands in.
    name = str(meta.get("name") or str(meta.get("generateName") or "").rstrip("-"))
    namespace = str(meta.get("namespace") or "default")
    if kind == "RayCluster":
        return ClusterSource(kind, name, namespace, "spec", obj)
    spec = obj.get("spec")
    where = f"{source}: {kind} {name}"
    if not isinstance(spec, dict):
        raise ManifestError([Problem(f"{where}: spec", "is missing or not a mapping")])
    field = EMBEDDED_SPEC[kind]
    selector = spec.get("clusterSelector") if kind == "RayJob" else None
    if selector:
        if not isinstance(selector, dict) or not selector.get(RAYJOB_CLUSTER_SELECTOR_KEY):
            raise ManifestError(
                [
                    Problem(
                        f"{where}: spec.clusterSelector",
                        f"must name the cluster as {RAYJOB_CLUSTER_SELECTOR_KEY}: <name> "
                        "(KubeRay: cluster name in ClusterSelector should not be empty)",
                    )
                ]
            )
        selected = str(selector[RAYJOB_CLUSTER_SELECTOR_KEY])
        return ClusterSource(kind, name, namespace, "spec.clusterSelector", None, selected)
    embedded = spec.get(field)
    if not isinstance(embedded, dict):
        message = (
            "is missing; a RayJob needs rayClusterSpec or clusterSelector (KubeRay: one of "
            "RayClusterSpec or ClusterSelector must be set)"
            if kind == "RayJob"
            else "is missing or not a mapping; a RayService runs the cluster it describes"
        )
        raise ManifestError([Problem(f"{where}: spec.{field}", message)])
    raycluster = {
        "apiVersion": obj.get("apiVersion", "ray.io/v1"),
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": embedded,
    }
    return ClusterSource(kind, name, namespace, f"spec.{field}", raycluster)


def _nothing_to_read(documents: list[Any], source: str) -> Problem:
    mappings = [d for d in documents if isinstance(d, dict)]
    if len(mappings) == 1 and "raycluster" in mappings[0] and set(mappings[0]) <= SNAPSHOT_KEYS:
        return Problem(
            source,
            f"is a snapshot (raycluster, pods, ray_state), not a manifest: "
            f"run `tpu-autoscaler plan {source}`",
        )
    kinds = sorted({str(d.get("kind")) for d in mappings if d.get("kind") is not None})
    found = f" (found: {', '.join(kinds)})" if kinds else " (no object has a kind)"
    return Problem(source, f"holds no RayCluster, RayJob or RayService{found}")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
