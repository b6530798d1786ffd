"""Prometheus metrics of the autoscaler, served on Ray's autoscaler port (44217) so
existing scrape configs find them. One registry per autoscaler, so tests and the
simulator can run several side by side."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

METRICS_PORT = 44217
SLICE_STATES = ("requested", "pending", "running", "draining")


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.slices = Gauge(
            "tpu_autoscaler_slices",
            "Replicas (slices) of each worker group by state",
            ["group", "state"],
            registry=r,
        )
        self.pending_bundles = Gauge(
            "tpu_autoscaler_pending_demand_bundles",
            "Demand bundles that existing, pending and planned capacity cannot yet hold",
            registry=r,
        )
        self.infeasible = Gauge(
            "tpu_autoscaler_infeasible_demands",
            "Demands (tasks, placement groups, request_resources) no group can ever serve",
            registry=r,
        )
        self.invalid_groups = Gauge(
            "tpu_autoscaler_invalid_worker_groups",
            "Worker groups whose spec is invalid and which are left alone",
            registry=r,
        )
        self.group_capacity = Gauge(
            "tpu_autoscaler_group_capacity",
            "1 for each worker group's capacity status (available, stocked_out, "
            "backing_off, churning), 0 for the others",
            ["group", "status"],
            registry=r,
        )
        self.group_capacity_since = Gauge(
            "tpu_autoscaler_group_capacity_since_timestamp_seconds",
            "Since when a worker group's capacity has been short (0: available)",
            ["group"],
            registry=r,
        )
        self.group_capacity_until = Gauge(
            "tpu_autoscaler_group_capacity_until_timestamp_seconds",
            "Until when a worker group backs off or is avoided (0: no such bound)",
            ["group"],
            registry=r,
        )
        self.launched = Counter(
            "tpu_autoscaler_replicas_launched",
            "Replicas (whole slices) launched",
            ["group"],
            registry=r,
        )
        self.removed = Counter(
            "tpu_autoscaler_replicas_removed",
            "Replicas (whole slices) removed, by cause",
            ["group", "cause"],
            registry=r,
        )
        self.drains_refused = Counter(
            "tpu_autoscaler_drains_refused",
            "Idle replicas kept because a host refused to drain (work arrived)",
            ["group"],
            registry=r,
        )
        self.conflicts = Counter(
            "tpu_autoscaler_patch_conflicts",
            "RayCluster patches refused as stale (re-read and re-planned)",
            registry=r,
        )
        self.api_errors = Counter(
            "tpu_autoscaler_api_errors",
            "Failed calls to the Kubernetes API or the GCS",
            ["api", "operation"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "tpu_autoscaler_decision_seconds",
            "Time to plan one round",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.replica_up_seconds = Histogram(
            "tpu_autoscaler_replica_up_seconds",
            "From a replica's first pod created to its last host registered with Ray, as "
            "the rounds saw it (up to one round late)",
            ["group"],
            buckets=(15, 30, 60, 120, 180, 300, 450, 600, 900, 1800, 3600),
            registry=r,
        )
        self.loop_seconds = Histogram(
            "tpu_autoscaler_loop_duration_seconds",
            "Time of one round: read, plan, drain, patch, report",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )

    def serve(self, port: int = METRICS_PORT, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)
