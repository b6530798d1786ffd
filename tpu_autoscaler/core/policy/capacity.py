"""Each group's capacity state, derived from what the cluster said (`capacity_signals`)
and the launches that failed (`launch_failures`, this pass's timeouts):

- STOCKED_OUT since the first of a run of stockout, quota or node pool signals, each
  within `stockout_hold_s` of the one before, until the hold after the last one;
- BACKING_OFF until the jittered exponential backoff after the failed launches
  (provisioning timeouts, incomplete gangs, TIMED_OUT signals) ends;
- available otherwise, and once a launch made after a signal came up: capacity
  returned, so that signal and those before it no longer count.

A group in either state gets no new launch (`Ledger.limit`); replicas it already has
in flight stay, so capacity that returns is taken by them first. Those of a stocked-out
group that have not come up are stranded (`stranded`): they stay, but demand is not
placed on them, so another group that can serve it launches now rather than after
their provisioning timeout; demand only they could serve waits on them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tpu_autoscaler.core.capacity import (
    CapacityProblem,
    CapacitySignal,
    CapacityStatus,
    GroupCapacity,
)
from tpu_autoscaler.core.snapshot import (
    ClusterSnapshot,
    LaunchFailures,
    PolicyConfig,
    Replica,
    ReplicaState,
)

SHORTAGES = frozenset(
    {CapacityProblem.STOCKOUT, CapacityProblem.QUOTA, CapacityProblem.NODE_POOL_FAILED}
)
"""Problems that say launches would not be served now."""


def group_capacities(
    snapshot: ClusterSnapshot, backoff_until: Mapping[str, float]
) -> dict[str, GroupCapacity]:
    """The groups of `snapshot` whose capacity is not plainly available, by group.
    `backoff_until`: each group's backoff from launch failures (`health.check`)."""
    config = snapshot.config
    now = snapshot.now_s
    # Without signals nothing is answered: no replica needs looking at.
    returned = snapshot.capacity_returned() if snapshot.capacity_signals else {}
    signals: dict[str, list[CapacitySignal]] = {}
    for signal in snapshot.capacity_signals:
        if returned.get(signal.group, float("-inf")) < signal.at_s <= now:
            signals.setdefault(signal.group, []).append(signal)
    states: dict[str, GroupCapacity] = {}
    for shape in snapshot.shapes:
        group = shape.group
        heard = sorted(signals.get(group, ()), key=lambda s: s.at_s)
        candidates = [
            state
            for state in (
                stocked_out(group, [s for s in heard if s.problem in SHORTAGES], config, now),
                backing_off(
                    group,
                    [s for s in heard if s.problem is CapacityProblem.TIMED_OUT],
                    snapshot.launch_failures.get(group),
                    backoff_until.get(group),
                    config,
                    now,
                ),
            )
            if state is not None
        ]
        if candidates:
            states[group] = max(candidates, key=lambda s: s.until_s or now)
    return states


def stocked_out(
    group: str, shortages: list[CapacitySignal], config: PolicyConfig, now_s: float
) -> GroupCapacity | None:
    """STOCKED_OUT since the first signal of the run that ends with the newest, if
    that is within the hold."""
    if not shortages or now_s - shortages[-1].at_s >= config.stockout_hold_s:
        return None
    first = len(shortages) - 1
    while first > 0 and shortages[first].at_s - shortages[first - 1].at_s < config.stockout_hold_s:
        first -= 1
    since, last = shortages[first].at_s, shortages[-1]
    return GroupCapacity(
        group,
        CapacityStatus.STOCKED_OUT,
        since_s=since,
        until_s=last.at_s + config.stockout_hold_s,
        reason=f"stocked out since t={since:.0f}s: {quoted(last)}",
    )


def backing_off(
    group: str,
    timeouts: list[CapacitySignal],
    failures: LaunchFailures | None,
    until_s: float | None,
    config: PolicyConfig,
    now_s: float,
) -> GroupCapacity | None:
    """BACKING_OFF after the group's failed launches: those the shell counted and the
    TIMED_OUT signals heard since capacity last came, whichever are more (both may
    tell of one timeout)."""
    count = failures.count if failures else 0
    last_s = failures.last_failure_s if failures else float("-inf")
    if timeouts:
        count = max(count, len(timeouts))
        last_s = max(last_s, timeouts[-1].at_s)
    candidates = [] if until_s is None else [until_s]
    if count:
        candidates.append(config.backoff_until(LaunchFailures(count, last_s), group))
    until = max(candidates, default=now_s)
    if until <= now_s:
        return None
    what = quoted(timeouts[-1]) if timeouts else "launches not up in time"
    return GroupCapacity(
        group,
        CapacityStatus.BACKING_OFF,
        since_s=last_s if count else now_s,  # no failure counted yet: this pass timed one out
        until_s=until,
        reason=f"backs off until t={until:.0f}s after {max(count, 1)} failed launch(es): {what}",
    )


def quoted(signal: CapacitySignal) -> str:
    """A signal as people read it: its message and where it was read."""
    return f"{signal.message} ({signal.source})" if signal.source else signal.message


def blocking(states: Iterable[GroupCapacity], now_s: float) -> dict[str, GroupCapacity]:
    """The states that hold back new launches now, by group."""
    return {
        s.group: s
        for s in states
        if s.status in (CapacityStatus.STOCKED_OUT, CapacityStatus.BACKING_OFF)
        and (s.until_s is None or s.until_s > now_s)
    }


def stranded(replicas: Iterable[Replica], states: Mapping[str, GroupCapacity]) -> frozenset[str]:
    """The replicas of STOCKED_OUT groups still waiting for capacity: requested or
    pending, no host of theirs ever registered with Ray. A group stocked out since
    before they were launched, or since, alike: a launch that then came up would have
    ended the stockout (`ClusterSnapshot.capacity_returned`)."""
    if not any(state.status is CapacityStatus.STOCKED_OUT for state in states.values()):
        return frozenset()  # most rounds: no group stocked out, no replica to look at
    return frozenset(
        replica.name
        for replica in replicas
        if (state := states.get(replica.group)) is not None
        and state.status is CapacityStatus.STOCKED_OUT
        and replica.state in (ReplicaState.REQUESTED, ReplicaState.PENDING)
        and not replica.came_up
    )
