"""The production Kubernetes client (`KubernetesApi` on the official client) over real
HTTP against the simulator's API server: the happy paths, the mapping of errors, and
the retries under injected faults, checking that a guarded patch is never applied
twice however its answers get lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from random import Random
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_autoscaler.adapters.kube.api import Conflict, NotFound, Rejected, Unavailable
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy, kubernetes_api
from tpu_autoscaler.controlplane import apiserver_faults
from tpu_autoscaler.controlplane.apiserver import ApiServer
from tpu_autoscaler.controlplane.apiserver_faults import Fault
from tpu_autoscaler.controlplane.store import ObjectStore
from tpu_autoscaler.core import labels

CLUSTER = Path(__file__).parent.parent / "examples" / "clusters" / "v6e-4x4-multihost.yaml"
NAMESPACE, NAME, GROUP = "default", "tpu-v6e-16", "tpu-v6e-group"
REPLICAS_PATH = "/spec/workerGroupSpecs/0/replicas"
TIMEOUT_S = 0.2
"""Where a request is held (`slow`): short, so waiting it out costs little."""
CALM_TIMEOUT_S = 2.0
"""Elsewhere: long enough that a loaded machine does not add timeouts of its own."""
POLICY = RetryPolicy(attempts=4, base_s=0.2, cap_s=5.0)


def _pod(name: str, cluster: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {labels.KUBERAY_CLUSTER: cluster, labels.KUBERAY_GROUP: group},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": f"node-{name}"},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }


def _store() -> tuple[ObjectStore, list[int]]:
    """A store holding the example cluster, and the `replicas` of every RayCluster
    write it takes, in order."""
    store = ObjectStore()
    store.create_raycluster(yaml.safe_load(CLUSTER.read_text()))
    writes: list[int] = []

    def record(kind: str, obj: dict[str, Any]) -> None:
        if kind == "RayCluster":
            writes.append(obj["spec"]["workerGroupSpecs"][0]["replicas"])

    store.watchers.append(record)
    return store, writes


def _client(url: str, sleeps: list[float], timeout_s: float = CALM_TIMEOUT_S) -> KubernetesApi:
    return KubernetesApi(
        kubernetes_api(url), POLICY, timeout_s, sleep=sleeps.append, random=Random(0)
    )


def _scale(replicas: int) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": REPLICAS_PATH, "value": replicas}]


class Harness:
    def __init__(self, timeout_s: float = CALM_TIMEOUT_S) -> None:
        self.store, self.writes = _store()
        self.server = ApiServer(self.store).start()
        self.sleeps: list[float] = []
        self.api = _client(self.server.url, self.sleeps, timeout_s)

    def version(self) -> str:
        version: str = self.store.get_raycluster(NAMESPACE, NAME)["metadata"]["resourceVersion"]
        return version

    def replicas(self) -> int:
        replicas: int = self.store.get_raycluster(NAMESPACE, NAME)["spec"]["workerGroupSpecs"][0][
            "replicas"
        ]
        return replicas

    def settle(self) -> None:
        """Let held requests finish, so the store shows everything that will happen."""
        self.server.release_slow()
        assert self.server.wait_idle(5.0)


@pytest.fixture
def harness() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.server.stop()


@pytest.fixture
def impatient() -> Iterator[Harness]:
    """A harness whose client gives up on a held request after `TIMEOUT_S`."""
    harness = Harness(TIMEOUT_S)
    try:
        yield harness
    finally:
        harness.server.stop()


# --- happy paths -----------------------------------------------------------------------


def test_get_raycluster_returns_the_stored_object(harness: Harness) -> None:
    got = harness.api.get_raycluster(NAMESPACE, NAME)
    assert got == harness.store.get_raycluster(NAMESPACE, NAME)
    assert got["spec"]["workerGroupSpecs"][0]["groupName"] == GROUP  # camelCase, not models


def test_list_pods_selects_by_labels_and_returns_raw_json(harness: Harness) -> None:
    for pod in (
        _pod("mine-0", NAME, GROUP),
        _pod("mine-head", NAME, "headgroup"),
        _pod("theirs-0", "other", GROUP),
    ):
        harness.store.create_pod(pod)
    selector = {labels.KUBERAY_CLUSTER: NAME, labels.KUBERAY_GROUP: GROUP}
    pods = harness.api.list_pods(NAMESPACE, selector)
    assert [p["metadata"]["name"] for p in pods] == ["mine-0"]
    assert pods[0]["status"]["podIP"] == "10.0.0.1"
    assert "resourceVersion" in pods[0]["metadata"]
    sent = parse_qs(urlsplit(harness.server.requests[-1][1]).query)["labelSelector"]
    assert sent == [f"{labels.KUBERAY_CLUSTER}={NAME},{labels.KUBERAY_GROUP}={GROUP}"]
    assert len(harness.api.list_pods(NAMESPACE)) == 3


def test_guarded_patch_applies_and_moves_the_version_on(harness: Harness) -> None:
    before = harness.version()
    patched = harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), before)
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert patched["metadata"]["resourceVersion"] != before
    assert patched == harness.store.get_raycluster(NAMESPACE, NAME)
    assert harness.writes == [2]


def test_unguarded_patch_applies(harness: Harness) -> None:
    harness.api.patch_raycluster(NAMESPACE, NAME, _scale(1), None)
    assert harness.replicas() == 1


def test_create_event_is_recorded_as_sent(harness: Harness) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{NAME}."},
        "involvedObject": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": NAME},
        "reason": "ScaledUp",
        "message": "launched 1 replica of tpu-v6e-group",
        "type": "Normal",
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingComponent": "tpu-autoscaler",
    }
    harness.api.create_event(NAMESPACE, event)
    [recorded] = harness.store.events
    assert recorded["reason"] == "ScaledUp"
    assert recorded["eventTime"] == "2026-01-01T00:00:00.000000Z"  # not reformatted
    assert recorded["metadata"]["namespace"] == NAMESPACE
    assert recorded["metadata"]["name"].startswith(f"{NAME}.")
    assert event["metadata"] == {"generateName": f"{NAME}."}  # the caller's copy untouched


# --- errors ----------------------------------------------------------------------------


def test_stale_resource_version_is_a_conflict(harness: Harness) -> None:
    stale = harness.version()
    harness.store.patch_raycluster(NAMESPACE, NAME, _scale(1), None)  # someone else
    with pytest.raises(Conflict, match=f"raycluster {NAMESPACE}/{NAME}: 409"):
        harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), stale)
    assert harness.replicas() == 1
    assert harness.sleeps == []  # a conflict is for the caller to re-plan, not to retry


def test_missing_raycluster_is_not_found(harness: Harness) -> None:
    with pytest.raises(NotFound, match=f"raycluster {NAMESPACE}/nope: 404"):
        harness.api.get_raycluster(NAMESPACE, "nope")
    assert harness.sleeps == []


def test_failed_test_operation_is_rejected_not_a_conflict(harness: Harness) -> None:
    operations = [{"op": "test", "path": REPLICAS_PATH, "value": 7}, *_scale(2)]
    with pytest.raises(Rejected) as raised:
        harness.api.patch_raycluster(NAMESPACE, NAME, operations, harness.version())
    assert raised.value.status == 422
    assert harness.writes == []


@pytest.mark.parametrize("code", [400, 422])
def test_validation_statuses_are_rejected(harness: Harness, code: int) -> None:
    harness.server.inject(apiserver_faults.status(code, "PATCH"))
    with pytest.raises(Rejected):
        harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), harness.version())
    assert harness.sleeps == []


# --- retries ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", [500, 429])
def test_transient_status_is_retried_with_jittered_backoff(harness: Harness, code: int) -> None:
    harness.server.inject(
        apiserver_faults.status(code, "PATCH"), apiserver_faults.status(code, "PATCH")
    )
    harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), harness.version())
    assert harness.writes == [2]
    assert len(harness.sleeps) == 2
    dice = Random(0)  # the client's: each pause is a fresh draw, within its ceiling
    for retry, pause in enumerate(harness.sleeps, start=1):
        assert 0.0 <= pause <= POLICY.ceiling_s(retry)
        assert pause == dice.uniform(0.0, POLICY.ceiling_s(retry))


def test_unavailable_after_all_attempts_names_the_object(harness: Harness) -> None:
    harness.server.inject(*(apiserver_faults.status(503, "GET") for _ in range(POLICY.attempts)))
    with pytest.raises(Unavailable) as raised:
        harness.api.get_raycluster(NAMESPACE, NAME)
    message = str(raised.value)
    assert f"raycluster {NAMESPACE}/{NAME}" in message and "503" in message
    assert "Content-Type" not in message and "Authorization" not in message
    assert len(harness.server.requests) == POLICY.attempts
    assert len(harness.sleeps) == POLICY.attempts - 1
    assert harness.api.get_raycluster(NAMESPACE, NAME)  # the server is back


def test_dropped_before_applying_is_retried_and_applied_once(harness: Harness) -> None:
    harness.server.inject(apiserver_faults.drop_before("PATCH"))
    patched = harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), harness.version())
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert harness.writes == [2]
    assert len(harness.sleeps) == 1


def test_dropped_after_applying_conflicts_on_resend_and_applied_once(harness: Harness) -> None:
    harness.server.inject(apiserver_faults.drop_after("PATCH"))
    with pytest.raises(Conflict, match="answer was lost"):
        harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), harness.version())
    assert harness.writes == [2]
    assert [m for m, _ in harness.server.requests] == ["PATCH", "PATCH"]


def test_unguarded_patch_is_not_resent_once_it_may_have_applied(harness: Harness) -> None:
    harness.server.inject(apiserver_faults.drop_after("PATCH"))
    with pytest.raises(Unavailable, match="not resent"):
        harness.api.patch_raycluster(NAMESPACE, NAME, _scale(2), None)
    assert harness.writes == [2]
    assert len(harness.server.requests) == 1


def test_slow_answer_times_out_and_the_resend_wins(impatient: Harness) -> None:
    impatient.server.inject(apiserver_faults.slow("PATCH"))
    patched = impatient.api.patch_raycluster(NAMESPACE, NAME, _scale(2), impatient.version())
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    impatient.settle()  # the held first copy now meets a newer version: a conflict
    assert impatient.writes == [2]
    assert len(impatient.sleeps) == 1


def test_slow_read_times_out_and_is_retried(impatient: Harness) -> None:
    impatient.server.inject(apiserver_faults.slow("GET"))
    assert impatient.api.get_raycluster(NAMESPACE, NAME)["metadata"]["name"] == NAME
    assert len(impatient.server.requests) == 2
    impatient.settle()


def test_event_resent_after_a_lost_answer_is_recorded_once(harness: Harness) -> None:
    harness.server.inject(apiserver_faults.drop_after("POST"))
    event = {"involvedObject": {"kind": "RayCluster", "name": NAME}, "reason": "ScaledUp"}
    harness.api.create_event(NAMESPACE, event)
    assert len(harness.store.events) == 1
    assert len(harness.server.requests) == 2


def test_unreachable_server_is_unavailable() -> None:
    with ApiServer(ObjectStore()) as server:
        url = server.url  # a port nothing listens on once the server is gone
    sleeps: list[float] = []
    with pytest.raises(Unavailable, match=f"raycluster {NAMESPACE}/{NAME}: cannot connect"):
        _client(url, sleeps).get_raycluster(NAMESPACE, NAME)
    assert len(sleeps) == POLICY.attempts - 1


@given(st.integers(1, 10), st.floats(0.0, 10.0), st.floats(0.0, 60.0), st.randoms())
def test_backoff_pauses_stay_within_the_capped_ceiling(
    retry: int, base_s: float, extra_cap_s: float, random: Random
) -> None:
    policy = RetryPolicy(attempts=4, base_s=base_s, cap_s=base_s + extra_cap_s)
    pause = policy.pause_s(retry, random)
    assert 0.0 <= pause <= min(policy.cap_s, base_s * 2 ** (retry - 1))


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"base_s": -1.0}, {"base_s": 2.0, "cap_s": 1.0}])
def test_retry_policy_refuses_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


# --- a controller's loop under random faults -----------------------------------------

FAULTS: dict[str, Callable[[str], Fault]] = {
    "500": lambda method: apiserver_faults.status(500, method),
    "503": lambda method: apiserver_faults.status(503, method),
    "429": lambda method: apiserver_faults.status(429, method),
    "drop_before": apiserver_faults.drop_before,
    "drop_after": apiserver_faults.drop_after,
}
STEP_FAULTS = st.lists(
    st.tuples(st.sampled_from(sorted(FAULTS)), st.sampled_from(["GET", "PATCH"])), max_size=6
)
MAX_ROUNDS = 40


def _scale_to(api: KubernetesApi, target: int) -> None:
    """Read, plan, write guarded; on a conflict or an outage, read again and re-plan."""
    for _ in range(MAX_ROUNDS):
        try:
            current = api.get_raycluster(NAMESPACE, NAME)
        except Unavailable:
            continue
        if current["spec"]["workerGroupSpecs"][0]["replicas"] == target:
            return
        version = current["metadata"]["resourceVersion"]
        try:
            api.patch_raycluster(NAMESPACE, NAME, _scale(target), version)
        except (Conflict, Unavailable):
            continue
    raise AssertionError(f"no convergence on {target} replicas in {MAX_ROUNDS} rounds")


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 2), STEP_FAULTS), min_size=1, max_size=4),
    held=st.none() | st.tuples(st.integers(0, 3), st.sampled_from(["GET", "PATCH"])),
)
def test_scaling_through_faults_applies_every_change_exactly_once(
    steps: list[tuple[int, list[tuple[str, str]]]], held: tuple[int, str] | None
) -> None:
    harness = Harness(TIMEOUT_S)
    try:
        expected: list[int] = []
        for index, (target, faults) in enumerate(steps):
            injected: list[Fault] = [FAULTS[kind](method) for kind, method in faults]
            if held is not None and held[0] == index:
                # At most one held request per example: each costs a client timeout.
                injected.insert(0, apiserver_faults.slow(held[1]))
            harness.server.inject(*injected)
            _scale_to(harness.api, target)
            harness.settle()
            if target != (expected[-1] if expected else 0):
                expected.append(target)
            assert harness.replicas() == target
        assert harness.writes == expected
    finally:
        harness.server.stop()
