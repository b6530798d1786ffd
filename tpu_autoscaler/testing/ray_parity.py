"""Does our reading of a RayCluster equal Ray 2.60's (`_derive_autoscaling_config_from_ray_cr`,
the config `ray kuberay-autoscaler` builds each round), and do we refuse what KubeRay v1.7
and the GKE TPU webhook refuse? Used by the differential property test and by
`benchmarks/conformance_kuberay_samples.py`; not product code.

A cluster is read as the API server stores it (the CRD's defaults applied, through the
simulated API server's decoder), then by KubeRay's validation (the simulated operator's
model of validation.go, plus the label syntax that model leaves out, restated here from
apimachinery), by the TPU webhook (the simulator's model), by Ray's config, and by us.
Where both read it, every difference is named: one of DIVERGENCES (documented in
docs/configuration.md) or unexplained."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)

from tpu_autoscaler.controlplane import crd, webhook
from tpu_autoscaler.controlplane.kuberay_validation import spec_error
from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.manifest.loading import parse_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

DIVERGENCES = {
    "head-resource-on-worker-0": "TPU-{pod_type}-head is on worker 0 of each slice only; "
    "Ray's node type puts it on every host",
    "raylet-derived-resources": "we add the accelerator_type:TPU-* resource the raylet "
    "advertises once started; Ray's config has only what the manifest says",
    "raylet-derived-labels": "we add ray.io/node-group and the static ray.io/tpu-* labels "
    "the raylet derives at start; Ray's config has the group's own labels only",
    "kuberay-refuses": "a cluster KubeRay refuses (InvalidRayClusterSpec) never runs; we "
    "refuse it, Ray's config reads it anyway",
    "webhook-refuses": "hosts per replica come from topology chips / the pod's chip request; "
    "a numOfHosts that differs (or a TPU group without its topology) is refused, as the TPU "
    "webhook refuses the RayCluster; Ray's config multiplies by numOfHosts as written",
    "no-worker-groups": "Ray's config raises on a cluster without workerGroupSpecs "
    "(KeyError); we read it as a head alone",
}

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _kuberay_label_ok(key: str, value: str) -> bool:
    """apimachinery IsQualifiedName(key) and IsValidLabelValue(value)."""
    parts = key.split("/")
    name = parts[-1]
    if len(parts) > 2 or not name or len(name) > 63 or not _NAME.fullmatch(name):
        return False
    if len(parts) == 2 and (len(parts[0]) > 253 or not _SUBDOMAIN.fullmatch(parts[0])):
        return False
    return len(value) <= 63 and (value == "" or bool(_NAME.fullmatch(value)))


def kuberay_refusal(stored: dict[str, Any]) -> str | None:
    """Why KubeRay v1.7 refuses the stored RayCluster, None if it reconciles it."""
    spec = stored.get("spec") or {}
    groups = [spec.get("headGroupSpec") or {}, *(spec.get("workerGroupSpecs") or [])]
    for group in groups:
        for key, value in (group.get("labels") or {}).items():
            if not _kuberay_label_ok(str(key), str(value)):
                return f"invalid label {key}: {value!r}"
    return spec_error(stored)


def webhook_refusal(stored: dict[str, Any]) -> str | None:
    """Why the GKE TPU webhook refuses the RayCluster's creation (the simulator's model
    of it), None if it admits it."""
    try:
        denied = webhook.denial(stored)
    except webhook.WebhookFailed as exc:
        return f"the TPU webhook refuses it: {exc}"
    return f"the TPU webhook refuses it: {denied}" if denied else None


@dataclass(frozen=True, slots=True)
class Difference:
    where: str
    ours: Any
    rays: Any
    divergence: str | None
    """The DIVERGENCES key that explains it, None if nothing does."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One cluster read by the API server, KubeRay, Ray and us."""

    outcome: str
    """same | differs | both refuse | we refuse, Ray reads | Ray refuses, we read |
    KubeRay refuses, we read"""
    why: str = ""
    differences: tuple[Difference, ...] = field(default=())

    @property
    def divergences(self) -> tuple[str, ...]:
        return tuple(sorted({d.divergence for d in self.differences if d.divergence}))


