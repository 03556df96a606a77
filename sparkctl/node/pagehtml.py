"""The status page's HTML, rendered on the head from the page's document. Pure.

No external asset, no script: inline style, inline SVG plots, a ``<meta http-equiv=refresh>``
to follow the cluster. Every value shown comes from the document ``/status.json`` serves
(the same field names as ``sparkctl status --json``); each cell names its field
(``data-node``, ``data-field``) so a reader or a test finds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any

FIELDS = ("reachable", "rank", "replica", "alive", "engine_procs", "sm_mhz", "clock_lock", "power_w", "temp_c",
          "mem_available_gib", "watchdog")
STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
.fail{background:#fdd}.warn{background:#ffe9b3}.ok{background:#e3f6e3}h2{margin-top:1.2em;font-size:1.1em}
svg{border:1px solid #ddd;background:#fafafa;margin-right:1em}.muted{color:#777}"""
PAGE = "status page"  # the page's name in messages


def _v(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _cell(node: str, field: str, value: Any, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-node="{escape(node)}" data-field="{escape(field)}">{escape(_v(value))}</td>'


def _plot(title: str, series: Mapping[str, Sequence[tuple[float, float]]], unit: str) -> str:
    """One small SVG line plot: a line per node over the ring buffer's window."""
    w, h, pad = 360, 120, 28
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f'<svg width="{w}" height="{h}" role="img"><text x="8" y="20">{escape(title)}: no samples yet</text></svg>'
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
    lo, hi = (lo - 1, hi + 1) if hi == lo else (lo, hi)
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
    out = [f'<svg width="{w}" height="{h}" role="img" aria-label="{escape(title)}">',
           f'<text x="4" y="12" font-size="11">{escape(title)} ({escape(unit)}), last {int(t1 - t0)} s</text>',
           f'<text x="4" y="{pad + 2}" font-size="10">{hi:g}</text><text x="4" y="{h - 4}" font-size="10">{lo:g}</text>']
    for i, (node, s) in enumerate(sorted(series.items())):
        if not s:
            continue
        xy = " ".join(f"{pad + (w - pad - 4) * ((t - t0) / (t1 - t0) if t1 > t0 else 1):.1f},"
                      f"{h - 8 - (h - pad - 8) * (v - lo) / (hi - lo):.1f}" for t, v in s)
        col = colours[i % len(colours)]
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{xy}"/>')
        out.append(f'<text x="{w - 70}" y="{24 + 11 * i}" font-size="10" fill="{col}">{escape(node)}</text>')
    out.append("</svg>")
    return "".join(out)


def render(doc: Mapping[str, Any]) -> str:
    rec = doc.get("record") or None
    at = datetime.fromtimestamp(float(doc.get("at") or 0), timezone.utc).isoformat(timespec="seconds")
    parts = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="refresh" content="{int(max(5, float(doc.get("interval_s") or 5) * 2))}">',
             "<title>sparkctl status</title>", f"<style>{STYLE}</style></head><body>",
             f'<h1>sparkctl status</h1><p class="muted">sampled at <span id="at">{escape(at)}</span> by the head\'s '
             "exporter; read-only</p>"]
    if rec:
        parts.append('<table id="record"><tr><th class="l">profile</th><th class="l">state</th><th class="l">engine</th>'
                     '<th class="l">served name</th><th class="l">since</th></tr><tr>'
                     + "".join(f'<td class="l" data-field="{k}">{escape(_v(rec.get(k)))}</td>'
                               for k in ("profile", "state", "engine", "served_name", "updated_at")) + "</tr></table>")
    else:
        parts.append('<p id="record">no run record: nothing was started on this cluster</p>')
    rates = doc.get("rates") or {}
    ep = ", ".join(f"{h}: {e.get('state')}" for h, e in (doc.get("endpoint") or {}).items()) or "n/a"
    parts.append('<table id="rates"><tr><th class="l">endpoint</th><th>tokens/s</th><th>requests/s</th></tr><tr>'
                 f'<td class="l" data-field="endpoint_state">{escape(ep)}</td>'
                 f'<td data-field="tokens_per_s">{escape(_v(rates.get("tokens_per_s")))}</td>'
                 f'<td data-field="requests_per_s">{escape(_v(rates.get("requests_per_s")))}</td></tr></table>')
    parts.append('<h2>nodes and ranks</h2><table id="nodes"><tr><th class="l">node</th>'
                 + "".join(f"<th>{f}</th>" for f in FIELDS) + "</tr>")
    for row in doc.get("nodes") or []:
        n = str(row.get("node"))
        parts.append(f'<tr><td class="l">{escape(n)}</td>' + "".join(_cell(n, f, row.get(f)) for f in FIELDS) + "</tr>")
    parts.append("</table>")
    hist = doc.get("history") or []
    for field, title, unit in (("mem_available_gib", "MemAvailable", "GiB"), ("power_w", "GPU power", "W")):
        series: dict[str, list[tuple[float, float]]] = {}
        for s in hist:
            for n, vals in (s.get("nodes") or {}).items():
                if vals.get(field) is not None:
                    series.setdefault(n, []).append((float(s["t"]), float(vals[field])))
        parts.append(_plot(title, series, unit))
    drift = doc.get("drift") or []
    parts.append('<h2>drift</h2><ul id="drift">' + ("".join(f"<li>{escape(d)}</li>" for d in drift)
                                                    or "<li>none</li>") + "</ul>")
    for g in doc.get("gateways") or []:
        node = str(g.get("node"))
        state = "up" if g.get("up") else f"down ({_v(g.get('error'))})"
        parts.append(f'<h2>gateway</h2><p id="gateway" data-node="{escape(node)}">{escape(node)}:'
                     f'{escape(_v(g.get("port")))} <span data-field="gateway_state">{escape(state)}</span></p>'
                     '<table id="gateway-backends"><tr><th class="l">model</th><th class="l">backend</th>'
                     '<th class="l">status</th><th class="l">healthy</th></tr>')
        for w in g.get("workers") or []:
            parts.append(f'<tr><td class="l">{escape(_v(w.get("model")))}</td><td class="l">{escape(_v(w.get("url")))}'
                         f'</td><td class="l" data-url="{escape(_v(w.get("url")))}">{escape(_v(w.get("status")))}</td>'
                         f'<td class="l">{"yes" if w.get("healthy") else "no"}</td></tr>')
        parts.append("</table>")
    by_stack = doc.get("laws_by_stack")
    if by_stack is None:  # a document from an exporter before stacks
        by_stack = {"default": doc.get("laws") or {}}
    for stack, laws in sorted((by_stack or {"default": {}}).items(), key=lambda kv: kv[0] != "default"):
        tid = "laws" if stack == "default" else f"laws-{stack}"
        title = "laws" if stack == "default" else f"laws of stack {stack}"
        parts.append(f'<h2>{escape(title)}</h2><p class="muted">last judged {escape(_v(laws.get("at")))} '
                     f'(profile {escape(_v(laws.get("profile")))})</p><table id="{escape(tid)}" '
                     f'data-stack="{escape(stack)}"><tr><th class="l">law</th><th class="l">node</th>'
                     '<th class="l">subject</th><th class="l">status</th><th class="l">observed</th></tr>')
        for v in laws.get("verdicts") or []:
            st = str(v.get("status"))
            parts.append(f'<tr class="{escape(st)}"><td class="l">{escape(_v(v.get("law")))}</td>'
                         f'<td class="l">{escape(_v(v.get("node")))}</td><td class="l">{escape(v.get("subject") or "")}'
                         f'</td><td class="l" data-law="{escape(_v(v.get("law")))}" '
                         f'data-node="{escape(_v(v.get("node")))}">{escape(st)}</td>'
                         f'<td class="l">{escape(_v(v.get("observed")))}</td></tr>')
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
