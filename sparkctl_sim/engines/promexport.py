"""``/metrics`` of a SIMULATED engine: its counters, and the latency histograms of the real release.

Owns: the exposition text of the simulated ds41f, TensorFold, vLLM and SGLang
rank 0 (the counter names of docs/engines.md) and :class:`LatencyHistograms`,
the TTFT and inter-token latency histograms that vLLM and SGLang export, with
the names, buckets and label sets of the releases sparkctl's contracts pin:

* vLLM 0.11.2, ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``):
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``
  and its deprecated twin ``vllm:time_per_output_token_seconds`` (observed
  with the same value: ``record()`` observes both), labels ``model_name`` and
  ``engine`` (``labelnames = ["model_name", "engine"]``), every series created
  at start (``make_per_engine`` calls ``.labels()`` at init, so the buckets
  read 0 before the first request). prometheus_client's default registry in
  one API process: the ``_created`` samples are exported.
* SGLang 0.5.4 with ``--enable-metrics``, ``sglang/srt/metrics/collector.py``
  (``TokenizerMetricsCollector``): ``sglang:time_to_first_token_seconds`` and
  ``sglang:inter_token_latency_seconds``, label ``model_name``, the series
  created at the first observation (``.labels(**labels).observe`` in
  ``observe_*``); a multiprocess registry (``sglang/srt/utils/common.py``
  ``MultiProcessCollector``), so no ``_created`` samples. The ITL observation
  is SGLang's own: each interval divided by the tokens it brought, counted once
  per token, while ``_sum`` grows by the whole interval.

The simulator is a witness: every value observed is an elapsed time it really
produced (``time.time()``, the clock both engines use), at the points where
the real engine takes it. vLLM: from the request's arrival at the engine
(``processor.process_inputs``: ``arrival_time = time.time()``, after the chat
template and the tokenizer) to the engine step that produced the first token
(``IterationStats.update_from_output``), then one ITL per later step
(``engine_core_timestamp - last_token_ts``). SGLang: from the tokenizer
manager's ``created_time`` (before tokenization) to the first output
(``managers/tokenizer_manager.py`` ``collect_metrics``). Here a step is one
token of one stream, emitted just after the observation, as the real engines
record before the output is written to the client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from sparkctl_sim.engines.cli import EngineConfig


class Engine(Protocol):
    """What the exposition reads of a simulated engine (sparkctl_sim.engines.server.Engine)."""

    cfg: EngineConfig
    generation_tokens: int
    prompt_tokens: int
    decoding: int
    finished: dict[str, int]
    speedup: float
    http: dict[tuple[str, int], int]
    cached_tokens: int
    latency: LatencyHistograms

COUNTER_NAMES = {  # docs/engines.md: the generated-token counter per engine
    "ds41f": "ds41f_generation_tokens_total",
    "tensorfold": "tensorfold_generated_tokens_total",
    "vllm": "vllm:generation_tokens_total",
    "sglang": "sglang:generation_tokens_total",
}
PROMPT_COUNTER_NAMES = {
    "ds41f": "ds41f_prompt_tokens_total",
    "tensorfold": "tensorfold_prompt_tokens_total",
    "vllm": "vllm:prompt_tokens_total",
    "sglang": "sglang:prompt_tokens_total",
}
RUNNING_GAUGE_NAMES = {
    "ds41f": "ds41f_requests_running",
    "tensorfold": "tensorfold_active_sequences",
    "vllm": "vllm:num_requests_running",
    "sglang": "sglang:num_running_reqs",
}

# vLLM 0.11.2 vllm/v1/metrics/loggers.py, the buckets= of each histogram.
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                     10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)
# SGLang 0.5.4 sglang/srt/metrics/collector.py, the defaults when --bucket-time-to-first-token /
# --bucket-inter-token-latency are not given (sparkctl renders neither).
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                      0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)


class LatencyHistograms:
    """The real engine's TTFT and ITL histograms, observed from what the simulator really does."""

    def __init__(self, engine: str, served_name: str) -> None:
        import prometheus_client as pc

        self.engine = engine
        self.registry = pc.CollectorRegistry()
        self._hists: list[Any] = []
        self._itl: list[Any] = []
        if engine == "vllm":
            names = ["model_name", "engine"]
            ttft = pc.Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                names, buckets=VLLM_TTFT_BUCKETS, registry=self.registry)
            tpot = pc.Histogram("vllm:time_per_output_token_seconds",
                                "Histogram of time per output token in seconds."
                                "DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
                                names, buckets=VLLM_ITL_BUCKETS, registry=self.registry)
            itl = pc.Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                               names, buckets=VLLM_ITL_BUCKETS, registry=self.registry)
            # make_per_engine: every series exists from the start (engine index 0: one engine core)
            self._ttft: Any = ttft.labels(served_name, "0")
            self._itl = [tpot.labels(served_name, "0"), itl.labels(served_name, "0")]
        elif engine == "sglang":
            self._labels = {"model_name": served_name}
            self._ttft_family = pc.Histogram("sglang:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", ["model_name"],
                                             buckets=SGLANG_TTFT_BUCKETS, registry=self.registry)
            self._itl_family = pc.Histogram("sglang:inter_token_latency_seconds",
                                            "Histogram of inter-token latency in seconds.", ["model_name"],
                                            buckets=SGLANG_ITL_BUCKETS, registry=self.registry)
        self.enabled = engine in ("vllm", "sglang")

    @staticmethod
    def now() -> float:
        return time.time()

    def first_token(self, arrival: float) -> float:
        """Observe the TTFT of a stream that arrived at ``arrival``; returns the time observed."""
        t = time.time()
        if self.engine == "vllm":
            self._ttft.observe(t - arrival)
        elif self.engine == "sglang":
            self._ttft_family.labels(**self._labels).observe(t - arrival)
        return t

    def next_tokens(self, last: float, n: int = 1) -> float:
        """Observe the interval since ``last`` that brought ``n`` tokens; returns the time observed."""
        t = time.time()
        if self.engine == "vllm":
            for h in self._itl:  # record(): one observation per step, into both names
                h.observe(t - last)
        elif self.engine == "sglang":
            # observe_inter_token_latency: the bucket of interval/n counted n times, _sum += interval
            h = self._itl_family.labels(**self._labels)
            adjusted = (t - last) / n
            h._sum.inc(t - last)
            for i, bound in enumerate(h._upper_bounds):
                if adjusted <= bound:
                    h._buckets[i].inc(n)
                    break
        return t

    def exposition(self) -> str:
        if not self.enabled:
            return ""
        import prometheus_client as pc

        if self.engine != "sglang":
            return pc.generate_latest(self.registry).decode()
        # SGLang's multiprocess collector exports no _created samples: leave them out here
        # (per registry: prometheus_client's disable_created_metrics() would be process-wide)
        registry = pc.CollectorRegistry()
        registry.register(_NoCreated(self.registry))
        return pc.generate_latest(registry).decode()


