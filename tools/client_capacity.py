"""The bench client's capacity per worker count, and its accuracy beside the bare-socket floor, in one run.

Three parts, all against the reference server (a child process; ``--server
lean``, the default, is :mod:`sparkctl.bench.leanserver`: same timing model and
bytes, less CPU per event; ``full`` is the aiohttp one), nothing leaves 127.0.0.1:

1. **Capacity sweep** at ``--concurrency`` (256) per worker count
   (``--workers 1,2``: :class:`sparkctl.bench.pool.WorkerPool`; 0 = the
   client in this process, one loop). All streams emit in lock-step (one
   event every ``g`` seconds each, at the same instants: what a batching
   engine does), offered ``c / g`` events/s. Per step: achieved events/s and
   loop-lag p50/p99 of every worker's 1 ms ticker (merged) in the steady window
   (last stream's first event to first stream's last event), the server's
   own lateness p99 (each chunk's write against its schedule, from its
   traces: the server's floor), and the CPU pressure: PSI "some" and our
   processes' run-queue wait (``/proc/PID/task/*/schedstat``). A step whose
   PSI is above ``--psi-limit`` is **STARVED**: its figures measure the
   machine, and it counts for no capacity. The capacity of a worker count is
   the highest achieved events/s of a non-starved step that kept up (>= 95 %
   of offered) with lag p99 under ``--lag-budget-ms``; where only starved
   steps could have given one, it says so instead of giving a figure.
2. **Accuracy at c** beside the floor (``tools/floor_client.py``: raw sockets,
   epoll, kernel stamps): batches of c identical requests (first tokens all at
   once), alternating floor / client per worker count. Per client: the TTFT
   error of every request (measured TTFT - the server's first content write +
   sent, i.e. against what the server really did) as median and p99, and the
   aggregate throughput's error against its closed form at the traced writes;
   then the client minus the floor.
3. **A 128K-token prompt** (``--long-prompt-tokens``), one stream: the TTFT
   error of the floor and of the client (its body sent as pieces:
   ``RequestSpec.body_parts``), side by side.

Prints figures; asserts nothing.

    python tools/client_capacity.py [--concurrency 256] [--workers 1,2] [--rates 5000,...]
                                    [--step-seconds 2] [--parts sweep,accuracy,long]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.bench.client import BenchClient, ClientTimeouts, LoopLagProbe, RequestSpec
from sparkctl.bench.events import RequestResult
from sparkctl.bench.metrics import aggregate_throughput, percentile, request_metrics
from sparkctl.bench.pool import WorkerPool
from sparkctl.bench.pressure import OTHER_LOAD_CORES, Pressure, PressureMeter
from sparkctl.bench.refserver import EmitTrace, RefConfig, RefServerProcess
from sparkctl.bench.selftest import fetch_traces

from floor_client import open_sockets, run_floor_batch  # beside this script (tools/ is sys.path[0])

CORES = len(os.sched_getaffinity(0))
KEEP_UP = 0.95  # achieved / offered below this: the client fell behind the offer
TIMEOUTS = ClientTimeouts(connect_s=10.0, read_s=30.0, request_s=300.0)
WARM = RequestSpec("completions", "refserver", 2, prompt="warm", extra_body={"ref": {"ttft_base_s": 0.0, "gap_s": 0.0}})


@dataclass(frozen=True)
class Step:
    workers: int
    offered_events_per_s: float | None  # None: flood
    events_per_s: float
    window_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    server_late_p99_ms: float | None
    pressure: Pressure
    statuses: dict[str, int]
    starved: bool


class Clients:
    """One worker count's client: a WorkerPool, or (0) a BenchClient in this process."""

    def __init__(self, url: str, concurrency: int, workers: int) -> None:
        self.workers = workers
        self.pool = WorkerPool(url, concurrency=concurrency, workers=workers, timeouts=TIMEOUTS) if workers > 0 \
            else None
        # -1: the client as it was before issue 23 (httpx over the stamped transport, one loop)
        self.client = None if workers > 0 else BenchClient(url, concurrency=concurrency, timeouts=TIMEOUTS,
                                                           engine="httpx" if workers < 0 else "wire")

    async def __aenter__(self) -> Clients:
        if self.pool is not None:
            await self.pool.start()
            await self.pool.warm_up(WARM)
        else:
            assert self.client is not None
            await self.client.warm_up(WARM)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.pool is not None:
            await self.pool.stop()
        if self.client is not None:
            await self.client.aclose()

    @property
    def pids(self) -> list[int]:
        return (self.pool.pids if self.pool is not None else []) + [os.getpid()]

    async def batch(self, specs: Sequence[RequestSpec]) -> tuple[list[RequestResult], list[float], list[float]]:
        if self.pool is not None:
            b = await self.pool.run_batch(specs)
            return b.results, b.lag_samples_s, b.lag_times_s
        assert self.client is not None
        async with LoopLagProbe(0.001) as lag:
            results = await self.client.run_batch(specs)
        return results, lag.samples_s, lag.times_s


