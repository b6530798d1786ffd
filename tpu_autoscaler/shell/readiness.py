"""When each slice came up whole: from its first pod's creation to its last host
registered with Ray, told once per replica (an Event on the RayCluster, with the
times as annotations `record` reads back, and a histogram per group).

What a platform team plans capacity with is how long its slices take to come up, and
Ray does not know when a slice's pods were created. The hosts' times are the rounds
that first saw them registered (up to one round late); `record` takes the hosts'
own start times from Ray instead and only the creation time from the Event.

A replica already whole in the first round after a (re)start is not told: it came up
before this process could see it, and telling it again would count it twice."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_autoscaler.core.capacity import ANNOTATION_PREFIX
from tpu_autoscaler.core.snapshot import ClusterSnapshot, ReplicaState

REPLICA_ANNOTATION = ANNOTATION_PREFIX + "replica"
GROUP_ANNOTATION = ANNOTATION_PREFIX + "group"
SLICE_ANNOTATION = ANNOTATION_PREFIX + "slice-name"
CREATED_ANNOTATION = ANNOTATION_PREFIX + "first-pod-created-at"
"""Unix seconds: when the replica's first pod was created (its launch, to KubeRay)."""
UP_AFTER_ANNOTATION = ANNOTATION_PREFIX + "up-after-seconds"


@dataclass(frozen=True, slots=True)
class ReplicaUp:
    """A replica whose hosts were all registered with Ray for the first time."""

    group: str
    replica: str
    slice_name: str | None
    hosts: int
    created_at_s: float
    """Its first pod's creation."""
    first_host_s: float
    last_host_s: float
    """When a round first saw its first and last host registered."""

    @property
    def up_s(self) -> float:
        """From its first pod's creation to its last host registered."""
        return self.last_host_s - self.created_at_s

    def message(self) -> str:
        return (
            f"replica {self.replica} of {self.group} up: {self.hosts} host(s) registered "
            f"with Ray {self.up_s:.0f} s after its first pod was created (first host at "
            f"{self.first_host_s - self.created_at_s:.0f} s)"
        )

    def annotations(self) -> dict[str, str]:
        told = {
            REPLICA_ANNOTATION: self.replica,
            GROUP_ANNOTATION: self.group,
            CREATED_ANNOTATION: f"{self.created_at_s:.3f}",
            UP_AFTER_ANNOTATION: f"{self.up_s:.3f}",
        }
        if self.slice_name is not None:
            told[SLICE_ANNOTATION] = self.slice_name
        return told


class ReadinessWatch:
    """Which replicas have been told (or were whole when this process first looked),
    as far as they still exist."""

    def __init__(self) -> None:
        self._told: set[str] | None = None
        """None until the first round: what is whole then is taken as told."""

    def came_up(self, snapshot: ClusterSnapshot) -> list[ReplicaUp]:
        """The replicas whole in `snapshot` and not told before, each told now."""
        hosts_per_replica = {s.group: s.hosts_per_replica for s in snapshot.shapes}
        present: set[str] = set()
        ups: list[ReplicaUp] = []
        first_round = self._told is None
        told = self._told if self._told is not None else set()
        for replica in snapshot.replicas:
            present.add(replica.name)
            if replica.name in told or replica.state is not ReplicaState.RUNNING:
                continue
            times_s = [h.registered_at_s for h in replica.hosts if not h.dead]
            if (
                len(times_s) != hosts_per_replica.get(replica.group)
                or not replica.identified
                or any(t is None for t in times_s)
            ):
                continue
            told.add(replica.name)
            if first_round:
                continue
            registered_s = [t for t in times_s if t is not None]
            ups.append(
                ReplicaUp(
                    replica.group,
                    replica.name,
                    replica.slice_name,
                    len(registered_s),
                    replica.created_at_s,
                    min(registered_s),
                    max(registered_s),
                )
            )
        told &= present  # a name gone may come back as another slice (KubeRay draws names)
        self._told = told
        return ups