class _NoCreated:
    """A collector yielding another registry's families without their ``_created`` samples."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def collect(self) -> Any:
        for fam in self.inner.collect():
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam


def _labels(engine: Engine) -> str:
    cfg = engine.cfg
    e = cfg.engine
    labels = f'model_name="{cfg.served_name}"' if e in ("vllm", "sglang") else f'model="{cfg.served_name}"'
    return 'engine="0",' + labels if e == "vllm" else labels


def exposition(engine: Engine) -> str:
    """The whole ``/metrics`` text of a simulated engine."""
    e = engine.cfg.engine
    labels = _labels(engine)
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: Sequence[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for lab, v in samples:
            lines.append(f"{name}{{{lab}}} {float(v)}" if lab else f"{name} {float(v)}")

    metric(COUNTER_NAMES[e], "counter", "Number of generation tokens processed.",
           [(labels, engine.generation_tokens)])
    metric(PROMPT_COUNTER_NAMES[e], "counter", "Number of prefill tokens processed.",
           [(labels, engine.prompt_tokens)])
    metric(RUNNING_GAUGE_NAMES[e], "gauge", "Number of requests in decode.", [(labels, engine.decoding)])
    if e == "vllm":
        metric("vllm:request_success_total", "counter", "Count of successfully processed requests.",
               [(f'{labels},finished_reason="{r}"', engine.finished[r]) for r in ("stop", "length", "abort")])
    metric("sparkctl_sim_speedup", "gauge",
           "SIMULATION: every simulated duration is divided by this factor.", [("", engine.speedup)])
    metric("sparkctl_sim_requests_total", "counter", "SIMULATION: HTTP requests by endpoint and status.",
           [(f'endpoint="{p}",status="{s}"', n) for (p, s), n in sorted(engine.http.items())])
    metric("sparkctl_sim_finished_requests_total", "counter", "SIMULATION: finished completions by reason.",
           [(f'reason="{r}"', n) for r, n in sorted(engine.finished.items())])
    metric("sparkctl_sim_cached_prompt_tokens_total", "counter",
           "SIMULATION: prompt tokens read from the prefix cache.", [("", engine.cached_tokens)])
    return "\n".join(lines) + "\n" + engine.latency.exposition()
