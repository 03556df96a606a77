"""The weights command group: fetch and sync."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from sparkctl.cli.base import (
    Ctx,
    cli,
    emit_json,
    err_console,
    escape,
    inventory_option,
    json_option,
    make_transport,
    out,
    pass_ctx,
    with_transport_options,
)
from sparkctl.errors import ConfigError

# --------------------------------------------------------------------------- weights


@cli.group("weights")
def weights_group() -> None:
    """One box downloads, the others receive over the cables (the download law)."""


def _weights_progress(quiet: bool) -> Any:
    console = err_console()

    def cb(p: Any) -> None:
        if quiet:
            return
        pct = f"{100 * p.bytes_done / p.bytes_total:5.1f}%" if getattr(p, "bytes_total", 0) else "     "
        rate = f"{getattr(p, 'rate_Bps', 0) / 1e6:8.1f} MB/s"
        console.print(f"{p.node:<9} {p.phase:<8} {pct} {rate}  {escape(str(p.file or ''))}")

    return cb


@weights_group.command("fetch")
@click.argument("profile")
@inventory_option
@click.option("--node", required=True, help="the one node that downloads")
@click.option("--url", required=True, help="what to download (one file; run once per file)")
@click.option("--connections", type=int, default=8, show_default=True)
@click.option("--sha256", help="expected checksum")
@with_transport_options
@json_option
@pass_ctx
def weights_fetch_cmd(c: Ctx, profile: str, node: str, url: str, connections: int, sha256: str | None,
                      connect_timeout_s: float, command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Parallel ranged download with per-chunk resume, into the profile's weights path on NODE."""
    from sparkctl.ops.weights import fetch

    res = c.resolve(profile)
    inv = c.inventory()
    if node not in inv.names:
        raise ConfigError(f"--node {node}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    wp = res.profile.model.weights_path
    dest = wp if wp.endswith(url.rsplit("/", 1)[-1]) else f"{wp.rstrip('/')}/{url.rsplit('/', 1)[-1].split('?')[0]}"
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        rep = fetch(inv, tr, node, url, dest, connections=connections, sha256=sha256,
                    progress=_weights_progress(as_json))
    if as_json:
        emit_json(asdict(rep))
    else:
        out.print(f"{node}: {rep.bytes:,} bytes in {rep.seconds:.1f} s ({rep.rate_Bps / 1e6:.1f} MB/s) -> {rep.dest}",
                  markup=False)


@weights_group.command("sync")
@click.argument("profile")
@inventory_option
@click.option("--from", "from_node", help="the node that has the weights (default: the inventory's first)")
@click.option("--dry-run", is_flag=True, help="print the distribution plan only")
@click.option("--connections", type=int, default=8, show_default=True)
@click.option("--chunk-mb", type=float, default=32.0, show_default=True,
              help="unit of verification and of relaying (a relay passes on each chunk once verified)")
@click.option("--no-pipeline", is_flag=True,
              help="store and forward: the node across waits until its neighbour holds every file")
@with_transport_options
@json_option
@pass_ctx
def weights_sync_cmd(c: Ctx, profile: str, from_node: str | None, dry_run: bool, connections: int, chunk_mb: float,
                     no_pipeline: bool, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                     as_json: bool) -> None:
    """Copy the profile's weights to its other nodes over the fabric only, verified against a manifest."""
    from sparkctl.model.layout import bind
    from sparkctl.ops.weights import describe_plan, plan_sync, sync

    res = c.resolve(profile)
    inv = c.inventory()
    nodes = list(bind(res, inv).nodes)
    src = from_node or inv.names[0]
    if src not in inv.names:
        raise ConfigError(f"--from {src}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    if dry_run:
        lines = describe_plan(plan_sync(inv, src, nodes))
        emit_json(lines) if as_json else [out.print(line, markup=False) for line in lines]
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        rep = sync(inv, tr, res.profile.model.weights_path, src, nodes=nodes, connections=connections,
                   chunk_mb=chunk_mb, pipeline=not no_pipeline, progress=_weights_progress(as_json))
    if as_json:
        emit_json(asdict(rep))
    else:
        for n, ns in rep.nodes.items():
            out.print(f"{n}: {ns.bytes:,} bytes in {ns.seconds:.1f} s ({ns.rate_Bps / 1e6:.1f} MB/s), "
                      f"verified {ns.verified}" + (f", error {ns.error}" if ns.error else ""), markup=False)
    if not rep.ok:
        raise SystemExit(5)
