"""Run bench suites against an OpenAI-compatible endpoint and write a run directory.

Owns: the order of a run (preflight, then each suite with the telemetry
sampler beside it), sending the plans of :mod:`sparkctl.bench.workloads`
through :class:`~sparkctl.bench.client.BenchClient`, turning event logs into
result rows with :mod:`sparkctl.bench.metrics`, and writing ``results.csv``,
``events.jsonl``, ``telemetry.csv`` and ``run.json``
(:mod:`sparkctl.bench.results`). The suites beyond plain points live in
:mod:`sparkctl.bench.suites`, what fits the context window in
:mod:`sparkctl.bench.fitting` (a point, a soak kind or an agent turn that would
not fit is not sent: docs/bench-metrics.md, "The context window"), the rows in
:mod:`sparkctl.bench.rows` and the sampler in :mod:`sparkctl.bench.telemetry`.

Must not: print (``progress`` is a callback), reach a cluster (the endpoint,
the configuration and the telemetry hook are handed in), or decide exit codes.

The configuration is a plain dict filled by the caller from the profile and
the cluster check; every key of :data:`~sparkctl.bench.results.CONFIG_COLUMNS`
goes into every CSV row, and the whole dict into ``run.json``. Keys read here:
``engine`` (sampling extras), ``bench`` (the profile's defaults) and
``thinking`` (``request_fields``, ``default_on``).

Telemetry hook: ``async def telemetry() -> Mapping[str, Mapping[str, Any]]``
returning ``{node: {"power_w", "sm_mhz", "temp_c", "event_reasons",
"mem_available_gib"}}`` (any value may be None). It is called every
``telemetry_interval_s`` (1 s) while a suite runs, plus once at the start and
the end of each suite; a call that raises is counted and skipped.
"""

from __future__ import annotations

import asyncio
import json
import platform
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from sparkctl import __version__
from sparkctl.bench import workloads as wl
from sparkctl.bench.client import BenchClient, RequestSpec, new_salt
from sparkctl.bench.events import RequestResult, result_to_jsonl
from sparkctl.bench.fitting import AgentFit
from sparkctl.bench.metrics import request_metrics
from sparkctl.bench.options import RunOptions
from sparkctl.bench.pool import PooledBenchClient, WorkerPool, default_workers
from sparkctl.bench.results import (
    CSV_COLUMNS,
    SCHEMA_VERSION,
    TELEMETRY_COLUMNS,
    csv_text,
    write_atomic,
)
from sparkctl.bench.rows import (
    build_row,
    point_metrics,
    run_label,
    summarize_rows,
    usage_cached_tokens,
    utc,
)
from sparkctl.bench.servermetrics import ServerMetrics
from sparkctl.bench.suites import Suites
from sparkctl.bench.telemetry import Telemetry, TelemetrySampler, telemetry_summary
from sparkctl.errors import ConfigError, TransportError

__all__ = ["KNOWN_ENGINES", "RunSummary", "Runner", "run", "run_async"]

Progress = Callable[[str], None]

# From this many streams released together, a point's client runs one event loop
# per core (issue 23: one loop's stamps went 17 ms stale at 256 streams).
POOL_MIN_STREAMS = 64

