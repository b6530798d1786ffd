"""Which groups are churning: their slices keep getting preempted soon after they
arrive, so new demand prefers a steadier group until the churn window passes after
the last preemption (the expander's "steadier group" comparator). A churning group
still serves what nothing else can: churn is a preference, not a limit.

How "soon after they arrive" is read: a `PREEMPTED` signal says that a slice of the
group went, not how long it had lived; by the time the policy reads it the replica is
gone from the snapshot (KubeRay deletes a replica that lost a host), and the signal
carries no age. What the snapshot does show is the signals' own times, so the rule is
on them: `config.churn_preemptions` preemptions of one group within one
`config.churn_window_s`. A slice is replaced whole after a preemption, so the second
of two preemptions within a window means a slice of the group (the replacement, or
one that arrived alongside it) was lost within a window of the first loss: slices
last less than a window there. A group that loses a long-lived slice once in a while
never reaches the count within one window and stays available.

Signals come per host (each raylet's death, each pod's node shutdown), and GCE
reclaims a slice's VMs together: signals of a group within `ONE_RECLAIM_S` of the
first of them count as one preemption."""

from __future__ import annotations

from collections.abc import Iterable

from tpu_autoscaler.core.capacity import (
    CapacityProblem,
    CapacitySignal,
    CapacityStatus,
    GroupCapacity,
)
from tpu_autoscaler.core.snapshot import PolicyConfig

ONE_RECLAIM_S = 60.0
"""How far apart the per-host signals of one slice's preemption may be (the kubelets'
shutdown times and the GCS's death times differ by seconds)."""


def churning_groups(
    signals: Iterable[CapacitySignal],
    groups: Iterable[str],
    config: PolicyConfig,
    now_s: float,
) -> dict[str, GroupCapacity]:
    """Each group of `groups` that churns at `now_s`, with since (the first preemption
    of the run that made it churn) and until (the window after the last)."""
    preempted: dict[str, list[float]] = {}
    known = set(groups)
    for signal in signals:
        if (
            signal.problem is CapacityProblem.PREEMPTED
            and signal.group in known
            and signal.at_s <= now_s
        ):
            preempted.setdefault(signal.group, []).append(signal.at_s)
    churning: dict[str, GroupCapacity] = {}
    for group, times in preempted.items():
        found = _churn(reclaims(sorted(times)), config, now_s)
        if found is not None:
            since_s, until_s, count = found
            churning[group] = GroupCapacity(
                group,
                CapacityStatus.CHURNING,
                since_s,
                until_s,
                f"{group}: {count} slice preemption(s) within {config.churn_window_s:.0f}s "
                f"(from t={since_s:.0f}s); new demand prefers a steadier group "
                f"until t={until_s:.0f}s",
            )
    return churning


def _churn(
    times: list[float], config: PolicyConfig, now_s: float
) -> tuple[float, float, int] | None:
    """(since, until, preemptions) if the latest preemption that completes a count
    within one window still holds at `now_s`; None otherwise."""
    window = config.churn_window_s
    needed = max(1, config.churn_preemptions)
    for last in range(len(times) - 1, needed - 2, -1):
        until_s = times[last] + window
        if until_s <= now_s:
            return None  # later ones are older still
        first = last - needed + 1
        if times[last] - times[first] <= window:
            start = first
            while start > 0 and times[last] - times[start - 1] <= window:
                start -= 1
            return times[start], until_s, last - start + 1
    return None


def reclaims(times: list[float]) -> list[float]:
    """The start of each preemption, per-host signals of one reclaim folded into it."""
    starts: list[float] = []
    for at_s in times:
        if not starts or at_s - starts[-1] >= ONE_RECLAIM_S:
            starts.append(at_s)
    return starts
