"""Ray's own scheduler unit tests, run against our SliceScheduler: the conformance
table of issue 12 (docs/parity.md).

Runs Ray's `python/ray/autoscaler/v2/tests/test_scheduler.py` (a copy kept outside
this repository) four times with pytest:

- `ray`: as is, against Ray's `ResourceDemandScheduler`;
- `ours`: with the name `ResourceDemandScheduler` in the test module replaced, once
  the module is imported and before any test runs, by `SliceSchedulerAsRay`: our
  `SliceScheduler` behind Ray's constructor, built from each `SchedulingRequest`
  alone (no KubeCluster, no RayCluster: node type configs become shapes). Each
  request also goes to a Ray scheduler on the side, and the two replies' decisions
  (launches, terminations with their causes, infeasible counts) are compared;
- `empty`: the same name replaced by a scheduler that always replies empty;
- `compare`: Ray's scheduler answers the test and ours decides aside, so that every
  call of a test is compared, also those after ours would have failed an assertion.

A test ours passes passes by accident when an empty reply passes it too (it asserts
no decision), or when our reply differs from Ray's on some call (its asserts do not
look at what differs).

A test that reaches into Ray's scheduler (`ResourceDemandScheduler._sched_best_node`,
`scheduler._something`) is "n/a" with the name it reached for, and so is one that
never calls a scheduler (it tests Ray's own `SchedulingNode`).

    python benchmarks/conformance_ray_scheduler.py PATH/TO/test_scheduler.py \\
        [--util PATH/TO/util.py] [--markdown OUT.md] [--json OUT.json] [--no-compat]

Ray's tests import `ray.autoscaler.v2.tests.util`, which Ray's wheel leaves out; the
plugin loads it from --util (default: util.py beside the test file). Copies of the
file older than the installed Ray build `ClusterResourceConstraint(min_bundles=...)`,
a field since renamed `resource_requests`: unless --no-compat, every run (Ray's
too) maps the old keyword onto the new field. This file is
also that pytest plugin (`-p conformance_ray_scheduler`, told what to do by the
CONFORMANCE_* environment variables); it does nothing in a run without them.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from abc import ABCMeta
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ray.autoscaler.v2.scheduler import (
    IResourceScheduler,
    ResourceDemandScheduler,
    SchedulingReply,
)
from ray.core.generated.instance_manager_pb2 import TerminationRequest

from tpu_autoscaler.adapters.ray.scheduler import SliceScheduler

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN = Path(__file__).stem
MODE_ENV = "CONFORMANCE_MODE"
RESULTS_ENV = "CONFORMANCE_RESULTS"
UTIL_ENV = "CONFORMANCE_UTIL"
COMPAT_ENV = "CONFORMANCE_COMPAT"
MODES = ("ray", "ours", "empty", "compare")
RUN_TIMEOUT_S = 900


# --- the stand-ins for ResourceDemandScheduler -----------------------------------------


class NotApplicable(Exception):
    """A test reached into Ray's scheduler, which no other scheduler has."""


@dataclass
class Probe:
    """What the stand-in saw during one test."""

    schedule_calls: int = 0
    decided: int = 0
    """Replies with a launch, a termination or an infeasible request in them."""
    private: set[str] = field(default_factory=set)
    """Ray scheduler internals the test reached for."""
    same_as_ray: int = 0
    """Calls where ours decided what Ray's scheduler decided on the same request."""
    differences: list[str] = field(default_factory=list)


def decisions(reply: SchedulingReply) -> dict[str, Any]:
    """What a reply decides, in Ray's units: hosts to launch per type, instances to
    terminate with their causes, how many requests of each kind are infeasible."""
    launch: dict[str, int] = {}
    for request in reply.to_launch:
        launch[request.instance_type] = launch.get(request.instance_type, 0) + request.count
    return {
        "launch": dict(sorted(launch.items())),
        "terminate": sorted(
            f"{t.instance_id}:{TerminationRequest.Cause.Name(t.cause)}" for t in reply.to_terminate
        ),
        "infeasible": {
            "requests": len(reply.infeasible_resource_requests),
            "gangs": len(reply.infeasible_gang_resource_requests),
            "constraints": len(reply.infeasible_cluster_resource_constraints),
        },
    }


