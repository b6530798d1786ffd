"""KubeRay v1.7.0's own checks of a RayCluster, for what the CRD schema does not check
(min > max, idle timeouts without autoscaler v2, ...): `controllers/ray/utils/validation.go`
as `raycluster_controller.go` (`rayClusterReconcile`) calls it, pure.

What KubeRay does with a failure (v1.7.0): at the start of every reconcile it validates
the stored RayCluster; on an error it logs it, records a **Warning Event** on the
RayCluster (reason `InvalidRayClusterMetadata` or `InvalidRayClusterSpec`, action
`Validate`, message `The RayCluster spec is invalid <namespace>/<name>: <error>`) and
returns `ctrl.Result{}, nil`: the reconcile stops there, **without requeue and without
touching pods or status** (no condition is set; the status keeps its last value). The
next reconcile, after the next RayCluster or pod event, validates again. The write
itself was accepted by the API server: nothing is rejected, the cluster just stops
being reconciled until it is fixed.

Also from KubeRay, not rejections: `numOfHosts <= 0` is reconciled as 1; `replicas`
outside [minReplicas, maxReplicas] is clamped into it (`GetWorkerGroupDesiredReplicas`);
a suspended group is 0. Group names are checked for uniqueness only by KubeRay's
optional validating webhook (`pkg/webhooks/v1/raycluster_webhook.go`, registered only
with `ENABLE_WEBHOOKS=true`, off in the Helm chart): `webhook_error` models it.

Not modelled (no bearing on autoscaling): label syntax of `labels`, GCS fault
tolerance, auth, network policy, mTLS and history server options, upgrade strategy.
`minReplicas`/`maxReplicas` absent is reported as KubeRay would, but the CRD defaults
both (0 and 2147483647), so through an API server it never happens."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tpu_autoscaler.controlplane.crd_errors import go_quote

MAX_RAYCLUSTER_NAME_LENGTH: Final = 53
DNS1035_LABEL_MAX_LENGTH: Final = 63
RAY_ENABLE_AUTOSCALER_V2: Final = "RAY_enable_autoscaler_v2"
KUBERAY_GEN_AUTOSCALER_START_CMD: Final = "KUBERAY_GEN_AUTOSCALER_START_CMD"
FT_ENABLED_ANNOTATION: Final = "ray.io/ft-enabled"
PRIORITY_MIN_RAY_VERSION: Final = (2, 56, 0)

INVALID_METADATA: Final = "InvalidRayClusterMetadata"
INVALID_SPEC: Final = "InvalidRayClusterSpec"
VALIDATE_ACTION: Final = "Validate"

_DNS1035_LABEL: Final = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1035_MESSAGE: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
    "with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  "
    "or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_RAY_START_RESOURCE_PARAMS: Final = ("num-cpus", "num-gpus", "memory", "resources")


@dataclass(frozen=True)
class InvalidRayCluster:
    """What KubeRay records when it stops reconciling an invalid RayCluster: a Warning
    Event with this `reason` and `message`."""

    reason: str
    error: str
    """The validation error itself (`err`)."""
    message: str
    """The Event's message."""

    action: str = VALIDATE_ACTION
    type: str = "Warning"


def reconcile_verdict(raycluster: Mapping[str, Any]) -> InvalidRayCluster | None:
    """The Event KubeRay records before it stops reconciling `raycluster` (as stored),
    None if it reconciles it."""
    meta = raycluster.get("metadata") or {}
    where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    error = metadata_error(raycluster)
    if error is not None:
        message = f"The RayCluster metadata is invalid {where}: {error}"
        return InvalidRayCluster(INVALID_METADATA, error, message)
    error = spec_error(raycluster)
    if error is not None:
        return InvalidRayCluster(
            INVALID_SPEC, error, f"The RayCluster spec is invalid {where}: {error}"
        )
    return None


def metadata_error(raycluster: Mapping[str, Any]) -> str | None:
    """`ValidateRayClusterMetadata`."""
    name = str((raycluster.get("metadata") or {}).get("name", ""))
    if len(name) > MAX_RAYCLUSTER_NAME_LENGTH:
        return f"RayCluster name should be no more than {MAX_RAYCLUSTER_NAME_LENGTH} characters"
    problems = dns1035_label_problems(name)
    if problems:
        return f"RayCluster name should be a valid DNS1035 label: [{' '.join(problems)}]"
    return None


def dns1035_label_problems(value: str) -> list[str]:
    """k8s.io/apimachinery `validation.IsDNS1035Label`."""
    problems = []
    if len(value) > DNS1035_LABEL_MAX_LENGTH:
        problems.append(f"must be no more than {DNS1035_LABEL_MAX_LENGTH} characters")
    if not _DNS1035_LABEL.fullmatch(value):
        problems.append(_DNS1035_MESSAGE)
    return problems


