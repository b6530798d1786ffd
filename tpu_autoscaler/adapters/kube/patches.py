"""A plan as a change to the RayCluster: one JSON patch that sets, for every group
the plan touches, `replicas` and `scaleStrategy.workersToDelete` (every pod of every
removed replica) together, so KubeRay never sees a launch without its count or a
deletion without its pods. Applied guarded by the resourceVersion the plan was made
from; a conflict means re-read and re-plan, never a blind retry."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from functools import cached_property
from itertools import compress
from operator import attrgetter, is_not

from tpu_autoscaler.adapters.kube.api import JsonPatch
from tpu_autoscaler.adapters.kube.pods import Pod
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.snapshot import Replica
from tpu_autoscaler.manifest.model import RayCluster

_NAME = attrgetter("name")


class KeptPodNames:
    """The names of the pods of the last round asked, kept from round to round by each
    pod object: a pod read as before (the same object, `Observer`) has its name, so
    only the pods new since (objects not held here) and those gone are looked at.
    Walking every pod for its name cost a round ~1.5 ms at 4,096 pods.

    Right against a real API server: the names are always exactly those of the pods
    passed (every list decodes new objects for what changed, and new objects are new
    here); an object is held while it is listed, so no other object takes its `id`."""

    def __init__(self) -> None:
        self.pods: dict[int, Pod] = {}
        self.names: dict[str, int] = {}
        """How many of `pods` have each name."""
        self.listed: tuple[Pod, ...] = ()
        """The pods of the last call, in order (a copy: a caller's list may change)."""

    def names_of(self, pods: Sequence[Pod]) -> Collection[str]:
        """The names of `pods` (until the next call: the collection is this memory).
        The same objects at the same places as the last call's (a re-plan in the same
        round, or a round whose pods did not change: half the calls of a large burst)
        are told in C by identity alone, without a set of every pod's `id`."""
        held = self.pods
        names = self.names
        listed_before, self.listed = self.listed, tuple(pods)
        if len(pods) == len(listed_before) and not any(map(is_not, pods, listed_before)):
            return names.keys()
        listed = set(map(id, pods))  # ids only: no pod is touched in C
        for gone in held.keys() - listed:
            name = held.pop(gone).name
            names[name] -= 1
            if not names[name]:
                del names[name]
        new = listed.difference(held)
        if new:
            for pod in compress(pods, map(new.__contains__, map(id, pods))):
                if id(pod) not in held:  # a pod listed twice is one pod
                    held[id(pod)] = pod
                    names[pod.name] = names.get(pod.name, 0) + 1
        return names.keys()


class PodNames(Collection[str]):
    """The names of `pods`, gathered at the first question: a patch asks only when a
    group it changes lists pods in `workersToDelete`, and most rounds' patches change
    no such group (or nothing), so the names of every pod are seldom needed. `kept`:
    the names of an earlier round's pods, brought up to these (else gathered anew)."""

    def __init__(self, pods: Sequence[Pod], kept: KeptPodNames | None = None) -> None:
        self.pods = pods
        self.kept = kept

    @cached_property
    def names(self) -> Collection[str]:
        if self.kept is not None:
            return self.kept.names_of(self.pods)
        return frozenset(map(_NAME, self.pods))

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def effective_replicas(raycluster: RayCluster, group: str) -> int:
    """What KubeRay acts on for `group` (`WorkerGroupSpec.effective_replicas`)."""
    return next(
        g for g in raycluster.spec.worker_group_specs if g.group_name == group
    ).effective_replicas


def group_operations(
    raycluster: RayCluster,
    group: str,
    replicas: int,
    doomed: Iterable[str] = (),
    existing_pods: Collection[str] = (),
) -> JsonPatch:
    """The operations that set one group's `replicas` and its whole `workersToDelete`:
    the pods already listed that still exist (`replicas` was lowered for them, so
    dropping them would leave them for good), then `doomed`. Empty if nothing changes."""
    index, spec = next(
        (i, g) for i, g in enumerate(raycluster.spec.worker_group_specs) if g.group_name == group
    )
    listed = spec.scale_strategy.workers_to_delete
    delete = list(dict.fromkeys([*(p for p in listed if p in existing_pods), *doomed]))
    path = f"/spec/workerGroupSpecs/{index}"
    operations: JsonPatch = []
    if replicas != spec.replicas:
        operations.append({"op": "replace", "path": f"{path}/replicas", "value": replicas})
    if delete != listed:
        operations.append(
            {"op": "add", "path": f"{path}/scaleStrategy", "value": {"workersToDelete": delete}}
        )
    return operations


def plan_patch(
    raycluster: RayCluster,
    plan: Plan,
    existing_pods: Collection[str] = (),
    taken_back: Sequence[Replica] = (),
) -> JsonPatch:
    """The JSON patch that carries out `plan` on `raycluster`; empty if it changes nothing.
    `taken_back`: replicas named in `workersToDelete` earlier that are to stay (their
    pods no longer listed, `replicas` one higher for each: `shell/taken_back.py`)."""
    operations: JsonPatch = []
    kept_pods = {h.pod_name for r in taken_back for h in r.hosts}
    still_listed = frozenset(existing_pods) - kept_pods if kept_pods else existing_pods
    for spec in raycluster.spec.worker_group_specs:
        launched = plan.launched(spec.group_name)
        removed = [t for t in plan.terminate if t.group == spec.group_name]
        back = sum(r.group == spec.group_name for r in taken_back)
        if not launched and not removed and not back:
            continue
        # KubeRay may run more replicas than `replicas` says (it read the count before a
        # patch lowered it and replaced an unhealthy replica anyway): removing them all
        # is 0, never below. workersToDelete takes the named ones whatever the count.
        target = max(
            0, effective_replicas(raycluster, spec.group_name) + launched + back - len(removed)
        )
        doomed = [pod for t in removed for pod in t.pods]
        operations += group_operations(raycluster, spec.group_name, target, doomed, still_listed)
    return operations
