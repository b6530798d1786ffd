"""What does Ray read of the head group? Its node's resources and labels, read as a
worker group's are (`manifest/ray_resources.py`, `manifest/node_labels.py`), with
every problem named under `spec.headGroupSpec`."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_autoscaler.core import labels
from tpu_autoscaler.core.problems import Problem
from tpu_autoscaler.manifest.group_problems import GroupProblems
from tpu_autoscaler.manifest.model import RayCluster
from tpu_autoscaler.manifest.node_labels import check_labels, node_labels
from tpu_autoscaler.manifest.ray_resources import ray_node_resources

HEAD_GROUP = "headgroup"
"""The head's node type name in Ray's autoscaler config (`_HEAD_GROUP_NAME`)."""


@dataclass(frozen=True, slots=True)
class HeadNode:
    """The head node as Ray's autoscaler sees it."""

    resources: dict[str, float]
    labels: dict[str, str]
    problems: tuple[Problem, ...]


def read_head(cluster: RayCluster) -> HeadNode:
    """The head's resources and labels, and what KubeRay or Ray would refuse in them."""
    head = cluster.spec.head_group_spec
    found = GroupProblems(0, HEAD_GROUP, prefix="spec.headGroupSpec")
    containers = head.template.spec.containers
    if not containers:
        found.error(
            "template.spec.containers",
            "KubeRay refuses the RayCluster: headGroupSpec should have at least one container",
        )
    check_labels(head.labels, head.ray_start_params, "Head", found)
    read = ray_node_resources(
        head.resources,
        head.ray_start_params,
        containers[0] if containers else None,
        "template.spec.containers[0]",
        found,
    )
    derived = {labels.RAY_NODE_GROUP: HEAD_GROUP}
    return HeadNode(read.resources, node_labels(head.labels, derived, found), tuple(found.found))


def head_resources(cluster: RayCluster) -> dict[str, float]:
    """The head's resources for a simulated or local head: Ray's reading, with 1 CPU
    where the manifest gives none (which `validate` reports as an error)."""
    resources = dict(read_head(cluster).resources)
    resources.setdefault("CPU", 1.0)
    return resources
