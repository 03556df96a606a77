"""``bench --server-metrics``: the engine's own latency histograms beside the client's figures.

Owns: which histograms each engine exports (:data:`ENGINE_HISTOGRAMS`, with the
release source each name comes from), reading them from the engine's
``/metrics`` before and after every measured window, the suite's difference
(:func:`sparkctl.bench.promhist.difference`, summed over its windows), and the
side-by-side record written to ``run.json`` (``server_metrics``) and printed.

Windows: for the released-together and one-by-one points (prefill, decode,
concurrency, peak) the histograms are read around every measured repeat, so
the client's warm-up requests and the context-fit probes (docs/bench-metrics.md,
"The context window") are outside the difference and the server counts the
same requests as the client; the other suites are read once before and once
after the whole suite, and their record says how many unmeasured requests
(warm-ups, probes, resets) the window holds.

Must not: print, or decide exit codes. An engine without histograms, a
``/metrics`` that does not answer, or a restart mid-suite is a value in the
record (``available: false`` and ``reason``), never a failed run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkctl.bench import promhist as ph

# The latency histograms each engine exports, first the name of the release
# sparkctl's contracts pin, then older names:
# * vLLM 0.11.2, vllm/v1/metrics/loggers.py (PrometheusStatLogger): TTFT
#   `vllm:time_to_first_token_seconds` (from the request's arrival at the engine
#   frontend, after tokenization, to the engine step that produced the first token:
#   v1/metrics/stats.py IterationStats.update_from_output); ITL
#   `vllm:inter_token_latency_seconds`, one observation per engine step after the
#   first; before 0.11 the same figure was `vllm:time_per_output_token_seconds`
#   (0.11 keeps it, deprecated). Labels model_name, engine.
# * SGLang 0.5.4 with --enable-metrics, sglang/srt/metrics/collector.py
#   (TokenizerMetricsCollector): `sglang:time_to_first_token_seconds` (from the
#   tokenizer manager's created_time, before tokenization, to the first output:
#   managers/tokenizer_manager.py collect_metrics) and
#   `sglang:inter_token_latency_seconds` (each interval divided by its new tokens,
#   counted once per token). Label model_name.
ENGINE_HISTOGRAMS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "vllm": {"ttft": ("vllm:time_to_first_token_seconds",),
             "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")},
    "sglang": {"ttft": ("sglang:time_to_first_token_seconds",),
               "itl": ("sglang:inter_token_latency_seconds",)},
}

# Why an engine has none. llama-server's /metrics (only with --metrics) exports
# counters and gauges only (llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total,
# llamacpp:requests_processing, ...: sparkctl/plan/contracts/llamacpp-b6500.json lists
# them); llama-cpp-python's server has no /metrics at all. ds41f and TensorFold are not
# public projects: docs/engines.md names one counter each and no histogram.
NO_HISTOGRAMS = {
    "llamacpp": "llama.cpp has no server-side latency histograms: llama-server's /metrics (with --metrics) "
                "has counters and gauges only, llama-cpp-python's server has no /metrics",
    "ds41f": "ds41f documents no server-side latency histograms (docs/engines.md)",
    "tensorfold": "TensorFold documents no server-side latency histograms (docs/engines.md)",
}


@dataclass
class _Window:
    """One suite's accumulated server histograms and the client's values of the same requests."""

    hist: dict[str, ph.Histogram] = field(default_factory=dict)
    client_ttft: list[float] = field(default_factory=list)
    client_itl: list[float] = field(default_factory=list)
    n_client: int = 0
    n_unmeasured: int = 0
    n_windows: int = 0
    per_suite_window: bool = False
    problem: str | None = None


class ServerMetrics:
    """Reads an engine's latency histograms around measured windows; one per bench run."""

    def __init__(self, base_url: str, engine: str | None, model: str, headers: Mapping[str, str],
                 timeout_s: float = 10.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.engine = engine
        self.model = model
        self._http = httpx.AsyncClient(timeout=timeout_s, trust_env=False, headers=dict(headers))
        self.names: dict[str, str] = {}          # "ttft"/"itl" -> the family this engine serves
        self.reason: str | None = None          # why there are no server figures
        self.suites: dict[str, _Window] = {}
        self._open: tuple[str, dict[str, ph.Histogram | None]] | None = None
        self._suite = ""

    @property
    def available(self) -> bool:
        return bool(self.names) and self.reason is None

    async def _scrape(self) -> str:
        r = await self._http.get(self.url)
        if r.status_code != 200:
            hint = " (SGLang serves it only with --enable-metrics; llama-server only with --metrics)" \
                if r.status_code in (404, 501) else ""
            raise httpx.HTTPError(f"{self.url} answered HTTP {r.status_code}{hint}")
        return r.text

    async def probe(self) -> None:
        """Learn which histograms the engine serves; sets :attr:`reason` when there are none."""
        if (self.engine or "") in NO_HISTOGRAMS:
            self.reason = NO_HISTOGRAMS[self.engine or ""]
            return
        try:
            offered = set(ph.histogram_families(await self._scrape()))
        except (httpx.HTTPError, ValueError) as exc:
            self.reason = f"/metrics not readable: {exc}"
            return
        known = ENGINE_HISTOGRAMS.get(self.engine or "")
        if known is None:  # an engine sparkctl was not told: whichever known family it serves
            known = next((k for k in ENGINE_HISTOGRAMS.values() if k["ttft"][0] in offered), None)
            if known is None:
                self.reason = (f"{self.url} serves no latency histogram sparkctl knows "
                               f"(engine {self.engine or 'unknown'})")
                return
        for kind, names in known.items():
            name = next((n for n in names if n in offered), None)
            if name:
                self.names[kind] = name
        if "ttft" not in self.names:
            self.reason = f"{self.url} serves none of {', '.join(known['ttft'])}"

    def _read(self, text: str) -> dict[str, ph.Histogram | None]:
        return {k: ph.parse_histogram(text, n, {"model_name": self.model}) for k, n in self.names.items()}

    def start_suite(self, suite: str, per_suite_window: bool) -> None:
        self._suite = suite
        self.suites[suite] = _Window(per_suite_window=per_suite_window)

    async def begin(self) -> None:
        """Read the histograms before a measured window."""
        if not self.available or self.suites[self._suite].problem:
            return
        try:
            self._open = (self._suite, self._read(await self._scrape()))
        except (httpx.HTTPError, ValueError) as exc:
            self.suites[self._suite].problem = f"reading /metrics before a window: {exc}"

    async def end(self) -> None:
        """Read them after the window; add the difference to the suite's total."""
        if self._open is None:
            return
        suite, before = self._open
        self._open = None
        w = self.suites[suite]
        try:
            after = self._read(await self._scrape())
            for kind, a in after.items():
                if a is None:
                    continue
                d = ph.difference(before.get(kind), a)
                w.hist[kind] = w.hist[kind] + d if kind in w.hist else d
            w.n_windows += 1
        except (httpx.HTTPError, ValueError) as exc:  # ph.HistogramError is a ValueError
            w.problem = f"reading /metrics after a window: {exc}"

    def observe_client(self, ttft_s: float | None, itl_s: Sequence[float], counted: bool) -> None:
        """One request the client finished while the suite ran (``counted`` = a measured one)."""
        w = self.suites.get(self._suite)
        if w is None:
            return
        if not counted:
            w.n_unmeasured += int(self._open is not None or w.per_suite_window)
            return
        if self._open is None and not w.per_suite_window:
            return
        w.n_client += 1
        if ttft_s is not None:
            w.client_ttft.append(ttft_s)
        w.client_itl.extend(itl_s)

    def record(self) -> dict[str, Any]:
        """``run.json`` ``server_metrics``: per suite, server and client figures side by side."""
        out: dict[str, Any] = {"engine": self.engine, "url": self.url, "available": self.available,
                               "reason": self.reason, "histograms": dict(self.names),
                               "quantiles": "server: Prometheus histogram_quantile (linear interpolation "
                                            "inside the bucket); client: exact percentiles of the values",
                               "suites": {}, "suite_order": list(self.suites)}
        if not self.available:
            return out
        for suite, w in self.suites.items():
            s: dict[str, Any] = {"window": "suite" if w.per_suite_window else "each measured repeat",
                                 "windows": w.n_windows, "client_requests": w.n_client,
                                 "unmeasured_requests_in_window": w.n_unmeasured, "problem": w.problem}
            for kind, values in (("ttft", w.client_ttft), ("itl", w.client_itl)):
                h = w.hist.get(kind)
                s[kind] = {"server": ph.summarize(h) if h is not None and not w.problem else None,
                           "server_buckets": None if h is None else
                           [[None if b == ph.INF else b, c] for b, c in zip(h.bounds, h.cumulative)],
                           "client": client_summary(values)}
            out["suites"][suite] = s
        return out

    async def aclose(self) -> None:
        await self._http.aclose()


def client_summary(values: Sequence[float]) -> dict[str, Any]:
    """``count``, ``mean`` and p50/p90/p99 of the client's own values (numpy's linear method)."""
    from sparkctl.bench.metrics import percentile

    vals = sorted(values)
    return {"count": len(vals), "mean": sum(vals) / len(vals) if vals else None,
            **{f"p{round(q * 100)}": percentile(vals, q * 100) if vals else None for q in ph.QUANTILES}}


FIGURES = (("ttft", "TTFT s"), ("itl", "ITL s"))
TABLE_HEADER = ("suite", "figure", "stat", "server", "server bucket", "client")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def table_rows(record: Mapping[str, Any]) -> list[list[str]]:
    """``run.json`` ``server_metrics`` as rows of :data:`TABLE_HEADER`: per suite and figure the
    count, mean and p50/p90/p99, server and client side by side; the server's quantiles with
    the bucket they were interpolated in (the truth is somewhere in it). Pure."""
    rows: list[list[str]] = []
    suites = record.get("suites") or {}
    order = [x for x in record.get("suite_order") or () if x in suites] or sorted(suites)  # run.json sorts keys
    for suite, s in ((x, suites[x]) for x in order):
        for kind, label in FIGURES:
            fig = s.get(kind) or {}
            srv, cli = fig.get("server") or {}, fig.get("client") or {}
            if not srv and not cli.get("count"):
                continue
            n_srv = srv.get("count")
            rows.append([suite, label, "n", "-" if n_srv is None else f"{n_srv:.0f}", "", str(cli.get("count", 0))])
            rows.append([suite, label, "mean", _f(srv.get("mean")), "exact (_sum/_count)", _f(cli.get("mean"))])
            for q in ("p50", "p90", "p99"):
                b = srv.get(q + "_bucket")
                span = "" if not b else f"({_f(b[0]) if b[0] is not None else '-inf'}, " \
                                        f"{_f(b[1]) if b[1] is not None else '+Inf'}]"
                rows.append([suite, label, q, _f(srv.get(q)), span, _f(cli.get(q))])
    return rows


def notes(record: Mapping[str, Any]) -> list[str]:
    """The lines that go under the table: no histograms (why), windows, problems."""
    if not record.get("available"):
        return [f"no server-side histograms: {record.get('reason')}"]
    out = [f"server-side: {', '.join(record.get('histograms', {}).values())} from {record.get('url')}; "
           "server quantiles are Prometheus histogram_quantile estimates (linear inside the bucket), "
           "client quantiles exact; TTFT/ITL definitions differ: docs/bench-metrics.md"]
    for suite, s in (record.get("suites") or {}).items():
        if s.get("problem"):
            out.append(f"{suite}: no server figures: {s['problem']}")
        elif s.get("unmeasured_requests_in_window"):
            out.append(f"{suite}: read around the whole suite; the server also counted "
                       f"{s['unmeasured_requests_in_window']} unmeasured requests (warm-ups, probes)")
    return out
