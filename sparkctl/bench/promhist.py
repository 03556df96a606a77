"""Prometheus histograms read from an engine's ``/metrics``: parse, difference, quantiles. Pure.

Owns: turning one exposition text into the cumulative buckets of one
histogram family (the series of a family summed bucket by bucket, like
PromQL's ``sum by (le)``), the difference of two readings of the same
histogram (a suite's own observations: an engine's buckets count from its
start), and quantile estimates from buckets exactly as Prometheus'
``histogram_quantile`` makes them (``bucketQuantile`` in
prometheus/prometheus ``promql/quantile.go``): linear interpolation inside
the bucket that holds the rank, 0 as the lower edge of the first bucket, and
the upper bound of the highest finite bucket when the rank falls in ``+Inf``.
An estimate is therefore only as fine as the engine's buckets: every figure
carries the bucket it came from (docs/bench-metrics.md, "Server-side figures").

Parsing is prometheus_client's own (``text_string_to_metric_families``), the
library both vLLM and SGLang export with. Nothing here fetches: the text is
handed in (:mod:`sparkctl.bench.servermetrics` scrapes). No NaN leaves this
module: what cannot be estimated is ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INF = math.inf


class HistogramError(ValueError):
    """Two readings that cannot be differenced (other buckets, or counts that went down: a restart)."""


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets of one histogram: ``cumulative[i]`` observations were ``<= bounds[i]``.

    ``bounds`` ends with ``+Inf``; ``count`` is the ``_count`` sample (= the ``+Inf`` bucket)
    and ``sum`` the ``_sum`` sample."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.cumulative) or not self.bounds or self.bounds[-1] != INF:
            raise HistogramError("a histogram needs one cumulative count per bucket and a +Inf bucket")
        if list(self.bounds) != sorted(self.bounds) or len(set(self.bounds)) != len(self.bounds):
            raise HistogramError("bucket bounds must be distinct and increasing")

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> Histogram:
        return cls(tuple(bounds), (0.0,) * len(bounds), 0.0, 0.0)

    def per_bucket(self) -> tuple[float, ...]:
        """Observations in each bucket alone (the cumulative counts differenced)."""
        return tuple(c - p for c, p in zip(self.cumulative, (0.0, *self.cumulative[:-1])))

    def __add__(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise HistogramError(f"different buckets: {self.bounds} and {other.bounds}")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative)),
                         self.count + other.count, self.sum + other.sum)


def _matches(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def parse_histogram(text: str, name: str, match: Mapping[str, str] | None = None) -> Histogram | None:
    """The histogram family ``name`` in exposition ``text``, its series summed; None when absent.

    ``match``: keep only series whose labels have these values (e.g. ``model_name``); a
    label the series do not carry does not filter. A family that exists but has no
    series yet (SGLang creates its labelled series at the first observation) is None
    too: the caller differences it against an empty histogram of the same buckets."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    count = total = 0.0
    seen = False
    for fam in text_string_to_metric_families(text):
        if fam.name != name or fam.type != "histogram":
            continue
        want = {k: v for k, v in (match or {}).items()
                if any(k in s.labels for s in fam.samples)}
        for s in fam.samples:
            if not _matches(s.labels, want):
                continue
            if s.name == name + "_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + float(s.value)
                seen = True
            elif s.name == name + "_count":
                count += float(s.value)
            elif s.name == name + "_sum":
                total += float(s.value)
    if not seen:
        return None
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), count, total)


def histogram_families(text: str) -> tuple[str, ...]:
    """Names of every histogram family in ``text`` (what the engine offers)."""
    from prometheus_client.parser import text_string_to_metric_families

    return tuple(sorted({f.name for f in text_string_to_metric_families(text) if f.type == "histogram"}))


