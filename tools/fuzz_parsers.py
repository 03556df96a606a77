#!/usr/bin/env python3
"""Fuzz every probe parser and the batch splitter with truncated and garbled REAL captures.

Runs the property tests of tests/test_probes.py with many more cases than CI
gives them (CI: 400 + 300 + 300 + 200). The properties: a parser returns a
value or raises ProbeParseError; parse_batch never raises, and every section it
cannot read becomes "cannot read X on node Y: ..." while the other sections
keep their values. Prints the case counts and every failure (there must be
none). Usage: python3 tools/fuzz_parsers.py [--cases N]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tests.test_probes as tp  # noqa: E402  (the properties and the real captures live with the tests)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10_000, help="cases per property (4 properties)")
    args = ap.parse_args()
    cfg = settings(max_examples=args.cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    # the tests' own bodies (``.hypothesis.inner_test``) under this script's case count
    properties = [
        ("each parser on a mutated real capture", tp.test_mutated_captures_give_a_value_or_probe_parse_error,
         st.data()),
        ("the batch cut at every byte", tp.test_truncated_batch_names_the_cut_facts,
         st.integers(0, len(tp.BATCH) - 1)),
        ("one garbled section inside a whole batch", tp.test_garbled_section_is_a_value_or_an_unreadable_entry,
         st.data()),
        ("random text as a batch", tp.test_parse_batch_never_raises_on_noise, st.text(max_size=300)),
    ]
    cases = {"n": 0}

    def counted(body):  # type: ignore[no-untyped-def]
        def run(arg):  # type: ignore[no-untyped-def]
            cases["n"] += 1
            body(arg)
        return run

    failures = 0
    t0 = time.perf_counter()
    print(f"{'property':<42} {'inputs':>8} {'time s':>7}  verdict")
    for title, prop, strategy in properties:
        before = cases["n"]
        t = time.perf_counter()
        try:
            cfg(given(strategy)(counted(prop.hypothesis.inner_test)))()
            verdict = "ok"
        except Exception:  # noqa: BLE001 - a failure is what we hunt; print it whole
            failures += 1
            verdict = "FAILED"
            traceback.print_exc()
        n = cases["n"] - before
        print(f"{title:<42} {n:>8} {time.perf_counter() - t:>7.1f}  {verdict}")
    print(f"parsers: {len({p for _, p, _ in tp.REAL})} with {len(tp.REAL)} real captures; "
          f"{cases['n']} inputs in {time.perf_counter() - t0:.1f} s; failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
