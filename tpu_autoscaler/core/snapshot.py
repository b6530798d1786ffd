"""The cluster as the policy sees it at one instant: slice shapes, the replicas of
each group with their hosts, pending demand, and the launch history that backoff
needs. Adapters build it from Kubernetes and the GCS; tests build it directly."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from operator import attrgetter
from typing import Any

from tpu_autoscaler.core.capacity import CapacitySignal
from tpu_autoscaler.core.demand import RESOURCE_EPSILON, Demand
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.resize import PodSize
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.core.units import Hosts


class ReplicaState(StrEnum):
    REQUESTED = "requested"
    """Counted in `replicas` but KubeRay has not created its pods yet."""
    PENDING = "pending"
    """Pods exist; not every host has a live Ray node yet."""
    RUNNING = "running"
    """Every host has a live Ray node."""
    DRAINING = "draining"
    """Being removed: its capacity is gone for planning."""


@dataclass(frozen=True, slots=True)
class Host:
    """One pod of a replica, and its Ray node once registered."""

    pod_name: str
    host_index: int
    node_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    idle_s: float = 0.0
    """How long Ray has seen this node idle; 0 while busy or not registered."""
    dead: bool = False
    """Pod failed, or its Ray node died."""
    registered_at_s: float | None = None
    """When the autoscaler first saw this host in Ray (None: not known, as in a
    snapshot file)."""
    size: PodSize | None = None
    """Its pod's CPU and memory and resize state, for a group that resizes in place."""

    @property
    def registered(self) -> bool:
        return self.node_id is not None and not self.dead

    @property
    def in_use(self) -> bool:
        """A Ray node that Ray does not report idle, or some of whose resources are
        taken."""
        return self.registered and (
            self.idle_s <= 0
            or any(self.available.get(k, 0.0) + RESOURCE_EPSILON < v for k, v in self.total.items())
        )


