"""Commands that read profiles and inventories and touch no host: profiles, show, explain, schema, inventory, render, plan."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from sparkctl.cli.base import (
    Ctx,
    cli,
    emit_json,
    err_console,
    escape,
    inventory_option,
    json_option,
    out,
    pass_ctx,
    secrets_from_env,
    set_option,
)
from sparkctl.errors import ConfigError
from sparkctl.model.inventory import Inventory
from sparkctl.model.profiles import describe


@cli.command("profiles")
@json_option
@pass_ctx
def profiles_cmd(c: Ctx, as_json: bool) -> None:
    """List the profiles (yours first, then the bundled ones)."""
    found = c.roots().all_profiles()
    rows = [{"name": n, "description": describe(p), "file": str(p)} for n, p in found.items()]
    if as_json:
        emit_json(rows)
        return
    t = Table(box=None, pad_edge=False)
    t.add_column("profile", style="bold")
    t.add_column("description")
    for r in rows:
        t.add_row(r["name"], r["description"])
    out.print(t)


@cli.command("show")
@inventory_option
@click.argument("profile")
@click.option("--node", help="apply this node's overlay")
@set_option
@json_option
@pass_ctx
def show_cmd(c: Ctx, profile: str, node: str | None, sets: tuple[str, ...], as_json: bool) -> None:
    """Print the resolved PROFILE."""
    res = c.resolve(profile, sets)
    data = res.to_dict(node)
    if as_json:
        emit_json(data)
        return
    import yaml

    click.echo(f"# profile {profile} (digest {res.digest()}); files: {', '.join(res.files)}")
    click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


@cli.command("explain")
@inventory_option
@click.argument("profile")
@click.argument("key")
@click.option("--node", help="include this node's overlay")
@set_option
@json_option
@pass_ctx
def explain_cmd(c: Ctx, profile: str, key: str, node: str | None, sets: tuple[str, ...], as_json: bool) -> None:
    """Print where KEY of PROFILE gets its value (lowest layer first, the winner last)."""
    res = c.resolve(profile, sets)
    chain = res.explain(key, node)
    if as_json:
        emit_json([{"value": s.value, "source": asdict(s.source)} for s in chain])
        return
    for i, s in enumerate(chain):
        mark = "=>" if i == len(chain) - 1 else "  "
        click.echo(f"{mark} {json.dumps(s.value, default=str)}  ({s.source})")


@cli.command("schema")
@click.option("--markdown", is_flag=True, help="print docs/profile-schema.md")
def schema_cmd(markdown: bool) -> None:
    """Print the profile and inventory schema."""
    from sparkctl.model.schemadoc import schema_markdown

    click.echo(schema_markdown(), nl=False)


# --------------------------------------------------------------------------- inventory


@cli.group("inventory", invoke_without_command=True)
@inventory_option
@json_option
@click.pass_context
def inventory_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the topology, ring order, neighbours, fabric addresses and routes (`inventory discover`: find them)."""
    if ctx.invoked_subcommand is not None:
        return
    show_inventory(ctx.find_object(Ctx).inventory(), as_json)  # type: ignore[union-attr]


def show_inventory(inv: Inventory, as_json: bool) -> None:
    from sparkctl.cli.views import inventory_view, ring_picture

    view = inventory_view(inv)
    if as_json:
        emit_json(view)
        return
    out.print(f"[bold]{inv.name}[/bold]: {inv.topology}, {len(inv.nodes)} nodes, MTU {inv.mtu} ({inv.file})")
    if inv.topology == "ring":
        out.print(ring_picture(inv))
    if inv.topology == "switch":
        out.print(f"switch {inv.switch_name} (ports at MTU {inv.switch_mtu}); one subnet per port group, no relay: "
                  + ", ".join(sorted({lk.subnet for lk in inv.links})), markup=False)
    for n in view["nodes"]:
        if inv.topology == "switch":
            out.print(f"\n[bold]{n['name']}[/bold]  ssh {n['ssh']}  on the switch", markup=True)
        else:
            pos = "" if n["ring_position"] is None else f"rank {n['ring_position']}  "
            out.print(f"\n[bold]{n['name']}[/bold]  {pos}ssh {n['ssh']}  neighbours: "
                      f"{', '.join(n['neighbours']) or '-'}", markup=True)
        for a in n["addresses"]:
            out.print(f"    {a['port']}  {a['netdev']:<14} {a['rdma']:<13} {a['address']}/24", markup=False)
    if view["routes"]:
        out.print("\n[bold]routes[/bold] (non-neighbours through a neighbour)")
        for r in view["routes"]:
            out.print(f"  {r['node']}: {r['dst']} via {r['via']} dev {r['dev']}")


# --------------------------------------------------------------------------- render / plan


@cli.command("render")
@inventory_option
@click.argument("profile")
@click.option("--node", help="only this node")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="write DIR/NODE/<path> instead of printing")
@set_option
@json_option
@pass_ctx
def render_cmd(c: Ctx, profile: str, node: str | None, out_dir: str | None, sets: tuple[str, ...], as_json: bool) -> None:
    """Render every file each node would receive (touches no host; secrets masked)."""
    from sparkctl.plan.render import render

    res = c.resolve(profile, sets)
    inv = c.inventory()
    rendering = render(res, inv, c.roots(), secrets_from_env(res), reveal_secrets=False)
    for w in rendering.warnings:
        err_console().print(f"[yellow]warning:[/] {escape(w)}")
    nodes = [node] if node else list(rendering.files)
    if node and node not in rendering.files:
        raise ConfigError(f"node {node!r} runs no rank of {profile}", hint=f"nodes: {', '.join(rendering.files)}")
    if out_dir:
        written = write_tree(Path(out_dir), {n: rendering.files[n] for n in nodes})
        if as_json:
            emit_json({"written": written})
        else:
            out.print(f"wrote {len(written)} files under {out_dir}")
        return
    if as_json:
        emit_json({n: {p: {"mode": f"{f.mode:o}", "text": f.text} for p, f in rendering.files[n].items()} for n in nodes})
        return
    for n in nodes:
        for path, f in rendering.files[n].items():
            click.echo(f"==> {n}:{path} (mode {f.mode:o}) <==")
            click.echo(f.text, nl=not f.text.endswith("\n"))


def write_tree(base: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    written = []
    for node, nf in files.items():
        for path, f in nf.items():
            dest = base / node / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
            with os.fdopen(fd, "w") as fh:
                fh.write(f.text)
            os.chmod(tmp, f.mode)
            os.replace(tmp, dest)
            written.append(str(dest))
    return written
