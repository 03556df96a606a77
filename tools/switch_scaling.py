#!/usr/bin/env python3
"""`check` and `up` on 2, 4, 8 and 16 SIMULATED nodes behind a simulated switch, side by side in one run.

For each size it builds a private switched cluster (`sparkctl sim up --topology switch
--nodes N --ready --no-images` under a temporary SPARKCTL_SIM_DIR, then the profile's one image) while
holding the host's e2e locks (tools/check_scaling.py `e2e_lock`: do not wrap this script
in `flock`), times each command as a user runs it (a new `python -m sparkctl.cli`
process), then removes the cluster (`sparkctl sim down`) before the next size:

* `check PROFILE --json --bandwidth 0`: the probes of every node and the switch_subnet
  law's don't-fragment pings (each replica's pairs and a ring around each subnet);
* `up PROFILE`, then `down` (both timed, shown apart).

The profile is tensorfold-tp4x2-switch with the replicas that fill the size: TP2 x1 on
2 nodes, TP4 x1 on 4, TP4 x2 on 8, TP4 x4 on 16 (the simulated TensorFold engine). The
page_size law is waived as in the tests (the stock 4 KiB kernel).

Beside each wall time, where the CPU went during it: "sparkctl" is the command's own
process (its user+system time: the operator's side, paramiko's SSH included), "nodes" is
the rest of this machine's busy time meanwhile (/proc/stat), which is the simulated nodes'
sshd sessions, shells and tools (and any other load on this shared machine). On real
Sparks each node's part runs on its own CPUs; here 16 nodes share two cores.

Prints figures; asserts nothing. Target (issue 22): the cost at 16 nodes at most 2x the
cost at 4. Usage: python3 tools/switch_scaling.py [--sizes 2,4,8,16] [--repeats 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_scaling import e2e_lock  # noqa: E402  (tools/ is not a package)

REPO = Path(__file__).resolve().parent.parent
PROFILE = "tensorfold-tp4x2-switch"
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:4x-2026.10"  # its engine.image (profiles/tensorfold-tp4-ring.yaml)
WAIVE = ("--waive", "page_size", "--reason", "stock 4 KiB kernel (tools/switch_scaling.py)")


def sets_for(n: int) -> tuple[str, ...]:
    tp = 2 if n == 2 else 4
    return ("--set", f"topology.tp_size={tp}", "--set", f"topology.replicas={n // tp}")


def busy_s() -> float:
    """This machine's busy CPU time so far, all cores (proc(5), /proc/stat: the cpu line)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait; guest is in user