@dataclass(frozen=True, slots=True)
class Replica:
    """One slice: the pods KubeRay created for one replica of a worker group."""

    group: str
    name: str
    state: ReplicaState
    hosts: tuple[Host, ...] = ()
    created_at_s: float = 0.0
    """When its first pod was created (when it was requested, if it has none)."""
    slice_name: str | None = None
    """`TPU_NAME` of its pods (known before Ray registers them)."""
    identified: bool = True
    """False when its pods carry no replica name (KubeRay < 1.6 or the feature gate
    off): which pods form a slice is then unknown, so it is never removed."""
    outdated: bool = False
    """Launched from a configuration its group no longer has (Ray's
    `launch_config_hash` changed): replaced, as Ray does. Never on KubeRay."""
    last_pod_created_at_s: float | None = None
    """When its newest pod was created: KubeRay creates a replica's pods one API call
    at a time, so a replica with missing pods may still be being created."""
    memo: dict[object, object] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What the policy worked out from this replica alone, kept as long as it lives
    (`policy.scratch`): adapters keep the object of a replica that did not change from
    one round to the next, and most do not."""

    @property
    def came_up(self) -> bool:
        """A host of it registered with Ray, now or before: its capacity came."""
        came = self.memo.get(_CAME_UP)
        if came is None:
            came = self.memo[_CAME_UP] = any(
                h.registered or h.registered_at_s is not None for h in self.hosts
            )
        return came is True

    @property
    def all_registered(self) -> bool:
        """Every host it has is registered with Ray (`Host.registered`)."""
        registered = self.memo.get(_ALL_REGISTERED)
        if registered is None:
            registered = self.memo[_ALL_REGISTERED] = all(h.registered for h in self.hosts)
        return registered is True

    @property
    def least_idle_s(self) -> float:
        """How long its least idle host has been idle (0: one is busy or has no node);
        0 for a replica without hosts."""
        idle_s = self.memo.get(_LEAST_IDLE_S)
        if not isinstance(idle_s, float):
            idle_s = self.memo[_LEAST_IDLE_S] = float(
                min((h.idle_s for h in self.hosts), default=0.0)
            )
        return idle_s

    @property
    def dead_pods(self) -> list[str]:
        """The pods of its dead hosts (`Host.dead`); read-only."""
        dead = self.memo.get(_DEAD_PODS)
        if not isinstance(dead, list):
            dead = self.memo[_DEAD_PODS] = [h.pod_name for h in self.hosts if h.dead]
        return dead


class Remade:
    """`replace(obj, **{field: value})` for one field of a dataclass, made by position
    while every field `__init__` takes is taken by position (`replace` looks each up by
    name: about twice the cost, and a round remakes every new or changed replica and
    its hosts). A field added to the class is carried over like the others."""

    def __init__(self, cls: type[Any], name: str) -> None:
        taken = [f.name for f in fields(cls) if f.init]
        self.cls = cls
        self.name = name
        self.by_position = len(taken) > 1 and all(not f.kw_only for f in fields(cls) if f.init)
        self.values = attrgetter(*taken)
        self.at = taken.index(name)

    def __call__(self, obj: Any, value: Any) -> Any:
        if not self.by_position:
            return replace(obj, **{self.name: value})
        values = list(self.values(obj))
        values[self.at] = value
        return self.cls(*values)


_CAME_UP = "came up"
_ALL_REGISTERED = "all registered"
_LEAST_IDLE_S = "least idle s"
_DEAD_PODS = "dead pods"
"""`Replica.memo` keys of the facts the policy asks of every replica each pass."""


@dataclass(frozen=True, slots=True)
class LaunchFailures:
    """Consecutive provisioning timeouts of a group, for exponential backoff."""

    count: int
    last_failure_s: float

    @staticmethod
    def one_more(previous: LaunchFailures | None, now_s: float) -> LaunchFailures:
        """The failures after another provisioning timeout at `now_s`."""
        return LaunchFailures((previous.count if previous else 0) + 1, now_s)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    provisioning_timeout_s: float = 900.0
    joining_timeout_s: float = 300.0
    """How long after its first host joined Ray a pending replica may take for the
    rest, even past the provisioning timeout."""
    registration_settle_s: float = 10.0
    """How long after a host joins Ray its free capacity is taken as its total: Ray's
    report of pending demand lags its placements, so work being placed on the new host
    is counted both in its use and as still pending (seen on real raylets: a second
    slice launched 3 s after the first came up, for work the first could hold)."""
    creation_timeout_s: float = 60.0
    """How long after its newest pod a replica with missing pods is taken for one
    KubeRay is still creating, not for a broken one."""
    backoff_base_s: float = 30.0
    backoff_cap_s: float = 600.0
    conserve_gpu_nodes: bool = True
    """Rank groups with GPUs last for demand that uses no GPU, as Ray does unless
    AUTOSCALER_CONSERVE_GPU_NODES=0 (the adapters read Ray's setting)."""
    backoff_jitter: float = 0.2
    """Each backoff is stretched by up to this fraction, derived from the group and
    the failure count (pure, repeatable), so groups that failed together do not all
    retry in the same round."""
    gang_arrival_bound_s: float = 240.0
    """How long the slices of an all-or-nothing gang may take to arrive together: past
    it, the arrived ones are given back and the group backs off (not the 15-minute
    provisioning timeout)."""
    stockout_hold_s: float = 600.0
    """How long a stockout or quota signal keeps a group stocked out with no newer one."""
    churn_window_s: float = 1800.0
    """A group whose slices were preempted `churn_preemptions` times within this window
    of arriving is churning for this long after the last one."""
    churn_preemptions: int = 2

    def backoff_until(self, failures: LaunchFailures, group: str = "") -> float:
        """When `group` may launch again after `failures`: the base doubled per failure
        after the first, stretched by up to `backoff_jitter` (`jitter_fraction`), at most
        the cap."""
        delay = self.backoff_base_s * 2.0 ** max(0, failures.count - 1)
        stretch = 1.0 + self.backoff_jitter * jitter_fraction(group, failures.count)
        return failures.last_failure_s + min(self.backoff_cap_s, delay * stretch)


def jitter_fraction(group: str, failures: int) -> float:
    """A fraction in [0, 1) drawn from a hash of (group, failure count), not a random
    generator: the policy stays pure and repeatable, and groups that failed together
    still spread their retries."""
    digest = hashlib.blake2b(f"{group}/{failures}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    shapes: tuple[SliceShape, ...]
    replicas: tuple[Replica, ...]
    demand: Demand
    now_s: float
    launch_failures: Mapping[str, LaunchFailures] = field(default_factory=dict)
    config: PolicyConfig = field(default_factory=PolicyConfig)
    fixed_hosts: tuple[Host, ...] = ()
    """Live Ray nodes of the cluster that are no replica of a group: the head, and
    workers of groups the policy does not manage. Demand is packed on them first, as
    Ray packs existing nodes first; they are never launched or removed."""
    availability: Mapping[str, float] = field(default_factory=dict)
    """Per group, how likely a launch is to be allocated now, 0 to 1 (Ray's
    `cloud_resource_availabilities`: 0 for the type whose allocation timed out last;
    a group not listed: 1). Among equally good groups the more available wins."""
    max_worker_hosts: Hosts | None = None
    """The cluster-wide limit on worker hosts (Ray's `max_workers`; None: only each
    group's maxReplicas). Ray counts it in nodes, so it binds whole replicas here."""
    capacity_signals: tuple[CapacitySignal, ...] = ()
    """What the cluster said about groups' capacity (Events, node pools,
    preemptions), newest last; the policy derives each group's `GroupCapacity`."""
    capacity_returned_s: Mapping[str, float] = field(default_factory=dict)
    """Per group, when the newest launch seen to come up in earlier rounds was made
    (the shell carries it, as it does `launch_failures`): the replica that showed it
    may be gone since (preempted, removed as broken), yet the signals before it stay
    answered (`capacity_returned`)."""

    def shape(self, group: str) -> SliceShape | None:
        return next((s for s in self.shapes if s.group == group), None)

    def capacity_returned(self) -> dict[str, float]:
        """Per group, when the newest launch that then came up (a host registered) was
        made: signals up to then were answered by capacity. Remembered ones included."""
        returned = dict(self.capacity_returned_s)
        for replica in self.replicas:
            if replica.came_up:
                previous = returned.get(replica.group, float("-inf"))
                returned[replica.group] = max(previous, replica.created_at_s)
        return returned

    def after(self, plan: Plan) -> ClusterSnapshot:
        """This snapshot once the shell has carried out `plan`, before anything came
        up: removed replicas gone (what they showed of capacity remembered), launched
        ones requested (named as the Kubernetes adapter names replicas without pods),
        provisioning timeouts counted."""
        if not plan.terminate and not plan.launch:
            return self  # most rounds: nothing removed, launched or timed out
        removed = {t.replica for t in plan.terminate}
        replicas = [r for r in self.replicas if r.name not in removed]
        names = {r.name for r in replicas} if plan.launch else set()
        for launch in plan.launch:
            added = requested_replicas(launch.group, launch.replicas, names, self.now_s)
            names |= {r.name for r in added}
            replicas += added
        failures = dict(self.launch_failures)
        for t in plan.terminate:
            if t.provisioning_timeout:
                failures[t.group] = LaunchFailures.one_more(failures.get(t.group), self.now_s)
        return replace(
            self,
            replicas=tuple(replicas),
            launch_failures=failures,
            capacity_returned_s=self.capacity_returned() if removed else self.capacity_returned_s,
        )


def requested_replica_name(group: str, index: int) -> str:
    """The name of a replica counted in `replicas` whose pods do not exist yet."""
    return f"{group}-requested-{index}"


def requested_replicas(
    group: str, count: int, taken: Collection[str], now_s: float
) -> list[Replica]:
    """`count` replicas of `group` counted in `replicas` whose pods do not exist yet,
    named by the lowest free indexes (`requested_replica_name`)."""
    added: list[Replica] = []
    names = set(taken)
    index = 0
    for _ in range(max(0, count)):
        while requested_replica_name(group, index) in names:
            index += 1
        name = requested_replica_name(group, index)
        names.add(name)
        added.append(Replica(group, name, ReplicaState.REQUESTED, (), now_s))
    return added
