"""Performance model of the SIMULATED engines, calibrated to published figures.

Owns: how fast a simulated engine prefills and decodes, as a pure function of
(engine, TP size, prompt length, decode concurrency, GPU clock cap, stale
link). No clock, no I/O, no sockets: the engine runtime asks this module for
durations and does the waiting itself.

Calibration (``docs/reference/published-numbers.yaml``):

* ds41f and TensorFold at TP4 come from the 4-node ring report, measured with
  the GPU clock capped at 2000 MHz. ds41f's uncapped prefill is the capped
  figure times 4758/4441 (the report's 2K re-measurement); TensorFold's
  uncapped points are published. Decode does not depend on the cap ("unchanged
  within noise"), so one decode curve serves both.
* TP2 figures come from the 2-node report, measured at a 2100 MHz cap:
  TensorFold TP2 (decode 60, 4 streams 221.8, cold prefill 2400 @ 32K,
  2231 @ 127K, 1618 @ 992K, TTFT 0.2-0.4 s), vLLM TP2 (decode 65.8, prefill
  1800 @ 32K and 1198 @ 419K, TTFT 0.7 s), SGLang TP2 (decode 35 = middle of
  the reported 25-47, prefill 2600), ds41f TP2 (the ring report's "same model
  on two Sparks": decode 60, prefill 2400 @ 32K).
* Anything not published is DERIVED, and says so in ``provenance``: missing
  aggregate points borrow the same engine's TP4 curve shape (vLLM and SGLang
  borrow TensorFold's, the more conservative); vLLM/SGLang at TP4 scale their
  TP2 figures by the ring report's "two to four nodes multiplied prefill by
  more than 2.5" and ds41f's 67/60 decode gain; TP1 is TP2 with half the
  prefill and 54.1/60 of the decode (the one-box single-stream record); TP3 is
  the geometric mean of TP2 and TP4; TP > 4 uses the TP4 figures.

Rules:

* Prefill rate P(n) for an n-token prompt is interpolated linearly on log(n)
  between published points and held flat outside them. It is the rate the
  reports define: prompt tokens / time to first token.
* TTFT = max(base_latency_s, uncached_tokens / P(n)). With the ``max`` a full
  uncached prompt reproduces the published prompt/TTFT exactly; the base
  latency (scheduling, HTTP, first decode step) dominates short or fully
  cached prompts. Waiting behind other prefills is the runtime's business.
* Clock cap c (MHz, None = uncapped, boosting to ~3 GHz): prefill moves
  linearly from the 2000 MHz figure at c = 2000 to the uncapped figure at
  c >= 3003 (the max SM clock); below 2000 MHz it scales with c / 2000.
* Aggregate decode A(c) over c concurrently decoding streams is interpolated
  linearly on log(c) between the published points and held flat beyond the
  last one; each stream decodes at A(c) / c.
* A stale link (the AC-cycle law: "half of single-stream decode") halves
  decode and prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

ENGINES = ("ds41f", "tensorfold", "vllm", "sglang")

CAP_REF_MHZ = 2000  # the ring report's cap; every prefill curve is stored at it
MAX_SM_MHZ = 3003  # GB10 max SM clock (docs/reference/spark-facts.md)
DS41F_UNCAPPED_RATIO = 4758 / 4441  # ring report, 2K prefill, 7 repetitions
STALE_FACTOR = 0.5  # AC-cycle law: stale PCIe state cost half of decode

Points = tuple[tuple[float, float], ...]


def interp_log(points: Points, x: float) -> float:
    """Linear interpolation on log(x) between sorted (x, y) points, flat outside."""
    if not points:
        raise ValueError("no calibration points")
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    lx = math.log(x)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            t = (lx - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    raise AssertionError("unreachable: points not sorted")


def clock_fraction(cap_mhz: float | None) -> float:
    """0.0 at the 2000 MHz reference cap, 1.0 uncapped; linear in between."""
    if cap_mhz is None:
        return 1.0
    return min(1.0, max(0.0, (cap_mhz - CAP_REF_MHZ) / (MAX_SM_MHZ - CAP_REF_MHZ)))


def _pts(d: dict[float, float]) -> Points:
    return tuple(sorted((float(k), float(v)) for k, v in d.items()))


@dataclass(frozen=True)
class PerfModel:
    """One engine at one TP size. Rates in tokens/s, times in seconds."""

    engine: str
    tp: int
    prefill_capped_tok_s: Points  # at CAP_REF_MHZ
    prefill_uncapped_tok_s: Points  # same prompt lengths as the capped curve
    decode_aggregate_tok_s: Points  # (concurrency, aggregate); includes (1, single stream)
    base_latency_s: float
    provenance: str = ""
    derived: bool = False

    # --- prefill -----------------------------------------------------------
    def prefill_tok_s(
        self, prompt_tokens: int, clock_cap_mhz: float | None = None, stale: bool = False
    ) -> float:
        n = max(1, prompt_tokens)
        capped = interp_log(self.prefill_capped_tok_s, n)
        uncapped = interp_log(self.prefill_uncapped_tok_s, n)
        rate = capped + (uncapped - capped) * clock_fraction(clock_cap_mhz)
        if clock_cap_mhz is not None and clock_cap_mhz < CAP_REF_MHZ:
            rate *= max(clock_cap_mhz, 1.0) / CAP_REF_MHZ
        if stale:
            rate *= STALE_FACTOR
        return rate

    def prefill_work_s(
        self,
        prompt_tokens: int,
        uncached_tokens: int,
        clock_cap_mhz: float | None = None,
        stale: bool = False,
    ) -> float:
        """Compute time of the uncached part of a prompt (no base latency)."""
        if uncached_tokens <= 0:
            return 0.0
        return uncached_tokens / self.prefill_tok_s(prompt_tokens, clock_cap_mhz, stale)

    def ttft_s(
        self,
        prompt_tokens: int,
        uncached_tokens: int | None = None,
        clock_cap_mhz: float | None = None,
        stale: bool = False,
    ) -> float:
        """Time to first token of one request that waits behind nothing."""
        u = prompt_tokens if uncached_tokens is None else uncached_tokens
        return max(self.base_latency_s, self.prefill_work_s(prompt_tokens, u, clock_cap_mhz, stale))

    # --- decode ------------------------------------------------------------
    def aggregate_tok_s(self, concurrency: int, stale: bool = False) -> float:
        c = max(1, concurrency)
        rate = interp_log(self.decode_aggregate_tok_s, c)
        return rate * STALE_FACTOR if stale else rate

    def per_stream_tok_s(self, concurrency: int, stale: bool = False) -> float:
        c = max(1, concurrency)
        return self.aggregate_tok_s(c, stale) / c

    def describe(self, clock_cap_mhz: float | None = None, stale: bool = False) -> dict[str, Any]:
        """JSON-able parameters and the rates in effect (for /sim/info)."""
        lengths = sorted({int(n) for n, _ in self.prefill_capped_tok_s} | {2048, 8192, 32768, 131072})
        return {
            "engine": self.engine,
            "tp": self.tp,
            "derived": self.derived,
            "provenance": self.provenance,
            "base_latency_s": self.base_latency_s,
            "clock_cap_mhz": clock_cap_mhz,
            "stale": stale,
            "prefill_capped_2000mhz_tok_s": {str(int(n)): r for n, r in self.prefill_capped_tok_s},
            "prefill_uncapped_tok_s": {str(int(n)): r for n, r in self.prefill_uncapped_tok_s},
            "decode_aggregate_points_tok_s": {str(int(c)): r for c, r in self.decode_aggregate_tok_s},
            "effective": {
                "prefill_tok_s": {
                    str(n): self.prefill_tok_s(n, clock_cap_mhz, stale) for n in lengths
                },
                "aggregate_tok_s": {
                    str(c): self.aggregate_tok_s(c, stale) for c in (1, 2, 4, 8, 12, 16, 32)
                },
                "per_stream_tok_s": {
                    str(c): self.per_stream_tok_s(c, stale) for c in (1, 2, 4, 8, 12, 16, 32)
                },
            },
        }


# ---------------------------------------------------------------------------
# Calibration table
# ---------------------------------------------------------------------------


def _at_2100_to_capped(ref: dict[float, float], ratio: float) -> tuple[Points, Points]:
    """Figures measured at a 2100 MHz cap -> (capped@2000, uncapped) curves."""
    at_2100 = 1.0 + (ratio - 1.0) * clock_fraction(2100)
    capped = {n: r / at_2100 for n, r in ref.items()}
    return _pts(capped), _pts({n: r * ratio for n, r in capped.items()})


# Published single-stream / aggregate curve shapes (ring report, TP4).
_DS41F_TP4_AGG = {1: 67.0, 4: 162.0, 16: 328.0}
_TF_TP4_AGG = {1: 63.7, 4: 133.0, 16: 193.0}


def _shape(single: float, shape: dict[int, float]) -> dict[float, float]:
    return {float(c): single * a / shape[1] for c, a in shape.items()}


def _published() -> dict[tuple[str, int], PerfModel]:
    ds41f_capped = {2048: 4441.0, 8192: 5783.0, 32768: 6377.0, 131072: 6239.0}
    tf_capped = {8192: 3060.0, 32768: 3152.0, 131072: 2928.0}
    tf_uncapped = {8192: 3265.0, 32768: 3393.0, 131072: 3129.0}

    table: dict[tuple[str, int], PerfModel] = {}
    table[("ds41f", 4)] = PerfModel(
        "ds41f", 4,
        _pts(ds41f_capped),
        _pts({n: r * DS41F_UNCAPPED_RATIO for n, r in ds41f_capped.items()}),
        _pts(_DS41F_TP4_AGG),
        base_latency_s=0.05,
        provenance="ring report TP4 @2000 MHz; uncapped x4758/4441",
    )
    table[("tensorfold", 4)] = PerfModel(
        "tensorfold", 4,
        _pts(tf_capped), _pts(tf_uncapped), _pts(_TF_TP4_AGG),
        base_latency_s=0.05,
        provenance="ring report TP4 @2000 MHz and uncapped",
    )

    # --- TP2, measured at a 2100 MHz cap (2-node report) ---------------------
    tf2_agg = {1.0: 60.0, 4.0: 221.8}
    tf2_agg[16.0] = 221.8 * _TF_TP4_AGG[16] / _TF_TP4_AGG[4]  # derived: TF TP4 shape 4->16
    cap, unc = _at_2100_to_capped({32768: 2400.0, 127000: 2231.0, 992000: 1618.0}, DS41F_UNCAPPED_RATIO)
    table[("tensorfold", 2)] = PerfModel(
        "tensorfold", 2, cap, unc, _pts(tf2_agg),
        base_latency_s=0.3,  # TTFT 0.2-0.4 s single stream
        provenance="2-node report TP2 @2100 MHz; 16-stream point from TF TP4 shape",
    )
    cap, unc = _at_2100_to_capped({32000: 1800.0, 419000: 1198.0}, DS41F_UNCAPPED_RATIO)
    table[("vllm", 2)] = PerfModel(
        "vllm", 2, cap, unc, _pts(_shape(65.8, _TF_TP4_AGG)),
        base_latency_s=0.7,
        provenance="2-node report vLLM TP2 @2100 MHz; aggregate from TF TP4 shape",
    )
    cap, unc = _at_2100_to_capped({32768: 2600.0}, DS41F_UNCAPPED_RATIO)
    table[("sglang", 2)] = PerfModel(
        "sglang", 2, cap, unc, _pts(_shape(35.0, _TF_TP4_AGG)),
        base_latency_s=0.05,
        provenance="2-node report SGLang TP2 (25-47 tok/s); aggregate from TF TP4 shape",
    )
    cap, unc = _at_2100_to_capped({32768: 2400.0}, DS41F_UNCAPPED_RATIO)
    table[("ds41f", 2)] = PerfModel(
        "ds41f", 2, cap, unc, _pts(_shape(60.0, _DS41F_TP4_AGG)),
        base_latency_s=0.05,
        provenance="ring report's TP2 reference (60 tok/s, 2400 @32K); aggregate from ds41f TP4 shape",
    )

    # --- vLLM / SGLang TP4: derived from their TP2 -----------------------------
    for eng in ("vllm", "sglang"):
        m2 = table[(eng, 2)]
        table[(eng, 4)] = _scaled(
            m2, 4, prefill=2.5, decode=67.0 / 60.0,
            provenance=f"DERIVED from {eng} TP2: prefill x2.5, decode x67/60",
        )
    return table


def _scaled(m: PerfModel, tp: int, prefill: float, decode: float, provenance: str) -> PerfModel:
    return replace(
        m,
        tp=tp,
        prefill_capped_tok_s=tuple((n, r * prefill) for n, r in m.prefill_capped_tok_s),
        prefill_uncapped_tok_s=tuple((n, r * prefill) for n, r in m.prefill_uncapped_tok_s),
        decode_aggregate_tok_s=tuple((c, r * decode) for c, r in m.decode_aggregate_tok_s),
        provenance=provenance,
        derived=True,
    )


def _geomean(a: PerfModel, b: PerfModel, tp: int) -> PerfModel:
    """Midpoint on a log scale of two models with the same sample points."""

    def mid(p: Points, q: Points) -> Points:
        return tuple((x, math.sqrt(y * interp_log(q, x))) for x, y in p)

    return replace(
        a,
        tp=tp,
        prefill_capped_tok_s=mid(a.prefill_capped_tok_s, b.prefill_capped_tok_s),
        prefill_uncapped_tok_s=mid(a.prefill_uncapped_tok_s, b.prefill_uncapped_tok_s),
        decode_aggregate_tok_s=mid(a.decode_aggregate_tok_s, b.decode_aggregate_tok_s),
        provenance=f"DERIVED: geometric mean of TP{a.tp} and TP{b.tp}",
        derived=True,
    )


_TABLE = _published()


def model_for(engine: str, tp: int) -> PerfModel:
    """The performance model of ``engine`` at tensor-parallel size ``tp``."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if (engine, tp) in _TABLE:
        return _TABLE[(engine, tp)]
    if tp == 1:
        return _scaled(
            _TABLE[(engine, 2)], 1, prefill=0.5, decode=54.1 / 60.0,
            provenance=f"DERIVED from {engine} TP2: prefill x0.5, decode x54.1/60 (one-box record)",
        )
    if tp == 3:
        return _geomean(_TABLE[(engine, 2)], _TABLE[(engine, 4)], 3)
    m4 = _TABLE[(engine, 4)]
    return replace(m4, tp=tp, derived=True, provenance=f"DERIVED: TP{tp} uses the TP4 figures")
