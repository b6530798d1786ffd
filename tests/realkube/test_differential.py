"""Do the simulated API server and a real kube-apiserver 1.20.2 answer any sequence of
the requests this project's code paths send alike? Hypothesis generates sequences
(creates of RayClusters and pods, GETs, pod lists by equality and set-based selectors,
JSON and merge patches unguarded or guarded by a current or stale resourceVersion,
status writes through the status subresource, pod deletes with grace periods and
preconditions, bound and unbound) and each is sent to both servers over HTTP through
the official client; after the sequence, a watch from a version seen in it. Every
answer must match: status code, reason, body, stored objects, watch events (compared
as `differential.normalise` leaves them). Each example gets a fresh simulated server
and a fresh namespace on the real one."""

from __future__ import annotations

import copy
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from kubernetes import client

from tests.realkube.differential import Versions, allowed, difference, normalise, watch_until
from tests.realkube.endpoints import (
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    Endpoint,
    Real,
    Simulated,
    pod,
    raycluster,
)
from tpu_autoscaler.controlplane.clock import EventQueue
from tpu_autoscaler.controlplane.store import ObjectStore

pytestmark = pytest.mark.kube_real

CLUSTERS = ("c0", "c1")
PODS = ("p0", "p1", "p2")
KEYS = ("app", "tier")
VALUES = ("a", "b")
LAST = "zz-last"
"""The object created after a sequence, whose ADDED event ends the watch read."""

PRELUDE: list[tuple[Any, ...]] = [
    ("create_cluster", "c0"),
    ("create_pod", "p0", {"app": "a"}, True, None),
    ("create_pod", "p1", {"tier": "b"}, False, None),
]
"""The steps every sequence starts with, so that most of its requests meet objects."""

# --- what a step sends ----------------------------------------------------------------

Guard = tuple[str, int]
"""("none", _), ("current", _): the object's newest version seen, ("seen", k): the k-th
version seen on that server (stale, or by chance current), ("empty", _)."""

guards = st.tuples(
    st.sampled_from(["none", "current", "current", "seen", "empty"]), st.integers(0, 9)
)

labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)


@dataclass(frozen=True)
class Selector:
    """A label selector as the test means it: (key, operator, values) requirements, read
    here by the documented semantics, independently of the simulator's parser."""

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]

    def __repr__(self) -> str:
        return repr(self.text)

    @property
    def text(self) -> str:
        parts = []
        for key, operator, values in self.requirements:
            if operator in ("in", "notin"):
                parts.append(f"{key} {operator} ({','.join(values)})")
            elif operator == "exists":
                parts.append(key)
            elif operator == "!":
                parts.append(f"!{key}")
            else:
                parts.append(f"{key}{operator}{values[0]}")
        return ",".join(parts)

    def selects(self, pod_labels: dict[str, str]) -> bool:
        return all(_holds(pod_labels.get(k), op, values) for k, op, values in self.requirements)


def _holds(value: str | None, operator: str, values: tuple[str, ...]) -> bool:
    if operator in ("=", "=="):
        return value == values[0]
    if operator == "!=":
        return value != values[0]
    if operator == "in":
        return value in values
    if operator == "notin":
        return value not in values
    if operator == "exists":
        return value is not None
    return value is None  # "!"


@st.composite
def selectors(draw: st.DrawFn) -> Selector:
    """A label selector of one or two requirements, each operator of equality and sets."""
    requirements = []
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from((*KEYS, "gone")))
        values = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True))
        operator = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!"]))
        requirements.append((key, operator, tuple(values)))
    return Selector(tuple(requirements))


