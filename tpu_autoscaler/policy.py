"""The slice scheduling policy: a cluster snapshot in, a plan of whole replicas out.

Pure: no I/O, no clock (time is `snapshot.now_s`), no Ray or Kubernetes. One pass:
1. replicas with a dead or missing host, or pending past the provisioning timeout,
   are removed whole (a timeout also starts the group's backoff);
2. groups below minReplicas are topped up;
3. gangs, then tasks and actors, are placed on free capacity of running, pending and
   requested replicas; what does not fit launches whole replicas of the group that
   needs the fewest chips (`expander.py`), within maxReplicas, backoff and the
   upscaling mode; what cannot be launched is reported, never dropped;
4. `request_resources` bundles are placed on total capacity the same way;
5. running replicas whose every host has been idle past the group's timeout, and on
   which step 3 and 4 placed nothing, are removed down to minReplicas.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from tpu_autoscaler import exact, expander
from tpu_autoscaler.demand import (
    Bundle,
    ClusterConstraint,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    pinned_slice,
)
from tpu_autoscaler.expander import Option
from tpu_autoscaler.placement import HostCapacity, SlotReplica, World, fresh_hosts
from tpu_autoscaler.plan import Launch, Plan, Terminate, Unmet
from tpu_autoscaler.shapes import SliceShape
from tpu_autoscaler.snapshot import ClusterSnapshot, LaunchFailures, Replica, ReplicaState
from tpu_autoscaler.units import Replicas

_MAX_ROUNDS = 4


def plan(snapshot: ClusterSnapshot) -> Plan:
    """The whole-replica scaling plan for `snapshot`.

    A pass decides launches while it places demand, so a small bundle may land on a
    replica launched for a bigger one that comes later. The plan is therefore
    settled: passes repeat on the snapshot as it will be once the launches so far are
    requested, until one launches nothing. Re-planning the resulting cluster then
    launches nothing more."""
    with _collector_paused():
        return _settle(snapshot)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A pass allocates many small objects that live until it ends; Python's cyclic
    collector would rescan the whole snapshot for them again and again (a third of
    the time at 16,384 hosts). Nothing a pass makes outlives it but the plan."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _settle(snapshot: ClusterSnapshot) -> Plan:
    current = snapshot
    kinds = _GangKinds()
    launched: dict[str, list[Launch]] = {}
    terminated: list[Terminate] = []
    for _ in range(_MAX_ROUNDS):
        result = _Pass(current, kinds).run()
        terminated.extend(result.terminate)
        for launch in result.launch:
            launched.setdefault(launch.group, []).append(launch)
        if not result.launch:
            break
        current = current.after(result)
    launches = tuple(
        Launch(
            group,
            Replicas(sum(x.replicas for x in items)),
            "; ".join(_dedupe([x.reason for x in items])),
        )
        for group, items in launched.items()
    )
    return replace(result, launch=launches, terminate=tuple(terminated))


@dataclass
class _GroupState:
    shape: SliceShape
    existing: int = 0
    """Replicas that count toward maxReplicas: all but those removed this pass."""
    healthy: int = 0
    """Replicas that count toward minReplicas: existing and not draining."""
    running: int = 0
    in_flight: int = 0
    """Requested or pending: launched earlier, not up yet."""
    new: int = 0
    launch_reasons: Counter[str] = field(default_factory=Counter)
    backoff_until: float | None = None

    @property
    def headroom(self) -> int:
        return max(0, self.shape.max_replicas - self.existing - self.new)

    def rate_limit(self) -> int | None:
        """Conservative mode: replicas in flight (earlier and new) at most as many as
        running ones, at least one, so a slow provisioner is not flooded."""
        if self.shape.upscaling_mode != "Conservative":
            return None
        return max(0, max(1, self.running) - self.in_flight - self.new)


class _GangKinds:
    """Gang kinds as small ints, their order and text: shared by the passes of one
    plan, which see the same demand."""

    def __init__(self) -> None:
        self.ids: dict[object, int] = {}
        self.of_gang: dict[int, int] = {}
        self.examples: dict[int, GangDemand] = {}
        self.orders: dict[int, tuple[int, int, float, int, str]] = {}
        self.texts: dict[int, str] = {}


class _Pass:
    def __init__(self, snapshot: ClusterSnapshot, kinds: _GangKinds | None = None) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now_s
        self.groups: dict[str, _GroupState] = {s.group: _GroupState(s) for s in snapshot.shapes}
        self.terminate: list[Terminate] = []
        self.removed: set[str] = set()
        self.infeasible: list[Unmet] = []
        self.waiting: list[Unmet] = []
        self.world = World()
        self.capacity_world = World()
        """Total capacity, for `request_resources`; built only when there are any."""
        self.constrained = bool(snapshot.demand.constraints)
        self.slice_names: set[str] = set()
        self.bundles_placed = 0
        self.bundles_unmet = 0
        self._copies_cache: dict[tuple[str, object], int] = {}
        self._launches = 0
        self._new_names = itertools.count()
        self.kinds = kinds or _GangKinds()
        self._deferred: list[ResourceDemand | GangDemand] = []
        self._deferred_reasons: dict[int, tuple[list[str], list[str]]] = {}
        self._hopeless: dict[int, tuple[int, list[str], list[str]]] = {}
        """Gang kinds that found no option, and the launch count then: capacity only
        shrinks between launches, so an identical gang cannot fare better until one."""

    # --- the pass -----------------------------------------------------------------

    def run(self) -> Plan:
        self._remove_unhealthy()
        self._build_worlds()
        self._top_up_min_replicas()
        demand = self.snapshot.demand
        if not self._serve_exactly():
            self._serve_gangs(demand.gangs)
            for request in sorted(demand.resources, key=lambda r: _bundle_order(r.bundle)):
                self._serve_count(request)
            self._serve_deferred()
        for constraint in demand.constraints:
            self._serve_constraint(constraint)
        self._remove_idle()
        launches = tuple(
            Launch(g.shape.group, Replicas(g.new), _count_reasons(g.launch_reasons))
            for g in self.groups.values()
            if g.new
        )
        return Plan(
            launches,
            tuple(self.terminate),
            tuple(self.infeasible),
            tuple(self.waiting),
            bundles_placed=self.bundles_placed,
            bundles_unmet=self.bundles_unmet,
        )

    # --- health -------------------------------------------------------------------

    def _remove_unhealthy(self) -> None:
        config = self.snapshot.config
        for replica in self.snapshot.replicas:
            state = self.groups.get(replica.group)
            if state is None or replica.state is ReplicaState.DRAINING or not replica.identified:
                continue
            expected = state.shape.hosts_per_replica
            dead = [h.pod_name for h in replica.hosts if h.dead]
            reason = None
            timed_out = False
            if dead:
                reason = f"host(s) {', '.join(dead)} dead; a slice is only usable whole"
            elif (
                replica.state is not ReplicaState.REQUESTED
                and len(replica.hosts) < expected
                and not self._being_created(replica)
            ):
                reason = (
                    f"has {len(replica.hosts)} of {expected} hosts; a partial slice is unusable"
                )
            elif replica.state is ReplicaState.PENDING and self.now >= self._provisioning_deadline(
                replica
            ):
                waited = self.now - replica.created_at_s
                reason = (
                    f"pending {waited:.0f}s, past the {config.provisioning_timeout_s:.0f}s "
                    "provisioning timeout"
                )
                previous = self.snapshot.launch_failures.get(replica.group)
                failures = LaunchFailures((previous.count if previous else 0) + 1, self.now)
                state.backoff_until = config.backoff_until(failures)
                timed_out = True
            if reason is not None:
                self._remove(replica, reason, timed_out)
        for group, failures in self.snapshot.launch_failures.items():
            state = self.groups.get(group)
            if state is not None and state.backoff_until is None:
                until = config.backoff_until(failures)
                if until > self.now:
                    state.backoff_until = until

    def _provisioning_deadline(self, replica: Replica) -> float:
        """When a pending replica has waited too long: the provisioning timeout after
        its creation, or, once its capacity came and hosts joined Ray, the joining
        timeout after the first did (pods turn Running one by one; a slice coming up
        as a stockout ends is not a failed launch)."""
        config = self.snapshot.config
        deadline = replica.created_at_s + config.provisioning_timeout_s
        joined = [h.registered_at_s for h in replica.hosts if h.registered_at_s is not None]
        if joined:
            deadline = max(deadline, min(joined) + config.joining_timeout_s)
        return deadline

    def _being_created(self, replica: Replica) -> bool:
        """KubeRay is still adding pods to it: none has failed or registered with Ray
        and the newest is younger than the creation timeout."""
        newest = replica.last_pod_created_at_s
        return (
            newest is not None
            and self.now - newest < self.snapshot.config.creation_timeout_s
            and not any(h.registered for h in replica.hosts)
        )

    def _remove(
        self, replica: Replica, reason: str, timed_out: bool = False, idle: bool = False
    ) -> None:
        self.removed.add(replica.name)
        pods = tuple(h.pod_name for h in replica.hosts)
        self.terminate.append(Terminate(replica.group, replica.name, pods, reason, timed_out, idle))

    # --- the scratch worlds -----------------------------------------------------------

    def _build_worlds(self) -> None:
        order = {ReplicaState.RUNNING: 0, ReplicaState.PENDING: 1, ReplicaState.REQUESTED: 2}
        usable = []
        for replica in self.snapshot.replicas:
            state = self.groups.get(replica.group)
            if state is None or replica.name in self.removed:
                continue
            state.existing += 1
            if replica.state is ReplicaState.DRAINING:
                continue
            state.healthy += 1
            state.running += replica.state is ReplicaState.RUNNING
            state.in_flight += replica.state in (ReplicaState.REQUESTED, ReplicaState.PENDING)
            usable.append(replica)
            if replica.slice_name:
                self.slice_names.add(replica.slice_name)
        usable.sort(key=lambda r: (order[r.state], r.created_at_s, r.name))
        for replica in usable:
            shape = self.groups[replica.group].shape
            real = {h.host_index: h for h in replica.hosts if h.registered}
            settling = self._settling(replica)
            if len(real) == shape.hosts_per_replica:
                hosts = [
                    (h.labels, h.total, h.total if settling else h.available)
                    for _, h in sorted(real.items())
                ]
            else:
                # Hosts not up yet count at full capacity with the labels Ray will give them.
                synthesized = self._synthesized(shape, replica.slice_name)
                hosts = [
                    (
                        real[i].labels,
                        real[i].total,
                        real[i].total if settling else real[i].available,
                    )
                    if i in real
                    else host
                    for i, host in enumerate(synthesized)
                ]
            self.world.add_replica(
                SlotReplica(replica.group, replica.name, False, replica.slice_name), hosts
            )
            if self.constrained:
                capacity = [(labels, total, total) for labels, total, _ in hosts]
                self.capacity_world.add_replica(
                    SlotReplica(replica.group, replica.name, False, replica.slice_name), capacity
                )

    def _settling(self, replica: Replica) -> bool:
        """A host of the replica joined Ray in the last `registration_settle_s`: its
        hosts offer their total, not what Ray reports free. Ray reports pending demand
        later than it places it, and work that needs the new host (a gang across the
        slice) lands on all of them at once, so their use may be that pending demand."""
        joined = [h.registered_at_s for h in replica.hosts if h.registered_at_s is not None]
        settle_s = self.snapshot.config.registration_settle_s
        return bool(joined) and self.now - max(joined) < settle_s

    def _synthesized(self, shape: SliceShape, slice_name: str | None) -> list[HostCapacity]:
        """The hosts of a replica not up yet, with the slice name the webhook gave it."""
        if slice_name is not None:
            return fresh_hosts(shape, slice_name)
        return self.world.fresh(shape)

    def _launch(self, group: str, count: int, reason: str, times: int = 1) -> list[SlotReplica]:
        state = self.groups[group]
        added = []
        for _ in range(count):
            name = f"{group}+new{next(self._new_names)}"
            added.append(self.world.add_new_replica(state.shape, name))
            if self.constrained:
                added.append(self.capacity_world.add_new_replica(state.shape, name))
            state.new += 1
        self._launches += 1
        state.launch_reasons[reason] += times
        return added

    def _withdraw(
        self, group: str, replicas: list[SlotReplica], reason: str, per_batch: int
    ) -> None:
        """Take back launches nothing was placed on: they keep no capacity."""
        unused = {r.name for r in replicas} - {r.name for r in replicas if r.used}
        if not unused:
            return
        for replica in replicas:
            if replica.name in unused:
                for host in replica.hosts:
                    host.free = {}
        state = self.groups[group]
        state.new -= len(unused)
        state.launch_reasons[reason] -= len(unused) // per_batch
        state.launch_reasons += Counter()  # drops reasons counted down to zero

    # --- minReplicas ----------------------------------------------------------------

    def _top_up_min_replicas(self) -> None:
        for state in self.groups.values():
            missing = state.shape.min_replicas - state.healthy
            if missing > 0:
                self._launch(
                    state.shape.group,
                    min(missing, state.headroom),
                    f"minReplicas {state.shape.min_replicas}, has {state.healthy}",
                )

    # --- options --------------------------------------------------------------------

    def _limit(self, state: _GroupState) -> tuple[int, str | None]:
        """How many more replicas the group may launch now, and why not more."""
        if state.backoff_until is not None and state.backoff_until > self.now:
            return 0, (
                f"{state.shape.group} backs off after provisioning timeouts until "
                f"t={state.backoff_until:.0f}s; waiting on capacity"
            )
        limit, why = (
            state.headroom,
            f"{state.shape.group} at maxReplicas {state.shape.max_replicas}",
        )
        rate = state.rate_limit()
        if rate is not None and rate < limit:
            limit, why = (
                rate,
                f"{state.shape.group} upscales Conservatively "
                f"(at most {max(1, state.running)} new per round)",
            )
        return limit, why

    def _count_options(
        self, bundle: Bundle, count: int
    ) -> tuple[list[Option], list[str], list[str]]:
        options: list[Option] = []
        blocked: list[str] = []
        never: list[str] = []
        for state in self.groups.values():
            shape = state.shape
            per_replica = self._copies(shape, bundle)
            if per_replica == 0:
                never.append(expander.why_not(shape, bundle))
                continue
            if shape.max_replicas == 0:
                never.append(f"{shape.group} has maxReplicas 0")
                continue
            limit, why = self._limit(state)
            if limit == 0:
                blocked.append(why or shape.group)
                continue
            needed = math.ceil(count / per_replica)
            replicas = min(needed, limit)
            options.append(
                Option(
                    shape.group,
                    replicas,
                    replicas * shape.chips_per_replica,
                    shape.priority,
                    f"{replicas} x {shape.group} ({per_replica} per replica)",
                )
            )
        return options, blocked, never

    # --- serving demand ---------------------------------------------------------------

    def _serve_count(self, request: ResourceDemand) -> None:
        bundle = request.bundle
        if self._pinned_to_missing_slice(bundle, request, request.count):
            return
        remaining = self.world.place_count(bundle, request.count)
        self.bundles_placed += request.count - remaining
        while remaining:
            options, blocked, never = self._count_options(bundle, remaining)
            chosen = expander.best_option(options)
            if chosen is None:
                self._unmet(ResourceDemand(bundle, remaining), blocked, never, remaining)
                return
            self._launch(
                chosen.group,
                chosen.replicas,
                f"{remaining} x {bundle}: {expander.describe_options(options, chosen)}",
            )
            after = self.world.place_count(bundle, remaining)
            self.bundles_placed += remaining - after
            if after == remaining:  # cannot happen unless shapes lie; never loop forever
                self._unmet(
                    ResourceDemand(bundle, remaining),
                    [f"{chosen.group} launched but did not fit"],
                    [],
                    remaining,
                )
                return
            remaining = after

    def _serve_exactly(self) -> bool:
        """Small demand is placed by exhaustive search over launch counts in cost
        order, so it gets the fewest chips; False (nothing changed) when the demand is
        not small, or cannot be served whole within the groups' limits."""
        demand = self.snapshot.demand
        items = [
            exact.Item(g.bundles, g.strategy if g.strategy in _STRICT else None)
            for g in demand.gangs
        ] + [
            exact.Item((r.bundle,))
            for r in demand.resources
            for _ in range(min(r.count, exact.MAX_BUNDLES + 1))
        ]
        bundles = [b for item in items for b in item.bundles]
        if (
            not bundles
            or len(bundles) > exact.MAX_BUNDLES
            or len(self.world.hosts) > exact.MAX_HOSTS
        ):
            return False
        if any(b.head_resource or pinned_slice(b.selector) is not None for b in bundles):
            return False
        budget = exact.Budget()
        for vector in self._launch_vectors(bundles):
            mark = len(self.world.replicas)
            for group, count in vector:
                for i in range(count):
                    self.world.add_new_replica(self.groups[group].shape, f"{group}+trial{i}")
            try:
                found = len(self.world.hosts) <= exact.MAX_HOSTS and exact.assign(
                    self.world.hosts, items, budget
                )
            except exact.SearchTooLong:
                self.world.remove_replicas_from(mark)
                return False
            self.world.remove_replicas_from(mark)
            if not found:
                continue
            wanted = "; ".join([str(r) for r in demand.resources] + [str(g) for g in demand.gangs])
            for group, count in vector:
                if count:
                    self._launch(
                        group,
                        count,
                        f"{wanted}: {count} x {group}, the fewest chips (exhaustive search)",
                    )
            assignment = exact.assign(self.world.hosts, items)
            assert assignment is not None  # the same search on the same hosts
            for bundle, host in assignment:
                self.world.take(host, bundle.resources)
            self.bundles_placed += len(bundles)
            return True
        return False

    def _launch_vectors(self, bundles: list[Bundle]) -> list[tuple[tuple[str, int], ...]]:
        """Launch counts per group to try, cheapest first (chips, replicas, priority)."""
        ranges = []
        for state in self.groups.values():
            if any(self._copies(state.shape, b) for b in bundles):
                top = min(self._limit(state)[0], len(bundles))
                ranges.append([(state.shape.group, k) for k in range(top + 1)])
        vectors = [()] if not ranges else list(itertools.product(*ranges))
        if len(vectors) > _MAX_EXACT_VECTORS:
            return []

        def cost(vector: tuple[tuple[str, int], ...]) -> tuple[int, int, int, tuple[str, ...]]:
            chips = sum(k * self.groups[g].shape.chips_per_replica for g, k in vector)
            priority = sum(k * self.groups[g].shape.priority for g, k in vector)
            return (chips, sum(k for _, k in vector), -priority, tuple(g for g, k in vector if k))

        return sorted(vectors, key=cost)

    def _serve_gangs(self, gangs: Sequence[GangDemand]) -> None:
        """Gangs in order, each kind in one run (see `_serve_run`)."""
        with_kinds = [(self._kind_id(g), i, g) for i, g in enumerate(gangs)]
        keyed = sorted(((self._kind_order(k), g.gang_id, i), k, g) for k, i, g in with_kinds)
        start = 0
        while start < len(keyed):
            end = start + 1
            while end < len(keyed) and keyed[end][1] == keyed[start][1]:
                end += 1
            self._serve_run([g for _, _, g in keyed[start:end]])
            start = end

    def _serve_run(self, run: Sequence[GangDemand]) -> None:
        """Gangs of one kind. Once one needs a launch, the rest grow in one step: as
        many more launches as the gangs the first launch held leave unserved, within
        the group's limits. Once one can be neither placed nor launched for, neither
        can the rest (capacity only shrinks between launches): they wait with it."""
        i = 0
        while i < len(run):
            gang = run[i]
            launches = self._launches
            outcome = self._serve_gang(gang)
            i += 1
            if outcome is _DEFERRED and self._launches == launches:
                blocked, never = self._deferred_reasons[id(gang)]
                for rest in run[i:]:
                    self._unmet(rest, blocked, never, len(rest.bundles))
                return
            if not isinstance(outcome, tuple):
                continue
            group, replicas, reason = outcome
            held = 1
            while i < len(run) and self.world.place_gang(run[i]):
                self.bundles_placed += len(run[i].bundles)
                held += 1
                i += 1
            batches = min(
                math.ceil((len(run) - i) / held), self._limit(self.groups[group])[0] // replicas
            )
            if batches > 0:
                # Later gangs may share what is left over: launch for all of them at
                # once, then take back what they did not use.
                batch = self._launch(group, batches * replicas, reason, times=batches)
                while i < len(run):
                    launches = self._launches
                    outcome = self._serve_gang(run[i])
                    i += 1
                    if outcome is _DEFERRED and self._launches == launches:
                        blocked, never = self._deferred_reasons[id(run[i - 1])]
                        for rest in run[i:]:
                            self._unmet(rest, blocked, never, len(rest.bundles))
                        i = len(run)
                self._withdraw(group, batch, reason, replicas)

    def _serve_gang(self, gang: GangDemand) -> tuple[str, int, str] | object | None:
        """Place `gang`, launching for it if need be. Returns the launch (group,
        replicas, reason) if one group's launch made it fit, `_DEFERRED` if it got no
        capacity, else None."""
        size = len(gang.bundles)
        if any(self._pinned_to_missing_slice(b, gang, size) for b in gang.bundles[:1]):
            return None
        if self.world.place_gang(gang):
            self.bundles_placed += size
            return None
        kind = self._kind_id(gang)
        known = self._hopeless.get(kind)
        if known is not None and known[0] == self._launches:
            self._unmet(gang, known[1], known[2], size)
            return _DEFERRED
        options: list[Option] = []
        blocked: list[str] = []
        never: list[str] = []
        for state in self.groups.values():
            shape = state.shape
            servable = [b for b in gang.bundles if self._copies(shape, b)]
            if not servable:
                continue
            if len(servable) < size and not all(
                self._copies(shape, b) or self._fits_existing(b) for b in gang.bundles
            ):
                continue
            # Search as if the group were empty, to tell "never" from "not now".
            ceiling = min(shape.max_replicas, size)
            needed = self._replicas_for_gang(gang, state, ceiling)
            if needed is None:
                never.append(
                    f"{shape.group} cannot hold it with {ceiling} new replica(s) "
                    f"(maxReplicas {shape.max_replicas})"
                )
                continue
            limit, why = self._limit(state)
            if needed > limit:
                blocked.append(why or shape.group)
                continue
            options.append(
                Option(
                    shape.group,
                    needed,
                    needed * shape.chips_per_replica,
                    shape.priority,
                    f"{needed} x {shape.group}",
                )
            )
        chosen = expander.best_option(options)
        if chosen is not None:
            reason = f"placement group ({self._kind_text(gang)}): " + expander.describe_options(
                options, chosen
            )
            self._launch(chosen.group, chosen.replicas, reason)
            if self.world.place_gang(gang):
                self.bundles_placed += size
                return (chosen.group, chosen.replicas, reason)
        elif not blocked and self._serve_gang_across_groups(gang):
            self.bundles_placed += size
            return None
        if not blocked and not never:
            never = [
                expander.why_not(s.shape, b) for s in self.groups.values() for b in gang.bundles[:1]
            ]
        self._hopeless[kind] = (self._launches, blocked, never)
        self._unmet(gang, blocked, never, size)
        return _DEFERRED

    def _serve_gang_across_groups(self, gang: GangDemand) -> bool:
        """A gang whose bundles need different groups (say a CPU driver bundle beside
        TPU workers): launch, per group, what its own bundles need; keep it only if
        the whole gang then fits."""
        wanted: dict[str, list[Bundle]] = {}
        for bundle in gang.bundles:
            if self._fits_existing(bundle):
                continue
            options, _, _ = self._count_options(bundle, 1)
            chosen = expander.best_option(options)
            if chosen is None:
                return False
            wanted.setdefault(chosen.group, []).append(bundle)
        # Grow every group's share in step until the gang fits or a limit is hit.
        launches = dict.fromkeys(wanted, 1)
        while True:
            if any(count > self._limit(self.groups[group])[0] for group, count in launches.items()):
                return False
            mark = len(self.world.replicas)
            for group, count in launches.items():
                for i in range(count):
                    self.world.add_new_replica(self.groups[group].shape, f"{group}+trial{i}")
            fits = self.world.gang_fits(gang)
            self.world.remove_replicas_from(mark)
            if fits:
                break
            growable = [g for g, count in launches.items() if count < len(wanted[g])]
            if not growable:
                return False
            for group in growable:
                launches[group] += 1
        for group, count in launches.items():
            self._launch(
                group,
                count,
                f"placement group ({self._kind_text(gang)}): {count} x {group} for its bundles",
            )
        return self.world.place_gang(gang)

    def _kind_id(self, gang: GangDemand) -> int:
        """A small number per gang kind, so that runs and memos compare ints."""
        kinds = self.kinds
        kind = kinds.of_gang.get(id(gang))
        if kind is None:
            kind = kinds.ids.setdefault(gang.kind, len(kinds.ids))
            kinds.of_gang[id(gang)] = kind
            kinds.examples.setdefault(kind, gang)
        return kind

    def _kind_order(self, kind: int) -> tuple[int, int, float, int, str]:
        """Slice heads, then the most constrained gangs, then the largest, each kind
        together: soft gangs placed last can fill the gaps the strict ones leave."""
        order = self.kinds.orders.get(kind)
        if order is None:
            gang = self.kinds.examples[kind]
            tpu = sum(b.resources.get("TPU", 0.0) for b in gang.bundles)
            head = 0 if gang.is_slice_head else 1
            strictness = _STRICTNESS[gang.strategy]
            order = (head, strictness, -tpu, -len(gang.bundles), self._kind_text(gang))
            self.kinds.orders[kind] = order
        return order

    def _kind_text(self, gang: GangDemand) -> str:
        kind = self._kind_id(gang)
        text = self.kinds.texts.get(kind)
        if text is None:
            text = self.kinds.texts[kind] = self.kinds.examples[kind].kind_text()
        return text

    def _copies(self, shape: SliceShape, bundle: Bundle) -> int:
        key = (shape.group, bundle.key)
        copies = self._copies_cache.get(key)
        if copies is None:
            copies = self._copies_cache[key] = expander.copies_per_replica(shape, bundle)
        return copies

    def _fits_existing(self, bundle: Bundle) -> bool:
        return self.world.first_fit(bundle) is not None

    def _replicas_for_gang(self, gang: GangDemand, state: _GroupState, bound: int) -> int | None:
        """Fewest new replicas of the group with which the gang fits, up to `bound`."""
        if bound <= 0:
            return None

        def fits_with(k: int) -> bool:
            mark = len(self.world.replicas)
            for i in range(k):
                self.world.add_new_replica(state.shape, f"{state.shape.group}+trial{i}")
            ok = self.world.gang_fits(gang)
            self.world.remove_replicas_from(mark)
            return ok

        low, high = 0, 1
        while not fits_with(high):
            if high >= bound:
                return None
            low, high = high, min(bound, high * 2)
        while high - low > 1:
            mid = (low + high) // 2
            if fits_with(mid):
                high = mid
            else:
                low = mid
        return high

    def _serve_constraint(self, constraint: ClusterConstraint) -> None:
        counts = Counter(b.key for b in constraint.bundles)
        bundles = {b.key: b for b in constraint.bundles}
        for key, count in sorted(counts.items(), key=lambda kv: _bundle_order(bundles[kv[0]])):
            bundle = bundles[key]
            remaining = self.capacity_world.place_count(bundle, count)
            self.bundles_placed += count - remaining
            while remaining:
                options, blocked, never = self._count_options(bundle, remaining)
                chosen = expander.best_option(options)
                if chosen is None:
                    self._unmet(ClusterConstraint((bundle,) * remaining), blocked, never, remaining)
                    break
                self._launch(chosen.group, chosen.replicas, f"{constraint}: {chosen.debug}")
                after = self.capacity_world.place_count(bundle, remaining)
                self.bundles_placed += remaining - after
                if after == remaining:
                    self._unmet(
                        ClusterConstraint((bundle,) * remaining),
                        [f"{chosen.group} launched but did not fit"],
                        [],
                        remaining,
                    )
                    break
                remaining = after

    def _pinned_to_missing_slice(self, bundle: Bundle, what: object, bundles: int) -> bool:
        names = pinned_slice(bundle.selector)
        if names is None or names & self.slice_names:
            return False
        self.bundles_unmet += bundles
        self.infeasible.append(
            Unmet(
                str(what),
                f"names slice {', '.join(sorted(names))}, which does not exist; "
                "no other slice can serve it",
            )
        )
        return True

    def _unmet(self, demand: object, blocked: list[str], never: list[str], bundles: int) -> None:
        """Defer an item that got no capacity: later items may launch replicas it can
        share, so it is served once more before being reported."""
        if isinstance(demand, ResourceDemand | GangDemand):
            self._deferred.append(demand)
            self._deferred_reasons[id(demand)] = (blocked, never)
            return
        self._report(demand, blocked, never, bundles)

    def _serve_deferred(self) -> None:
        for _ in range(_RETRY_ROUNDS):
            deferred, self._deferred = self._deferred, []
            if not deferred:
                return
            launches = self._launches
            self._serve_gangs([item for item in deferred if isinstance(item, GangDemand)])
            for item in deferred:
                if isinstance(item, ResourceDemand):
                    self._serve_count(item)
            if self._launches == launches and len(self._deferred) == len(deferred):
                break
        # Gangs of one kind that failed for one reason are reported as one line.
        alike: dict[tuple[object, str, str], list[GangDemand]] = {}
        for item in self._deferred:
            blocked, never = self._deferred_reasons[id(item)]
            if isinstance(item, GangDemand):
                key = (self._kind_id(item), "; ".join(blocked), "; ".join(never))
                alike.setdefault(key, []).append(item)
            else:
                self._report(item, blocked, never, item.count)
        for same in alike.values():
            blocked, never = self._deferred_reasons[id(same[0])]
            size = sum(len(g.bundles) for g in same)
            if len(same) == 1:
                self._report(same[0], blocked, never, size)
                continue
            examples = ", ".join(g.gang_id for g in same[:3])
            what = f"{len(same)} placement groups ({self._kind_text(same[0])}), e.g. {examples}"
            self._report(what, blocked, never, size)
        self._deferred = []

    def _report(self, demand: object, blocked: list[str], never: list[str], bundles: int) -> None:
        self.bundles_unmet += bundles
        if blocked:
            self.waiting.append(Unmet(str(demand), "; ".join(_dedupe(blocked))))
        else:
            reason = "; ".join(_dedupe(never)) or "no worker group"
            self.infeasible.append(Unmet(str(demand), f"no group can ever serve it: {reason}"))

    # --- idle removal -----------------------------------------------------------------

    def _remove_idle(self) -> None:
        used = {r.name for r in self.world.replicas if r.used}
        used |= {r.name for r in self.capacity_world.replicas if r.used}
        candidates: dict[str, list[tuple[float, Replica]]] = {}
        for replica in self.snapshot.replicas:
            state = self.groups.get(replica.group)
            if (
                state is None
                or replica.state is not ReplicaState.RUNNING
                or not replica.identified
                or replica.name in self.removed
                or replica.name in used
                or len(replica.hosts) != state.shape.hosts_per_replica
                or not all(h.registered for h in replica.hosts)
            ):
                continue
            idle_s = min(h.idle_s for h in replica.hosts)
            if idle_s >= state.shape.idle_timeout_s:
                candidates.setdefault(replica.group, []).append((idle_s, replica))
        for group, idle in candidates.items():
            state = self.groups[group]
            allowed = state.healthy + state.new - state.shape.min_replicas
            for idle_s, replica in sorted(idle, key=lambda c: (-c[0], c[1].name))[
                : max(0, allowed)
            ]:
                self._remove(
                    replica,
                    f"all {len(replica.hosts)} hosts idle >= {idle_s:.0f}s "
                    f"(idle timeout {state.shape.idle_timeout_s:g}s)",
                    idle=True,
                )


def _bundle_order(bundle: Bundle) -> tuple[float, float, float, str]:
    r = bundle.resources
    return (-r.get("TPU", 0.0), -r.get("GPU", 0.0), -r.get("CPU", 0.0), str(bundle))


_RETRY_ROUNDS = 3
_MAX_EXACT_VECTORS = 256
_STRICT = (GangStrategy.STRICT_PACK, GangStrategy.STRICT_SPREAD)
_DEFERRED = object()

_STRICTNESS = {
    GangStrategy.STRICT_SPREAD: 0,
    GangStrategy.STRICT_PACK: 1,
    GangStrategy.PACK: 2,
    GangStrategy.SPREAD: 2,
}


def _count_reasons(reasons: Counter[str]) -> str:
    return "; ".join(f"{n} x {reason}" if n > 1 else reason for reason, n in reasons.items())


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
