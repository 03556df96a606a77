"""Metrics of streamed requests, derived from their event logs. PURE.

Owns the arithmetic that turns :class:`~sparkctl.bench.events.Event` logs into
TTFT, inter-token latencies, TPOT, prefill and decode rates, aggregate
throughput, and median/min/max summaries over repeats. The definitions, with
their edge cases, are in ``docs/bench-metrics.md``; this docstring and that
page must say the same thing.

Must not: read a clock, open a socket or a file, or import the client. Every
input is an event log; every output is a frozen dataclass or a float.

Key rules:

* A *content chunk* is a ``chunk`` event with ``n_text_chars > 0``. A
  role-only or finish-only chunk is never the first token.
* TTFT = time of the first content chunk - time of ``sent``.
* Token counts come from the last ``usage`` event. Without one, completion
  tokens fall back to the per-chunk hints if every content chunk has one
  (``token_source="chunk_hints"``), else to the number of content chunks
  (``token_source="chunk_count"``, i.e. one token per chunk assumed).
* Tokens per chunk: the server's hints when every content chunk has one;
  otherwise ``completion_tokens / n_content_chunks`` for every chunk (servers
  that pack k tokens per chunk pack them evenly; the estimate is exact when
  they do).
* Decode window: from the first content chunk to the last. The tokens that
  arrived in that window are ``completion_tokens - tokens_in_first_chunk``, so
  ``decode_tok_s = (completion_tokens - tokens_in_first_chunk) / (t_last -
  t_first)`` and ``tpot_s`` is its inverse. With one token per chunk these are
  exactly ``(completion_tokens - 1) / (t_last - t_first_token)`` and
  ``(t_last - t_first_token) / (completion_tokens - 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from sparkctl.bench.events import Event

TokenSource = Literal["usage", "chunk_hints", "chunk_count"]
PromptTokenSource = Literal["usage", "caller"]
ChunkTokenSource = Literal["hints", "usage_estimate", "assumed_one"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    Same as numpy's default ("linear") method. ``None`` for an empty sequence.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


@dataclass(frozen=True)
class Summary:
    """Median, min and max over repeats; ``n`` counts the values that were not ``None``."""

    n: int
    median: float | None
    min: float | None
    max: float | None


def summarize(values: Iterable[float | None]) -> Summary:
    """Median/min/max of the values that are not ``None`` (a metric a repeat could not yield)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return Summary(0, None, None, None)
    return Summary(len(xs), percentile(xs, 50.0), min(xs), max(xs))


@dataclass(frozen=True)
class RequestMetrics:
    """Everything derivable from one request's event log. ``None`` = not derivable.

    Times in seconds, rates in tokens per second.
    """

    complete: bool
    """``[DONE]`` was seen and no ``error`` event was logged."""
    time_to_headers_s: float | None
    time_to_first_byte_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    itl_s: tuple[float, ...]
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    tpot_s: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    token_source: TokenSource | None
    prompt_token_source: PromptTokenSource | None
    n_content_chunks: int
    tokens_per_chunk: float | None
    chunk_token_source: ChunkTokenSource | None
    t_sent_s: float | None
    t_first_token_s: float | None
    t_last_token_s: float | None


def _first(events: Sequence[Event], kind: str) -> Event | None:
    return next((e for e in events if e.kind == kind), None)