SPEC_CHANGES: list[tuple[str, Any]] = [
    ("/spec/workerGroupSpecs/0/replicas", 1),
    ("/spec/workerGroupSpecs/0/replicas", 2),
    ("/spec/workerGroupSpecs/0/replicas", "two"),
    ("/spec/rayVersion", "2.61.0"),
    ("/spec/autoscalerOptions/idleTimeoutSeconds", 120),
    ("/spec/autoscalerOptions/upscalingMode", "Sideways"),
    ("/spec/unknownField", 1),
    ("/metadata/labels", {"app": "a"}),
]
STATUSES: list[dict[str, Any]] = [
    {"state": "ready"},
    {"state": "suspended", "availableWorkerReplicas": 2},
    {"desiredWorkerReplicas": 1, "unknownField": 1},
    {"state": 3},
]

steps = st.one_of(
    st.tuples(st.just("create_cluster"), st.sampled_from(CLUSTERS)),
    st.tuples(
        st.just("create_pod"),
        st.sampled_from(PODS),
        labels,
        st.booleans(),
        st.sampled_from([None, 0, 20]),
    ),
    st.tuples(st.just("get_cluster"), st.sampled_from(CLUSTERS)),
    st.tuples(st.just("get_pod"), st.sampled_from(PODS)),
    st.tuples(st.just("list_pods"), st.one_of(st.none(), selectors())),
    st.tuples(
        st.just("patch"),
        st.sampled_from(CLUSTERS),
        st.sampled_from([JSON_PATCH, MERGE_PATCH]),
        st.sampled_from(range(len(SPEC_CHANGES))),
        guards,
    ),
    st.tuples(
        st.just("status"),
        st.sampled_from(CLUSTERS),
        st.sampled_from(["PUT", MERGE_PATCH, JSON_PATCH]),
        st.sampled_from(range(len(STATUSES))),
        guards,
    ),
    st.tuples(
        st.just("delete_pod"),
        st.sampled_from(PODS),
        st.sampled_from([None, 0, 5, 40]),
        guards,
    ),
)

watches = st.tuples(
    st.sampled_from(["pods", "rayclusters"]), st.integers(0, 4), st.one_of(st.none(), selectors())
)

# --- one server's side of a sequence -------------------------------------------------


@dataclass
class Side:
    """A server under test and what the test has seen on it."""

    endpoint: Endpoint
    versions: Versions = field(default_factory=Versions)
    newest: dict[str, str] = field(default_factory=dict)
    """Each object's newest resourceVersion seen ("kind/name")."""
    answers: list[Any] = field(default_factory=list)

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        answer = self.endpoint.request(method, path, body, content_type, query)
        self._remember(answer.body)
        self.answers.append(allowed(normalise((answer.status, answer.body), self.versions)))
        return answer.body

    def _remember(self, body: Any) -> None:
        objects = body.get("items", [body]) if isinstance(body, dict) else []
        for obj in objects:
            meta = obj.get("metadata") or {}
            if obj.get("kind") in ("Pod", "RayCluster") and "resourceVersion" in meta:
                self.newest[f"{obj['kind']}/{meta['name']}"] = meta["resourceVersion"]

    def guard(self, guard: Guard, key: str) -> str | None:
        kind, index = guard
        if kind == "current":
            return self.newest.get(key, "1")
        if kind == "seen":
            seen = self.versions.seen
            return seen[index % len(seen)] if seen else "1"
        return "" if kind == "empty" else None

    def pods(self) -> str:
        return self.endpoint.pods_path()

    def clusters(self) -> str:
        return f"/apis/ray.io/v1/namespaces/{self.endpoint.namespace}/rayclusters"


