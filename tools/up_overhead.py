#!/usr/bin/env python3
"""sparkctl's own time in `up`, the previous code against this one, side by side in one run.

Runs on the SIMULATED ring: builds a private one (`sparkctl sim up --nodes 4`
under a temporary SPARKCTL_SIM_DIR) while holding the hosts' e2e locks (as
tools/check_scaling.py does; do not wrap this script in `flock`), and removes
it at the end.

Each measurement is one `sparkctl up ds41f-tp4-ring --json` as a user runs it
(a new process), then `down`. "old" is a checkout of the previous layout
(default /tmp/baseline: `git worktree add /tmp/baseline 6d66335`), "new" this
checkout. sparkctl's own time = the command's wall time minus the time it spent
waiting for the engine to become ready (`ready_s` in its JSON): interpreter
start, imports, the check, the clock cap, the pushes, the starts, the records.
The order alternates every repeat so drift on this shared machine falls on both.

The previous code's engine unit writes its log with StandardOutput=append: into
/var/log/sparkctl, which systemd does not create (the bug issue 12 fixed), so
before each "old" run this tool creates that directory on every node; the new
code needs nothing made for it.

Prints figures; asserts nothing. Usage: python3 tools/up_overhead.py [--repeats 5] [--baseline DIR]

``--compare TREE`` measures the SIMULATOR instead (issue 19): each repeat builds the
ring once with TREE's code and once with this checkout's (order alternating; each
tree's own ``.venv/bin/python`` when it has one) and runs `up` then `down` twice on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from check_scaling import e2e_lock, tree_python  # the same two host locks, in the same order (tools/ is sys.path[0])

REPO = Path(__file__).resolve().parent.parent
PROFILE = "ds41f-tp4-ring"
WAIVE = ["--waive", "page_size", "--reason", "stock 4 KiB kernel"]


def compare(base: Path, repeats: int, ups: int = 2) -> int:
    """sparkctl's own time in `up` on the ring simulated by ``base``'s code and by this checkout's."""
    trees = {"base": base.resolve(), "this": REPO}
    tmp = Path(tempfile.mkdtemp(prefix="up-overhead-compare-"))
    times: dict[str, list[float]] = {"base": [], "this": []}
    with e2e_lock():
        for i in range(repeats):
            for name in (("base", "this") if i % 2 == 0 else ("this", "base")):
                tree = trees[name]
                env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / name / "sim"),
                       "XDG_STATE_HOME": str(tmp / name / "state"), "SPARKCTL_SIM_SPEEDUP": "20",
                       "SPARKCTL_SIM_LOAD_S": "1", "PYTHONPATH": str(tree)}
                env.pop("SPARKCTL_INVENTORY", None)
                env.pop("PYTHONDONTWRITEBYTECODE", None)  # a node's sessions write bytecode: so do these
                which = ([tree_python(tree), "-m", "sparkctl.cli"], env)
                inv = str(tmp / name / "sim" / "inventory.yaml")

                def run(*a: str, which: tuple[list[str], dict[str, str]] = which) -> subprocess.CompletedProcess[str]:
                    return subprocess.run([*which[0], *a], env=which[1], capture_output=True, text=True,
                                          timeout=600, cwd=tmp, check=False)

                r = run("sim", "up", "--nodes", "4", "--ready")
                if r.returncode:
                    run("sim", "down")
                    print(r.stdout, r.stderr)
                    return 1
                try:
                    for k in range(ups):
                        t0 = time.perf_counter()
                        r = run("-i", inv, "up", PROFILE, *WAIVE, "--json")
                        wall = time.perf_counter() - t0
                        if r.returncode:
                            print(f"{name} up failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
                        else:
                            ready = float(json.loads(r.stdout).get("ready_s", 0.0))
                            times[name].append(wall - ready)
                            print(f"repeat {i + 1}.{k + 1} {name}: wall {wall:.2f} s, ready {ready:.2f} s, "
                                  f"own {wall - ready:.2f} s", flush=True)
                        run("-i", inv, "down")
                finally:
                    run("sim", "down")
    if times["base"] and times["this"]:
        b, t = statistics.median(times["base"]), statistics.median(times["this"])
        print(f"\nsparkctl's own time in `up {PROFILE}` on the SIMULATED ring (median of "
              f"{len(times['base'])}/{len(times['this'])}): simulator of {trees['base']} {b:.2f} s, "
              f"of {REPO} {t:.2f} s, this/base {t / b:.2f} (target: under 5 s)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default="/tmp/baseline")
    ap.add_argument("--compare", type=Path, default=None,
                    help="a checkout whose simulator to measure against this one's (see the docstring)")
    args = ap.parse_args()
    if args.compare is not None:
        return compare(args.compare, args.repeats)
    base = Path(args.baseline)
    if not (base / "sparkctl" / "__init__.py").is_file():
        print(f"no previous checkout at {base}: git worktree add {base} REV", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="up-overhead-"))
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state"),
           "SPARKCTL_SIM_SPEEDUP": "20", "SPARKCTL_SIM_LOAD_S": "1"}
    env.pop("SPARKCTL_INVENTORY", None)
    inv = str(tmp / "sim" / "inventory.yaml")
    new = ([sys.executable, "-m", "sparkctl.cli"], {**env, "PYTHONPATH": str(REPO)})
    old = ([sys.executable, "-m", "sparkctl.cli"], {**env, "PYTHONPATH": str(base)})

    def run(which: tuple[list[str], dict[str, str]], *a: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*which[0], *a], env=which[1], capture_output=True, text=True, timeout=timeout,
                              cwd=tmp, check=False)

    times: dict[str, list[float]] = {"old": [], "new": []}
    with e2e_lock():
        try:
            r = run(new, "sim", "up", "--nodes", "4", "--ready")  # fabric prepared: this measures `up` alone
            if r.returncode:
                print(r.stdout, r.stderr)
                return 1
            from sparkctl_sim import cluster

            for i in range(args.repeats):
                for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    which = old if name == "old" else new
                    if name == "old":
                        for n in ("spark-a", "spark-b", "spark-c", "spark-d"):
                            subprocess.run([*cluster.ssh_argv(tmp / "sim", n), "mkdir -p /var/log/sparkctl"],
                                           capture_output=True, timeout=30, check=False)
                    t0 = time.perf_counter()
                    r = run(which, "-i", inv, "up", PROFILE, *WAIVE, "--json")
                    wall = time.perf_counter() - t0
                    if r.returncode:
                        print(f"{name} up failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
                        run(which, "-i", inv, "down")
                        continue
                    ready = float(json.loads(r.stdout).get("ready_s", 0.0))
                    times[name].append(wall - ready)
                    print(f"repeat {i + 1} {name}: wall {wall:.2f} s, ready {ready:.2f} s, own {wall - ready:.2f} s")
                    run(which, "-i", inv, "down")
        finally:
            run(new, "sim", "down", timeout=300)
    if times["old"] and times["new"]:
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"\nsparkctl's own time in `up {PROFILE}` (median of {len(times['old'])}/{len(times['new'])}): "
              f"old {o:.2f} s, new {n:.2f} s, new/old {n / o:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
