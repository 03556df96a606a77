"""The bench client's capacity: events/s at concurrency 64 while event-loop lag p99 stays under 5 ms.

A paced sweep. The reference server (a child process) runs 64 streams that
emit one event every ``g`` seconds each, all 64 at the same instants (identical
requests: what a batching engine does, one decode step gives every stream a
token), so the offered rate is ``64 / g`` events/s. Each step raises the
offered rate and lasts about ``--step-seconds``. For each step it prints:

* the achieved events/s and the loop lag p50/p99 (a 1 ms ticker: how late it
  woke, i.e. how stale a timestamp taken then could be), both over the steady
  window only (from the last stream's first event to the first stream's last
  event; connection setup and request teardown are outside it), and the lag
  max over the whole step;
* the CPU pressure (``/proc/pressure/cpu`` "some") while the step ran:
  figures taken under other load measure the machine, not the client.

The **capacity** is the highest achieved events/s of a step whose lag p99 was
under ``--lag-budget-ms`` (5 ms, the issue's budget) and which kept up (achieved
within 5 % of offered). The last row is the flood: the server offers far more
than a Python event loop takes (``g`` = 0.5 ms), i.e. the client's ceiling.
Prints figures; asserts nothing. Nothing leaves 127.0.0.1.

With ``--stamps kernel,loop`` two clients run against the same server, steps
alternating between them: the kernel's receive stamps (the default) against
stamps taken in the read callback only, i.e. what ``recvmsg`` and the
ancillary data cost the client.

    python tools/client_capacity.py [--concurrency 64] [--rates 1000,2000,...] [--step-seconds 2]
                                    [--stamps kernel,loop]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass

from sparkctl.bench.client import BenchClient, ClientTimeouts, LoopLagProbe, RequestSpec
from sparkctl.bench.metrics import percentile
from sparkctl.bench.refserver import RefServerProcess
from sparkctl.bench.selftest import cpu_pressure_total_s

KEEP_UP = 0.95  # achieved / offered below this: the client fell behind the offer


@dataclass(frozen=True)
class Step:
    stamps: str  # "kernel" or "loop": who dated the receives
    offered_events_per_s: float | None  # None: flood
    events_per_s: float
    window_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    cpu_pressure_pct: float | None
    statuses: dict[str, int]


async def run_step(client: BenchClient, mode: str, concurrency: int, gap_s: float, tokens: int) -> Step:
    spec = RequestSpec("completions", "refserver", tokens, prompt="capacity probe", salt=False,
                       extra_body={"ref": {"ttft_base_s": 0.02, "ttft_per_token_s": 0.0, "gap_s": gap_s,
                                           "tokens_per_chunk": 1}})
    p0, t0 = cpu_pressure_total_s(), time.perf_counter()
    async with LoopLagProbe(0.001) as lag:
        results = await client.run_batch([spec] * concurrency)
    p1, t1 = cpu_pressure_total_s(), time.perf_counter()
    stamps = [[e.t_s for e in r.events if e.kind == "chunk" and e.n_text_chars > 0] for r in results]
    stamps = [s for s in stamps if s]
    start = max(s[0] for s in stamps)  # every stream is streaming from here ...
    end = min(s[-1] for s in stamps)  # ... until here
    if end <= start:  # too short to have a steady window: use everything
        start, end = min(s[0] for s in stamps), max(s[-1] for s in stamps)
    n = sum(1 for s in stamps for t in s if start < t <= end)
    lags = [x for x, t in zip(lag.samples_s, lag.times_s) if start <= t <= end] or [0.0]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return Step(
        stamps=mode,
        offered_events_per_s=concurrency / gap_s,
        events_per_s=n / (end - start) if end > start else 0.0,
        window_s=end - start,
        lag_p50_ms=(percentile(lags, 50.0) or 0.0) * 1e3,
        lag_p99_ms=(percentile(lags, 99.0) or 0.0) * 1e3,
        lag_max_ms=max(lag.samples_s or [0.0]) * 1e3,
        cpu_pressure_pct=None if p0 is None or p1 is None else 100 * (p1 - p0) / (t1 - t0),
        statuses=statuses,
    )


async def sweep(concurrency: int, rates: list[float], step_s: float, flood_gap_s: float,
                flood_tokens: int, stamp_modes: list[str]) -> list[Step]:
    steps: list[Step] = []
    async with RefServerProcess() as srv, contextlib.AsyncExitStack() as stack:
        timeouts = ClientTimeouts(connect_s=10.0, read_s=30.0, request_s=300.0)
        clients: dict[str, BenchClient] = {}
        for mode in stamp_modes:
            clients[mode] = await stack.enter_async_context(
                BenchClient(srv.base_url, concurrency=concurrency, timeouts=timeouts,
                            kernel_stamps=mode == "kernel"))
            await clients[mode].warm_up(RequestSpec("completions", "refserver", 2, prompt="warm", salt=False,
                                                    extra_body={"ref": {"ttft_base_s": 0.0, "gap_s": 0.0}}))
        for rate in rates:
            gap = concurrency / rate
            for mode, client in clients.items():
                steps.append(await run_step(client, mode, concurrency, gap, max(int(step_s / gap), 8)))
        for mode, client in clients.items():
            flood = await run_step(client, mode, concurrency, flood_gap_s, flood_tokens)
            steps.append(dataclasses.replace(flood, offered_events_per_s=None))
    return steps


def capacity(steps: list[Step], lag_budget_ms: float) -> Step | None:
    """The step with the highest achieved events/s that kept up and kept lag p99 under budget."""
    ok = [s for s in steps if s.offered_events_per_s is not None and s.lag_p99_ms < lag_budget_ms
          and s.events_per_s >= KEEP_UP * s.offered_events_per_s]
    return max(ok, key=lambda s: s.events_per_s, default=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rates", default="1000,2000,3000,4000,5000,6000,8000,10000,12800",
                   help="offered events/s per step (all streams together), comma separated")
    p.add_argument("--step-seconds", type=float, default=2.0)
    p.add_argument("--lag-budget-ms", type=float, default=5.0)
    p.add_argument("--flood-gap-s", type=float, default=0.0005)
    p.add_argument("--flood-tokens", type=int, default=256)
    p.add_argument("--stamps", default="kernel",
                   help="who dates receives, comma separated: kernel (the default client), loop (read callback)")
    a = p.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    modes = [m.strip() for m in a.stamps.split(",") if m.strip()]
    if not modes or set(modes) - {"kernel", "loop"}:
        p.error("--stamps takes kernel, loop or both")
    steps = asyncio.run(sweep(a.concurrency, rates, a.step_seconds, a.flood_gap_s, a.flood_tokens, modes))
    print(f"client capacity sweep: concurrency {a.concurrency}, streams in lock-step, lag budget "
          f"p99 < {a.lag_budget_ms:g} ms (steady window)")
    print(f"{'stamps':>6} {'offered ev/s':>12} {'achieved ev/s':>13} {'window s':>9} {'lag p50 ms':>10} "
          f"{'lag p99 ms':>10} {'lag max ms':>10} {'cpu psi':>8}  statuses")
    for s in steps:
        offered = "flood" if s.offered_events_per_s is None else f"{s.offered_events_per_s:,.0f}"
        psi = "n/a" if s.cpu_pressure_pct is None else f"{s.cpu_pressure_pct:.0f}%"
        print(f"{s.stamps:>6} {offered:>12} {s.events_per_s:>13,.0f} {s.window_s:>9.2f} {s.lag_p50_ms:>10.2f} "
              f"{s.lag_p99_ms:>10.2f} {s.lag_max_ms:>10.1f} {psi:>8}  {s.statuses}")
    for mode in modes:
        mine = [s for s in steps if s.stamps == mode]
        best = capacity(mine, a.lag_budget_ms)
        flood = mine[-1]
        print(f"{mode} stamps: capacity (lag p99 < {a.lag_budget_ms:g} ms, kept up): "
              + (f"{best.events_per_s:,.0f} events/s" if best else "none of the steps")
              + f"; flood ceiling {flood.events_per_s:,.0f} events/s (lag p99 {flood.lag_p99_ms:.1f} ms)")


if __name__ == "__main__":
    main()