def _ms(v: float | None) -> float:
    return (v or 0.0) * 1e3


def server_late_p99(results: Sequence[RequestResult], traces: dict[str, EmitTrace], cfg: RefConfig) -> float | None:
    """p99 over every traced chunk of (written - scheduled): the server's own lateness."""
    late = []
    for r in results:
        tr = traces.get(r.salt.rstrip("\n"))
        if tr is None:
            continue
        t_first = tr.t_start_s + cfg.ttft_s(tr.prompt_tokens)
        done = 0
        for t, n in tr.emits:
            late.append(t - (t_first + (done + n - 1) * cfg.gap_s))
            done += n
    return percentile(late, 99.0) if late else None


async def run_step(cl: Clients, url: str, server_pid: int | None, concurrency: int, gap_s: float, tokens: int,
                   psi_limit: float) -> Step:
    ref = {"ttft_base_s": 0.05, "ttft_per_token_s": 0.0, "gap_s": gap_s, "tokens_per_chunk": 1, "trace": True}
    spec = RequestSpec("completions", "refserver", tokens, prompt="capacity probe", extra_body={"ref": ref})
    with PressureMeter(cl.pids + ([server_pid] if server_pid else [])) as pm:
        results, lag_s, lag_t = await cl.batch([spec] * concurrency)
    traces = await fetch_traces(url)
    stamps = [[e.t_s for e in r.events if e.kind == "chunk" and e.n_text_chars > 0] for r in results]
    stamps = [s for s in stamps if s]
    start = max(s[0] for s in stamps)  # every stream is streaming from here ...
    end = min(s[-1] for s in stamps)  # ... until here
    if end <= start:
        start, end = min(s[0] for s in stamps), max(s[-1] for s in stamps)
    n = sum(1 for s in stamps for t in s if start < t <= end)
    lags = [x for x, t in zip(lag_s, lag_t) if start <= t <= end] or [0.0]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    cfg = RefConfig(ttft_base_s=0.05, gap_s=gap_s)
    return Step(cl.workers, concurrency / gap_s, n / (end - start) if end > start else 0.0, end - start,
                _ms(percentile(lags, 50.0)), _ms(percentile(lags, 99.0)), max(lag_s or [0.0]) * 1e3,
                None if (v := server_late_p99(results, traces, cfg)) is None else v * 1e3,
                pm.result, statuses, pm.result.starved(psi_limit))


def capacity(steps: Sequence[Step], lag_budget_ms: float) -> tuple[Step | None, Step | None]:
    """(the best good step, the best step that would have counted but was starved)."""
    def good(s: Step) -> bool:
        return (s.offered_events_per_s is not None and s.lag_p99_ms < lag_budget_ms
                and s.events_per_s >= KEEP_UP * s.offered_events_per_s)
    best = max((s for s in steps if good(s) and not s.starved), key=lambda s: s.events_per_s, default=None)
    starved = max((s for s in steps if good(s) and s.starved), key=lambda s: s.events_per_s, default=None)
    return best, starved


