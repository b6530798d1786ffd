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

import math
from collections import Counter
from dataclasses import dataclass, field

from tpu_autoscaler import expander
from tpu_autoscaler.demand import (
    Bundle,
    ClusterConstraint,
    GangDemand,
    GangStrategy,
    ResourceDemand,
    pinned_slice,
)
from tpu_autoscaler.expander import Option
from tpu_autoscaler.placement import SlotReplica, World, fresh_hosts
from tpu_autoscaler.plan import Launch, Plan, Terminate, Unmet
from tpu_autoscaler.shapes import SliceShape
from tpu_autoscaler.snapshot import ClusterSnapshot, LaunchFailures, Replica, ReplicaState
from tpu_autoscaler.units import Replicas


def plan(snapshot: ClusterSnapshot) -> Plan:
    """The whole-replica scaling plan for `snapshot`."""
    return _Pass(snapshot).run()


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
    launch_reasons: list[str] = field(default_factory=list)
    backoff_until: float | None = None
    removed: int = 0

    @property
    def headroom(self) -> int:
        return max(0, self.shape.max_replicas - self.existing - self.new)

    def rate_limit(self) -> int | None:
        """Conservative mode: replicas in flight (earlier and new) at most as many as
        running ones, at least one, so a slow provisioner is not flooded."""
        if self.shape.upscaling_mode != "Conservative":
            return None
        return max(0, max(1, self.running) - self.in_flight - self.new)


