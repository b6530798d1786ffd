"""Run the simulated-cluster state machines on random examples for a long stretch.

CI runs each machine derandomized on a few examples (the `ci` profile), so it finds the
same paths every time. Random runs of a few hundred examples per machine found eight
policy and patch bugs in session 12 that no derandomized run reached; this script is
that run, meant for a nightly job or an idle machine:

    make fuzz                       # every machine, 200 random examples each
    .venv/bin/python tools/fuzz_machines.py --examples 800 ClashingNames

A failure prints the shrunk steps and a `@reproduce_failure` blob, and the example is
kept in `.hypothesis/` so the next run (or pytest of the machine's module, from the
same directory) replays it first. Exit code 1 on a failure, 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from hypothesis import Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

ROOT = Path(__file__).resolve().parent.parent
MACHINES = {
    "SlicedCluster": "tests.test_sim_stateful",
    "ClashingNames": "tests.test_sim_stateful_clash",
    "FallbackCluster": "tests.test_sim_stateful_fallback",
}


def machine(name: str) -> type[RuleBasedStateMachine]:
    found = getattr(importlib.import_module(MACHINES[name]), name)
    assert issubclass(found, RuleBasedStateMachine)
    return found


def fuzz(name: str, examples: int) -> bool:
    """`examples` random examples of one machine (replaying any failure kept first)."""
    chosen = machine(name)
    began = time.monotonic()
    try:
        run_state_machine_as_test(
            chosen,
            settings=settings(
                chosen.TestCase.settings,
                max_examples=examples,
                derandomize=False,
                phases=[Phase.reuse, Phase.generate, Phase.shrink, Phase.explain],
                print_blob=True,
                deadline=None,
            ),
        )
    except Exception as failure:  # any failure of the machine is the finding
        # The traceback carries hypothesis's notes: the shrunk steps and the blob.
        traceback.print_exception(failure, file=sys.stdout)
        print(f"FAILED {name} after {time.monotonic() - began:.0f} s: {failure!r}", flush=True)
        return False
    print(f"ok {name}: {examples} examples in {time.monotonic() - began:.0f} s", flush=True)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machines", nargs="*", help=f"some of {', '.join(MACHINES)} (all)")
    parser.add_argument("--examples", type=int, default=200, help="random examples per machine")
    args = parser.parse_args(argv)
    unknown = [name for name in args.machines if name not in MACHINES]
    if unknown or args.examples < 1:
        what = f"unknown machine {', '.join(unknown)}" if unknown else "--examples below 1"
        parser.error(f"{what}; machines: {', '.join(MACHINES)}")
    sys.path.insert(0, str(ROOT))
    results = [fuzz(name, args.examples) for name in args.machines or MACHINES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
