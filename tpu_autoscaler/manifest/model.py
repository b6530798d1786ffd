"""The RayCluster custom resource, as far as autoscaling reads it.

Field names follow the CRD (camelCase on the wire, snake_case in Python). Every
field we do not read is kept as it came (`extra="allow"`), so a manifest from any
KubeRay version loads and round-trips. Pydantic validates types; the rules that
span fields (topology against numOfHosts, min against max) live in `manifest/shapes.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tpu_autoscaler.core.labels import GKE_TPU_RESOURCE
from tpu_autoscaler.core.shape import UpscalingMode

Quantity = str | int | float
"""A Kubernetes resource quantity as YAML gives it: `"24"`, `24`, `"100G"`, `"500m"`."""

KUBERAY_MAX_REPLICAS = 2_147_483_647
"""KubeRay's default `maxReplicas` (int32 max)."""


class K8sModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
        frozen=True,
        coerce_numbers_to_str=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """`metadata:` with nothing after it is null in YAML; the API server drops a null
        for a field that is not nullable, so the field takes its default (KubeRay's
        samples write `template: {metadata: }`)."""
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data


class ObjectMeta(K8sModel):
    name: str = ""
    namespace: str = "default"
    uid: str | None = None
    resource_version: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class EnvVar(K8sModel):
    name: str
    value: str | None = None
    """None when the value comes from `valueFrom`, which we cannot resolve offline."""


class ResourceRequirements(K8sModel):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)


class ContainerResizePolicy(K8sModel):
    resource_name: str = ""
    restart_policy: str | None = None


class Container(K8sModel):
    name: str = ""
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    resize_policy: list[ContainerResizePolicy] | None = None
    """What an in-place resize of cpu or memory does to the container (Kubernetes >= 1.27)."""

    def env_value(self, name: str) -> str | None:
        """The value the container sees: the kubelet lets a later entry of the same
        name win (the TPU webhook appends `TPU_WORKER_ID` after a template's own)."""
        for var in reversed(self.env):
            if var.name == name:
                return var.value
        return None

    def requests_tpu(self) -> bool:
        """The webhook's test: a non-zero `google.com/tpu` limit or request."""
        return any(
            str(res.get(GKE_TPU_RESOURCE, "0")).strip() not in ("0", "")
            for res in (self.resources.limits, self.resources.requests)
        )


class PodSpec(K8sModel):
    containers: list[Container] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)


class PodTemplate(K8sModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec = Field(default_factory=PodSpec)


class ScaleStrategy(K8sModel):
    workers_to_delete: list[str] = Field(default_factory=list)


class HeadGroupSpec(K8sModel):
    ray_start_params: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, Quantity] | None = None
    """KubeRay >= 1.4: Ray resources of the head, overriding rayStartParams."""
    labels: dict[str, str] | None = None
    """KubeRay >= 1.5: Ray node labels of the head."""
    template: PodTemplate = Field(default_factory=PodTemplate)


class WorkerGroupSpec(K8sModel):
    group_name: str = Field(min_length=1)
    replicas: int | None = Field(default=None, ge=0)
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=KUBERAY_MAX_REPLICAS, ge=0)
    num_of_hosts: int = Field(default=1, ge=1)
    idle_timeout_seconds: int | None = Field(default=None, ge=0)
    priority: int | None = None
    suspend: bool | None = None
    ray_start_params: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, Quantity] | None = None
    """KubeRay >= 1.4: Ray resources of each pod, overriding rayStartParams."""
    labels: dict[str, str] | None = None
    """KubeRay >= 1.5: Ray node labels of each pod."""
    scale_strategy: ScaleStrategy = Field(default_factory=ScaleStrategy)
    template: PodTemplate

    @property
    def effective_replicas(self) -> int:
        """What KubeRay acts on: `replicas` raised to minReplicas, capped at maxReplicas."""
        return min(max(self.replicas or 0, self.min_replicas), self.max_replicas)


class AutoscalerOptions(K8sModel):
    idle_timeout_seconds: int | None = Field(default=None, ge=0)
    upscaling_mode: UpscalingMode | None = None
    version: Literal["v1", "v2"] | None = None
    image: str | None = None
    image_pull_policy: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] = Field(default_factory=list)


class RayClusterSpec(K8sModel):
    ray_version: str | None = None
    enable_in_tree_autoscaling: bool | None = None
    autoscaler_options: AutoscalerOptions = Field(default_factory=AutoscalerOptions)
    head_group_spec: HeadGroupSpec = Field(default_factory=HeadGroupSpec)
    worker_group_specs: list[WorkerGroupSpec] = Field(default_factory=list)


class RayCluster(K8sModel):
    api_version: str = "ray.io/v1"
    kind: Literal["RayCluster"] = "RayCluster"
    metadata: ObjectMeta
    spec: RayClusterSpec

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> RayCluster:
        return cls.model_validate(obj)