def difference(ours: Mapping[str, Any], ray: Mapping[str, Any]) -> str:
    """The parts of two `decisions` that differ, ours first."""
    parts = []
    for key, value in ours.items():
        other = ray[key]
        if isinstance(value, dict) and isinstance(other, dict) and key == "infeasible":
            parts += [
                f"infeasible {k} {value[k]} (Ray {other[k]})" for k in value if value[k] != other[k]
            ]
        elif value != other:
            parts.append(f"{key} {value} (Ray {other})")
    return ", ".join(parts)


PROBE = Probe()

_RAY_INTERNALS = frozenset(
    name
    for name in [*dir(ResourceDemandScheduler), *vars(ResourceDemandScheduler())]
    if name.startswith("_") and not name.startswith("__")
)


def _reach(name: str) -> NotApplicable | AttributeError:
    if name in _RAY_INTERNALS:
        PROBE.private.add(name)
        return NotApplicable(f"reaches into ResourceDemandScheduler.{name}")
    return AttributeError(name)


class _RayName(ABCMeta):
    """The class side of the guard: `ResourceDemandScheduler._x` on a stand-in."""

    def __getattr__(cls, name: str) -> Any:
        raise _reach(name)


class _StandIn(IResourceScheduler, metaclass=_RayName):  # type: ignore[misc]
    """Ray's constructor (`ResourceDemandScheduler(event_logger=None)`), the probe,
    and the guard against Ray's internals. `decide` answers the test; `aside`, when
    there is one, gets the same request and the two decisions are compared."""

    aside: IResourceScheduler | None = None

    def __init__(self, event_logger: Any = None) -> None:
        self.event_logger = event_logger

    def __getattr__(self, name: str) -> Any:
        raise _reach(name)

    def schedule(self, request: Any) -> SchedulingReply:
        aside_request = copy.deepcopy(request) if self.aside is not None else None
        reply = self.decide(request)
        PROBE.schedule_calls += 1
        answer = decisions(reply)
        if answer["launch"] or answer["terminate"] or any(answer["infeasible"].values()):
            PROBE.decided += 1
        if self.aside is not None:
            try:
                other = decisions(self.aside.schedule(aside_request))
            except Exception as error:  # a failure aside is a difference too
                other = {key: f"raised {error!r}" for key in answer}
            ours, ray = self.ours_and_ray(answer, other)
            if ours == ray:
                PROBE.same_as_ray += 1
            else:
                PROBE.differences.append(f"call {PROBE.schedule_calls}: {difference(ours, ray)}")
        return reply

    def decide(self, request: Any) -> SchedulingReply:
        raise NotImplementedError

    def ours_and_ray(self, answer: Any, other: Any) -> tuple[Any, Any]:
        return answer, other


class SliceSchedulerAsRay(_StandIn):
    """Our `SliceScheduler` where Ray's tests build a `ResourceDemandScheduler`.

    Everything comes from the `SchedulingRequest`: with no KubeCluster and no
    RayCluster, SliceScheduler turns each node type config into a shape (one host
    per replica unless its resources or labels name a multi-host TPU slice), reads
    the head type off the instances, replicas off the instances and Ray nodes, and
    demand off the request's messages. Ray's scheduler decides aside."""

    def __init__(self, event_logger: Any = None) -> None:
        super().__init__(event_logger)
        self.inner = SliceScheduler(cluster=None)
        self.aside = ResourceDemandScheduler(event_logger)

    def decide(self, request: Any) -> SchedulingReply:
        return self.inner.schedule(request)