def _who(w: int) -> str:
    return "httpx" if w < 0 else f"w={w}" if w else "w=0"


def _psi(p: Pressure) -> str:
    """'PSI some / our run-queue wait / others' cores'."""
    return ("n/a" if p.psi_some_pct is None else f"{p.psi_some_pct:.0f}%") + f" / {p.own_wait_pct:.0f}% / " \
        + ("n/a" if p.other_cores is None else f"{p.other_cores:.2f}")


async def sweep(a: argparse.Namespace, url: str, server_pid: int | None) -> None:
    rates = [float(x) for x in a.rates.split(",")]
    print(f"\n== 1. capacity: concurrency {a.concurrency}, streams in lock-step, lag budget p99 < "
          f"{a.lag_budget_ms:g} ms (steady window); STARVED = PSI some > {a.psi_limit:g}% during the step while others used "
          f"> {OTHER_LOAD_CORES:g} core; psi/wait/others = PSI some, our processes' run-queue wait, others' CPU in cores")
    print(f"{'workers':>7} {'offered ev/s':>12} {'achieved ev/s':>13} {'window s':>8} {'lag p50':>7} {'lag p99':>7} "
          f"{'lag max':>7} {'srv late p99':>12} {'psi/wait/others':>19}  statuses")
    all_steps: list[Step] = []
    for w in a.workers:
        async with Clients(url, a.concurrency, w) as cl:
            for rate in rates:
                gap = a.concurrency / rate
                s = await run_step(cl, url, server_pid, a.concurrency, gap, max(int(a.step_seconds / gap), 8),
                                   a.psi_limit)
                all_steps.append(s)
                late = "n/a" if s.server_late_p99_ms is None else f"{s.server_late_p99_ms:.2f} ms"
                print(f"{_who(w):>7} {s.offered_events_per_s:>12,.0f} {s.events_per_s:>13,.0f} {s.window_s:>8.2f} "
                      f"{s.lag_p50_ms:>7.2f} {s.lag_p99_ms:>7.2f} {s.lag_max_ms:>7.1f} {late:>12} "
                      f"{_psi(s.pressure):>19}  {s.statuses}{'  STARVED' if s.starved else ''}", flush=True)
    for w in a.workers:
        best, starved = capacity([s for s in all_steps if s.workers == w], a.lag_budget_ms)
        label = f"{w} worker process(es)" if w > 0 else "in-process client (one loop)" if w == 0 else \
            "in-process httpx client (before issue 23)"
        if best is not None:
            line = f"{best.events_per_s:,.0f} events/s (offered {best.offered_events_per_s:,.0f}, " \
                   f"lag p99 {best.lag_p99_ms:.2f} ms, PSI {_psi(best.pressure)})"
        else:
            line = "none of the non-starved steps"
        if starved is not None and (best is None or starved.events_per_s > best.events_per_s):
            line += (f"; a higher step ({starved.offered_events_per_s:,.0f} offered) was CPU-starved "
                     f"(PSI {_psi(starved.pressure)}): no figure from it")
        above = [s for s in all_steps if s.workers == w and s.offered_events_per_s is not None
                 and s.offered_events_per_s > ((best.offered_events_per_s or 0.0) if best else 0.0)]
        failed_starved = [s for s in above if s.starved]
        if best is not None and failed_starved and len(failed_starved) == len(above):
            line += "; every step above it ran CPU-starved: a lower bound"
        elif failed_starved:
            line += f"; {len(failed_starved)} of the {len(above)} steps above it ran CPU-starved"
        if w > 0 and w + 1 > CORES:
            # the reference server is a busy process of its own: w workers and the server need w + 1 cores,
            # so past CORES - 1 workers they share a core with the server and with each other (what the
            # "wait" column shows): the figure measures this machine's cores, not the client's growth
            line += (f"; {w} workers + the server = {w + 1} busy processes on {CORES} cores: "
                     f"growth past {max(CORES - 1, 1)} worker(s) needs more cores than this machine has")
        print(f"capacity, {label}: {line}")