KNOWN_ENGINES = ("ds41f", "tensorfold", "vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class RunSummary:
    """What a run produced (also in ``run.json``)."""

    out_dir: str
    n_rows: int
    n_requests: int
    n_errors: int
    points: tuple[dict[str, Any], ...]
    telemetry: dict[str, Any]
    record_grade: bool | None
    record_problems: tuple[str, ...]
    duration_s: float



class Runner(Suites):  # and so ContextFit
    """One run: an endpoint, a model, a configuration, an output directory."""

    def __init__(self, base_url: str, model: str, out_dir: Path, config: Mapping[str, Any], options: RunOptions,
                 telemetry: Telemetry | None = None, progress: Progress | None = None,
                 api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        # sent as Authorization: Bearer on every request; kept out of config, rows and the summary
        self._api_key = api_key
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.out = out_dir
        self.config: dict[str, Any] = dict(config)
        self.opt = options
        self.progress = progress or (lambda _m: None)
        self.t0 = time.perf_counter()
        self.sampler = TelemetrySampler(telemetry, options.telemetry_interval_s, self.t0)
        self.rows: list[dict[str, Any]] = []
        self.n_requests = 0
        self.n_errors = 0
        self.tokens_by_suite: dict[str, list[int]] = {}
        self._events_fh: Any = None
        self._suite = ""
        self._probe_http: httpx.AsyncClient | None = None
        self._token_scale: wl.TokenScale | None = None
        self._fixed: dict[Any, int] = {}       # probed engine tokens of a prompt's fixed part, by prompt
        self._agent_fit: dict[str, AgentFit] = {}
        self.n_fit_probes = 0
        self.server: ServerMetrics | None = None   # --server-metrics: the engine's own histograms
        self.run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        bench = self.config.get("bench") or {}
        self.repeats = wl.repeats_for(options.repeats, options.record, bench.get("repeats"))
        self.decode_tokens = options.decode_tokens or bench.get("decode_tokens") or wl.DEFAULT_DECODE_TOKENS
        self.lengths = tuple(options.lengths or bench.get("prefill_lengths_tokens") or wl.DEFAULT_PREFILL_LENGTHS)
        self.levels = tuple(options.concurrency or bench.get("concurrency") or wl.DEFAULT_CONCURRENCY)

    # -- plumbing -------------------------------------------------------------------
    @property
    def engine(self) -> str | None:
        e = self.config.get("engine")
        return str(e) if e else None

    def _spec(self, messages: Sequence[Mapping[str, str]], max_tokens: int, extra: Mapping[str, Any],
              labels: Mapping[str, str], keep_text: bool = False) -> RequestSpec:
        return RequestSpec("chat", self.model, max_tokens, messages=tuple(messages), temperature=wl.TEMPERATURE,
                           seed=wl.SEED, salt=False, extra_body=dict(extra), labels=dict(labels),
                           keep_text=keep_text)

    def _ask_spec(self, ask: wl.Ask, salt: str, labels: Mapping[str, str]) -> RequestSpec:
        return self._spec(wl.render_messages(ask.prompt, salt), ask.max_tokens, ask.extra_body,
                          {**labels, "salt": salt.strip()}, ask.keep_text)

    def _log(self, results: Sequence[RequestResult], counted: bool = True) -> None:
        for r in results:
            self._events_fh.write(result_to_jsonl(r, self.t0))
            if counted:
                self.n_requests += 1
                self.n_errors += not r.ok
            m = request_metrics(r.events)
            if self.server is not None:
                self.server.observe_client(m.ttft_s, m.itl_s, counted)
            tok = self.tokens_by_suite.setdefault(self._suite, [0, 0])
            tok[0] += m.completion_tokens or 0
            tok[1] += max(0, (m.prompt_tokens or 0) - (usage_cached_tokens(r.events) or 0))
        self._events_fh.flush()

    def _row(self, suite: str, point: str, params: Mapping[str, Any], repeat: int, results: Sequence[RequestResult],
             t_start: str, metrics: Mapping[str, Any], flags: Sequence[str] = (), salt: str = "") -> dict[str, Any]:
        row = build_row(run_id=self.run_id, label=run_label(self.opt.label, self.config, self.model),
                        config=self.config, model=self.model, base_url=self.base_url, suite=suite, point=point,
                        params=params, repeat=repeat, results=results, t_start=t_start, metrics=metrics,
                        flags=flags, salt=salt)
        self.rows.append(row)
        return row


    async def _batch_client(self, concurrency: int) -> BenchClient | PooledBenchClient:
        """The client of released-together batches: one event loop per core from
        ``POOL_MIN_STREAMS`` streams (``client_workers``). One batch at a time: the
        suites that send requests concurrently one by one keep :meth:`_client`."""
        workers = self.opt.client_workers
        if workers is None:  # auto: one event loop per core once one loop would fall behind
            workers = default_workers() if concurrency >= POOL_MIN_STREAMS else 1
        if workers <= 1 or urllib.parse.urlsplit(self.base_url).scheme != "http":
            return await self._client(concurrency)
        pool = WorkerPool(self.base_url, concurrency=concurrency, workers=workers, timeouts=self.opt.timeouts,
                          api_key=self._api_key)
        await pool.start()
        c = PooledBenchClient(pool)
        warm = self._spec([{"role": "user", "content": new_salt() + "Say OK."}], 1, {}, {"warmup": "1"})
        self._log(await c.warm_up(warm), counted=False)
        return c

    async def _client(self, concurrency: int) -> BenchClient:
        c = BenchClient(self.base_url, concurrency=concurrency, timeouts=self.opt.timeouts, api_key=self._api_key)
        warm = self._spec([{"role": "user", "content": new_salt() + "Say OK."}], 1, {}, {"warmup": "1"})
        self._log(await c.warm_up(warm), counted=False)
        return c

    # -- preflight ------------------------------------------------------------------
    async def preflight(self) -> None:
        """The endpoint answers and serves the model; fill engine facts the config lacks."""
        async with httpx.AsyncClient(timeout=self.opt.timeouts.connect_s + 10, trust_env=False,
                                     headers=self._auth) as h:
            try:
                r = await h.get(self.base_url + "/v1/models")
            except httpx.HTTPError as exc:
                raise TransportError(f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}",
                                     hint="is the engine up? `sparkctl status`, or check --base-url") from None
            if r.status_code == 401:
                raise TransportError(f"{self.base_url}/v1/models answered HTTP 401: the endpoint wants a key"
                                     + (" and refused the one sent" if self._api_key else ""),
                                     hint="serve.api_key_env names the operator's variable that holds it; "
                                          "set it (or give --api-key-env with --base-url)")
            if r.status_code != 200:
                raise TransportError(f"{self.base_url}/v1/models answered HTTP {r.status_code}")
            try:
                data = r.json().get("data") or []
            except ValueError:
                raise TransportError(f"{self.base_url}/v1/models did not answer JSON") from None
            ids = [d.get("id") for d in data if isinstance(d, dict)]
            if self.model not in ids:
                raise ConfigError(f"{self.base_url} does not serve model {self.model!r}",
                                  hint=f"served: {', '.join(map(str, ids)) or 'nothing'}")
            entry = next((d for d in data if isinstance(d, dict) and d.get("id") == self.model), None)
            owner = (entry or {}).get("owned_by")
            props: dict[str, Any] | None = None
            llama = "llamacpp" in (self.config.get("engine"), owner)
            served_by_models = wl.context_window(entry, None, None)[1] in (
                "/v1/models max_model_len", "/v1/models context_length")
            if llama or not served_by_models:
                try:  # llama.cpp's server: the per-slot window (its /v1/models has only the training length)
                    pr = await h.get(self.base_url + "/props")
                    props = pr.json() if pr.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    props = None
            argv = self.config.get("engine_argv")
            slot = wl.llama_server_slot_ctx(argv) if llama and isinstance(argv, (list, tuple)) else None
            window, source = wl.context_window(entry, props if isinstance(props, dict) else None,
                                               self.config.get("context_len_tokens"), slot)
            self.config["context_window_tokens"], self.config["context_window_source"] = window, source
            if not self.config.get("engine") and owner in KNOWN_ENGINES:
                self.config["engine"] = owner
                self.config.setdefault("discovered", []).append("engine")
            if not self.config.get("engine_version"):
                try:
                    v = await h.get(self.base_url + "/version")
                    if v.status_code == 200:
                        self.config["engine_version"] = v.json().get("version")
                        self.config.setdefault("discovered", []).append("engine_version")
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass

    # -- suites ---------------------------------------------------------------------
    async def run_points(self, points: Sequence[wl.Point]) -> None:
        """Single-request and released-together points (prefill, decode, concurrency, peak)."""
        clients: dict[int, BenchClient | PooledBenchClient] = {}
        try:
            for p in points:
                c = len(p.asks) if p.together else 1
                if c not in clients:
                    clients[c] = await (self._batch_client(c) if p.together else self._client(c))
                client = clients[c]
                self.progress(f"{p.name}: {p.repeats} repeats")
                if p.warm:
                    ask = p.asks[0]
                    self._log([await client.request(self._ask_spec(ask, new_salt(), {"warmup": "1"}))], False)
                for rep in range(1, p.repeats + 1):
                    t_start = utc()
                    labels = {"suite": p.suite, "point": p.name, "repeat": str(rep)}
                    specs = [self._ask_spec(a, new_salt(), labels) for a in p.asks]
                    if self.server is not None:  # a measured window: warm-ups and probes stay outside
                        await self.server.begin()
                    if p.together:
                        results = await client.run_batch(specs)
                    else:
                        results = [await client.request(s) for s in specs]
                    self._log(results)
                    if self.server is not None:
                        await self.server.end()
                    self._point_row(p, rep, results, t_start)
        finally:
            for client in clients.values():
                await client.aclose()


    def _point_row(self, p: wl.Point, rep: int, results: Sequence[RequestResult], t_start: str) -> None:
        metrics, flags = point_metrics(p, results)
        self._row(p.suite, p.name, p.params, rep, results, t_start, metrics, flags)


    async def suite_warm_prefix(self) -> None:
        n = self.opt.warm_prefix_tokens
        cold_p, warm_p = wl.warm_prefix_prompts(n)
        name = f"warm-prefix/{n}"
        params = {"length_tokens": n}
        # a prefix that does not fit is not shrunk: that would be another point (docs/bench-metrics.md)
        needs = [x for x in (await self._need(cold_p, 1), await self._need(warm_p, 1)) if x is not None]
        if self._over(max(needs, default=None)):
            self._not_run("warm-prefix", name, params, max(needs))
            return
        self.progress(f"{name}: {self.repeats} repeats")
        client = await self._client(1)
        try:
            for rep in range(1, self.repeats + 1):
                t_start = utc()
                salt = new_salt()  # shared by the pair: the warm request must find the cold one's prefix
                labels = {"suite": "warm-prefix", "point": name, "repeat": str(rep), "salt": salt.strip()}
                cold = await client.request(self._spec(wl.render_messages(cold_p, salt), 1, {}, {**labels, "phase": "cold"}))
                warm = await client.request(self._spec(wl.render_messages(warm_p, salt), 1, {}, {**labels, "phase": "warm"}))
                self._log([cold, warm])
                mc, mw = request_metrics(cold.events), request_metrics(warm.events)
                cc, cw = usage_cached_tokens(cold.events), usage_cached_tokens(warm.events)
                flags = [f"rejected:cold point read {cc} cached tokens"] if cc else []
                if not cw:
                    flags.append("warm:no cache hit reported")
                ratio = (mc.ttft_s / mw.ttft_s) if mc.ttft_s and mw.ttft_s else None
                self._row("warm-prefix", name, params, rep, [cold, warm], t_start, {
                    "prompt_tokens": mc.prompt_tokens, "cached_tokens": cw, "cold_cached_tokens": cc,
                    "cold_s": mc.ttft_s, "warm_s": mw.ttft_s, "cold_warm_ratio": ratio, "ttft_s": mc.ttft_s,
                    "prefill_tok_s": mc.prefill_tok_s,
                }, [f for f in flags if f.startswith("rejected")], salt=salt.strip())
                if not cw:
                    self.rows[-1]["flags"] = ";".join(filter(None, [self.rows[-1]["flags"], flags[-1]]))
        finally:
            await client.aclose()

    # -- the run --------------------------------------------------------------------
    def _plans(self, suite: str) -> list[wl.Point]:
        if suite == "prefill":
            return wl.prefill_plan(self.lengths, self.repeats)
        if suite == "decode":
            return wl.decode_plan(self.decode_tokens, self.repeats, self.engine)
        if suite == "concurrency":
            return wl.concurrency_plan(self.levels, self.decode_tokens, self.repeats, self.engine)
        if suite == "peak":
            return wl.peak_plan(self.decode_tokens, self.repeats, self.engine)
        raise AssertionError(suite)



    async def run(self) -> RunSummary:
        self.out.mkdir(parents=True, exist_ok=True)
        started = utc()
        await self.preflight()
        self.progress(f"{self.base_url} serves {self.model} ({self.config.get('engine') or 'engine unknown'}); "
                      f"{self.repeats} repeats per point; writing {self.out}")
        if self.opt.server_metrics:
            self.server = ServerMetrics(self.base_url, self.engine, self.model, self._auth)
            await self.server.probe()
            self.progress(f"server-side histograms: {', '.join(self.server.names.values())}" if self.server.available
                          else f"server-side histograms: none ({self.server.reason})")
        try:
            with (self.out / "events.jsonl").open("w") as fh:
                self._events_fh = fh
                for suite in self.opt.suites:
                    await self._run_suite(suite)
                    self._write_tables()
        finally:
            if self._probe_http is not None:
                await self._probe_http.aclose()
            if self.server is not None:
                await self.server.aclose()
        return self._finish(started)

    async def _run_suite(self, suite: str) -> None:
        self._suite = suite
        points = suite in ("prefill", "decode", "concurrency", "peak")
        srv, probes = self.server if self.server is not None and self.server.available else None, self.n_fit_probes
        if srv is not None:  # points: read around each measured repeat; the rest: around the suite
            srv.start_suite(suite, per_suite_window=not points)
            if not points:
                await srv.begin()
        await self.sampler.start(suite)
        try:
            if points:
                await self.run_points(await self._fitting(self._plans(suite)))
            else:
                await {"warm-prefix": self.suite_warm_prefix, "longctx": self.suite_longctx,
                       "quality": self.suite_quality, "agent": self.suite_agent,
                       "soak": self.suite_soak}[suite]()
        finally:
            await self.sampler.stop()
            if srv is not None and not points:
                srv.suites[suite].n_unmeasured += self.n_fit_probes - probes
                await srv.end()

    def _write_tables(self) -> None:
        write_atomic(self.out / "results.csv", csv_text(self.rows, CSV_COLUMNS))
        write_atomic(self.out / "telemetry.csv", csv_text(self.sampler.rows, TELEMETRY_COLUMNS))

    def _finish(self, started: str) -> RunSummary:
        self._write_tables()
        points = summarize_rows(self.rows)
        tele = telemetry_summary(self.sampler.rows, {k: (v[0], v[1]) for k, v in self.tokens_by_suite.items()})
        problems: list[str] = []
        if self.opt.record:
            if self.repeats < wl.RECORD_REPEATS:
                problems.append(f"{self.repeats} repeats (a record needs {wl.RECORD_REPEATS})")
            if self.n_errors:
                problems.append(f"{self.n_errors} failed requests")
            srcs = {r["token_source"] for r in self.rows if r.get("token_source")}
            if srcs - {"usage"}:
                problems.append(f"token counts not from usage: {sorted(srcs - {'usage'})}")
        summary = RunSummary(
            out_dir=str(self.out), n_rows=len(self.rows), n_requests=self.n_requests, n_errors=self.n_errors,
            points=tuple(points), telemetry=tele, record_grade=(not problems) if self.opt.record else None,
            record_problems=tuple(problems), duration_s=time.perf_counter() - self.t0,
        )
        opts = asdict(self.opt)
        meta = {
            "schema_version": SCHEMA_VERSION, "sparkctl_version": __version__, "run_id": self.run_id,
            "label": run_label(self.opt.label, self.config, self.model),
            "base_url": self.base_url, "model": self.model, "config": self.config, "options": opts,
            "effective": {"repeats": self.repeats, "decode_tokens": self.decode_tokens,
                          "lengths": list(self.lengths), "concurrency": list(self.levels)},
            "started_utc": started, "finished_utc": utc(), "python": platform.python_version(),
            "client_host": platform.node(), "telemetry_failures": self.sampler.failures,
            "summary": asdict(summary),
        }
        if self.server is not None:
            meta["server_metrics"] = self.server.record()
        write_atomic(self.out / "run.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        return summary




async def run_async(base_url: str, model: str, out_dir: str | Path, config: Mapping[str, Any],
                    options: RunOptions = RunOptions(), telemetry: Telemetry | None = None,
                    progress: Progress | None = None, api_key: str | None = None) -> RunSummary:
    """Run ``options.suites`` against ``base_url`` serving ``model``; write ``out_dir``.

    ``api_key``: the endpoint's key (Authorization: Bearer); never written anywhere."""
    return await Runner(base_url, model, Path(out_dir), config, options, telemetry, progress, api_key).run()


def run(base_url: str, model: str, out_dir: str | Path, config: Mapping[str, Any],
        options: RunOptions = RunOptions(), telemetry: Telemetry | None = None,
        progress: Progress | None = None, api_key: str | None = None) -> RunSummary:
    """:func:`run_async` on a fresh event loop."""
    return asyncio.run(run_async(base_url, model, out_dir, config, options, telemetry, progress, api_key))
