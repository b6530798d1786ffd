"""`tpu-autoscaler`: the command line. Each subcommand parses its input at the edge,
calls the core and prints; bad input exits 2 with every problem named, never a
traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpu_autoscaler import __version__
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import load_raycluster
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes

if TYPE_CHECKING:
    from tpu_autoscaler.adapters.kube.client import KubernetesApi

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        code: int = args.handler(args)
    except ManifestError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-autoscaler",
        description="Slice-aware autoscaling for Ray on KubeRay TPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser(
        "validate",
        help="check a RayCluster manifest and print each worker group's slice shape",
        description="Check a RayCluster manifest with the rules of the TPU webhook, KubeRay "
        "and Ray, and print the slice shape of each worker group. Exit 2 if it is invalid.",
    )
    validate.add_argument("manifest", help="RayCluster YAML or JSON file, or - for stdin")
    validate.add_argument("--output", choices=("text", "json"), default="text")
    validate.set_defaults(handler=_validate)

    plan = sub.add_parser(
        "plan",
        help="explain what the autoscaler would do on a cluster snapshot",
        description="Read a snapshot (RayCluster, its pods, Ray's ClusterResourceState, now) "
        "and print the scaling plan: whole replicas to launch and remove, and demand that "
        "cannot be served, each with its reason.",
    )
    plan.add_argument("snapshot", help="snapshot YAML or JSON file, or - for stdin")
    plan.add_argument("--output", choices=("text", "json"), default="text")
    plan.add_argument(
        "--policy",
        choices=("slice", "ray"),
        default="slice",
        help="slice: this project's policy; ray: Ray 2.60's stock KubeRay autoscaling",
    )
    plan.add_argument(
        "--provisioning-timeout-s", type=float, default=900.0, help="remove replicas pending longer"
    )
    plan.add_argument(
        "--creation-timeout-s",
        type=float,
        default=60.0,
        help="a replica missing pods is still being created this long after its newest pod",
    )
    plan.set_defaults(handler=_plan)

    snap = sub.add_parser(
        "snapshot",
        help="write a snapshot of a live cluster for `plan`",
        description="Read the RayCluster and its pods from Kubernetes (in-cluster config, "
        "else kubeconfig) and Ray's ClusterResourceState from the GCS, and write them as "
        "one snapshot file.",
    )
    snap.add_argument("--cluster-name", default=os.environ.get("RAY_CLUSTER_NAME"))
    snap.add_argument(
        "--namespace",
        "--cluster-namespace",
        dest="namespace",
        default=os.environ.get("RAY_CLUSTER_NAMESPACE", "default"),
    )
    snap.add_argument("--gcs-address", help="host:port of the GCS; without it, no Ray state")
    snap.add_argument("--kube-host", help="Kubernetes API URL, instead of in-cluster/kubeconfig")
    snap.add_argument("--output", "-o", default="-", help="file to write, - for stdout")
    snap.set_defaults(handler=_snapshot)

    run = sub.add_parser(
        "run",
        help="autoscale a RayCluster (in place of `ray kuberay-autoscaler`)",
        description="Run beside the Ray head as KubeRay's autoscaler: every interval, read "
        "the RayCluster, its pods and the GCS, plan whole slices, drain, patch, report. "
        "Takes the flags and environment of `ray kuberay-autoscaler`.",
    )
    run.add_argument("--cluster-name", default=os.environ.get("RAY_CLUSTER_NAME"))
    run.add_argument(
        "--cluster-namespace",
        default=os.environ.get("RAY_CLUSTER_NAMESPACE"),
        help="default: $RAY_CLUSTER_NAMESPACE, else this pod's namespace, else default",
    )
    run.add_argument("--gcs-address", help="host:port; default: this pod's IP, port 6379")
    run.add_argument("--kube-host", help="Kubernetes API URL (default: in-cluster, kubeconfig)")
    run.add_argument(
        "--update-interval-s",
        type=float,
        default=_env_float("AUTOSCALER_UPDATE_INTERVAL_S", 5.0),
        help="seconds between rounds (default: $AUTOSCALER_UPDATE_INTERVAL_S, else 5)",
    )
    run.add_argument("--metrics-port", type=int, default=44217, help="0: no metrics server")
    run.add_argument("--log-format", choices=("json", "text"), default="json")
    run.add_argument("--once", action="store_true", help="one round, then exit")
    run.add_argument(
        "--provisioning-timeout-s",
        type=float,
        default=900.0,
        help="remove a slice whose hosts are not all up this long after creation",
    )
    run.add_argument(
        "--creation-timeout-s",
        type=float,
        default=60.0,
        help="a slice missing pods is still being created this long after its newest pod",
    )
    run.set_defaults(handler=_run)

    local = sub.add_parser(
        "local",
        help="a real Ray cluster on this machine whose TPU hosts are raylets, autoscaled",
        description="Start a real Ray head, the simulated Kubernetes/KubeRay/GKE control "
        "plane in real time and, for every pod that runs, a real raylet with the pod's TPU "
        "environment; autoscale it with `tpu-autoscaler run` (or Ray's stock autoscaler). "
        "Prints the Ray address, then one line per scaling event, until SIGINT or SIGTERM.",
    )
    local.add_argument("--cluster", required=True, help="RayCluster manifest (YAML or JSON)")
    local.add_argument(
        "--policy",
        choices=("slice", "ray"),
        default="slice",
        help="slice: tpu-autoscaler; ray: Ray 2.60's stock KubeRay autoscaler v2",
    )
    local.add_argument("--address-file", help="write the Ray address here once it is up")
    local.add_argument(
        "--provision-delay-s",
        type=float,
        default=5.0,
        help="seconds from a slice's pods created to its hosts running (GKE: 60-180)",
    )
    local.add_argument(
        "--keep-logs", action="store_true", help="keep the Ray and autoscaler logs on exit"
    )
    local.set_defaults(handler=_local)

    simulate = sub.add_parser(
        "simulate",
        help="run a workload on a simulated TPU cluster under an autoscaler",
        description="Run a workload trace on a simulated cluster (Kubernetes, KubeRay, the TPU "
        "webhook, GKE provisioning and Ray on a virtual clock) under this project's policy or "
        "Ray 2.60's stock autoscaling, and print what happened.",
    )
    simulate.add_argument("--cluster", required=True, help="RayCluster manifest")
    simulate.add_argument("--workload", required=True, help="workload trace (YAML)")
    simulate.add_argument("--policy", choices=("slice", "ray"), default="slice")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument(
        "--world",
        choices=("realistic", "ideal"),
        default="realistic",
        help="realistic: KubeRay creates pods one call at a time, deleted pods linger, pods "
        "turn Running one by one, status writes move the resourceVersion; ideal: all of it "
        "instant and atomic, for comparison only",
    )
    simulate.add_argument("--output", choices=("text", "json"), default="text")
    simulate.add_argument("--plot", help="write slices, chips and pending demand over time (PNG)")
    simulate.add_argument(
        "--duration-s", type=float, help="simulated seconds (default: last work end + 30 min)"
    )
    simulate.set_defaults(handler=_simulate)
    return parser


def _validate(args: argparse.Namespace) -> int:
    cluster = load_raycluster(args.manifest)
    shapes = derive_shapes(cluster)
    if args.output == "json":
        print(json.dumps(validate_report(shapes), indent=2))
        return EXIT_BAD_INPUT if shapes.errors else EXIT_OK
    for problem in shapes.problems:
        print(problem, file=sys.stderr)
    if shapes.errors:
        print(
            f"{args.manifest}: {len(shapes.errors)} error(s), nothing changed",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(render_shapes_table(shapes))
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    from tpu_autoscaler.adapters.snapshot_file import load_snapshot
    from tpu_autoscaler.core.policy import plan
    from tpu_autoscaler.core.snapshot import PolicyConfig

    for flag in ("provisioning_timeout_s", "creation_timeout_s"):
        if getattr(args, flag) <= 0:
            print(f"error: --{flag.replace('_', '-')} must be positive", file=sys.stderr)
            return EXIT_BAD_INPUT
    loaded = load_snapshot(
        args.snapshot,
        PolicyConfig(
            provisioning_timeout_s=args.provisioning_timeout_s,
            creation_timeout_s=args.creation_timeout_s,
        ),
    )
    for problem in loaded.shapes.problems:
        print(
            f"{problem} (group left alone)" if problem.severity == "error" else problem,
            file=sys.stderr,
        )
    if args.policy == "ray":
        from tpu_autoscaler.adapters.ray.baseline import ray_plan

        result = ray_plan(loaded)
    else:
        result = plan(loaded.snapshot)
    if args.output == "json":
        print(json.dumps({"policy": args.policy, **result.to_json()}, indent=2))
    else:
        print(result.render_text())
    return EXIT_OK


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


def _snapshot(args: argparse.Namespace) -> int:
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


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ManifestError([Problem(f"${name}", f"is {raw!r}, not a number")]) from None


def _run(args: argparse.Namespace) -> int:
    import threading

    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.adapters.ray.gcs import RayGcsClient
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
    autoscaler = Autoscaler(
        kube,
        gcs,
        namespace,
        args.cluster_name,
        config=PolicyConfig(
            provisioning_timeout_s=args.provisioning_timeout_s,
            creation_timeout_s=args.creation_timeout_s,
        ),
        metrics=metrics,
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


def _local(args: argparse.Namespace) -> int:
    import threading
    from pathlib import Path

    from tpu_autoscaler.local.cluster import ClusterStartFailed
    from tpu_autoscaler.local.session import AlreadyRunning, run_local
    from tpu_autoscaler.shell import runner

    if args.provision_delay_s < 0:
        raise ManifestError([Problem("--provision-delay-s", "must not be negative")])
    cluster = load_raycluster(args.cluster)
    shapes = derive_shapes(cluster)
    if shapes.errors:
        raise ManifestError(list(shapes.errors))
    if not any(s.tpu is not None for s in shapes.shapes):
        raise ManifestError([Problem(args.cluster, "has no TPU worker group to autoscale")])
    stop = threading.Event()
    runner.stop_on_signals(stop)
    try:
        return run_local(
            cluster.model_dump(by_alias=True, exclude_none=True),
            args.policy,
            args.provision_delay_s,
            Path(args.address_file) if args.address_file else None,
            stop,
            keep_logs=args.keep_logs,
            out=lambda line: print(line, flush=True),
        )
    except AlreadyRunning as exc:
        print(f"error: {exc}; stop it first", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ClusterStartFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _simulate(args: argparse.Namespace) -> int:
    import logging

    from tpu_autoscaler.adapters.kube.api import Rejected
    from tpu_autoscaler.controlplane.world import WORLDS
    from tpu_autoscaler.sim.cluster import SimulatedCluster
    from tpu_autoscaler.sim.workload import load_workload

    # The simulated autoscaler's log lines would drown the summary; its decisions
    # are in the summary, the timeline and the simulated cluster's Events.
    logging.getLogger("tpu_autoscaler").addHandler(logging.NullHandler())

    cluster = load_raycluster(args.cluster)
    workload = load_workload(args.workload)
    unknown = {f.host_failure.group for f in workload.faults if f.host_failure} | {
        f.stockout.group for f in workload.faults if f.stockout
    }
    unknown |= set(workload.provisioning.capacity)
    unknown -= {g.group_name for g in cluster.spec.worker_group_specs}
    if unknown:
        raise ManifestError(
            [
                Problem(
                    f"{args.workload}", f"faults or capacity name unknown groups: {sorted(unknown)}"
                )
            ]
        )
    try:
        delay = workload.provisioning.delay_s
        sim = SimulatedCluster(
            cluster.model_dump(by_alias=True, exclude_none=True),
            args.policy,
            args.seed,
            provisioning_delay=lambda events: events.random.uniform(delay.min, delay.max),
            capacity=workload.provisioning.capacity,
            world=WORLDS[args.world],
        )
    except Rejected as exc:
        raise ManifestError([Problem(args.cluster, f"rejected at admission: {exc}")]) from None
    sim.load(workload)
    duration = args.duration_s if args.duration_s is not None else workload.last_end_s + 1800
    summary = sim.run(duration)
    if args.plot:
        from tpu_autoscaler.sim.plot import plot_timeline

        plot_timeline(sim.timeline, args.plot, f"{cluster.metadata.name}: {args.policy} policy")
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:26} {value}")
    return EXIT_OK


def shape_json(shape: SliceShape) -> dict[str, Any]:
    tpu = shape.tpu
    return {
        "name": shape.group,
        "accelerator": tpu.generation.gke_accelerators[0] if tpu else None,
        "generation": tpu.generation.name if tpu else None,
        "topology": tpu.topology if tpu else None,
        "pod_type": tpu.pod_type if tpu else None,
        "hosts_per_replica": shape.hosts_per_replica,
        "chips_per_host": tpu.chips_per_host if tpu else None,
        "tpu_per_host": shape.tpu_per_host if tpu else None,
        "head_resource": tpu.head_resource if tpu else None,
        "labels": dict(sorted(shape.group_labels.items())),
        "resources_per_host": dict(sorted(shape.resources_per_host.items())),
        "min_replicas": shape.min_replicas,
        "max_replicas": shape.max_replicas,
        "idle_timeout_s": shape.idle_timeout_s,
        "upscaling_mode": shape.upscaling_mode,
        "priority": shape.priority,
    }


def validate_report(shapes: ClusterShapes) -> dict[str, Any]:
    return {
        "cluster": shapes.cluster,
        "namespace": shapes.namespace,
        "groups": [shape_json(s) for s in shapes.shapes],
        "errors": [p.to_json() for p in shapes.errors],
        "warnings": [p.to_json() for p in shapes.warnings],
    }


def render_shapes_table(shapes: ClusterShapes) -> str:
    header = (
        "GROUP",
        "ACCELERATOR",
        "TOPOLOGY",
        "POD TYPE",
        "HOSTS",
        "CHIPS/HOST",
        "TPU/HOST",
        "HEAD RESOURCE",
        "REPLICAS",
        "IDLE",
    )
    rows = [header]
    for s in shapes.shapes:
        tpu = s.tpu
        rows.append(
            (
                s.group,
                tpu.generation.gke_accelerators[0] if tpu else "-",
                tpu.topology if tpu else "-",
                tpu.pod_type if tpu else "-",
                str(s.hosts_per_replica),
                str(tpu.chips_per_host) if tpu else "-",
                f"{s.tpu_per_host:g}" if tpu else "-",
                tpu.head_resource if tpu else "-",
                f"{s.min_replicas}..{s.max_replicas}",
                f"{s.idle_timeout_s:g}s",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"RayCluster {shapes.namespace}/{shapes.cluster}"]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for s in shapes.shapes:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(s.group_labels.items()))
        lines.append(f"  {s.group}: labels {labels}")
    return "\n".join(lines)
