"""Which errors kube-openapi's validation of the OpenAPI v3 schema finds in a decoded
RayCluster, judged and worded as kube-openapi's validators and
`kubeOpenAPIResultToFieldErrors` judge and word them: `jsonschema`'s Draft 4 with the
keywords the RayCluster schema uses (type, int-or-string, format, required, enum,
pattern, maxLength, minimum, anyOf) replaced, and its errors put in kube-openapi's
order. Int-or-string `anyOf` alternatives are not ranked by match count: the first
alternative's errors are reported.

A served version's validator remembers the subtrees it found clean (`_CleanSubtrees`):
most writes change a few fields of a RayCluster whose pod templates are most of it."""

from __future__ import annotations

import functools
import json
import math
import pickle
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Final

from jsonschema import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import Draft4Validator, extend

from tpu_autoscaler.controlplane.crd_errors import FieldError, go_number, go_path, go_quote
from tpu_autoscaler.controlplane.crd_schema import schema

_RANKS: Final = {
    "type": 0,
    "x-kubernetes-int-or-string": 0,
    "anyOf": 1,
    "maxLength": 2,
    "pattern": 2,
    "format": 3,
    "minimum": 4,
    "enum": 6,
    "required": 7,
}
"""The order of kube-openapi's validators on one value (`NewSchemaValidator`): type,
schema props (anyOf), string, format, number, slice, common (enum), object."""


class _GoError(ValidationError):
    """A schema error carrying what `kubeOpenAPIResultToFieldErrors` makes of it.
    `detail` may hold `{path}`, the value's path (known only once jsonschema has
    placed the error); `plain` errors are not `openapierrors.Validation`s and name
    no field (`<nil>`); `suffix` extends the path (a missing required property)."""

    def __init__(
        self,
        kind: str,
        bad_value: object,
        detail: str = "",
        plain: bool = False,
        suffix: str = "",
        rank: int | None = None,
    ) -> None:
        super().__init__(detail or kind)
        self.kind = kind
        self.bad_value = bad_value
        self.detail = detail
        self.plain = plain
        self.suffix = suffix
        self.rank = rank


def _json_type(instance: Any) -> tuple[str, str]:
    """kube-openapi's `schemaInfoForType` for JSON decoded as the apiserver decodes it
    (integers int64, other numbers float64)."""
    if isinstance(instance, bool):
        return "boolean", ""
    if isinstance(instance, int):
        return "integer", "int64"
    if isinstance(instance, float):
        return "number", "float64"
    if isinstance(instance, str):
        return "string", ""
    if isinstance(instance, list):
        return "array", ""
    return "object", ""


def _types(schema_: Mapping[str, Any]) -> list[str]:
    """The types kube-openapi checks: int-or-string becomes `[integer, string]`
    (`ConvertJSONSchemaPropsWithPostProcess`)."""
    if schema_.get("x-kubernetes-int-or-string"):
        return ["integer", "string"]
    declared = schema_.get("type")
    return [declared] if isinstance(declared, str) else []


def _type_failure(type_name: str, found: str) -> _GoError:
    return _GoError(
        "Invalid value", found, f"{{path}} in body must be of type {type_name}: {go_quote(found)}"
    )


def _is_json_integer(number: float) -> bool:
    return math.isfinite(number) and number.is_integer() and abs(number) <= 2**53


