"""One run of a sweep: a setting applied to the cluster and trace, simulated under one
policy with one seed, as `tpu-autoscaler simulate` would. A run is a plain function
of JSON-able inputs, so a Ray worker anywhere computes the same result as this
process does."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpu_autoscaler.sim.workload import Workload
from tpu_autoscaler.whatif.settings import Setting, apply_setting

WALL_CLOCK_FIELDS = ("decision_ms",)
"""Summary fields measured on the wall clock: they differ from run to run and are
kept out of a sweep's results, which must not."""


@dataclass(frozen=True)
class RunSpec:
    """What one run needs, all of it JSON: the sweep's inputs and this run's point."""

    raycluster: Mapping[str, Any]
    workload: Mapping[str, Any]
    setting: tuple[tuple[str, str], ...]
    policy: str
    seed: int
    world: str
    duration_s: float | None

    @property
    def key(self) -> str:
        """Identifies the run in a results file, with a digest of the inputs so a
        rerun on a changed cluster or trace does not take old results for new."""
        return run_key(self.inputs_digest, self.setting, self.policy, self.seed, self.world)

    @property
    def inputs_digest(self) -> str:
        blob = json.dumps(
            [self.raycluster, self.workload, self.duration_s], sort_keys=True, default=str
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_key(
    digest: str, setting: tuple[tuple[str, str], ...], policy: str, seed: int, world: str
) -> str:
    return json.dumps([digest, [list(kv) for kv in setting], policy, seed, world])


def simulate_run(spec: RunSpec) -> dict[str, Any]:
    """The run's summary (`sim/metrics.py`) without the wall-clock fields."""
    from tpu_autoscaler.adapters.kube.api import Rejected
    from tpu_autoscaler.controlplane.world import WORLDS
    from tpu_autoscaler.core.problems import ManifestError, Problem
    from tpu_autoscaler.sim.cluster import SimulatedCluster

    logging.getLogger("tpu_autoscaler").addHandler(logging.NullHandler())
    cluster, workload = apply_setting(
        spec.raycluster, Workload.model_validate(spec.workload), Setting(spec.setting)
    )
    try:
        sim = SimulatedCluster.for_workload(
            cluster,
            workload,
            "ray" if spec.policy == "ray" else "slice",
            spec.seed,
            WORLDS[spec.world],
        )
    except Rejected as exc:
        label = Setting(spec.setting).label
        raise ManifestError([Problem(label, f"rejected at admission: {exc}")]) from None
    duration = spec.duration_s if spec.duration_s is not None else workload.last_end_s + 1800
    summary = sim.run(duration)
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_FIELDS}
