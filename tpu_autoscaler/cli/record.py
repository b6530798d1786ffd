"""`tpu-autoscaler record`: a running cluster's history, from Ray's GCS, as a workload
trace `simulate` and `whatif` take, with the RayCluster it ran on."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

import yaml

from tpu_autoscaler.cli.exit_codes import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from tpu_autoscaler.core.problems import ManifestError, Problem

if TYPE_CHECKING:
    from tpu_autoscaler.adapters.kube.api import KubeApi
    from tpu_autoscaler.record.history import SliceLaunch


def add_record_parser(sub: Any) -> None:
    record = sub.add_parser(
        "record",
        help="write a workload trace from a running Ray cluster's history",
        description="Read task, actor and placement group history from Ray's GCS (as the "
        "State API does; no dashboard needed) and write it as a workload trace: each piece "
        "of demand with its arrival, run time and shape, `slice_placement_group` calls as "
        "one item. Also writes the RayCluster it ran on (read from Kubernetes, or --cluster).",
    )
    record.add_argument(
        "--gcs-address", default=os.environ.get("RAY_ADDRESS"), help="host:port of the GCS"
    )
    record.add_argument("--from-history", help="a history written by --history-output, not the GCS")
    record.add_argument("--cluster", help="RayCluster manifest the history ran on")
    record.add_argument("--cluster-name", default=os.environ.get("RAY_CLUSTER_NAME"))
    record.add_argument("--namespace", default=os.environ.get("RAY_CLUSTER_NAMESPACE", "default"))
    record.add_argument("--kube-host", help="Kubernetes API URL, instead of in-cluster/kubeconfig")
    record.add_argument("--output", "-o", default="-", help="trace file to write, - for stdout")
    record.add_argument("--cluster-output", help="write the RayCluster here (YAML)")
    record.add_argument("--history-output", help="also write what was read (JSON)")
    record.add_argument(
        "--limit", type=int, default=100_000, help="entries per GCS read (per job for tasks)"
    )
    record.add_argument(
        "--resolution-s", type=float, default=1.0, help="times rounded to this many seconds"
    )
    record.add_argument(
        "--provisioning-delay-s",
        metavar="MIN-MAX",
        help="write this slice provisioning delay into the trace (seconds; default: the "
        "simulator's 60-180): Ray does not know how long a slice took to come up",
    )
    record.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    record.add_argument(
        "--no-kubernetes-events",
        action="store_true",
        help="do not read the autoscaler's ReplicaUp Events (with --cluster-name, they give "
        "each slice's pod creation, from which the provisioning delay is measured)",
    )
    record.set_defaults(handler=cmd_record)


def cmd_record(args: argparse.Namespace) -> int:
    from tpu_autoscaler.record.history import History, launches_up
    from tpu_autoscaler.record.trace import trace_from_history
    from tpu_autoscaler.sim.metrics import quantiles
    from tpu_autoscaler.sim.provisioning import RAYLET_START_S
    from tpu_autoscaler.sim.workload import DelayRange

    if args.limit < 1 or args.resolution_s <= 0:
        raise ManifestError([Problem("--limit/--resolution-s", "give positive numbers")])
    delay: DelayRange | None = None
    if args.provisioning_delay_s:
        try:
            delay = DelayRange.parse(args.provisioning_delay_s)
        except ValueError:
            raise ManifestError(
                [Problem("--provisioning-delay-s", "give seconds, S or MIN-MAX, e.g. 8-12")]
            ) from None
    raycluster = _raycluster(args)
    if raycluster is None:
        return EXIT_FAILURE
    if args.from_history:
        with open(args.from_history, encoding="utf-8") as f:
            history = History.model_validate_json(f.read())
    elif args.gcs_address:
        from tpu_autoscaler.adapters.ray.history import read_history

        try:
            history = read_history(args.gcs_address, args.limit, progress=not args.no_progress)
        except Exception as exc:  # grpc and Ray raise their own kinds; all mean the same
            print(f"error: reading the GCS at {args.gcs_address}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    else:
        print("error: give --gcs-address (or RAY_ADDRESS) or --from-history", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.from_history and args.cluster_name and not args.no_kubernetes_events:
        launched = _launches_told(args)
        if launched:
            history = history.model_copy(update={"slices_launched": launched})
    if args.history_output:
        with open(args.history_output, "w", encoding="utf-8") as f:
            f.write(history.model_dump_json(indent=1))
    recorded = trace_from_history(history, _slice_types(raycluster), args.resolution_s)
    name = raycluster["metadata"]["name"]
    header = [
        f"Recorded by `tpu-autoscaler record` from RayCluster {name}: time 0 is "
        f"{recorded.start_ms / 1000:.3f} (Unix s).",
        *recorded.notes,
    ]
    trace: dict[str, Any] = {
        "items": [i.model_dump(exclude_defaults=True) for i in recorded.workload.items]
    }
    provisioning: dict[str, Any] = {}
    spreads = [up.spread_s for up in history.slices_up if len(up.hosts_started_ms) > 1]
    stagger_s = max(spreads) if spreads else None
    if stagger_s is not None:
        # The widest spread seen: hosts drawn uniformly over it spread less on average.
        provisioning["host_stagger_s"] = stagger_s
        header.append(
            f"host_stagger_s: the widest spread of one slice's hosts starting in Ray, "
            f"{len(spreads)} multi-host slices seen ({min(spreads):g}-{max(spreads):g} s)."
        )
    paired = launches_up(history.slices_launched, history.slices_up)
    if delay is None and paired:
        firsts_s = [
            (up.hosts_started_ms[0] - launch.first_pod_created_ms) / 1000 for launch, up in paired
        ]
        # The simulator brings a slice's VMs up after the delay, runs each of its n pods
        # a uniform draw over the stagger later (the first, stagger/(n+1) on average),
        # and registers each raylet a few seconds after: those are not delay.
        delays_s = [
            max(0.0, first_s - RAYLET_START_S - (stagger_s or 0.0) / (len(up.hosts_started_ms) + 1))
            for first_s, (_, up) in zip(firsts_s, paired, strict=True)
        ]
        delay = DelayRange(min=round(min(delays_s), 1), max=round(max(delays_s), 1))
        header.append(
            f"delay_s: measured, {len(paired)} slice launches (the autoscaler's ReplicaUp "
            f"Events): {min(firsts_s):.1f}-{max(firsts_s):.1f} s from the first pod created to "
            f"the first host's raylet started, less the simulator's {RAYLET_START_S:g} s "
            "raylet start and its first pod's average wait within the host stagger."
        )
    unpaired = len(history.slices_launched) - len(paired)
    if unpaired:
        unmatched = (
            f"{unpaired} of {len(history.slices_launched)} slice launches the autoscaler told "
            "matched no slice Ray still remembers (the GCS keeps the newest dead nodes only: "
            "RAY_maximum_gcs_dead_node_cached_count); the delay leaves them out"
        )
        header.append(unmatched + ".")
        print(f"warning: {unmatched}", file=sys.stderr)
    if delay is not None:
        provisioning["delay_s"] = delay.model_dump()
    if provisioning:
        trace["provisioning"] = provisioning
    body = yaml.safe_dump(
        trace,
        sort_keys=False,
        default_flow_style=None,
        width=120,
    )
    text = "".join(f"# {line}\n" for line in header) + body
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    if args.cluster_output:
        with open(args.cluster_output, "w", encoding="utf-8") as f:
            yaml.safe_dump(raycluster, f, sort_keys=False)
    waits = quantiles(recorded.waits_s)
    launches = {k: len(v) for k, v in history.slice_launches_ms.items()}
    print(
        f"recorded {len(recorded.workload.items)} items; waits as they happened: "
        f"p50 {waits['p50']}s, p95 {waits['p95']}s; slices that came up: {launches or 0}",
        file=sys.stderr,
    )
    for note in recorded.notes:
        print(f"warning: {note}", file=sys.stderr)
    return EXIT_OK


def _raycluster(args: argparse.Namespace) -> dict[str, Any] | None:
    from tpu_autoscaler.manifest.loading import load_manifest, parse_raycluster

    if args.cluster:
        found, cluster = load_manifest(args.cluster)
        if cluster is None:
            raise ManifestError([Problem(args.cluster, found.describe())])
        return cluster.model_dump(by_alias=True, exclude_none=True)
    if not args.cluster_name:
        raise ManifestError(
            [Problem("--cluster", "give a manifest, or --cluster-name to read it from Kubernetes")]
        )
    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.cli.live import _kubernetes

    api = _kubernetes(args.kube_host)
    if api is None:
        return None
    try:
        raw = api.get_raycluster(args.namespace, args.cluster_name)
    except ApiError as exc:
        print(f"error: Kubernetes API: {exc}", file=sys.stderr)
        return None
    cluster = parse_raycluster(raw, f"RayCluster {args.namespace}/{args.cluster_name}")
    dumped: dict[str, Any] = cluster.model_dump(by_alias=True, exclude_none=True)
    dumped.pop("status", None)
    return dumped


def _launches_told(args: argparse.Namespace) -> list[SliceLaunch]:
    """Each slice launch the autoscaler told as come up; none, with a warning, if they
    cannot be read."""
    from tpu_autoscaler.adapters.kube.api import ApiError
    from tpu_autoscaler.cli.live import _kubernetes

    api = _kubernetes(args.kube_host)
    if api is None:
        print("warning: no slice launches read: the delay is not measured", file=sys.stderr)
        return []
    try:
        return launches_told(api, args.namespace, args.cluster_name)
    except ApiError as exc:
        print(f"warning: no slice launches read from Kubernetes: {exc}", file=sys.stderr)
        return []


def launches_told(api: KubeApi, namespace: str, cluster_name: str) -> list[SliceLaunch]:
    """Each slice launch the autoscaler told as come up: the `ReplicaUp` Events on the
    RayCluster `cluster_name`, by their annotations (`shell/readiness.py`). One told
    by another version, or of a group with no slices (no slice name), is passed over."""
    from tpu_autoscaler.record.history import SliceLaunch
    from tpu_autoscaler.shell import events, readiness

    selector = f"involvedObject.name={cluster_name},reason={events.REPLICA_UP}"
    launches = []
    for event in api.list_events(namespace, field_selector=selector):
        notes = (event.get("metadata") or {}).get("annotations") or {}
        try:
            launches.append(
                SliceLaunch(
                    slice_name=notes[readiness.SLICE_ANNOTATION],
                    replica=notes[readiness.REPLICA_ANNOTATION],
                    group=notes[readiness.GROUP_ANNOTATION],
                    first_pod_created_ms=float(notes[readiness.CREATED_ANNOTATION]) * 1000,
                )
            )
        except (KeyError, ValueError):
            continue
    return launches


def _slice_types(raycluster: dict[str, Any]) -> dict[str, Any]:
    from tpu_autoscaler.manifest.loading import parse_raycluster
    from tpu_autoscaler.manifest.shapes import derive_shapes
    from tpu_autoscaler.record.trace import SliceType

    types = {}
    for shape in derive_shapes(parse_raycluster(raycluster, "cluster")).shapes:
        if shape.tpu is not None:
            types[shape.tpu.pod_type] = SliceType(
                shape.tpu.topology,
                shape.tpu.generation.name,
                {"CPU": 1.0, "TPU": float(shape.tpu.chips_per_host)},
            )
    return types
