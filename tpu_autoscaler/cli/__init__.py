"""`tpu-autoscaler`: the command line. Each subcommand parses its input at the edge,
calls the core and prints; bad input exits 2 with every problem named, never a
traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tpu_autoscaler import __version__
from tpu_autoscaler.cli.exit_codes import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from tpu_autoscaler.cli.live import cmd_local, cmd_run, cmd_snapshot, env_float
from tpu_autoscaler.cli.offline import cmd_plan, cmd_simulate, cmd_validate
from tpu_autoscaler.cli.record import add_record_parser
from tpu_autoscaler.cli.whatif import add_whatif_parser
from tpu_autoscaler.core.problems import ManifestError

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILURE", "EXIT_OK", "main"]


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
    validate.set_defaults(handler=cmd_validate)

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
    plan.add_argument(
        "--gang-arrival-bound-s",
        type=float,
        default=240.0,
        help="give back a gang's arrived slices if the rest are not up this long after launch",
    )
    plan.set_defaults(handler=cmd_plan)

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
    snap.set_defaults(handler=cmd_snapshot)

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
        default=env_float("AUTOSCALER_UPDATE_INTERVAL_S", 5.0),
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
    run.add_argument(
        "--gang-arrival-bound-s",
        type=float,
        default=240.0,
        help="give back a gang's arrived slices if the rest are not up this long after launch",
    )
    run.set_defaults(handler=cmd_run)

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
    local.add_argument(
        "--kubernetes",
        choices=("simulated", "real"),
        default="simulated",
        help="simulated: the simulator's API server in this process; real: kube-apiserver "
        "and etcd on this machine (make kube-binaries), the autoscaler holding only the "
        "documented Role's token",
    )
    local.set_defaults(handler=cmd_local)

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
    simulate.set_defaults(handler=cmd_simulate)
    add_record_parser(sub)
    add_whatif_parser(sub)
    return parser