class RayWithOursAside(_StandIn):
    """Ray's scheduler answers the test; ours decides aside. The test runs to its
    end whatever ours decides, so every call of it is compared, not only those
    before ours fails an assertion."""

    def __init__(self, event_logger: Any = None) -> None:
        super().__init__(event_logger)
        self.ray = ResourceDemandScheduler(event_logger)
        self.aside = SliceScheduler(cluster=None)

    def decide(self, request: Any) -> SchedulingReply:
        reply: SchedulingReply = self.ray.schedule(request)
        return reply

    def ours_and_ray(self, answer: Any, other: Any) -> tuple[Any, Any]:
        return other, answer


class EmptyReplyScheduler(_StandIn):
    """Decides nothing: what a test that passes with it too asserts is no decision."""

    def decide(self, request: Any) -> SchedulingReply:
        return SchedulingReply()


STAND_INS: Mapping[str, type[_StandIn]] = {
    "ours": SliceSchedulerAsRay,
    "compare": RayWithOursAside,
    "empty": EmptyReplyScheduler,
}


# --- the pytest plugin -----------------------------------------------------------------

_RESULTS: dict[str, dict[str, Any]] = {}
_ROOTPATH: list[Path] = []


def _mode() -> str | None:
    return os.environ.get(MODE_ENV)


def install_ray_test_util(util: Path) -> None:
    """Make `ray.autoscaler.v2.tests.util` importable from `util` when Ray's wheel
    has no such module."""
    try:
        importlib.import_module("ray.autoscaler.v2.tests.util")
        return
    except ImportError:
        pass
    import ray.autoscaler.v2 as v2

    package = types.ModuleType("ray.autoscaler.v2.tests")
    package.__path__ = []
    sys.modules[package.__name__] = package
    v2.tests = package  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_file_location(f"{package.__name__}.util", util)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {util}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    package.util = module  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    if _mode() is None:
        return
    _ROOTPATH.append(config.rootpath)
    install_ray_test_util(Path(os.environ[UTIL_ENV]))


def min_bundles_compat(message_type: Any) -> Any:
    """`message_type` (Ray's `ClusterResourceConstraint`) taking the keyword
    `min_bundles` for its field `resource_requests`, as older copies of Ray's tests
    spell it; or `message_type` itself when it still has `min_bundles`."""
    fields = message_type.DESCRIPTOR.fields_by_name
    if "min_bundles" in fields or "resource_requests" not in fields:
        return message_type

    def build(*args: Any, min_bundles: Any = None, **kwargs: Any) -> Any:
        if min_bundles is not None:
            kwargs["resource_requests"] = min_bundles
        return message_type(*args, **kwargs)

    return build


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if _mode() is None:
        return
    stand_in = STAND_INS.get(_mode() or "")
    for module in dict.fromkeys(getattr(item, "module", None) for item in items):
        if module is None:
            continue
        if stand_in is not None and hasattr(module, "ResourceDemandScheduler"):
            module.ResourceDemandScheduler = stand_in
        if os.environ.get(COMPAT_ENV) == "1" and hasattr(module, "ClusterResourceConstraint"):
            module.ClusterResourceConstraint = min_bundles_compat(module.ClusterResourceConstraint)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global PROBE
    PROBE = Probe()
    yield


