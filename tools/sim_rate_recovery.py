"""Do the bench suites recover the simulated engines' configured rates within 2 %? Prints the errors.

What it runs: the simulated ds41f and TensorFold engines (``python -m
sparkctl_sim.engine``) as plain local processes on 127.0.0.1, sped up
``--speedup`` times (default 2; the test uses 10, where the client's own few ms
of send spread become 10x larger in engine time: -4.5 % on TensorFold's
concurrency/4 aggregate at 10x, -1.3 % at 2x, same machine, same hour), with no
simulated ring, namespaces or SSH (so it needs no lock on the simulated
cluster). Against each it runs the bench runner's prefill, decode and
concurrency suites, then compares each point's median with the rate the engine
says it applies (``/sim/info`` ``perf.effective``; the prefill rate is
interpolated on log(prompt length) between its table points, as the engine
does). The aggregate's window holds the TTFT (the bench's definition), so its
expected value comes from the engine's closed form (:func:`expected_aggregate`),
not from the decode-only aggregate the engine is configured with. Prints every
error, the CPU pressure (Linux PSI "some") while each engine ran, and exits 1 when any error is outside
+-``--tolerance-pct`` (default 2, the issue's "configured rates are recovered within 2 %").

This is the strict check; tests/test_bench_suites.py keeps a wide bound (see
its test) because a unit test must not fail because another process held the
CPU. Figures taken while CPU pressure is high measure the machine, not the
arithmetic: read the printed pressure beside them.

    python tools/sim_rate_recovery.py [--speedup 2] [--repeats 2] [--engine ds41f --engine tensorfold]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sparkctl.bench.options import RunOptions
from sparkctl.bench.pressure import cpu_pressure_total_s
from sparkctl.bench.runner import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from localengine import prefill_rate, start_local, stop  # noqa: E402 - tests/localengine.py, a test driver

# name served, decode tokens. TensorFold ignores ignore_eos: 100 tokens stay under
# its shortest natural answer (120), as in tests/test_bench_suites.py.
ENGINES: dict[str, tuple[str, int]] = {"ds41f": ("dsv41-ds41f", 384), "tensorfold": ("dsv41-tf", 100)}


def recovery_errors(summary: Any, info: dict[str, Any], speedup: float, lengths: tuple[int, ...],
                    levels: tuple[int, ...], tokens: int) -> dict[str, tuple[float, float]]:
    """{"point metric": (expected, error %)} of each point's median against the configured rate."""
    eff = info["perf"]["effective"]
    pts = {p["point"]: p for p in summary.points}
    out: dict[str, tuple[float, float]] = {}

    def check(point: str, metric: str, expected: float) -> None:
        got = pts[point]["metrics"][metric]["median"] / speedup
        out[f"{point} {metric}"] = (expected, 100.0 * (got / expected - 1.0))

    for n in lengths:
        check(f"prefill/{n}", "prefill_tok_s", prefill_rate(eff["prefill_tok_s"], n))
    check("decode/1", "decode_tok_s", eff["per_stream_tok_s"]["1"])
    for c in levels:
        point = pts[f"concurrency/{c}"]
        prompt = (point["metrics"].get("prompt_tokens") or {}).get("median") or 0
        check(f"concurrency/{c}", "aggregate_tok_s",
              expected_aggregate(info, c, tokens, prompt / c if prompt else 0))
        check(f"concurrency/{c}", "stream_decode_median_tok_s", eff["per_stream_tok_s"][str(c)])
    return out


def expected_aggregate(info: dict[str, Any], c: int, tokens: int, prompt_tokens: float) -> float:
    """The engine's aggregate under the bench's definition (docs/bench-metrics.md).

    The bench's window runs from the first send to the last token, so it holds
    the TTFT; the engine's configured aggregate is decode only. The engine
    (sparkctl/sim/engines/server.py) prefills the c prompts one after another
    and sends each first token at max(base latency, end of its prefill); then
    the c streams decode together at per_stream(c). So, in engine seconds:
    window = max(base_latency, c * prefill_work) + (tokens - 1) / per_stream(c).
    """
    eff = info["perf"]["effective"]
    base = float(info["perf"]["base_latency_s"])
    work = prompt_tokens / prefill_rate(eff["prefill_tok_s"], max(prompt_tokens, 1.0)) if prompt_tokens else 0.0
    window = max(base, c * work) + (tokens - 1) / eff["per_stream_tok_s"][str(c)]
    return c * tokens / window


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", action="append", choices=sorted(ENGINES), help="default: both")
    ap.add_argument("--speedup", type=float, default=2.0,
                    help="engine time runs this much faster; the client's own fixed costs (send spread) grow with it")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tolerance-pct", type=float, default=2.0)
    a = ap.parse_args()
    lengths, levels = (8192, 16384), (1, 2, 4)
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="sparkctl-rates-") as tmp:
        for engine in a.engine or sorted(ENGINES):
            name, tokens = ENGINES[engine]
            proc, url = start_local(engine, name, Path(tmp) / f"{engine}.log", a.speedup)
            try:
                info = httpx.get(url + "/sim/info").json()
                p0, t0 = cpu_pressure_total_s(), time.perf_counter()
                summary = run(url, name, Path(tmp) / engine, {"engine": engine, "tp_size": 1},
                              RunOptions(suites=("prefill", "decode", "concurrency"), lengths=lengths,
                                         concurrency=levels, decode_tokens=tokens, repeats=a.repeats),
                              progress=lambda _msg: None)
                p1, t1 = cpu_pressure_total_s(), time.perf_counter()
            finally:
                stop(proc)
            psi = "n/a" if p0 is None or p1 is None else f"{100 * (p1 - p0) / (t1 - t0):.0f}%"
            errs = recovery_errors(summary, info, a.speedup, lengths, levels, tokens)
            print(f"{engine}: speedup {info.get('speedup')}, {summary.n_requests} requests, "
                  f"{summary.n_errors} errors, CPU pressure while it ran {psi}")
            print(f"  {'point metric':<48} {'configured':>11} {'error%':>8}")
            for key, (expected, err) in errs.items():
                mark = "" if abs(err) <= a.tolerance_pct else "  OUTSIDE"
                print(f"  {key:<48} {expected:>11.4g} {err:>+8.2f}{mark}")
            worst = max([worst, *(abs(e) for _, e in errs.values())])
            if summary.n_errors:
                worst = math.inf
    print(json.dumps({"worst_abs_error_pct": round(worst, 3), "tolerance_pct": a.tolerance_pct}))
    return 0 if worst <= a.tolerance_pct else 1


if __name__ == "__main__":
    sys.exit(main())
