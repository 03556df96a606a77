"""Reports over bench run directories: the comparison table, plots, and A/B ratios.

Owns: reading run directories (:func:`~sparkctl.bench.results.load_run`) and
the published reference figures (``published-numbers.yaml``, shipped in this
package), building the field reports' comparison table (rows: prefill at
8K/32K/128K, decode at one stream, 4 and 16 concurrent aggregate; one column
per measured stack, then the reference columns), writing ``report.md``,
optional ``report.html`` and PNG plots (matplotlib, Agg backend), and the
per-metric ratios of ``compare``.

Must not: print (the CLI does), run benchmarks, or recompute a metric from
anything but the run's own rows and event logs.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sparkctl.bench.events import Event
from sparkctl.bench.metrics import request_metrics, summarize
from sparkctl.bench.results import HEADLINE, LoadedRun, load_run, to_float, write_atomic
from sparkctl.errors import ConfigError, Ref

# (key, row title): the rows of the field reports' table
TABLE_ROWS: tuple[tuple[str, str], ...] = (
    ("prefill_8192", "Prefill 8K (tok/s)"),
    ("prefill_32768", "Prefill 32K (tok/s)"),
    ("prefill_131072", "Prefill 128K (tok/s)"),
    ("decode_1", "Decode, 1 stream (tok/s)"),
    ("aggregate_4", "4 concurrent (aggregate tok/s)"),
    ("aggregate_16", "16 concurrent (aggregate tok/s)"),
)


@dataclass(frozen=True)
class Cell:
    median: float | None
    min: float | None = None
    max: float | None = None
    n: int = 0
    flagged: bool = False
    """Some repeats of the point were flagged (short answers, cached, errors) and left out."""


@dataclass(frozen=True)
class Column:
    label: str
    cells: Mapping[str, Cell]
    reference: bool = False
    note: str = ""


# --------------------------------------------------------------------------- published figures


def load_published(path: str | Path | None = None) -> dict[str, Any]:
    """The published-numbers YAML: ``path``, else the copy shipped in this package."""
    if path is None:
        text = resources.files("sparkctl.bench").joinpath("published-numbers.yaml").read_text()
        where = "sparkctl/bench/published-numbers.yaml"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"no such file {p}", Ref(file=str(p)))
        text, where = p.read_text(), str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML: {exc}", Ref(file=where)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping", Ref(file=where))
    return data


def _ref_cells(stack: Mapping[str, Any]) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for n, v in (stack.get("prefill_tok_s") or {}).items():
        cells[f"prefill_{int(n)}"] = Cell(float(v), n=1)
    if stack.get("decode_1_stream_tok_s") is not None:
        cells["decode_1"] = Cell(float(stack["decode_1_stream_tok_s"]), n=1)
    for c, v in (stack.get("aggregate_tok_s") or {}).items():
        cells[f"aggregate_{int(c)}"] = Cell(float(v), n=1)
    return cells


REFERENCE_NOTES = {
    "ds41f": "ring report, TP4, 2000 MHz cap, stock 4 KiB kernel, mean of 2",
    "ds41f_author": "ds41f README (spark-ds41f-1022, 64 KiB kernel, author's suite; long row 131K source text)",
    "tensorfold": "ring report, TP4, 2000 MHz cap, mean of 2",
    "tensorfold_author": "TensorFold README, median of 3, temperature 0.7, thinking on",
}


def reference_columns(published: Mapping[str, Any]) -> list[Column]:
    """Columns from the published figures (ring report stacks, then the TP2 reference)."""
    cols: list[Column] = []
    ring = published.get("four_node_ring_tp4") or {}
    for key, stack in (ring.get("stacks") or {}).items():
        if isinstance(stack, dict):
            cols.append(Column(f"{key} (published)", _ref_cells(stack), True, REFERENCE_NOTES.get(key, "")))
    two = (published.get("two_node_tp2") or {}).get("for_reference_from_4node_report") or {}
    if two:
        cells = {}
        if two.get("decode_1_stream_tok_s") is not None:
            cells["decode_1"] = Cell(float(two["decode_1_stream_tok_s"]), n=1)
        if two.get("prefill_32k_tok_s") is not None:
            cells["prefill_32768"] = Cell(float(two["prefill_32k_tok_s"]), n=1)
        cols.append(Column("TP2 (published)", cells, True, "same model on two Sparks, ring report"))
    return cols


# --------------------------------------------------------------------------- measured columns


def _ratio(a: float | None, b: float | None) -> float:
    """a / b, 0 when either is missing or zero (a bar of nothing, not a gap)."""
    return a / b if a and b else 0.0


def _cell(run: LoadedRun, suite: str, metric: str, match: Mapping[str, str]) -> Cell:
    mine = [r for r in run.rows if r["suite"] == suite and all(r.get(k) == v for k, v in match.items())]
    valid = [r for r in mine if r.get("valid") == "1"]
    s = summarize(to_float(r.get(metric)) for r in valid)
    return Cell(s.median, s.min, s.max, s.n, flagged=len(valid) < len(mine))


def measured_cells(run: LoadedRun) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for n in (8192, 32768, 131072):
        cells[f"prefill_{n}"] = _cell(run, "prefill", "prefill_tok_s", {"length_tokens": str(n)})
    dec = _cell(run, "decode", "decode_tok_s", {})
    if dec.median is None:  # a run without the decode suite: the single stream of the concurrency suite
        dec = _cell(run, "concurrency", "aggregate_tok_s", {"concurrency": "1"})
    cells["decode_1"] = dec
    for c in (4, 16):
        cells[f"aggregate_{c}"] = _cell(run, "concurrency", "aggregate_tok_s", {"concurrency": str(c)})
    return cells


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _fmt_cell(c: Cell | None, ranges: bool = False) -> str:
    if c is None or c.median is None:
        return "–"
    s = _fmt(c.median)
    if ranges and c.n > 1 and c.min is not None and c.max is not None:
        s += f" ({_fmt(c.min)}–{_fmt(c.max)})"
    return s + (" †" if c.flagged else "")


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Report:
    runs: tuple[LoadedRun, ...]
    columns: tuple[Column, ...]
    markdown: str
    files: tuple[str, ...]


def comparison_table(columns: Sequence[Column], ranges: bool = False) -> list[list[str]]:
    """Rows of strings: a header, then one row per :data:`TABLE_ROWS` entry. Pure."""
    table = [["", *[c.label for c in columns]]]
    for key, title in TABLE_ROWS:
        table.append([title, *[_fmt_cell(c.cells.get(key), ranges) for c in columns]])
    return table


def _md_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join(["---"] + ["---:"] * (len(rows[0]) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def _run_facts(run: LoadedRun) -> str:
    cfg = run.meta.get("config", {})
    eff = run.meta.get("effective", {})
    keys = ("engine", "engine_version", "profile", "profile_digest", "model", "topology", "tp_size", "kernel",
            "page_size_kib", "waivers")
    facts = ", ".join(f"{k} {cfg[k]}" for k in keys if cfg.get(k) not in (None, "", [], {}))
    srcs = sorted({r.get("token_source") or "?" for r in run.rows})
    return (f"- **{run.label}** ({run.path}): {facts or 'no configuration recorded'}; clock cap {run.clock_cap}; "
            f"{eff.get('repeats', '?')} repeats per point; token counts from {', '.join(srcs)}; "
            f"started {run.meta.get('started_utc', '?')}")


def _extras(run: LoadedRun) -> list[str]:
    """One line per other suite's headline figure."""
    lines: list[str] = []
    points = list(dict.fromkeys((r["suite"], r["point"]) for r in run.rows))
    for suite, point in points:
        if suite in ("prefill", "decode", "concurrency") or (suite == "quality" and point.count("/") > 1):
            continue
        metric = HEADLINE.get(suite, "")
        c = _cell(run, suite, metric, {"point": point})
        extra = ""
        if suite == "peak":
            extra = " (community ruler: warmed, ignore_eos, decode-only)"
        if suite == "warm-prefix":
            cold, warm = _cell(run, suite, "cold_s", {"point": point}), _cell(run, suite, "warm_s", {"point": point})
            extra = f" (cold {_fmt_cell(cold)} s, warm {_fmt_cell(warm)} s)"
        if suite == "longctx":
            found = [r.get("found") for r in run.rows if r["point"] == point]
            depth = [r.get("depth_tokens") for r in run.rows if r["point"] == point]
            extra = f" (found {sum(f == '1' for f in found)}/{len(found)}, depth {', '.join(d for d in depth if d)} tokens)"
        if suite == "quality":
            extra = " % of scenarios passed"
        val = _fmt_cell(c, ranges=True) if suite != "soak" else (f"{c.median:.4f}" if c.median is not None else "–")
        lines.append(f"  - {point}: {metric} {val}{extra}")
    peaks = [(_cell(run, "peak", "decode_tok_s", {"point": p}), p) for s, p in points if s == "peak"]
    peaks = [(c, p) for c, p in peaks if c.median is not None]
    if peaks:
        best, p = max(peaks, key=lambda t: t[0].median or 0.0)
        lines.append(f"  - peak single stream (community ruler, best content {p.split('/')[-1]}): {_fmt_cell(best)} tok/s")
    tele = (run.meta.get("summary") or {}).get("telemetry") or {}
    for suite, t in tele.items():
        nodes = ", ".join(f"{n} mean {v['mean_w']:.0f} W / peak {v['peak_w']:.0f} W" for n, v in t["nodes"].items())
        jpt = t.get("j_per_completion_token")
        lines.append(f"  - power during {suite}: {nodes or 'no samples'}"
                     + (f"; {jpt:.2f} J per completion token" if jpt else ""))
    return lines


