"""What kube-apiserver 1.20 adds to a Pod it creates: the defaults of `core/v1`
(`SetDefaults_PodSpec`, `SetDefaults_Container`, requests defaulted from limits), the
`Priority` and `DefaultTolerationSeconds` admission plugins' fields, and the status
`PodStrategy.PrepareForCreate` gives a new pod (Pending, with its QoS class).

Set only where the pod leaves them unset: the simulated kubelet's shortcut of creating
a pod already Running (local mode's head pod) keeps its status."""

from __future__ import annotations

from typing import Any, Final

NOT_READY_TOLERATION_S: Final = 300
QOS_RESOURCES: Final = ("cpu", "memory")

SPEC_DEFAULTS: Final = {
    "restartPolicy": "Always",
    "dnsPolicy": "ClusterFirst",
    "terminationGracePeriodSeconds": 30,
    "schedulerName": "default-scheduler",
    "securityContext": {},
    "enableServiceLinks": True,
    "priority": 0,
    "preemptionPolicy": "PreemptLowerPriority",
}


def default_pod(pod: dict[str, Any]) -> None:
    """Default `pod` in place, as kube-apiserver stores a created pod."""
    meta = pod.setdefault("metadata", {})
    for empty in [k for k in ("labels", "annotations") if meta.get(k) == {}]:
        del meta[empty]  # Go's ObjectMeta omits an empty map (omitempty)
    spec = pod.setdefault("spec", {})
    for key, value in SPEC_DEFAULTS.items():
        spec.setdefault(key, value if not isinstance(value, dict) else dict(value))
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        _default_container(container)
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(
            t.get("key") == key and t.get("effect") in ("NoExecute", None) for t in tolerations
        ):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": NOT_READY_TOLERATION_S,
                }
            )
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", qos_class(spec))


def _default_container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
    pull = "Always" if "@" not in image and tag in ("", "latest") else "IfNotPresent"
    container.setdefault("imagePullPolicy", pull)
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for name, quantity in limits.items():
            requests.setdefault(name, quantity)
    for port in container.get("ports", []):
        port.setdefault("protocol", "TCP")


def qos_class(spec: dict[str, Any]) -> str:
    """`qos.GetPodQOS` (cpu and memory only; quantities compared as written)."""
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    requested = limited = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = {
            k: v for k, v in (resources.get("requests") or {}).items() if k in QOS_RESOURCES
        }
        limits = {k: v for k, v in (resources.get("limits") or {}).items() if k in QOS_RESOURCES}
        requested = requested or bool(requests)
        limited = limited or bool(limits)
        if set(limits) != set(QOS_RESOURCES) or any(
            requests.get(k, v) != v for k, v in limits.items()
        ):
            guaranteed = False
    if not requested and not limited:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"
