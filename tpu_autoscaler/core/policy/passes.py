"""One pass of the policy over a snapshot, in the order the decisions depend on:
1. broken replicas go whole (`health`), so do the slices of a gang that did not
   arrive whole (`gang_arrival`), and backoffs start; each group's capacity state
   (`capacity`: stocked out, backing off) follows; replicas above their group's or
   the cluster's max go (`limits`);
2. the rest are counted (`ledger`) and become scratch capacity (`scratch`), but for
   those a stockout strands (`capacity.stranded`);
3. groups below minReplicas are topped up;
4. `request_resources` on total capacity, all of it or none (`constraints`), first
   as in Ray: what it launches is capacity for the demand;
5. demand is placed, launching what does not fit: small demand by exhaustive search
   (`exact_search`), else gangs (`gangs`), then tasks and actors (`counts`), then
   what was deferred once more; what still does not fit is reported (`outcome`);
   tasks and actors without TPUs may grow running pods in place first (`resizing`);
6. warm buffers are topped up (`warm`);
7. idle replicas nothing was placed on go (`idle`), down to minReplicas and the
   warm buffer.

Groups whose slices keep getting preempted are churning (`churn`): the expander
ranks them after steadier groups; they are listed in the plan's capacity."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from tpu_autoscaler.core.demand import Bundle, ResourceDemand
from tpu_autoscaler.core.plan import Plan
from tpu_autoscaler.core.policy import expander, fallbacks, health
from tpu_autoscaler.core.policy.capacity import blocking, group_capacities, stranded
from tpu_autoscaler.core.policy.churn import churning_groups
from tpu_autoscaler.core.policy.constraints import serve_constraint
from tpu_autoscaler.core.policy.counts import Copies, serve_count
from tpu_autoscaler.core.policy.exact_search import serve_exactly
from tpu_autoscaler.core.policy.gangs import GangKinds, GangServer
from tpu_autoscaler.core.policy.idle import idle_removals
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.limits import limit_removals
from tpu_autoscaler.core.policy.nodes import serve_as_nodes, served_as_nodes
from tpu_autoscaler.core.policy.outcome import Outcome
from tpu_autoscaler.core.policy.resizing import Growth
from tpu_autoscaler.core.policy.roster import Roster
from tpu_autoscaler.core.policy.scratch import Scratch
from tpu_autoscaler.core.policy.utilization import Scorer
from tpu_autoscaler.core.policy.warm import top_up_warm
from tpu_autoscaler.core.snapshot import ClusterSnapshot

RETRY_ROUNDS = 3
"""Times deferred demand is served again while that launches something."""


class Pass:
    def __init__(self, snapshot: ClusterSnapshot, kinds: GangKinds) -> None:
        self.snapshot = snapshot
        self.shapes = shapes = {s.group: s for s in snapshot.shapes}
        self.roster = roster = Roster(snapshot.replicas, shapes)
        checked = health.check(snapshot, shapes, roster)
        self.capacity = group_capacities(snapshot, checked.backoff_until)
        waiting_on_capacity = stranded(snapshot.replicas, self.capacity)
        self.reprieved = {
            t.replica: t
            for t in checked.removals
            if t.replica in checked.timed_out and t.replica in waiting_on_capacity
        }
        """Stranded launches past their provisioning timeout: a stockout, not a broken
        launch, explains the wait. They go only if no demand waits on them: one that
        does is first in line when its group's capacity returns."""
        self.terminate = [t for t in checked.removals if t.replica not in self.reprieved]
        self.removed = {t.replica for t in self.terminate}
        self.terminate += limit_removals(snapshot, shapes, self.removed, roster)
        self.removed |= {t.replica for t in self.terminate}
        self.scratch = Scratch(constrained=bool(snapshot.demand.constraints))
        self.churning = churning_groups(
            snapshot.capacity_signals, shapes, snapshot.config, snapshot.now_s
        )
        self.ledger = Ledger(
            snapshot.shapes,
            snapshot.now_s,
            self.scratch,
            checked.backoff_until,
            snapshot.max_worker_hosts,
            snapshot.availability,
            churning=self.churning,
            capacity=blocking(self.capacity.values(), snapshot.now_s),
        )
        usable = self.ledger.count(snapshot.replicas, self.removed, roster)
        self.stranded = (
            [r for r in usable if r.name in waiting_on_capacity] if waiting_on_capacity else []
        )
        """Launches a stockout strands: capacity only for what no other group can
        serve (`_serve_deferred`)."""
        self.scratch.add_fixed(snapshot.fixed_hosts)
        self.scratch.add_existing(
            [r for r in usable if r.name not in waiting_on_capacity]
            if waiting_on_capacity
            else usable,
            shapes,
            snapshot.config,
            snapshot.now_s,
        )
        self.scratch.slice_names |= {r.slice_name for r in self.stranded if r.slice_name}
        self.growth = Growth(snapshot.replicas, shapes, self.removed)
        self.copies = Copies()
        self.scorer = Scorer(snapshot.config.conserve_gpu_nodes)
        # Ray schedules all tasks and actors in one call, request_resources in another.
        self.task_rotation = expander.Rotation()
        self.constraint_rotation = expander.Rotation()
        self.outcome = Outcome()
        self.kinds = kinds

    @cached_property
    def gangs(self) -> GangServer:
        """Made once there is demand to place: it holds the scratch capacity, which is
        built on first use (`Scratch.world`)."""
        return GangServer(
            self.ledger,
            self.copies,
            self.outcome,
            self.kinds,
            self.scratch.world,
            self.scratch.slice_names,
            self.scorer,
            self.growth,
        )

    def run(self) -> Plan:
        self.ledger.top_up_min_replicas()
        demand = self.snapshot.demand
        # Ray enforces request_resources first: what it launches serves demand too.
        for constraint in demand.constraints:
            serve_constraint(
                constraint,
                self.ledger,
                self.copies,
                self.outcome,
                self.scratch,
                bundle_order,
                self.scorer,
                self.constraint_rotation,
            )
        # Without demand nothing is placed or deferred: the scratch capacity is not built.
        if (demand.constraints or demand.gangs or demand.resources) and not serve_exactly(
            demand, self.ledger, self.copies, self.outcome, self.scratch.world
        ):
            self.gangs.serve_all(demand.gangs)
            self._serve_requests(demand.resources)
            self._serve_deferred()
        # What was placed on is settled now: the warm buffer and idle removal only
        # launch (nothing is placed on a launch) and remove.
        used = self.scratch.used()
        self._end_reprieves(used)
        top_up_warm(
            self.snapshot.replicas,
            self.ledger,
            self.removed,
            used,
            self.scratch.new_replicas(),
        )
        self.terminate += idle_removals(self.snapshot, self.ledger, self.removed, used, self.roster)
        outcome = self.outcome
        return Plan(
            self.ledger.launches(),
            tuple(self.terminate),
            tuple(outcome.infeasible),
            tuple(outcome.waiting),
            bundles_placed=outcome.bundles_placed,
            bundles_unmet=outcome.bundles_unmet,
            capacity=(
                *self.capacity.values(),
                *(self.churning[g] for g in sorted(self.churning)),
            ),
            resize=tuple(self.growth.resizes),
        )

    def _serve_requests(self, requests: Sequence[ResourceDemand]) -> None:
        """TPU demand by the slice rules, one shape at a time; then the rest as Ray's
        scheduler serves it, every shape at once (`nodes.py`). A request with label
        selector fallbacks is tried selector by selector (`fallbacks.py`)."""

        def by_nodes(request: ResourceDemand) -> bool:
            return served_as_nodes(request.bundle) and not request.bundle.fallbacks

        as_nodes = [r for r in requests if by_nodes(r)]
        for request in sorted(requests, key=lambda r: bundle_order(r.bundle)):
            if not by_nodes(request):
                self._serve_request(request)
        if as_nodes:
            serve_as_nodes(
                as_nodes,
                self.ledger,
                self.copies,
                self.outcome,
                self.scratch.world,
                self.scorer,
                self.task_rotation,
                self.growth,
            )

    def _serve_request(self, request: ResourceDemand) -> None:
        bundle = request.bundle
        if self.outcome.pinned_to_missing_slice(
            bundle, request, request.count, self.scratch.slice_names
        ):
            return
        count = request.count
        if bundle.fallbacks:
            served = fallbacks.serve_existing(bundle, count, self.scratch.world, self.outcome)
            count -= served
            if not count:
                return
            chosen = fallbacks.variant_to_launch(
                bundle, count, self.ledger, self.copies, self.scorer
            )
            if chosen is None:
                self.outcome.unmet(
                    ResourceDemand(bundle, count, request.source),
                    fallbacks.reasons(bundle, count, self.ledger, self.copies, self.scorer),
                    count,
                )
                return
        else:
            chosen = bundle
        serve_count(
            self.ledger,
            self.copies,
            self.outcome,
            self.scratch.world,
            chosen,
            count,
            self.scorer,
            self.task_rotation,
            lambda left, options, choice: (
                f"{left} x {chosen}: {expander.describe_options(options, choice)}"
            ),
            lambda left: ResourceDemand(bundle, left, request.source),
        )

    def _serve_deferred(self) -> None:
        self._retry_deferred()
        if self.stranded and (self.outcome.deferred or self.outcome.deferred_gangs):
            # What no group could launch for may still wait on a stranded launch:
            # the capacity that returns to its group goes to it first.
            snapshot = self.snapshot
            self.scratch.add_existing(self.stranded, self.shapes, snapshot.config, snapshot.now_s)
            self.stranded = []
            self._retry_deferred()
        self.outcome.report_deferred(self.gangs.kinds.of, self.gangs.kinds.text)

    def _end_reprieves(self, used: set[str]) -> None:
        """Reprieved launches no demand was placed on (`used`: what was) go as timed
        out after all."""
        for name, timed_out in self.reprieved.items():
            if name not in used:
                self.terminate.append(timed_out)
                self.removed.add(name)

    def _retry_deferred(self) -> None:
        outcome = self.outcome
        for _ in range(RETRY_ROUNDS):
            count = outcome.deferred_count()
            requests, gangs = outcome.take_deferred(), outcome.take_deferred_gangs()
            if not count:
                return
            launches = self.ledger.launch_calls
            self.gangs.serve_all([g for run in gangs for g in run.gangs])
            self._serve_requests([d.item for d in requests])
            if self.ledger.launch_calls == launches and outcome.deferred_count() == count:
                break


def bundle_order(bundle: Bundle) -> tuple[float, float, float, str]:
    """Largest accelerator demand first (`Bundle.size`), then by text."""
    tpu, gpu, cpu = bundle.size()
    return (-tpu, -gpu, -cpu, str(bundle))