def _first_line(report: pytest.TestReport) -> str:
    """The first line of the failure's message, and the test file's line when the
    failure was raised there (an assertion of the test, not code it called)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(crash.message if crash is not None else report.longrepr).strip()
    line = text.splitlines()[0] if text else ""
    line = line.removeprefix("AssertionError: ")
    test_file = _ROOTPATH[0] / report.nodeid.split("::")[0] if _ROOTPATH else None
    if crash is not None and test_file is not None and Path(crash.path) == test_file:
        line = f"line {crash.lineno}: {line}"
    return line


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _mode() is None:
        return
    record = _RESULTS.setdefault(report.nodeid, {"outcome": None, "message": ""})
    if report.failed:
        if record["outcome"] not in ("failed", "error"):
            record["outcome"] = "failed" if report.when == "call" else "error"
            record["message"] = _first_line(report)
    elif report.skipped and record["outcome"] is None:
        record["outcome"] = "skipped"
        record["message"] = _first_line(report)
    elif report.when == "call" and record["outcome"] is None:
        record["outcome"] = "passed"
    if report.when == "teardown":
        record["schedule_calls"] = PROBE.schedule_calls
        record["decided"] = PROBE.decided
        record["private"] = sorted(PROBE.private)
        record["same_as_ray"] = PROBE.same_as_ray
        record["differences"] = PROBE.differences


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get(RESULTS_ENV)
    if _mode() is None or out is None:
        return
    Path(out).write_text(json.dumps(_RESULTS, indent=1))


# --- running Ray's file in each mode ---------------------------------------------------


def run_mode(
    test_file: Path, util: Path, mode: str, compat: bool = True
) -> dict[str, dict[str, Any]]:
    """One pytest run of `test_file` in `mode`; each test's outcome and probe."""
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        out = Path(tmp) / "results.json"
        env = dict(os.environ)
        env.update({MODE_ENV: mode, RESULTS_ENV: str(out), UTIL_ENV: str(util)})
        env[COMPAT_ENV] = "1" if compat else "0"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE), str(ROOT), env.get("PYTHONPATH", "")) if p
        )
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-p",
            PLUGIN,
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            "--rootdir",
            str(test_file.parent),
            "-q",
            "--tb=line",
        ]
        done = subprocess.run(
            command,
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        if done.returncode not in (0, 1) or not out.exists():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise RuntimeError(f"pytest in mode {mode} exited {done.returncode}:\n{tail}")
        results: dict[str, dict[str, Any]] = json.loads(out.read_text())
        return results


# --- the table -------------------------------------------------------------------------

_SHOWN = {"passed": "pass", "failed": "FAIL", "error": "error", "skipped": "skip", None: "-"}


@dataclass(frozen=True)
class Row:
    test: str
    ray: str
    ours: str
    """pass, FAIL, error, skip, or n/a (the test cannot judge a scheduler swap)."""
    empty: str
    same: str
    """Of the test's scheduler calls, how many ours decided as Ray's ("2/3"; from the
    `compare` run, where every call is made)."""
    differences: tuple[str, ...]
    """Each call ours decides otherwise than Ray, from the `compare` run."""
    accident: bool
    """Ours passes, and an empty reply passes too or our reply differs from Ray's."""
    note: str
    """Why n/a; the first line of our failure; why a pass is by accident."""

    @property
    def gap(self) -> bool:
        return self.ray == "pass" and self.ours not in ("pass", "n/a")


def row_of(
    nodeid: str,
    ray: Mapping[str, Any],
    ours: Mapping[str, Any],
    empty: Mapping[str, Any],
    compare: Mapping[str, Any],
) -> Row:
    test = nodeid.split("::", 1)[-1]
    shown = _SHOWN[ours.get("outcome")]
    calls = int(ours.get("schedule_calls") or 0)
    all_calls = int(compare.get("schedule_calls") or 0)
    same = int(compare.get("same_as_ray") or 0)
    accident = False
    if ours.get("private"):
        shown = "n/a"
        note = "reaches into " + ", ".join(
            f"ResourceDemandScheduler.{name}" for name in ours["private"]
        )
    elif not calls and not empty.get("schedule_calls"):
        shown = "n/a"
        if ray.get("outcome") == "passed":
            note = "calls no scheduler: tests Ray's own classes"
        else:
            note = (
                "calls no scheduler; fails under Ray too (this copy of Ray's file does "
                f"not match the installed Ray): {ray.get('message', '')}"
            )
    elif shown != "pass":
        note = str(ours.get("message", ""))
    elif empty.get("outcome") == "passed":
        accident = True
        note = "by accident: an empty reply passes too"
    elif ours.get("differences"):
        accident = True
        note = f"by accident: passes, yet decides otherwise than Ray ({ours['differences'][0]})"
    else:
        note = ""
    return Row(
        test=test,
        ray=_SHOWN[ray.get("outcome")],
        ours=shown,
        empty=_SHOWN[empty.get("outcome")],
        same=f"{same}/{all_calls}" if all_calls and shown != "n/a" else "-",
        differences=tuple(compare.get("differences") or ()) if shown != "n/a" else (),
        accident=accident,
        note=note,
    )


def rows_of(runs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[Row]:
    """One row per test, in the order Ray's run met them."""
    ids = list(dict.fromkeys(nodeid for mode in MODES for nodeid in runs[mode]))
    return [row_of(nodeid, *(runs[mode].get(nodeid, {}) for mode in MODES)) for nodeid in ids]


@dataclass(frozen=True)
class Totals:
    tests: int
    not_applicable: int
    ray_passes: int
    ours_passes: int
    accidents: int
    gaps: int
    ours_only: int
    """Tests ours passes and Ray does not."""

    def render(self) -> str:
        judged = self.tests - self.not_applicable
        return (
            f"{self.tests} tests, {self.not_applicable} not applicable; of the other "
            f"{judged}: Ray passes {self.ray_passes}, ours {self.ours_passes} "
            f"({self.accidents} of them by accident); Ray passes and ours fails "
            f"{self.gaps}; ours passes and Ray fails {self.ours_only}."
        )


def totals_of(rows: Sequence[Row]) -> Totals:
    judged = [r for r in rows if r.ours != "n/a"]
    return Totals(
        tests=len(rows),
        not_applicable=len(rows) - len(judged),
        ray_passes=sum(r.ray == "pass" for r in judged),
        ours_passes=sum(r.ours == "pass" for r in judged),
        accidents=sum(r.accident for r in judged),
        gaps=sum(r.gap for r in judged),
        ours_only=sum(r.ours == "pass" and r.ray != "pass" for r in judged),
    )


def _clip(text: str, width: int = 150) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_text(rows: Sequence[Row]) -> str:
    header = ("test", "ray", "ours", "empty", "as Ray", "note")
    table = [header, *((r.test, r.ray, r.ours, r.empty, r.same, _clip(r.note, 90)) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line[:5], widths, strict=True))
        + "  "
        + line[5]
        for line in table
    ]
    return "\n".join([*lines, "", totals_of(rows).render()])


def _cell(text: str) -> str:
    return _clip(text, 220).replace("|", "\\|")


def render_markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| Test | Ray | Ours | Empty reply | Calls decided as Ray | Note |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| `{r.test}` | {r.ray} | {r.ours} | {r.empty} | {r.same} | {_cell(r.note)} |"
            for r in rows
        ),
        "",
        totals_of(rows).render(),
        "",
        "Where ours decides otherwise than Ray (every call; Ray's reply answered the test):",
        "",
        *(
            f"- `{r.test}`: " + "; ".join(r.differences).replace("|", "\\|")
            for r in rows
            if r.differences
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="Ray's test_scheduler.py")
    parser.add_argument(
        "--util",
        type=Path,
        help="Ray's tests/util.py (default: util.py beside the test file)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write each run's raw results here")
    parser.add_argument(
        "--no-compat",
        action="store_true",
        help="run the file strictly as is: no ClusterResourceConstraint(min_bundles=...) "
        "for copies of Ray's tests older than the field's rename to resource_requests",
    )
    args = parser.parse_args(argv)
    test_file = args.test_file.resolve()
    util = (args.util or test_file.parent / "util.py").resolve()
    for path in (test_file, util):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    runs = {}
    for mode in MODES:
        print(f"running {test_file.name} against {mode} ...", file=sys.stderr, flush=True)
        runs[mode] = run_mode(test_file, util, mode, compat=not args.no_compat)
    rows = rows_of(runs)
    print(render_text(rows))
    if args.markdown:
        args.markdown.write_text(render_markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
