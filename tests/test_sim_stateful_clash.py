"""The sliced cluster's state machine where KubeRay's replica names clash often.

KubeRay 1.7 names a multi-host replica `<group>-` + 5 random characters and never
checks the name is free (`GenerateRayWorkerReplicaGroupName`): at 4,096 live replicas
of a group, two share a name 44 % of the time. Two slices under one name are one
replica to KubeRay (it creates one more, and deletes both when either is named or
fails). Here the simulated KubeRay gives a new replica the name of a live one half the
time, and every invariant of `SlicedCluster` holds per slice, or per name where
KubeRay deletes by name (an idle slice waits for its busy twin)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import settings

from tests.test_sim_stateful import SlicedCluster
from tpu_autoscaler.controlplane.kuberay_groups import GroupReconciler
from tpu_autoscaler.core import labels

CLASH_CHANCE = 0.5
"""How often a new replica takes the name of a live one (KubeRay: 1 in 27^5 per live
replica)."""


class ClashingNames(SlicedCluster):
    def __init__(self) -> None:
        super().__init__()
        groups = self.sim.operator.groups
        draw = GroupReconciler._replica_name
        self.clashes = 0
        """Replicas KubeRay named after a live one."""

        def clashing_name(group: str) -> str:
            names = [key.split("#")[0] for g, key in self._replicas() if g == group]
            # One live slice under a name; a third under one name would also need
            # KubeRay to hand out again the index a clash frees (it counts one index
            # per name): about n^3 rare, and then no label tells the slices apart.
            alone = sorted({n for n in names if names.count(n) == 1} - groups.creating)
            if alone and groups.events.random.random() < CLASH_CHANCE:
                self.clashes += 1
                return groups.events.random.choice(alone)
            return draw(groups, group)

        # Replica names only: pod names draw their own 5 characters.
        groups._replica_name = clashing_name  # type: ignore[method-assign]

    def _removal_units(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Two slices under one name go together: an idle one waits for its busy twin."""
        return super()._replicas()

    def _kuberays_extra(self, group: str) -> int:
        """KubeRay counts two slices under one name as one replica and creates one more
        to make up `replicas` (a slice over maxReplicas, which goes by idle timeout)."""
        names = [key.split("#")[0] for g, key in self._replicas() if g == group]
        return len(names) - len(set(names))

    def _being_created(self, replica: str) -> bool:
        return replica.split("#")[0] in self.sim.operator.creating

    def _replicas(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Each slice apart, as GKE and Ray see them: a clashed name holds two."""
        slices: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for (group, name), pods in super()._replicas().items():
            for pod in pods:
                index = pod["metadata"]["labels"].get(labels.KUBERAY_REPLICA_INDEX, "")
                slices[(group, f"{name}#{index}")].append(pod)
        return slices


ClashingNames.TestCase.settings = settings(
    SlicedCluster.TestCase.settings, max_examples=60, stateful_step_count=30
)
TestClashingNames = ClashingNames.TestCase
