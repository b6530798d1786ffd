"""KubeRay v1.7.0's RayCluster CustomResourceDefinition applied to a write as
kube-apiserver applies it (k8s.io/apiextensions-apiserver and kube-openapi):

1. decode (`customresource_handler.go`, `unstructuredSchemaCoercer.apply`): the root
   `metadata` is cut down to ObjectMeta's fields; every field the structural schema
   does not declare is pruned (`pruning/algorithm.go`: `x-kubernetes-preserve-unknown-fields`
   keeps them, `apiVersion`/`kind`/`metadata` of the root and of embedded resources are
   never pruned); nulls that are neither `nullable` nor defaulted are dropped
   (`PruneNonNullableNullsWithoutDefaults`); then `default`s are applied
   (`defaulting/algorithm.go`).
2. prepare (`registry/customresource/strategy.go`): with the status subresource, a
   create cannot set `status` and an update of the main resource keeps the stored one.
3. validate: apiVersion and kind, the OpenAPI v3 schema with `jsonschema` (its
   keywords replaced by ones that judge and word an error as kube-openapi's validators
   and `kubeOpenAPIResultToFieldErrors` do), `x-kubernetes-list-type` map/set
   uniqueness (`listtype/validation.go`) and the CRD's `x-kubernetes-validations`.

CEL is not evaluated: the three rules KubeRay v1.7.0 declares are modelled one by one
(`CEL_RULES`); a rule this module does not know is listed by `unmodelled_rules`.
Not modelled: validation ratcheting of unchanged fields on update (it only ever
forgives), ObjectMeta's label and annotation syntax, and int-or-string `anyOf`
alternatives ranked by match count (the first alternative's errors are reported).

A rejected write raises `Rejected` with kube-apiserver's message, e.g.
`RayCluster.ray.io "c" is invalid: spec.workerGroupSpecs[0].replicas: Invalid value:
"string": spec.workerGroupSpecs[0].replicas in body must be of type integer: "string"`."""

from __future__ import annotations

import ast
import copy
import functools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, Final

from jsonschema import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import Draft4Validator, extend

from tpu_autoscaler.adapters.kube.api import Rejected

CRD_FILE: Final = "rayclusters.ray.io.v1.7.0.json"
"""Under `tpu_autoscaler/controlplane/crds/`; `crds/README.md` says where it came from."""

GROUP: Final = "ray.io"
KIND: Final = "RayCluster"

OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
"""metav1.ObjectMeta's JSON fields: the rest of a CR's `metadata` is dropped on decode."""

_META_FIELDS: Final = frozenset({"apiVersion", "kind", "metadata"})
_OMITTED: Final = object()
"""A field error that shows no value (Go's `field.OmitValueType`)."""


# --- the CRD ---------------------------------------------------------------------------


@functools.cache
def definition() -> Mapping[str, Any]:
    """The CustomResourceDefinition, loaded once."""
    text = resources.files("tpu_autoscaler.controlplane").joinpath("crds", CRD_FILE).read_text()
    crd: dict[str, Any] = json.loads(text)
    return crd


def served_versions() -> list[str]:
    return [v["name"] for v in definition()["spec"]["versions"] if v.get("served")]


def _version(name: str) -> Mapping[str, Any]:
    for version in definition()["spec"]["versions"]:
        if version["name"] == name and version.get("served"):
            return version  # type: ignore[no-any-return]
    raise KeyError(name)


def schema(version: str = "v1") -> Mapping[str, Any]:
    """The `openAPIV3Schema` of a served version."""
    return _version(version)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


# --- field errors as k8s.io/apimachinery words them -------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One `field.Error`: `<field>: <type>[: <value>][: <detail>]`."""

    field: str
    type: str
    bad_value: object = _OMITTED
    detail: str = ""

    def __str__(self) -> str:
        body = self.type
        if self.bad_value is not _OMITTED and self.type not in ("Required value", "Too long"):
            body = f"{self.type}: {_go_value(self.bad_value)}"
        return f"{self.field}: {body}: {self.detail}" if self.detail else f"{self.field}: {body}"


