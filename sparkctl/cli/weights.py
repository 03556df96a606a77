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
from sparkctl.errors import ConfigError, LifecycleError

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
@click.option("--node", help="the one node that downloads (default: the inventory's first)")
@click.option("--revision", help="Hub branch, tag or commit (default: model.revision)")
@click.option("--include", multiple=True, metavar="GLOB", help="files to take (repeat; replaces model.files.include)")
@click.option("--exclude", multiple=True, metavar="GLOB", help="files to leave (repeat; replaces model.files.exclude)")
@click.option("--dry-run", is_flag=True, help="print the files, their total size and the free space; download nothing")
@click.option("--url", help="download this one file instead of the model's repository (run once per file)")
@click.option("--connections", type=int, default=8, show_default=True)
@click.option("--chunk-mb", type=float, default=32.0, show_default=True, help="unit of a ranged request and of resume")
@click.option("--sha256", help="expected checksum (with --url)")
@with_transport_options
@json_option
@pass_ctx
def weights_fetch_cmd(c: Ctx, profile: str, node: str | None, revision: str | None, include: tuple[str, ...],
                      exclude: tuple[str, ...], dry_run: bool, url: str | None, connections: int, chunk_mb: float,
                      sha256: str | None, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                      as_json: bool) -> None:
    """Download the profile's model from the Hugging Face Hub onto NODE, verified and resumable.

    The repository is model.id at model.revision (HF_ENDPOINT names a mirror;
    the token, found as huggingface_hub finds it (HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
    HF_TOKEN_PATH or $HF_HOME/token) and never printed, opens gated and
    private repositories), laid out
    as `hf download --local-dir` does in model.local_dir (default
    model.weights_path), with a manifest of the commit and every file's hash.
    Then `sparkctl weights sync PROFILE` gives the other nodes the files over
    the cables.
    """
    import os

    from sparkctl.ops import hub
    from sparkctl.ops.hubfetch import fetch_model, find_token, resolve
    from sparkctl.ops.weights import fetch

    res = c.resolve(profile)
    inv = c.inventory()
    node = node or inv.names[0]
    if node not in inv.names:
        raise ConfigError(f"--node {node}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    m = res.profile.model
    if url is not None:
        wp = m.weights_path
        dest = wp if wp.endswith(url.rsplit("/", 1)[-1]) else f"{wp.rstrip('/')}/{url.rsplit('/', 1)[-1].split('?')[0]}"
        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            rep = fetch(inv, tr, node, url, dest, connections=connections, sha256=sha256, chunk_mb=chunk_mb,
                        progress=_weights_progress(as_json))
        if as_json:
            emit_json(asdict(rep))
        else:
            out.print(f"{node}: {rep.bytes:,} bytes in {rep.seconds:.1f} s ({rep.rate_Bps / 1e6:.1f} MB/s) -> "
                      f"{rep.dest}", markup=False)
        return
    endpoint = os.environ.get("HF_ENDPOINT") or hub.DEFAULT_ENDPOINT
    found = find_token()  # where huggingface_hub finds it; a secret: it goes to the agent's stdin, nowhere else
    token, token_from = (found.value, found.source) if found is not None else (None, "HF_TOKEN")
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        plan = resolve(inv, tr, node, repo_id=m.id, revision=revision or m.revision,
                       include=list(include) or m.files.include, exclude=list(exclude) or m.files.exclude,
                       local_dir=hub.local_dir_of(m.weights_path, m.local_dir), endpoint=endpoint, token=token,
                       token_from=token_from)
        if dry_run:
            if as_json:
                emit_json({"node": plan.node, "repo_id": plan.revision.repo_id, "revision": plan.revision.revision,
                           "commit": plan.revision.commit, "local_dir": plan.local_dir,
                           "files": [asdict(f) for f in plan.files], "total_bytes": plan.total_bytes,
                           "present_bytes": plan.present_bytes, "free_bytes": plan.free_bytes})
            else:
                for line in hub.describe(plan):
                    out.print(line, markup=False)
            return
        if not as_json:
            err_console().print(f"{escape(node)}: {len(plan.files)} files of {escape(m.id)}@"
                                f"{escape(plan.revision.commit[:12])}, {plan.total_bytes:,} bytes")
        rep2 = fetch_model(inv, tr, plan, token=token, connections=connections, chunk_mb=chunk_mb,
                           progress=_weights_progress(as_json), token_from=token_from,
                           note=None if as_json else lambda m: err_console().print(f"[yellow]wait:[/] {escape(m)}"))
    if as_json:
        emit_json(asdict(rep2))
        return
    for n in rep2.notices:
        err_console().print(f"[yellow]note:[/] {escape(n)}")
    if rep2.retries or rep2.resolved:
        err_console().print(f"[yellow]note:[/] {rep2.retries} waits for the network or the Hub, "
                            f"{rep2.resolved} expired storage URLs resolved again")
    for f in rep2.corrupt:
        err_console().print(f"[yellow]{escape(f)}: differed from the Hub; deleted and fetched again[/]")
    out.print(f"{node}: {rep2.repo_id}@{rep2.commit[:12]}: {rep2.fetched} fetched, {rep2.skipped} already complete, "
              f"{rep2.bytes:,} bytes in {rep2.seconds:.1f} s ({rep2.rate_Bps / 1e6:.1f} MB/s) -> {rep2.local_dir}",
              markup=False)


@weights_group.command("sync")
@click.argument("profile")
@inventory_option
@click.option("--from", "from_node", help="the node that has the weights (default: the inventory's first)")
@click.option("--to", "to_nodes", multiple=True, metavar="NODE",
              help="receivers (repeat; default: the profile's nodes), e.g. to stage a model ahead of a bigger profile")
@click.option("--dry-run", is_flag=True, help="print the distribution plan only")
@click.option("--connections", type=int, default=8, show_default=True)
@click.option("--chunk-mb", type=float, default=32.0, show_default=True,
              help="unit of verification and of relaying (a relay passes on each chunk once verified)")
@click.option("--no-pipeline", is_flag=True,
              help="store and forward: the node across waits until its neighbour holds every file")
@with_transport_options
@json_option
@pass_ctx
def weights_sync_cmd(c: Ctx, profile: str, from_node: str | None, to_nodes: tuple[str, ...], dry_run: bool,
                     connections: int, chunk_mb: float, no_pipeline: bool, connect_timeout_s: float,
                     command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Copy the profile's weights to its other nodes over the fabric only, verified against a manifest."""
    from sparkctl.model.layout import bind
    from sparkctl.ops.hub import local_dir_of
    from sparkctl.ops.weights import describe_plan, plan_sync, sync

    res = c.resolve(profile)
    inv = c.inventory()
    nodes = list(dict.fromkeys([*(to_nodes or bind(res, inv).nodes), *([from_node] if from_node else [])]))
    src = from_node or inv.names[0]
    if src not in inv.names:
        raise ConfigError(f"--from {src}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    if dry_run:
        lines = describe_plan(plan_sync(inv, src, nodes))
        if as_json:
            emit_json(lines)
        else:
            for line in lines:
                out.print(line, markup=False)
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        m = res.profile.model
        rep = sync(inv, tr, local_dir_of(m.weights_path, m.local_dir), src, nodes=nodes, connections=connections,
                   chunk_mb=chunk_mb, pipeline=not no_pipeline, progress=_weights_progress(as_json))
    if as_json:
        emit_json(asdict(rep))
    else:
        for n, ns in rep.nodes.items():
            out.print(f"{n}: {ns.bytes:,} bytes in {ns.seconds:.1f} s ({ns.rate_Bps / 1e6:.1f} MB/s), "
                      f"verified {ns.verified}" + (f", error {ns.error}" if ns.error else ""), markup=False)
    if not rep.ok:
        unverified = sorted(n for n, ns in rep.nodes.items() if not ns.verified)
        raise LifecycleError(f"weights sync from {src}: not verified on {', '.join(unverified)}",
                             hint="each node's error is above (or in --json)")