def _head_container(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = _pod_spec(spec.get("headGroupSpec") or {}).get("containers") or [{}]
    return containers[0]  # type: ignore[no-any-return]


def _pod_spec(group: Mapping[str, Any]) -> Mapping[str, Any]:
    return (group.get("template") or {}).get("spec") or {}


def _env(container: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((e for e in container.get("env") or [] if e.get("name") == name), None)


def _autoscaler_v2_env(spec: Mapping[str, Any]) -> bool:
    var = _env(_head_container(spec), RAY_ENABLE_AUTOSCALER_V2)
    return var is not None and var.get("value") in ("1", "true")


def _autoscaling(spec: Mapping[str, Any]) -> bool:
    """`IsAutoscalingEnabled`."""
    return spec.get("enableInTreeAutoscaling") is True


def _autoscaler_version(spec: Mapping[str, Any]) -> str | None:
    return (spec.get("autoscalerOptions") or {}).get("version")


def _group_resources_error(name: str, group: Mapping[str, Any]) -> str | None:
    """`validateRayGroupResources`."""
    params = group.get("rayStartParams") or {}
    if any(params.get(k) for k in _RAY_START_RESOURCE_PARAMS) and group.get("resources"):
        return (
            f"resource fields should not be set in both rayStartParams and Resources for "
            f"{name} group; please use only one"
        )
    return None


def _group_labels_error(name: str, group: Mapping[str, Any]) -> str | None:
    """`validateRayGroupLabels`, without the label syntax."""
    if "labels" in (group.get("rayStartParams") or {}):
        return (
            f"rayStartParams['labels'] is not supported for {name} group; please use the "
            "top-level Labels field instead"
        )
    return None


def _idle_timeout_error(group: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """`validateWorkerGroupIdleTimeout`: a group's idle timeout needs autoscaler v2."""
    timeout = group.get("idleTimeoutSeconds")
    name = group.get("groupName", "")
    if timeout is None:
        return None
    if timeout < 0:
        return f"worker group {name}: idleTimeoutSeconds must be non-negative, got {timeout}"
    if _autoscaler_version(spec) == "v2" or _autoscaler_v2_env(spec):
        return None
    return (
        f"worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. "
        "Please set .spec.autoscalerOptions.version to 'v2' (or set "
        f"{RAY_ENABLE_AUTOSCALER_V2} environment variable to 'true' in the head pod if using "
        "KubeRay < 1.4.0)"
    )


def parse_generic_version(text: str) -> tuple[int, ...]:
    """k8s.io/apimachinery `version.ParseGeneric`: at least major.minor, suffix ignored."""
    match = re.fullmatch(r"\s*v?([0-9]+(?:\.[0-9]+)*)(.*)", text)
    if match is None:
        raise ValueError(f"could not parse {text!r} as version")
    parts = tuple(int(p) for p in match.group(1).split("."))
    if len(parts) < 2:
        raise ValueError(f"illegal version string {text!r}")
    return parts + (0,) * (3 - len(parts))


def _priority_error(group: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """`validateWorkerGroupPriority`: priorities need Ray >= 2.56 and autoscaler v2."""
    priority = group.get("priority")
    name = group.get("groupName", "")
    if not priority:
        return None
    ray_version = str(spec.get("rayVersion") or "")
    if ray_version == "":
        return (
            f"worker group {name}: priority is set, but RayVersion was not specified. Ray "
            "version 2.56.0 or later is required"
        )
    try:
        parsed = parse_generic_version(ray_version)
    except ValueError as exc:
        return (
            f"worker group {name}: priority is set, but RayVersion format is invalid: "
            f"{ray_version}, {exc}"
        )
    if parsed < PRIORITY_MIN_RAY_VERSION:
        return (
            f"worker group {name}: priority is set, but minimum Ray version is 2.56.0, got "
            f"{ray_version}"
        )
    if _autoscaler_version(spec) == "v2" or _autoscaler_v2_env(spec):
        return None
    return (
        f"worker group {name}: priority is set to {priority}, but autoscaler v2 is not "
        "enabled. Priority is only supported with autoscaler v2 enabled"
    )


def _worker_group_error(group: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    name = group.get("groupName", "")
    if not _pod_spec(group).get("containers"):
        return "workerGroupSpec should have at least one container"
    low, high = group.get("minReplicas"), group.get("maxReplicas")
    if not _autoscaling(spec) and (low is None or high is None):
        return (
            f"worker group {name} must set both minReplicas and maxReplicas when autoscaling "
            "is disabled"
        )
    if low is not None and low < 0:
        return f"worker group {name} has negative minReplicas {low}"
    if high is not None and high < 0:
        return f"worker group {name} has negative maxReplicas {high}"
    if low is not None and high is not None and low > high:
        return f"worker group {name} has minReplicas {low} greater than maxReplicas {high}"
    return (
        _group_resources_error(name, group)
        or _group_labels_error(name, group)
        or _idle_timeout_error(group, spec)
        or _priority_error(group, spec)
    )


def spec_error(raycluster: Mapping[str, Any]) -> str | None:
    """`ValidateRayClusterSpec`'s first error (its rules in its order, those listed in
    the module docstring left out), None if KubeRay accepts the spec."""
    spec: Mapping[str, Any] = raycluster.get("spec") or {}
    head = spec.get("headGroupSpec") or {}
    groups: Sequence[Mapping[str, Any]] = spec.get("workerGroupSpecs") or []
    if not _pod_spec(head).get("containers"):
        return "headGroupSpec should have at least one container"
    error = _group_resources_error("Head", head) or _group_labels_error("Head", head)
    if error:
        return error
    for group in groups:
        error = _worker_group_error(group, spec)
        if error:
            return error
    annotations = (raycluster.get("metadata") or {}).get("annotations") or {}
    if annotations.get(FT_ENABLED_ANNOTATION) and spec.get("gcsFaultToleranceOptions"):
        return (
            f"{FT_ENABLED_ANNOTATION} annotation and GcsFaultToleranceOptions are both set. "
            "Please use only GcsFaultToleranceOptions to configure GCS fault tolerance"
        )
    # RayJobDeletionPolicy is on by default in v1.7.0: a suspended group is fine here.
    if not _autoscaling(spec):
        var = _env(_head_container(spec), RAY_ENABLE_AUTOSCALER_V2)
        if var is not None and var.get("value") in ("1", "true"):
            return (
                f"environment variable {RAY_ENABLE_AUTOSCALER_V2} cannot be set to "
                f"'{var['value']}' when enableInTreeAutoscaling is false. Please set "
                "enableInTreeAutoscaling: true to use autoscaler v2"
            )
    else:
        error = _autoscaling_error(spec, groups)
        if error:
            return error
    options = spec.get("autoscalerOptions") or {}
    timeout = options.get("idleTimeoutSeconds")
    if timeout is not None and timeout < 0:
        return f"autoscalerOptions.idleTimeoutSeconds must be non-negative, got {timeout}"
    if _env(options, KUBERAY_GEN_AUTOSCALER_START_CMD) is not None:
        return (
            f"autoscalerOptions.env must not contain {KUBERAY_GEN_AUTOSCALER_START_CMD}: it is "
            "managed by KubeRay and injected automatically into the autoscaler container"
        )
    return None


def _autoscaling_error(spec: Mapping[str, Any], groups: Sequence[Mapping[str, Any]]) -> str | None:
    for group in groups:
        if group.get("suspend") is True:
            name = group.get("groupName", "")
            return f"worker group {name} cannot be suspended with Autoscaler enabled"
    head_env = _env(_head_container(spec), RAY_ENABLE_AUTOSCALER_V2)
    if _autoscaler_version(spec) is not None and head_env is not None:
        return (
            "both .spec.autoscalerOptions.version and head Pod env var "
            f"{RAY_ENABLE_AUTOSCALER_V2} are set, please only use the former"
        )
    if _autoscaler_version(spec) == "v2":
        head_policy = _pod_spec(spec.get("headGroupSpec") or {}).get("restartPolicy", "")
        if head_policy not in ("", "Never"):
            return "restartPolicy for head Pod should be Never or unset when using autoscaler V2"
        for group in groups:
            if _pod_spec(group).get("restartPolicy", "") not in ("", "Never"):
                return (
                    f"restartPolicy for worker group {group.get('groupName', '')} should be "
                    "Never or unset when using autoscaler V2"
                )
    return None


def webhook_error(raycluster: Mapping[str, Any]) -> str | None:
    """KubeRay's optional validating webhook (`RayClusterWebhook.validateRayCluster`, on
    create and update, only with `ENABLE_WEBHOOKS=true`): the name as
    `metadata_error` checks it, and unique worker group names. The apiserver's message
    (HTTP 422) for a rejection, None if allowed."""
    name = str((raycluster.get("metadata") or {}).get("name", ""))
    problems = []
    error = metadata_error(raycluster)
    if error is not None:
        problems.append(f"metadata.name: Invalid value: {go_quote(name)}: {error}")
    seen: set[str] = set()
    for index, group in enumerate((raycluster.get("spec") or {}).get("workerGroupSpecs") or []):
        group_name = str(group.get("groupName", ""))
        if group_name in seen:
            problems.append(
                f"spec.workerGroupSpecs[{index}]: Invalid value: {_go_group(group)}: "
                "worker group names must be unique"
            )
            break
        seen.add(group_name)
    if not problems:
        return None
    joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return f'RayCluster.ray.io "{name}" is invalid: {joined}'


def _go_group(group: Mapping[str, Any]) -> str:
    """A WorkerGroupSpec as `field.Error` prints a struct: its JSON (Go orders the keys
    by struct field, this by name)."""
    return json.dumps(group, sort_keys=True, separators=(",", ":"))
