#!/usr/bin/env python3
"""sparkctl's hub fetch against huggingface_hub.snapshot_download, side by side on one shaped local hub.

Both download the same multi-file repository from the same local hub
(sparkctl_sim/hub.py, in its own process: no client shares an interpreter lock
with the server) on loopback, shaped like a CDN: ``--per-conn-mbps`` per
connection (a per-flow limit) under ``--link-mbps`` for all of them (the
link). sparkctl runs through its real path (the agent's hub-fetch on a
LocalTransport node, verified, manifest written); the official client runs
with its defaults (``max_workers=8``, one stream per file). The runs
alternate ``--rounds`` times; the medians and their ratio are printed.

    python tools/hub_fetch.py --files 4 --file-mb 64 --per-conn-mbps 10 --link-mbps 2000

Not a test (shared noisy machine): a measurement to quote with its settings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _blob(size: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    reps = size // len(block) + 1
    return (block * reps)[:size]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=4, help="LFS shards")
    ap.add_argument("--file-mb", type=float, default=64.0)
    ap.add_argument("--per-conn-mbps", type=float, default=10.0, help="MB/s per connection (a CDN's per-flow rate)")
    ap.add_argument("--link-mbps", type=float, default=2000.0, help="MB/s for all connections together")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--chunk-mb", type=float, default=16.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    from huggingface_hub import snapshot_download

    from sparkctl.model.inventory import loads_inventory
    from sparkctl.ops.hubfetch import fetch_model, resolve
    from sparkctl.transport import LocalTransport

    size = int(args.file_mb * 2**20)
    files = {f"model-{i + 1:05d}-of-{args.files:05d}.safetensors": _blob(size, i) for i in range(args.files)}
    files.update({"config.json": b'{"model_type": "llama"}\n', "tokenizer.json": b"{}\n",
                  "model.safetensors.index.json": b'{"weight_map": {}}\n'})
    total = sum(len(v) for v in files.values())
    work = Path(tempfile.mkdtemp(prefix="hub-fetch-"))
    for rel, data in files.items():
        (work / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / "repo" / rel).write_bytes(data)
    inv = loads_inventory("cluster: {name: t, fabric_pool: 127.24.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
                          f"  - {{name: a, host: 192.0.2.1, prefix: {work / 'a'}}}\n")
    tr = LocalTransport(inv.names, sudo=False)
    times: dict[str, list[float]] = {"sparkctl": [], "snapshot_download": []}
    server = subprocess.Popen(
        [sys.executable, "-m", "sparkctl_sim.hub", "--dir", str(work / "repo"), "--repo-id", "bench/model",
         "--per-conn-mbps", f"{args.per_conn_mbps:g}", "--link-mbps", f"{args.link_mbps:g}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        endpoint = json.loads(server.stdout.readline())["endpoint"]  # type: ignore[union-attr]
        for r in range(args.rounds):
            for who in (("sparkctl", "snapshot_download") if r % 2 == 0 else ("snapshot_download", "sparkctl")):
                shutil.rmtree(work / "a", ignore_errors=True)
                shutil.rmtree(work / "hf", ignore_errors=True)
                os.sync()  # the previous run's dirty pages must not slow this one
                t0 = time.perf_counter()
                if who == "sparkctl":
                    plan = resolve(inv, tr, "a", repo_id="bench/model", revision="main", include=["*"],
                                   exclude=[], local_dir="/m", endpoint=endpoint, token=None)
                    rep = fetch_model(inv, tr, plan, token=None, connections=args.connections,
                                      chunk_mb=args.chunk_mb, poll_s=0.2)
                    assert rep.fetched == len(files)
                else:
                    snapshot_download("bench/model", local_dir=str(work / "hf"), endpoint=endpoint)
                dt = time.perf_counter() - t0
                times[who].append(dt)
                print(f"round {r + 1} {who:<18} {dt:7.2f} s  {total / dt / 1e6:8.1f} MB/s", flush=True)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"repository: {len(files)} files, {total / 2**20:.0f} MiB; hub shaped to {args.per_conn_mbps:g} MB/s per "
          f"connection, {args.link_mbps:g} MB/s in all; cores: {os.cpu_count()}")
    for k, v in med.items():
        print(f"median {k:<18} {v:7.2f} s  {total / v / 1e6:8.1f} MB/s")
    print(f"ratio sparkctl / snapshot_download (throughput): {med['snapshot_download'] / med['sparkctl']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
