"""The simulator's `ObjectStore` served over HTTP as the Kubernetes API server serves
it, so the production client (`adapters.kubernetes_client`) can be tested end to end
on loopback: the same REST paths, `Status` error bodies and status codes, and the
same reading of a `resourceVersion` carried inside a JSON patch as a precondition
(409 when the object moved on; a failed `test` operation is 422).

Faults are injected per request, to exercise the client's retries and their safety:
an error status, a connection dropped before or after the store applied the request,
or a handler held until released (the client times out first)."""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, cast
from urllib.parse import parse_qs, unquote, urlsplit

from tpu_autoscaler.adapters.kube.api import Conflict, NotFound, Rejected
from tpu_autoscaler.controlplane.store import ObjectStore

FaultKind = Literal["status", "drop_before", "drop_after", "slow"]

JSON_PATCH = "application/json-patch+json"
RESOURCE_VERSION_PATH = "/metadata/resourceVersion"
SHUTDOWN_POLL_S = 0.02
SLOW_HANDLER_LIMIT_S = 30.0
"""A held handler proceeds by itself after this long, so a test that forgets to
release it leaves no thread behind for good."""

_RAYCLUSTER = re.compile(r"/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters/([^/]+)")
_PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods")
_EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events")

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True, eq=False)
class Fault:
    """What to do to the next request whose method is `method` (None: any) and whose
    path and query contain `path`. Build one with `status`, `drop_before`,
    `drop_after` or `slow`."""

    kind: FaultKind
    method: str | None = None
    path: str = ""
    code: int = 500
    released: threading.Event = field(default_factory=threading.Event, repr=False)

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or self.method == method) and self.path in target


def status(code: int, method: str | None = None, path: str = "") -> Fault:
    """Answer with `code` and a `Status` body; the store is not touched."""
    return Fault("status", method, path, code)


def drop_before(method: str | None = None, path: str = "") -> Fault:
    """Close the connection without an answer; the store is not touched."""
    return Fault("drop_before", method, path)


def drop_after(method: str | None = None, path: str = "") -> Fault:
    """Apply the request to the store, then close the connection without an answer:
    the client cannot tell this from `drop_before`."""
    return Fault("drop_after", method, path)


def slow(method: str | None = None, path: str = "") -> Fault:
    """Hold the request until `ApiServer.release_slow`, then apply it and answer (to a
    client that has usually given up by then)."""
    return Fault("slow", method, path)


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, HTTPStatus(code).phrase.replace(" ", "")),
        "code": code,
    }


@dataclass
class _Reply:
    code: int
    body: dict[str, Any]


