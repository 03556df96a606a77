#!/usr/bin/env python3
"""Fuzz sparkctl's inputs and parsers: the test suite's properties under the hypothesis 'fuzz' profile.

The properties live with the tests (tests/test_fuzz_inputs.py: random and mutated
profiles and inventories only ever give a sparkctl error; tests/test_probes.py:
every parser on mutated real captures, cut and garbled batches, noise, gives a
value or a ProbeParseError). This runs them with ``--fuzz --fuzz-cases N`` and
prints, per property, the inputs hypothesis ran and the failures. Asserts nothing
itself; exits non-zero when a property failed.

Usage: python3 tools/fuzz.py [--suite inputs|parsers|all] [--cases 10000]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITES = {
    "inputs": ["tests/test_fuzz_inputs.py"],
    "parsers": ["tests/test_probes.py::test_mutated_captures_give_a_value_or_probe_parse_error",
                "tests/test_probes.py::test_truncated_batch_names_the_cut_facts",
                "tests/test_probes.py::test_garbled_section_is_a_value_or_an_unreadable_entry",
                "tests/test_probes.py::test_parse_batch_never_raises_on_noise"],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    ap.add_argument("--cases", type=int, default=10_000, help="inputs per property")
    args = ap.parse_args()
    targets = [t for s, ts in SUITES.items() if args.suite in (s, "all") for t in ts]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fuzz", "--fuzz-cases",
                        str(args.cases), "--hypothesis-show-statistics", *targets], cwd=REPO, capture_output=True,
                       text=True, check=False)
    stats = []
    for block in re.split(r"^(?=tests/\S+:$)", r.stdout, flags=re.M):
        name = re.match(r"(tests/\S+):$", block, re.M)
        counts = re.findall(r"(\d+) passing examples?, (\d+) failing examples?", block)
        if name and counts:
            stats.append((name.group(1), sum(int(a) for a, _ in counts), sum(int(b) for _, b in counts)))
    print(f"{'property':<80} {'inputs':>8} {'failing':>8}")
    for name, ok, bad in stats:
        print(f"{name:<80} {ok:>8} {bad:>8}")
    total = sum(int(ok) + int(bad) for _, ok, bad in stats)
    print(f"{len(stats)} properties, {total} inputs in {time.perf_counter() - t0:.1f} s; pytest exit {r.returncode}")
    if r.returncode:
        print(r.stdout[-4000:], r.stderr[-2000:])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
