"""Which Ray node labels may a group write, and what does each node end up with?

A group's top-level `labels` (KubeRay >= 1.5) pass two checks before a node carries
them: KubeRay v1.7's `validateRayGroupLabels` (controllers/ray/utils/validation.go:
`rayStartParams.labels` is refused, keys must be Kubernetes qualified names and values
label values, else the whole RayCluster is refused, InvalidRayClusterSpec) and Ray
2.60's `validate_node_label_syntax` (ray/_private/label_utils.py: run by the KubeRay
autoscaler config and by `ray start --labels`; its key prefix allows capitals,
underscores and empty dot-segments, but caps each segment at 63 characters). A label
passes only if both accept it, and a refusal cites whichever refuses.

Neither refuses keys under `ray.io/`: KubeRay's and Ray's label-scheduling guides set
`ray.io/market-type` or `ray.io/region` on groups, and Ray's raylet lets a user label
override the one it derives (resource_and_label_spec.py `_resolve_labels`)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tpu_autoscaler.manifest.group_problems import GroupProblems

# k8s.io/apimachinery/pkg/util/validation (IsQualifiedName, IsDNS1123Subdomain,
# IsValidLabelValue): what KubeRay accepts.
_K8S_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_K8S_DNS1123_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
K8S_NAME_MAX = 63
K8S_PREFIX_MAX = 253

# ray/_private/label_utils.py LABEL_REGEX and LABEL_PREFIX_REGEX: what Ray accepts.
_RAY_SEGMENT = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_RAY_NAME = re.compile(_RAY_SEGMENT)
_RAY_PREFIX = re.compile(rf"({_RAY_SEGMENT})?(\.({_RAY_SEGMENT})?)*")
RAY_PREFIX_MAX = 253

_K8S_NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character"
)


def kuberay_key_problems(key: str) -> list[str]:
    """KubeRay's errors for label key `key` (IsQualifiedName), empty if it accepts it."""
    parts = key.split("/")
    if len(parts) > 2:
        return [f"a qualified name {_K8S_NAME_RULE}, with an optional DNS subdomain prefix and '/'"]
    problems: list[str] = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            if len(prefix) > K8S_PREFIX_MAX:
                problems.append(f"prefix part must be no more than {K8S_PREFIX_MAX} characters")
            if not _K8S_DNS1123_SUBDOMAIN.fullmatch(prefix):
                problems.append(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
                    "alphanumeric characters, '-' or '.', and must start and end with an "
                    "alphanumeric character"
                )
    if not name:
        problems.append("name part must be non-empty")
    else:
        if len(name) > K8S_NAME_MAX:
            problems.append(f"name part must be no more than {K8S_NAME_MAX} characters")
        if not _K8S_NAME.fullmatch(name):
            problems.append(f"name part {_K8S_NAME_RULE}")
    return problems


def kuberay_value_problems(value: str) -> list[str]:
    """KubeRay's errors for label value `value` (IsValidLabelValue)."""
    problems: list[str] = []
    if len(value) > K8S_NAME_MAX:
        problems.append(f"must be no more than {K8S_NAME_MAX} characters")
    if value and not _K8S_NAME.fullmatch(value):
        problems.append(f"a valid label must be an empty string or {_K8S_NAME_RULE}")
    return problems


def ray_key_problem(key: str) -> str | None:
    """Ray's error for label key `key` (validate_label_key), None if it accepts it."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > RAY_PREFIX_MAX or not _RAY_PREFIX.fullmatch(prefix)):
        return (
            f"Invalid label key prefix `{prefix}`. Prefix must be a series of DNS labels "
            f"separated by dots (.), not longer than {RAY_PREFIX_MAX} characters in total."
        )
    if len(name) > K8S_NAME_MAX or not _RAY_NAME.fullmatch(name):
        return f"Invalid label key name `{name}`. Name must be 63 chars or less, {_K8S_NAME_RULE}."
    return None


def ray_value_problem(value: str) -> str | None:
    """Ray's error for label value `value` (validate_label_value)."""
    if value == "" or (len(value) <= K8S_NAME_MAX and _RAY_NAME.fullmatch(value)):
        return None
    return f"Invalid label value `{value}`. Value must be 63 chars or less, {_K8S_NAME_RULE}."


def check_labels(
    group_labels: Mapping[str, str] | None,
    ray_start_params: Mapping[str, str],
    kuberay_group: str,
    found: GroupProblems,
) -> None:
    """Every label KubeRay or Ray would refuse, named at its field; `kuberay_group` is
    how KubeRay names the group in its message (`Head` for the head)."""
    if "labels" in ray_start_params:
        found.error(
            "rayStartParams.labels",
            f"KubeRay refuses the RayCluster: rayStartParams['labels'] is not supported for "
            f"{kuberay_group} group; please use the top-level Labels field instead",
        )
    for key, value in (group_labels or {}).items():
        kuberay = kuberay_key_problems(key)
        if kuberay:
            found.error(
                f"labels[{key}]",
                f"KubeRay refuses the RayCluster: invalid label key for {kuberay_group} "
                f"group: '{key}', error: {'; '.join(kuberay)}",
            )
        else:
            ray = ray_key_problem(key)
            if ray:
                found.error(f"labels[{key}]", f"Ray refuses the label: {ray}")
        kuberay = kuberay_value_problems(value)
        if kuberay:
            found.error(
                f"labels[{key}]",
                f"KubeRay refuses the RayCluster: invalid label value for key '{key}' in "
                f"{kuberay_group} group: '{value}', error: {'; '.join(kuberay)}",
            )
        else:
            ray = ray_value_problem(value)
            if ray:
                found.error(f"labels[{key}]", f"Ray refuses the label: {ray}")


def node_labels(
    group_labels: Mapping[str, str] | None, derived: Mapping[str, str], found: GroupProblems
) -> dict[str, str]:
    """The labels a node of the group carries: the ones Ray derives at start, with the
    group's own on top, as Ray's raylet merges them (a warning where one overrides)."""
    merged = dict(derived)
    for key, value in (group_labels or {}).items():
        if key in derived and derived[key] != value:
            found.warn(
                f"labels[{key}]",
                f"{value!r} overrides the {derived[key]!r} Ray derives for this group; "
                "Ray's raylet keeps yours",
            )
        merged[key] = value
    return merged