def _go_value(value: object) -> str:
    """A bad value as `field.Error.ErrorBody` prints it: simple types with `%v`, strings
    with `%q`, anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _go_number(value)
    if isinstance(value, str):
        return _go_quote(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _go_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def invalid_message(name: str, errors: Sequence[FieldError]) -> str:
    """`apierrors.NewInvalid`'s message: one error as is, several (deduplicated) in
    brackets, comma separated."""
    texts = list(dict.fromkeys(str(e) for e in errors))
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return f"{KIND}.{GROUP} {_go_quote(name)} is invalid: {joined}"


# --- decode: metadata, pruning, nulls, defaults ----------------------------------------


@dataclass(frozen=True)
class Decoded:
    object: dict[str, Any]
    unknown_fields: tuple[str, ...]
    """The pruned fields' paths, as kube-apiserver's `unknown field` warnings name them."""


def decode(obj: Mapping[str, Any]) -> Decoded:
    """`obj` as kube-apiserver decodes a RayCluster from a request body."""
    decoded = copy.deepcopy(dict(obj))
    unknown: list[str] = []
    meta = decoded.get("metadata")
    if isinstance(meta, dict):
        for key in sorted(set(meta) - OBJECT_META_FIELDS):
            unknown.append(f"metadata.{key}")
            del meta[key]
    try:
        root = schema(_api_version_name(decoded))
    except KeyError:
        return Decoded(decoded, ())
    _prune(decoded, root, "", unknown, embedded=True)
    _drop_non_nullable_nulls(decoded, root)
    _apply_defaults(decoded, root)
    return Decoded(decoded, tuple(sorted(unknown)))


def _api_version_name(obj: Mapping[str, Any]) -> str:
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    return version if group == GROUP else ""


def _child_schema(schema_: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    if schema_ is None:
        return None
    properties = schema_.get("properties", {})
    if key in properties:
        return properties[key]  # type: ignore[no-any-return]
    additional = schema_.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None


def _prune(
    value: Any, schema_: Mapping[str, Any] | None, path: str, unknown: list[str], embedded: bool
) -> None:
    preserve = schema_ is not None and schema_.get("x-kubernetes-preserve-unknown-fields", False)
    if isinstance(value, dict):
        if schema_ is None:
            unknown.extend(_join(path, k) for k in value)
            value.clear()
            return
        has_additional = isinstance(schema_.get("additionalProperties"), Mapping)
        for key in list(value):
            if embedded and key in _META_FIELDS:
                continue
            if key in schema_.get("properties", {}) or has_additional:
                child = _child_schema(schema_, key)
                _prune(
                    value[key],
                    child,
                    _join(path, key),
                    unknown,
                    bool(child and child.get("x-kubernetes-embedded-resource")),
                )
            elif not preserve:
                unknown.append(_join(path, key))
                del value[key]
    elif isinstance(value, list):
        items = schema_.get("items") if schema_ is not None else None
        if preserve and items is None:
            return
        for index, item in enumerate(value):
            item_schema = items if isinstance(items, Mapping) else None
            embedded_item = bool(item_schema and item_schema.get("x-kubernetes-embedded-resource"))
            _prune(item, item_schema, f"{path}[{index}]", unknown, embedded_item)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _drop_non_nullable_nulls(value: Any, schema_: Mapping[str, Any] | None) -> None:
    if isinstance(value, dict):
        for key in list(value):
            child = _child_schema(schema_, key)
            if (
                value[key] is None
                and child is not None
                and not child.get("nullable", False)
                and "default" not in child
            ):
                del value[key]
            else:
                _drop_non_nullable_nulls(value[key], child)
    elif isinstance(value, list):
        items = schema_.get("items") if schema_ is not None else None
        for item in value:
            _drop_non_nullable_nulls(item, items if isinstance(items, Mapping) else None)


def _apply_defaults(value: Any, schema_: Mapping[str, Any] | None) -> None:
    if schema_ is None:
        return
    if isinstance(value, dict):
        for key, prop in schema_.get("properties", {}).items():
            if "default" in prop and (
                key not in value or (value[key] is None and not prop.get("nullable", False))
            ):
                value[key] = copy.deepcopy(prop["default"])
        additional = schema_.get("additionalProperties")
        for key in list(value):
            if key in schema_.get("properties", {}):
                _apply_defaults(value[key], schema_["properties"][key])
            elif isinstance(additional, Mapping):
                if _defaults_null(value[key], additional):
                    value[key] = copy.deepcopy(additional["default"])
                _apply_defaults(value[key], additional)
    elif isinstance(value, list):
        items = schema_.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                if _defaults_null(item, items):
                    value[index] = copy.deepcopy(items["default"])
                _apply_defaults(value[index], items)


def _defaults_null(value: Any, schema_: Mapping[str, Any]) -> bool:
    return value is None and not schema_.get("nullable", False) and "default" in schema_


# --- the schema, judged as kube-openapi judges it -----------------------------------------


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
        "Invalid value", found, f"{{path}} in body must be of type {type_name}: {_go_quote(found)}"
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
            text = _go_number(instance)
            if not re.fullmatch(r"[+-]?\d+", text) or not -limit <= int(text) < limit:
                yield _GoError(
                    "Invalid value",
                    "",
                    f"Checked value must be of type integer with format {wanted} in {{path}}",
                    plain=True,
                    rank=4,
                )
    elif isinstance(instance, str) and wanted == "date-time" and not _is_date_time(instance):
        detail = f"{{path}} in body must be of type date-time: {_go_quote(instance)}"
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
        values = ", ".join(_go_quote(v if isinstance(v, str) else json.dumps(v)) for v in allowed)
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


@functools.cache
def _validator(version: str) -> Validator:
    validator: Validator = _KubeOpenApiValidator(schema(version))
    return validator


def go_path(parts: Sequence[str | int]) -> str:
    """A path as kube-openapi names it: `spec.workerGroupSpecs[0].replicas`."""
    text = ""
    for part in parts:
        text = f"{text}[{part}]" if isinstance(part, int) else _join(text, part)
    return text


def _schema_errors(obj: Mapping[str, Any], version: str) -> list[FieldError]:
    errors = sorted(
        _validator(version).iter_errors(obj),
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


# --- x-kubernetes-list-type ------------------------------------------------------------


def _list_errors(value: Any, schema_: Mapping[str, Any] | None, path: str) -> Iterator[FieldError]:
    if schema_ is None:
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _list_errors(child, _child_schema(schema_, key), _join(path, key))
    elif isinstance(value, list):
        list_type = schema_.get("x-kubernetes-list-type")
        if list_type == "set":
            for index in _second_occurrences(value):
                yield FieldError(f"{path}[{index}]", "Duplicate value", value[index])
        elif list_type == "map":
            yield from _map_list_errors(value, schema_.get("x-kubernetes-list-map-keys", []), path)
        items = schema_.get("items")
        for index, item in enumerate(value):
            yield from _list_errors(
                item, items if isinstance(items, Mapping) else None, f"{path}[{index}]"
            )


def _second_occurrences(values: Sequence[Any]) -> list[int]:
    """`validateListSet`: the index of each value's second occurrence."""
    seen: dict[str, int] = {}
    found = []
    for index, value in enumerate(values):
        key = json.dumps(value, sort_keys=True)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:
            found.append(index)
    return found