def judge(raycluster: dict[str, Any]) -> Verdict:
    """Our reading of `raycluster` (as written) against the API server's, KubeRay's and Ray's."""
    ours: ClusterShapes | None = None
    try:
        ours = derive_shapes(parse_raycluster(raycluster, "manifest"))
    except ManifestError as exc:
        our_error = str(exc.problems[0])
    else:
        our_error = str(ours.errors[0]) if ours.errors else ""
    written = copy.deepcopy(raycluster)
    # The API server stores every object in a namespace; `kubectl apply` picks default.
    written.setdefault("metadata", {}).setdefault("namespace", "default")
    try:
        stored = crd.admit(written)
    except Exception as exc:  # the API server's refusal (Invalid)
        refusal: str | None = f"the API server refuses it: {str(exc)[:120]}"
        ray: dict[str, Any] | None = None
    else:
        refusal = kuberay_refusal(stored)
        refusal = f"KubeRay refuses it: {refusal}" if refusal else webhook_refusal(stored)
        try:
            ray = _derive_autoscaling_config_from_ray_cr(stored)
        except Exception as exc:  # Ray's refusal: the autoscaler raises and stops
            ray = None
            refusal = refusal or f"Ray's config raises {type(exc).__name__}: {str(exc)[:120]}"
    if our_error:
        if refusal:
            return Verdict("both refuse", f"{refusal} | we: {our_error}")
        return Verdict("we refuse, Ray reads", our_error)
    assert ours is not None
    if ray is None:
        no_groups = not (raycluster.get("spec") or {}).get("workerGroupSpecs")
        diverge = "no-worker-groups" if no_groups else None
        return Verdict("Ray refuses, we read", refusal or "", (Difference("", "", "", diverge),))
    if refusal:
        return Verdict("KubeRay refuses, we read", refusal)
    found = tuple(differences(ours, ray))
    if any(d.divergence is None for d in found):
        unexplained = [d for d in found if d.divergence is None]
        why = "; ".join(f"{d.where}: ours {d.ours} / Ray {d.rays}" for d in unexplained)
        return Verdict("differs", why, found)
    return Verdict("same", "", found)


def differences(ours: ClusterShapes, ray: dict[str, Any]) -> list[Difference]:
    """Every difference between our reading and Ray's config, named where documented."""
    found: list[Difference] = []
    types = ray["available_node_types"]
    if ours.head is not None:
        head = types["headgroup"]
        _compare(found, "headgroup.resources", ours.head.resources, head["resources"], set())
        _labels(found, "headgroup", ours.head.labels, head["labels"], {"ray.io/node-group"})
    for shape in ours.shapes:
        node_type = types[shape.group]
        hosts = shape.hosts_per_replica
        head_resource = shape.head_resource
        for host in range(hosts):
            where = f"{shape.group}.resources[host {host}]"
            mine = shape.host_resources(host)
            extra_ok = {k for k in mine if k.startswith("accelerator_type:")}
            _compare(found, where, mine, node_type["resources"], extra_ok, head_resource)
        derived = {"ray.io/node-group"}
        if shape.tpu is not None:
            derived |= set(shape.tpu.static_labels())
        _labels(found, shape.group, shape.group_labels, node_type["labels"], derived)
        for name, mine_n, rays_n in (
            ("min_workers", shape.min_replicas * hosts, node_type["min_workers"]),
            ("max_workers", shape.max_replicas * hosts, node_type["max_workers"]),
            ("priority", shape.priority, node_type.get("priority", 0)),
            (
                "idle_timeout_s",
                shape.idle_timeout_s,
                node_type.get("idle_timeout_s", ray["idle_timeout_minutes"] * 60),
            ),
            (
                "upscaling Conservative",
                shape.upscaling_mode == "Conservative",
                ray["upscaling_speed"] == 1,
            ),
        ):
            if mine_n != rays_n:
                found.append(Difference(f"{shape.group}.{name}", mine_n, rays_n, None))
    return found


def _compare(
    found: list[Difference],
    where: str,
    mine: dict[str, float],
    rays: dict[str, Any],
    derived: set[str],
    head_resource: str | None = None,
) -> None:
    for key in sorted(set(mine) | set(rays)):
        if mine.get(key) == rays.get(key):
            continue
        if key in derived and key not in rays:
            divergence: str | None = "raylet-derived-resources"
        elif key == head_resource and key not in mine:
            divergence = "head-resource-on-worker-0"
        else:
            divergence = None
        found.append(Difference(f"{where}[{key}]", mine.get(key), rays.get(key), divergence))


def _labels(
    found: list[Difference],
    group: str,
    mine: Any,
    rays: dict[str, str],
    derived: set[str],
) -> None:
    for key in sorted(set(mine) | set(rays)):
        if mine.get(key) == rays.get(key):
            continue
        known = key in derived and key not in rays
        found.append(
            Difference(
                f"{group}.labels[{key}]",
                mine.get(key),
                rays.get(key),
                "raylet-derived-labels" if known else None,
            )
        )