def run(side: Side, step: tuple[Any, ...]) -> None:
    verb, name, *rest = step
    namespace = side.endpoint.namespace
    if verb == "create_cluster":
        obj = raycluster(namespace)
        obj["metadata"]["name"] = name
        side.send("POST", side.clusters(), obj)
    elif verb == "create_pod":
        pod_labels, bound, grace = rest
        obj = pod(namespace, name, pod_labels, "node-1" if bound else None)
        if grace is not None:
            obj["spec"]["terminationGracePeriodSeconds"] = grace
        side.send("POST", side.pods(), obj)
    elif verb == "get_cluster":
        side.send("GET", f"{side.clusters()}/{name}")
    elif verb == "get_pod":
        side.send("GET", f"{side.pods()}/{name}")
    elif verb == "list_pods":
        side.send("GET", side.pods(), query=[] if name is None else [("labelSelector", name.text)])
    elif verb == "patch":
        content_type, change, guard = rest
        path, value = SPEC_CHANGES[change]
        version = side.guard(guard, f"RayCluster/{name}")
        body = _patch(content_type, path, value, version)
        side.send("PATCH", f"{side.clusters()}/{name}", body, content_type)
    elif verb == "status":
        how, status, guard = rest
        version = side.guard(guard, f"RayCluster/{name}")
        target = f"{side.clusters()}/{name}/status"
        if how == "PUT":
            obj = side.send("GET", target)
            if obj.get("kind") != "RayCluster":  # not found: a RayCluster all the same
                obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}}
            obj["status"] = copy.deepcopy(STATUSES[status])
            _set_version(obj, version)
            side.send("PUT", target, obj)
        else:
            body = _patch(how, "/status", STATUSES[status], version)
            side.send("PATCH", target, body, how)
    elif verb == "delete_pod":
        grace, guard = rest
        options: dict[str, Any] = {}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        version = side.guard(guard, f"Pod/{name}")
        if version is not None:
            options["preconditions"] = {"resourceVersion": version}
        side.send("DELETE", f"{side.pods()}/{name}", options)


def _patch(content_type: str, path: str, value: Any, version: str | None) -> Any:
    if content_type == JSON_PATCH:
        operations = [{"op": "add", "path": path, "value": value}]
        if version is not None:
            guard = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
            operations.insert(0, guard)
        return operations
    body: dict[str, Any] = {}
    target: Any = body
    *parents, last = path.strip("/").split("/")
    for part in parents:
        if part == "workerGroupSpecs":
            # A merge patch replaces a list whole: the example's groups, one changed.
            target = target.setdefault(part, raycluster("")["spec"][part])
        else:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    target[last] = value
    if version is not None:
        body.setdefault("metadata", {})["resourceVersion"] = version
    return body


def _set_version(obj: dict[str, Any], version: str | None) -> None:
    if version is None:
        obj["metadata"].pop("resourceVersion", None)
    else:
        obj["metadata"]["resourceVersion"] = version


def watch(side: Side, resource: str, since: int, selector: Selector | None) -> None:
    """After the sequence: a watch from the `since`-th version seen, read up to the ADDED
    event of an object created last (made to match `selector`)."""
    namespace = side.endpoint.namespace
    seen = side.versions.seen
    query = [("resourceVersion", seen[min(since, len(seen) - 1)] if seen else "0")]
    if resource == "pods":
        last_labels = _matching(selector)
        if last_labels is None:
            selector = None
        if selector is not None:
            query.append(("labelSelector", selector.text))
        side.send("POST", side.pods(), pod(namespace, LAST, last_labels or {}))
        path, kind = side.pods(), "Pod"
    else:
        obj = raycluster(namespace)
        obj["metadata"]["name"] = LAST
        side.send("POST", side.clusters(), obj)
        path, kind = side.clusters(), "RayCluster"
    events = watch_until(side.endpoint.api_client, path, query, (kind, LAST))
    side.answers.append(allowed(normalise(events, side.versions)))


def _matching(selector: Selector | None) -> dict[str, str] | None:
    """The first labels (over the keys and values steps use) that `selector` selects,
    None if none do."""
    options = [(None, *VALUES)] * (len(KEYS) + 1)
    for values in itertools.product(*options):
        candidate = {k: v for k, v in zip((*KEYS, "gone"), values, strict=True) if v is not None}
        if selector is None or selector.selects(candidate):
            return candidate
    return None


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
    max_examples=60,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: see the docstring
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
        for number, step in enumerate([*PRELUDE, *sequence]):
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
