"""`KubernetesProvisioningApi` over real HTTP against a small stand-in server that
keeps ProvisioningRequests and PodTemplates by URL: the paths, verbs and label
selectors the official client sends, bodies as given, a create whose answer was lost
counted as created on resend, and a missing object as NotFound."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tpu_autoscaler.adapters.kube.api import NotFound
from tpu_autoscaler.adapters.kube.client import KubernetesApi, RetryPolicy, kubernetes_api
from tpu_autoscaler.adapters.kube.provreq_client import KubernetesProvisioningApi

REQUESTS = "/apis/autoscaling.x-k8s.io/v1/namespaces/ns/provisioningrequests"
TEMPLATES = "/api/v1/namespaces/ns/podtemplates"


class Server(ThreadingHTTPServer):
    objects: dict[str, dict[str, Any]]
    seen: list[tuple[str, str]]
    lose_next_create_answer: bool


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.server.seen.append(("GET", self.path))
        wanted = dict(
            pair.split("=", 1)
            for pair in parse_qs(url.query).get("labelSelector", [""])[0].split(",")
            if pair
        )
        items = [
            obj
            for key, obj in sorted(self.server.objects.items())
            if key.rsplit("/", 1)[0] == url.path
            and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        self._answer(200, {"items": items})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append(("POST", self.path))
        key = f"{urlsplit(self.path).path}/{body['metadata']['name']}"
        if key in self.server.objects:
            self._answer(409, {"kind": "Status", "message": "already exists"})
            return
        self.server.objects[key] = body
        if self.server.lose_next_create_answer:
            self.server.lose_next_create_answer = False
            self._answer(503, {"kind": "Status", "message": "answer lost"})
            return
        self._answer(201, body)

    def do_DELETE(self) -> None:
        self.server.seen.append(("DELETE", self.path))
        if self.server.objects.pop(urlsplit(self.path).path, None) is None:
            self._answer(404, {"kind": "Status", "message": "not found"})
            return
        self._answer(200, {"kind": "Status", "status": "Success"})


@pytest.fixture
def served() -> Iterator[tuple[KubernetesProvisioningApi, Server]]:
    server = Server(("127.0.0.1", 0), Handler)
    server.objects, server.seen, server.lose_next_create_answer = {}, [], False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    kube = KubernetesApi(kubernetes_api(host), RetryPolicy(attempts=3, base_s=0.0, cap_s=0.0))
    try:
        yield KubernetesProvisioningApi(kube), server
    finally:
        server.shutdown()
        server.server_close()


def _obj(name: str, group: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"tpu-autoscaler.dev/group": group}}}


def test_requests_and_templates_round_trip(
    served: tuple[KubernetesProvisioningApi, Server],
) -> None:
    api, server = served
    api.create_pod_template("ns", {"apiVersion": "v1", "kind": "PodTemplate", **_obj("a", "g")})
    request = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest"}
    api.create_provisioning_request("ns", {**request, **_obj("a", "g")})
    api.create_provisioning_request("ns", {**request, **_obj("b", "h")})
    names = [
        r["metadata"]["name"]
        for r in api.list_provisioning_requests("ns", {"tpu-autoscaler.dev/group": "g"})
    ]
    assert names == ["a"]
    assert [t["metadata"]["name"] for t in api.list_pod_templates("ns")] == ["a"]
    api.delete_provisioning_request("ns", "a")
    api.delete_pod_template("ns", "a")
    assert [r["metadata"]["name"] for r in api.list_provisioning_requests("ns")] == ["b"]
    assert ("POST", REQUESTS) in server.seen and ("POST", TEMPLATES) in server.seen
    assert ("DELETE", f"{REQUESTS}/a") in server.seen and (
        "DELETE",
        f"{TEMPLATES}/a",
    ) in server.seen
    assert any(m == "GET" and p.startswith(REQUESTS + "?labelSelector=") for m, p in server.seen)


def test_a_create_whose_answer_was_lost_counts_as_created_once(
    served: tuple[KubernetesProvisioningApi, Server],
) -> None:
    api, server = served
    server.lose_next_create_answer = True
    api.create_provisioning_request("ns", _obj("a", "g"))
    assert [p for m, p in server.seen if m == "POST"] == [REQUESTS, REQUESTS]
    assert len(api.list_provisioning_requests("ns")) == 1


def test_deleting_what_is_gone_is_not_found(
    served: tuple[KubernetesProvisioningApi, Server],
) -> None:
    api, _ = served
    with pytest.raises(NotFound):
        api.delete_provisioning_request("ns", "gone")
    with pytest.raises(NotFound):
        api.delete_pod_template("ns", "gone")