def _errors(results: Sequence[RequestResult], traces: dict[str, EmitTrace], n_tokens: int
            ) -> tuple[list[float], float | None]:
    """(TTFT error per request, aggregate-throughput error %) against the server's traced writes."""
    errs: list[float] = []
    last, sent = [], []
    for r in results:
        tr = traces.get(r.salt.rstrip("\n"))
        m = request_metrics(r.events)
        t_sent = r.t_sent_s
        if tr is None or not tr.emits or m.ttft_s is None or t_sent is None:
            continue
        errs.append(m.ttft_s - (tr.emits[0][0] - t_sent))
        last.append(tr.emits[-1][0])
        sent.append(t_sent)
    agg = None
    if last and len(last) == len(results):
        truth = len(results) * n_tokens / (max(last) - min(sent))
        agg = (aggregate_throughput([r.events for r in results]).tok_s / truth - 1) * 100.0
    return errs, agg


async def accuracy(a: argparse.Namespace, url: str, server_pid: int | None) -> None:
    c, n = a.concurrency, a.accuracy_tokens
    ref = {"ttft_base_s": 0.1, "ttft_per_token_s": 0.0, "gap_s": 0.005, "tokens_per_chunk": 1, "trace": True}
    spec = RequestSpec("completions", "refserver", n, prompt="accuracy probe", extra_body={"ref": ref})
    print(f"\n== 2. accuracy at concurrency {c}: {a.repeats} batches each, {n} tokens, first tokens all at once; "
          f"errors against the server's traced writes")
    rows: dict[str, tuple[list[float], list[float], list[Pressure]]] = {}
    clients = {w: Clients(url, c, w) for w in a.workers}
    for cl in clients.values():
        await cl.__aenter__()
    try:
        for _ in range(a.repeats):
            socks = open_sockets(url, c)  # opened ahead of the window, as the clients' pools are
            with PressureMeter([os.getpid()] + ([server_pid] if server_pid else [])) as pm:
                res = run_floor_batch(url, [spec] * c, socks)
            e, g = _errors(res, await fetch_traces(url), n)
            r = rows.setdefault("floor", ([], [], []))
            r[0].extend(e), r[1].append(g if g is not None else float("nan")), r[2].append(pm.result)
            for w, cl in clients.items():
                with PressureMeter(cl.pids + ([server_pid] if server_pid else [])) as pm:
                    res, _, _ = await cl.batch([spec] * c)
                e, g = _errors(res, await fetch_traces(url), n)
                r = rows.setdefault(f"client {_who(w)}", ([], [], []))
                r[0].extend(e), r[1].append(g if g is not None else float("nan")), r[2].append(pm.result)
    finally:
        for cl in clients.values():
            await cl.__aexit__()
    _print_accuracy(rows, a.psi_limit)


def _print_accuracy(rows: dict[str, tuple[list[float], list[float], list[Pressure]]], psi_limit: float) -> None:
    print(f"{'client':>12} {'n':>5} {'TTFT err p50 ms':>15} {'p99 ms':>8} {'agg err %':>10} {'- floor p50 ms':>14} "
          f"{'- floor agg %':>13}  psi/wait/others (max)")
    f50 = percentile(rows["floor"][0], 50.0) or 0.0
    fagg = percentile(rows["floor"][1], 50.0) or 0.0
    for name, (errs, aggs, ps) in rows.items():
        p50, p99 = percentile(errs, 50.0) or 0.0, percentile(errs, 99.0) or 0.0
        agg = percentile(aggs, 50.0) or 0.0
        worst = max(ps, key=lambda p: p.psi_some_pct or 0.0)
        starved = any(p.starved(psi_limit) for p in ps)
        print(f"{name:>12} {len(errs):>5} {p50 * 1e3:>15.3f} {p99 * 1e3:>8.3f} {agg:>+10.4f} "
              f"{(p50 - f50) * 1e3:>+14.3f} {agg - fagg:>+13.4f}  {_psi(worst)}"
              + ("  STARVED (a batch ran above the PSI limit)" if starved else ""))


