"""`KubeApi` on the official Kubernetes client: the RayCluster, its pods and Events
over the API server's REST API, with bounded retries and the errors of `kube_api`.

Guarded patches. A JSON patch (RFC 6902) has no field for a precondition, but the
API server applies a patch to the stored object and then stores the result through
the same update path as a PUT, which is guarded by the resourceVersion of the
object being written. A patch that sets `metadata.resourceVersion` therefore makes
that version a precondition: if the stored object has moved on, the write fails
with 409 Conflict. So `patch_raycluster` prepends
`{"op": "replace", "path": "/metadata/resourceVersion", "value": <version read>}`.
A `test` operation on the version would also refuse a stale write, but the API
server answers a failed `test` with 422 Invalid, which cannot be told from a
validation failure. Sources:
- kubernetes/kubernetes#15420 (hack/test-cmd.sh: "If resourceVersion is specified
  in the patch, it will be treated as a precondition ... the Patch should be
  rejected"), and #15416;
- kubernetes/kubernetes#63104 (the patched object carrying resourceVersion=N "is
  effectively a precondition on that version", giving normal resourceVersion
  semantics when it is stored);
- kubernetes/kubernetes#87951 (liggitt: "for patch, if you want resourceVersion as
  a precondition, you need to embed it in the patch content");
- kubernetes/kubernetes#68838 (a failed JSON patch `test` is 422, after #68202
  reported it as 500).

Retries. 429, 5xx, timeouts and dropped connections are retried with capped,
fully jittered exponential backoff; urllib3's own retries are off (`kubernetes_api`)
so a request is never sent more often than `RetryPolicy.attempts`. A guarded patch
is safe to resend after a lost answer: if the first copy was applied, the object's
version has moved on and the resend is a Conflict, so the change applies at most
once. So is a patch that first tests `/metadata/generation` (`guarded.GuardedApply`'s
re-send after a status write): its own change moved the generation, so the resend
fails the test (422). An unguarded patch is resent only when the failure proves nothing reached the
server (no connection, 429); otherwise it ends as Unavailable. An Event gets its
name on the client, so a resent Event that was created meets 409 AlreadyExists,
which then counts as created."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException
from random import Random
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import ConnectTimeoutError, HTTPError, MaxRetryError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from tpu_autoscaler.adapters.kube.api import (
    JSON_PATCH,
    MERGE_PATCH,
    ApiError,
    Conflict,
    JsonPatch,
    NotFound,
    Rejected,
    Unavailable,
)

RAYCLUSTER_GROUP = "ray.io"
RAYCLUSTER_VERSION = "v1"
RAYCLUSTER_PLURAL = "rayclusters"
MESSAGE_LIMIT = 300
"""Characters of the API server's own message kept in an error."""

_TRANSPORT_ERRORS = (HTTPError, HTTPException, OSError)


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; before try n+1 a pause drawn uniformly from
    [0, min(cap_s, base_s * 2**(n-1))] ("full jitter": clients that failed together
    do not retry together)."""

    attempts: int = 4
    base_s: float = 0.2
    cap_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.cap_s < self.base_s:
            raise ValueError(f"invalid retry policy {self}")

    def ceiling_s(self, retry: int) -> float:
        """The longest pause before retry number `retry` (1 for the first)."""
        return float(min(self.cap_s, self.base_s * 2 ** (retry - 1)))

    def pause_s(self, retry: int, random: Random) -> float:
        return random.uniform(0.0, self.ceiling_s(retry))


DEFAULT_RETRY = RetryPolicy()
DEFAULT_TIMEOUT_S = 10.0


def kubernetes_api(host: str | None = None) -> client.ApiClient:
    """An API client: `host` (tests, proxies) if given, else in-cluster, else
    kubeconfig; with urllib3's retries off, as `KubernetesApi` does its own."""
    configuration = client.Configuration()
    if host is not None:
        configuration.host = host
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            config.load_kube_config(client_configuration=configuration)
    # False, not 0: urllib3 then raises the transport error itself instead of
    # wrapping it, and never resends on its own.
    configuration.retries = False
    return client.ApiClient(configuration)


