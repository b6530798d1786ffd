"""How k8s.io/apimachinery names a field and words an error about it: `field.Error`
(`<field>: <type>[: <value>][: <detail>]`, the bad value printed as Go prints it),
kube-openapi's field paths (`spec.workerGroupSpecs[0].replicas`) and
`apierrors.NewInvalid`'s message for a rejected RayCluster."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tpu_autoscaler.adapters.kube.api import Rejected
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


class GoLiteral(str):
    """A bad value printed as is (Go's `%#v` of a value that is not JSON, e.g. `0x0`
    for the uint64 resourceVersion 0)."""


def go_value(value: object) -> str:
    """A bad value as `field.Error.ErrorBody` prints it: simple types with `%v`, strings
    with `%q`, anything else as JSON."""
    if isinstance(value, GoLiteral):
        return str(value)
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


CAUSE_TYPES: Final = {
    "Not found": "FieldValueNotFound",
    "Required value": "FieldValueRequired",
    "Duplicate value": "FieldValueDuplicate",
    "Invalid value": "FieldValueInvalid",
    "Unsupported value": "FieldValueNotSupported",
    "Forbidden": "FieldValueForbidden",
    "Too long": "FieldValueTooLong",
    "Too many": "FieldValueTooMany",
    "Internal error": "InternalError",
}
"""`metav1.CauseType` of each `field.ErrorType`."""


class Invalid(Rejected):
    """`apierrors.NewInvalid`: a write refused for its field errors, with what the
    `Status` body's `details` say (the group and kind, the name, one cause per error)."""

    def __init__(
        self, name: str, errors: Sequence[FieldError], group: str = GROUP, kind: str = KIND
    ) -> None:
        texts = list(dict.fromkeys(str(e) for e in errors))
        joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        super().__init__(f"{kind}.{group} {go_quote(name)} is invalid: {joined}")
        self.name, self.group, self.kind = name, group, kind
        self.errors = tuple(errors)

    def details(self) -> dict[str, object]:
        causes = [
            {
                "reason": CAUSE_TYPES.get(e.type, e.type),
                "message": str(e).removeprefix(f"{e.field}: "),
                "field": e.field,
            }
            for e in self.errors
        ]
        return {"name": self.name, "group": self.group, "kind": self.kind, "causes": causes}
