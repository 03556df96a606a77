#!/usr/bin/env python3
"""Fuzz profile and inventory loading with hypothesis: >= 10,000 cases.

Prints the case counts and any non-sparkctl exception (there must be none).
Usage: python3 tools/fuzz_inputs.py [--cases N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.errors import SparkctlError
from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import render
from tests.fuzzing import dump, load_example, mutate, strategies

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10_000, help="cases per target (4 targets)")
    args = ap.parse_args()
    _, _, tree = strategies()
    ring = load_example(REPO, "inventory.yaml")
    profile = load_example(REPO, "profiles/ds41f-tp4-ring.yaml")
    tmp = Path(tempfile.mkdtemp())
    (tmp / "profiles").mkdir()
    roots = Roots.make(root=str(tmp), env={})
    ring_inv = loads_inventory(dump(ring), "ring.yaml")
    counts = {"cases": 0, "sparkctl_errors": 0, "accepted": 0, "crashes": 0}
    crashes: list[str] = []

    def check(fn) -> None:  # type: ignore[no-untyped-def]
        counts["cases"] += 1
        try:
            fn()
            counts["accepted"] += 1
        except SparkctlError:
            counts["sparkctl_errors"] += 1
        except Exception:  # noqa: BLE001 - that is what we hunt
            counts["crashes"] += 1
            crashes.append(traceback.format_exc())

    cfg = settings(max_examples=args.cases, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))

    @cfg
    @given(st.text(max_size=400))
    def text_inventory(t: str) -> None:
        check(lambda: loads_inventory(t, "fuzz.yaml"))

    @cfg
    @given(tree)
    def tree_inventory(doc: object) -> None:
        check(lambda: loads_inventory(dump(doc), "fuzz.yaml"))

    @cfg
    @given(st.lists(st.integers(0, 50), max_size=4), tree)
    def mutated_inventory(path: list[int], value: object) -> None:
        check(lambda: loads_inventory(dump(mutate(ring, path, value)), "fuzz.yaml"))

    @cfg
    @given(st.lists(st.integers(0, 50), max_size=4), tree)
    def mutated_profile(path: list[int], value: object) -> None:
        (tmp / "profiles" / "fz.yaml").write_text(dump(mutate(profile, path, value)))
        check(lambda: render(resolve("fz", roots), ring_inv, roots))

    t0 = time.perf_counter()
    for target in (text_inventory, tree_inventory, mutated_inventory, mutated_profile):
        target()
    dt = time.perf_counter() - t0
    print(f"fuzz cases: {counts['cases']} in {dt:.1f} s "
          f"(sparkctl errors {counts['sparkctl_errors']}, accepted {counts['accepted']}, crashes {counts['crashes']})")
    for c in crashes[:5]:
        print(c)


if __name__ == "__main__":
    main()
