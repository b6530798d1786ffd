"""Do the simulated API server and a real kube-apiserver 1.20.2 answer any sequence of
the requests this project's code paths send alike? Hypothesis generates sequences
(creates of RayClusters and pods, GETs, pod lists by equality and set-based selectors,
JSON and merge patches unguarded or guarded by a current, stale or empty
resourceVersion, status writes through the status subresource, pod deletes with grace
periods and preconditions, bound and unbound) and each is sent to both servers over
HTTP through the official client; after the sequence, a watch from a version seen in
it. Every answer must match: status code, reason, body, watch events, and at the end
every stored object (compared as `differential.normalise` leaves them). Each example
gets a fresh simulated server and a fresh namespace on the real one. Examples are not
shrunk: shrinking replays many sequences against the real server, and a failing one
is printed whole with the first differing answer as a diff."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from kubernetes import client

from tests.realkube.differential import difference
from tests.realkube.differential_side import Side, run, watch
from tests.realkube.differential_steps import Selector, steps, watches
from tests.realkube.endpoints import JSON_PATCH, MERGE_PATCH, Real, Simulated
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore

pytestmark = pytest.mark.kube_real

PRELUDE: list[tuple[Any, ...]] = [
    ("create_cluster", "c0"),
    ("create_pod", "p0", {"app": "a"}, True, None),
    ("create_pod", "p1", {"tier": "b"}, False, None),
]
"""The steps every sequence starts with, so that most of its requests meet objects."""

CODA: list[tuple[Any, ...]] = [
    ("list_pods", None),
    ("get_cluster", "c0"),
    ("get_cluster", "c1"),
]
"""The steps every sequence ends with: everything stored, compared."""

# --- the test -----------------------------------------------------------------------


@pytest.fixture
def sides(admin: client.ApiClient) -> Callable[[], tuple[Simulated, Side, Side]]:
    """A factory of fresh (simulated, real) pairs, one per example."""

    def fresh() -> tuple[Simulated, Side, Side]:
        namespace = f"diff-{secrets.token_hex(4)}"
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
        # A clock that never moves: a terminating pod stays, as with no kubelet.
        simulated = Simulated(namespace, ObjectStore(EventQueue()))
        return simulated, Side(simulated), Side(Real(admin, namespace))

    return fresh


@settings(
    max_examples=100,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking (docstring)
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=st.lists(steps, min_size=1, max_size=12), after=watches)
def test_both_servers_answer_any_sequence_alike(
    sides: Callable[[], tuple[Simulated, Side, Side]],
    sequence: list[tuple[Any, ...]],
    after: tuple[str, int, Selector | None],
) -> None:
    server, simulated, real = sides()
    try:
        for number, step in enumerate([*PRELUDE, *sequence, *CODA]):
            done = len(real.answers)
            for side in (simulated, real):
                run(side, step)
            new = simulated.answers[done:], real.answers[done:]
            assert new[0] == new[1], f"step {number}: {step}\n{difference(*new)}"
            # What the sequences reach (pytest --hypothesis-show-statistics).
            event(f"{step[0]} {' '.join(str(answer[0]) for answer in new[1])}")
        done = len(real.answers)
        for side in (simulated, real):
            watch(side, *after)
        new = simulated.answers[done:], real.answers[done:]
        assert new[0] == new[1], f"the watch {after}\n{difference(*new)}"
        event(f"watch {after[0]}: {len(new[1][-1]) - 1} events before the last")
    finally:
        server.close()


def test_a_patch_naming_the_cluster_with_a_number_is_refused_alike(
    sides: Callable[[], tuple[Simulated, Side, Side]],
) -> None:
    """`metadata.name` patched to a number: kube-apiserver cannot decode the patched
    object into an ObjectMeta and answers 422 Invalid on the field `patch`, quoting the
    whole patched object (uid, times) and json-iterator's error with byte offsets; the
    simulated server raised TypeError in its validation and dropped the connection.
    Compared: code, reason, details, the causes' fields and reasons, and each message
    up to the quoted object and from the decoder's words to where offsets begin."""
    server, simulated, real = sides()
    try:
        for step in PRELUDE:
            for side in (simulated, real):
                run(side, step)
        for body, content_type in (
            ([{"op": "replace", "path": "/metadata/name", "value": 5}], JSON_PATCH),
            ({"metadata": {"name": 5}}, MERGE_PATCH),
        ):
            said = []
            for side in (simulated, real):
                side.send("PATCH", f"{side.clusters()}/c0", body, content_type)
                code, status = side.answers[-1]
                (cause,) = status["details"].pop("causes")
                said.append(
                    (
                        code,
                        status["reason"],
                        status["details"],
                        cause["field"],
                        cause["reason"],
                        status["message"].split('Invalid value: "')[0],
                        cause["message"].startswith('Invalid value: "{'),
                        all(
                            "v1.ObjectMeta." in text
                            and 'ReadString: expects " or n, but found 5' in text
                            for text in (cause["message"], status["message"])
                        ),
                    )
                )
            assert said[0] == said[1], said
            assert said[0][0] == 422 and said[0][6] and said[0][7]
    finally:
        server.close()