def _map_list_errors(items: list[Any], keys: Sequence[str], path: str) -> Iterator[FieldError]:
    for index, item in enumerate(items):
        if item is not None and not isinstance(item, dict):
            yield FieldError(
                f"{path}[{index}]",
                "Invalid value",
                item,
                "must be an object for an array of list-type map",
            )
            return
    entries = [{k: item[k] for k in keys if k in item} for item in items if item is not None]
    for index in _second_occurrences(entries):
        yield FieldError(f"{path}[{index}]", "Duplicate value", entries[index])


# --- x-kubernetes-validations (CEL, modelled rule by rule) ---------------------------------

CelRule = Callable[[Any, Any], bool]
"""(self, oldSelf; absent oldSelf is `_ABSENT`) -> the rule holds."""

_ABSENT: Final = object()


def _immutable(value: Any, old: Any) -> bool:
    return old is _ABSENT or value == old


def _one_of(rule: str) -> CelRule | None:
    match = re.fullmatch(r"self in (\[.*\])", rule)
    if match is None:
        return None
    try:
        allowed = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return lambda value, _old: value in allowed


def cel_rule(rule: str) -> CelRule | None:
    """The Python model of a CEL rule, None if not modelled. Transition rules (those
    reading `oldSelf`) hold on create and whenever the old object lacks the field,
    as the apiserver skips them then."""
    if rule == "self == oldSelf":
        return _immutable
    return _one_of(rule)


