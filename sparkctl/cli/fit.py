"""``sparkctl fit PROFILE``: will the model fit, per node and rank, with the figures (read-only)."""

from __future__ import annotations

import os

import click
from rich.table import Table

from sparkctl.cli.base import (
    Ctx,
    cli,
    emit_json,
    escape,
    inventory_option,
    json_option,
    make_transport,
    out,
    pass_ctx,
    set_option,
    with_transport_options,
)
from sparkctl.errors import CheckFailed
from sparkctl.model.memfit import gib


@cli.command("fit")
@click.argument("profile")
@inventory_option
@set_option
@click.option("--hub", "use_hub", is_flag=True,
              help="read the model's headers from the Hub (HTTP Range, header bytes only) even where a node has them")
@with_transport_options
@json_option
@pass_ctx
def fit_cmd(c: Ctx, profile: str, sets: tuple[str, ...], use_hub: bool, connect_timeout_s: float,
            command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Weights per rank, KV cache, overheads and what each node has: refuse (exit 4) what would over-commit.

    The model's shape comes from its own files: config.json and the safetensors
    headers, or the GGUF's metadata and tensor infos, read on each node (never the
    weights); a node without the files (or --hub) reads them from the Hub
    (HF_ENDPOINT, the token as huggingface_hub finds it). The same arithmetic is
    the memory_fit law, judged by `check` and before `up` (docs/LAWS.md).
    """
    from sparkctl.ops import hub
    from sparkctl.ops.fit import run_fit
    from sparkctl.ops.hubfetch import find_token

    res = c.resolve(profile, sets)
    inv = c.inventory()
    endpoint = os.environ.get("HF_ENDPOINT") or hub.DEFAULT_ENDPOINT
    found = find_token()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        report = run_fit(res, inv, tr, use_hub=use_hub, endpoint=endpoint, token=found.value if found else None)
    if as_json:
        emit_json(report.to_dict())
    else:
        _print(report)
    if not report.ok:
        bad = [n for n in report.nodes if n.fit is None or not n.fit.ok]
        first = bad[0]
        why = first.error or (first.fit.problems[0] if first.fit else "")
        raise CheckFailed(f"fit {profile}: refused on {', '.join(n.node for n in bad)}; {first.node}: {why}",
                          hint="lower model.context_len_tokens, the concurrency or laws.gpu_memory_utilization, "
                               "or use more ranks (docs/LAWS.md, memory_fit)")


def _print(report: object) -> None:
    from sparkctl.ops.fit import FitReport

    assert isinstance(report, FitReport)
    m = report.model
    if m:
        mla = f", MLA latent {m['mla_latent']}" if m.get("mla_latent") else ""
        out.print(f"{report.profile}: {m['kind']} {m['arch']}, {m['layers']} layers, {m['heads']} heads, "
                  f"{m['kv_heads']} KV heads x {m['head_dim']}{mla}, {gib(m['weight_bytes'])} of weights",
                  markup=False)
    t = Table(box=None, pad_edge=False)
    for col in ("node", "rank", "weights", "KV/token", "KV cache", "overhead", "engine holds", "MemAvailable",
                "headroom", "verdict"):
        t.add_column(col, overflow="fold")
    for n in report.nodes:
        f = n.fit
        if f is None:
            t.add_row(n.node, str(n.rank), *["-"] * 7, f"[red]cannot judge[/] {escape(n.error)}")
            continue
        verdict = "[green]fits[/]" if f.ok else "[bold red]refused[/]"
        t.add_row(n.node, str(n.rank), gib(f.weights_bytes), f"{f.kv_bytes_per_token:,.0f} B",
                  f"{gib(f.kv_cache_bytes)} ({f.kv_tokens:,} tok)", gib(f.overhead_bytes), gib(f.committed_bytes),
                  gib(f.node.available_bytes), gib(f.headroom_bytes), verdict)
    out.print(t)
    for n in report.nodes:
        f = n.fit
        if f is None:
            continue
        lines = [f"{n.node}: headers from {n.source}; KV {f.kv_dtype}; context {f.context_tokens:,}, "
                 f"concurrency {f.concurrency} ({f.concurrency_source}); max concurrency at full context "
                 f"{f.max_concurrency:.2f}x; overhead: {f.overhead_note}"]
        if f.replicated:
            lines.append(f"  replicated on every rank: {gib(f.replicated_bytes)} ({len(f.replicated)} tensor groups, "
                         f"e.g. {', '.join(f.replicated[:3])})")
        if f.budget_bytes:
            lines.append(f"  the engine's fraction: {gib(f.budget_bytes)} of MemTotal {gib(f.node.total_bytes)}")
        for p in f.problems:
            lines.append(f"  refused: {p}")
        for ln in lines:
            out.print(escape(ln))
