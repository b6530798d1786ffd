"""The settings a what-if sweep varies, and how one setting changes a cluster
manifest and a workload trace. `--vary KEY=V1,V2,...` names one axis; the grid is
every combination of the axes' values.

Keys scoped to a worker group take `GROUP.KEY`, or bare `KEY` for every worker group:
`maxReplicas`, `minReplicas` (slices), `idleTimeoutSeconds` (the group's own, which
autoscaler v2 honours), `warmReplicas` (the `tpu-autoscaler.dev/warm-replicas`
annotation), `capacity` (how many slices GKE can hold at once: a reservation).
Keys of the whole run: `provisioningDelay` (seconds, `S` or `MIN-MAX`), `hostStagger`
(seconds: each pod of a slice turns Running up to this much after its VMs),
`scaleDownDelay` (seconds a slice's VMs outlive its pods: cluster-autoscaler's
scale-down delay) and `stockoutScale` (the trace's stockout windows stretched by this
factor; 0 drops them)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_autoscaler.core.capacity import WARM_REPLICAS_ANNOTATION
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.sim.workload import DelayRange, Fault, Stockout, Workload

GROUP_KEYS = ("maxReplicas", "minReplicas", "idleTimeoutSeconds", "warmReplicas", "capacity")
RUN_KEYS = ("provisioningDelay", "hostStagger", "scaleDownDelay", "stockoutScale")


@dataclass(frozen=True)
class Axis:
    """One `--vary`: a key (`GROUP.KEY` or `KEY`) and the values it takes, as given."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Setting:
    """One point of the grid: each axis's key with one of its values, in axis order."""

    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values) or "as given"

    def to_json(self) -> dict[str, str]:
        return dict(self.values)


def parse_axis(spec: str, groups: Sequence[str]) -> Axis:
    """`KEY=V1,V2,...` checked against the keys and the manifest's worker groups."""
    where = f"--vary {spec}"
    key, sep, raw = spec.partition("=")
    values = tuple(v.strip() for v in raw.split(",") if v.strip())
    if not sep or not key or not values:
        raise ManifestError([Problem(where, "give KEY=V1,V2,... e.g. maxReplicas=1,2,4")])
    group, _, name = key.rpartition(".")
    known = GROUP_KEYS + RUN_KEYS
    if name not in known:
        raise ManifestError([Problem(where, f"{name!r} is not a key; known: {', '.join(known)}")])
    if group and name in RUN_KEYS:
        raise ManifestError([Problem(where, f"{name} applies to the whole run: drop {group!r}.")])
    if group and group not in groups:
        raise ManifestError(
            [Problem(where, f"no worker group {group!r}; groups: {', '.join(groups)}")]
        )
    for value in values:
        problem = _value_problem(name, value)
        if problem:
            raise ManifestError([Problem(where, f"value {value!r}: {problem}")])
    return Axis(key, values)


def grid(axes: Sequence[Axis]) -> list[Setting]:
    """Every combination of the axes' values, the first axis varying slowest."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise ManifestError([Problem("--vary", f"a key is given twice: {keys}")])
    return [
        Setting(tuple(zip(keys, combo, strict=True)))
        for combo in itertools.product(*(a.values for a in axes))
    ]


def apply_setting(
    raycluster: Mapping[str, Any], workload: Workload, setting: Setting
) -> tuple[dict[str, Any], Workload]:
    """The manifest and trace with `setting` applied; the inputs are left as they were."""
    cluster = copy.deepcopy(dict(raycluster))
    specs = cluster["spec"].get("workerGroupSpecs", [])
    provisioning = workload.provisioning
    faults = list(workload.faults)
    for key, value in setting.values:
        group, _, name = key.rpartition(".")
        if name == "provisioningDelay":
            provisioning = provisioning.model_copy(update={"delay_s": DelayRange.parse(value)})
        elif name == "hostStagger":
            provisioning = provisioning.model_copy(update={"host_stagger_s": float(value)})
        elif name == "scaleDownDelay":
            update = {"scale_down_delay_s": float(value)}
            provisioning = provisioning.model_copy(update=update)
        elif name == "stockoutScale":
            faults = _scaled_stockouts(faults, float(value))
        elif name == "capacity":
            names = [group] if group else [s["groupName"] for s in specs]
            capacity = {**provisioning.capacity, **dict.fromkeys(names, int(value))}
            provisioning = provisioning.model_copy(update={"capacity": capacity})
        else:
            for spec in specs:
                if not group or spec["groupName"] == group:
                    _set_group_value(spec, name, int(value))
    changed = workload.model_copy(update={"provisioning": provisioning, "faults": faults})
    return cluster, changed


def _set_group_value(spec: dict[str, Any], name: str, value: int) -> None:
    if name == "warmReplicas":
        metadata = spec.setdefault("template", {}).setdefault("metadata", {})
        metadata.setdefault("annotations", {})[WARM_REPLICAS_ANNOTATION] = str(value)
    else:
        spec[name] = value


def _scaled_stockouts(faults: list[Fault], factor: float) -> list[Fault]:
    scaled: list[Fault] = []
    for fault in faults:
        if fault.stockout is None:
            scaled.append(fault)
        elif factor > 0:
            until = fault.at + (fault.stockout.until - fault.at) * factor
            stockout = Stockout(group=fault.stockout.group, until=until)
            scaled.append(fault.model_copy(update={"stockout": stockout}))
    return scaled


def _value_problem(name: str, value: str) -> str | None:
    if name == "provisioningDelay":
        try:
            DelayRange.parse(value)
        except ValueError:
            return "give seconds >= 0, S or MIN-MAX, e.g. 60-180"
        return None
    if name in ("stockoutScale", "hostStagger", "scaleDownDelay"):
        try:
            ok = float(value) >= 0
        except ValueError:
            ok = False
        if ok:
            return None
        return (
            "give a factor >= 0, e.g. 0, 1, 2" if name == "stockoutScale" else "give seconds >= 0"
        )
    if not value.isdigit():
        return "give a whole number >= 0"
    return None
