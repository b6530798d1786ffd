"""How k8s.io/apimachinery names a field and words an error about it: `field.Error`
(`<field>: <type>[: <value>][: <detail>]`, the bad value printed as Go prints it),
kube-openapi's field paths (`spec.workerGroupSpecs[0].replicas`) and
`apierrors.NewInvalid`'s message for a rejected RayCluster."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tpu_autoscaler.controlplane.crd_schema import GROUP, KIND

OMITTED: Final = object()
"""A field error that shows no value (Go's `field.OmitValueType`)."""


@dataclass(frozen=True)
class FieldError:
    """One `field.Error`: `<field>: <type>[: <value>][: <detail>]`."""

    field: str
    type: str
    bad_value: object = OMITTED
    detail: str = ""

    def __str__(self) -> str:
        body = self.type
        if self.bad_value is not OMITTED and self.type not in ("Required value", "Too long"):
            body = f"{self.type}: {go_value(self.bad_value)}"
        return f"{self.field}: {body}: {self.detail}" if self.detail else f"{self.field}: {body}"


def go_value(value: object) -> str:
    """A bad value as `field.Error.ErrorBody` prints it: simple types with `%v`, strings
    with `%q`, anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return go_number(value)
    if isinstance(value, str):
        return go_quote(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def go_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def invalid_message(name: str, errors: Sequence[FieldError]) -> str:
    """`apierrors.NewInvalid`'s message: one error as is, several (deduplicated) in
    brackets, comma separated."""
    texts = list(dict.fromkeys(str(e) for e in errors))
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return f"{KIND}.{GROUP} {go_quote(name)} is invalid: {joined}"


def go_path(parts: Sequence[str | int]) -> str:
    """A path as kube-openapi names it: `spec.workerGroupSpecs[0].replicas`."""
    text = ""
    for part in parts:
        text = f"{text}[{part}]" if isinstance(part, int) else join_path(text, part)
    return text


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
