#!/usr/bin/env python3
"""Weights sync throughput against a plain single-stream copy, on loopback.

One agent ``serve`` process serves a random file on 127.0.0.1; the same file is
then copied from the same address by

* ``curl -o`` (or a urllib single stream when curl is missing): the baseline;
* the agent's ``pull`` (ranged, N connections, SHA-256 verified, fsync'd, atomic
  rename): what one receiver of ``sparkctl weights sync`` does;
* ``sparkctl.ops.weights.sync`` end to end for a pair of local "nodes" (addresses
  127.20.0.1/2, LocalTransport) with the CLI's defaults, which adds the agent
  push, the manifest on the source (cold: hashed, once, first; warm: from the
  hash cache, interleaved with the others), the server, the job polling and the stop.

It prints medians and the throughput ratio pull / plain (target >= 0.8); it
asserts nothing. Everything lives in one temporary directory under /tmp that
is removed at the end. Usage: python3 tools/weights_sync.py [--size-mib 256]
[--repeats 3] [--connections 1 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "sparkctl" / "remote" / "weights_agent.py"
MIB = 1 << 20


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    os.sync()  # the previous run's dirty pages must not slow this one
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _plain(url: str, dest: Path, durable: bool = False) -> None:
    if shutil.which("curl"):
        subprocess.run(["curl", "-s", "-f", "-o", str(dest), url], check=True)
    else:
        with urllib.request.urlopen(url) as resp, open(dest, "wb") as f:
            shutil.copyfileobj(resp, f, 1 * MIB)
    if durable:  # what the pull does before its rename: the bytes on disk, not only in the page cache
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pull(base: str, manifest: Path, dest: Path, connections: int, inside: list[float]) -> None:
    run = subprocess.run(
        [sys.executable, "-S", str(AGENT), "pull", "--from-url", base, "--manifest-json", str(manifest), "--dest",
         str(dest), "--connections", str(connections)], capture_output=True, text=True,
    )
    last = json.loads(run.stdout.splitlines()[-1])
    if run.returncode != 0 or last.get("event") != "done" or last.get("fetched") != 1:
        raise SystemExit(f"pull failed: {run.stdout[-500:]} {run.stderr[-500:]}")
    inside.append(float(last["seconds"]))  # the agent's own clock: without interpreter start-up


class _SyncPair:
    """``weights.sync`` between two local "nodes", called as ``sparkctl weights sync`` calls it (its defaults)."""

    def __init__(self, tmp: Path, blob: Path) -> None:
        sys.path.insert(0, str(REPO))
        from sparkctl.model.inventory import loads_inventory
        from sparkctl.transport import LocalTransport

        self.tmp = tmp
        self.inv = loads_inventory(
            "cluster: {name: bench, fabric_pool: 127.20.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
            f"  - {{name: a, host: 192.0.2.1, prefix: {tmp / 'a'}}}\n"
            f"  - {{name: b, host: 192.0.2.2, prefix: {tmp / 'b'}}}\n"
            "cables: [[a:p0, b:p0]]\n"
        )
        (tmp / "a" / "models").mkdir(parents=True)
        os.link(blob, tmp / "a" / "models" / "blob.bin")
        self.tr = LocalTransport(self.inv.names, sudo=False)

    def run(self) -> tuple[float, float]:
        """(wall seconds of the whole call, seconds of the receiver's pull by the agent's own clock)."""
        from sparkctl.ops import weights

        shutil.rmtree(self.tmp / "b" / "models", ignore_errors=True)
        holder: dict = {}
        secs = _timed(lambda: holder.update(rep=weights.sync(self.inv, self.tr, "/models", "a")))
        if not holder["rep"].ok:
            raise SystemExit(f"sync failed: {holder['rep']}")
        return secs, holder["rep"].nodes["b"].seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    size = args.size_mib * MIB
    tmp = Path(tempfile.mkdtemp(prefix="sparkctl-weights-bench-", dir="/tmp"))
    server = None
    try:
        (tmp / "src").mkdir()
        with open(tmp / "src" / "blob.bin", "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(MIB))
        man = subprocess.run([sys.executable, "-S", str(AGENT), "manifest", "--dir", str(tmp / "src")],
                             capture_output=True, text=True, check=True)
        (tmp / "manifest.json").write_text(man.stdout.splitlines()[-1])
        server = subprocess.Popen(
            [sys.executable, "-S", str(AGENT), "serve", "--dir", str(tmp / "src"), "--bind", "127.0.0.1", "--port", "0",
             "--ttl-s", "120"], stdout=subprocess.PIPE, text=True,
        )
        listening = json.loads(server.stdout.readline())  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{listening['port']}/"
        url = base + "blob.bin"

        plain, durable = [], []
        pulls: dict[int, list[float]] = {c: [] for c in args.connections}
        inside: dict[int, list[float]] = {c: [] for c in args.connections}
        pair = _SyncPair(tmp / "pair", tmp / "src" / "blob.bin")
        syncs = [("cold", pair.run())]  # the first hashes the source; the others find it in the hash cache
        for _ in range(args.repeats):  # interleaved, so drift hits every method alike
            plain.append(_timed(lambda: _plain(url, tmp / "plain.bin")))
            (tmp / "plain.bin").unlink()
            durable.append(_timed(lambda: _plain(url, tmp / "plain.bin", durable=True)))
            (tmp / "plain.bin").unlink()
            for c in args.connections:
                dest = tmp / f"pull{c}"
                pulls[c].append(_timed(lambda: _pull(base, tmp / "manifest.json", dest, c, inside[c])))
                shutil.rmtree(dest)
            syncs.append(("warm", pair.run()))
        server.terminate()
        server.wait(10)
        server = None

        def rate(secs: float) -> float:
            return size / secs / 1e6

        p = statistics.median(plain)
        tool = "curl -o" if shutil.which("curl") else "urllib single stream"
        print(f"file {args.size_mib} MiB on 127.0.0.1, {args.repeats} repeats, medians, {os.cpu_count()} cpus")
        print(f"  plain ({tool}):{'':14s}{p:7.3f} s  {rate(p):8.1f} MB/s")
        for c, xs in pulls.items():
            m, i = statistics.median(xs), statistics.median(inside[c])
            print(f"  agent pull, {c} connection(s):  {m:7.3f} s  {rate(m):8.1f} MB/s  ratio {p / m:5.2f}"
                  f"  | own clock {i:6.3f} s ratio {p / i:5.2f}")
        print("  (pull = ranged GETs + sha256 verified + fsync + atomic rename; wall time includes the"
              " python3 start-up, the agent's own clock does not)")
        cold = [x for k, x in syncs if k == "cold"]
        warm = [x for k, x in syncs if k == "warm"]
        d = statistics.median(durable)
        print(f"  plain + fsync:{'':18s}{d:7.3f} s  {rate(d):8.1f} MB/s  (the pull fsyncs before its rename)")
        for name, xs in (("cold", cold), ("warm cache", warm)):
            w, own = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
            print(f"  weights.sync pair, {name + ':':<12}{w:7.3f} s  {rate(w):8.1f} MB/s  ratio {p / w:5.2f}"
                  f"  (vs plain + fsync {d / w:5.2f}); fixed costs (wall - the pull's own clock) {w - own:5.3f} s")
        best = min(args.connections, key=lambda c: statistics.median(pulls[c]))
        print(f"target: pull/plain >= 0.8; best pull ({best} connection(s)): wall ratio "
              f"{p / statistics.median(pulls[best]):.2f}, own-clock ratio {p / statistics.median(inside[best]):.2f}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