def request_metrics(events: Sequence[Event], prompt_tokens_fallback: int | None = None) -> RequestMetrics:
    """Derive :class:`RequestMetrics` from one request's event log.

    ``prompt_tokens_fallback`` is a prompt-token count the caller knows (e.g.
    from its own tokenizer); it is used only when no ``usage`` event carries
    ``prompt_tokens``, and ``prompt_token_source`` then says ``"caller"``.
    Events must be in the order they were observed (non-decreasing ``t_s``).
    """
    sent = _first(events, "sent")
    headers = _first(events, "headers")
    first_byte = _first(events, "first_byte")
    done = _first(events, "done")
    errored = any(e.kind == "error" for e in events)
    content = [e for e in events if e.kind == "chunk" and e.n_text_chars > 0]
    usages = [e for e in events if e.kind == "usage"]
    t0 = sent.t_s if sent else None

    def since_sent(e: Event | None) -> float | None:
        return e.t_s - t0 if (e is not None and t0 is not None) else None

    # -- token counts ---------------------------------------------------------
    last_usage = usages[-1] if usages else None
    hints_complete = bool(content) and all(e.n_content_tokens_hint > 0 for e in content)
    completion_tokens: int | None
    token_source: TokenSource | None
    if last_usage is not None and last_usage.completion_tokens is not None:
        completion_tokens, token_source = last_usage.completion_tokens, "usage"
    elif hints_complete:
        completion_tokens, token_source = sum(e.n_content_tokens_hint for e in content), "chunk_hints"
    elif content or done is not None:
        completion_tokens, token_source = len(content), "chunk_count"
    else:
        completion_tokens, token_source = None, None

    prompt_tokens: int | None = None
    prompt_source: PromptTokenSource | None = None
    usage_prompt = [e.prompt_tokens for e in usages if e.prompt_tokens is not None]
    if usage_prompt:
        prompt_tokens, prompt_source = usage_prompt[-1], "usage"
    elif prompt_tokens_fallback is not None:
        prompt_tokens, prompt_source = prompt_tokens_fallback, "caller"

    # -- tokens carried by each content chunk ---------------------------------
    per_chunk: list[float]
    chunk_source: ChunkTokenSource | None
    if not content:
        per_chunk, chunk_source = [], None
    elif hints_complete:
        per_chunk, chunk_source = [float(e.n_content_tokens_hint) for e in content], "hints"
    elif token_source == "usage" and completion_tokens:
        k = completion_tokens / len(content)
        per_chunk, chunk_source = [k] * len(content), "usage_estimate"
    else:
        per_chunk, chunk_source = [1.0] * len(content), "assumed_one"
    tokens_per_chunk = (sum(per_chunk) / len(per_chunk)) if per_chunk else None

    # -- timing ---------------------------------------------------------------
    t_first = content[0].t_s if content else None
    t_last = content[-1].t_s if content else None
    ttft = since_sent(content[0]) if content else None
    end = done if done is not None else (events[-1] if events else None)
    e2e = since_sent(end)

    itl = tuple((b.t_s - a.t_s) / k for a, b, k in zip(content, content[1:], per_chunk[1:], strict=False))

    decode_tok_s: float | None = None
    tpot_s: float | None = None
    if t_first is not None and t_last is not None and completion_tokens is not None and per_chunk:
        window = t_last - t_first
        tokens_after_first = completion_tokens - per_chunk[0]
        if window > 0 and tokens_after_first > 0:
            decode_tok_s = tokens_after_first / window
            tpot_s = window / tokens_after_first

    prefill_tok_s = (prompt_tokens / ttft) if (prompt_tokens is not None and ttft) else None

    return RequestMetrics(
        complete=done is not None and not errored,
        time_to_headers_s=since_sent(headers),
        time_to_first_byte_s=since_sent(first_byte),
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=itl,
        itl_p50_s=percentile(itl, 50.0),
        itl_p90_s=percentile(itl, 90.0),
        itl_p99_s=percentile(itl, 99.0),
        tpot_s=tpot_s,
        prefill_tok_s=prefill_tok_s,
        decode_tok_s=decode_tok_s,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        token_source=token_source,
        prompt_token_source=prompt_source,
        n_content_chunks=len(content),
        tokens_per_chunk=tokens_per_chunk,
        chunk_token_source=chunk_source,
        t_sent_s=t0,
        t_first_token_s=t_first,
        t_last_token_s=t_last,
    )


@dataclass(frozen=True)
class Throughput:
    """Aggregate throughput of requests released together.

    ``tok_s = completion_tokens / window_s`` with ``window_s`` from the first
    ``sent`` to the last content chunk of any request. ``token_source`` is
    ``"usage"`` when every request counted from usage, else the weakest
    fallback any request used.
    """

    n_requests: int
    completion_tokens: int
    window_s: float | None
    tok_s: float | None
    token_source: TokenSource | None


_SOURCE_RANK: dict[str, int] = {"usage": 0, "chunk_hints": 1, "chunk_count": 2}


def aggregate_throughput(logs: Sequence[Sequence[Event]]) -> Throughput:
    """Sum of completion tokens / (last token time - first send time) over a set of requests.

    Every request's ``sent`` opens the window (a request that produced nothing
    still took its place in the batch); requests without content add no
    tokens and do not close the window.
    """
    per = [request_metrics(ev) for ev in logs]
    sents = [m.t_sent_s for m in per if m.t_sent_s is not None]
    lasts = [m.t_last_token_s for m in per if m.t_last_token_s is not None]
    tokens = sum(m.completion_tokens or 0 for m in per if m.t_last_token_s is not None)
    sources: list[TokenSource] = [m.token_source for m in per if m.token_source is not None]
    ranked = sorted(sources, key=lambda s: _SOURCE_RANK[s])
    source: TokenSource | None = ranked[-1] if ranked else None  # the weakest source any request had
    if not sents or not lasts:
        return Throughput(len(per), tokens, None, None, source)
    window = max(lasts) - min(sents)
    return Throughput(len(per), tokens, window, (tokens / window) if window > 0 else None, source)
