"""Fitting the context window: what a bench point needs, and the points that do not fit.

Owns: the ``max_tokens: 1`` probes that ask the engine's ``usage.prompt_tokens``
for each prompt's fixed part and for the filler's tokens per word, the estimate
of what a prompt plus its answer needs (:meth:`ContextFit._need`, the formula in
:mod:`sparkctl.bench.workloads`), the agent corpora's fresh-turn counts, and
the flagged row of a point that is not sent (docs/bench-metrics.md, "The
context window").

A mixin of :class:`sparkctl.bench.runner.Runner`: it reads the runner's
``config`` (``context_window_tokens``), ``opt``, ``model``, ``base_url`` and
``progress``, writes ``config["context_fit"]``, and adds rows through ``_row``.

Must not: print or count its probes as requests of any point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import httpx

from sparkctl.bench import client as bc
from sparkctl.bench import workloads as wl
from sparkctl.bench.rows import utc

if TYPE_CHECKING:
    from sparkctl.bench.events import RequestResult
    from sparkctl.bench.options import RunOptions


@dataclass(frozen=True)
class AgentFit:
    """Engine tokens of an agent corpus' fresh turns: the system message alone, and (system, user turn t)."""

    system_tokens: int
    fresh_tokens: tuple[int, ...]
    answer_tokens_per_word: float
    """The filler's rate, for an answer re-sent as history (its count out can differ from its count in)."""


class ContextFit:
    """The context-window half of the runner (see the module docstring for what it reads)."""

    config: dict[str, Any]
    opt: RunOptions
    model: str
    base_url: str
    progress: Callable[[str], None]
    _probe_http: httpx.AsyncClient | None
    _auth: dict[str, str]  # Authorization: Bearer, when the endpoint wants a key
    _token_scale: wl.TokenScale | None
    _fixed: dict[Any, int]
    _agent_fit: dict[str, AgentFit]
    n_fit_probes: int

    if TYPE_CHECKING:  # the runner's (sparkctl.bench.runner.Runner)
        def _row(self, suite: str, point: str, params: Mapping[str, Any], repeat: int, results: Sequence[RequestResult],
                 t_start: str, metrics: Mapping[str, Any], flags: Sequence[str] = (), salt: str = "") -> dict[str, Any]: ...

    @property
    def window(self) -> int | None:
        w = self.config.get("context_window_tokens")
        return w if isinstance(w, int) else None

    def _not_run(self, suite: str, point: str, params: Mapping[str, Any], need: int) -> None:
        """A row for a point that does not fit the context window: flagged, never silently dropped."""
        self.progress(f"{point}: not run, {need} tokens exceed the context window of {self.window}")
        self._row(suite, point, params, 0, [], utc(), {},
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

    async def _probe_tokens(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        """``usage.prompt_tokens`` of ``messages`` (one token out, not streamed), or None.

        Probes are not requests of any point: they are not counted, logged or timed.
        """
        if self._probe_http is None:
            t = self.opt.timeouts
            self._probe_http = httpx.AsyncClient(timeout=httpx.Timeout(t.read_s, connect=t.connect_s),
                                                 trust_env=False, headers=self._auth)
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