class KubernetesApi:
    """`KubeApi` over HTTP. Every request is bounded by `timeout_s` and retried by
    `retry`; `sleep` and `random` are the clock and dice of the backoff."""

    def __init__(
        self,
        api_client: client.ApiClient,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        sleep: Callable[[float], None] = time.sleep,
        random: Random | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.api_client = api_client
        self.retry = retry
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._random = random if random is not None else Random()
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        raycluster: dict[str, Any] = self._call(
            f"raycluster {namespace}/{name}",
            lambda: self._objects.get_namespaced_custom_object(
                RAYCLUSTER_GROUP,
                RAYCLUSTER_VERSION,
                namespace,
                RAYCLUSTER_PLURAL,
                name,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
        )
        return raycluster

    def list_pods(
        self, namespace: str, selector: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The pods as the API serves them (camelCase JSON), not as client models."""
        label_selector = ",".join(f"{k}={v}" for k, v in (selector or {}).items())
        what = f"pods in {namespace}" + (f" with {label_selector}" if label_selector else "")
        body = self._call(
            what,
            lambda: self._core.list_namespaced_pod(
                namespace,
                label_selector=label_selector or None,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The Events as the API serves them (camelCase JSON), not as client models."""
        what = f"events in {namespace}" + (f" with {field_selector}" if field_selector else "")
        body = self._call(
            what,
            lambda: self._core.list_namespaced_event(
                namespace,
                field_selector=field_selector or None,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    def patch_raycluster(
        self, namespace: str, name: str, operations: JsonPatch, resource_version: str | None
    ) -> dict[str, Any]:
        guarded = list(operations)
        if resource_version is not None:
            guard = {"op": "replace", "path": "/metadata/resourceVersion"}
            guarded.insert(0, {**guard, "value": resource_version})
        patched: dict[str, Any] = self._call(
            f"raycluster {namespace}/{name}",
            lambda: self._objects.patch_namespaced_custom_object(
                RAYCLUSTER_GROUP,
                RAYCLUSTER_VERSION,
                namespace,
                RAYCLUSTER_PLURAL,
                name,
                guarded,
                _content_type=JSON_PATCH,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
            resendable=resource_version is not None or _tests_generation(operations),
        )
        return patched

    def resize_pod(self, namespace: str, name: str, operations: JsonPatch) -> dict[str, Any]:
        # Resendable: it sets values, so a second copy changes nothing more.
        resized: dict[str, Any] = self._call(
            f"pod {namespace}/{name} resize",
            lambda: self._core.patch_namespaced_pod_resize(
                name,
                namespace,
                list(operations),
                _content_type=JSON_PATCH,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
        )
        return resized

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._call(
            f"pod {namespace}/{name}",
            lambda: self._core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"annotations": annotations}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
        )

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        named = {**event, "metadata": dict(event.get("metadata") or {})}
        meta = named["metadata"]
        meta.setdefault("namespace", namespace)
        if not meta.get("name"):
            # Named here, not by the server's generateName, so that a resend after a
            # lost answer meets the first copy instead of making a second.
            stem = meta.get("generateName") or _event_stem(event)
            meta["name"] = f"{stem}{self._random.getrandbits(64):016x}"
            meta.pop("generateName", None)
        self._call(
            f"event {namespace}/{meta['name']}",
            lambda: self._post(f"/api/v1/namespaces/{namespace}/events", named),
            created_if_exists=True,
        )

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body` exactly as given: the generated `create_namespaced_event` would
        first turn it into a client model, which rejects fields it does not know and
        rewrites timestamps (an Event's microsecond `eventTime` loses its fraction)."""
        request = self.api_client.param_serialize(
            method="POST",
            resource_path=path,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=self.timeout_s)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    def _call(
        self,
        what: str,
        send: Callable[[], Any],
        *,
        resendable: bool = True,
        created_if_exists: bool = False,
    ) -> Any:
        """`send()` until it answers, as JSON, within the retry policy. `what` names
        the object in errors; a request that is not `resendable` is retried only
        when it cannot have reached the server."""
        maybe_applied = False
        error: ApiError = Unavailable(f"{what}: not attempted")
        for attempt in range(1, self.retry.attempts + 1):
            if attempt > 1:
                self._sleep(self.retry.pause_s(attempt - 1, self._random))
            try:
                data = send().data
            except ApiException as exc:
                if exc.status == 409 and maybe_applied and created_if_exists:
                    return None
                error = _status_error(what, exc, maybe_applied)
                reached = error.transient and exc.status != 429
            except _TRANSPORT_ERRORS as exc:
                error = Unavailable(f"{what}: {_transport_failure(exc, self.timeout_s)}")
                reached = not _never_connected(exc)
            else:
                try:
                    return json.loads(data)
                except ValueError:
                    raise ApiError(f"{what}: the answer is not JSON") from None
            if not error.transient:
                raise error from None
            maybe_applied = maybe_applied or reached
            if reached and not resendable:
                raise Unavailable(f"{error}; not resent, it may have been applied") from None
        raise Unavailable(f"{error} ({self.retry.attempts} attempts)") from None


def _status_error(what: str, exc: ApiException, maybe_applied: bool) -> ApiError:
    code = int(exc.status or 0)
    if code == 0:
        # No HTTP answer (TLS failed, or the request could not be built): the
        # reason's first line names the failure, the rest can quote the URL.
        return ApiError(f"{what}: {str(exc.reason or 'no answer').splitlines()[0]}")
    detail = f"{what}: {code} {exc.reason or ''}".rstrip()
    message = _server_message(exc.body)
    if message:
        detail = f"{detail}: {message}"
    error: ApiError
    if code == 404:
        error = NotFound(detail)
    elif code == 409:
        if maybe_applied:
            detail += " (an earlier attempt's answer was lost: it may be this write's own)"
        error = Conflict(detail)
    elif code in (400, 422):
        error = Rejected(detail)
    elif code == 429 or 500 <= code <= 599:
        error = Unavailable(detail)
    else:
        error = ApiError(detail)
    error.status = code
    return error


def _server_message(body: Any) -> str:
    """The `message` of a `Status` body: the server's words, never the headers."""
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message[:MESSAGE_LIMIT] if isinstance(message, str) else ""


def _transport_failure(exc: BaseException, timeout_s: float) -> str:
    """What went wrong, by kind only: transport errors' texts carry URLs (and, for
    proxies, possibly credentials)."""
    cause = _root(exc)
    if isinstance(cause, ConnectTimeoutError | ConnectionRefusedError):
        return f"cannot connect ({type(cause).__name__})"
    if isinstance(cause, Urllib3Timeout | TimeoutError):
        return f"no answer within {timeout_s:g}s"
    inner = cause.args[-1] if cause.args else None
    suffix = f", {type(inner).__name__}" if isinstance(inner, BaseException) else ""
    return f"connection lost ({type(cause).__name__}{suffix})"


def _never_connected(exc: BaseException) -> bool:
    """True when the request cannot have reached the server (no connection made)."""
    return isinstance(_root(exc), ConnectTimeoutError | ConnectionRefusedError)


def _root(exc: BaseException) -> BaseException:
    while isinstance(exc, MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    return exc


def _event_stem(event: dict[str, Any]) -> str:
    involved = event.get("involvedObject") or {}
    return f"{involved.get('name') or 'tpu-autoscaler'}."


def _tests_generation(operations: JsonPatch) -> bool:
    """Whether the patch is conditional on the generation (its first operation tests
    it), so that a second copy of it cannot apply."""
    first = operations[0] if operations else {}
    return first.get("op") == "test" and first.get("path") == "/metadata/generation"
