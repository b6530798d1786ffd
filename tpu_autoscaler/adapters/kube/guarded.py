"""How a change reaches the RayCluster: read, decide, patch guarded by the
resourceVersion read. A conflict that only a status write caused (KubeRay writes the
status whenever its pod counts change; the spec's generation stays) leaves the change
as right as it was, so the same patch goes again on the new version; a spec that moved
means read and decide again. The controller and Ray's provider wrappers apply their
changes through this one loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tpu_autoscaler.adapters.kube.api import Conflict, JsonPatch, KubeApi

log = logging.getLogger("tpu_autoscaler")

MAX_REPLANS = 3
"""Conflicting patches in one apply before it gives up (raises the Conflict)."""
MAX_REBASES = 5
"""Conflicts with status writes absorbed by one patch before it re-plans."""

Decision = TypeVar("Decision")


@dataclass(frozen=True)
class Proposal(Generic[Decision]):
    """A decision and the patch that carries it, made from the RayCluster `raw`."""

    raw: dict[str, Any]
    decision: Decision
    operations: JsonPatch
    guarded: bool = True
    """False: sent with no resourceVersion precondition (Ray's stock provider does so)."""

    @property
    def guard(self) -> str | None:
        if not self.guarded:
            return None
        version: str | None = self.raw.get("metadata", {}).get("resourceVersion")
        return version


class GuardedApply:
    """One change to one RayCluster carried through conflicts; `replans` and `rebases`
    count what it took (`rebases`: those absorbed by a patch that landed), also
    when `apply` raises."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        on_conflict: Callable[[], None] = lambda: None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.on_conflict = on_conflict
        self.replans = 0
        self.rebases = 0

    def apply(self, propose: Callable[[], Proposal[Decision]]) -> Proposal[Decision]:
        """Propose (read and decide) and patch until the patch lands or is not needed;
        the proposal that held. Raises Conflict after MAX_REPLANS conflicting
        proposals, and any other ApiError of the patch at once (maybe applied, maybe
        not: a re-read tells, and the guard keeps a repeat from applying twice).
        Errors `propose` raises pass through untouched."""
        while True:
            proposal = propose()
            if not proposal.operations:
                return proposal
            try:
                self.rebases += self._patch_through_status_churn(proposal)
                return proposal
            except Conflict as exc:
                self.on_conflict()
                self.replans += 1
                log.info("patch conflict, re-reading", extra={"detail": str(exc)})
                if self.replans >= MAX_REPLANS:
                    raise

    def _patch_through_status_churn(self, proposal: Proposal[Any]) -> int:
        """Patch; the number of status-write conflicts absorbed on the way. (An
        unguarded patch never meets a conflict: the API checks no version.)"""
        guard = proposal.guard
        generation = proposal.raw["metadata"].get("generation")
        rebases = 0
        while True:
            try:
                self.api.patch_raycluster(self.namespace, self.name, proposal.operations, guard)
                return rebases
            except Conflict:
                if generation is None or rebases == MAX_REBASES:
                    raise
                current = self.api.get_raycluster(self.namespace, self.name)
                if current["metadata"].get("generation") != generation:
                    raise
                self.on_conflict()
                log.info("patch conflict with a status write, patching the new version")
                guard = current["metadata"]["resourceVersion"]
                rebases += 1
