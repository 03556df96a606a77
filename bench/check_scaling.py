#!/usr/bin/env python3
"""`check` wall time on 4 nodes against 1 node, and SSH connections per node.

Runs on the SIMULATED ring (builds it if needed with `sparkctl sim up`). Prints
figures; asserts nothing. Targets (issue 4): 4-node/1-node <= 1.5x; 1
connection per node. Usage: python3 bench/check_scaling.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from sparkctl.check import run_check
from sparkctl.inventory import load_inventory
from sparkctl.profiles import resolve
from sparkctl.resources import Roots
from sparkctl.sim.paths import default_inventory
from sparkctl.transport import SSHTransport


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not default_inventory().is_file():
        subprocess.run([sys.executable, "-m", "sparkctl.cli", "sim", "up", "--nodes", "4"], check=True)
    inv = load_inventory(default_inventory())
    roots = Roots.make()
    four = resolve("ds41f-tp4-ring", roots)
    one = resolve("tiny-llamacpp", roots)  # a single-node stack on spark-a
    results = {}
    for label, res in (("1 node", one), ("4 nodes", four)):
        times = []
        with SSHTransport(inv.nodes) as tr:
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run_check(res, inv, tr, bandwidth_s=0)
                times.append(time.perf_counter() - t0)
            conns = dict(tr.connections_opened)
        results[label] = (statistics.median(times), min(times), max(times), conns)
        print(f"{label}: check median {results[label][0]:.2f} s (min {min(times):.2f}, max {max(times):.2f}) "
              f"over {args.repeats} runs; ssh connections opened per node: {conns}")
    ratio = results["4 nodes"][0] / results["1 node"][0]
    print(f"ratio 4 nodes / 1 node: {ratio:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
