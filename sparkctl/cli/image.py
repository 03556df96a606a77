"""The ``image`` command group: the profile's container image on every node."""

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
    set_option,
    with_transport_options,
)
from sparkctl.model.imageid import short


@cli.group("image")
def image_group() -> None:
    """The engine's container image on every node (the image_identity law)."""


@image_group.command("sync")
@click.argument("profile")
@click.option("--from", "from_node", default=None, help="the node whose image the others get "
              "(default: the build most nodes have, on a tie the first node's)")
@inventory_option
@set_option
@click.option("--key-hours", type=click.FloatRange(min=0, min_open=True, max=24 * 366), default=4.0, show_default=True,
              help="how long the receivers accept the source's node-to-node key (expiry-time=); each sync renews it")
@click.option("--dry-run", is_flag=True, help="read the content digests, print the plan, change nothing")
@with_transport_options
@json_option
@pass_ctx
def image_sync_cmd(c: Ctx, profile: str, from_node: str | None, sets: tuple[str, ...], key_hours: float,
                   dry_run: bool, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                   as_json: bool) -> None:
    """Copy PROFILE's image from one node to the others over the fabric, verified by content digest.

    Runs `docker save IMAGE | ssh <fabric address> docker load` on the source
    node (streamed, no temporary file), as the community copies locally built
    images (eugr/spark-vllm-docker build-and-copy.sh). The source's key may run
    nothing else on the receivers (a forced command) and expires after
    --key-hours; `sparkctl image revoke` takes it away at once.
    """
    from sparkctl.ops import image

    inv = c.inventory()
    res = c.resolve(profile, sets)
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        if dry_run:
            plan, *_ = image.plan(res, inv, tr, from_node, key_hours)
            print_plan(plan, as_json)
            return
        result = image.sync(res, inv, tr, from_node, key_hours=key_hours, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"profile": result.profile, "image": result.image, "source": result.source,
                   "content": result.content, "copied": list(result.copied)})
    elif result.copied:
        out.print(f"{result.image} ({short(result.content)}) copied from {result.source} to "
                  f"{', '.join(result.copied)}, verified by content digest", markup=False)
    else:
        out.print(f"every node already has {result.image} as {short(result.content)}", markup=False)


@image_group.command("revoke")
@inventory_option
@click.option("--dry-run", is_flag=True, help="print the plan, change nothing")
@with_transport_options
@json_option
@pass_ctx
def image_revoke_cmd(c: Ctx, dry_run: bool, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
                     as_json: bool) -> None:
    """Take image sync's node-to-node key away from every node now (it also expires by itself).

    Removes its lines from the authorized_keys sparkctl wrote, and its key,
    known_hosts and gate. The next `image sync` grants it again.
    """
    from sparkctl.ops import image
    from sparkctl.plan.imageplan import plan_image_revoke

    inv = c.inventory()
    if dry_run:
        plan = plan_image_revoke(inv)
        print_plan(plan, as_json)
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        nodes = image.revoke(inv, tr, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"op": "image revoke", "nodes": list(nodes)})
    else:
        out.print(f"image sync's node-to-node key revoked on {', '.join(nodes)}", markup=False)
