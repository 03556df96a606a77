#!/usr/bin/env python3
"""`sparkctl weights sync` on the SIMULATED pair and the SIMULATED 4-node ring: time and ratio.

For each cluster size (``sim up --nodes 2``, then ``--nodes 4``) the bench puts
one random file of ``--size-mib`` in the source node's weights path, runs
``sparkctl weights sync`` once to warm the source's hash cache (so what is
timed is the distribution, not the one-time manifest hashing), then, per
repeat, deletes the receivers' copies and times the command (a process, over
real SSH, like a user runs it). On the ring it times the pipelined chain (the
default) and ``--no-pipeline`` (store and forward) side by side.

The veth "cables" are unshaped by default: they move bytes as fast as two
shared CPUs copy them, so every extra receiver competes for the same CPU, and
a ring of 3 receivers is slower than a pair for that reason alone. With
``--rate-mbit R`` (default 400) the bench puts a ``tc`` token bucket of R on
each fabric veth end, inside the node namespaces, so each cable is an
independent R-limited link and the ratio shows what the topology and the
chaining cost. The shaping lives only as long as the bench's cluster (``sim
down`` removes the namespaces); the management network is never shaped.

Figures: wall time of the command (median): the distribution time; and the
longest single pull by the agents' own clock (from ``--json``, without job
start-up and polling), which shows how long the node across waited on its
neighbour when pipelined but not the stage wait of store and forward. Prints; asserts nothing. Holds the host's sim lock
(/run/sparkctl-sim/e2e-tests.lock) and uses a private SPARKCTL_SIM_DIR and
XDG_STATE_HOME under /tmp, removed at the end.

Usage: python3 tools/weights_distribution.py [--size-mib 256] [--repeats 3]
[--rate-mbit 400|0] [--chunk-mb 2] [--connections 4]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = Path("/run/sparkctl-sim/e2e-tests.lock")
MIB = 1 << 20
# same model family, one pair profile and one ring profile
PROFILES = {2: "tensorfold-tp2", 4: "tensorfold-tp4-ring"}
NODES = ("spark-a", "spark-b", "spark-c", "spark-d")
MGMT_IFNAME = "enP7s7"


def _run(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, check=False, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _sparkctl(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    r = _run([sys.executable, "-m", "sparkctl.cli", *args], env, timeout)
    if r.returncode != 0:
        raise SystemExit(f"sparkctl {' '.join(args)} -> {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def _shape(nodes: int, rate_mbit: int) -> list[str]:
    """A token bucket on every fabric veth end of every node; returns what was shaped."""
    shaped = []
    for node in NODES[:nodes]:
        ns = f"sparkctl-{node}"
        links = json.loads(subprocess.run(["ip", "-n", ns, "-j", "link", "show"], capture_output=True, text=True,
                                          check=True).stdout)
        for link in links:
            dev = link["ifname"]
            if dev in ("lo", MGMT_IFNAME):
                continue
            # burst: a few jumbo GSO packets; latency bounds the queue (drops beyond it)
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                            "rate", f"{rate_mbit}mbit", "burst", "512kb", "latency", "100ms"], check=True)
            shaped.append(f"{node}:{dev}")
    return shaped


def _weights_dir(env: dict[str, str], profile: str) -> str:
    sys.path.insert(0, str(REPO))
    from sparkctl.model.profiles import resolve
    from sparkctl.model.resources import Roots

    return resolve(profile, Roots.make()).profile.model.weights_path


def _one_size(nodes: int, args: argparse.Namespace, blob: Path, base: Path) -> dict[str, list[tuple[float, float]]]:
    root = base / f"sim{nodes}"
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(root), "XDG_STATE_HOME": str(base / f"state{nodes}"),
           "PYTHONPATH": str(REPO)}
    env.pop("SPARKCTL_INVENTORY", None)
    profile = PROFILES[nodes]
    wp = _weights_dir(env, profile)
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        _sparkctl(env, "sim", "up", "--nodes", str(nodes), "--ready")
        inv = str(root / "inventory.yaml")
        if args.rate_mbit > 0:
            shaped = _shape(nodes, args.rate_mbit)
            print(f"  {nodes} nodes: shaped {len(shaped)} fabric veth ends to {args.rate_mbit} Mbit/s", flush=True)
        src = root / "nodes" / "spark-a" / "fs" / wp.lstrip("/")
        src.mkdir(parents=True, exist_ok=True)
        os.link(blob, src / "blob.safetensors")  # same inode: no copy of the bytes
        receivers = NODES[1:nodes]
        common = ["--connections", str(args.connections), "--chunk-mb", f"{args.chunk_mb:g}", "--json"]
        _sparkctl(env, "-i", inv, "weights", "sync", profile, "--from", "spark-a", *common)  # warm the hash cache
        modes = {"pipelined": []} if nodes == 2 else {"pipelined": [], "store-and-forward": ["--no-pipeline"]}
        for _ in range(args.repeats):
            for mode, extra in modes.items():  # interleaved, so drift hits both alike
                for r in receivers:
                    shutil.rmtree(root / "nodes" / r / "fs" / wp.lstrip("/"), ignore_errors=True)
                os.sync()
                t = time.perf_counter()
                out = _sparkctl(env, "-i", inv, "weights", "sync", profile, "--from", "spark-a", *common, *extra)
                wall = time.perf_counter() - t
                rep = json.loads(out.stdout)
                nodes_rep = rep["nodes"]
                if not all(n["verified"] and n["bytes"] == args.size_mib * MIB for n in nodes_rep.values()):
                    raise SystemExit(f"sync did not move and verify every byte: {nodes_rep}")
                own = max(n["seconds"] for n in nodes_rep.values())
                results.setdefault(mode, []).append((wall, own))
    finally:
        r = _run([sys.executable, "-m", "sparkctl.cli", "sim", "down"], env, 300)
        if r.returncode != 0:
            print(f"sim down failed: {r.stdout[-500:]} {r.stderr[-500:]}", file=sys.stderr)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate-mbit", type=int, default=400, help="tc rate per fabric veth end; 0: unshaped")
    ap.add_argument("--chunk-mb", type=float, default=2.0,
                    help="verification/relay unit; scaled down with the file (32 MiB default for real models)")
    ap.add_argument("--connections", type=int, default=4)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the simulated cluster's namespaces need root")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="sparkctl-weights-dist-", dir="/tmp"))
    try:
        blob = base / "blob.bin"
        with open(blob, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(MIB))
        with open(LOCK, "a") as lock:
            print(f"waiting for {LOCK} ...", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
            pair = _one_size(2, args, blob, base)
            ring = _one_size(4, args, blob, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(xs: list[tuple[float, float]], k: int) -> float:
        return statistics.median(x[k] for x in xs)

    shaping = f"each fabric veth end shaped to {args.rate_mbit} Mbit/s" if args.rate_mbit else "unshaped veths"
    print(f"weights sync of {args.size_mib} MiB from spark-a, {args.repeats} repeats, medians; {shaping}; "
          f"chunk {args.chunk_mb:g} MiB x {args.connections} connections; {os.cpu_count()} cpus shared by all nodes")
    if args.rate_mbit:
        print(f"  one transfer at line rate: {args.size_mib * MIB * 8 / (args.rate_mbit * 1e6):.2f} s")
    p_wall, p_own = med(pair["pipelined"], 0), med(pair["pipelined"], 1)
    print(f"  {'2 nodes (pair)':<34} wall {p_wall:7.2f} s   longest pull {p_own:7.2f} s")
    for mode, xs in ring.items():
        w, o = med(xs, 0), med(xs, 1)
        print(f"  {'4 nodes (ring), ' + mode:<34} wall {w:7.2f} s   longest pull {o:7.2f} s   "
              f"ratio 4/2 (wall) {w / p_wall:5.2f}")
    print("target: 4-node / 2-node <= 1.3 (pipelined)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
