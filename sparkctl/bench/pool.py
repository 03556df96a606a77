"""Several event loops for one bench batch: worker processes, streams spread across them.

Owns: starting ``workers`` processes (``spawn``; one per core by default, as
AIPerf runs its workers), each with its own event loop and its own
:class:`~sparkctl.bench.client.BenchClient` (kernel receive stamps, its share
of the connections opened before anything is measured); spreading the streams
of a batch across them (stream ``i`` to worker ``i mod W``); releasing them
together; and merging what comes back **exactly**: every request's full event
log, in the order of the specs, and every loop-lag sample of every worker. No
sampling, no re-stamping: a worker's ``time.perf_counter()`` is
CLOCK_MONOTONIC, one clock for every process of the host, so its stamps are
the stamps a single loop would have taken, and the metrics
(:mod:`sparkctl.bench.metrics`, docs/bench-metrics.md) are computed from the
merged results by the same code whatever the number of workers. Request ids
are given by the parent in spec order (``r000001``...), as one client numbers
them.

Why: one Python event loop stamps N simultaneous arrivals one after another;
at 256 streams the last is milliseconds stale (issue 23: loop-lag p99 17 ms at
5,000 events/s). W loops on W cores each take 1/W of the streams.

Must not: compute metrics, print, or read the environment.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing.connection
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkctl.bench.client import BenchClient, ClientTimeouts, LoopLagProbe, RequestSpec
from sparkctl.bench.events import RequestResult


def default_workers() -> int:
    """One worker per core this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def spread(n_streams: int, n_workers: int) -> list[list[int]]:
    """Stream indices per worker: stream ``i`` goes to worker ``i mod W``. Pure."""
    if n_workers < 1:
        raise ValueError("n_workers must be >= 1")
    return [list(range(w, n_streams, n_workers)) for w in range(n_workers)]


def merge_results(n: int, parts: Sequence[Sequence[tuple[int, RequestResult]]]) -> list[RequestResult]:
    """The workers' (index, result) pairs as one list in spec order; every index exactly once. Pure."""
    out: list[RequestResult | None] = [None] * n
    for part in parts:
        for i, r in part:
            if not 0 <= i < n or out[i] is not None:
                raise ValueError(f"result index {i} is out of range or given twice")
            out[i] = r
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise ValueError(f"no result for streams {missing[:5]}")
    return [r for r in out if r is not None]


