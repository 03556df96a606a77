#!/usr/bin/env python3
"""The rolling switch through the gateway, measured: failed and truncated streams, the longest gap between
successful first tokens, and time to first token during the switch against the steady state before it, in one run.

Runs on the SIMULATED ring: builds a private one (`sparkctl sim up --nodes 4` under a temporary
SPARKCTL_SIM_DIR) while holding the hosts' e2e locks (as tools/check_scaling.py does; do not wrap this script
in `flock`), and removes it at the end. The REAL gateway (smg) in front of the REAL llama.cpp engine (the tiny
GGUF), two single-node replicas on spark-a and spark-b: the profiles and the open-loop load of
tests/sim/test_simulated_ring_rolling_switch.py (one streamed request every --period s, whatever the earlier ones
do; a stream counts whole only with a finish_reason, [DONE] and no error frame, since smg ends a stream its
backend cut with an error frame and [DONE]). The profiles pace the engine's stream at one token a second (a
SIMULATED decode speed, sparkctl_sim/llamacpp_routes): short answers stream for about 5 s and every
--long-every-th request for over a minute, so each drain waits out the streams in flight on its replica.

Each round: the load runs --before s with one profile serving (the steady state), then during `sparkctl switch`
to the other profile, then --after s. Rounds alternate roll-old -> roll-new and back. Windows are by the time a
request was sent. Prints figures; asserts nothing.

Usage: python3 tools/rolling_switch.py [--rounds 2] [--period 0.25] [--tokens 3] [--long-every 20] [--before 20]
       [--after 5]
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
from typing import Any

from check_scaling import e2e_lock  # the same two host locks, in the same order (tools/ is sys.path[0])

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkctl.model.inventory import load_inventory  # noqa: E402 - after the repository is on the path
from tests.sim.helpers import LONG_TOKENS, SHORT_TOKENS, Load  # noqa: E402 - the e2e's own load
from tests.sim.test_simulated_ring_rolling_switch import GW_PORT, PROFILES  # noqa: E402 - and profiles


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def _gap(results: list[dict[str, Any]]) -> float:
    """The longest time between two successive successful first tokens (s)."""
    firsts = sorted(r["t"] + r["ttft"] for r in results if r["ttft"] is not None and r["status"] == 200)
    return max((b - a for a, b in zip(firsts, firsts[1:])), default=float("nan"))


def report(load: Load, t0: float, t1: float, switch: subprocess.CompletedProcess[str], frm: str, to: str) -> dict[str, Any]:
    windows = {"before": [r for r in load.results if r["t"] < t0],
               "during": [r for r in load.results if t0 <= r["t"] <= t1],
               "after": [r for r in load.results if r["t"] > t1]}
    ok = {k: [r["ttft"] for r in v if load.whole(r) and r["ttft"] is not None] for k, v in windows.items()}
    bad = load.failed()
    row = {"switch": f"{frm} -> {to}", "exit": switch.returncode, "seconds": round(t1 - t0, 1),
           "requests": len(load.results), "failed": sum(r["status"] != 200 for r in bad),
           "truncated": sum(r["status"] == 200 for r in bad),
           "p50_before_ms": _pct(ok["before"], 0.5), "p99_before_ms": _pct(ok["before"], 0.99),
           "p50_during_ms": _pct(ok["during"], 0.5), "p99_during_ms": _pct(ok["during"], 0.99),
           "gap_s": _gap(load.results), "during_n": len(windows["during"])}
    row["p99_ratio"] = row["p99_during_ms"] / row["p99_before_ms"] if row["p99_before_ms"] else float("nan")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--period", type=float, default=0.25, help="seconds between two requests (open loop)")
    ap.add_argument("--tokens", type=int, default=SHORT_TOKENS,
                    help="max_tokens of each streamed request (the profiles pace the engine at one token a "
                         "second, a SIMULATED decode speed: 3 tokens stream for about 5 s)")
    ap.add_argument("--long-every", type=int, default=20,
                    help=f"every Nth request asks for {LONG_TOKENS} tokens, a stream of over a minute (0: none)")
    ap.add_argument("--before", type=float, default=20.0, help="seconds of steady state before each switch")
    ap.add_argument("--after", type=float, default=5.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rolling-switch-"))
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state"),
           "SPARKCTL_SIM_SPEEDUP": "20", "SPARKCTL_SIM_LOAD_S": "1", "PYTHONPATH": str(REPO)}
    env.pop("SPARKCTL_INVENTORY", None)
    inv = tmp / "sim" / "inventory.yaml"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sparkctl.cli", *args], env=env, capture_output=True,
                              text=True, timeout=900, cwd=tmp, check=False)

    rows: list[dict[str, Any]] = []
    with e2e_lock():
        r = run("sim", "up", "--nodes", "4", "--ready", "--no-images")
        if r.returncode:
            print(r.stdout, r.stderr)
            run("sim", "down")
            return 1
        try:
            (inv.parent / "profiles").mkdir(exist_ok=True)
            for name in ("roll-old", "roll-new"):
                (inv.parent / "profiles" / f"{name}.yaml").write_text(PROFILES[name])
            r = run("-i", str(inv), "up", "roll-old", "--json")
            if r.returncode:
                print(r.stdout[-2000:], r.stderr[-2000:])
                return 1
            gw = f"http://{load_inventory(inv).node('spark-a').host}:{GW_PORT}"
            now = "roll-old"
            for i in range(a.rounds):
                to = "roll-new" if now == "roll-old" else "roll-old"
                long = frozenset(range(a.long_every // 2, 2000, a.long_every)) if a.long_every else frozenset()
                with Load(gw, period=a.period, max_tokens=a.tokens, long=long) as load:
                    time.sleep(a.before)
                    t0 = time.monotonic()
                    sw = run("-i", str(inv), "switch", to, "--json")
                    t1 = time.monotonic()
                    time.sleep(a.after)
                row = report(load, t0, t1, sw, now, to)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if sw.returncode:
                    print(sw.stderr[-2000:], file=sys.stderr)
                    break
                now = to
        finally:
            run("sim", "down")
    if not rows:
        return 1
    print(f"\nrolling switch of two replicas through smg on the SIMULATED ring ({len(rows)} rounds, one request "
          f"every {a.period} s, max_tokens {a.tokens}, every {a.long_every}th {LONG_TOKENS}):")
    print(f"{'switch':24s} {'s':>5s} {'req':>5s} {'failed':>6s} {'trunc':>5s} {'p50 before':>10s} {'p99 before':>10s}"
          f" {'p50 during':>10s} {'p99 during':>10s} {'p99 x':>6s} {'gap s':>6s}")
    for w in rows:
        print(f"{w['switch']:24s} {w['seconds']:5.1f} {w['requests']:5d} {w['failed']:6d} {w['truncated']:5d} "
              f"{w['p50_before_ms']:10.0f} {w['p99_before_ms']:10.0f} {w['p50_during_ms']:10.0f} "
              f"{w['p99_during_ms']:10.0f} {w['p99_ratio']:6.2f} {w['gap_s']:6.2f}")
    print(f"p99 during / before, median of rounds: {statistics.median(w['p99_ratio'] for w in rows):.2f} "
          "(target: at most 2); failed + truncated: "
          f"{sum(w['failed'] + w['truncated'] for w in rows)} (target: 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
