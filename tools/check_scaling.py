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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--old", type=Path, default=Path("/tmp/baseline"), help="checkout of the previous layout")
    ap.add_argument("--new", type=Path, default=REPO, help="checkout to measure (default: this one)")
    args = ap.parse_args()
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
