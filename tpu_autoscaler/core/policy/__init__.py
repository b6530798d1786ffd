"""The slice scheduling policy: a cluster snapshot in, a plan of whole replicas out.

Pure: no I/O, no clock (time is `snapshot.now_s`), no Ray or Kubernetes. A pass
(`passes.py`) decides launches while it places demand, so a small bundle may land on
a replica launched for a bigger one that comes later; the plan is therefore settled:
passes repeat on the snapshot as it will be once the launches so far are requested,
until one launches nothing. Re-planning the resulting cluster then launches nothing
more. What goes (and what is resized in place) is the first pass's decision, on the
cluster as it is (as Ray's one scheduling call decides it): a later pass sees that
pass's launches as capacity and may place the work elsewhere, leaving idle a node the
first pass kept busy.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from tpu_autoscaler.core.plan import Launch, Plan, Resize, Terminate
from tpu_autoscaler.core.policy.gangs import GangKinds
from tpu_autoscaler.core.policy.outcome import dedupe
from tpu_autoscaler.core.policy.passes import Pass
from tpu_autoscaler.core.snapshot import ClusterSnapshot
from tpu_autoscaler.core.units import Replicas

__all__ = ["plan"]

MAX_PASSES = 4


def plan(snapshot: ClusterSnapshot) -> Plan:
    """The whole-replica scaling plan for `snapshot`."""
    with _collector_paused():
        return _settle(snapshot)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A pass allocates many small objects that live until it ends; Python's cyclic
    collector would rescan the whole snapshot for them again and again (a third of
    the time at 16,384 hosts). Nothing a pass makes outlives it but the plan, and
    each pass unlinks its scratch capacity's cycles (`Scratch.release`), so that
    little is left for the collector once it runs again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _settle(snapshot: ClusterSnapshot) -> Plan:
    current = snapshot
    kinds = GangKinds()
    launched: dict[str, list[Launch]] = {}
    terminated: list[Terminate] = []
    resized: tuple[Resize, ...] = ()
    for _ in range(MAX_PASSES):
        one_pass = Pass(current, kinds)
        result = one_pass.run()
        one_pass.scratch.release()
        if current is snapshot:
            terminated.extend(result.terminate)
            resized = result.resize
        for launch in result.launch:
            launched.setdefault(launch.group, []).append(launch)
        if not result.launch:
            break
        current = current.after(result)
    launches = tuple(
        Launch(
            group,
            Replicas(sum(x.replicas for x in items)),
            "; ".join(dedupe([x.reason for x in items])),
        )
        for group, items in launched.items()
    )
    return replace(result, launch=launches, terminate=tuple(terminated), resize=resized)
