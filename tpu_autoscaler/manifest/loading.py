"""Reading Kubernetes objects from a file or stdin: YAML (one or many documents) or
JSON, a single object, a `List`, or a list. Every failure is a `ManifestError` that
names the file and, for a RayCluster, the field path, so the CLI can exit 2 cleanly.
A RayJob's or RayService's embedded cluster is read as the RayCluster KubeRay makes
of it (`manifest/objects.py`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tpu_autoscaler.core.problems import ManifestError, Problem
from tpu_autoscaler.manifest.model import RayCluster
from tpu_autoscaler.manifest.objects import ClusterSource, pick_cluster_source


def read_text(source: str) -> str:
    """The text of `source`, a path or `-` for stdin."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem(source, f"cannot be read: {exc}")]) from None


def load_documents(text: str, source: str) -> list[Any]:
    """Every YAML/JSON document in `text`, with `List` objects and lists flattened."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(
            [Problem(source, f"is not valid YAML or JSON{where}: {problem}")]
        ) from None
    flat: list[Any] = []
    for doc in documents:
        if isinstance(doc, list):
            flat.extend(doc)
        elif isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            flat.extend(doc.get("items") or [])
        else:
            flat.append(doc)
    return flat


def parse_raycluster(obj: dict[str, Any], source: str) -> RayCluster:
    """A validated RayCluster; every type error as a Problem naming its field and group."""
    try:
        return RayCluster.model_validate(obj)
    except ValidationError as exc:
        raise ManifestError(
            [_problem_from_pydantic(err, obj, source) for err in exc.errors()]
        ) from None


def load_manifest(source: str) -> tuple[ClusterSource, RayCluster | None]:
    """The cluster the manifest in file `source` (or stdin for `-`) describes: which
    object it came from, and the RayCluster (None for a RayJob's clusterSelector)."""
    found = pick_cluster_source(load_documents(read_text(source), source), source)
    if found.raycluster is None:
        return found, None
    try:
        return found, parse_raycluster(found.raycluster, source)
    except ManifestError as exc:
        raise ManifestError([found.locate(p) for p in exc.problems]) from None


def load_raycluster(source: str) -> RayCluster:
    """The RayCluster the manifest in `source` describes (its own, a RayJob's or a
    RayService's); a RayJob that selects an existing cluster is bad input here."""
    found, cluster = load_manifest(source)
    if cluster is None:
        raise ManifestError([Problem(source, found.describe())])
    return cluster


def format_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int) or "/" in part or "." in part:
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _problem_from_pydantic(err: Any, obj: dict[str, Any], source: str) -> Problem:
    loc = tuple(err["loc"])
    group = _group_named_at(loc, obj)
    return Problem(f"{source}: {format_path(loc)}", str(err["msg"]), group)


def _group_named_at(loc: tuple[str | int, ...], obj: dict[str, Any]) -> str | None:
    """The groupName of the worker group a validation error points into, if any."""
    if len(loc) >= 3 and loc[:2] == ("spec", "workerGroupSpecs") and isinstance(loc[2], int):
        groups = (obj.get("spec") or {}).get("workerGroupSpecs") or []
        if loc[2] < len(groups) and isinstance(groups[loc[2]], dict):
            name = groups[loc[2]].get("groupName")
            return str(name) if name is not None else f"#{loc[2]}"
        return f"#{loc[2]}"
    return None
