"""Removals taken back (`shell/taken_back.py`): which replicas named in workersToDelete
stay because they came up and took work before KubeRay deleted them."""

from __future__ import annotations

import copy
from typing import Any

from tests.test_read_deltas import GROUP, _world
from tpu_autoscaler.adapters.kube.observe import Observer
from tpu_autoscaler.adapters.ray.state import from_message
from tpu_autoscaler.adapters.snapshot_file import LoadedSnapshot, assemble
from tpu_autoscaler.shell.taken_back import busy_though_named


def _named(
    listed: list[str], terminating: str | None = None, failed: str | None = None
) -> tuple[LoadedSnapshot, list[Any]]:
    """The world of test_read_deltas (three running slices, one pending) with work on
    one host, `listed` in its group's workersToDelete and `terminating` being deleted."""
    api, state = _world()
    busy = next(n for n in state.node_states if "-worker-" in n.instance_id)
    busy.available_resources["TPU"] = 0.0
    for spec in api.raycluster["spec"]["workerGroupSpecs"]:
        if spec["groupName"] == GROUP:
            spec["scaleStrategy"] = {"workersToDelete": listed}
    if terminating is not None:
        at = next(i for i, p in enumerate(api.pods) if p["metadata"]["name"] == terminating)
        api.pods[at] = copy.deepcopy(api.pods[at])
        api.pods[at]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if failed is not None:
        at = next(i for i, p in enumerate(api.pods) if p["metadata"]["name"] == failed)
        api.pods[at] = copy.deepcopy(api.pods[at])
        api.pods[at]["status"]["phase"] = "Failed"
    observed = Observer("default", api.raycluster["metadata"]["name"]).read(api)  # type: ignore[arg-type]
    loaded = assemble(observed.cluster, list(observed.pods), from_message(state), 50.0)
    replicas = sorted(
        (r for r in loaded.snapshot.replicas if r.group == GROUP), key=lambda r: r.created_at_s
    )
    return loaded, replicas


def _pods(replica: Any) -> list[str]:
    return [h.pod_name for h in replica.hosts]


def test_only_a_whole_named_replica_with_work_and_nothing_deleted_is_taken_back() -> None:
    _, replicas = _named([])
    busy = next(r for r in replicas if any(h.in_use for h in r.hosts))
    busy_pod = next(h.pod_name for h in busy.hosts if h.in_use)
    idle = next(
        r for r in replicas if r.hosts and all(h.registered for h in r.hosts) and r is not busy
    )
    assert not any(h.in_use for h in idle.hosts)
    both = _pods(busy) + _pods(idle)

    loaded, _ = _named(both)
    assert [r.name for r in busy_though_named(loaded, ())] == [busy.name]
    # Drained for its idle removal: Ray places nothing there; it goes as planned.
    assert busy_though_named(loaded, {busy.name}) == ()
    # KubeRay has begun deleting it: too late, and a partial slice otherwise.
    loaded, _ = _named(both, terminating=_pods(busy)[2])
    assert busy_though_named(loaded, ()) == ()
    # A host dead: a broken slice, removed as such.
    loaded, _ = _named(both, failed=next(p for p in _pods(busy) if p != busy_pod))
    assert busy_though_named(loaded, ()) == ()
    # Not all of its pods named: not a replica this autoscaler removed whole.
    loaded, _ = _named(_pods(busy)[:3] + _pods(idle))
    assert busy_though_named(loaded, ()) == ()
    # Nothing named at all.
    assert busy_though_named(_named([])[0], ()) == ()
