"""The commands that talk to a cluster: `snapshot` (read one), `run` (the autoscaler,
as KubeRay starts it in `autoscalerOptions`) and `local` (real raylets as TPU hosts)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.manifest.loading import load_manifest
from tpu_autoscaler.manifest.shapes import derive_shapes

if TYPE_CHECKING:
    from tpu_autoscaler.adapters.kube.client import KubernetesApi

from tpu_autoscaler.cli.exit_codes import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK


def _kubernetes(host: str | None) -> KubernetesApi | None:
    """The API client (`host`, else in-cluster, else kubeconfig); None, said on stderr,
    if there is no configuration."""
    from kubernetes.config.config_exception import ConfigException

    from tpu_autoscaler.adapters.kube.client import KubernetesApi, kubernetes_api

    try:
        return KubernetesApi(kubernetes_api(host))
    except ConfigException as exc:
        message = f"error: no Kubernetes configuration (in-cluster or kubeconfig): {exc}"
        print(message, file=sys.stderr)
        return None


def cmd_snapshot(args: argparse.Namespace) -> int:
    import yaml

    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.adapters.live import take_snapshot

    if not args.cluster_name:
        print("error: --cluster-name (or RAY_CLUSTER_NAME) is required", file=sys.stderr)
        return EXIT_BAD_INPUT
    api = _kubernetes(args.kube_host)
    if api is None:
        return EXIT_FAILURE
    try:
        data = take_snapshot(api, args.cluster_name, args.namespace, args.gcs_address)
    except ApiError as exc:
        print(f"error: Kubernetes API: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(f"error: cannot reach the GCS: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    text = yaml.safe_dump(data, sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    return EXIT_OK


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ManifestError([Problem(f"${name}", f"is {raw!r}, not a number")]) from None


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.adapters.ray.gcs import RayGcsClient
    from tpu_autoscaler.adapters.ray.settings import conserve_gpu_nodes_from_env
    from tpu_autoscaler.core.snapshot import PolicyConfig
    from tpu_autoscaler.manifest.loading import parse_raycluster
    from tpu_autoscaler.shell import runner
    from tpu_autoscaler.shell.controller import Autoscaler
    from tpu_autoscaler.shell.metrics import AutoscalerMetrics

    problems = []
    if not args.cluster_name:
        problems.append(Problem("--cluster-name", "is required (or set RAY_CLUSTER_NAME)"))
    if args.update_interval_s <= 0:
        problems.append(Problem("--update-interval-s", "must be positive"))
    if args.provisioning_timeout_s <= 0:
        problems.append(Problem("--provisioning-timeout-s", "must be positive"))
    if args.creation_timeout_s <= 0:
        problems.append(Problem("--creation-timeout-s", "must be positive"))
    if args.gang_arrival_bound_s <= 0:
        problems.append(Problem("--gang-arrival-bound-s", "must be positive"))
    if problems:
        raise ManifestError(problems)
    runner.configure_logging(args.log_format)
    namespace = args.cluster_namespace or runner.namespace_from_pod()
    gcs_address = args.gcs_address or _pod_gcs_address()
    kube = _kubernetes(args.kube_host)
    if kube is None:
        return EXIT_FAILURE
    try:
        raw = kube.get_raycluster(namespace, args.cluster_name)
    except ApiError as exc:
        print(f"error: Kubernetes API: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    parse_raycluster(raw, f"raycluster {namespace}/{args.cluster_name}")
    stop = threading.Event()
    runner.stop_on_signals(stop)
    gcs = RayGcsClient(gcs_address)
    if not runner.wait_for_gcs(gcs, stop, args.update_interval_s):
        return EXIT_OK
    metrics = AutoscalerMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    from tpu_autoscaler.adapters.kube.provreq_client import KubernetesProvisioningApi

    autoscaler = Autoscaler(
        kube,
        gcs,
        namespace,
        args.cluster_name,
        config=PolicyConfig(
            provisioning_timeout_s=args.provisioning_timeout_s,
            creation_timeout_s=args.creation_timeout_s,
            gang_arrival_bound_s=args.gang_arrival_bound_s,
            conserve_gpu_nodes=conserve_gpu_nodes_from_env(),
        ),
        metrics=metrics,
        provisioning=KubernetesProvisioningApi(kube),
    )
    runner.log.info(
        "started",
        extra={"cluster": f"{namespace}/{args.cluster_name}", "gcs": gcs_address},
    )
    if args.once:
        return EXIT_OK if autoscaler.step().error is None else EXIT_FAILURE
    runner.run_rounds(autoscaler, stop, args.update_interval_s)
    return EXIT_OK


def _pod_gcs_address() -> str:
    """As `ray kuberay-autoscaler`: the autoscaler runs in the head pod, so the GCS is
    on this pod's own IP."""
    from ray._private.services import get_node_ip_address

    return f"{get_node_ip_address()}:6379"


def cmd_local(args: argparse.Namespace) -> int:
    import threading
    from pathlib import Path

    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.local.cluster import ClusterStartFailed
    from tpu_autoscaler.local.kubernetes import KubernetesUnavailable
    from tpu_autoscaler.local.session import AlreadyRunning, run_local
    from tpu_autoscaler.shell import runner

    if args.provision_delay_s < 0:
        raise ManifestError([Problem("--provision-delay-s", "must not be negative")])
    found, cluster = load_manifest(args.cluster)
    if cluster is None:
        raise ManifestError([Problem(args.cluster, found.describe())])
    if found.kind != "RayCluster":
        print(f"reading {found.describe()}", file=sys.stderr)
    shapes = derive_shapes(cluster)
    if shapes.errors:
        raise ManifestError([found.locate(p) for p in shapes.errors])
    if not any(s.tpu is not None for s in shapes.shapes):
        raise ManifestError([Problem(args.cluster, "has no TPU worker group to autoscale")])
    stop = threading.Event()
    runner.stop_on_signals(stop)
    try:
        # The manifest as written (not our model's re-dump, which adds empty defaults
        # such as `template.metadata.name: ""` that kube-apiserver 1.20 refuses).
        assert found.raycluster is not None
        return run_local(
            found.raycluster,
            args.policy,
            args.provision_delay_s,
            Path(args.address_file) if args.address_file else None,
            stop,
            keep_logs=args.keep_logs,
            out=lambda line: print(line, flush=True),
            kubernetes=args.kubernetes,
        )
    except AlreadyRunning as exc:
        print(f"error: {exc}; stop it first", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ClusterStartFailed, KubernetesUnavailable, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
