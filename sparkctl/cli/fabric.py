"""The ``fabric`` command group: prepare the fabric of fresh nodes, and undo it."""

from __future__ import annotations

import click

from sparkctl.cli.base import (
    Ctx,
    NodeProgress,
    cli,
    emit_json,
    inventory_option,
    json_option,
    make_transport,
    out,
    pass_ctx,
    print_plan,
    secrets_from_env,
    set_option,
    with_transport_options,
)


@cli.group("fabric")
def fabric_group() -> None:
    """Prepare the fabric of every node (netplan, forwarding, Docker's firewall, clock-cap unit) and undo it."""


@fabric_group.command("apply")
@click.argument("profile", required=False)
@inventory_option
@set_option
@click.option("--dry-run", is_flag=True, help="print the plan and change nothing")
@with_transport_options
@json_option
@pass_ctx
def fabric_apply_cmd(c: Ctx, profile: str | None, sets: tuple[str, ...], dry_run: bool, connect_timeout_s: float,
                     command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Push and apply the fabric files on every cabled node; keep what they replace.

    With PROFILE its clock-cap unit is pushed and enabled too, so the cap comes
    back at boot. Idempotent; `sparkctl fabric restore` puts the kept state back.
    """
    from sparkctl.ops.fabric import apply, plan_apply

    inv = c.inventory()
    res = c.resolve(profile, sets) if profile else None
    secrets = secrets_from_env(res) if res else {}
    if dry_run:  # reads the nodes' netplan files (what happens to a foreign one is in the plan)
        from sparkctl.ops.fabric import read_netplan
        from sparkctl.ops.lock import holder_info

        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            netplan = read_netplan(inv, tr)
        plan, _files = plan_apply(inv, c.roots(), res, secrets, netplan, holder_info("fabric apply"))
        print_plan(plan, as_json)
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = apply(inv, tr, c.roots(), res, secrets=secrets, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"op": result.op, "nodes": list(result.nodes)})
    else:
        out.print(f"fabric applied on {', '.join(result.nodes)}; undo with `sparkctl fabric restore`")


@fabric_group.command("restore")
@inventory_option
@with_transport_options
@json_option
@pass_ctx
def fabric_restore_cmd(c: Ctx, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                       as_json: bool) -> None:
    """Put back what `fabric apply` replaced: netplan files, sysctl file and values, units."""
    from sparkctl.ops.fabric import restore

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = restore(inv, tr, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"op": result.op, "nodes": list(result.nodes)})
    else:
        out.print(f"fabric restored on {', '.join(result.nodes)}")
