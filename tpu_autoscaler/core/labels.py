"""Names of labels, node selectors and environment variables shared with Ray, KubeRay,
GKE and the TPU webhook. Tests pin the Ray ones to `ray._raylet` so drift shows up."""

# Ray node labels (ray/_raylet RAY_NODE_*_KEY).
RAY_ACCELERATOR_TYPE = "ray.io/accelerator-type"
RAY_TPU_SLICE_NAME = "ray.io/tpu-slice-name"
RAY_TPU_WORKER_ID = "ray.io/tpu-worker-id"
RAY_TPU_TOPOLOGY = "ray.io/tpu-topology"
RAY_TPU_POD_TYPE = "ray.io/tpu-pod-type"
RAY_NODE_GROUP = "ray.io/node-group"
RAY_RESERVED_LABEL_PREFIX = "ray.io/"

# Ray resources.
TPU_RESOURCE = "TPU"
ACCELERATOR_TYPE_RESOURCE_PREFIX = "accelerator_type:"
IMPLICIT_RESOURCE_PREFIX = "node:__internal_implicit_resource_"
"""Every node has one unit of each such resource without reporting it (ray/_raylet)."""

# GKE node selectors and extended resource.
GKE_TPU_ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
GKE_TPU_RESOURCE = "google.com/tpu"

# KubeRay pod labels.
KUBERAY_CLUSTER = "ray.io/cluster"
KUBERAY_GROUP = "ray.io/group"
KUBERAY_NODE_TYPE = "ray.io/node-type"
KUBERAY_REPLICA_INDEX = "ray.io/worker-group-replica-index"
KUBERAY_REPLICA_NAME = "ray.io/worker-group-replica-name"
KUBERAY_HOST_INDEX = "ray.io/replica-host-index"
WEBHOOK_REPLICA_INDEX = "replicaIndex"

# Environment of a TPU pod (set by GKE, the webhook and KubeRay).
ENV_TPU_NAME = "TPU_NAME"
ENV_TPU_WORKER_ID = "TPU_WORKER_ID"
ENV_TPU_ACCELERATOR_TYPE = "TPU_ACCELERATOR_TYPE"
ENV_TPU_TOPOLOGY = "TPU_TOPOLOGY"
ENV_TPU_RESOURCE_PER_CHIP = "RAY_TPU_RESOURCE_PER_CHIP"
ENV_CLOUD_INSTANCE_ID = "RAY_CLOUD_INSTANCE_ID"
ENV_NODE_TYPE_NAME = "RAY_NODE_TYPE_NAME"
