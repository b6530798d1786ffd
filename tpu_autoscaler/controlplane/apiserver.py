"""The simulator's `ObjectStore` served over HTTP as the Kubernetes API server serves
it, so the production client (`adapters.kube.client`) can be tested end to end
on loopback: a threaded HTTP server on 127.0.0.1, each request answered by the API's
routes (`apiserver_routes`: the same REST paths, `Status` error bodies and status codes,
the resourceVersion precondition; a watch streamed as its events come) unless a fault
injected for it (`apiserver_faults`) answers with an error status, drops the connection
before or after the store applied the request, or holds the handler until released."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from tpu_autoscaler.controlplane.apiserver_faults import SLOW_HANDLER_LIMIT_S, Fault, Traffic
from tpu_autoscaler.controlplane.apiserver_replies import Reply, status_body
from tpu_autoscaler.controlplane.apiserver_routes import Routes
from tpu_autoscaler.controlplane.store import ObjectStore

SHUTDOWN_POLL_S = 0.02


class ApiServer:
    """Serves `store` on 127.0.0.1 (a free port) from a daemon thread. Every store
    access holds `lock`, so a simulation thread that holds it too can share the store."""

    def __init__(self, store: ObjectStore, lock: threading.RLock | None = None) -> None:
        self.store = store
        self.lock = lock if lock is not None else threading.RLock()
        self.traffic = Traffic()
        self.requests: list[tuple[str, str]] = self.traffic.requests
        """(method, path with query) of every request received, oldest first."""
        self.routes = Routes(store)
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
        self.routes.watches.close()
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
        self.traffic.inject(*faults)

    @property
    def pending_faults(self) -> int:
        return self.traffic.pending_faults

    def release_slow(self) -> None:
        """Let every request held by a `slow` fault so far proceed."""
        self.traffic.release_slow()

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is being handled (held ones included); False if
        `timeout_s` passed first."""
        return self.traffic.wait_idle(timeout_s)

    # --- the API ---------------------------------------------------------------------

    def _dispatch(
        self, method: str, target: str, content_type: str, body: bytes
    ) -> tuple[int, bytes] | Iterator[dict[str, Any]]:
        """The status and body, or a watch's events (read without the lock: nothing
        changes a stored object in place)."""
        url = urlsplit(target)
        path = unquote(url.path)
        with self.lock:
            reply = self.routes.route(method, path, parse_qs(url.query), content_type, body)
            if not isinstance(reply, Reply):
                return reply
            # Serialised under the lock: listed pods are the store's own objects.
            return reply.code, json.dumps(reply.body).encode()


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

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        api = cast(_HttpServer, self.server).api
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = api.traffic.begin(method, self.path)
        try:
            if fault is not None and fault.kind == "status":
                message = f"injected fault: {fault.code}"
                self._send(fault.code, json.dumps(status_body(fault.code, message)).encode())
                return
            if fault is not None and fault.kind == "drop_before":
                return
            if fault is not None and fault.kind == "slow":
                fault.released.wait(SLOW_HANDLER_LIMIT_S)
            answer = api._dispatch(method, self.path, self.headers.get("Content-Type", ""), body)
            if fault is not None and fault.kind == "drop_after":
                return
            if isinstance(answer, tuple):
                self._send(*answer)
            else:
                self._stream(answer)
        finally:
            self.close_connection = True
            api.traffic.end()

    def _send(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, events: Iterator[dict[str, Any]]) -> None:
        """A watch: one JSON event per chunk as each comes, as kube-apiserver streams
        it (chunked, so HTTP/1.1), until the watch ends."""
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for event in events:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass
