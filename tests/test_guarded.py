"""The one guarded apply the controller and Ray's provider wrappers share, on the
object store with writers that race it: status writes (the generation stays) are
absorbed by sending the same patch on the new version; spec edits mean a new proposal."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.factories import raycluster, tpu_group
from tests.racing import WritesBeforePatches
from tpu_autoscaler.adapters.kube.api import Conflict, JsonPatch
from tpu_autoscaler.adapters.kube.guarded import MAX_REBASES, MAX_REPLANS, GuardedApply, Proposal
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import catalog

NS, NAME = "default", "test"
SET_REPLICAS: JsonPatch = [
    {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}
]


def _store() -> ObjectStore:
    store = ObjectStore()
    store.create_raycluster(
        raycluster(
            tpu_group("tpu", catalog.slice_type(catalog.find_generation("v6e"), "4x4")), name=NAME
        )
    )
    return store


def _propose(api: WritesBeforePatches, proposals: list[int]) -> Any:
    def propose() -> Proposal[int]:
        proposals.append(len(proposals))
        return Proposal(api.get_raycluster(NS, NAME), len(proposals), SET_REPLICAS)

    return propose


def test_status_writes_are_absorbed_by_the_same_proposal_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = WritesBeforePatches(_store(), MAX_REBASES, spec=False)
    conflicts: list[None] = []
    applier = GuardedApply(api, NS, NAME, lambda: conflicts.append(None))  # type: ignore[arg-type]
    proposals: list[int] = []
    with caplog.at_level(logging.INFO, logger="tpu_autoscaler"):
        landed = applier.apply(_propose(api, proposals))
    assert (landed.decision, len(proposals), applier.rebases, applier.replans) == (
        1,
        1,
        MAX_REBASES,
        0,
    )
    assert (api.patches, len(conflicts)) == (MAX_REBASES + 1, MAX_REBASES)
    assert api.get_raycluster(NS, NAME)["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    rebased = [
        r for r in caplog.records if r.getMessage().startswith("patch conflict with a status write")
    ]
    assert len(rebased) == MAX_REBASES


def test_spec_edits_re_propose_until_max_replans_then_raise() -> None:
    api = WritesBeforePatches(_store(), 100, spec=True)
    applier = GuardedApply(api, NS, NAME)  # type: ignore[arg-type]
    proposals: list[int] = []
    with pytest.raises(Conflict):
        applier.apply(_propose(api, proposals))
    assert (len(proposals), applier.replans, applier.rebases, api.patches) == (
        MAX_REPLANS,
        MAX_REPLANS,
        0,
        MAX_REPLANS,
    )


def test_a_proposal_with_nothing_to_patch_sends_nothing() -> None:
    api = WritesBeforePatches(_store(), 0, spec=False)
    applier = GuardedApply(api, NS, NAME)  # type: ignore[arg-type]
    landed = applier.apply(lambda: Proposal(api.get_raycluster(NS, NAME), "nothing", []))
    assert (landed.decision, api.patches) == ("nothing", 0)


def test_errors_of_the_proposal_pass_through_untouched() -> None:
    api = WritesBeforePatches(_store(), 0, spec=False)

    def broken() -> Proposal[None]:
        raise KeyError("read failed")

    with pytest.raises(KeyError, match="read failed"):
        GuardedApply(api, NS, NAME).apply(broken)  # type: ignore[arg-type]


def test_rebases_add_up_across_proposals_and_each_re_plan_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A proposal absorbs two status writes and then meets a spec edit; the next one
    absorbs one more and lands: one re-plan, logged with the conflict; the rebases
    counted are those of the patch that landed."""
    store = _store()
    proposals: list[int] = []

    class ThenSpecThenStatus(WritesBeforePatches):
        """Two status writes, a spec edit, then one more status write."""

        def __init__(self, store: ObjectStore) -> None:
            super().__init__(store, 0, spec=False)
            self.script = ["status", "status", "spec", "status"]

        def patch_raycluster(
            self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
        ) -> dict[str, Any]:
            if self.script:
                self.spec = self.script.pop(0) == "spec"
                self.times = 1
            return super().patch_raycluster(namespace, name, operations, resource_version)

    racing = ThenSpecThenStatus(store)
    applier = GuardedApply(racing, NS, NAME)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="tpu_autoscaler"):
        applier.apply(_propose(racing, proposals))
    assert (applier.rebases, applier.replans, len(proposals)) == (1, 1, 2)
    replanned = [r for r in caplog.records if r.getMessage() == "patch conflict, re-reading"]
    assert len(replanned) == 1 and "is at" in replanned[0].detail  # type: ignore[attr-defined]
