"""Every RayCluster, RayJob and RayService among KubeRay's own samples, read by Ray 2.60
and by us: the conformance table of issue 17 (docs/configuration.md).

Reads `ray-operator/config/samples/**.yaml` at the KubeRay tag we support (v1.7.0) out
of a git mirror of KubeRay (a bare repository; default /work/.mirror/ray-project+kuberay/repo,
or --mirror / $KUBERAY_MIRROR), nothing copied into this repository. For each object:
which cluster it describes (`manifest/objects.py`; a RayJob's clusterSelector brings
none), then `tpu_autoscaler.testing.ray_parity.judge`: the API server's defaults,
KubeRay's refusals, the installed Ray's `_derive_autoscaling_config_from_ray_cr`, and
our `validate`. Prints one row per object and the counts:

- same: both read it, and every difference is a documented divergence (listed);
- differs: both read it, with a difference nothing documents (why);
- both refuse: we refuse it, and so do KubeRay, the API server or Ray's config;
- we refuse, Ray reads / Ray refuses, we read / KubeRay refuses, we read.

    python benchmarks/conformance_kuberay_samples.py [--mirror DIR] [--tag v1.7.0]
        [--markdown OUT.md]

Exit 0 with a line saying so when the mirror is absent; exit 1 when any object
"differs" or "we refuse, Ray reads" (the issue's targets).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpu_autoscaler.core.problems import ManifestError
from tpu_autoscaler.manifest.objects import EMBEDDED_SPEC, cluster_source
from tpu_autoscaler.testing.ray_parity import Verdict, judge

DEFAULT_MIRROR = "/work/.mirror/ray-project+kuberay/repo"
SAMPLES = "ray-operator/config/samples"
KINDS = ("RayCluster", *EMBEDDED_SPEC)
BAD = ("differs", "we refuse, Ray reads", "KubeRay refuses, we read")


def git(mirror: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", *args], check=True, capture_output=True, text=True
    ).stdout


def sample_objects(mirror: Path, tag: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, object) of every RayCluster, RayJob and RayService in the samples at `tag`."""
    paths = git(mirror, "ls-tree", "-r", "--name-only", f"{tag}:{SAMPLES}").split()
    found = []
    for path in sorted(p for p in paths if p.endswith((".yaml", ".yml"))):
        text = git(mirror, "show", f"{tag}:{SAMPLES}/{path}")
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError:
            continue
        for doc in documents:
            if isinstance(doc, dict) and doc.get("kind") in KINDS:
                found.append((path, doc))
    return found


def verdict_of(path: str, obj: dict[str, Any]) -> Verdict:
    try:
        source = cluster_source(obj, path)
    except ManifestError as exc:
        return Verdict("both refuse", f"KubeRay refuses it too | we: {exc.problems[0]}")
    if source.raycluster is None:
        return Verdict("existing cluster", source.describe())
    # Ray's config logs its own warnings and errors; the table says what matters.
    with contextlib.redirect_stderr(io.StringIO()):
        return judge(source.raycluster)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("KUBERAY_MIRROR", DEFAULT_MIRROR))
    parser.add_argument("--tag", default="v1.7.0")
    parser.add_argument("--markdown", help="also write the table as Markdown here")
    args = parser.parse_args()
    mirror = Path(args.mirror)
    if not (mirror / "HEAD").exists() and not (mirror / ".git").exists():
        print(f"skipped: no KubeRay mirror at {mirror} (--mirror or $KUBERAY_MIRROR)")
        return 0
    if (mirror / ".git").exists():
        mirror = mirror / ".git"
    logging.disable(logging.CRITICAL)
    rows = []
    for path, obj in sample_objects(mirror, args.tag):
        verdict = verdict_of(path, obj)
        meta = obj.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        note = ", ".join(verdict.divergences)
        if verdict.outcome != "same":
            note = f"{note}: {verdict.why}" if note else verdict.why
        rows.append((path, f"{obj['kind']} {name}", verdict.outcome, note))
    counts = collections.Counter(row[2] for row in rows)
    print(render(rows, counts, args.tag))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, counts, args.tag), encoding="utf-8")
    return 1 if any(counts[b] for b in BAD) else 0


def render(rows: list[tuple[str, str, str, str]], counts: Any, tag: str) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"KubeRay {tag} samples: {len(rows)} objects"]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:3], widths, strict=True)]
        lines.append("  ".join([*cells, row[3][:160]]).rstrip())
    lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def markdown(rows: list[tuple[str, str, str, str]], counts: Any, tag: str) -> str:
    lines = [
        f"KubeRay {tag} samples, {len(rows)} objects: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        "",
        "| sample | object | verdict | divergences / why |",
        "|---|---|---|---|",
    ]
    for path, obj, outcome, note in rows:
        lines.append(f"| {path} | {obj} | {outcome} | {note.replace('|', '/')[:200]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
