"""Self-test of the bench measurement core against the reference server.

Owns: starting :mod:`sparkctl.bench.refserver` on 127.0.0.1 (a child process
by default, so the server has its own interpreter), running the
:mod:`sparkctl.bench.client` at each concurrency level over several server
configurations, and checking every metric of :mod:`sparkctl.bench.metrics`
against its closed form. Then measures the client's own capacity
(:mod:`sparkctl.bench.capacity`: events/s at concurrency 64, event-loop lag
p99, the CPU pressure meanwhile). Results are frozen dataclasses; nothing
here prints (see :func:`format_report`).

The truth each request is judged against: the closed forms over the token
counts the timing model fixes (``P`` in, ``n`` out, ``k`` per chunk), at the
times the server really wrote each chunk. The server keeps them
(``trace: true``, :class:`~sparkctl.bench.refserver.EmitTrace`) on
CLOCK_MONOTONIC, the clock the client stamps on, so a client on the same host
compares its events with the writes that caused them. A virtual machine wakes
an idle process late, and most after a long wait: the CI VM wrote the first
chunk after a 0.4 s TTFT 2-3 ms late, and the client, stamping when its read
callback ran, saw it 1-2 ms later still. Judged against the schedule alone,
those 4-8 ms failed prefill (-1.8 %) and decode (+2.0 %) at concurrency 1 on
every attempt, while the client's arithmetic was right. Now the server's
lateness is reported per cell (``server_late_ms``; ``request_delay_ms`` from
the send to the server's ``t0``) and the client dates bytes by the kernel's
receive stamp (:mod:`sparkctl.bench.stamped`), so what is judged is the
client: its stamps and its arithmetic.

Tolerances (the issue's, not widened):

* rates (prefill, decode, aggregate) and their inverses (TPOT, ITL p50):
  +-1 % at concurrency 1, +-2 % above;
* TTFT: every request at or after the server's first content write (causal),
  and the median request within +2 ms;
* ITL p99 (a tail: jitter) within 2 ms of the p99 of the written gaps;
* token counts and their sources, statuses, and the chunking the server
  traced: exact, every request.

The statistic (and why it is the median): timed checks judge the median
request of each (configuration, concurrency) cell, as the bench's reports
give medians over repeats; the worst request is printed beside it. One
request whose first chunk another process delayed moves prefill and decode
in opposite directions; the median of >= 3 requests is not moved by one,
while a wrong formula moves every request.

"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkctl.bench.capacity import Capacity, measure_client_capacity
from sparkctl.bench.client import BenchClient, ClientTimeouts, LoopLagProbe, RequestSpec
from sparkctl.bench.events import RequestResult
from sparkctl.bench.metrics import aggregate_throughput, percentile, request_metrics
from sparkctl.bench.pressure import CONTENDED_PSI_PCT, cpu_pressure_total_s
from sparkctl.bench.refserver import (
    EmitTrace,
    PreciseWaker,
    RefConfig,
    RefServer,
    RefServerProcess,
    count_prompt_tokens,
)

TTFT_SLACK_S = 0.002  # the issue's budget: TTFT within +2 ms of the closed form
TTFT_CAUSAL_EPS_S = 0.00005  # a kernel receive stamp is converted from CLOCK_REALTIME
RATE_TOL_PCT_C1 = 1.0  # rates at concurrency 1
RATE_TOL_PCT = 2.0  # rates above concurrency 1


@dataclass(frozen=True)
class Check:
    """One compared metric. ``error_pct`` is None for exact (non-numeric) checks."""

    config: str
    concurrency: int
    metric: str
    expected: float | str
    measured: float | str
    error_pct: float | None
    tolerance: str
    passed: bool
    n_requests: int
    worst_error_pct: float | None = None
    """The worst single request's error (reported, not judged; see check_cell)."""