def _type(validator: Any, declared: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    """kube-openapi's `typeValidator.Validate`, `nullable` included."""
    types = _types(schema_)
    wanted_format = schema_.get("format", "")
    if instance is None:
        if types and "null" not in types and not schema_.get("nullable", False):
            yield _type_failure(",".join(types), "null")
        return
    found, found_format = _json_type(instance)
    float_int = found == "number" and _is_json_integer(instance) and "integer" in types
    int_float = found == "integer" and "number" in types
    if (
        not isinstance(instance, str | list)
        and wanted_format
        and not (found in types or found_format == wanted_format or float_int or int_float)
    ):
        yield _type_failure(wanted_format, found_format)
        return
    numeric = "number" in types or "integer" in types
    if not numeric and wanted_format and isinstance(instance, str | list):
        return
    if not (found in types or float_int or int_float):
        yield _type_failure(",".join(types), found)


def _int_or_string(validator: Any, enabled: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    """`x-kubernetes-int-or-string` types a schema that declares no `type`."""
    if enabled and "type" not in schema_:
        yield from _type(validator, None, instance, schema_)


_INTEGER_LIMITS: Final = {"int32": 2**31, "int64": 2**63}


def _format(validator: Any, wanted: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    """The number validator's range check (`IsValueValidAgainstRange`: a plain error,
    where a fraction fails too) and the one string format the RayCluster schema uses
    (`date-time`)."""
    if isinstance(instance, bool):
        return
    if isinstance(instance, int | float):
        if _types(schema_) == ["integer"] and wanted in _INTEGER_LIMITS:
            limit = _INTEGER_LIMITS[wanted]
            text = go_number(instance)
            if not re.fullmatch(r"[+-]?\d+", text) or not -limit <= int(text) < limit:
                yield _GoError(
                    "Invalid value",
                    "",
                    f"Checked value must be of type integer with format {wanted} in {{path}}",
                    plain=True,
                    rank=4,
                )
    elif isinstance(instance, str) and wanted == "date-time" and not _is_date_time(instance):
        detail = f"{{path}} in body must be of type date-time: {go_quote(instance)}"
        yield _GoError("Invalid value", instance, detail)


def _is_date_time(text: str) -> bool:
    """strfmt's `date-time`: RFC 3339 with a time part."""
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return "T" in text.upper()


def _required(validator: Any, names: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    if isinstance(instance, dict):
        for name in names:
            if name not in instance:
                yield _GoError("Required value", "", suffix=name)


def _enum(validator: Any, allowed: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    if not any(type(instance) is type(value) and instance == value for value in allowed):
        values = ", ".join(go_quote(v if isinstance(v, str) else json.dumps(v)) for v in allowed)
        yield _GoError("Unsupported value", instance, f"supported values: {values}")


def _pattern(validator: Any, pattern: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    if isinstance(instance, str) and not re.search(pattern, instance):
        yield _GoError("Invalid value", instance, f"{{path}} in body should match '{pattern}'")


def _max_length(validator: Any, limit: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    if isinstance(instance, str) and len(instance) > limit:
        unit = "byte" if limit == 1 else "bytes"
        yield _GoError("Too long", "", f"may not be more than {limit} {unit}")


def _minimum(validator: Any, bound: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return
    exclusive = schema_.get("exclusiveMinimum", False)
    if instance < bound or (exclusive and instance == bound):
        words = "greater than" if exclusive else "greater than or equal to"
        yield _GoError("Invalid value", instance, f"{{path}} in body should be {words} {bound}")


def _any_of(validator: Any, options: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    failures = []
    for index, option in enumerate(options):
        errors = list(validator.descend(instance, option, schema_path=index))
        if not errors:
            return
        failures.append(errors)
    yield _GoError(
        "Invalid value", "", '"{path}" must validate at least one schema (anyOf)', plain=True
    )
    for error in failures[0]:
        if isinstance(error, _GoError):
            error.rank = _RANKS["anyOf"]
        yield error


_KubeOpenApiValidator: Any = extend(  # type: ignore[no-untyped-call]
    Draft4Validator,
    {
        "type": _type,
        "x-kubernetes-int-or-string": _int_or_string,
        "format": _format,
        "required": _required,
        "enum": _enum,
        "pattern": _pattern,
        "maxLength": _max_length,
        "minimum": _minimum,
        "anyOf": _any_of,
    },
)


class _CleanSubtrees:
    """The subtrees found clean, by the schema node they were validated against.

    Exact: the errors a subtree has under a schema node are a function of the two
    alone. Every keyword judges the instance it is given and what is under it (the
    ones that relate siblings or count items, `required`, `additionalProperties`,
    `maxItems`, judge the members of the instance they sit on, which a subtree holds
    whole), the schema has no `$ref` (a structural schema may have none; nodes under
    one are not remembered) and kube-openapi's wording depends on the path only, which
    a clean subtree never gets to. So a subtree equal to one found clean before under
    the same node is clean: it is passed over. One with errors is always validated.
    Equal means the same pickle, which keeps apart what JSON would not (a tuple and a
    list, `1` and `"1"` as keys) and what validation tells apart (`1`, `1.0`, `True`).
    Defaults and pruning come before (`crd_decode`): what is validated is the decoded
    object. Only the nodes of a served version's schema (cached, never freed: their
    `id`s stay theirs) down to `DEPTH` are remembered, a bounded number of each."""

    DEPTH: Final = 4
    """spec.workerGroupSpecs[i].template: the pod templates, most of a RayCluster."""
    KEPT: Final = 64
    """Clean subtrees kept per node; the set starts over when full."""

    def __init__(self) -> None:
        self.by_node: dict[int, set[bytes]] = {}

    def watch(self, root: Mapping[str, Any]) -> None:
        """Remember clean subtrees under `root`'s containers down to `DEPTH`."""

        def walk(node: Any, depth: int) -> None:
            if not isinstance(node, Mapping) or depth > self.DEPTH:
                return
            children = [*node.get("properties", {}).values()]
            if isinstance(node.get("items"), Mapping):
                children.append(node["items"])
            if depth and children and "$ref" not in json.dumps(node):
                self.by_node.setdefault(id(node), set())
            for child in children:
                walk(child, depth + 1)

        walk(root, 0)

    def descend(
        self, validator: Any, instance: Any, schema_: Any, path: Any, schema_path: Any
    ) -> Iterator[ValidationError]:
        """`validator.descend`, passing over a subtree found clean before."""
        clean = self.by_node.get(id(schema_))
        if clean is None:
            yield from validator.descend(instance, schema_, path=path, schema_path=schema_path)
            return
        try:
            key = pickle.dumps(instance, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            yield from validator.descend(instance, schema_, path=path, schema_path=schema_path)
            return
        if key in clean:
            return
        errors = list(validator.descend(instance, schema_, path=path, schema_path=schema_path))
        if not errors:
            if len(clean) >= self.KEPT:
                clean.clear()
            clean.add(key)
        yield from errors


_CLEAN = _CleanSubtrees()


def _properties(validator: Any, properties: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    """jsonschema's `properties`, through `_CLEAN`."""
    if not validator.is_type(instance, "object"):
        return
    for name, subschema in properties.items():
        if name in instance:
            yield from _CLEAN.descend(validator, instance[name], subschema, name, name)


_PLAIN_STRING: Final = {"type": "string", "description": ""}
"""A schema that asks only for a string (`workersToDelete`'s items: up to a slice's
hosts for each replica removed): a list of `str`s under it has no errors, found in C."""


def _items(validator: Any, items: Any, instance: Any, schema_: Mapping[str, Any]) -> Any:
    """jsonschema's Draft 4 `items`, through `_CLEAN`."""
    if not validator.is_type(instance, "array"):
        return
    if validator.is_type(items, "object"):
        plain = items.keys() <= _PLAIN_STRING.keys() and items.get("type") == "string"
        if plain and set(map(type, instance)) <= {str}:
            return  # every item a string, and nothing else asked of one
        for index, item in enumerate(instance):
            yield from _CLEAN.descend(validator, item, items, index, None)
    else:
        for (index, item), subschema in zip(enumerate(instance), items, strict=False):
            yield from _CLEAN.descend(validator, item, subschema, index, index)


_RememberingValidator: Any = extend(  # type: ignore[no-untyped-call]
    _KubeOpenApiValidator, {"properties": _properties, "items": _items}
)


@functools.cache
def _validator(version: str) -> Validator:
    root = schema(version)
    _CLEAN.watch(root)
    validator: Validator = _RememberingValidator(root)
    return validator


def schema_errors(obj: Mapping[str, Any], version: str) -> list[FieldError]:
    return _errors(_validator(version), obj)


def errors_against(obj: Mapping[str, Any], root: Mapping[str, Any]) -> list[FieldError]:
    """The field errors of `obj` under another CRD's `openAPIV3Schema` `root`, every
    subtree validated (nothing remembered: `_CleanSubtrees`)."""
    validator: Validator = _KubeOpenApiValidator(root)
    return _errors(validator, obj)


def _errors(validator: Validator, obj: Mapping[str, Any]) -> list[FieldError]:
    errors = sorted(
        validator.iter_errors(obj),
        key=lambda e: (go_path(list(e.absolute_path)), _rank(e)),
    )
    return [field_error for error in errors for field_error in _field_errors(error)]


def _rank(error: ValidationError) -> int:
    explicit = error.rank if isinstance(error, _GoError) else None
    return explicit if explicit is not None else _RANKS.get(str(error.validator), 5)


def _field_errors(error: ValidationError) -> Iterator[FieldError]:
    if not isinstance(error, _GoError):
        # A keyword this module did not replace (additionalProperties: false, ...).
        path = go_path(list(error.absolute_path)) or "<nil>"
        yield FieldError(path, "Invalid value", "", error.message)
        return
    path = go_path([*error.absolute_path, *([error.suffix] if error.suffix else [])])
    detail = error.detail.replace("{path}", path)
    if error.plain:
        yield FieldError("<nil>", "Invalid value", "", detail)
    else:
        yield FieldError(path, error.kind, error.bad_value, detail)