def own_s() -> float:
    """The CPU time of this tool's waited-for children: the sparkctl commands it ran."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(n: int, repeats: int, tmp: Path) -> dict[str, list[float]]:
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / f"sim{n}"), "XDG_STATE_HOME": str(tmp / f"state{n}"),
           "SPARKCTL_SIM_SPEEDUP": "20", "SPARKCTL_SIM_LOAD_S": "1"}
    env.pop("SPARKCTL_INVENTORY", None)
    inv = str(tmp / f"sim{n}" / "inventory.yaml")

    cpu: list[tuple[float, float]] = []  # the last run's (sparkctl's CPU, the rest of the machine's)

    def run(*argv: str, timeout: float = 600) -> tuple[float, subprocess.CompletedProcess[str]]:
        t0, own0, busy0 = time.perf_counter(), own_s(), busy_s()
        r = subprocess.run([sys.executable, "-m", "sparkctl.cli", *argv], env=env, cwd=tmp, capture_output=True,
                           text=True, timeout=timeout, check=False)
        took, own = time.perf_counter() - t0, own_s() - own0
        cpu[:] = [(own, max(0.0, busy_s() - busy0 - own))]
        return took, r

    out: dict[str, list[float]] = {"sim up": [], "check": [], "up": [], "down": [],
                                   "check cpu": [], "check nodes": [], "up cpu": [], "up nodes": []}
    took, r = run("sim", "up", "--topology", "switch", "--nodes", str(n), "--ready", "--no-images")
    try:
        if r.returncode:
            sys.exit(f"sim up --nodes {n} failed:\n{r.stdout}\n{r.stderr}")
        out["sim up"].append(took)
        _, r = run("sim", "image", "load", "all", IMAGE)  # the one image the profile runs
        if r.returncode:
            sys.exit(f"sim image load failed:\n{r.stdout}\n{r.stderr}")
        # warm the caches; --fix locks the profile's GPU clock cap (clock_cap's remedy), as an operator would
        run("-i", inv, "check", PROFILE, *sets_for(n), "--fix", "--bandwidth", "0", *WAIVE)
        for _ in range(repeats):
            took, r = run("-i", inv, "check", PROFILE, *sets_for(n), "--json", "--bandwidth", "0", *WAIVE)
            verdicts = json.loads(r.stdout or "{}").get("verdicts")
            if verdicts is None:
                sys.exit(f"check on {n} nodes (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            failed = sorted({(v["law"], v["node"]) for v in verdicts if v["status"] == "fail"})
            if failed:
                print(f"  {n} nodes: check failed {failed} (timed all the same)", flush=True)
            out["check"].append(took)
            out["check cpu"].append(cpu[0][0])
            out["check nodes"].append(cpu[0][1])
            took, r = run("-i", inv, "up", PROFILE, *sets_for(n), *WAIVE, "--json")
            if r.returncode:
                sys.exit(f"up on {n} nodes (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            out["up"].append(took)
            out["up cpu"].append(cpu[0][0])
            out["up nodes"].append(cpu[0][1])
            took, r = run("-i", inv, "down", "--json")
            if r.returncode:
                sys.exit(f"down on {n} nodes (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            out["down"].append(took)
    finally:
        run("sim", "down", timeout=300)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="build and measure every size this many times, in turn")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="switch-scaling-"))
    results: dict[int, dict[str, list[float]]] = {}
    with e2e_lock():
        for r in range(args.rounds):  # sizes in turn, so a slow spell of this shared machine hits each
            for n in sizes:
                got = measure(n, args.repeats, tmp)
                for k, v in got.items():
                    results.setdefault(n, {}).setdefault(k, []).extend(v)
                print(f"{n:2d} nodes (round {r + 1}): " + ", ".join(
                    f"{k} {statistics.median(v):.2f} s" for k, v in got.items() if "cpu" not in k and "nodes" not in k),
                    flush=True)
    print(f"\n{PROFILE} on a SIMULATED switched cluster, {args.rounds} x {args.repeats} runs each (median, min-max; "
          "wall time of the whole command, process start included)")
    print(f"  {'nodes':>5}  " + "  ".join(f"{k:>22}" for k in ("check", "up", "down", "sim up")))
    for n in sizes:
        cells = []
        for k in ("check", "up", "down", "sim up"):
            v = results[n][k]
            cells.append(f"{statistics.median(v):6.2f} s ({min(v):5.2f}-{max(v):5.2f})")
        print(f"  {n:>5}  " + "  ".join(f"{c:>22}" for c in cells))
    print("\n  CPU during each command (median s): sparkctl's own process | the rest of the machine (the "
          "simulated nodes)")
    for n in sizes:
        r = results[n]
        print(f"  {n:>5}  check {statistics.median(r['check cpu']):5.2f} | {statistics.median(r['check nodes']):5.2f}"
              f"    up {statistics.median(r['up cpu']):5.2f} | {statistics.median(r['up nodes']):5.2f}")
    if 4 in results:
        def ratio(n: int, k: str) -> float:
            return statistics.median(results[n][k]) / statistics.median(results[4][k])
        for n in sizes:
            print(f"  {n:>2} nodes / 4 nodes: wall: check {ratio(n, 'check'):.2f}x, up {ratio(n, 'up'):.2f}x"
                  + ("  (target <= 2x)" if n == 16 else "")
                  + f"; sparkctl's CPU: check {ratio(n, 'check cpu'):.2f}x, up {ratio(n, 'up cpu'):.2f}x"
                  + f"; the nodes' CPU: check {ratio(n, 'check nodes'):.2f}x, up {ratio(n, 'up nodes'):.2f}x")


if __name__ == "__main__":
    main()
