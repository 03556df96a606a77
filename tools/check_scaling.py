#!/usr/bin/env python3
"""`check` on 1 and 4 nodes, the previous transport against this one side by side, and SSH logins per node.

Runs on the SIMULATED ring: builds a private one (`sparkctl sim up --nodes 4`
under a temporary SPARKCTL_SIM_DIR) while holding the host's e2e lock
(/tmp/sparkctl-e2e.lock, then the tests/sim fixtures' /run/sparkctl-sim/e2e-tests.lock;
so do not wrap this script in `flock` on either file),
and removes it at the end (`sparkctl sim down`).

Each measurement is one `sparkctl check PROFILE --json --bandwidth 0` as a user
runs it (a new process: interpreter start, imports, connections, the probes),
"old" from a checkout of the previous layout (default /tmp/baseline, its own
`python -m sparkctl.cli`), "new" from this checkout (`python -m sparkctl.cli.main`).
The order alternates every repeat (old, new / new, old) so drift on this shared
machine falls on both. "1 node" is tiny-llamacpp (spark-a only), "4 nodes" is
ds41f-tp4-ring with its fabric probes. SSH logins are counted from each
simulated node's own sshd log ("Accepted publickey" lines) around every run.

Prints figures; asserts nothing. Targets (issue 4): 4-node/1-node <= 1.5x;
1 connection per node. Usage: python3 tools/check_scaling.py [--repeats 5]

``--compare TREE`` measures the SIMULATOR instead (issue 19): each repeat builds the
ring once with TREE's code and once with this checkout's (order alternating; each
tree's own ``.venv/bin/python`` when it has one), times `check` on 1 and 4 nodes
on it, and, on the first repeat, every simulated tool call sparkctl's check makes
on a node (:func:`call_times`: N calls in one SSH session, per-call mean).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
E2E_LOCK = Path("/tmp/sparkctl-e2e.lock")
# the host lock the tests/sim fixtures take (namespace names are host-wide); taken second, as under `flock E2E_LOCK pytest`
SIM_TESTS_LOCK = Path("/run/sparkctl-sim/e2e-tests.lock")
PROFILES = {"1 node": "tiny-llamacpp", "4 nodes": "ds41f-tp4-ring"}


@contextmanager
def e2e_lock() -> Iterator[None]:
    SIM_TESTS_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(E2E_LOCK, "a") as first, open(SIM_TESTS_LOCK, "a") as second:
        fcntl.flock(first, fcntl.LOCK_EX)
        fcntl.flock(second, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(second, fcntl.LOCK_UN)
            fcntl.flock(first, fcntl.LOCK_UN)


def logins(sim_dir: Path) -> dict[str, int]:
    """Accepted logins so far, per simulated node (its sshd's own log)."""
    out = {}
    for log in sorted(sim_dir.rglob("sshd.log")):
        out[log.parent.name] = log.read_text(errors="replace").count("Accepted publickey")
    return out


# the simulated tool calls of one node's `check` (a trace of the tools' wrappers), node state only first
CALLS = (
    "/bin/true",  # fork + exec, the floor
    "uname -r", "getconf PAGESIZE", "apt-mark showhold", "lspci -vv -s 0000:01:00.0",
    "lspci -PP -D -s 0002:01:00.1", "ethtool enp1s0f0np0", "ibdev2netdev",
    "dpkg-query -W --showformat='${db:Status-Status}' earlyoom",
    # time- or process-dependent: Python
    "nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.max.sm,"
    "clocks_event_reasons.active,power.draw,temperature.gpu --format=csv,noheader,nounits",
    "nvidia-smi -q -d CLOCK,PERFORMANCE", "ps -eo pid,args", "systemctl show -p UnitFileState,ActiveState earlyoom",
    "docker info --format '{{json .DriverStatus}}'",
)


def call_times(sim_dir: Path, env: dict[str, str], node: str = "spark-a", n: int = 20) -> dict[str, float]:
    """Mean ms per call of each of CALLS, run n times in a loop in one SSH session on ``node``."""
    from sparkctl_sim import cluster

    loop = "".join(
        f"s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do {c} >/dev/null 2>&1; i=$((i+1)); done; "
        f"e=$(date +%s%N); echo \"$(( (e - s) / {n} ))\"; " for c in CALLS)
    r = subprocess.run([*cluster.ssh_argv(sim_dir, node), loop], env=env, capture_output=True, text=True,
                       timeout=600, check=False)
    ns = [int(x) for x in r.stdout.split()]
    if len(ns) != len(CALLS):
        sys.exit(f"call timing failed on {node}: {r.stdout!r} {r.stderr[-400:]!r}")
    return {c: v / 1e6 for c, v in zip(CALLS, ns)}


def tree_python(tree: Path) -> str:
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def compare(base: Path, repeats: int) -> None:
    """The simulator of ``base`` against this checkout's: `check` on 1 and 4 nodes, per-call times."""
    trees = {"base": base.resolve(), "this": REPO}
    tmp = Path(tempfile.mkdtemp(prefix="check-scaling-compare-"))
    times: dict[tuple[str, str], list[float]] = {}
    calls: dict[str, dict[str, float]] = {}
    with e2e_lock():
        for rep in range(repeats):
            for name in (("base", "this") if rep % 2 == 0 else ("this", "base")):
                tree = trees[name]
                env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / name / "sim"),
                       "XDG_STATE_HOME": str(tmp / name / "state"), "PYTHONPATH": str(tree)}
                env.pop("SPARKCTL_INVENTORY", None)
                env.pop("PYTHONDONTWRITEBYTECODE", None)  # a node's sessions write bytecode: so do these
                cmd = [tree_python(tree), "-m", "sparkctl.cli"]

                def run(*argv: str, env: dict[str, str] = env, cmd: list[str] = cmd) -> subprocess.CompletedProcess[str]:
                    return subprocess.run([*cmd, *argv], env=env, cwd=tmp, capture_output=True, text=True,
                                          timeout=600, check=False)

                up = run("sim", "up", "--nodes", "4", "--ready")
                if up.returncode:
                    run("sim", "down")
                    sys.exit(f"{name}: sim up failed:\n{up.stdout}\n{up.stderr}")
                try:
                    inv = str(tmp / name / "sim" / "inventory.yaml")
                    run("-i", inv, "check", PROFILES["1 node"], "--json", "--bandwidth", "0")  # warm the caches
                    for label, profile in PROFILES.items():
                        t0 = time.perf_counter()
                        r = run("-i", inv, "check", profile, "--json", "--bandwidth", "0")
                        took = time.perf_counter() - t0
                        try:
                            json.loads(r.stdout)["verdicts"]
                        except (ValueError, KeyError):
                            sys.exit(f"{name} check {profile} gave no report (exit {r.returncode}):\n{r.stderr}")
                        times.setdefault((name, label), []).append(took)
                    if rep < 2:
                        calls[name] = call_times(tmp / name / "sim", env)
                finally:
                    run("sim", "down")
                print(f"repeat {rep + 1} {name}: " + ", ".join(
                    f"{label} {times[(name, label)][-1]:.2f} s" for label in PROFILES), flush=True)
    print(f"\n`sparkctl check --bandwidth 0` on the SIMULATED ring, the simulator of {trees['base']} (base) "
          f"and of {REPO} (this), {repeats} runs each, order alternating; wall time of the whole command")
    for label in PROFILES:
        for name in trees:
            ts = times[(name, label)]
            print(f"  {label:8s} {name}: median {statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f})")
    for name in trees:
        scale = statistics.median(times[(name, "4 nodes")]) / statistics.median(times[(name, "1 node")])
        print(f"  {name}: 4 nodes / 1 node = {scale:.2f}x (target <= 1.5x)")
    print("\nsimulated tool calls on spark-a, mean ms per call (20 calls in one SSH session): base | this")
    for c in CALLS:
        print(f"  {calls['base'][c]:7.1f} | {calls['this'][c]:7.1f}  {c[:90]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compare", type=Path, default=None,
                    help="a checkout whose simulator to measure against this one's (see the docstring)")
    ap.add_argument("--old", type=Path, default=Path("/tmp/baseline"), help="checkout of the previous layout")
    ap.add_argument("--new", type=Path, default=REPO, help="checkout to measure (default: this one)")
    args = ap.parse_args()
    if args.compare is not None:
        compare(args.compare, args.repeats)
        return
    variants = {
        "old": (args.old, [sys.executable, "-m", "sparkctl.cli"]),
        "new": (args.new, [sys.executable, "-m", "sparkctl.cli.main"]),
    }
    tmp = Path(tempfile.mkdtemp(prefix="check-scaling-"))
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state")}
    env.pop("SPARKCTL_INVENTORY", None)
    inventory = tmp / "sim" / "inventory.yaml"

    def sparkctl(variant: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        tree, cmd = variants[variant]
        return subprocess.run([*cmd, *argv], env={**env, "PYTHONPATH": str(tree)}, cwd=tmp, capture_output=True,
                              text=True, timeout=timeout, check=False)

    with e2e_lock():
        up = sparkctl("new", "sim", "up", "--nodes", "4", "--ready")
        if up.returncode != 0:
            sys.exit(f"sim up failed:\n{up.stdout}\n{up.stderr}")
        try:
            times: dict[tuple[str, str], list[float]] = {}
            conns: dict[tuple[str, str], list[dict[str, int]]] = {}
            for rep in range(args.repeats):
                order = ("old", "new") if rep % 2 == 0 else ("new", "old")
                for variant in order:
                    for label, profile in PROFILES.items():
                        before = logins(tmp / "sim")
                        t0 = time.perf_counter()
                        r = sparkctl(variant, "-i", str(inventory), "check", profile, "--json", "--bandwidth", "0")
                        took = time.perf_counter() - t0
                        after = logins(tmp / "sim")
                        try:
                            json.loads(r.stdout)["verdicts"]
                        except (ValueError, KeyError):
                            sys.exit(f"{variant} check {profile} gave no report (exit {r.returncode}):\n{r.stderr}")
                        times.setdefault((variant, label), []).append(took)
                        conns.setdefault((variant, label), []).append(
                            {n: after[n] - before.get(n, 0) for n in after if after[n] - before.get(n, 0)})
            print(f"`sparkctl check --bandwidth 0` on the SIMULATED ring, {args.repeats} runs each, "
                  "old/new alternating; wall time of the whole command (process start included)")
            for label in PROFILES:
                for variant in ("old", "new"):
                    ts = times[(variant, label)]
                    seen = conns[(variant, label)]
                    same = all(c == seen[0] for c in seen)
                    print(f"  {label:8s} {variant}: median {statistics.median(ts):.2f} s "
                          f"(min {min(ts):.2f}, max {max(ts):.2f}); ssh logins per node per run: "
                          f"{seen[0]}{'' if same else f' (varied: {seen})'}")
                ratio = statistics.median(times[("new", label)]) / statistics.median(times[("old", label)])
                print(f"  {label:8s} new/old = {ratio:.2f}x")
            for variant in ("old", "new"):
                scale = statistics.median(times[(variant, "4 nodes")]) / statistics.median(times[(variant, "1 node")])
                print(f"  {variant}: 4 nodes / 1 node = {scale:.2f}x (target <= 1.5x)")
            for variant, (tree, _cmd) in variants.items():
                mod = "sparkctl.transport" if variant == "old" else "sparkctl.transport.connection"
                starts = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-c", f"import {mod}"], env={**env, "PYTHONPATH": str(tree)},
                                   check=True)
                    starts.append(time.perf_counter() - t0)
                print(f"  {variant}: python -c 'import {mod}': median {statistics.median(starts) * 1000:.0f} ms")
        finally:
            sparkctl("new", "sim", "down", timeout=120)


if __name__ == "__main__":
    main()
