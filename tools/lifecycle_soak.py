#!/usr/bin/env python3
"""N up / switch / down cycles on the SIMULATED ring: failures, orphans, time per phase.

Also reports sparkctl's own overhead in `up` (everything but the engine's
readiness wait) and `switch` downtime beyond the new engine's load time.
Prints figures; asserts nothing. Usage: python3 tools/lifecycle_soak.py --cycles 50

It holds the host's simulated-cluster lock (/run/sparkctl-sim/e2e-tests.lock,
as the e2e tests and tools/fault_matrix.py do) for its whole run. It uses your
simulated ring if one is up (and leaves it up); otherwise it builds one and
removes it at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import fcntl
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops.executor import down, switch, up
from sparkctl.plan.laws import Waiver
from sparkctl.transport import SSHTransport
from sparkctl_sim.paths import default_inventory

LOCK = Path("/run/sparkctl-sim/e2e-tests.lock")
ENGINE_PS = "ps -eo pid,args | grep -cE '[d]s41f serve|[t]ensorfold serve|[d]ocker run|[l]aunch.sh' || true"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=50)
    args = ap.parse_args()
    sim = [sys.executable, "-m", "sparkctl.cli", "sim"]
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = not default_inventory().is_file()
        try:
            if built:
                subprocess.run([*sim, "up", "--nodes", "4"], check=True)
            soak(args.cycles)
        finally:
            if built:
                subprocess.run([*sim, "down"], check=False)
            fcntl.flock(lock, fcntl.LOCK_UN)


def soak(cycles: int) -> None:
    inv = load_inventory(default_inventory())
    roots = Roots.make()
    ds = resolve("ds41f-tp4-ring", roots)
    tf = resolve("tensorfold-tp4-ring", roots)
    waive = {"page_size": Waiver("page_size", "stock 4 KiB kernel (soak)")}
    phases: dict[str, list[float]] = defaultdict(list)
    failures, orphans = [], 0
    overhead, downtime_extra = [], []
    t_all = time.perf_counter()
    with SSHTransport(inv.nodes) as tr:
        for i in range(cycles):
            try:
                t0 = time.perf_counter()
                r = up(ds, inv, tr, roots, waivers=waive)
                phases["up"].append(time.perf_counter() - t0)
                for p in r.phases:
                    phases[f"up.{p.phase}"].append(p.seconds)
                overhead.append(sum(p.seconds for p in r.phases if p.phase != "ready"))
                t0 = time.perf_counter()
                s = switch(tf, inv, tr, roots, waivers=waive)
                phases["switch"].append(time.perf_counter() - t0)
                if not s.switched:
                    failures.append(f"cycle {i}: switch rolled back: {s.error}")
                elif s.up is not None:
                    load = next((p.seconds for p in s.up.phases if p.phase == "ready"), 0.0)
                    downtime_extra.append(s.downtime_s - load)
                t0 = time.perf_counter()
                down(inv, tr)
                phases["down"].append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                failures.append(f"cycle {i}: {type(exc).__name__}: {exc}")
                try:
                    down(inv, tr)
                except Exception:  # noqa: BLE001
                    pass
            left = sum(int(r.stdout.strip() or 0) for r in tr.run_all({n: ENGINE_PS for n in inv.names}).values())
            orphans += left
    print(f"{cycles} cycles in {time.perf_counter() - t_all:.0f} s: {len(failures)} failures, "
          f"{orphans} orphan processes after down")
    for f in failures[:10]:
        print("  ", f)
    for name, vals in sorted(phases.items()):
        print(f"  {name:<16} median {statistics.median(vals):6.2f} s  max {max(vals):6.2f} s")
    if overhead:
        print(f"sparkctl's own overhead in up (all but readiness): median {statistics.median(overhead):.2f} s "
              f"(target < 5 s)")
    if downtime_extra:
        print(f"switch downtime beyond the new engine's load/readiness: median {statistics.median(downtime_extra):.2f} s "
              f"(target < 3 s)")


if __name__ == "__main__":
    main()