def build_report(run_dirs: Sequence[str | Path], out_dir: str | Path, *, html_out: bool = False,
                 published_path: str | Path | None = None, plots: bool = True) -> Report:
    """Read the runs, write ``report.md`` (+ ``report.html``) and the PNG plots into ``out_dir``."""
    if not run_dirs:
        raise ConfigError("no run directories given", hint="sparkctl bench report RUN_DIR...")
    runs = tuple(load_run(p) for p in run_dirs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    published = load_published(published_path)
    labels = _unique_labels(runs)
    measured = [Column(labels[i], measured_cells(r)) for i, r in enumerate(runs)]
    columns = tuple(measured + reference_columns(published))
    files: list[str] = []
    pngs = write_plots(runs, labels, out) if plots else []
    files += pngs
    md = [f"# Bench report: {', '.join(labels)}", "",
          f"Model: {published.get('model', '?')} (published columns). Definitions: docs/bench-metrics.md.", "",
          _md_table(comparison_table(columns)), "",
          "Measured columns: median over repeats (min–max below); † = some repeats were flagged and left out "
          "(short answers, cached prefixes, errors). Published columns come from published-numbers.yaml:", ""]
    md += [f"- {c.label}: {c.note}" for c in columns if c.reference and c.note]
    md += ["", "## Measured, median (min–max)", "", _md_table(comparison_table(measured, ranges=True)), "",
           "## Runs", ""]
    for i, r in enumerate(runs):
        md.append(_run_facts(r).replace(f"**{r.label}**", f"**{labels[i]}**", 1))
        md += _extras(r)
    md += _server_side(runs, labels)
    if pngs:
        md += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    text = "\n".join(md) + "\n"
    write_atomic(out / "report.md", text)
    files.insert(0, str(out / "report.md"))
    if html_out:
        write_atomic(out / "report.html", _html(columns, measured, text, pngs))
        files.insert(1, str(out / "report.html"))
    return Report(runs, columns, text, tuple(files))


def _server_side(runs: Sequence[LoadedRun], labels: Sequence[str]) -> list[str]:
    """``## Server-side and client-side latency``: runs made with ``--server-metrics``."""
    from sparkctl.bench.servermetrics import TABLE_HEADER, notes, table_rows

    md: list[str] = []
    for label, r in zip(labels, runs):
        rec = r.meta.get("server_metrics")
        if not rec:
            continue
        md += ["", f"### {label}", ""]
        rows = table_rows(rec)
        if rows:
            md += [_md_table([list(TABLE_HEADER), *rows]), ""]
        md += [f"- {line}" for line in notes(rec)]
    if md:
        md = ["", "## Server-side and client-side latency", "",
              "The engine's own histograms (read before and after each suite) beside the client's figures; "
              "what each includes: docs/bench-metrics.md, \"Server-side figures\"."] + md
    return md


def _unique_labels(runs: Sequence[LoadedRun]) -> list[str]:
    labels: list[str] = []
    for r in runs:
        base = r.label
        caps = {x.clock_cap for x in runs if x.label == base}
        lab = f"{base} ({r.clock_cap})" if len(caps) > 1 else base
        k, cand = 2, lab
        while cand in labels:
            cand, k = f"{lab} #{k}", k + 1
        labels.append(cand)
    return labels


def _html(columns: Sequence[Column], measured: Sequence[Column], md: str, pngs: Sequence[str]) -> str:
    def table(rows: list[list[str]]) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    imgs = "".join(f'<figure><img src="{html.escape(Path(p).name)}" alt="{html.escape(Path(p).stem)}"></figure>'
                   for p in pngs)
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
             "img{max-width:100%}pre{white-space:pre-wrap}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Bench report</title><style>{style}</style>"
            f"</head><body><h1>Bench report</h1>{table(comparison_table(columns))}"
            f"<h2>Measured, median (min–max)</h2>{table(comparison_table(measured, ranges=True))}{imgs}"
            f"<h2>Details</h2><pre>{html.escape(md)}</pre></body></html>\n")


