"""Which replicas are broken and go whole, and which are merely young.

A replica with a dead host, or with fewer pods than `numOfHosts` once KubeRay is done
creating them, can never run a slice-wide job; one pending past its deadline has
failed to provision, which also backs its group off, as does a gang's slice that did
not come with its siblings (`gang_arrival`). A replica KubeRay is still
creating (it POSTs the pods one at a time), or whose hosts are joining Ray one by
one, is neither."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpu_autoscaler.core.plan import RemovalCause, Terminate
from tpu_autoscaler.core.policy.gang_arrival import incomplete_gangs
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    LaunchFailures,
    PolicyConfig,
    Replica,
    ReplicaState,
)

if TYPE_CHECKING:  # the roster reads what this check keeps (`SOUND_HOSTS`)
    from tpu_autoscaler.core.policy.roster import Roster


@dataclass(frozen=True, slots=True)
class Health:
    removals: tuple[Terminate, ...]
    backoff_until: Mapping[str, float]
    """Groups backing off launches after provisioning timeouts, until when."""
    timed_out: frozenset[str] = frozenset()
    """The replicas among `removals` pending past their provisioning deadline (not a
    gang's late slices): a told stockout explains the wait of those of a stocked-out
    group, which then stay while demand waits on them (`Pass`)."""


def check(
    snapshot: ClusterSnapshot, shapes: Mapping[str, SliceShape], roster: Roster | None = None
) -> Health:
    """`roster`: the snapshot's (`Roster`), if the caller has it: only the replicas it
    does not know sound are looked at."""
    config = snapshot.config
    now = snapshot.now_s
    removals: list[Terminate] = []
    backoff: dict[str, float] = {}
    timed_out_names: set[str] = set()
    for replica in snapshot.replicas if roster is None else roster.unsound:
        shape = shapes.get(replica.group)
        if shape is None:
            continue
        expected = shape.hosts_per_replica
        sound_hosts = replica.memo.get(SOUND_HOSTS)
        if isinstance(sound_hosts, int) and sound_hosts >= expected:
            continue  # most replicas: whole, running and alive, whatever the time
        if replica.state is ReplicaState.DRAINING or not replica.identified:
            continue
        dead = replica.dead_pods
        reason = None
        timed_out = False
        if dead:
            reason = f"host(s) {', '.join(dead)} dead; a slice is only usable whole"
        elif (
            replica.state is not ReplicaState.REQUESTED
            and len(replica.hosts) < expected
            and not being_created(replica, config, now)
        ):
            reason = f"has {len(replica.hosts)} of {expected} hosts; a partial slice is unusable"
        elif replica.state is ReplicaState.PENDING and now >= provisioning_deadline(
            replica, config
        ):
            if len(replica.hosts) > expected and any(
                h.in_use or (h.registered and h.idle_s <= shape.idle_timeout_s)
                for h in replica.hosts
            ):
                # Two slices under one name (KubeRay reused it): the newer one failed
                # to come, but removing it names the replica and KubeRay deletes the
                # older one with it. It waits for that one's work to end and its idle
                # timeout to pass, as an idle slice would, holding no chips and
                # counting as no capacity (the scratch sees the older slice's hosts
                # only); a stockout it met blocks the group by its Events.
                continue
            failures = LaunchFailures.one_more(snapshot.launch_failures.get(replica.group), now)
            backoff[replica.group] = config.backoff_until(failures, replica.group)
            reason = (
                f"pending {now - replica.created_at_s:.0f}s, past the "
                f"{config.provisioning_timeout_s:.0f}s provisioning timeout"
            )
            timed_out = True
            timed_out_names.add(replica.name)
        if reason is not None:
            pods = tuple(h.pod_name for h in replica.hosts)
            cause = RemovalCause.PROVISIONING_TIMEOUT if timed_out else RemovalCause.UNHEALTHY
            removals.append(Terminate(replica.group, replica.name, pods, reason, cause))
        elif replica.state is ReplicaState.RUNNING:
            replica.memo[SOUND_HOSTS] = len(replica.hosts)
    removed = {t.replica for t in removals}
    for gone in incomplete_gangs(
        snapshot,
        shapes,
        removed,
        frozenset(timed_out_names),
        None if roster is None else roster.pending,
    ):
        removals.append(gone)
        if gone.provisioning_timeout and gone.group not in backoff:
            failures = LaunchFailures.one_more(snapshot.launch_failures.get(gone.group), now)
            backoff[gone.group] = config.backoff_until(failures, gone.group)
    for group, failures in snapshot.launch_failures.items():
        if group in shapes and group not in backoff:
            until = config.backoff_until(failures, group)
            if until > now:
                backoff[group] = until
    return Health(tuple(removals), backoff, frozenset(timed_out_names))


SOUND_HOSTS = "sound hosts"
"""`Replica.memo` key: for a running replica with no dead host, how many hosts it
has. Its check passes for any shape of at most that many hosts at any time (only a
pending replica times out, only a short one may be still being created), so the next
check of the same object skips it (a third of the check at 1,024 slices)."""


def provisioning_deadline(replica: Replica, config: PolicyConfig) -> float:
    """When a pending replica has waited too long: the provisioning timeout after its
    creation, or, once its capacity came and hosts joined Ray, the joining timeout
    after the first did (pods turn Running one by one; a slice coming up as a
    stockout ends is not a failed launch)."""
    deadline = replica.created_at_s + config.provisioning_timeout_s
    joined = [h.registered_at_s for h in replica.hosts if h.registered_at_s is not None]
    if joined:
        deadline = max(deadline, min(joined) + config.joining_timeout_s)
    return deadline


def being_created(replica: Replica, config: PolicyConfig, now_s: float) -> bool:
    """KubeRay is still adding pods to it: none has failed or registered with Ray and
    the newest is younger than the creation timeout."""
    newest = replica.last_pod_created_at_s
    return (
        newest is not None
        and now_s - newest < config.creation_timeout_s
        and not any(h.registered for h in replica.hosts)
    )


def settling(replica: Replica, config: PolicyConfig, now_s: float) -> bool:
    """A host of the replica joined Ray in the last `registration_settle_s`: its hosts
    offer their total, not what Ray reports free. Ray reports pending demand later
    than it places it, and work that needs the new host (a gang across the slice)
    lands on all of them at once, so their use may be that pending demand."""
    joined_s = last_joined_s(replica)
    return joined_s is not None and now_s - joined_s < config.registration_settle_s


def last_joined_s(replica: Replica) -> float | None:
    """When its newest host joined Ray; None if none has."""
    return max(
        [h.registered_at_s for h in replica.hosts if h.registered_at_s is not None],
        default=None,
    )
