#!/usr/bin/env python3
"""`check` wall time on 4 nodes against 1 node, and SSH connections per node.

Runs on the SIMULATED ring (builds it if needed with `sparkctl sim up`). Prints
figures; asserts nothing. Targets (issue 4): 4-node/1-node <= 1.5x; 1
connection per node. Usage: python3 tools/check_scaling.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops.check import run_check
from sparkctl.transport.ssh import SSHTransport
from sparkctl_sim.paths import default_inventory


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not default_inventory().is_file():
        subprocess.run([sys.executable, "-m", "sparkctl.cli.main", "sim", "up", "--nodes", "4"], check=True)
    inv = load_inventory(default_inventory())
    roots = Roots.make()
    four = resolve("ds41f-tp4-ring", roots)
    one = resolve("tiny-llamacpp", roots)  # a single-node stack on spark-a
    # Side by side in one run. "probes only" is the same work per node in both
    # (the batched fact script); "full" adds the 4-node fabric probes (DF pings,
    # relay), which a single node does not have. The simulated GB10 tools are
    # Python processes that share this machine's 2 cores across all 4 "nodes":
    # their CPU time, not sparkctl's, is what grows with the node count here.
    results = {}
    for fabric in (False, True):
        for label, res in (("1 node", one), ("4 nodes", four)):
            times = []
            with SSHTransport(inv.nodes) as tr:
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    run_check(res, inv, tr, bandwidth_s=0, fabric=fabric)
                    times.append(time.perf_counter() - t0)
                conns = dict(tr.connections_opened)
            key = (fabric, label)
            results[key] = statistics.median(times)
            print(f"{'full' if fabric else 'probes only'} {label}: check median {results[key]:.2f} s "
                  f"(min {min(times):.2f}, max {max(times):.2f}) over {args.repeats} runs; "
                  f"ssh connections opened per node: {conns}")
        ratio = results[(fabric, "4 nodes")] / results[(fabric, "1 node")]
        print(f"{'full' if fabric else 'probes only'}: 4 nodes / 1 node = {ratio:.2f}x (target <= 1.5x)")
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do python3 -c pass; done"], check=True)
    print(f"(one python start here: {(time.perf_counter() - t0) / 10 * 1000:.0f} ms; each simulated tool is one)")


if __name__ == "__main__":
    main()