# --------------------------------------------------------------------------- plots


def request_samples(run: LoadedRun, suites: Sequence[str] = ("decode", "concurrency")) -> tuple[list[float], list[float]]:
    """TTFT and ITL samples (seconds) of the measured requests of ``suites``, from events.jsonl."""
    path = run.path / "events.jsonl"
    if not path.is_file():
        return [], []
    heads: dict[str, dict[str, Any]] = {}
    logs: dict[str, list[Event]] = {}
    with path.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            if "request" in d:
                h = d["request"]
                heads[h["request_id"]] = h
                logs[h["request_id"]] = []
                continue
            rid = d.pop("request_id", None)
            if rid in logs:
                logs[rid].append(Event.from_dict(d))
    ttft: list[float] = []
    itl: list[float] = []
    for rid, ev in logs.items():
        lab = heads[rid].get("labels") or {}
        if lab.get("suite") not in suites or lab.get("warmup") or heads[rid].get("status") != "ok":
            continue
        m = request_metrics(ev)
        if m.ttft_s is not None:
            ttft.append(m.ttft_s)
        itl.extend(m.itl_s)
    return ttft, itl


def write_plots(runs: Sequence[LoadedRun], labels: Sequence[str], out: Path) -> list[str]:
    """prefill by length, aggregate by concurrency, TTFT and ITL distributions, clock cap on/off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []

    def series(run: LoadedRun, suite: str, key: str, metric: str) -> list[tuple[float, Cell]]:
        xs = sorted({x for r in run.rows if r["suite"] == suite and (x := to_float(r.get(key)))})
        return [(x, _cell(run, suite, metric, {key: str(int(x))})) for x in xs if x is not None]

    def line_plot(name: str, suite: str, key: str, metric: str, xlabel: str, ylabel: str, title: str,
                  logx: bool) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        drawn = False
        for run, lab in zip(runs, labels):
            pts = [(x, c) for x, c in series(run, suite, key, metric) if c.median is not None]
            if not pts:
                continue
            xs = [x for x, _ in pts]
            med = [c.median or 0.0 for _, c in pts]
            lo = [m - (c.min if c.min is not None else m) for m, (_, c) in zip(med, pts)]
            hi = [(c.max if c.max is not None else m) - m for m, (_, c) in zip(med, pts)]
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=lab)
            drawn = True
        if not drawn:
            plt.close(fig)
            return
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(str(path))

    line_plot("prefill_by_length.png", "prefill", "length_tokens", "prefill_tok_s", "prompt tokens",
              "prefill tok/s (prompt tokens / TTFT)", "Prefill throughput by prompt length", True)
    line_plot("aggregate_by_concurrency.png", "concurrency", "concurrency", "aggregate_tok_s",
              "requests released together", "aggregate tok/s", "Aggregate decode throughput", True)

    samples = [request_samples(r) for r in runs]
    for idx, (name, title, unit) in enumerate((("ttft_distribution.png", "Time to first token", "TTFT (ms)"),
                                              ("itl_distribution.png", "Inter-token latency", "ITL (ms)"))):
        data = [[v * 1e3 for v in s[idx]] for s in samples]
        if not any(data):
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        keep = [(d, lab) for d, lab in zip(data, labels) if d]
        ax.boxplot([d for d, _ in keep], showfliers=True)
        ax.set_xticks(range(1, len(keep) + 1), [lab for _, lab in keep])
        ax.set_ylabel(unit)
        ax.set_title(f"{title} (decode and concurrency requests)")
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(str(path))

    caps = {r.clock_cap for r in runs}
    if len(caps) > 1:
        keys = [k for k, _ in TABLE_ROWS]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(runs)
        base_vals = {k: next((measured_cells(r)[k].median for r in runs if measured_cells(r)[k].median), None)
                     for k in keys}
        for i, (run, lab) in enumerate(zip(runs, labels)):
            cells = measured_cells(run)
            rel = [_ratio(cells[k].median, base_vals[k]) for k in keys]
            ax.bar([j + i * width for j in range(len(keys))], rel, width, label=f"{lab}")
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(keys))],
                      [t.split(" (")[0] for _, t in TABLE_ROWS], rotation=20, ha="right")
        ax.set_ylabel(f"relative to {labels[0]}")
        ax.set_title("Clock cap on vs off")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        path = out / "clock_cap.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(str(path))
    return files


# --------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Ratio:
    suite: str
    point: str
    metric: str
    a: float | None
    b: float | None
    ratio: float | None  # b / a


COMPARED_METRICS = ("prefill_tok_s", "decode_tok_s", "aggregate_tok_s", "ttft_s", "itl_p50_s", "itl_p99_s",
                    "stream_decode_median_tok_s", "cold_warm_ratio", "score", "found", "error_rate")


def compare_runs(a_dir: str | Path, b_dir: str | Path) -> tuple[LoadedRun, LoadedRun, list[Ratio]]:
    """B / A for every metric both runs measured at the same (suite, point)."""
    a, b = load_run(a_dir), load_run(b_dir)
    out: list[Ratio] = []
    points = list(dict.fromkeys((r["suite"], r["point"]) for r in a.rows))
    for suite, point in points:
        for metric in COMPARED_METRICS:
            ca = _cell(a, suite, metric, {"point": point})
            cb = _cell(b, suite, metric, {"point": point})
            if ca.median is None and cb.median is None:
                continue
            ratio = cb.median / ca.median if ca.median and cb.median is not None else None
            out.append(Ratio(suite, point, metric, ca.median, cb.median, ratio))
    return a, b, out
