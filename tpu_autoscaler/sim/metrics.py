"""What a simulated run measured: the counts and times its summary reports, and the
timeline its plot draws."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metrics:
    slices_launched: int = 0
    partial_slice_seconds: float = 0.0
    busy_replicas_terminated: int = 0
    demand_waits_s: list[float] = field(default_factory=list)
    busy_chip_seconds: float = 0.0
    idle_chip_seconds: float = 0.0
    scale_flaps: int = 0
    decision_s: list[float] = field(default_factory=list)
    conflicts: int = 0
    conflicts_unabsorbed: int = 0
    """Conflicts in rounds that then gave up: a decision that did not land that round."""
    rounds_failed: int = 0
    drains_refused: int = 0
    reservations_failed: int = 0
    """Slice head reservations that timed out (the user saw TimeoutError)."""
    slices_launched_by_group: dict[str, int] = field(default_factory=dict)
    idle_chip_seconds_by_group: dict[str, float] = field(default_factory=dict)
    """Idle chips per group: a warm buffer's cost shows in its group's."""
    busy_chip_seconds_by_group: dict[str, float] = field(default_factory=dict)
    """Busy chips per group: with the idle ones, what each group's chips cost
    (`whatif --price`: a spot group and an on-demand one are priced apart)."""
    unregistered_chip_seconds: float = 0.0
    unregistered_chip_seconds_by_group: dict[str, float] = field(default_factory=dict)
    """Chips of VMs up without a Ray node (booting, drained or failed until their pods
    go): billed as much as idle ones, though no Ray node shows them."""
    launches_cancelled: int = 0
    """Replicas the autoscaler removed before they ever came up, neither failed nor
    past the provisioning timeout: a launch it took back itself."""
    slice_up_s: list[float] = field(default_factory=list)
    """Each replica that came up whole: from its pods created to its last raylet
    registered, what the autoscaler's `tpu_autoscaler_replica_up_seconds` measures on
    a cluster (without its round's lateness)."""
    rounds_wall_s: float = 0.0
    """Wall time of the autoscaler's rounds that ran (`decision_s` has one entry per
    round run), with its calls into the simulated API server and GCS and the
    simulator's look at whether the next may be skipped (`sim/quiet.py`): where a
    run's wall time goes, beside the world's between rounds. A reading of the
    machine, so never in the summary, which repeats exactly."""
    _coming: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Pods whose raylet has not started: the launch (by number) they are of, when it
    was created."""
    _hosts_to_come: dict[int, int] = field(default_factory=dict)
    """By launch: its hosts whose raylet has not started."""

    def replica_created(self, group: str, pods: list[str], now_s: float) -> None:
        """A replica's pods created: one slice launched, its hosts to come."""
        self.slices_launched += 1
        by_group = self.slices_launched_by_group
        by_group[group] = by_group.get(group, 0) + 1
        launch = self.slices_launched
        self._hosts_to_come[launch] = len(pods)
        for pod in pods:
            self._coming[pod] = (launch, now_s)

    def raylet_started(self, pod: str, now_s: float) -> None:
        """A raylet registered: the last of its replica's makes the replica up. (A
        pod replaced or gone before its raylet leaves its launch never up.)"""
        coming = self._coming.pop(pod, None)
        if coming is None:
            return
        launch, created_s = coming
        left = self._hosts_to_come[launch] - 1
        if left:
            self._hosts_to_come[launch] = left
        else:
            del self._hosts_to_come[launch]
            self.slice_up_s.append(now_s - created_s)

    def summary(
        self, policy: str, seed: int, sim_seconds: float, unsatisfied: int, world: str
    ) -> dict[str, Any]:
        decisions = sorted(self.decision_s) or [0.0]
        return {
            "policy": policy,
            "world": world,
            "seed": seed,
            "sim_seconds": round(sim_seconds, 1),
            "slices_launched": self.slices_launched,
            "partial_slice_seconds": round(self.partial_slice_seconds, 1),
            "busy_replicas_terminated": self.busy_replicas_terminated,
            "slice_up_s": quantiles(self.slice_up_s),
            "demand_wait_s": quantiles(self.demand_waits_s),
            "unsatisfied_at_end": unsatisfied,
            "busy_chip_hours": round(self.busy_chip_seconds / 3600, 2),
            "idle_chip_hours": round(self.idle_chip_seconds / 3600, 2),
            "unregistered_chip_hours": round(self.unregistered_chip_seconds / 3600, 2),
            "slices_launched_by_group": dict(sorted(self.slices_launched_by_group.items())),
            "idle_chip_hours_by_group": {
                g: round(s / 3600, 2) for g, s in sorted(self.idle_chip_seconds_by_group.items())
            },
            "busy_chip_hours_by_group": {
                g: round(s / 3600, 2) for g, s in sorted(self.busy_chip_seconds_by_group.items())
            },
            "unregistered_chip_hours_by_group": {
                g: round(s / 3600, 2)
                for g, s in sorted(self.unregistered_chip_seconds_by_group.items())
            },
            "scale_flaps": self.scale_flaps,
            "decision_ms": {
                "p50": round(statistics.median(decisions) * 1e3, 2),
                "p99": round(_quantile(decisions, 0.99) * 1e3, 2),
            },
            "patch_conflicts": self.conflicts,
            "patch_conflicts_absorbed": self.conflicts - self.conflicts_unabsorbed,
            "rounds_failed": self.rounds_failed,
            "drains_refused": self.drains_refused,
            "launches_cancelled": self.launches_cancelled,
            "reservations_failed": self.reservations_failed,
        }


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p95 and max; all 0 for none. `record` reads a real run's waits with it, so
    they compare with a simulated run's as measured alike."""
    ordered = sorted(values) or [0.0]
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(_quantile(ordered, 0.95), 1),
        "max": round(ordered[-1], 1),
    }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Timeline:
    """Samples for plots: time, slices by state, chips busy and idle, pending work."""

    t_s: list[float] = field(default_factory=list)
    slices: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    chips_busy: list[int] = field(default_factory=list)
    chips_idle: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