def merge_lag(parts: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[list[float], list[float]]:
    """Every worker's (samples, times) loop-lag series as one series ordered by time. Pure."""
    pairs = sorted((t, s) for samples, times in parts for s, t in zip(samples, times))
    return [s for _, s in pairs], [t for t, _ in pairs]


@dataclass(frozen=True)
class PoolBatch:
    """One batch released across the workers, merged."""

    results: list[RequestResult]
    lag_samples_s: list[float]
    """Every worker's 1 ms ticker lateness during the batch, ordered by ``lag_times_s``."""
    lag_times_s: list[float]
    lag_p99_ms_by_worker: tuple[float, ...]
    release_s: float
    """The instant every worker released its streams (perf_counter)."""


def _p99_ms(samples: Sequence[float]) -> float:
    from sparkctl.bench.metrics import percentile

    return (percentile(list(samples), 99.0) or 0.0) * 1e3


def _worker_main(fd: int) -> None:
    """A worker process: its settings, then commands, over the connection on ``fd``."""
    conn = multiprocessing.connection.Connection(fd)
    try:
        base_url, concurrency, timeouts, api_key, kernel_stamps, lag_period_s = conn.recv()
        asyncio.run(_worker_loop(conn, base_url, concurrency, timeouts, api_key, kernel_stamps, lag_period_s))
    except (EOFError, KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        pass


async def _sleep_until(t: float) -> None:
    """Sleep until perf_counter() reaches ``t``: the loop's timer, then a spin for the last millisecond."""
    left = t - time.perf_counter()
    if left > 0.002:
        await asyncio.sleep(left - 0.0015)
    while time.perf_counter() < t:
        pass


async def _worker_loop(conn: multiprocessing.connection.Connection, base_url: str, concurrency: int,
                       timeouts: ClientTimeouts, api_key: str | None, kernel_stamps: bool,
                       lag_period_s: float) -> None:
    loop = asyncio.get_running_loop()
    async with BenchClient(base_url, concurrency=max(concurrency, 1), timeouts=timeouts, api_key=api_key,
                           kernel_stamps=kernel_stamps) as client:
        await client.open_connections()
        conn.send(("ready", None))
        while True:
            msg = await loop.run_in_executor(None, conn.recv)
            kind = msg[0]
            if kind == "close":
                conn.send(("closed", None))
                return
            if kind == "warm":
                await client.open_connections()
                results = await client.run_batch([msg[1]] * len(msg[2]), msg[2])
                conn.send(("warm", results))
            elif kind == "batch":
                items: list[tuple[int, str, RequestSpec]] = msg[1]
                client.prepare([s for _, _, s in items])
                conn.send(("armed", None))
                go = await loop.run_in_executor(None, conn.recv)
                release_at = float(go[1])
                # the cyclic GC stays out of the window: a full collection walks every event
                # kept so far (65k at 256 streams x 256 tokens) and stalls the loop for it
                gc.collect()
                gc.freeze()
                gc.disable()
                try:
                    await _sleep_until(release_at)
                    async with LoopLagProbe(lag_period_s) as lag:
                        results = await client.run_batch([s for _, _, s in items], [rid for _, rid, _ in items]) \
                            if items else []
                finally:
                    gc.enable()
                    gc.unfreeze()
                conn.send(("batch", [(i, r) for (i, _, _), r in zip(items, results)], lag.samples_s, lag.times_s))
                del results
                gc.collect()


class WorkerPool:
    """``workers`` processes, each an event loop with its own :class:`BenchClient`.

    ``async with WorkerPool(url, concurrency=256, workers=2) as pool: batch = await pool.run_batch(specs)``.
    Worker ``w`` holds the connections of the streams ``spread`` gives it, opened
    when the pool starts (before anything is measured).
    """

    def __init__(self, base_url: str, *, concurrency: int, workers: int | None = None,
                 timeouts: ClientTimeouts = ClientTimeouts(), api_key: str | None = None,
                 kernel_stamps: bool = True, lag_period_s: float = 0.001, start_timeout_s: float = 60.0,
                 release_delay_s: float = 0.005) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.base_url = base_url
        self.concurrency = concurrency
        self.workers = min(workers or default_workers(), concurrency)
        self.timeouts = timeouts
        self.api_key = api_key
        self.kernel_stamps = kernel_stamps
        self.lag_period_s = lag_period_s
        self.start_timeout_s = start_timeout_s
        self.release_delay_s = release_delay_s
        self._conns: list[multiprocessing.connection.Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._seq = 0

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (for :class:`~sparkctl.bench.pressure.PressureMeter`)."""
        return [p.pid for p in self._procs]

    async def _recv(self, conn: multiprocessing.connection.Connection, timeout_s: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, conn.recv)
        return await (asyncio.wait_for(fut, timeout_s) if timeout_s else fut)

    async def start(self) -> None:
        # a child interpreter of its own (``python -m sparkctl.bench.pool FD``), not
        # multiprocessing's spawn: that re-imports the caller's __main__ (a tool, pytest)
        shares = spread(self.concurrency, self.workers)
        for share in shares:
            mine, theirs = socket.socketpair()
            p = subprocess.Popen([sys.executable, "-m", "sparkctl.bench.pool", str(theirs.fileno())],
                                 pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
            theirs.close()
            conn = multiprocessing.connection.Connection(mine.detach())
            conn.send((self.base_url, len(share), self.timeouts, self.api_key, self.kernel_stamps,
                       self.lag_period_s))
            self._conns.append(conn)
            self._procs.append(p)
        try:
            for c in self._conns:
                msg = await self._recv(c, self.start_timeout_s)
                if msg[0] != "ready":
                    raise RuntimeError(f"bench worker did not start: {msg!r}")
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for c in self._conns:
            try:
                c.send(("close",))
            except (OSError, ValueError):
                pass
        loop = asyncio.get_running_loop()
        for p in self._procs:
            try:
                await loop.run_in_executor(None, p.wait, 5.0)
            except subprocess.TimeoutExpired:
                p.terminate()
                await loop.run_in_executor(None, p.wait)
        for c in self._conns:
            c.close()
        self._conns, self._procs = [], []

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def warm_up(self, spec: RequestSpec) -> list[RequestResult]:
        """Every worker sends its share of ``concurrency`` copies of ``spec`` (fills every connection)."""
        ids = self._ids(self.concurrency)
        for c, share in zip(self._conns, spread(self.concurrency, len(self._conns))):
            c.send(("warm", spec, [ids[i] for i in share]))
        parts = [(await self._recv(c))[1] for c in self._conns]
        return merge_results(self.concurrency, [list(zip(share, got)) for share, got in
                                                zip(spread(self.concurrency, len(self._conns)), parts)])

    def _ids(self, n: int) -> list[str]:
        """Request ids for the next ``n`` requests, numbered as one client numbers them."""
        ids = [f"r{self._seq + i + 1:06d}" for i in range(n)]
        self._seq += n
        return ids

    async def run_batch(self, specs: Sequence[RequestSpec]) -> PoolBatch:
        """Release ``specs`` together across the workers; the merged results in spec order."""
        ids = self._ids(len(specs))
        shares = spread(len(specs), len(self._conns))
        for c, share in zip(self._conns, shares):
            c.send(("batch", [(i, ids[i], specs[i]) for i in share]))
        for c in self._conns:
            msg = await self._recv(c)
            if msg[0] != "armed":
                raise RuntimeError(f"bench worker: {msg!r}")
        release = time.perf_counter() + self.release_delay_s
        for c in self._conns:
            c.send(("go", release))
        parts = [await self._recv(c) for c in self._conns]
        results = merge_results(len(specs), [p[1] for p in parts])
        samples, times = merge_lag([(p[2], p[3]) for p in parts])
        return PoolBatch(results, samples, times, tuple(_p99_ms(p[2]) for p in parts), release)


class PooledBenchClient:
    """A :class:`WorkerPool` behind :class:`BenchClient`'s interface (``warm_up``, ``run_batch``, ``request``,
    ``aclose``), for callers that hold either (the runner's released-together points)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.concurrency = pool.concurrency

    async def warm_up(self, spec: RequestSpec) -> list[RequestResult]:
        return await self.pool.warm_up(spec)

    async def run_batch(self, specs: Sequence[RequestSpec]) -> list[RequestResult]:
        return (await self.pool.run_batch(specs)).results

    async def request(self, spec: RequestSpec, request_id: str | None = None) -> RequestResult:
        return (await self.pool.run_batch([spec])).results[0]

    async def aclose(self) -> None:
        await self.pool.stop()


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]))
