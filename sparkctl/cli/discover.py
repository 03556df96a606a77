"""``sparkctl inventory discover HOST...``: the cabling found instead of typed (read-only on every host)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from sparkctl.cli.base import emit_json, err_console, escape, make_transport, with_transport_options
from sparkctl.cli.config import inventory_cmd
from sparkctl.errors import CheckFailed, ConfigError


@inventory_cmd.command("discover")
@click.argument("hosts", nargs=-1, required=True, metavar="[NAME=][USER@]HOST[:PORT]...")
@click.option("--user", "ssh_user", default="nvidia", show_default=True, help="ssh login (HOST's USER@ wins)")
@click.option("--port", "ssh_port", type=int, default=22, show_default=True, help="ssh port (HOST's :PORT wins)")
@click.option("--identity", "ssh_identity", metavar="FILE", help="private key file (~/.ssh/config applies when unset)")
@click.option("--known-hosts", "known_hosts", metavar="FILE", help="known_hosts file (~/.ssh/known_hosts when unset)")
@click.option("--sudo/--no-sudo", default=True, show_default=True,
              help="what the written inventory says (discovery itself never uses sudo)")
@click.option("--name", "cluster_name", help="cluster name in the written inventory (default: spark-ring / spark-pair)")
@click.option("--fabric-pool", default="10.20.0.0/16", show_default=True, help="the pool the fabric /24s come from")
@click.option("--output", "-o", "output", metavar="FILE", help="write the inventory here (default: print it)")
@click.option("--force", is_flag=True, help="overwrite --output if it exists")
@click.option("--json", "as_json", is_flag=True, help="the findings as JSON (and the inventory text in it)")
@with_transport_options
def discover_cmd(hosts: tuple[str, ...], ssh_user: str, ssh_port: int, ssh_identity: str | None,
                 known_hosts: str | None, sudo: bool, cluster_name: str | None, fabric_pool: str,
                 output: str | None, force: bool, as_json: bool, **transport: Any) -> None:
    """Find which fabric port of each host faces which box, and write the inventory of that pair or ring.

    Each host is reached over SSH, its four CX-7 twin netdevs read (MAC, link state, speed,
    MTU, carrier changes), and ff02::1 pinged on every up port for 2 s so that the IPv6
    neighbour table names the MAC at the far end of each cable: a read-only probe (only the
    kernel's neighbour cache changes). The first host is the head. A cable that goes
    nowhere, a box cabled to itself, a flapping port or a ring that is not a ring is named,
    and nothing is written.
    """
    from sparkctl.cli.base import NodeProgress
    from sparkctl.model.cabling import SshSettings, inventory_text
    from sparkctl.model.inventory import loads_inventory
    from sparkctl.ops.discover import discover

    if output and Path(output).exists() and not force:
        raise ConfigError(f"{output} exists", hint="pass --force to overwrite it, or another --output")
    ssh = SshSettings(user=ssh_user, port=ssh_port, identity=ssh_identity, known_hosts=known_hosts, sudo=sudo)
    found = discover(hosts, ssh, lambda nodes: _transport(nodes, transport), NodeProgress(quiet=False))
    f = found.finding
    text = None
    if f.ok and f.topology in ("single", "pair", "ring", "switch"):
        name = cluster_name or f"spark-{f.topology}"
        text = inventory_text(f, found.hosts, cluster=name, fabric_pool=fabric_pool, ssh=ssh)
        inv = loads_inventory(text, output or "<discovered>")  # the loader's own errors, before anything is written
    if as_json:
        emit_json({**found.to_dict(), "inventory": text,
                   "addresses": [] if text is None else _addresses(inv)})
    else:
        _print(found)
    if not f.ok:
        raise CheckFailed(f"discovery found {len(f.problems)} problem(s); no inventory written" if f.problems else
                          f"no {f.topology or 'topology'} found",
                          hint="fix the cabling named above and run discover again")
    if output and text is not None:
        tmp = Path(f"{output}.tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, output)
        err_console().print(f"wrote {escape(output)} ({f.topology}, {len(f.order)} nodes)")
    elif not as_json and text is not None:
        click.echo(text, nl=False)


def _transport(nodes: Any, settings: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    hosts = SimpleNamespace(nodes=tuple(nodes))  # make_transport reads only the nodes of an inventory
    return make_transport(hosts, settings["connect_timeout_s"], settings["command_timeout_s"],  # type: ignore[arg-type]
                          settings["deadline_s"])


def _addresses(inv: Any) -> list[dict[str, str]]:
    return [{"cable": str(lk.cable), "twin": str(lk.twin), "subnet": lk.subnet,
             "a": f"{lk.a.node}:{lk.a.netdev}={lk.a.address}", "b": f"{lk.b.node}:{lk.b.netdev}={lk.b.address}"}
            for lk in inv.links]


def _print(found: Any) -> None:
    f = found.finding
    con = err_console()
    for h in found.hosts:
        for s in h.netdevs.values():
            speed = f"{s.speed_mbps // 1000} Gb/s" if s.speed_mbps else "-"
            con.print(f"  {escape(h.name):<10} {s.netdev:<14} {s.rdma or '-':<13} {s.mac or '-':<17} "
                      f"{s.operstate or '?':<6} {speed:>9}  MTU {s.mtu or '-'}  answered {len(s.answered)}")
    for host, bad in found.unreadable.items():
        con.print(f"[yellow]unreadable[/] {escape(host)}: {escape('; '.join(bad))}")
    for a, b in f.cables:
        con.print(f"cable {escape(str(a))} <-> {escape(str(b))}")
    for seg in f.segments:
        con.print(f"switch segment: {escape(', '.join(map(str, seg)))}")
    if f.topology == "ring":
        con.print(f"[bold]ring[/] {escape(' -> '.join(f.order))} -> {escape(f.order[0])}")
    elif f.topology:
        con.print(f"[bold]{f.topology}[/] {escape(', '.join(f.order))}")
    for n in f.notes:
        con.print(f"[dim]note[/] {escape(n)}")
    for p in f.problems:
        con.print(f"[bold red]problem[/] {escape(p)}")
