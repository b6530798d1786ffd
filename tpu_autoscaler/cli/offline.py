"""The commands that read files only: `validate` (a manifest's worker groups and
problems), `plan` (one decision on a snapshot) and `simulate` (a workload trace on the
simulated cluster)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tpu_autoscaler.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.core.shape import SliceShape
from tpu_autoscaler.manifest.loading import load_manifest
from tpu_autoscaler.manifest.objects import ClusterSource
from tpu_autoscaler.manifest.shapes import ClusterShapes, derive_shapes


def cmd_validate(args: argparse.Namespace) -> int:
    found, cluster = load_manifest(args.manifest)
    if cluster is None:
        # A RayJob on an existing cluster: nothing of ours to check, and not an error.
        if args.output == "json":
            print(json.dumps({"source": source_json(found), "groups": [], "errors": []}, indent=2))
        else:
            print(found.describe())
        return EXIT_OK
    derived = derive_shapes(cluster)
    shapes = replace(derived, problems=tuple(found.locate(p) for p in derived.problems))
    if args.output == "json":
        print(json.dumps({"source": source_json(found), **validate_report(shapes)}, indent=2))
        return EXIT_BAD_INPUT if shapes.errors else EXIT_OK
    for problem in shapes.problems:
        print(problem, file=sys.stderr)
    if shapes.errors:
        print(
            f"{args.manifest}: {len(shapes.errors)} error(s), nothing changed",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(render_shapes_table(shapes, found.describe()))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from tpu_autoscaler.adapters.ray.settings import conserve_gpu_nodes_from_env
    from tpu_autoscaler.adapters.snapshot_file import load_snapshot
    from tpu_autoscaler.core.policy import plan
    from tpu_autoscaler.core.snapshot import PolicyConfig

    for flag in ("provisioning_timeout_s", "creation_timeout_s", "gang_arrival_bound_s"):
        if getattr(args, flag) <= 0:
            print(f"error: --{flag.replace('_', '-')} must be positive", file=sys.stderr)
            return EXIT_BAD_INPUT
    loaded = load_snapshot(
        args.snapshot,
        PolicyConfig(
            provisioning_timeout_s=args.provisioning_timeout_s,
            creation_timeout_s=args.creation_timeout_s,
            gang_arrival_bound_s=args.gang_arrival_bound_s,
            conserve_gpu_nodes=conserve_gpu_nodes_from_env(),
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
    signals = loaded.snapshot.capacity_signals
    if args.output == "json":
        read = {"capacity_signals": [s.to_json() for s in signals]}
        print(json.dumps({"policy": args.policy, **result.to_json(), **read}, indent=2))
    else:
        print(result.render_text())
        for s in signals:  # what the snapshot's Events and pods said, as read
            print(f"signal {s.group}: {s.problem} at {s.at_s:.0f}: {s.message} ({s.source})")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    import logging

    from tpu_autoscaler.adapters.kube.api import Rejected
    from tpu_autoscaler.controlplane.world import WORLDS
    from tpu_autoscaler.sim.cluster import SimulatedCluster
    from tpu_autoscaler.sim.workload import load_workload

    # The simulated autoscaler's log lines would drown the summary; its decisions
    # are in the summary, the timeline and the simulated cluster's Events.
    logging.getLogger("tpu_autoscaler").addHandler(logging.NullHandler())

    found, cluster = load_manifest(args.cluster)
    if cluster is None:
        raise ManifestError([Problem(args.cluster, found.describe())])
    if found.kind != "RayCluster":
        print(f"reading {found.describe()}", file=sys.stderr)
    workload = load_workload(args.workload)
    unknown = {f.group for f in workload.faults}
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
        sim = SimulatedCluster.for_workload(
            cluster.model_dump(by_alias=True, exclude_none=True),
            workload,
            args.policy,
            args.seed,
            WORLDS[args.world],
        )
    except Rejected as exc:
        raise ManifestError([Problem(args.cluster, f"rejected at admission: {exc}")]) from None
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
        "head": None
        if shapes.head is None
        else {
            "resources": dict(sorted(shapes.head.resources.items())),
            "labels": dict(sorted(shapes.head.labels.items())),
        },
        "errors": [p.to_json() for p in shapes.errors],
        "warnings": [p.to_json() for p in shapes.warnings],
    }


def source_json(found: ClusterSource) -> dict[str, str | None]:
    return {
        "kind": found.kind,
        "name": found.name,
        "namespace": found.namespace,
        "cluster_spec": found.spec_path if found.raycluster is not None else None,
        "selected_cluster": found.selected_cluster,
    }


def render_shapes_table(shapes: ClusterShapes, title: str | None = None) -> str:
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
    lines = [title or f"RayCluster {shapes.namespace}/{shapes.cluster}"]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for s in shapes.shapes:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(s.group_labels.items()))
        per_host = s.host_resources(1 % s.hosts_per_replica)
        per_host.pop(s.head_resource or "", None)
        head_note = f"; {s.head_resource}=1 on host 0" if s.head_resource else ""
        lines.append(f"  {s.group}: resources per host {_amounts(per_host)}{head_note}")
        lines.append(f"  {s.group}: labels {labels}")
    if shapes.head is not None:
        lines.append(f"  head: resources {_amounts(shapes.head.resources)}")
    return "\n".join(lines)


def _amounts(resources: Mapping[str, float]) -> str:
    """`CPU=24, TPU=4, memory=1e+11`: as Ray counts them."""
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()))
