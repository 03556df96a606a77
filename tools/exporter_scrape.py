#!/usr/bin/env python3
"""One node exporter, measured: the time of one scrape, and its CPU at a scrape interval.

    python tools/exporter_scrape.py --url http://10.201.0.12:9478/metrics --pid PID [--scrapes 8] [--interval-s 15]
    python tools/exporter_scrape.py --sim-node spark-b [...]     # a SIMULATED node: URL and PID from the sim

Prints, side by side: the wall time of each scrape (median, min, max), the part of it the
fact probe took (the exporter's own ``sparkctl_probe_duration_seconds``: the node's tools) and
the rest (the exporter itself: parsing, rendering, HTTP); then the CPU the exporter process
and the probes it waited for used over the run (``/proc/PID/stat`` utime+stime+cutime+cstime)
as a share of one core at that interval. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime (proc(5), after comm)
    return ticks / os.sysconf("SC_CLK_TCK")


def _scrape(url: str) -> tuple[float, float | None]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0 = time.perf_counter()
    with opener.open(url, timeout=60) as r:
        text = r.read().decode()
    wall = time.perf_counter() - t0
    probe = next((float(ln.split()[-1]) for ln in text.splitlines()
                  if ln.startswith("sparkctl_probe_duration_seconds ")), None)
    return wall, probe


def _sim(node: str) -> tuple[str, int]:
    import yaml

    root = Path(os.environ.get("SPARKCTL_SIM_DIR", "/var/lib/sparkctl-sim"))
    inv = yaml.safe_load((root / "inventory.yaml").read_text())
    host = next(n["host"] for n in inv["nodes"] if n["name"] == node)
    state = json.loads((root / "nodes" / node / "run" / "systemd" / "sparkctl-exporter.service.json").read_text())
    pid = int(state.get("MainPID") or state.get("pid") or 0)
    return f"http://{host}:9478/metrics", pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int, default=0, help="the exporter's process (for its CPU)")
    ap.add_argument("--sim-node", help="a SIMULATED node: its exporter's URL and PID")
    ap.add_argument("--scrapes", type=int, default=8)
    ap.add_argument("--interval-s", type=float, default=15.0)
    a = ap.parse_args()
    url, pid = (a.url, a.pid) if not a.sim_node else _sim(a.sim_node)
    if not url:
        ap.error("--url or --sim-node")
    _scrape(url)  # warm: the first scrape pays Python's imports of the shims' caches
    walls, probes = [], []
    c0, t0 = (_cpu_s(pid) if pid else None), time.monotonic()
    for i in range(a.scrapes):
        start = time.monotonic()
        w, p = _scrape(url)
        walls.append(w)
        if p is not None:
            probes.append(p)
        if i < a.scrapes - 1:
            time.sleep(max(0.0, a.interval_s - (time.monotonic() - start)))
    span = time.monotonic() - t0
    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1000:7.1f} ms (min {min(xs) * 1000:.1f}, max {max(xs) * 1000:.1f})"

    print(f"exporter {url}: {a.scrapes} scrapes, one every {a.interval_s:g} s")
    print(f"  one scrape, wall          {ms(walls)}")
    if probes:
        own = [w - p for w, p in zip(walls, probes)]
        print(f"  of it the fact probe      {ms(probes)}   (the node's tools: nvidia-smi, ethtool, ...)")
        print(f"  of it the exporter itself {ms(own)}   (parse, render, HTTP)")
    if pid:
        used = _cpu_s(pid) - (c0 or 0.0)
        print(f"  CPU over {span:.0f} s: {used:.2f} s = {100 * used / span:.1f} % of one core at a {a.interval_s:g} s "
              f"interval ({used / a.scrapes * 1000:.0f} ms per scrape, probes included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
