"""What the simulated API server answers with: a status code and a JSON body, and for an
error the `Status` body kube-apiserver sends (its reason for each code, `details`)."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

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


@dataclass
class Reply:
    code: int
    body: dict[str, Any]


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, HTTPStatus(code).phrase.replace(" ", "")),
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def error(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> Reply:
    return Reply(code, status_body(code, message, reason, details))
