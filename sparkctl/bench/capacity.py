"""The bench client's own capacity: the events/s it absorbs while the reference server floods it.

Owns :func:`measure_client_capacity` (in the caller's process, one loop, or
spread over a :class:`~sparkctl.bench.pool.WorkerPool`) and its result
:class:`Capacity`: events/s against the offered rate, the event-loop lag
beside it, and the CPU pressure while it ran (:mod:`sparkctl.bench.pressure`),
which says whether the figure is the client's or the machine's. The
self-test runs it at the end (:func:`~sparkctl.bench.selftest.run_selftest_async`).

Must not: start the server (the caller passes its URL), or print (the
self-test's :func:`~sparkctl.bench.selftest.format_report` does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkctl.bench.client import BenchClient, ClientTimeouts, LoopLagProbe, RequestSpec
from sparkctl.bench.metrics import percentile
from sparkctl.bench.pressure import CONTENDED_PSI_PCT, Pressure, PressureMeter


@dataclass(frozen=True)
class Capacity:
    """What the client itself can absorb (the server floods; the client is the bottleneck)."""

    concurrency: int
    n_events: int
    window_s: float
    events_per_s: float
    offered_events_per_s: float | None
    loop_lag_p50_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    statuses: Mapping[str, int]
    workers: int = 0
    """0: the client in the self-test's own process (one loop); N: a WorkerPool of N processes."""
    pressure: Pressure | None = None
    starved: bool = False
    """CPU-starved while measured (:meth:`Pressure.starved`): the figure measures the machine."""


async def measure_client_capacity(base_url: str, *, concurrency: int = 64, max_tokens: int = 256,
                                  gap_s: float = 0.0005, timeouts: ClientTimeouts = ClientTimeouts(request_s=120.0),
                                  lag_period_s: float = 0.001, workers: int = 0,
                                  server_pids: Sequence[int] = (),
                                  contended_psi_pct: float = CONTENDED_PSI_PCT) -> Capacity:
    """Events/s the client absorbs at ``concurrency`` while the server offers ``concurrency / gap_s``.

    With the default ``gap_s`` the offered rate (128 k events/s at 64) is far
    above what one Python event loop can take, so the figure is the client's
    ceiling. The loop-lag ticker runs alongside (in every worker) and reports
    how late a 1 ms timer fires, i.e. how stale a timestamp can be at that
    load. ``workers`` > 0 spreads the streams over that many worker processes
    (:class:`~sparkctl.bench.pool.WorkerPool`); the CPU pressure while it ran
    says whether the figure is the client's or the machine's (``starved``).
    """
    from sparkctl.bench.pool import WorkerPool

    spec = RequestSpec("completions", "refserver", max_tokens, prompt="capacity probe",
                       extra_body={"ref": {"ttft_base_s": 0.01, "ttft_per_token_s": 0.0, "gap_s": gap_s,
                                           "tokens_per_chunk": 1}})
    warm = RequestSpec("completions", "refserver", 2, prompt="warm",
                       extra_body={"ref": {"ttft_base_s": 0.0, "gap_s": 0.0}})
    if workers:
        async with WorkerPool(base_url, concurrency=concurrency, workers=workers, timeouts=timeouts,
                              lag_period_s=lag_period_s) as pool:
            await pool.warm_up(warm)
            with PressureMeter([*pool.pids, os.getpid(), *server_pids]) as pm:
                batch = await pool.run_batch([spec] * concurrency)
            results, samples = batch.results, batch.lag_samples_s
    else:
        async with BenchClient(base_url, concurrency=concurrency, timeouts=timeouts) as client:
            await client.warm_up(warm)
            with PressureMeter([os.getpid(), *server_pids]) as pm:
                async with LoopLagProbe(lag_period_s) as lag:
                    results = await client.run_batch([spec] * concurrency)
            samples = lag.samples_s
    chunks = [e for r in results for e in r.events if e.kind == "chunk"]
    first = min(r.t_sent_s for r in results if r.t_sent_s is not None)
    last = max(e.t_s for r in results for e in r.events)
    window = last - first
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    samples = samples or [0.0]
    return Capacity(
        concurrency=concurrency,
        n_events=len(chunks),
        window_s=window,
        events_per_s=len(chunks) / window if window > 0 else 0.0,
        offered_events_per_s=(concurrency / gap_s) if gap_s > 0 else None,
        loop_lag_p50_ms=(percentile(samples, 50.0) or 0.0) * 1e3,
        loop_lag_p99_ms=(percentile(samples, 99.0) or 0.0) * 1e3,
        loop_lag_max_ms=max(samples) * 1e3,
        statuses=statuses,
        workers=workers,
        pressure=pm.result,
        starved=pm.result.starved(contended_psi_pct),
    )
