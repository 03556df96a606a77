"""Run bench suites against an OpenAI-compatible endpoint and write a run directory.

Owns: the order of a run (preflight, then each suite with the telemetry
sampler beside it), sending the plans of :mod:`sparkctl.bench.workloads`
through :class:`~sparkctl.bench.client.BenchClient`, turning event logs into
result rows with :mod:`sparkctl.bench.metrics`, and writing ``results.csv``,
``events.jsonl``, ``telemetry.csv`` and ``run.json``
(:mod:`sparkctl.bench.results`). When the context window is known, it also
decides what fits it: ``max_tokens: 1`` probes ask the engine's
``usage.prompt_tokens`` for each prompt's fixed part and the filler's rate, and
a point, a soak kind or an agent turn that would not fit is not sent
(docs/bench-metrics.md, "The context window").

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
import math
import platform
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from sparkctl import __version__
from sparkctl.bench import client as bc
from sparkctl.bench import quality as q
from sparkctl.bench import workloads as wl
from sparkctl.bench.client import BenchClient, ClientTimeouts, RequestSpec, new_salt
from sparkctl.bench.events import Event, RequestResult, result_to_jsonl
from sparkctl.bench.metrics import aggregate_throughput, request_metrics, summarize
from sparkctl.bench.results import (
    CSV_COLUMNS,
    HEADLINE,
    METRIC_COLUMNS,
    SCHEMA_VERSION,
    TELEMETRY_COLUMNS,
    csv_text,
    write_atomic,
)
from sparkctl.errors import ConfigError, TransportError

Telemetry = Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]]
Progress = Callable[[str], None]

KNOWN_ENGINES = ("ds41f", "tensorfold", "vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class RunOptions:
    """What to run. ``None`` = the profile's ``bench`` default, else the workloads default."""

    suites: tuple[str, ...] = wl.DEFAULT_SUITES
    repeats: int | None = None
    record: bool = False
    lengths: tuple[int, ...] | None = None          # prefill lengths (and the needle ladder's, for longctx)
    concurrency: tuple[int, ...] | None = None      # concurrency levels (and agent session counts)
    decode_tokens: int | None = None
    duration_s: float = 600.0                       # soak
    label: str | None = None
    agent_warmup_s: float = 10.0
    agent_measure_s: float = 60.0
    agent_cooldown_s: float = 30.0                  # the most an in-flight request may run after the window
    agent_corpora: tuple[str, ...] = ("draftable", "adversarial")
    needle_depths: tuple[float, ...] = wl.DEFAULT_NEEDLE_DEPTHS
    warm_prefix_tokens: int = wl.DEFAULT_WARM_PREFIX_TOKENS
    quality_concurrency: int = 8
    soak_concurrency: int = wl.DEFAULT_SOAK_CONCURRENCY
    soak_scale: float = 1.0                         # scales the soak mix's prompt lengths
    telemetry_interval_s: float = 1.0
    timeouts: ClientTimeouts = ClientTimeouts()

    def __post_init__(self) -> None:
        bad = [s for s in self.suites if s not in wl.SUITES]
        if bad:
            raise ConfigError(f"unknown suite {bad[0]!r}", hint=f"suites: {', '.join(wl.SUITES)}")
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError("--repeats must be >= 1")


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


def _utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def usage_cached_tokens(events: Sequence[Event]) -> int | None:
    """``cached_tokens`` of the last usage event that carried it."""
    vals = [e.cached_tokens for e in events if e.kind == "usage" and e.cached_tokens is not None]
    return vals[-1] if vals else None


# --------------------------------------------------------------------------- telemetry


class TelemetrySampler:
    """Samples the hook while a suite runs; keeps rows for telemetry.csv."""

    def __init__(self, hook: Telemetry | None, interval_s: float, t0: float) -> None:
        self.hook = hook
        self.interval_s = interval_s
        self.t0 = t0
        self.rows: list[dict[str, Any]] = []
        self.failures = 0
        self._suite = ""
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        if self.hook is None:
            return
        t = time.perf_counter()
        try:
            data = await self.hook()
        except Exception:  # noqa: BLE001 - a node that does not answer is a missing sample, not a failed run
            self.failures += 1
            return
        for node, d in sorted(data.items()):
            reasons = d.get("event_reasons")
            self.rows.append({
                "t_s": t - self.t0, "t_utc": _utc(), "suite": self._suite, "node": node,
                "power_w": d.get("power_w"), "sm_mhz": d.get("sm_mhz"), "temp_c": d.get("temp_c"),
                "event_reasons": ";".join(map(str, reasons)) if isinstance(reasons, (list, tuple)) else reasons,
                "mem_available_gib": d.get("mem_available_gib"),
            })

    async def _loop(self) -> None:
        nxt = time.perf_counter()
        while True:
            nxt += self.interval_s
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            await self.sample()

    async def start(self, suite: str) -> None:
        self._suite = suite
        if self.hook is None:
            return
        await self.sample()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            await self.sample()


def telemetry_summary(rows: Sequence[Mapping[str, Any]], tokens_by_suite: Mapping[str, tuple[int, int]]
                      ) -> dict[str, Any]:
    """Mean and peak W per node and suite, energy (trapezoid over samples) and J/token. Pure.

    ``tokens_by_suite``: suite -> (completion tokens, uncached prompt tokens) the suite processed.
    """
    out: dict[str, Any] = {}
    for suite in dict.fromkeys(r["suite"] for r in rows):
        per_node: dict[str, Any] = {}
        energy = 0.0
        for node in sorted({r["node"] for r in rows if r["suite"] == suite}):
            pts = [(float(r["t_s"]), float(r["power_w"])) for r in rows
                   if r["suite"] == suite and r["node"] == node and r.get("power_w") not in (None, "")]
            if not pts:
                continue
            e = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
            energy += e
            per_node[node] = {"mean_w": sum(p for _, p in pts) / len(pts), "peak_w": max(p for _, p in pts),
                              "energy_j": e, "samples": len(pts)}
        comp, prompt = tokens_by_suite.get(suite, (0, 0))
        out[suite] = {
            "nodes": per_node, "energy_j": energy,
            "j_per_completion_token": energy / comp if comp and per_node else None,
            "j_per_token": energy / (comp + prompt) if (comp + prompt) and per_node else None,
        }
    return out


# --------------------------------------------------------------------------- the runner


LONGCTX_ANSWER_TOKENS = 48  # room for the passphrase and a sentence around it


@dataclass(frozen=True)
class AgentFit:
    """Engine tokens of an agent corpus' fresh turns: the system message alone, and (system, user turn t)."""

    system_tokens: int
    fresh_tokens: tuple[int, ...]
    answer_tokens_per_word: float
    """The filler's rate, for an answer re-sent as history (its count out can differ from its count in)."""


class Runner:
    """One run: an endpoint, a model, a configuration, an output directory."""

    def __init__(self, base_url: str, model: str, out_dir: Path, config: Mapping[str, Any], options: RunOptions,
                 telemetry: Telemetry | None = None, progress: Progress | None = None) -> None:
        self.base_url = base_url.rstrip("/")
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
            tok = self.tokens_by_suite.setdefault(self._suite, [0, 0])
            tok[0] += m.completion_tokens or 0
            tok[1] += max(0, (m.prompt_tokens or 0) - (usage_cached_tokens(r.events) or 0))
        self._events_fh.flush()

    def _row(self, suite: str, point: str, params: Mapping[str, Any], repeat: int, results: Sequence[RequestResult],
             t_start: str, metrics: Mapping[str, Any], flags: Sequence[str] = (), salt: str = "") -> dict[str, Any]:
        per = [request_metrics(r.events) for r in results]
        srcs = {m.token_source for m in per if m.token_source}
        psrcs = {m.prompt_token_source for m in per if m.prompt_token_source}
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        n_err = sum(not r.ok for r in results)
        flags = list(flags) + ([f"errors:{n_err}"] if n_err else [])
        cfg = self.config
        row: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "sparkctl_version": __version__, "run_id": self.run_id,
            "label": self.opt.label or cfg.get("label") or cfg.get("profile") or cfg.get("engine") or self.model,
            "profile": cfg.get("profile"), "profile_digest": cfg.get("profile_digest"), "engine": cfg.get("engine"),
            "engine_version": cfg.get("engine_version"), "model": cfg.get("model") or self.model,
            "served_name": self.model, "base_url": self.base_url, "topology": cfg.get("topology"),
            "tp_size": cfg.get("tp_size"), "nodes": cfg.get("nodes"), "clock_cap_mhz": cfg.get("clock_cap_mhz"),
            "kernel": cfg.get("kernel"), "page_size_kib": cfg.get("page_size_kib"), "waivers": cfg.get("waivers"),
            "context_window_tokens": cfg.get("context_window_tokens"),
            "context_window_source": cfg.get("context_window_source"),
            "suite": suite, "point": point, "params": dict(params), "repeat": repeat,
            "salt": salt or ";".join(r.labels.get("salt", "") for r in results[:4]) + (";..." if len(results) > 4 else ""),
            "token_source": "usage" if srcs == {"usage"} else ("+".join(sorted(srcs)) or None),
            "prompt_token_source": "usage" if psrcs == {"usage"} else ("+".join(sorted(psrcs)) or None),
            "t_start_utc": t_start, "t_end_utc": _utc(), "n_requests": len(results),
            "n_ok": len(results) - n_err, "n_errors": n_err, "statuses": statuses,
            "valid": not flags, "flags": ";".join(flags),
        }
        for k in ("length_tokens", "concurrency", "decode_tokens", "corpus", "content", "thinking", "scenario",
                  "category", "depth_fraction"):
            row[k] = params.get(k)
        for k in METRIC_COLUMNS:
            row[k] = metrics.get(k)
        self.rows.append(row)
        return row

    async def _client(self, concurrency: int) -> BenchClient:
        c = BenchClient(self.base_url, concurrency=concurrency, timeouts=self.opt.timeouts)
        warm = self._spec([{"role": "user", "content": new_salt() + "Say OK."}], 1, {}, {"warmup": "1"})
        self._log(await c.warm_up(warm), counted=False)
        return c

    # -- preflight ------------------------------------------------------------------
    async def preflight(self) -> None:
        """The endpoint answers and serves the model; fill engine facts the config lacks."""
        async with httpx.AsyncClient(timeout=self.opt.timeouts.connect_s + 10, trust_env=False) as h:
            try:
                r = await h.get(self.base_url + "/v1/models")
            except httpx.HTTPError as exc:
                raise TransportError(f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}",
                                     hint="is the engine up? `sparkctl status`, or check --base-url") from None
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
            if not wl.context_window(entry, None, None)[0]:
                try:  # llama.cpp's server: the per-slot window
                    pr = await h.get(self.base_url + "/props")
                    props = pr.json() if pr.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    props = None
            window, source = wl.context_window(entry, props if isinstance(props, dict) else None,
                                               self.config.get("context_len_tokens"))
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
        clients: dict[int, BenchClient] = {}
        try:
            for p in points:
                c = len(p.asks) if p.together else 1
                if c not in clients:
                    clients[c] = await self._client(c)
                client = clients[c]
                self.progress(f"{p.name}: {p.repeats} repeats")
                if p.warm:
                    ask = p.asks[0]
                    self._log([await client.request(self._ask_spec(ask, new_salt(), {"warmup": "1"}))], False)
                for rep in range(1, p.repeats + 1):
                    t_start = _utc()
                    labels = {"suite": p.suite, "point": p.name, "repeat": str(rep)}
                    specs = [self._ask_spec(a, new_salt(), labels) for a in p.asks]
                    if p.together:
                        results = await client.run_batch(specs)
                    else:
                        results = [await client.request(s) for s in specs]
                    self._log(results)
                    self._point_row(p, rep, results, t_start)
        finally:
            for client in clients.values():
                await client.aclose()

    def _point_row(self, p: wl.Point, rep: int, results: Sequence[RequestResult], t_start: str) -> None:
        per = [request_metrics(r.events) for r in results]
        flags: list[str] = []
        is_short = [bool(a.expect_tokens and (m.completion_tokens or 0) < a.expect_tokens) for m, a in zip(per, p.asks)]
        if any(is_short):
            # the row is flagged (left out of the point's medians); inside it, the
            # per-stream figures below are over the full-length streams only
            flags.append(f"short:{sum(is_short)}")
        full = [m for m, s in zip(per, is_short) if not s]
        if p.suite == "prefill":
            cached = usage_cached_tokens(results[0].events)
            if cached:
                flags.append(f"cached:{cached}")
        if not p.together:
            m = per[0]
            metrics = {k: getattr(m, k) for k in ("prompt_tokens", "completion_tokens", "ttft_s", "prefill_tok_s",
                                                    "decode_tok_s", "tpot_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
                                                    "e2e_s")}
            metrics["cached_tokens"] = usage_cached_tokens(results[0].events)
            if p.suite != "prefill":
                metrics["prefill_tok_s"] = None  # with more than one token out, TTFT is not a prefill figure
        else:
            agg = aggregate_throughput([r.events for r in results])
            rates = summarize(m.decode_tok_s for m in full)
            ttfts = summarize(m.ttft_s for m in per)
            metrics = {
                "aggregate_tok_s": agg.tok_s, "window_s": agg.window_s, "completion_tokens": agg.completion_tokens,
                "prompt_tokens": sum(m.prompt_tokens or 0 for m in per),
                "decode_tok_s": rates.median, "stream_decode_median_tok_s": rates.median,
                "stream_decode_min_tok_s": rates.min, "stream_decode_max_tok_s": rates.max,
                "ttft_p50_s": ttfts.median, "ttft_max_s": ttfts.max, "ttft_s": ttfts.median,
                "itl_p50_s": summarize(m.itl_p50_s for m in full).median,
                "itl_p90_s": summarize(m.itl_p90_s for m in full).median,
                "itl_p99_s": summarize(m.itl_p99_s for m in full).max,
                "tpot_s": summarize(m.tpot_s for m in full).median,
            }
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
                t_start = _utc()
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

    async def suite_longctx(self) -> None:
        lengths = self.opt.lengths or wl.DEFAULT_LONGCTX_LENGTHS
        client = await self._client(1)
        try:
            for n, d, prompt in wl.longctx_prompts(lengths, self.opt.needle_depths):
                assert prompt.needle is not None
                name = f"longctx/{n}@{d:g}"
                params = {"length_tokens": n, "depth_fraction": d}
                need = await self._need(prompt, LONGCTX_ANSWER_TOKENS)
                if self._over(need):
                    assert need is not None
                    self._not_run("longctx", name, params, need)
                    continue
                self.progress(f"{name}: {self.repeats} repeats")
                for rep in range(1, self.repeats + 1):
                    t_start = _utc()
                    salt = new_salt()
                    labels = {"suite": "longctx", "point": name, "repeat": str(rep), "salt": salt.strip()}
                    probe = await client.request(self._spec(wl.needle_prefix_messages(prompt, salt), 1, {},
                                                            {**labels, "phase": "depth"}))
                    full = await client.request(self._spec(wl.render_messages(prompt, salt), LONGCTX_ANSWER_TOKENS, {},
                                                           {**labels, "phase": "ask"}, keep_text=True))
                    self._log([probe, full])
                    mp, mf = request_metrics(probe.events), request_metrics(full.events)
                    found = wl.needle_found(full.text, prompt.needle) if full.ok else None
                    self._row("longctx", name, params, rep, [probe, full], t_start, {
                        "depth_tokens": mp.prompt_tokens, "prompt_tokens": mf.prompt_tokens,
                        "completion_tokens": mf.completion_tokens, "ttft_s": mf.ttft_s,
                        "cached_tokens": usage_cached_tokens(full.events), "found": found,
                    }, salt=salt.strip())
        finally:
            await client.aclose()

    async def suite_quality(self) -> None:
        th = self.config.get("thinking") or {}
        modes = wl.thinking_modes(th.get("request_fields"), bool(th.get("default_on")))
        conc = max(1, self.opt.quality_concurrency)
        client = await self._client(conc)
        sem = asyncio.Semaphore(conc)
        try:
            for mode, fields in modes:
                def max_tokens_of(s: q.Scenario, mode: str = mode) -> int:
                    return s.max_tokens if mode == "off" else max(s.max_tokens, 4096)

                scenarios = []
                for s in q.SCENARIOS:
                    need = await self._need(wl.Prompt(s.prompt), max_tokens_of(s))
                    if self._over(need):
                        assert need is not None
                        self._not_run("quality", f"quality/{mode}/{s.id}",
                                      {"thinking": mode, "scenario": s.id, "category": s.category}, need)
                    else:
                        scenarios.append(s)
                n_out = len(q.SCENARIOS) - len(scenarios)
                if not scenarios:
                    self._row("quality", f"quality/{mode}", {"thinking": mode}, 0, [], _utc(), {},
                              [f"not_run:exceeds_context_window:{len(q.SCENARIOS)} scenarios"])
                    continue
                self.progress(f"quality/{mode}: {len(scenarios)} scenarios x {self.repeats} repeats")
                for rep in range(1, self.repeats + 1):
                    t_start = _utc()

                    async def one(s: q.Scenario) -> RequestResult:
                        async with sem:
                            salt = new_salt()
                            labels = {"suite": "quality", "point": f"quality/{mode}/{s.id}", "repeat": str(rep),
                                      "salt": salt.strip()}
                            msgs = wl.render_messages(wl.Prompt(s.prompt), salt)
                            return await client.request(self._spec(msgs, max_tokens_of(s), fields, labels,
                                                                   keep_text=True))

                    results = await asyncio.gather(*(one(s) for s in scenarios))
                    self._log(results)
                    passed = 0
                    for s, r in zip(scenarios, results):
                        sc = q.score(s.id, r.text) if r.ok else q.Score(False, f"request {r.status}")
                        passed += sc.passed
                        m = request_metrics(r.events)
                        self._row("quality", f"quality/{mode}/{s.id}",
                                  {"thinking": mode, "scenario": s.id, "category": s.category}, rep, [r], t_start,
                                  {"score": 1.0 if sc.passed else 0.0, "completion_tokens": m.completion_tokens,
                                   "e2e_s": m.e2e_s, "ttft_s": m.ttft_s},
                                  flags=[] if r.ok else [f"status:{r.status}"])
                        self.rows[-1]["flags"] = ";".join(filter(None, [self.rows[-1]["flags"], f"why:{sc.reason}"]))
                        self.rows[-1]["valid"] = r.ok
                    # the score is over the scenarios sent; with some left out it is flagged (not comparable)
                    self._row("quality", f"quality/{mode}", {"thinking": mode}, rep, results, t_start,
                              {"score": 100.0 * passed / len(scenarios)},
                              [f"not_run_scenarios:{n_out}"] if n_out else [])
        finally:
            await client.aclose()

    async def suite_agent(self) -> None:
        levels = self.opt.concurrency or wl.DEFAULT_AGENT_SESSIONS
        for corpus in self.opt.agent_corpora:
            fit = await self._agent_fit_for(corpus)
            for n in levels:
                name = f"agent/{corpus}/{n}"
                if fit is not None:
                    # every session cycles through all the corpus' turns: the longest must fit alone
                    need = max(fit.fresh_tokens) + wl.FIT_MARGIN_TOKENS + self.decode_tokens
                    if self._over(need):
                        self._not_run("agent", name, {"corpus": corpus, "concurrency": n}, need)
                        continue
                self.progress(f"{name}: {self.repeats} windows of {self.opt.agent_measure_s:g} s")
                for rep in range(1, self.repeats + 1):
                    await self._agent_window(corpus, n, name, rep, fit)

    async def _agent_window(self, corpus: str, n: int, name: str, rep: int, fit: AgentFit | None = None) -> None:
        o = self.opt
        stagger = min(0.5, o.agent_warmup_s / (n + 1))
        plans = wl.agent_sessions(corpus, n, max_tokens=self.decode_tokens, stagger_s=stagger)
        client = await self._client(n)
        t_start = _utc()
        t0 = time.perf_counter()
        w0, w1 = t0 + o.agent_warmup_s, t0 + o.agent_warmup_s + o.agent_measure_s
        results: list[RequestResult] = []
        window_resets = [0]   # conversations started over because the next turn would not fit (inside the window)

        async def session(plan: wl.SessionPlan) -> None:
            await asyncio.sleep(plan.start_offset_s)
            salt, history, turn = new_salt(), [], 0
            last_prompt, last_completion = 0, 0   # engine tokens of the last turn sent and its answer
            errors_in_row = 0
            while time.perf_counter() < w1:
                sent_est = 0
                if fit is not None:
                    fresh = fit.fresh_tokens[wl.agent_turn_index(plan, turn)]
                    sent_est = fresh
                    if history:
                        sent_est = wl.agent_next_prompt_tokens(last_prompt, last_completion, fit.system_tokens, fresh)
                        if self._over(sent_est + wl.FIT_MARGIN_TOKENS + plan.max_tokens):
                            salt, history, sent_est = new_salt(), [], fresh
                            window_resets[0] += w0 <= time.perf_counter() <= w1
                msgs = wl.agent_turn_messages(plan, salt, history, turn)
                labels = {"suite": "agent", "point": name, "repeat": str(rep), "session": str(plan.session),
                          "turn": str(turn), "salt": salt.strip()}
                r = await client.request(self._spec(msgs, plan.max_tokens, {}, labels, keep_text=True))
                results.append(r)
                turn += 1
                if not r.ok:
                    # the engine may have refused this very history: start over, after a pause that
                    # keeps a failing engine from being hammered by the closed loop
                    errors_in_row += 1
                    salt, history = new_salt(), []
                    await asyncio.sleep(min(wl.agent_backoff_s(errors_in_row), max(0.0, w1 - time.perf_counter())))
                    continue
                errors_in_row = 0
                m = request_metrics(r.events)
                last_prompt = m.prompt_tokens if m.prompt_token_source == "usage" and m.prompt_tokens else sent_est
                if fit is not None:
                    last_completion = max(m.completion_tokens or 0,
                                          math.ceil(wl.words(r.text or "") * fit.answer_tokens_per_word))
                history = [*history, msgs[-1], {"role": "assistant", "content": r.text or ""}]
                if wl.trim_history(history, plan.history_budget_tokens):
                    salt, history = new_salt(), []

        tasks = [asyncio.create_task(session(p)) for p in plans]
        try:
            await asyncio.wait(tasks, timeout=(w1 - time.perf_counter()) + o.agent_cooldown_s)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
        self._log(results)
        # tokens inside the window: each content chunk carries completion_tokens / n_chunks (usage)
        tokens = 0.0
        inside: list[Any] = []
        for r in results:
            m = request_metrics(r.events)
            chunks = [e for e in r.events if e.kind == "chunk" and e.n_text_chars > 0]
            if chunks and m.tokens_per_chunk:
                tokens += m.tokens_per_chunk * sum(w0 <= e.t_s <= w1 for e in chunks)
            if m.t_sent_s is not None and m.t_last_token_s is not None and w0 <= m.t_sent_s and m.t_last_token_s <= w1:
                inside.append(m)
        rates = summarize(m.decode_tok_s for m in inside)
        ttft = summarize(m.ttft_s for m in inside)
        measured = [r for r in results if r.t_sent_s is not None and w0 <= r.t_sent_s <= w1]
        flags = [] if inside else ["no request completed inside the window"]
        if window_resets[0]:
            # the history could not grow as the suite defines it: not comparable with a larger window
            flags.append(f"context_resets:{window_resets[0]}")
        self._row("agent", name, {"corpus": corpus, "concurrency": n}, rep, measured or results, t_start, {
            "aggregate_tok_s": tokens / (w1 - w0), "window_s": w1 - w0, "completion_tokens": round(tokens),
            "decode_tok_s": rates.median, "stream_decode_median_tok_s": rates.median,
            "stream_decode_min_tok_s": rates.min, "stream_decode_max_tok_s": rates.max,
            "ttft_p50_s": ttft.median, "ttft_max_s": ttft.max, "ttft_s": ttft.median,
            "requests_per_s": len(measured) / (w1 - w0), "context_resets": window_resets[0],
        }, flags=flags)

    async def suite_soak(self) -> None:
        o = self.opt
        dur = o.duration_s
        params = {"concurrency": o.soak_concurrency}
        mix: list[tuple[str, int, int]] = []
        left_out: list[str] = []
        needs: list[int] = []
        for k, entry in enumerate(wl.SOAK_MIX):
            kind, ask = wl.soak_ask(k, self.engine, o.soak_scale)
            need = await self._need(ask.prompt, ask.max_tokens)
            if self._over(need):
                assert need is not None
                needs.append(need)
                left_out.append(f"soak_mix_not_run:{kind}:{need}>{self.window}")
            else:
                mix.append(entry)
        if not mix:
            self._not_run("soak", "soak", params, min(needs))
            return
        self.progress(f"soak: {dur:g} s of mixed load ({', '.join(m[0] for m in mix)}) at {o.soak_concurrency} streams")
        client = await self._client(o.soak_concurrency)
        t_start = _utc()
        t0 = time.perf_counter()
        end = t0 + dur
        results: list[RequestResult] = []
        counter = iter(range(10**9))

        async def worker() -> None:
            while time.perf_counter() < end:
                i = next(counter)
                kind, ask = wl.soak_ask(i, self.engine, o.soak_scale, mix)
                r = await client.request(self._ask_spec(ask, new_salt(), {"suite": "soak", "point": "soak",
                                                                          "kind": kind, "i": str(i)}))
                results.append(r)

        try:
            await asyncio.gather(*(worker() for _ in range(o.soak_concurrency)))
        finally:
            await client.aclose()
        self._log(results)
        wall = time.perf_counter() - t0
        per = [request_metrics(r.events) for r in results]
        errors = sum(not r.ok for r in results)
        comp = sum(m.completion_tokens or 0 for m in per)
        self._row("soak", "soak", params, 1, results, t_start, {
            "completion_tokens": comp, "aggregate_tok_s": comp / wall if wall else None, "window_s": wall,
            "requests_per_s": len(results) / wall if wall else None,
            "error_rate": errors / len(results) if results else None,
            "ttft_p50_s": summarize(m.ttft_s for m in per).median, "ttft_max_s": summarize(m.ttft_s for m in per).max,
        }, left_out)
        # a soak is judged by its errors: the row stays valid (errors are the measurement),
        # unless part of the mix was left out (another load than the suite defines)
        self.rows[-1]["valid"] = bool(results) and not left_out

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

    @property
    def window(self) -> int | None:
        w = self.config.get("context_window_tokens")
        return w if isinstance(w, int) else None

    def _not_run(self, suite: str, point: str, params: Mapping[str, Any], need: int) -> None:
        """A row for a point that does not fit the context window: flagged, never silently dropped."""
        self.progress(f"{point}: not run, {need} tokens exceed the context window of {self.window}")
        self._row(suite, point, params, 0, [], _utc(), {},
                  [f"not_run:exceeds_context_window:{need}>{self.window}"])

    def _over(self, need: int | None) -> bool:
        return need is not None and self.window is not None and need > self.window

    async def _fitting(self, points: Sequence[wl.Point]) -> list[wl.Point]:
        """The points whose every ask fits the window; a flagged row for each of the others."""
        out: list[wl.Point] = []
        for p in points:
            needs = [n for n in [await self._need(a.prompt, a.max_tokens) for a in p.asks] if n is not None]
            need = max(needs, default=None)
            if self._over(need):
                assert need is not None
                self._not_run(p.suite, p.name, p.params, need)
            else:
                out.append(p)
        return out

    # -- fitting the context window ----------------------------------------------------
    async def _probe_tokens(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        """``usage.prompt_tokens`` of ``messages`` (one token out, not streamed), or None.

        Probes are not requests of any point: they are not counted, logged or timed.
        """
        if self._probe_http is None:
            t = self.opt.timeouts
            self._probe_http = httpx.AsyncClient(timeout=httpx.Timeout(t.read_s, connect=t.connect_s),
                                                 trust_env=False)
        body = {"model": self.model, "messages": list(messages), "max_tokens": 1, "temperature": wl.TEMPERATURE,
                "seed": wl.SEED, "stream": False}
        self.n_fit_probes += 1
        try:
            r = await self._probe_http.post(self.base_url + "/v1/chat/completions", json=body)
            n = (r.json().get("usage") or {}).get("prompt_tokens") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None  # a refused or dropped probe: the estimate falls back to the assumption
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    async def _fixed_tokens(self, key: Any, messages: Sequence[Mapping[str, str]]) -> int:
        """Engine tokens of ``messages`` (a prompt without filler), probed once per ``key``."""
        if key not in self._fixed:
            n = await self._probe_tokens(messages)
            self._fixed[key] = n if n is not None else wl.assumed_tokens(wl.sim_prompt_tokens(messages))
        return self._fixed[key]

    async def _scale(self) -> wl.TokenScale:
        """The filler's engine tokens per word: two probes, without and with ``k`` filler words."""
        if self._token_scale is None:
            salt = bc.new_salt()
            base = wl.Prompt(wl.PREFILL_INSTRUCTION)
            fixed = wl.sim_prompt_tokens(wl.render_messages(base, salt))
            # 1/8 of the window in words: fits up to 7 tokens per word, and from 4K windows
            # up covers the whole cycle of the source prose (about 190 words)
            k = max(16, min(512, (self.window or 4096) // 8))
            u0 = await self._probe_tokens(wl.render_messages(base, salt))
            u1 = await self._probe_tokens(wl.render_messages(replace(base, target_tokens=fixed + k), salt))
            if u0 is not None and u1 is not None and u1 > u0:
                self._token_scale = wl.TokenScale((u1 - u0) / k, f"usage probes: {k} filler words = {u1 - u0} tokens")
            else:
                self._token_scale = wl.TokenScale(wl.ASSUMED_TOKENS_PER_WORD, "assumed: the engine reported no usage")
            self.config["context_fit"] = {
                "filler_tokens_per_word": round(self._token_scale.filler_tokens_per_word, 4),
                "source": self._token_scale.source, "margin_fraction": wl.FIT_MARGIN_FRACTION,
                "margin_tokens": wl.FIT_MARGIN_TOKENS,
            }
        return self._token_scale

    async def _need(self, prompt: wl.Prompt, max_tokens: int) -> int | None:
        """Tokens ``prompt`` and ``max_tokens`` need in the window; None (and no probe) when it is unknown."""
        if self.window is None:
            return None
        scale = await self._scale()
        salt = bc.new_salt()
        b = wl.bare(prompt)
        fixed = await self._fixed_tokens(("prompt", replace(b, filler_offset=0)), wl.render_messages(b, salt))
        return scale.need(fixed, wl.filler_words(prompt, salt), max_tokens)

    async def _agent_fit_for(self, corpus: str) -> AgentFit | None:
        """Probed counts of ``corpus``' fresh turns; None when the window is unknown."""
        if self.window is None:
            return None
        if corpus not in self._agent_fit:
            salt = bc.new_salt()
            first = wl.agent_turn_messages(wl.SessionPlan(corpus, 0, 1, 0, 0.0), salt, [], 0)
            system = await self._fixed_tokens(("agent-system", corpus), first[:1])
            fresh = []
            for t in range(len(wl.CORPORA[corpus])):
                msgs = wl.agent_turn_messages(wl.SessionPlan(corpus, t, 1, 0, 0.0), salt, [], 0)
                fresh.append(await self._fixed_tokens(("agent", corpus, t), msgs))
            scale = await self._scale()
            self._agent_fit[corpus] = AgentFit(system, tuple(fresh), scale.filler_tokens_per_word)
        return self._agent_fit[corpus]

    async def run(self) -> RunSummary:
        self.out.mkdir(parents=True, exist_ok=True)
        started = _utc()
        await self.preflight()
        self.progress(f"{self.base_url} serves {self.model} ({self.config.get('engine') or 'engine unknown'}); "
                      f"{self.repeats} repeats per point; writing {self.out}")
        with (self.out / "events.jsonl").open("w") as fh:
            self._events_fh = fh
            for suite in self.opt.suites:
                self._suite = suite
                await self.sampler.start(suite)
                try:
                    if suite in ("prefill", "decode", "concurrency", "peak"):
                        await self.run_points(await self._fitting(self._plans(suite)))
                    else:
                        await {"warm-prefix": self.suite_warm_prefix, "longctx": self.suite_longctx,
                               "quality": self.suite_quality, "agent": self.suite_agent,
                               "soak": self.suite_soak}[suite]()
                finally:
                    await self.sampler.stop()
                self._write_tables()
        if self._probe_http is not None:
            await self._probe_http.aclose()
        return self._finish(started)

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
            "label": self.opt.label or self.config.get("label") or self.config.get("profile")
            or self.config.get("engine") or self.model,
            "base_url": self.base_url, "model": self.model, "config": self.config, "options": opts,
            "effective": {"repeats": self.repeats, "decode_tokens": self.decode_tokens,
                          "lengths": list(self.lengths), "concurrency": list(self.levels)},
            "started_utc": started, "finished_utc": _utc(), "python": platform.python_version(),
            "client_host": platform.node(), "telemetry_failures": self.sampler.failures,
            "summary": asdict(summary),
        }
        write_atomic(self.out / "run.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        return summary


def summarize_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Median/min/max over the valid repeats of every (suite, point) and metric. Pure."""
    out: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((r["suite"], r["point"]) for r in rows))
    for suite, point in keys:
        mine = [r for r in rows if r["suite"] == suite and r["point"] == point]
        valid = [r for r in mine if r.get("valid") in (True, "1", 1)]
        entry: dict[str, Any] = {"suite": suite, "point": point, "params": mine[0].get("params"),
                                 "repeats": len(mine), "valid_repeats": len(valid),
                                 "flags": sorted({f for r in mine for f in str(r.get("flags") or "").split(";") if f}),
                                 "headline": HEADLINE.get(suite), "metrics": {}}
        for k in METRIC_COLUMNS:
            vals = [_num(r.get(k)) for r in valid]
            s = summarize(vals)
            if s.n:
                entry["metrics"][k] = {"n": s.n, "median": s.median, "min": s.min, "max": s.max}
        out.append(entry)
    return out


def _num(v: Any) -> float | None:
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


async def run_async(base_url: str, model: str, out_dir: str | Path, config: Mapping[str, Any],
                    options: RunOptions = RunOptions(), telemetry: Telemetry | None = None,
                    progress: Progress | None = None) -> RunSummary:
    """Run ``options.suites`` against ``base_url`` serving ``model``; write ``out_dir``."""
    return await Runner(base_url, model, Path(out_dir), config, options, telemetry, progress).run()


def run(base_url: str, model: str, out_dir: str | Path, config: Mapping[str, Any],
        options: RunOptions = RunOptions(), telemetry: Telemetry | None = None,
        progress: Progress | None = None) -> RunSummary:
    """:func:`run_async` on a fresh event loop."""
    return asyncio.run(run_async(base_url, model, out_dir, config, options, telemetry, progress))
