"""The one guarded apply the controller and Ray's provider wrappers share, on the
object store with writers that race it: status writes (the generation stays) are
absorbed by sending the same patch guarded by the generation; spec edits mean a new
proposal."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.factories import raycluster, tpu_group
from tests.racing import WritesBeforePatches
from tpu_autoscaler.adapters.kube.api import Conflict, JsonPatch, Rejected
from tpu_autoscaler.adapters.kube.guarded import MAX_REPLANS, GuardedApply, Proposal
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import catalog

NS, NAME = "default", "test"
SET_REPLICAS: JsonPatch = [
    {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}
]


class Scripted(WritesBeforePatches):
    """Before each patch, the next write of `script` ("status" or "spec"), then none."""

    def __init__(self, store: ObjectStore, script: list[str]) -> None:
        super().__init__(store, 0, spec=False)
        self.script = script

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        if self.script:
            self.spec = self.script.pop(0) == "spec"
            self.times = 1
        return super().patch_raycluster(namespace, name, operations, resource_version)


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


def test_a_status_write_before_every_patch_is_absorbed_by_one_rebase_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """KubeRay at fleet scale: while pods change it writes the status after every
    reconcile, up to its client's 100 writes a second, so one lands between every read
    and patch. A rebase guarded by a new resourceVersion would meet the next one; the
    rebase guarded by the generation lands."""
    api = WritesBeforePatches(_store(), 100, spec=False)
    conflicts: list[None] = []
    applier = GuardedApply(api, NS, NAME, lambda: conflicts.append(None))  # type: ignore[arg-type]
    proposals: list[int] = []
    with caplog.at_level(logging.INFO, logger="tpu_autoscaler"):
        landed = applier.apply(_propose(api, proposals))
    assert (landed.decision, len(proposals), applier.rebases, applier.replans) == (1, 1, 1, 0)
    assert (api.patches, len(conflicts)) == (2, 1)
    assert api.get_raycluster(NS, NAME)["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    rebased = [
        r for r in caplog.records if r.getMessage().startswith("patch conflict with a status write")
    ]
    assert len(rebased) == 1


def test_a_rebased_patch_lands_at_most_once() -> None:
    """Resent after it landed (an answer lost), the rebased patch meets the generation
    its own change moved."""
    api = WritesBeforePatches(_store(), 1, spec=False)
    applier = GuardedApply(api, NS, NAME)  # type: ignore[arg-type]
    generation = api.get_raycluster(NS, NAME)["metadata"]["generation"]
    applier.apply(_propose(api, []))
    assert applier.rebases == 1
    resent = [{"op": "test", "path": "/metadata/generation", "value": generation}, *SET_REPLICAS]
    with pytest.raises(Conflict):
        api.store.patch_raycluster(NS, NAME, resent, None)


def test_a_spec_edit_before_the_rebased_patch_means_a_new_proposal() -> None:
    """A status write and then a spec edit: the plan made from the old spec never
    lands; the next proposal, read from the edited spec, does."""
    store = _store()
    racing = Scripted(store, ["status", "spec"])
    applier = GuardedApply(racing, NS, NAME)  # type: ignore[arg-type]
    proposals: list[int] = []
    landed = applier.apply(_propose(racing, proposals))
    assert (landed.decision, applier.rebases, applier.replans, racing.patches) == (2, 0, 1, 3)
    group = store.get_raycluster(NS, NAME)["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 1 and landed.raw["metadata"]["generation"] == 2


class FailedTestsRejected(Scripted):
    """The API server's answer to a failed JSON patch `test`: 422, as for a patch
    its schema refuses (the object store raises Conflict)."""

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        try:
            return super().patch_raycluster(namespace, name, operations, resource_version)
        except Conflict as exc:
            if resource_version is None:
                raise Rejected(str(exc)) from exc
            raise


def test_a_failed_generation_test_answered_422_re_plans_and_a_refusal_is_raised() -> None:
    racing = FailedTestsRejected(_store(), ["status", "spec"])
    applier = GuardedApply(racing, NS, NAME)  # type: ignore[arg-type]
    proposals: list[int] = []
    applier.apply(_propose(racing, proposals))
    assert (applier.replans, len(proposals)) == (1, 2)

    class Refusing(WritesBeforePatches):
        def patch_raycluster(self, *args: Any) -> dict[str, Any]:
            if args[3] is None:
                raise Rejected("spec.workerGroupSpecs[0].replicas: Invalid value")
            return super().patch_raycluster(*args)

    refusing = Refusing(_store(), 1, spec=False)
    with pytest.raises(Rejected, match="Invalid value"):
        GuardedApply(refusing, NS, NAME).apply(_propose(refusing, []))  # type: ignore[arg-type]


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
    """A proposal absorbs a status write and then meets a spec edit; the next one
    absorbs one more and lands: one re-plan, logged with the conflict; the rebases
    counted are those of the patch that landed."""
    racing = Scripted(_store(), ["status", "spec", "status"])
    applier = GuardedApply(racing, NS, NAME)  # type: ignore[arg-type]
    proposals: list[int] = []
    with caplog.at_level(logging.INFO, logger="tpu_autoscaler"):
        applier.apply(_propose(racing, proposals))
    assert (applier.rebases, applier.replans, len(proposals)) == (1, 1, 2)
    replanned = [r for r in caplog.records if r.getMessage() == "patch conflict, re-reading"]
    assert len(replanned) == 1 and "generation" in replanned[0].detail  # type: ignore[attr-defined]
