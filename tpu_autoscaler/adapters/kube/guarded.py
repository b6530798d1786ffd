"""How a change reaches the RayCluster: read, decide, patch guarded by the
resourceVersion read. A conflict that only a status write caused (KubeRay writes the
status whenever its pod counts change; the spec's generation stays) leaves the change
as right as it was, so the same patch goes again, guarded by the generation it was
planned from (a JSON patch `test` of `/metadata/generation`) rather than by a
resourceVersion: status writes move the resourceVersion, never the generation. At
fleet scale KubeRay writes the status up to its client's rate limit (100 a second by
default) while pods change, so a new resourceVersion would be stale again before its
patch arrives. A spec that moved means read and decide again. The controller and
Ray's provider wrappers apply their changes through this one loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tpu_autoscaler.adapters.kube.api import Conflict, JsonPatch, KubeApi, Rejected

log = logging.getLogger("tpu_autoscaler")

MAX_REPLANS = 3
"""Conflicting patches in one apply before it gives up (raises the Conflict)."""

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
        """Patch; the number of status-write conflicts absorbed on the way (0 or 1).
        (An unguarded patch never meets a conflict: the API checks no version.)"""
        generation = proposal.raw["metadata"].get("generation")
        try:
            self.api.patch_raycluster(
                self.namespace, self.name, proposal.operations, proposal.guard
            )
            return 0
        except Conflict:
            if generation is None or self._generation() != generation:
                raise
        self.on_conflict()
        log.info("patch conflict with a status write, patching guarded by the generation")
        # Applies at most once and never to a spec other than the one planned from:
        # any spec change, this patch's own included, moves the generation.
        same_spec = {"op": "test", "path": "/metadata/generation", "value": generation}
        try:
            self.api.patch_raycluster(
                self.namespace, self.name, [same_spec, *proposal.operations], None
            )
        except Rejected as exc:
            # The API server answers a failed `test` with 422, as it answers a patch
            # the schema refuses; the generation tells which this was.
            if self._generation() == generation:
                raise
            raise Conflict(f"raycluster {self.namespace}/{self.name}: the spec moved") from exc
        return 1

    def _generation(self) -> Any:
        return self.api.get_raycluster(self.namespace, self.name)["metadata"].get("generation")
