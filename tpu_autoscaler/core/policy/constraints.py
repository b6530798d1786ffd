"""`request_resources`: all of its bundles or none, as Ray 2.60 treats a cluster
resource constraint (`_enforce_resource_constraints`: tried whole on total capacity;
if any bundle is left over, nothing of it is kept and the constraint is infeasible).

Its bundles are placed on total capacity (what is used does not matter), launching
for the rest: bundles without TPUs as Ray's scheduler places them (`nodes.py`: the
best-used existing node first, then node by node), the others by the slice rules.
It is served before any demand, as in Ray, so what it launches serves demand too.
If any bundle is left over, every placement and launch made for it is taken back,
so it neither grows the cluster part way nor keeps idle replicas from going. Left
over because a group or the cluster is at its max, it can never be served (total
capacity within the limits cannot hold it): infeasible, as in Ray. Left over only
because a group backs off or upscales conservatively, it waits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from tpu_autoscaler.core.demand import Bundle, ClusterConstraint, ResourceDemand
from tpu_autoscaler.core.plan import GroupReason, GroupVerdict
from tpu_autoscaler.core.policy import expander
from tpu_autoscaler.core.policy.counts import Copies, serve_count
from tpu_autoscaler.core.policy.ledger import Ledger
from tpu_autoscaler.core.policy.nodes import serve_as_nodes, served_as_nodes
from tpu_autoscaler.core.policy.outcome import Outcome, Reasons, dedupe, rejected
from tpu_autoscaler.core.policy.scratch import Scratch
from tpu_autoscaler.core.policy.utilization import Scorer


def serve_constraint(
    constraint: ClusterConstraint,
    ledger: Ledger,
    copies: Copies,
    outcome: Outcome,
    scratch: Scratch,
    order: Callable[[Bundle], tuple[float, float, float, str]],
    scorer: Scorer,
    rotation: expander.Rotation,
) -> None:
    """Serve `constraint` whole on `scratch`'s total capacity, or not at all."""
    counts = Counter(b.key for b in constraint.bundles)
    bundles = {b.key: b for b in constraint.bundles}
    trial = Outcome()
    ledger_mark = ledger.mark()
    world_mark = scratch.world.fork()
    as_nodes = all(served_as_nodes(b) and not b.fallbacks for b in constraint.bundles)
    with scratch.capacity_world.all_or_nothing() as undo:
        if as_nodes:
            requests = [
                ResourceDemand(bundles[key], count, constraint.source)
                for key, count in counts.items()
            ]
            serve_as_nodes(
                requests, ledger, copies, trial, scratch.capacity_world, scorer, rotation
            )
            for left in trial.take_deferred():
                bundle, n = left.item.bundle, left.item.count
                trial.report(ClusterConstraint((bundle,) * n, constraint.source), left.reasons, n)
        for key, count in sorted(counts.items(), key=lambda kv: order(bundles[kv[0]])):
            if not as_nodes:
                _serve_bundles(
                    constraint,
                    bundles[key],
                    count,
                    ledger,
                    copies,
                    trial,
                    scratch,
                    scorer,
                    rotation,
                )
        if not trial.bundles_unmet:
            outcome.placed(trial.bundles_placed)
            return
        undo()
    scratch.world.revert(world_mark)
    ledger.restore(ledger_mark)
    outcome.report(
        constraint,
        _whole(trial, ledger),
        len(constraint.bundles),
        note=(
            f"request_resources is all or nothing: {trial.bundles_unmet} of "
            f"{len(constraint.bundles)} bundles cannot be served, so nothing is launched "
            "or kept for it"
        ),
    )


def _serve_bundles(
    constraint: ClusterConstraint,
    bundle: Bundle,
    count: int,
    ledger: Ledger,
    copies: Copies,
    trial: Outcome,
    scratch: Scratch,
    scorer: Scorer,
    rotation: expander.Rotation,
) -> None:
    serve_count(
        ledger,
        copies,
        trial,
        scratch.capacity_world,
        bundle,
        count,
        scorer,
        rotation,
        lambda _left, options, choice: (
            f"{constraint}: {expander.describe_options(options, choice)}"
        ),
        lambda left: ClusterConstraint((bundle,) * left, constraint.source),
    )


def _whole(trial: Outcome, ledger: Ledger) -> Reasons:
    """Why the constraint as a whole is unserved: groups at a max can never hold more
    total capacity (rejected); backoff and conservative upscaling pass (skipped)."""
    blocked: list[GroupReason] = []
    never: list[GroupReason] = []
    for unmet in trial.waiting + trial.infeasible:
        for reason in unmet.groups:
            state = ledger.groups.get(reason.group)
            if reason.verdict is GroupVerdict.REJECTED:
                never.append(reason)
            elif state is not None and state.grows_later(ledger.now_s):
                blocked.append(reason)
            else:
                never.append(rejected(reason.group, reason.message))
    return Reasons(tuple(dedupe(blocked)), tuple(dedupe(never)))
