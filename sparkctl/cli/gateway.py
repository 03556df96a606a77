"""The ``gateway`` command group: the cluster's one endpoint (serve.gateway), seen and stopped."""

from __future__ import annotations

from typing import Any

import click

from sparkctl.cli.base import (
    Ctx,
    NodeProgress,
    cli,
    emit_json,
    escape,
    inventory_option,
    json_option,
    make_transport,
    out,
    pass_ctx,
    with_transport_options,
)


@cli.group("gateway")
def gateway_group() -> None:
    """The gateway (smg) the records name: where it runs, its backends; stop it."""


@gateway_group.command("status")
@inventory_option
@with_transport_options
@json_option
@pass_ctx
def gateway_status_cmd(c: Ctx, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                       as_json: bool) -> None:
    """Every gateway the records name: its node and port, up or not, its backends per model (read-only)."""
    from sparkctl.ops.gatewayops import gateway_status
    from sparkctl.ops.lock import read_records

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        gws, drift = gateway_status(inv, tr, read_records(inv, tr))
    if as_json:
        emit_json({"gateways": gws, "drift": drift})
        return
    print_gateways(gws)
    for stack, lines in drift.items():
        for d in lines:
            out.print(f"[yellow]drift[/] {escape(stack)}: {escape(d)}")


def print_gateways(gws: list[dict[str, Any]]) -> None:
    if not gws:
        out.print("no gateway: no record names one")
    for g in gws:
        state = "[green]up[/]" if g["up"] else f"[red]{escape(str(g['state']))}[/]"
        out.print(f"gateway on {escape(g['node'])}:{g['port']} ({escape(str(g.get('url')))}): {state}"
                  + (f"; {escape(str(g['error']))}" if g.get("error") else ""))
        for model, bs in g["backends"].items():
            out.print(f"  {escape(model)}: " + ", ".join(
                f"{escape(str(b['url']))} {escape(str(b['status']))}{'' if b['healthy'] else ' (unhealthy)'}"
                for b in bs))


@gateway_group.command("down")
@inventory_option
@click.option("--node", default=None, help="the gateway's node (default: the one the records name)")
@click.option("--force", is_flag=True, help="stop it even while a live stack still serves through it")
@with_transport_options
@json_option
@pass_ctx
def gateway_down_cmd(c: Ctx, node: str | None, force: bool, connect_timeout_s: float, command_timeout_s: float,
                     deadline_s: float, as_json: bool) -> None:
    """Stop and disable the gateway (`sparkctl plan gateway-down` prints the steps); refused while a stack serves
    through it unless --force. Its files and wheels stay; the next `up` with serve.gateway starts it again."""
    from sparkctl.ops.gatewayops import gateway_down

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = gateway_down(inv, tr, node=node, force=force, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json(result)
    else:
        out.print(f"gateway on {escape(result['node'])} stopped" + (f" ({escape(result['note'])})"
                                                                    if result["note"] else ""))