class _Pass:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now_s
        self.groups: dict[str, _GroupState] = {s.group: _GroupState(s) for s in snapshot.shapes}
        self.terminate: list[Terminate] = []
        self.removed: set[str] = set()
        self.infeasible: list[Unmet] = []
        self.waiting: list[Unmet] = []
        self.world = World()
        self.capacity_world = World()
        self.slice_names: set[str] = set()
        self.bundles_placed = 0
        self.bundles_unmet = 0

    # --- the pass -----------------------------------------------------------------

    def run(self) -> Plan:
        self._remove_unhealthy()
        self._build_worlds()
        self._top_up_min_replicas()
        demand = self.snapshot.demand
        for gang in sorted(demand.gangs, key=_gang_order):
            self._serve_gang(gang)
        for request in sorted(demand.resources, key=lambda r: _bundle_order(r.bundle)):
            self._serve_count(request)
        for constraint in demand.constraints:
            self._serve_constraint(constraint)
        self._remove_idle()
        launches = tuple(
            Launch(g.shape.group, Replicas(g.new), "; ".join(_dedupe(g.launch_reasons)))
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
            if state is None or replica.state is ReplicaState.DRAINING:
                continue
            expected = state.shape.hosts_per_replica
            dead = [h.pod_name for h in replica.hosts if h.dead]
            reason = None
            if dead:
                reason = f"host(s) {', '.join(dead)} dead; a slice is only usable whole"
            elif replica.state is not ReplicaState.REQUESTED and len(replica.hosts) < expected:
                reason = (
                    f"has {len(replica.hosts)} of {expected} hosts; a partial slice is unusable"
                )
            elif (
                replica.state is ReplicaState.PENDING
                and self.now - replica.created_at_s >= config.provisioning_timeout_s
            ):
                waited = self.now - replica.created_at_s
                reason = (
                    f"pending {waited:.0f}s, past the {config.provisioning_timeout_s:.0f}s "
                    "provisioning timeout"
                )
                previous = self.snapshot.launch_failures.get(replica.group)
                failures = LaunchFailures((previous.count if previous else 0) + 1, self.now)
                state.backoff_until = config.backoff_until(failures)
            if reason is not None:
                self._remove(replica, reason)
        for group, failures in self.snapshot.launch_failures.items():
            state = self.groups.get(group)
            if state is not None and state.backoff_until is None:
                until = config.backoff_until(failures)
                if until > self.now:
                    state.backoff_until = until

    def _remove(self, replica: Replica, reason: str) -> None:
        self.removed.add(replica.name)
        self.groups[replica.group].removed += 1
        self.terminate.append(
            Terminate(replica.group, replica.name, tuple(h.pod_name for h in replica.hosts), reason)
        )

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
            synthesized = fresh_hosts(shape, replica.slice_name)
            hosts = []
            capacity = []
            for index, (host_labels, total, _) in enumerate(synthesized):
                real = replica.hosts[index] if index < len(replica.hosts) else None
                if real is not None and real.registered:
                    hosts.append((real.labels, real.total, real.available))
                    capacity.append((real.labels, real.total, real.total))
                else:
                    hosts.append((host_labels, total, total))
                    capacity.append((host_labels, total, total))
            self.world.add_replica(
                SlotReplica(replica.group, replica.name, False, replica.slice_name), hosts
            )
            self.capacity_world.add_replica(
                SlotReplica(replica.group, replica.name, False, replica.slice_name), capacity
            )

    def _launch(self, group: str, count: int, reason: str) -> None:
        state = self.groups[group]
        for _ in range(count):
            name = f"{group}+new{state.new}"
            self.world.add_new_replica(state.shape, name)
            self.capacity_world.add_new_replica(state.shape, name)
            state.new += 1
        state.launch_reasons.append(reason)

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
            per_replica = expander.copies_per_replica(shape, bundle)
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
        if self._pinned_to_missing_slice(bundle, str(request), request.count):
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

    def _serve_gang(self, gang: GangDemand) -> None:
        size = len(gang.bundles)
        if any(self._pinned_to_missing_slice(b, str(gang), size) for b in gang.bundles[:1]):
            return
        if self.world.place_gang(gang):
            self.bundles_placed += size
            return
        options: list[Option] = []
        blocked: list[str] = []
        never: list[str] = []
        for state in self.groups.values():
            shape = state.shape
            servable = [b for b in gang.bundles if expander.copies_per_replica(shape, b)]
            if not servable:
                continue
            if len(servable) < size and not all(
                expander.copies_per_replica(shape, b) or self._fits_existing(b)
                for b in gang.bundles
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
            self._launch(
                chosen.group,
                chosen.replicas,
                f"{gang}: {expander.describe_options(options, chosen)}",
            )
            if self.world.place_gang(gang):
                self.bundles_placed += size
                return
        elif not blocked and self._serve_gang_across_groups(gang):
            self.bundles_placed += size
            return
        if not blocked and not never:
            never = [
                expander.why_not(s.shape, b) for s in self.groups.values() for b in gang.bundles[:1]
            ]
        self._unmet(gang, blocked, never, size)

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
        launches: dict[str, int] = {}
        for group, bundles in wanted.items():
            state = self.groups[group]
            per_replica = min(expander.copies_per_replica(state.shape, b) for b in bundles)
            launches[group] = math.ceil(len(bundles) / per_replica)
            if launches[group] > self._limit(state)[0]:
                return False
        mark = len(self.world.replicas)
        for group, count in launches.items():
            for i in range(count):
                self.world.add_new_replica(self.groups[group].shape, f"{group}+trial{i}")
        fits = self.world.gang_fits(gang)
        self.world.remove_replicas_from(mark)
        if not fits:
            return False
        for group, count in launches.items():
            self._launch(group, count, f"{gang}: {count} x {group} for its {group} bundles")
        return self.world.place_gang(gang)

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

    def _pinned_to_missing_slice(self, bundle: Bundle, what: str, bundles: int) -> bool:
        names = pinned_slice(bundle.selector)
        if names is None or names & self.slice_names:
            return False
        self.bundles_unmet += bundles
        self.infeasible.append(
            Unmet(
                what,
                f"names slice {', '.join(sorted(names))}, which does not exist; "
                "no other slice can serve it",
            )
        )
        return True

    def _unmet(self, demand: object, blocked: list[str], never: list[str], bundles: int) -> None:
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
                )


def _bundle_order(bundle: Bundle) -> tuple[float, float, float, str]:
    r = bundle.resources
    return (-r.get("TPU", 0.0), -r.get("GPU", 0.0), -r.get("CPU", 0.0), str(bundle))


_STRICTNESS = {
    GangStrategy.STRICT_SPREAD: 0,
    GangStrategy.STRICT_PACK: 1,
    GangStrategy.PACK: 2,
    GangStrategy.SPREAD: 2,
}


def _gang_order(gang: GangDemand) -> tuple[int, int, float, int, str]:
    """Slice heads, then the most constrained gangs, then the largest: soft gangs
    placed last can fill the gaps the strict ones leave."""
    tpu = sum(b.resources.get("TPU", 0.0) for b in gang.bundles)
    head = 0 if gang.is_slice_head else 1
    return (head, _STRICTNESS[gang.strategy], -tpu, -len(gang.bundles), gang.gang_id)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