def cel_rules(version: str = "v1") -> list[tuple[str, str, str]]:
    """Every `x-kubernetes-validations` rule: (path, rule, message)."""
    found: list[tuple[str, str, str]] = []

    def walk(schema_: Mapping[str, Any], path: str) -> None:
        for rule in schema_.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule.get("message", "")))
        for key, child in schema_.get("properties", {}).items():
            walk(child, _join(path, key))
        for key in ("items", "additionalProperties"):
            if isinstance(schema_.get(key), Mapping):
                walk(schema_[key], f"{path}[*]" if key == "items" else f"{path}.*")

    walk(schema(version), "")
    return found


def unmodelled_rules(version: str = "v1") -> list[tuple[str, str, str]]:
    return [r for r in cel_rules(version) if cel_rule(r[1]) is None]


def _cel_errors(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, version: str
) -> Iterator[FieldError]:
    for path, rule, message in cel_rules(version):
        if "*" in path:
            continue  # none in v1.7.0: rules sit on plain properties
        check = cel_rule(rule)
        value = _lookup(new, path)
        if check is None or value is _ABSENT:
            continue
        previous = _lookup(old, path) if old is not None else _ABSENT
        if not check(value, previous):
            shown = _OMITTED if isinstance(value, dict | list) else value
            yield FieldError(path, "Invalid value", shown, message or f"failed rule: {rule}")


def _lookup(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, Mapping) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


# --- admission ------------------------------------------------------------------------


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """The field errors kube-apiserver finds in a decoded RayCluster (`old`: the stored
    object, on update)."""
    version = _api_version_name(obj)
    errors: list[FieldError] = []
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", "Invalid value", obj.get("kind", ""), f"must be {KIND}"))
    if version not in served_versions():
        errors.append(
            FieldError(
                "apiVersion", "Invalid value", obj.get("apiVersion", ""), f"must be {GROUP}/v1"
            )
        )
    if errors:
        return errors
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name:
        errors.append(
            FieldError("metadata.name", "Required value", "", "name or generateName is required")
        )
    elif name in (".", "..") or "/" in name or "%" in name:
        errors.append(FieldError("metadata.name", "Invalid value", name, _segment_problem(name)))
    errors += _schema_errors(obj, version)
    errors += _list_errors(obj, schema(version), "")
    errors += _cel_errors(obj, old, version)
    return errors


def _segment_problem(name: str) -> str:
    if name in (".", ".."):
        return f"may not be '{name}'"
    return "may not contain '/'" if "/" in name else "may not contain '%'"


def _has_status_subresource(version: str) -> bool:
    try:
        return "status" in _version(version).get("subresources", {})
    except KeyError:
        return False


def admit(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The RayCluster as kube-apiserver stores it from this write: decoded (pruned and
    defaulted), its status as the status subresource allows (none on create, the
    stored one on update), validated. `old` is the stored object on update; a write
    the apiserver refuses raises `Rejected` with its message."""
    stored = decode(obj).object
    if _has_status_subresource(_api_version_name(stored)):
        stored.pop("status", None)
        if old is not None and "status" in old:
            stored["status"] = copy.deepcopy(old["status"])
    errors = validate(stored, old)
    if errors:
        meta = stored.get("metadata")
        name = meta.get("name", "") if isinstance(meta, Mapping) else ""
        raise Rejected(invalid_message(str(name), errors))
    return stored
