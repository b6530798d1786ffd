"""What "the same answer" means when the simulated and the real API server are compared
request by request (tests/realkube/test_differential.py): ids, times and
managedFields aside, resourceVersions mapped to tokens by order of appearance (so
"the same version", "a new version" and "an older version than one seen" are still
compared), and each known, accepted difference normalised by a named allowance listed
in docs/simulator.md. Also: a watch read up to an object's ADDED event on either
server."""

from __future__ import annotations

import copy
import difflib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from tests.realkube.endpoints import JSON

TIME_FIELDS = ("creationTimestamp", "deletionTimestamp")
DROPPED_FIELDS = ("uid", "managedFields")
PRECONDITION = re.compile(
    r"precondition \((\d*)\) does not match the ResourceVersion in record \((\d+)\)"
)

Allowance = Callable[[Any], Any]

SCHEMA_INDEX = re.compile(r"(spec\.[\w.\[\]]*?)\[\d+\]")


def _unindexed_schema_paths(answer: Any) -> Any:
    """A schema error's field path without list indexes (`spec.workerGroupSpecs.replicas`),
    as kube-apiserver 1.20 writes it; current Kubernetes, and the simulator, write
    `spec.workerGroupSpecs[0].replicas`."""
    if isinstance(answer, list):
        return [_unindexed_schema_paths(item) for item in answer]
    if isinstance(answer, dict):
        return {key: _unindexed_schema_paths(value) for key, value in answer.items()}
    if isinstance(answer, str):
        while SCHEMA_INDEX.search(answer):
            answer = SCHEMA_INDEX.sub(r"\1", answer)
    return answer


ALLOWANCES: dict[str, Allowance] = {"list indexes in schema error paths": _unindexed_schema_paths}
"""Differences accepted on purpose, by name (each listed in docs/simulator.md with its
reason): a function applied to both normalised answers."""


class Versions:
    """One server's resourceVersions as tokens in order of first appearance: `v3` is the
    fourth distinct version seen; `v3<` marks one that appeared after a newer one
    (a version going back)."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.seen: list[str] = []
        self._newest = -1

    def token(self, version: str) -> str:
        if version not in self.tokens:
            number = int(version) if version.isdigit() else -1
            older = "<" if number <= self._newest else ""
            self._newest = max(self._newest, number)
            self.tokens[version] = f"v{len(self.seen)}{older}"
            self.seen.append(version)
        return self.tokens[version]


def normalise(answer: Any, versions: Versions) -> Any:
    """`answer` (a status and body, or a list of watch events) as it is compared: a
    copy, versions tokenised in a fixed walk order, ids and times aside."""
    return _walk(copy.deepcopy(answer), versions)


def _walk(value: Any, versions: Versions) -> Any:
    if isinstance(value, (list, tuple)):
        return [_walk(item, versions) for item in value]
    if not isinstance(value, dict):
        return value
    walked: dict[str, Any] = {}
    for key in sorted(value):
        item = value[key]
        if key == "metadata" and isinstance(item, dict):
            walked[key] = _metadata(item, versions)
        elif key == "message" and isinstance(item, str):
            walked[key] = PRECONDITION.sub(
                lambda m: (
                    f"precondition ({m[1] and versions.token(m[1])}) does not match the "
                    f"ResourceVersion in record ({versions.token(m[2])})"
                ),
                item,
            )
        elif key == "details" and isinstance(item, dict):
            walked[key] = {k: v for k, v in item.items() if k != "uid"}
        else:
            walked[key] = _walk(item, versions)
    return walked


def _metadata(meta: dict[str, Any], versions: Versions) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key in sorted(meta):
        if key in DROPPED_FIELDS:
            continue
        if key in TIME_FIELDS:
            kept[key] = "<time>"
        elif key == "resourceVersion" and isinstance(meta[key], str):
            kept[key] = versions.token(meta[key])
        else:
            kept[key] = _walk(meta[key], versions)
    return kept


def difference(simulated: list[Any], real: list[Any]) -> str:
    """The two servers' answers as a unified diff of their JSON (empty if alike)."""
    ours, theirs = (json.dumps(a, indent=1, sort_keys=True).splitlines() for a in (simulated, real))
    return "\n".join(difflib.unified_diff(ours, theirs, "simulated", "real", lineterm="", n=4))


def allowed(answer: Any) -> Any:
    for allowance in ALLOWANCES.values():
        answer = allowance(answer)
    return answer


def watch_until(
    api_client: client.ApiClient,
    path: str,
    query: list[tuple[str, str]],
    last: tuple[str, str],
    timeout_s: float = 5.0,
) -> list[dict[str, Any]]:
    """The events a watch of `path` delivers up to and including the ADDED event of the
    object `last` (kind, name), which the caller created after every request whose
    events it expects; read as they come, with a deadline."""
    request = api_client.param_serialize(
        method="GET",
        resource_path=path,
        header_params={"Accept": JSON},
        query_params=[("watch", "1"), ("timeoutSeconds", "30"), *query],
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request, _request_timeout=(5.0, timeout_s))
    assert response.status == 200, response.read()
    events: list[dict[str, Any]] = []
    buffered = b""
    deadline = time.monotonic() + timeout_s
    try:
        for chunk in response.response.stream(amt=None, decode_content=False):
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in filter(None, lines):
                event = json.loads(line)
                events.append(event)
                obj = event["object"]
                if event["type"] == "ADDED" and (obj.get("kind"), obj["metadata"]["name"]) == last:
                    return events
            assert time.monotonic() < deadline, f"no ADDED {last} within {timeout_s} s"
    finally:
        response.response.close()  # mid-stream: the connection cannot be reused
    raise AssertionError(f"the watch ended before ADDED {last}: {events}")