@dataclass(frozen=True)
class SelfTestReport:
    ok: bool
    checks: tuple[Check, ...]
    capacity: Capacity | None
    loop_lag_p99_ms: Mapping[int, float]
    """Loop lag p99 during the measured runs at each concurrency (diagnosis)."""
    server: str
    duration_s: float
    statuses: Mapping[str, int] = field(default_factory=dict)
    starved_cells: tuple[tuple[str, int], ...] = ()
    """Cells that still failed after their retries while other load contended
    for the CPU: their timing rows measure the machine's load, not the client."""
    wake_lateness_max_ms: float = 0.0
    """Worst lateness of the reference server's precise timer on this machine,
    measured before the runs (information: the checks use the server's traces)."""
    capacities: tuple[Capacity, ...] = ()
    """The client's capacity per worker count (``capacity`` is the first of them)."""

    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def unexplained_failures(self) -> tuple[Check, ...]:
        """Failures outside starved cells, and any failed exact check anywhere."""
        starved = set(self.starved_cells)
        return tuple(c for c in self.failures() if (c.config, c.concurrency) not in starved or c.error_pct is None
                     and c.tolerance == "exact")


@dataclass(frozen=True)
class Scenario:
    """One server configuration the self-test runs at every concurrency level."""

    name: str
    endpoint: str
    prompt_words: int
    max_tokens: int
    ref: Mapping[str, Any] = field(default_factory=dict)
    lockstep: bool = False
    """Identical prompts at concurrency > 1 (not run at 1): every stream emits at the
    same instants, so the client reads N events at once every gap. Per-gap ITL is
    what breaks when the client dates an event by when its task ran rather than
    when its bytes arrived (two events read together, one gap ~0, the next ~2g)."""


# a = 100 ms, b = 1 ms/token (1000 tok/s prefill), g = 5 ms (200 tok/s decode).
# TTFT ~ 0.4 s keeps the 2 ms TTFT budget inside the 1 % prefill-rate budget.
BASE_TIMING = RefConfig(ttft_base_s=0.1, ttft_per_token_s=0.001, gap_s=0.005)

DEFAULT_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("completions", "completions", 300, 64),
    Scenario("chat-role-chunk", "chat", 300, 64, {"role_chunk": True}),
    Scenario("chat-k3", "chat", 300, 66, {"tokens_per_chunk": 3}),  # 66 = 22 full chunks
    Scenario("completions-no-usage", "completions", 300, 64, {"usage": False}),
    Scenario("completions-lockstep", "completions", 300, 64, lockstep=True),
)


def _rel_err_pct(measured: float, expected: float) -> float:
    return (measured - expected) / expected * 100.0


def _prompt(words: int) -> str:
    return " ".join(["lorem"] * words)


def _expected_prompt_tokens(sc: Scenario, result: RequestResult) -> int:
    prompt = _prompt(int(result.labels["prompt_words"]))
    if sc.endpoint == "chat":
        return count_prompt_tokens(messages=[{"role": "user", "content": result.salt + prompt}])
    return count_prompt_tokens(prompt=result.salt + prompt)


def _spec(sc: Scenario, base: RefConfig, prompt_words: int) -> RequestSpec:
    ref = {"ttft_base_s": base.ttft_base_s, "ttft_per_token_s": base.ttft_per_token_s, "gap_s": base.gap_s,
           "trace": True, **sc.ref}
    labels = {"prompt_words": str(prompt_words)}
    prompt = _prompt(prompt_words)
    if sc.endpoint == "chat":
        return RequestSpec("chat", "refserver", sc.max_tokens, messages=({"role": "user", "content": prompt},),
                           extra_body={"ref": ref}, labels=labels)
    return RequestSpec("completions", "refserver", sc.max_tokens, prompt=prompt, extra_body={"ref": ref},
                       labels=labels)