class ApiServer:
    """Serves `store` on 127.0.0.1 (a free port) from a daemon thread. Every store
    access holds `lock`, so a simulation thread that holds it too can share the store."""

    def __init__(self, store: ObjectStore, lock: threading.RLock | None = None) -> None:
        self.store = store
        self.lock = lock if lock is not None else threading.RLock()
        self.requests: list[tuple[str, str]] = []
        """(method, path with query) of every request received, oldest first."""
        self._faults: deque[Fault] = deque()
        self._held: list[Fault] = []
        self._in_flight = 0
        self._state = threading.Condition()
        self._names = 0
        self._list_version = 0
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> ApiServer:
        if self._http is None:
            self._http = _HttpServer(("127.0.0.1", 0), _Handler, self)
            # A short poll: `stop` waits for the serving loop to notice, once per test.
            self._thread = threading.Thread(
                target=self._http.serve_forever,
                args=(SHUTDOWN_POLL_S,),
                name="sim-apiserver",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self.release_slow()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the API server is not running")
        return f"http://127.0.0.1:{self._http.server_port}"

    # --- faults ----------------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each request takes the first queued fault it matches."""
        with self._state:
            self._faults.extend(faults)

    @property
    def pending_faults(self) -> int:
        with self._state:
            return len(self._faults)

    def release_slow(self) -> None:
        """Let every request held by a `slow` fault so far proceed."""
        with self._state:
            held, self._held = self._held, []
        for fault in held:
            fault.released.set()

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is being handled (held ones included); False if
        `timeout_s` passed first."""
        with self._state:
            return self._state.wait_for(lambda: self._in_flight == 0, timeout_s)

    def _begin(self, method: str, target: str) -> Fault | None:
        with self._state:
            self.requests.append((method, target))
            self._in_flight += 1
            fault = next((f for f in self._faults if f.matches(method, target)), None)
            if fault is not None:
                self._faults.remove(fault)
                if fault.kind == "slow":
                    self._held.append(fault)
            return fault

    def _end(self) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()

    # --- the API ---------------------------------------------------------------------

    def _dispatch(
        self, method: str, target: str, content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        url = urlsplit(target)
        path = unquote(url.path)
        with self.lock:
            reply = self._route(method, path, parse_qs(url.query), content_type, body)
            # Serialised under the lock: listed pods are the store's own objects.
            return reply.code, json.dumps(reply.body).encode()

    def _route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        content_type: str,
        body: bytes,
    ) -> _Reply:
        try:
            if match := _RAYCLUSTER.fullmatch(path):
                namespace, name = match.groups()
                try:
                    if method == "GET":
                        return _Reply(200, self.store.get_raycluster(namespace, name))
                    if method == "PATCH":
                        return self._patch_raycluster(namespace, name, content_type, body)
                except NotFound:
                    message = f'rayclusters.ray.io "{name}" not found'
                    return _Reply(404, status_body(404, message))
            elif match := _PODS.fullmatch(path):
                if method == "GET":
                    return self._list_pods(match.group(1), query.get("labelSelector", [""])[0])
            elif match := _EVENTS.fullmatch(path):
                if method == "POST":
                    return self._create_event(match.group(1), body)
            else:
                message = "the server could not find the requested resource"
                return _Reply(404, status_body(404, message))
        except Rejected as exc:
            return _Reply(422, status_body(422, str(exc)))
        return _Reply(405, status_body(405, f"{method} is not supported on {path}"))

    def _patch_raycluster(
        self, namespace: str, name: str, content_type: str, body: bytes
    ) -> _Reply:
        if content_type.split(";")[0].strip() != JSON_PATCH:
            message = f"unsupported media type {content_type!r}: this server takes {JSON_PATCH}"
            return _Reply(415, status_body(415, message))
        try:
            operations = json.loads(body)
        except ValueError as exc:
            return _Reply(400, status_body(400, f"invalid JSON patch: {exc}"))
        if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
            return _Reply(400, status_body(400, "a JSON patch is a list of operations"))
        operations, precondition = split_precondition(operations)
        current = self.store.get_raycluster(namespace, name)
        if precondition is not None and precondition != current["metadata"]["resourceVersion"]:
            # The apiserver applies the patch to the stored object and then stores
            # it guarded by the resourceVersion the patch left on it.
            return _Reply(
                409,
                status_body(
                    409,
                    f'Operation cannot be fulfilled on rayclusters.ray.io "{name}": the object '
                    "has been modified; please apply your changes to the latest version and "
                    "try again",
                ),
            )
        try:
            patched = self.store.patch_raycluster(namespace, name, operations, precondition)
        except Conflict as exc:
            # The version matched, so this is a failed `test` operation: 422, not 409.
            return _Reply(422, status_body(422, str(exc)))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return _Reply(422, status_body(422, f"the JSON patch does not apply: {exc!r}"))
        return _Reply(200, patched)

    def _list_pods(self, namespace: str, selector_text: str) -> _Reply:
        try:
            selector = parse_equality_selector(selector_text)
        except ValueError as exc:
            return _Reply(400, status_body(400, str(exc)))
        items = self.store.list_pods(namespace, selector)
        # A list carries the version it was read at (Ray's KubeRay provider reads it):
        # here the newest listed so far, so it never goes back, as the apiserver's.
        for item in items:
            version = str(item["metadata"].get("resourceVersion", ""))
            if version.isdigit():
                self._list_version = max(self._list_version, int(version))
        meta = {"resourceVersion": str(self._list_version)}
        return _Reply(
            200, {"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items}
        )

    def _create_event(self, namespace: str, body: bytes) -> _Reply:
        try:
            event = json.loads(body)
        except ValueError as exc:
            return _Reply(400, status_body(400, f"invalid JSON: {exc}"))
        if not isinstance(event, dict):
            return _Reply(400, status_body(400, "an Event is a JSON object"))
        meta = event.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            message = "the namespace of the object does not match the namespace of the request"
            return _Reply(400, status_body(400, message))
        if not meta.get("name"):
            if not meta.get("generateName"):
                return _Reply(422, status_body(422, "metadata.name: Required value"))
            self._names += 1
            meta["name"] = f"{meta['generateName']}{self._names:05d}"
        taken = any(
            e["metadata"].get("name") == meta["name"] and e["metadata"]["namespace"] == namespace
            for e in self.store.events
        )
        if taken:
            message = f'events "{meta["name"]}" already exists'
            return _Reply(409, status_body(409, message, "AlreadyExists"))
        self.store.create_event(namespace, event)
        return _Reply(201, self.store.events[-1])


def split_precondition(
    operations: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None]:
    """The patch without the operations that set the resourceVersion, and the version
    they set (the last one wins, as applying them in order would leave it): the
    apiserver keeps the object only if that is still its version. An empty version
    is no precondition, as the apiserver treats it."""
    kept: list[dict[str, Any]] = []
    precondition: str | None = None
    for operation in operations:
        if operation.get("path") == RESOURCE_VERSION_PATH and operation.get("op") in (
            "add",
            "replace",
        ):
            precondition = str(operation.get("value") or "") or None
        else:
            kept.append(operation)
    return kept, precondition


def parse_equality_selector(text: str) -> dict[str, str]:
    """`k=v,k2==v2` as a dict; set-based selectors are beyond this simulator."""
    selector: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep or not key or "!" in key:
            raise ValueError(f"unsupported label selector term {term!r}")
        selector[key.strip()] = value.strip()
    return selector


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        api: ApiServer,
    ) -> None:
        super().__init__(address, handler)
        self.api = api

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out has closed its end; writing to it fails, as meant.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so a dropped connection never takes a
    # pooled keep-alive connection of an unrelated request with it.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        api = cast(_HttpServer, self.server).api
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = api._begin(method, self.path)
        try:
            if fault is not None and fault.kind == "status":
                message = f"injected fault: {fault.code}"
                self._send(fault.code, json.dumps(status_body(fault.code, message)).encode())
                return
            if fault is not None and fault.kind == "drop_before":
                return
            if fault is not None and fault.kind == "slow":
                fault.released.wait(SLOW_HANDLER_LIMIT_S)
            code, payload = api._dispatch(
                method, self.path, self.headers.get("Content-Type", ""), body
            )
            if fault is not None and fault.kind == "drop_after":
                return
            self._send(code, payload)
        finally:
            self.close_connection = True
            api._end()

    def _send(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass
