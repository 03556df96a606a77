"""The bench suites that are more than a list of points: longctx, quality, agent and soak.

Owns: how each of these suites sends its requests (the needle probe and
question of longctx, the quality scenarios scored by rule with thinking off
and on, the closed-loop agent sessions inside a measurement window, the soak's
mixed load) and the rows each produces. Their prompts and plans come from
:mod:`sparkctl.bench.workloads`; what fits the window from
:mod:`sparkctl.bench.fitting`.

A mixin of :class:`sparkctl.bench.runner.Runner` over the context-window half
(:class:`~sparkctl.bench.fitting.ContextFit`): it uses the runner's ``_client``,
``_spec``, ``_ask_spec``, ``_log``, ``_row``, ``rows``, ``repeats``,
``decode_tokens`` and ``engine`` (declared below for the type checker).

Must not: print (``progress`` is a callback) or write files.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparkctl.bench import quality as q
from sparkctl.bench import workloads as wl
from sparkctl.bench.client import new_salt
from sparkctl.bench.events import RequestResult
from sparkctl.bench.fitting import AgentFit, ContextFit
from sparkctl.bench.metrics import request_metrics, summarize
from sparkctl.bench.rows import usage_cached_tokens, utc

if TYPE_CHECKING:
    from sparkctl.bench.client import BenchClient, RequestSpec
    from sparkctl.bench.options import RunOptions

LONGCTX_ANSWER_TOKENS = 48  # room for the passphrase and a sentence around it


class Suites(ContextFit):
    """longctx, quality, agent and soak (see the module docstring for what they use of the runner)."""

    opt: RunOptions
    rows: list[dict[str, Any]]
    repeats: int
    decode_tokens: int

    if TYPE_CHECKING:  # the runner's (sparkctl.bench.runner.Runner)
        @property
        def engine(self) -> str | None: ...

        async def _client(self, concurrency: int) -> BenchClient: ...

        def _spec(self, messages: Sequence[Mapping[str, str]], max_tokens: int, extra: Mapping[str, Any],
                  labels: Mapping[str, str], keep_text: bool = False) -> RequestSpec: ...

        def _ask_spec(self, ask: wl.Ask, salt: str, labels: Mapping[str, str]) -> RequestSpec: ...

        def _log(self, results: Sequence[RequestResult], counted: bool = True) -> None: ...

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
                    t_start = utc()
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
                    self._row("quality", f"quality/{mode}", {"thinking": mode}, 0, [], utc(), {},
                              [f"not_run:exceeds_context_window:{len(q.SCENARIOS)} scenarios"])
                    continue
                self.progress(f"quality/{mode}: {len(scenarios)} scenarios x {self.repeats} repeats")
                for rep in range(1, self.repeats + 1):
                    t_start = utc()

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
        t_start = utc()
        t0 = time.perf_counter()
        w0, w1 = t0 + o.agent_warmup_s, t0 + o.agent_warmup_s + o.agent_measure_s
        results: list[RequestResult] = []
        window_resets = [0]   # conversations started over because the next turn would not fit (inside the window)

        async def session(plan: wl.SessionPlan) -> None:
            await asyncio.sleep(plan.start_offset_s)
            history: list[wl.Message] = []
            salt, turn = new_salt(), 0
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
        t_start = utc()
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
