#!/usr/bin/env python3
"""Measure `sparkctl image sync` (the whole command) against a plain `docker save | ssh docker load`.

Runs on a private SIMULATED pair (`sparkctl sim up --nodes 2 --ready --no-images`
under a temporary SPARKCTL_SIM_DIR) while holding the host's locks as
tools/check_scaling.py does (/tmp/sparkctl-e2e.lock, then
/run/sparkctl-sim/e2e-tests.lock: do not wrap this script in `flock`). The image
(--size-mib) is loaded on spark-a; each repeat removes it from spark-b, then
times, in alternating order:

* sparkctl: `sparkctl image sync tensorfold-tp2` (a new process: interpreter,
  imports, reading both image IDs and verifying the node-to-node key in the same
  round trip, the lock, the copy with its image-ID check). The first run
  (the warm-up) provisions the key and is printed apart; the timed runs find it
  in place, as every run after the first does;
* plain: from the operator's side, `ssh spark-a 'docker save IMG | ssh
  <spark-b's fabric address> docker load'`: the same bytes over the same
  simulated link with the same node-to-node key, nothing else.

Prints every run, the medians, throughput, and plain/sparkctl (target >= 0.9).

Measured 2026-12-01 on the shared 2-core host, 3 repeats, medians: before the
grant was kept (key provisioned on every run, a separate verify step) 0.69 at
512 MiB and 0.897 at 2 GiB; with it, 512 MiB: sparkctl 3.46 s / plain 3.06 s =
0.885 and, a second run, 3.47 s / 3.22 s = 0.927; 2 GiB: 9.69 s / 9.11 s =
0.940. The first (provisioning) run took 4.40 s at 512 MiB, 10.48 s at 2 GiB.
What is left over plain is the interpreter and imports (~0.3 s more than the
ssh client's start), the image-ID read (~0.2 s, the connections to both nodes)
and the cluster lock (~0.06 s).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from check_scaling import e2e_lock  # the same two host locks, taken in the same order (tools/ is sys.path[0])

PROFILE = "tensorfold-tp2"
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:zig-2026.10"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=float, default=512.0, help="the image's layer size")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="image-sync-"))
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state")}
    env.pop("SPARKCTL_INVENTORY", None)
    inv = ["-i", str(tmp / "sim" / "inventory.yaml")]

    def sparkctl(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "sparkctl.cli.main", *argv], env=env, cwd=tmp,
                           capture_output=True, text=True, timeout=1800)
        if check and r.returncode != 0:
            sys.exit(f"sparkctl {' '.join(argv)} failed:\n{r.stdout}\n{r.stderr}")
        return r

    with e2e_lock():
        sparkctl("sim", "up", "--nodes", "2", "--ready", "--no-images")
        try:
            from sparkctl.model.inventory import load_inventory
            from sparkctl.ops.nodessh import fabric_address_from, ssh_argv
            from sparkctl_sim import cluster

            root = tmp / "sim"
            inventory = load_inventory(root / "inventory.yaml")
            sparkctl("sim", "image", "load", "spark-a", IMAGE, "--size-mib", f"{args.size_mib:g}")
            remote = ssh_argv(inventory, "spark-a", "spark-b", fabric_address_from(inventory, "spark-a", "spark-b"))
            plain_cmd = f"docker save {shlex.quote(IMAGE)} | {shlex.join(remote)} 'docker load'"

            def ssh(node: str, command: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([*cluster.ssh_argv(root, node), command], capture_output=True, text=True,
                                      timeout=1800, env=env)

            def clear_b() -> None:
                ssh("spark-b", f"docker rmi {shlex.quote(IMAGE)} >/dev/null 2>&1; true")

            def run_sparkctl() -> float:
                t0 = time.perf_counter()
                r = sparkctl(*inv, "image", "sync", PROFILE)
                took = time.perf_counter() - t0
                assert "copied from spark-a to spark-b" in r.stdout, r.stdout
                return took

            def run_plain() -> float:
                t0 = time.perf_counter()
                r = ssh("spark-a", plain_cmd)
                took = time.perf_counter() - t0
                assert r.returncode == 0 and "Loaded image" in r.stdout, r.stderr
                return took

            clear_b()
            first = run_sparkctl()  # warm-up: authorizes the key the plain copy uses too, fills the page cache
            print(f"first    sparkctl {first:7.2f} s (provisions the node-to-node key)", flush=True)
            times: dict[str, list[float]] = {"sparkctl": [], "plain": []}
            for rep in range(args.repeats):
                order = ("sparkctl", "plain") if rep % 2 == 0 else ("plain", "sparkctl")
                for which in order:
                    clear_b()
                    took = run_sparkctl() if which == "sparkctl" else run_plain()
                    times[which].append(took)
                    print(f"repeat {rep + 1} {which:<8} {took:7.2f} s", flush=True)
            mb = args.size_mib * (1 << 20) / 1e6
            med = {k: statistics.median(v) for k, v in times.items()}
            for k, v in med.items():
                print(f"median {k:<8} {v:7.2f} s  {mb / v:8.1f} MB/s")
            print(f"ratio plain/sparkctl = {med['plain'] / med['sparkctl']:.3f} (target >= 0.9), "
                  f"image {args.size_mib:g} MiB, {args.repeats} repeats")
        finally:
            sparkctl("sim", "down", check=False)


if __name__ == "__main__":
    main()