async def long_prompt(a: argparse.Namespace, url: str, server_pid: int | None) -> None:
    words = a.long_prompt_tokens
    ref = {"ttft_base_s": 0.1, "ttft_per_token_s": 0.0, "gap_s": 0.005, "trace": True}
    spec = RequestSpec("completions", "refserver", 16, prompt=" ".join(["lorem"] * words), extra_body={"ref": ref})
    body = sum(len(p) for p in spec.body_parts(""))
    print(f"\n== 3. a {words:,}-token prompt ({body / 1e6:.2f} MB body), one stream, {a.repeats} repeats each")
    rows: dict[str, tuple[list[float], list[float], list[Pressure]]] = {}
    clients = {w: Clients(url, 1, w) for w in a.workers}
    for cl in clients.values():
        await cl.__aenter__()
    try:
        for _ in range(a.repeats):
            with PressureMeter([os.getpid()] + ([server_pid] if server_pid else [])) as pm:
                res = run_floor_batch(url, [spec])
            e, _ = _errors(res, await fetch_traces(url), 16)
            r = rows.setdefault("floor", ([], [], []))
            r[0].extend(e), r[1].append(0.0), r[2].append(pm.result)
            for w, cl in clients.items():
                with PressureMeter(cl.pids + ([server_pid] if server_pid else [])) as pm:
                    res, _, _ = await cl.batch([spec])
                e, _ = _errors(res, await fetch_traces(url), 16)
                r = rows.setdefault(f"client {_who(w)}", ([], [], []))
                r[0].extend(e), r[1].append(0.0), r[2].append(pm.result)
    finally:
        for cl in clients.values():
            await cl.__aexit__()
    _print_accuracy(rows, a.psi_limit)


async def main_async(a: argparse.Namespace) -> None:
    with PressureMeter() as idle:
        time.sleep(1.0)
    print(f"machine before the run (1 s idle): psi/wait/others {_psi(idle.result)}; STARVED steps are named, "
          f"not counted")
    async with RefServerProcess(lean=a.server == "lean") as srv:
        if "sweep" in a.parts:
            await sweep(a, srv.base_url, srv.pid)
        if "accuracy" in a.parts:
            await accuracy(a, srv.base_url, srv.pid)
        if "long" in a.parts:
            await long_prompt(a, srv.base_url, srv.pid)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--workers", default="0,1,2",
                   help="worker counts, comma separated (0 = the client in this process; httpx = the same with "
                        "the httpx engine, the client as it was before issue 23)")
    p.add_argument("--rates", default="5000,10000,15000,20000,25000,30000,40000",
                   help="offered events/s per step (all streams together), comma separated")
    p.add_argument("--step-seconds", type=float, default=2.0)
    p.add_argument("--lag-budget-ms", type=float, default=5.0)
    p.add_argument("--psi-limit", type=float, default=25.0,
                   help="PSI 'some' %% above which a step counts as CPU-starved")
    p.add_argument("--server", choices=("lean", "full"), default="lean")
    p.add_argument("--parts", default="sweep,accuracy,long")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--accuracy-tokens", type=int, default=64)
    p.add_argument("--long-prompt-tokens", type=int, default=131072)
    a = p.parse_args()
    a.workers = [-1 if x.strip() == "httpx" else int(x) for x in a.workers.split(",")]
    a.parts = {x.strip() for x in a.parts.split(",")}
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