def difference(before: Histogram | None, after: Histogram) -> Histogram:
    """The observations made between two readings: ``after - before``, bucket by bucket.

    ``before`` None = the series did not exist yet (nothing observed). Raises
    :class:`HistogramError` when the buckets differ or any count went down (the engine
    restarted between the readings: its counts began again from zero)."""
    if before is None:
        return after
    if before.bounds != after.bounds:
        raise HistogramError(f"the buckets changed between readings: {before.bounds} -> {after.bounds}")
    cum = tuple(a - b for a, b in zip(after.cumulative, before.cumulative))
    if any(c < 0 for c in cum) or after.count < before.count:
        raise HistogramError("a bucket count went down between readings (the engine restarted?)")
    return Histogram(after.bounds, cum, after.count - before.count, after.sum - before.sum)


@dataclass(frozen=True)
class Estimate:
    """A quantile estimate and the bucket ``(lower, upper]`` it was interpolated in: the truth
    lies in that bucket (``upper`` is +Inf when the rank fell past the highest finite bound,
    and ``value`` is then that bound, as Prometheus answers)."""

    value: float
    lower: float
    upper: float


def quantile_estimate(q: float, h: Histogram) -> Estimate | None:
    """Prometheus' ``histogram_quantile(q, ...)`` over these buckets; None where it gives NaN.

    Follows ``bucketQuantile`` (prometheus/prometheus promql/quantile.go): rank = q x
    observations; the first bucket whose cumulative count reaches the rank; linear
    interpolation between its lower edge (the previous bound, or 0 for the first
    bucket when its bound is above 0) and its upper bound; the highest finite bound
    when the rank is in ``+Inf``. Cumulative counts that decrease are made monotonic
    first (``ensureMonotonic``). q must be in [0, 1]."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} is not in [0, 1]")
    bounds = h.bounds
    cum: list[float] = []
    top = -INF
    for c in h.cumulative:  # ensureMonotonic: the envelope of the counts
        top = max(top, c)
        cum.append(top)
    if len(bounds) < 2 or cum[-1] <= 0:
        return None
    rank = q * cum[-1]
    b = 0
    while b < len(bounds) - 1 and cum[b] < rank:  # sort.Search over all but the +Inf bucket
        b += 1
    if b == len(bounds) - 1:
        return Estimate(bounds[-2], bounds[-2], INF)
    if b == 0 and bounds[0] <= 0:
        return Estimate(bounds[0], -INF, bounds[0])
    start, end, count = 0.0, bounds[b], cum[b]
    if b > 0:
        start = bounds[b - 1]
        count -= cum[b - 1]
        rank -= cum[b - 1]
    if count == 0:  # q = 0 with empty first buckets: 0/0 there, a NaN
        return None
    return Estimate(start + (end - start) * (rank / count), start, end)


def bucket_quantile(q: float, h: Histogram) -> float | None:
    """The value of :func:`quantile_estimate` (what ``histogram_quantile`` prints)."""
    e = quantile_estimate(q, h)
    return None if e is None else e.value


def bucket_of(value: float, bounds: Sequence[float]) -> tuple[float, float]:
    """The bucket ``(lower, upper]`` a value falls in with these bounds (lower 0 for the first)."""
    for i, b in enumerate(bounds):
        if value <= b:
            return (bounds[i - 1] if i else min(0.0, b), b)
    return (bounds[-1], INF)


QUANTILES = (0.5, 0.9, 0.99)


def summarize(h: Histogram) -> dict[str, Any]:
    """``count``, exact ``mean`` (``_sum / _count``) and p50/p90/p99 estimates, each with its
    bucket ``[lower, upper]`` (None for an infinite edge: JSON has no infinity)."""
    out: dict[str, Any] = {"count": h.count, "mean": h.sum / h.count if h.count else None}
    for q in QUANTILES:
        e = quantile_estimate(q, h)
        key = f"p{round(q * 100)}"
        out[key] = None if e is None else e.value
        out[key + "_bucket"] = None if e is None else [x if math.isfinite(x) else None for x in (e.lower, e.upper)]
    return out