def _median_pair(pairs: Sequence[tuple[float, float]], err: Any) -> tuple[float, float, float, float]:
    """(expected, measured, median error, worst error) over per-request (measured, expected) pairs.

    The median error interpolates like :func:`percentile`; expected/measured are
    the pair at the lower median, for display.
    """
    errs = sorted((err(m, e), e, m) for m, e in pairs)
    med = percentile([x[0] for x in errs], 50.0) or 0.0
    _, e, m = errs[(len(errs) - 1) // 2]
    worst = max((x[0] for x in errs), key=abs)
    return e, m, med, worst


def _chunking(trace: EmitTrace) -> str:
    """'P=305 21x3+1x2': the prompt tokens and the run-length tokens per chunk of a trace."""
    runs: list[list[int]] = []
    for _, k in trace.emits:
        if runs and runs[-1][1] == k:
            runs[-1][0] += 1
        else:
            runs.append([1, k])
    return f"P={trace.prompt_tokens} " + ("+".join(f"{c}x{k}" for c, k in runs) or "none")


def scheduled_trace(cfg: RefConfig, t_start_s: float, prompt_tokens: int, max_tokens: int) -> EmitTrace:
    """The emissions the timing model schedules from ``t_start_s`` (a server with no lateness). Pure."""
    k, t_first = cfg.tokens_per_chunk, t_start_s + cfg.ttft_s(prompt_tokens)
    emits: list[tuple[float, int]] = []
    done = 0
    while done < max_tokens:
        n = min(k, max_tokens - done)
        emits.append((t_first + (done + n - 1) * cfg.gap_s, n))
        done += n
    return EmitTrace(t_start_s, prompt_tokens, tuple(emits))


def check_cell(sc: Scenario, base: RefConfig, concurrency: int,
               batches: Sequence[Sequence[RequestResult]],
               traces: Mapping[str, EmitTrace] | None = None) -> list[Check]:
    """Compare the requests of one (scenario, concurrency) cell with the closed forms. Pure.

    The expected value of each metric is its closed form over the token counts
    the timing model fixes (prompt ``P``, ``n`` out, ``k`` per chunk), taken at
    the times the server really emitted (``traces``, by the request's salt: the
    server's ``loop.time()`` before each write, the client's clock). A machine
    that wakes the server late moves what the server did, not what the client
    must measure; how late it was is reported (``server_late_ms``, and
    ``request_delay_ms`` from the client's send to the server's ``t0``). A
    request with no trace is compared with the model's schedule from its send
    (a server with no lateness). The chunking the server traced must be the
    model's (``server_chunks``, exact).

    Timed checks judge the cell's *median* request (the statistic the bench's
    reports give: medians over repeats); the worst request is reported beside
    it (``worst_error_pct``), not judged, because on a shared host its error
    is the scheduler's (see the module docstring). Exact checks and the causal
    TTFT lower bound hold for every request.
    """
    cfg = base.with_overrides(sc.ref)
    rate_tol = RATE_TOL_PCT_C1 if concurrency == 1 else RATE_TOL_PCT
    rows: list[Check] = []
    results = [r for b in batches for r in b]
    n = len(results)

    def rel(metric: str, pairs: list[tuple[float | None, float]], tol_pct: float) -> None:
        if not pairs or any(m is None for m, _ in pairs):
            rows.append(Check(sc.name, concurrency, metric, pairs[0][1] if pairs else float("nan"), "missing",
                              None, f"+-{tol_pct:g}%", False, n))
            return
        e, m, med, worst = _median_pair(pairs, _rel_err_pct)  # type: ignore[arg-type]
        rows.append(Check(sc.name, concurrency, metric, e, m, med, f"+-{tol_pct:g}%", abs(med) <= tol_pct, n,
                          worst_error_pct=worst))

    def exact(metric: str, pairs: list[tuple[Any, Any]]) -> None:
        bad = [(m, e) for m, e in pairs if m != e]
        m, e = bad[0] if bad else pairs[0]
        rows.append(Check(sc.name, concurrency, metric, e, m, None, "exact", not bad, n))

    def info_ms(metric: str, values: list[float]) -> None:
        if values:
            rows.append(Check(sc.name, concurrency, metric, 0.0, (percentile(values, 50.0) or 0.0) * 1e3, None,
                              f"worst {max(values, key=abs) * 1e3:.2f} ms", True, n))

    statuses = [(r.status, "ok") for r in results]
    exact("status", statuses)

    ttft, prefill, decode, tpot, itl50, itl99, ctoks, ptoks, tsrc, psrc = ([] for _ in range(10))
    chunks: list[tuple[Any, Any]] = []
    server_late: list[float] = []
    request_delay: list[float] = []
    last_emit: dict[int, float] = {}
    for r in results:
        p = _expected_prompt_tokens(sc, r)
        m = request_metrics(r.events, prompt_tokens_fallback=p if not cfg.usage else None)
        t_sent = r.t_sent_s or 0.0
        traced = (traces or {}).get(r.salt.rstrip("\n"))
        plan = scheduled_trace(cfg, traced.t_start_s if traced else t_sent, p, sc.max_tokens)
        truth = traced or plan
        if traced is not None:
            chunks.append((_chunking(traced), _chunking(plan)))
            server_late.append(traced.emits[0][0] - plan.emits[0][0] if traced.emits else 0.0)
            request_delay.append(traced.t_start_s - t_sent)
        if not truth.emits:
            continue
        (e_first, k_first), e_last = truth.emits[0], truth.emits[-1][0]
        last_emit[id(r)] = e_last
        ttft_exp = e_first - t_sent
        window, after_first = e_last - e_first, sc.max_tokens - k_first
        itl_true = [(b - a) / kb for (a, _), (b, kb) in zip(truth.emits, truth.emits[1:])]
        ttft.append((m.ttft_s, ttft_exp))
        prefill.append((m.prefill_tok_s, p / ttft_exp))
        if after_first > 0 and window > 0:
            decode.append((m.decode_tok_s, after_first / window))
            tpot.append((m.tpot_s, window / after_first))
        if itl_true:
            itl50.append((m.itl_p50_s, percentile(itl_true, 50.0) or 0.0))
            itl99.append((m.itl_p99_s, percentile(itl_true, 99.0) or 0.0))
        ctoks.append((m.completion_tokens, sc.max_tokens))
        ptoks.append((m.prompt_tokens, p))
        tsrc.append((m.token_source, "usage" if cfg.usage else "chunk_count"))
        psrc.append((m.prompt_token_source, "usage" if cfg.usage else "caller"))

    # TTFT: every request at or after the server's first content write (causal: `sent`
    # is stamped before the body leaves, the server stamps before it writes; 50 us
    # for the kernel stamp's conversion from CLOCK_REALTIME), and the median request
    # within the issue's +2 ms: loopback plus the client's stamping. A wrong closed
    # form (first chunk, role chunk, k) is off by (k-1)*g = 10 ms or more.
    tol = f"[0, +{TTFT_SLACK_S * 1e3:.2f} ms]"
    if not ttft or any(m is None for m, _ in ttft):
        rows.append(Check(sc.name, concurrency, "ttft_s", ttft[0][1] if ttft else float("nan"), "missing", None,
                          tol, False, n))
    else:
        e, got, med_excess, worst_excess = _median_pair(ttft, lambda m_, e_: m_ - e_)  # type: ignore[arg-type]
        lo_ok = all(m_ >= e_ - TTFT_CAUSAL_EPS_S for m_, e_ in ttft)  # type: ignore[operator]
        rows.append(Check(sc.name, concurrency, "ttft_s", e, got, _rel_err_pct(got, e), tol,
                          lo_ok and med_excess <= TTFT_SLACK_S, n,
                          worst_error_pct=_rel_err_pct(e + worst_excess, e)))
        rows.append(Check(sc.name, concurrency, "ttft_excess_ms", 0.0, med_excess * 1e3, None,
                          f"worst {worst_excess * 1e3:.2f} ms", True, n))
    rel("prefill_tok_s", prefill, rate_tol)
    rel("decode_tok_s", decode, rate_tol)
    rel("tpot_s", tpot, rate_tol)
    rel("itl_p50_s", itl50, rate_tol)
    # ITL p99 is a tail: the client's stamping jitter on top of the server's, within 2 ms
    if not itl99 or any(m is None for m, _ in itl99):
        rows.append(Check(sc.name, concurrency, "itl_p99_s", cfg.gap_s, "missing", None, "", False, n))
    else:
        e, got, med, worst = _median_pair(itl99, lambda m_, e_: m_ - e_)  # type: ignore[arg-type]
        rows.append(Check(sc.name, concurrency, "itl_p99_s", e, got, _rel_err_pct(got, e),
                          f"+-{TTFT_SLACK_S * 1e3:.2f} ms", abs(med) <= TTFT_SLACK_S, n,
                          worst_error_pct=_rel_err_pct(e + worst, e)))
    exact("completion_tokens", ctoks)
    exact("prompt_tokens", ptoks)
    exact("token_source", tsrc)
    exact("prompt_token_source", psrc)
    if chunks:
        exact("server_chunks", chunks)
    info_ms("server_late_ms", server_late)
    info_ms("request_delay_ms", request_delay)

    # aggregate throughput per batch: sum n / (latest last token - first send); the
    # expected window ends at the server's last content write of the batch
    agg: list[tuple[float | None, float]] = []
    spreads: list[float] = []
    for b in batches:
        sent = [r.t_sent_s or 0.0 for r in b]
        spreads.append(max(sent) - min(sent))
        if all(id(r) in last_emit for r in b):
            end = max(last_emit[id(r)] for r in b)
            agg.append((aggregate_throughput([r.events for r in b]).tok_s, len(b) * sc.max_tokens / (end - min(sent))))
    rel("aggregate_tok_s", agg, rate_tol)
    rows.append(Check(sc.name, concurrency, "send_spread_s", 0.0, max(spreads), None, "info", True, n))
    return rows


async def fetch_traces(base_url: str) -> dict[str, EmitTrace]:
    """The reference server's emission traces since the last fetch (see :class:`EmitTrace`).

    Empty where the two clocks are not the same one (then every request is
    compared with the model's schedule): the server stamps with
    ``time.monotonic()``, the client with ``time.perf_counter()``.
    """
    if time.get_clock_info("perf_counter").implementation != time.get_clock_info("monotonic").implementation:
        return {}
    async with httpx.AsyncClient(timeout=10.0) as hc:
        resp = await hc.get(base_url + "/ref/traces")
        resp.raise_for_status()
        return {k: EmitTrace.from_dict(v) for k, v in resp.json().items()}


async def measure_wake_lateness(n_short: int = 40, short_s: float = 0.005, n_long: int = 4,
                                long_s: float = 0.25) -> float:
    """Worst lateness of the reference server's timer (:class:`PreciseWaker`) here, in seconds.

    A virtual machine or a busy host wakes sleeping threads late, most after a
    long idle sleep (a TTFT wait is one). Reported beside the checks, as the
    machine's figure; the checks take the server's lateness from its traces.
    Short waits (a decode gap) and long ones (a TTFT) are both sampled; the
    maximum is returned.
    """
    loop = asyncio.get_running_loop()
    waker = PreciseWaker(loop)
    late: list[float] = []
    try:
        for period in [short_s] * n_short + [long_s] * n_long:
            target = loop.time() + period
            await waker.sleep_until(target)
            late.append(loop.time() - target)
    finally:
        waker.close()
    return max(max(late), 0.0)


async def run_selftest_async(concurrency_levels: Sequence[int] = (1, 16), *, repeats: int = 3,
                             scenarios: Sequence[Scenario] = DEFAULT_SCENARIOS, base: RefConfig = BASE_TIMING,
                             capacity_concurrency: int | None = 64, server: str = "process",
                             stagger_words: int = 4, retries: int = 2,
                             starved_lag_ms: float = 2.0,
                             contended_psi_pct: float = CONTENDED_PSI_PCT,
                             capacity_workers: Sequence[int] = (0, 1, 2)) -> SelfTestReport:
    """The self-test inside a running event loop. ``server``: ``"process"`` or ``"inprocess"``.

    Request ``i`` of a batch has ``stagger_words * i`` more prompt words, so
    first tokens of a batch arrive ``stagger_words * b`` apart (4 ms with the
    default timing) instead of all at once. With identical prompts the client
    would stamp N simultaneous first tokens one after another, the last about
    N x its per-event cost late (see the capacity figures); staggering keeps
    that client limit out of a check of the arithmetic, and exercises the
    prefill closed form at several prompt lengths. Scenarios marked
    ``lockstep`` send identical prompts on purpose: they check that N streams
    emitting together keep their per-gap ITL.

    A cell (scenario x concurrency) that fails is run again, up to ``retries``
    times (a wrong closed form or definition fails every attempt; a scheduling
    hiccup of a shared machine does not); if its last attempt still fails while
    the CPU was contended, it is listed in ``starved_cells``. Contended = Linux CPU pressure
    (``/proc/pressure/cpu`` "some": the share of wall time in which a runnable
    task waited for a CPU) above ``contended_psi_pct`` during the cell; where
    PSI is missing, the client's loop-lag p99 above ``starved_lag_ms``. Both are
    measured independently of the errors they excuse. The ``attempts``,
    ``cpu_pressure_pct`` and ``loop_lag_p99_ms`` rows say what happened.
    """
    t_start = time.perf_counter()
    rows: list[Check] = []
    lag_p99: dict[int, float] = {}
    statuses: dict[str, int] = {}
    starved: list[tuple[str, int]] = []
    wake_p99_s = await measure_wake_lateness()
    srv: RefServer | RefServerProcess = RefServerProcess(base) if server == "process" else RefServer(base)
    async with srv:
        for c in concurrency_levels:
            timeouts = ClientTimeouts(connect_s=5.0, read_s=10.0, request_s=30.0)
            async with BenchClient(srv.base_url, concurrency=c, timeouts=timeouts) as client:
                await client.warm_up(RequestSpec("completions", "refserver", 2, prompt="warm",
                                                 extra_body={"ref": {"ttft_base_s": 0.0, "gap_s": 0.0}}))
                lags: list[float] = []
                for sc in scenarios:
                    if sc.lockstep and c == 1:
                        continue  # one stream: the same as its staggered twin
                    step = 0 if sc.lockstep else stagger_words
                    specs = [_spec(sc, base, sc.prompt_words + i * step) for i in range(c)]
                    for attempt in range(1, retries + 2):
                        psi0, t0 = cpu_pressure_total_s(), time.perf_counter()
                        async with LoopLagProbe() as lag:
                            batches = [await client.run_batch(specs) for _ in range(repeats)]
                        traces = await fetch_traces(srv.base_url)
                        psi1, t1 = cpu_pressure_total_s(), time.perf_counter()
                        lags += lag.samples_s
                        cell = check_cell(sc, base, c, batches, traces)
                        cell_lag_ms = (percentile(lag.samples_s, 99.0) or 0.0) * 1e3
                        psi_pct = None if psi0 is None or psi1 is None else (psi1 - psi0) / (t1 - t0) * 100.0
                        contended = psi_pct > contended_psi_pct if psi_pct is not None \
                            else cell_lag_ms > starved_lag_ms
                        # a failed cell is run again: a formula error fails every attempt,
                        # a moment when the scheduler ran something else does not
                        if all(r.passed for r in cell) or attempt > retries:
                            break
                    for b in batches:
                        for r in b:
                            statuses[r.status] = statuses.get(r.status, 0) + 1
                    n = cell[0].n_requests
                    if not all(r.passed for r in cell) and contended:
                        starved.append((sc.name, c))
                    rows += cell
                    rows.append(Check(sc.name, c, "cpu_pressure_pct", contended_psi_pct,
                                      "n/a" if psi_pct is None else psi_pct, None, "info", True, n))
                    rows.append(Check(sc.name, c, "loop_lag_p99_ms", starved_lag_ms, cell_lag_ms, None, "info",
                                      True, n))
                    rows.append(Check(sc.name, c, "attempts", 1.0, float(attempt), None, "info", True, n))
                lag_p99[c] = (percentile(lags, 99.0) or 0.0) * 1e3
        server_pids = [srv.pid] if isinstance(srv, RefServerProcess) and srv.pid else []
        caps = tuple([await measure_client_capacity(srv.base_url, concurrency=capacity_concurrency, workers=w,
                                                    server_pids=server_pids, contended_psi_pct=contended_psi_pct)
                      for w in capacity_workers] if capacity_concurrency else [])
    return SelfTestReport(
        ok=all(r.passed for r in rows),
        checks=tuple(rows),
        capacity=caps[0] if caps else None,
        capacities=caps,
        loop_lag_p99_ms=lag_p99,
        server=server,
        duration_s=time.perf_counter() - t_start,
        statuses=statuses,
        starved_cells=tuple(starved),
        wake_lateness_max_ms=wake_p99_s * 1e3,
    )


def run_selftest(concurrency_levels: Sequence[int] = (1, 16), **kwargs: Any) -> SelfTestReport:
    """Run the self-test on a fresh event loop (see :func:`run_selftest_async` for options)."""
    return asyncio.run(run_selftest_async(concurrency_levels, **kwargs))


def format_report(report: SelfTestReport) -> str:
    """A plain-text table of the report (pure; the caller prints it)."""

    def fmt(v: float | str) -> str:
        return v if isinstance(v, str) else f"{v:.6g}"

    lines = [f"selftest: {'OK' if report.ok else 'FAILED'} ({report.duration_s:.1f} s, server {report.server})"
             + (f"; failed while the CPU was contended: {list(report.starved_cells)}" if report.starved_cells else ""),
             "timed rows: the median request of the cell; 'worst%' = the worst request (shown, not judged)",
             f"{'config':<22} {'c':>3} {'metric':<20} {'expected':>12} {'measured':>12} {'err%':>8} {'worst%':>8}"
             "  tol            pass"]
    for r in report.checks:
        err = "" if r.error_pct is None else f"{r.error_pct:+.3f}"
        worst = "" if r.worst_error_pct is None else f"{r.worst_error_pct:+.3f}"
        lines.append(f"{r.config:<22} {r.concurrency:>3} {r.metric:<20} {fmt(r.expected):>12} {fmt(r.measured):>12} "
                     f"{err:>8} {worst:>8}  {r.tolerance:<14} {'yes' if r.passed else 'NO'}")
    lines.append(f"timer wake lateness max on this machine (info; the server's own is server_late_ms): "
                 f"{report.wake_lateness_max_ms:.3f} ms")
    for c, lag in report.loop_lag_p99_ms.items():
        lines.append(f"loop lag p99 during c={c}: {lag:.3f} ms")
    for k in report.capacities or ((report.capacity,) if report.capacity else ()):
        offered = f"{k.offered_events_per_s:,.0f}" if k.offered_events_per_s else "unpaced"
        who = f"{k.workers} worker process{'es' if k.workers > 1 else ''}" if k.workers else "in-process, one loop"
        p = k.pressure
        psi = "" if p is None else (f"; CPU pressure {'n/a' if p.psi_some_pct is None else f'{p.psi_some_pct:.0f}%'}"
                                    + ("" if p.other_cores is None else f", others' CPU {p.other_cores:.2f} cores"))
        figure = "CPU-STARVED, no figure (measured " if k.starved else ""
        lines.append(f"client capacity at c={k.concurrency} ({who}): {figure}{k.events_per_s:,.0f} events/s"
                     f"{')' if k.starved else ''} "
                     f"({k.n_events} events in {k.window_s:.2f} s, offered {offered}/s); "
                     f"loop lag p50 {k.loop_lag_p50_ms:.2f} ms, p99 {k.loop_lag_p99_ms:.2f} ms, "
                     f"max {k.loop_lag_max_ms:.2f} ms{psi}; statuses {dict(k.statuses)}")
    return "\n".join(lines)
