"""The files of a bench run directory: their columns, and reading them back.

A run directory holds:

* ``results.csv``   one row per point and repeat, with the full configuration
  (:data:`CSV_COLUMNS`; the source of truth for reports);
* ``events.jsonl``  every request's raw event log (:func:`~sparkctl.bench.events.result_to_jsonl`);
* ``telemetry.csv`` per-node samples taken while the suites ran (:data:`TELEMETRY_COLUMNS`);
* ``run.json``      metadata: configuration, options, summaries, telemetry summary.

Owns the column lists, atomic writes of whole files, and :func:`load_run`.
Must not compute metrics (:mod:`sparkctl.bench.metrics`) or print.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.errors import ConfigError, Ref

SCHEMA_VERSION = 1

CONFIG_COLUMNS: tuple[str, ...] = (
    "schema_version", "sparkctl_version", "run_id", "label", "profile", "profile_digest", "engine",
    "engine_version", "model", "served_name", "base_url", "topology", "tp_size", "nodes", "clock_cap_mhz",
    "kernel", "page_size_kib", "waivers", "context_window_tokens", "context_window_source",
)
POINT_COLUMNS: tuple[str, ...] = (
    "suite", "point", "params", "repeat", "salt", "token_source", "prompt_token_source", "t_start_utc",
    "t_end_utc", "n_requests", "n_ok", "n_errors", "statuses", "valid", "flags",
)
PARAM_COLUMNS: tuple[str, ...] = (
    "length_tokens", "concurrency", "decode_tokens", "corpus", "content", "thinking", "scenario", "category",
    "depth_fraction",
)
METRIC_COLUMNS: tuple[str, ...] = (
    "prompt_tokens", "completion_tokens", "cached_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "tpot_s",
    "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_s", "aggregate_tok_s", "window_s", "stream_decode_median_tok_s",
    "stream_decode_min_tok_s", "stream_decode_max_tok_s", "ttft_p50_s", "ttft_max_s", "depth_tokens", "found",
    "score", "cold_s", "warm_s", "cold_warm_ratio", "cold_cached_tokens", "requests_per_s", "error_rate",
    "context_resets",
)
CSV_COLUMNS: tuple[str, ...] = CONFIG_COLUMNS + POINT_COLUMNS + PARAM_COLUMNS + METRIC_COLUMNS

TELEMETRY_COLUMNS: tuple[str, ...] = (
    "t_s", "t_utc", "suite", "node", "power_w", "sm_mhz", "temp_c", "event_reasons", "mem_available_gib",
)

# The number each suite is judged by (report tables, compare).
HEADLINE: dict[str, str] = {
    "prefill": "prefill_tok_s", "decode": "decode_tok_s", "concurrency": "aggregate_tok_s",
    "agent": "aggregate_tok_s", "peak": "decode_tok_s", "warm-prefix": "cold_warm_ratio", "longctx": "found",
    "quality": "score", "soak": "error_rate",
}


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _cell(r.get(c)) for c in columns})
    return buf.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def to_float(v: str | None) -> float | None:
    if v is None or v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return None


@dataclass(frozen=True)
class LoadedRun:
    """A run directory read back: rows as strings, the metadata as written."""

    path: Path
    rows: tuple[dict[str, str], ...]
    meta: dict[str, Any]
    telemetry: tuple[dict[str, str], ...]

    @property
    def label(self) -> str:
        cfg = self.meta.get("config", {})
        return str(self.meta.get("label") or cfg.get("profile") or cfg.get("engine") or self.path.name)

    @property
    def clock_cap(self) -> str:
        v = self.meta.get("config", {}).get("clock_cap_mhz")
        return "uncapped" if v in (None, "", "none") else f"{v} MHz"

    def valid_rows(self, suite: str | None = None, point: str | None = None) -> list[dict[str, str]]:
        return [r for r in self.rows if r.get("valid") == "1" and (suite is None or r["suite"] == suite)
                and (point is None or r["point"] == point)]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load_run(path: str | Path) -> LoadedRun:
    """Read a run directory; a missing or malformed ``results.csv`` is a ConfigError."""
    p = Path(path)
    csv_path = p / "results.csv"
    if not csv_path.is_file():
        raise ConfigError(f"{p} is not a bench run directory (no results.csv)", Ref(file=str(p)),
                          hint="pass the directory `sparkctl bench` wrote (see its --out)")
    rows = _read_csv(csv_path)
    missing = [c for c in ("suite", "point", "valid") if rows and c not in rows[0]]
    if missing:
        raise ConfigError(f"results.csv lacks columns {missing}", Ref(file=str(csv_path)))
    meta: dict[str, Any] = {}
    if (p / "run.json").is_file():
        try:
            meta = json.loads((p / "run.json").read_text())
        except ValueError as exc:
            raise ConfigError(f"run.json is not JSON: {exc}", Ref(file=str(p / "run.json"))) from None
    tele = _read_csv(p / "telemetry.csv") if (p / "telemetry.csv").is_file() else []
    return LoadedRun(p, tuple(rows), meta, tuple(tele))
