"""The rows of ``results.csv``: one per repeat of a point, and their summary. PURE but for the stamp.

Owns: :func:`build_row` (the configuration columns, the point, its requests'
statuses and token sources, validity and flags, and the metric columns of
:data:`~sparkctl.bench.results.METRIC_COLUMNS`), :func:`point_metrics` (the
metrics of a prefill/decode/concurrency/peak repeat from its event logs),
:func:`summarize_rows` (median/min/max over the valid repeats of each point)
and :func:`utc` (the wall-clock stamp every row and sample carries).

Must not: write files (the runner does, through :mod:`sparkctl.bench.results`),
send requests or print.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sparkctl import __version__
from sparkctl.bench import workloads as wl
from sparkctl.bench.events import Event, RequestResult
from sparkctl.bench.metrics import aggregate_throughput, request_metrics, summarize
from sparkctl.bench.results import HEADLINE, METRIC_COLUMNS, SCHEMA_VERSION


def utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def usage_cached_tokens(events: Sequence[Event]) -> int | None:
    """``cached_tokens`` of the last usage event that carried it."""
    vals = [e.cached_tokens for e in events if e.kind == "usage" and e.cached_tokens is not None]
    return vals[-1] if vals else None


def run_label(label: str | None, config: Mapping[str, Any], model: str) -> Any:
    """The run's label: the option, else the configuration's label, profile or engine, else the model."""
    return label or config.get("label") or config.get("profile") or config.get("engine") or model


def build_row(*, run_id: str, label: Any, config: Mapping[str, Any], model: str, base_url: str, suite: str,
              point: str, params: Mapping[str, Any], repeat: int, results: Sequence[RequestResult], t_start: str,
              metrics: Mapping[str, Any], flags: Sequence[str] = (), salt: str = "") -> dict[str, Any]:
    """One row of results.csv; ``valid`` is False as soon as there is a flag (an error adds ``errors:N``)."""
    per = [request_metrics(r.events) for r in results]
    srcs = {m.token_source for m in per if m.token_source}
    psrcs = {m.prompt_token_source for m in per if m.prompt_token_source}
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    n_err = sum(not r.ok for r in results)
    flags = list(flags) + ([f"errors:{n_err}"] if n_err else [])
    cfg = config
    row: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "sparkctl_version": __version__, "run_id": run_id,
        "label": label,
        "profile": cfg.get("profile"), "profile_digest": cfg.get("profile_digest"), "engine": cfg.get("engine"),
        "engine_version": cfg.get("engine_version"), "model": cfg.get("model") or model,
        "served_name": model, "base_url": base_url, "topology": cfg.get("topology"),
        "tp_size": cfg.get("tp_size"), "nodes": cfg.get("nodes"), "clock_cap_mhz": cfg.get("clock_cap_mhz"),
        "kernel": cfg.get("kernel"), "page_size_kib": cfg.get("page_size_kib"), "waivers": cfg.get("waivers"),
        "context_window_tokens": cfg.get("context_window_tokens"),
        "context_window_source": cfg.get("context_window_source"),
        "suite": suite, "point": point, "params": dict(params), "repeat": repeat,
        "salt": salt or ";".join(r.labels.get("salt", "") for r in results[:4]) + (";..." if len(results) > 4 else ""),
        "token_source": "usage" if srcs == {"usage"} else ("+".join(sorted(srcs)) or None),
        "prompt_token_source": "usage" if psrcs == {"usage"} else ("+".join(sorted(psrcs)) or None),
        "t_start_utc": t_start, "t_end_utc": utc(), "n_requests": len(results),
        "n_ok": len(results) - n_err, "n_errors": n_err, "statuses": statuses,
        "valid": not flags, "flags": ";".join(flags),
    }
    for k in ("length_tokens", "concurrency", "decode_tokens", "corpus", "content", "thinking", "scenario",
              "category", "depth_fraction"):
        row[k] = params.get(k)
    for k in METRIC_COLUMNS:
        row[k] = metrics.get(k)
    return row


def point_metrics(p: wl.Point, results: Sequence[RequestResult]) -> tuple[dict[str, Any], list[str]]:
    """(metrics, flags) of one repeat of a single-request or released-together point."""
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
    metrics: dict[str, Any]
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
    return metrics, flags


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
