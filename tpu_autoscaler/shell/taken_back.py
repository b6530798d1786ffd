"""Removals taken back: a replica this autoscaler named in `workersToDelete` that came
up whole and took work before KubeRay deleted it.

KubeRay creates nothing in a group while pods it deleted are still listed (scale
expectations), and deletes the pods `workersToDelete` names only in a reconcile after
that, so a slice named for its provisioning timeout can come up, register with Ray and
get work in between: no drain guarded it (it had no Ray nodes when named). Deleting it
then kills the work. Its names are taken back out of `workersToDelete`, and `replicas`
raised for it, in the round's patch; it goes later by idle timeout, drained first, like
any slice. Found by `make fuzz` (note 13)."""

from __future__ import annotations

from collections.abc import Collection
from itertools import compress, repeat
from operator import attrgetter, is_

from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot
from tpu_autoscaler.core.snapshot import Replica, ReplicaState

_STATE = attrgetter("state")


def busy_though_named(loaded: LoadedSnapshot, retiring: Collection[str]) -> tuple[Replica, ...]:
    """The replicas to take back: every pod of the shape there and listed in
    `workersToDelete`, none being deleted yet, none dead, and some host in use (hosts
    join Ray one by one, and work lands on the first). Once its work ends it may be
    named again, and then goes. `retiring`: replicas this autoscaler drained for their
    idle removal (Ray places nothing on a drained node; they go as planned)."""
    named = {
        pod
        for group in loaded.cluster.spec.worker_group_specs
        for pod in group.scale_strategy.workers_to_delete
    }
    if not named:
        return ()
    shapes = {shape.group: shape for shape in loaded.snapshot.shapes}
    replicas = loaded.snapshot.replicas
    # Most replicas are not draining: passed over in C.
    draining = map(is_, map(_STATE, replicas), repeat(ReplicaState.DRAINING))
    candidates = [
        replica
        for replica in compress(replicas, draining)
        if replica.name not in retiring
        and replica.group in shapes
        and len(replica.hosts) == shapes[replica.group].hosts_per_replica
        and all(h.pod_name in named for h in replica.hosts)
        and not any(h.dead for h in replica.hosts)
        and any(h.in_use for h in replica.hosts)
    ]
    if not candidates:
        return ()
    # Rare (a named slice with work on it): only then walk every pod for deletions.
    terminating = {pod.name for pod in loaded.pods if pod.terminating}
    taken = [r for r in candidates if not any(h.pod_name in terminating for h in r.hosts)]
    return tuple(taken)
