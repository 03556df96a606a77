"""The command line: the only module that prints, prompts or exits.

Library code raises :class:`sparkctl.errors.SparkctlError`; ``main`` turns it
into one ``error:`` line on stderr and the error's exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import ConfigError, SparkctlError
from .inventory import Inventory, load_inventory
from .profiles import Resolved, describe, resolve
from .resources import Roots

# Piped output keeps whole lines (no wrapping at 80 columns).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


@dataclass
class Ctx:
    inventory_path: str | None
    root: str | None
    _inv: Inventory | None = field(default=None, repr=False)

    def roots(self) -> Roots:
        return Roots.make(self.root, self.inventory_file(required=False))

    def inventory_file(self, required: bool = True) -> str | None:
        if self.inventory_path:
            return self.inventory_path
        env = os.environ.get("SPARKCTL_INVENTORY")
        if env:
            return env
        if Path("inventory.yaml").is_file():
            return "inventory.yaml"
        from .sim import paths as simpaths

        sim_inv = simpaths.default_inventory()
        if sim_inv.is_file():
            return str(sim_inv)
        if required:
            raise ConfigError(
                "no inventory given and none found",
                hint="pass -i FILE, set SPARKCTL_INVENTORY, or run `sparkctl sim up` for a simulated ring",
            )
        return None

    def inventory(self) -> Inventory:
        if self._inv is None:
            self._inv = load_inventory(self.inventory_file())  # type: ignore[arg-type]
        return self._inv

    def resolve(self, name: str, sets: tuple[str, ...] = ()) -> Resolved:
        return resolve(name, self.roots(), sets)


pass_ctx = click.make_pass_decorator(Ctx)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
@click.option("-i", "--inventory", "inventory", metavar="FILE", help="inventory file (default: ./inventory.yaml, "
              "$SPARKCTL_INVENTORY, or the simulated cluster's)")
@click.option("--root", metavar="DIR", help="directory whose profiles/ and templates/ override the bundled ones "
              "(also $SPARKCTL_ROOT)")
@click.pass_context
def cli(ctx: click.Context, inventory: str | None, root: str | None) -> None:
    """sparkctl: run LLM serving stacks on switchless DGX Spark clusters."""
    ctx.obj = Ctx(inventory, root)


def _set_inventory(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.find_object(Ctx).inventory_path = value


inventory_option = click.option("-i", "--inventory", metavar="FILE", expose_value=False, callback=_set_inventory,
                                help="inventory file (same as the global -i)")
set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="override a profile value (repeatable), e.g. --set laws.clock_cap_mhz=2100")
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


# --------------------------------------------------------------------------- profiles


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
    from .schemadoc import schema_markdown

    click.echo(schema_markdown(), nl=False)


# --------------------------------------------------------------------------- inventory


@cli.command("inventory")
@inventory_option
@json_option
@pass_ctx
def inventory_cmd(c: Ctx, as_json: bool) -> None:
    """Show the topology, ring order, neighbours, fabric addresses and routes."""
    from .views import inventory_view, ring_picture

    inv = c.inventory()
    view = inventory_view(inv)
    if as_json:
        emit_json(view)
        return
    out.print(f"[bold]{inv.name}[/bold]: {inv.topology}, {len(inv.nodes)} nodes, MTU {inv.mtu} ({inv.file})")
    if inv.topology == "ring":
        out.print(ring_picture(inv))
    for n in view["nodes"]:
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


def _secrets_from_env(res: Resolved) -> dict[str, str]:
    names = {n for node in [None, *res.node_layers] for n in (res.for_node(node) if node else res.profile).engine.secret_env}
    return {n: os.environ[n] for n in names if n in os.environ}


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
    from .render import render

    res = c.resolve(profile, sets)
    inv = c.inventory()
    rendering = render(res, inv, c.roots(), _secrets_from_env(res), reveal_secrets=False)
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


@cli.command("plan")
@inventory_option
@click.argument("profile")
@set_option
@json_option
@pass_ctx
def plan_cmd(c: Ctx, profile: str, sets: tuple[str, ...], as_json: bool) -> None:
    """The ordered steps `up PROFILE` would take, and the files it would write (touches no host)."""
    from .plan import plan_up
    from .render import render

    res = c.resolve(profile, sets)
    inv = c.inventory()
    rendering = render(res, inv, c.roots(), _secrets_from_env(res), reveal_secrets=False)
    steps = plan_up(res, inv, rendering)
    lay = rendering.layout
    if as_json:
        emit_json({
            "profile": profile, "digest": res.digest(), "inventory": inv.file, "topology": inv.topology,
            "ranks": [asdict(r) for r in lay.ranks],
            "steps": [asdict(s) for s in steps],
        })
        return
    p = res.profile
    out.print(f"[bold]plan: up {profile}[/bold]  {p.engine.name} {p.engine.version}, {p.model.served_name}, "
              f"TP{p.topology.tp_size} x{p.topology.replicas} {p.topology.layout} on {inv.topology} ({inv.file})")
    out.print("ranks (follow the ring): " + "  ".join(
        f"{r.node}=rank {r.rank}{'/replica ' + str(r.replica) if p.topology.replicas > 1 else ''} ({r.host_ip})"
        for r in lay.ranks))
    for i, s in enumerate(steps, 1):
        out.print(f"{i:>2}. [bold]{s.phase:<10}[/bold] {', '.join(s.nodes)}: {s.summary}")
        for f in s.files:
            out.print(f"      {f}")


# --------------------------------------------------------------------------- transport, check


transport_options = [
    click.option("--connect-timeout", "connect_timeout_s", type=float, default=5.0, show_default=True,
                 help="seconds to wait for a node's ssh connection"),
    click.option("--command-timeout", "command_timeout_s", type=float, default=60.0, show_default=True,
                 help="seconds one remote command may take"),
    click.option("--deadline", "deadline_s", type=float, default=120.0, show_default=True,
                 help="seconds a whole fan-out step may take"),
]


def with_waive_options(f: Any) -> Any:
    f = click.option("--reason", help="why the waived laws are accepted (recorded)")(f)
    return click.option("--waive", multiple=True, metavar="LAW",
                        help="accept a failing law on purpose (needs --reason)")(f)


def with_transport_options(f: Any) -> Any:
    for opt in reversed(transport_options):
        f = opt(f)
    return f


def make_transport(inv: Inventory, connect_timeout_s: float, command_timeout_s: float, deadline_s: float) -> Any:
    import logging

    from .transport import SSHTransport, TransportSettings

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # we report connection errors ourselves
    return SSHTransport(inv.nodes, TransportSettings(connect_timeout_s, command_timeout_s, deadline_s))


STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "waived": "magenta", "skip": "dim"}


def print_verdicts(report: Any) -> None:
    """One table, law x node (the worst verdict in each cell), then every non-ok verdict with its fix."""
    order = {"fail": 0, "warn": 1, "waived": 2, "ok": 3, "skip": 4}
    laws_seen = list(dict.fromkeys(v.law for v in report.verdicts))
    t = Table(box=None, pad_edge=False)
    t.add_column("law")
    for n in report.nodes:
        t.add_column(n)
    for law in laws_seen:
        cells = []
        for n in report.nodes:
            vs = [v for v in report.verdicts if v.law == law and v.node == n]
            if not vs:
                cells.append("[dim]-[/]")
                continue
            vs = [v for v in vs if v.status != "skip"] or vs  # a skip beside judged verdicts judged nothing
            worst = min(vs, key=lambda v: order.get(v.status, 9))
            note = worst.observed if len(vs) == 1 else f"{sum(v.status == worst.status for v in vs)}/{len(vs)}"
            cells.append(f"[{STATUS_STYLE.get(worst.status, '')}]{worst.status}[/] {escape(note[:28])}")
        t.add_row(law, *cells)
    out.print(t)
    bad = [v for v in report.verdicts if v.status not in ("ok", "skip")]
    if bad:
        out.print()
    for v in sorted(bad, key=lambda v: (order.get(v.status, 9), v.law, v.node)):
        subject = f" {v.subject}" if v.subject else ""
        out.print(f"[{STATUS_STYLE.get(v.status, '')}]{v.status}[/] {v.law} {escape(v.node)}{escape(subject)}: "
                  f"{escape(v.observed)} (expected {escape(v.expected)})")
        if v.fix:
            out.print(f"    fix: {escape(v.fix)}")


def escape(text: str) -> str:
    from rich.markup import escape as _e

    return _e(str(text))


def parse_waivers(waive: tuple[str, ...], reason: str | None) -> dict[str, Any]:
    from .laws import LAWS, Waiver

    ids = {law.id for law in LAWS}
    out = {}
    for w in waive:
        if w not in ids:
            raise ConfigError(f"--waive {w}: no such law", hint=f"laws: {', '.join(sorted(ids))}")
        if not reason or not reason.strip():
            raise ConfigError(f"--waive {w} needs --reason \"...\"", hint="a waiver is recorded with its reason")
        out[w] = Waiver(w, reason.strip())
    return out


@cli.command("check")
@click.argument("profile")
@inventory_option
@set_option
@with_waive_options
@click.option("--fix", is_flag=True, help="apply the safe remedies (the clock cap) and check again")
@click.option("--bandwidth", "bandwidth_s", type=int, default=2, show_default=True, metavar="SECONDS",
              help="measure every twin with ib_write_bw for this long (0: skip; stale links show only here)")
@with_transport_options
@json_option
@pass_ctx
def check_cmd(c: Ctx, profile: str, sets: tuple[str, ...], waive: tuple[str, ...], reason: str | None, fix: bool,
              bandwidth_s: int, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
              as_json: bool) -> None:
    """Probe every node of PROFILE in parallel and judge every law (changes nothing, except --fix)."""
    from .check import clear_hw_change_if_done, run_check

    res = c.resolve(profile, sets)
    inv = c.inventory()
    waivers = parse_waivers(waive, reason)
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        report = run_check(res, inv, tr, waivers=waivers, fix=fix, bandwidth_s=bandwidth_s,
                           progress=None if as_json else (lambda m: err_console().print(f"[dim]{escape(m)}[/]")))
    closed = clear_hw_change_if_done(inv, report)
    if as_json:
        emit_json(report.to_dict())
    else:
        print_verdicts(report)
        for f in report.fixed:
            out.print(f"fixed: {escape(f)}")
        if closed:
            out.print("the recorded hardware change is complete: every node booted since and links are healthy")
        fails = sum(v.failed for v in report.verdicts)
        out.print(f"\n{'[green]ok[/]' if report.ok else f'[bold red]{fails} failing[/]'}: {len(report.nodes)} nodes, "
                  f"{len(report.verdicts)} verdicts in {report.duration_s:.1f} s")
    if not report.ok:
        raise SystemExit(4)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


@cli.command("hw-change")
@inventory_option
@click.option("--note", required=True, help="what changed (a cable moved, a card reseated, ...)")
@click.option("--node", "nodes", multiple=True, help="affected nodes (default: all)")
@with_transport_options
@pass_ctx
def hw_change_cmd(c: Ctx, note: str, nodes: tuple[str, ...], connect_timeout_s: float, command_timeout_s: float,
                  deadline_s: float) -> None:
    """Record a cable or PCIe change: `check` fails until the nodes are AC power-cycled."""
    from .check import record_hw_change

    inv = c.inventory()
    for n in nodes:
        if n not in inv.names:
            raise ConfigError(f"--node {n}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        rec = record_hw_change(inv, tr, note, list(nodes) or None)
    out.print(f"recorded hardware change '{escape(rec.note)}' at {rec.at} for {', '.join(rec.nodes)}.")
    out.print("until each of them has booted since and its links run at full rate, `check` fails with: "
              "shut both ends down, unplug them from AC for at least 60 s, reconnect without moving the cables.")


@cli.command("trust")
@click.argument("nodes", nargs=-1, required=True)
@inventory_option
@click.option("--fingerprint", help="record only if the node offers this SHA256:... fingerprint")
@click.option("--yes", is_flag=True, help="record without asking (you checked the fingerprint another way)")
@click.option("--connect-timeout", "connect_timeout_s", type=float, default=5.0, show_default=True)
@pass_ctx
def trust_cmd(c: Ctx, nodes: tuple[str, ...], fingerprint: str | None, yes: bool, connect_timeout_s: float) -> None:
    """Record NODES' ssh host keys in known_hosts, on purpose (never done silently)."""
    from .transport import TransportSettings, default_known_hosts, fetch_host_key, trust

    inv = c.inventory()
    settings = TransportSettings(connect_timeout_s=connect_timeout_s)
    for name in nodes:
        if name not in inv.names:
            raise ConfigError(f"node {name!r} is not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
        node = inv.node(name)
        ktype, fp, _ = fetch_host_key(node, settings)
        out.print(f"{name} ({node.host}:{node.ssh_port}) offers {ktype} {fp}")
        if fingerprint and fingerprint != fp:
            raise ConfigError(f"{name} offers {fp}, not the expected {fingerprint}", hint="do not trust this key")
        if not (yes or fingerprint):
            if not sys.stdin.isatty():
                raise ConfigError("refusing to trust a host key without confirmation",
                                  hint="pass --fingerprint SHA256:... (checked on the node) or --yes")
            click.confirm(f"record this key for {name}?", abort=True)
        trust(node, None, expected_fingerprint=fp, settings=settings)
        out.print(f"recorded in {default_known_hosts(node)}")


# --------------------------------------------------------------------------- up / down / switch / status / logs


class NodeProgress:
    """Per-node progress lines: phase, elapsed, last log line (rich live table on a terminal).

    With ``SPARKCTL_PROGRESS_JSONL=PATH`` every event is also appended to PATH as
    one JSON line (``t``, ``elapsed_s``, ``pid``, ``node``, ``phase``, ``message``),
    flushed at once, for tools that follow a run (bench/fault_matrix.py does).
    """

    def __init__(self, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.quiet = quiet
        self.console = err_console()
        self.events = os.environ.get("SPARKCTL_PROGRESS_JSONL") or None

    def __call__(self, node: str, phase: str, message: str) -> None:
        if self.events:
            line = json.dumps({"t": time.time(), "elapsed_s": round(time.monotonic() - self.t0, 3),
                               "pid": os.getpid(), "node": node, "phase": phase, "message": message})
            with open(self.events, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        if self.quiet:
            return
        el = time.monotonic() - self.t0
        who = "" if node == "*" else f"{node:<9} "
        self.console.print(f"[dim]{el:6.1f}s[/] {who}[bold]{phase:<10}[/] {escape(message)}")


def _up_summary(result: Any) -> None:
    if result.action == "noop":
        out.print(f"{result.profile}: already serving with the same rendered files; nothing to do")
        return
    rec = result.record
    phases = ", ".join(f"{p.phase} {p.seconds:.1f}s" for p in result.phases)
    own = sum(p.seconds for p in result.phases if p.phase != "ready")
    out.print(f"[green]{result.profile} serving[/] {rec.served_name} on "
              f"{', '.join(rec.heads)}:{rec.port} ({result.action}; {phases}; sparkctl's own time {own:.1f} s)")


@cli.command("up")
@click.argument("profile")
@inventory_option
@set_option
@with_waive_options
@with_transport_options
@json_option
@pass_ctx
def up_cmd(c: Ctx, profile: str, sets: tuple[str, ...], waive: tuple[str, ...], reason: str | None,
           connect_timeout_s: float, command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Check, push, start PROFILE's ranks in order and wait until it serves its model name."""
    from .lifecycle import up

    res = c.resolve(profile, sets)
    inv = c.inventory()
    waivers = parse_waivers(waive, reason)
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = up(res, inv, tr, c.roots(), sets=sets, waivers=waivers, secrets=_secrets_from_env(res),
                    progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"profile": result.profile, "action": result.action,
                   "phases": {p.phase: round(p.seconds, 3) for p in result.phases},
                   "ready_s": round(result.ready_s, 3), "record": result.record.to_dict() if result.record else None})
    else:
        _up_summary(result)


@cli.command("down")
@inventory_option
@click.option("--reset-clocks", is_flag=True, help="also reset the GPU clock lock (nvidia-smi -rgc)")
@with_transport_options
@json_option
@pass_ctx
def down_cmd(c: Ctx, reset_clocks: bool, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
             as_json: bool) -> None:
    """Stop what sparkctl started, verify processes gone and ports closed (idempotent)."""
    from .lifecycle import down

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = down(inv, tr, reset_clocks=reset_clocks, progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"stopped": list(result.stopped), "leftovers": dict(result.leftovers), "leaks_gib": dict(result.leaks),
                   "clocks_reset": list(result.clocks_reset)})
    else:
        out.print(f"stopped sparkctl engines on {', '.join(result.stopped)}")
        for n, what in result.leftovers.items():
            out.print(f"[bold red]still there[/] on {n}: {escape(what)}")
        for n, gib in result.leaks.items():
            out.print(f"[yellow]memory not given back[/] on {n}: {gib:.1f} GiB held with no engine (reboot {n})")
        if result.clocks_reset:
            out.print(f"clock lock reset on {', '.join(result.clocks_reset)}")
    if result.leftovers:
        from .errors import LifecycleError, Ref

        first = min(result.leftovers)
        raise LifecycleError(f"down failed in phase stop: engines may still run on {', '.join(sorted(result.leftovers))}",
                             Ref(node=first), hint="the record says failed; run `sparkctl down` again once the node answers")


@cli.command("switch")
@click.argument("profile")
@inventory_option
@set_option
@with_waive_options
@click.option("--supervise", is_flag=True,
              help="run the switch under a supervisor on the head node, detached from this session")
@click.option("--wait", "wait", is_flag=True, help="with --supervise: follow the supervisor until it finishes")
@with_transport_options
@json_option
@pass_ctx
def switch_cmd(c: Ctx, profile: str, sets: tuple[str, ...], waive: tuple[str, ...], reason: str | None,
               supervise: bool, wait: bool, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
               as_json: bool) -> None:
    """Replace the serving stack with PROFILE; if it does not become ready, bring the previous one back.

    With --supervise the switch runs on the head node, so a laptop that sleeps
    mid-switch still ends with a serving stack; `sparkctl status` shows its progress.
    """
    from .lifecycle import switch, switch_supervised

    res = c.resolve(profile, sets)
    inv = c.inventory()
    waivers = parse_waivers(waive, reason)
    if wait and not supervise:
        raise click.UsageError("--wait goes with --supervise")
    if supervise:
        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            sup = switch_supervised(res, inv, tr, c.roots(), sets=sets, waivers=waivers,
                                    secrets=_secrets_from_env(res), progress=NodeProgress(quiet=as_json), wait=wait)
        if as_json:
            emit_json({"supervised": True, "profile": sup.profile, "previous": sup.previous, "head": sup.head,
                       "pid": sup.pid, "log": sup.log, "phase": sup.phase, "events": list(sup.events)})
        elif not wait:
            out.print(f"supervisor pid {sup.pid} on {sup.head} switches to {sup.profile}; "
                      f"`sparkctl status` shows its progress (log {sup.log})")
        elif sup.phase == "done":
            out.print(f"[green]switched[/]: {sup.profile} serves now (supervised)")
        else:
            out.print(f"[bold red]switch to {profile} failed[/]: supervisor ended {sup.phase}")
        if wait and sup.phase != "done":
            raise SystemExit(5)
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = switch(res, inv, tr, c.roots(), sets=sets, waivers=waivers, secrets=_secrets_from_env(res),
                        progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"serving": result.serving, "switched": result.switched, "rolled_back": result.rolled_back,
                   "downtime_s": round(result.downtime_s, 3), "error": result.error})
    elif result.switched:
        out.print(f"[green]switched[/]: {result.serving} serves now; endpoint unavailable for {result.downtime_s:.1f} s")
    else:
        out.print(f"[bold red]switch to {profile} failed[/]: {escape(result.error)}")
        out.print(f"rolled back: {result.serving} serves again (endpoint unavailable for {result.downtime_s:.1f} s)")
    if not result.switched:
        raise SystemExit(5)


@cli.command("status")
@inventory_option
@click.option("--watch", "watch_s", type=float, default=None, metavar="SECONDS", help="refresh every SECONDS")
@with_transport_options
@json_option
@pass_ctx
def status_cmd(c: Ctx, watch_s: float | None, connect_timeout_s: float, command_timeout_s: float, deadline_s: float,
               as_json: bool) -> None:
    """What runs on every node, and where it drifted from the record."""
    from .status import cluster_status

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        while True:
            st = cluster_status(inv, tr)
            if as_json:
                emit_json(st)
            else:
                _print_status(st)
            if watch_s is None:
                break
            time.sleep(watch_s)


def _print_status(st: dict[str, Any]) -> None:
    rec = st["record"]
    if rec:
        out.print(f"[bold]{rec['profile']}[/] ({rec['engine']} {rec['engine_version']}, {rec['served_name']}): "
                  f"{rec['state']} since {rec['started_at']}"
                  + (f"; waivers: {', '.join(rec['waivers'])}" if rec["waivers"] else ""))
    else:
        out.print("no sparkctl record: nothing started by sparkctl")
    t = Table(box=None, pad_edge=False)
    for col in ("node", "rank", "engine", "alive", "SM MHz", "cap", "W", "C", "MemAvail GiB"):
        t.add_column(col)
    for n in st["nodes"]:
        if not n["reachable"]:
            t.add_row(n["node"], "-", "-", f"[red]unreachable[/] {escape(str(n['error']))[:40]}", "", "", "", "", "")
            continue
        t.add_row(n["node"], str(n.get("rank", "-")), str(n.get("engine") or "-"),
                  "[green]yes[/]" if n["alive"] else "no", str(n["sm_mhz"]), str(n["clock_lock"] or "-"),
                  str(n["power_w"]), str(n["temp_c"]), str(n["mem_available_gib"]))
    out.print(t)
    for h, e in st["endpoint"].items():
        if "error" in e:
            out.print(f"endpoint {e['url']}: [red]{e['error']}[/]")
        else:
            out.print(f"endpoint {e['url']}: serves {', '.join(e['models'])}; tokens generated {e['tokens_generated']}")
    sup = st.get("supervisor")
    if sup:
        state = "[green]running[/]" if sup["alive"] else "exited"
        out.print(f"switch supervisor on {sup['head']} (pid {sup['pid']}, {state}): "
                  f"[bold]{escape(str(sup['phase']))}[/]; log {escape(sup['log'])}")
        for e in sup["events"]:
            out.print(f"  {escape(str(e.get('t', '')))}  {escape(str(e.get('phase', '')))[:14]:<14} "
                      f"{escape(str(e.get('node', '')))[:10]:<10} {escape(str(e.get('message', '')))}")
    for d in st["drift"]:
        out.print(f"[yellow]drift[/] {escape(d)}")


@cli.command("logs")
@click.argument("node", required=False)
@inventory_option
@click.option("-n", "lines", type=int, default=50, show_default=True, help="lines per node")
@click.option("-f", "follow", is_flag=True, help="keep printing new lines")
@with_transport_options
@pass_ctx
def logs_cmd(c: Ctx, node: str | None, lines: int, follow: bool, connect_timeout_s: float, command_timeout_s: float,
             deadline_s: float) -> None:
    """Engine logs of every node (or NODE), each line prefixed by its node."""
    import shlex

    from .render import LOG_DIR, under

    inv = c.inventory()
    nodes = [node] if node else list(inv.names)
    for n in nodes:
        if n not in inv.names:
            raise ConfigError(f"node {n!r} is not in the inventory", hint=f"nodes: {', '.join(inv.names)}")
    paths = {n: shlex.quote(under(inv.node(n).prefix, LOG_DIR + "/engine.log")) for n in nodes}
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        offsets: dict[str, int] = {}
        res = tr.run_all({n: f"tail -n {int(lines)} {p} 2>/dev/null; echo; wc -c < {p} 2>/dev/null || echo 0"
                          for n, p in paths.items()})
        for n in nodes:
            body = res[n].stdout.rstrip("\n").split("\n")
            offsets[n] = int(body[-1]) if body and body[-1].strip().isdigit() else 0
            for line in body[:-2] if len(body) >= 2 else []:
                click.echo(f"[{n}] {line}")
        while follow:
            time.sleep(1.0)
            res = tr.run_all({n: f"tail -c +{offsets[n] + 1} {p} 2>/dev/null" for n, p in paths.items()})
            for n in nodes:
                text = res[n].stdout if res[n].ok else ""
                offsets[n] += len(text.encode())
                for line in text.splitlines():
                    click.echo(f"[{n}] {line}")


@cli.command("unlock")
@inventory_option
@pass_ctx
def unlock_cmd(c: Ctx) -> None:
    """Remove the cluster lock left by a process that is gone."""
    from .lifecycle import break_lock

    inv = c.inventory()
    with make_transport(inv, 5.0, 30.0, 60.0) as tr:
        holder = break_lock(inv, tr)
    out.print(f"lock removed (was: {escape(holder) or 'none'})")


# --------------------------------------------------------------------------- the simulated cluster


@cli.group("sim")
def sim_group() -> None:
    """The SIMULATED cluster on this machine (namespaces, real sshd, simulated GB10 tools and engines)."""


def _sim_root() -> Path:
    from .sim.paths import sim_root

    return sim_root()


@sim_group.command("up")
@click.option("--nodes", type=click.Choice(["1", "2", "4"]), default="4", show_default=True)
@click.option("--inventory-out", type=click.Path(dir_okay=False), help="where to write the inventory")
@click.option("--rootless", is_flag=True, help="degraded mode without namespaces (automatic when not root)")
def sim_up_cmd(nodes: str, inventory_out: str | None, rootless: bool) -> None:
    """Build (or converge) the simulated cluster and write its inventory."""
    from .inventory import loads_inventory
    from .sim import cluster
    from .sim.tinymodel import ensure_tiny_model
    from .sim.topology import sim_inventory_text, spec_from_inventory

    root = _sim_root()
    rootless = rootless or os.geteuid() != 0
    root.mkdir(parents=True, exist_ok=True)
    inv_path = Path(inventory_out) if inventory_out else root / "inventory.yaml"
    text = sim_inventory_text(int(nodes), root, rootless)
    inv = loads_inventory(text, str(inv_path))
    spec = spec_from_inventory(inv, rootless)
    status = cluster.up(spec, root, progress=lambda m: err_console().print(f"[dim]{escape(m)}[/]"))
    model = ensure_tiny_model(root / "models")
    for n in inv.nodes:  # the tiny real engine's weights, on every node's own disk
        dest = root / "nodes" / n.name / "fs" / "srv" / "models" / model.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            import shutil

            shutil.copyfile(model, dest)
    inv_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = inv_path.with_name(f".{inv_path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, inv_path)
    out.print(f"simulated {inv.topology} of {len(inv.nodes)} nodes is up ({status.mode} mode); inventory: {inv_path}")
    for lim in status.limitations:
        out.print(f"  not simulated: {escape(lim)}")
    out.print(f"try: sparkctl -i {inv_path} check ds41f-tp4-ring" if int(nodes) == 4 else f"try: sparkctl -i {inv_path} inventory")


@sim_group.command("down")
def sim_down_cmd() -> None:
    """Remove every trace of the simulated cluster (also after a crash)."""
    from .sim import cluster

    cluster.down(_sim_root())
    out.print("simulated cluster removed")


@sim_group.command("status")
@json_option
def sim_status_cmd(as_json: bool) -> None:
    """Namespaces, sshd, reachability, boot ids and links of the simulated nodes."""
    from .sim import cluster

    st = cluster.status(_sim_root())
    if as_json:
        emit_json(asdict(st))
        return
    out.print(f"simulated cluster: {st.mode} ({st.root})")
    for n in st.nodes:
        links = " ".join(f"{lk.ifname}:{'up' if lk.oper_up else 'DOWN'}/{lk.mtu}{'/stale' if lk.stale else ''}"
                         for lk in n.links)
        out.print(f"  {n.name:<8} {n.mgmt_ip}:{n.ssh_port} sshd {'up' if n.sshd_alive else 'DOWN'} "
                  f"ssh {'ok' if n.ssh_reachable else 'NO'} boot {str(n.boot_id)[:8]}  {links}", markup=False)


@sim_group.command("set")
@click.argument("node")
@click.argument("assignments", nargs=-1, required=True)
def sim_set_cmd(node: str, assignments: tuple[str, ...]) -> None:
    """Change a simulated node's hardware state: KEY=VALUE (e.g. kernel_release=6.17.0-1031-nvidia)."""
    from .sim import cluster

    for a in assignments:
        if "=" not in a:
            raise ConfigError(f"{a!r} is not KEY=VALUE", hint="e.g. page_size=65536 or held_packages=[]")
        key, _, value = a.partition("=")
        new = cluster.set_state(_sim_root(), node, key, value)
        out.print(f"{node}: {key} = {json.dumps(new)}", markup=False)


FAULTS = ("kill-engine", "link-down", "link-up", "stale-link", "mtu", "sshd-stop", "sshd-start",
          "unreachable", "reachable", "wedge", "unwedge", "leak-on-death", "disk-full", "disk-ok")


@sim_group.command("fault")
@click.argument("node")
@click.argument("kind", type=click.Choice(FAULTS))
@click.option("--iface", default="enp1s0f0np0", show_default=True, help="the twin netdev for link faults")
@click.option("--mtu", "mtu_bytes", type=int, default=1500, show_default=True, help="for kind mtu")
@click.option("--path", "disk_path", default="/var/lib/sparkctl", show_default=True,
              help="for kind disk-full: the node's directory whose disk fills (where the record lives)")
def sim_fault_cmd(node: str, kind: str, iface: str, mtu_bytes: int, disk_path: str) -> None:
    """Inject a fault into a simulated node."""
    from .sim import cluster

    root = _sim_root()
    actions = {
        "kill-engine": lambda: cluster.kill_engines(root, node),
        "link-down": lambda: cluster.link_down(root, node, iface),
        "link-up": lambda: cluster.link_up(root, node, iface),
        "stale-link": lambda: cluster.stale_link(root, node, iface),
        "mtu": lambda: cluster.set_mtu(root, node, iface, mtu_bytes),
        "sshd-stop": lambda: cluster.stop_sshd(root, node),
        "sshd-start": lambda: cluster.start_sshd(root, node),
        "unreachable": lambda: cluster.unreachable(root, node),
        "reachable": lambda: cluster.reachable(root, node),
        "wedge": lambda: cluster.set_state(root, node, "faults.wedged", "true"),
        "unwedge": lambda: cluster.set_state(root, node, "faults.wedged", "false"),
        "leak-on-death": lambda: cluster.set_state(root, node, "faults.leak_on_death", "true", allow_new=True),
        "disk-full": lambda: cluster.disk_full(root, node, disk_path),
        "disk-ok": lambda: cluster.disk_ok(root, node),
    }
    result = actions[kind]()
    out.print(f"{node}: {kind} done" + (f" ({result})" if result not in (None, []) else ""), markup=False)


@sim_group.command("reboot")
@click.argument("nodes", nargs=-1, required=True)
def sim_reboot_cmd(nodes: tuple[str, ...]) -> None:
    """Warm-reboot simulated nodes (new boot id, clock lock lost; stale links stay stale)."""
    from .sim import cluster

    for n in nodes:
        cluster.warm_reboot(_sim_root(), n)
        out.print(f"{n}: rebooted (warm)")


@sim_group.command("power-cycle")
@click.argument("nodes", nargs=-1, required=True)
def sim_power_cycle_cmd(nodes: tuple[str, ...]) -> None:
    """AC power-cycle simulated nodes (clears a stale link once both of its ends are cycled)."""
    from .sim import cluster

    cluster.power_cycle(_sim_root(), list(nodes))
    out.print(f"power-cycled: {', '.join(nodes)}")


# --------------------------------------------------------------------------- bench


class _BenchGroup(click.Group):
    """`sparkctl bench ARGS...` without a subcommand name is `sparkctl bench run ARGS...`.

    (A profile named like a subcommand, e.g. ``report``, needs the explicit ``bench run``.)
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def _int_list(_ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``8192,32768`` or ``8K,32K,128K`` (K = 1024) -> ints."""
    if not value:
        return None
    out = []
    for part in value.replace(" ", "").split(","):
        if not part:
            continue
        mult = 1024 if part[-1] in "kK" else 1
        try:
            n = int(part[:-1] if mult > 1 else part) * mult
        except ValueError:
            raise ConfigError(f"--{param.name}: {part!r} is not a whole number",
                              hint="a comma-separated list, e.g. 8K,32K,128K or 1,4,16") from None
        if n < 1:
            raise ConfigError(f"--{param.name}: {part!r} must be >= 1")
        out.append(n)
    return tuple(out)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text).strip("-") or "run"


@cli.group("bench", cls=_BenchGroup, no_args_is_help=True)
def bench_group() -> None:
    """Benchmark a serving stack: `sparkctl bench [PROFILE] --suite S...` (= `bench run`), report, compare."""


@bench_group.command("run")
@inventory_option
@click.argument("profile", required=False)
@click.option("--base-url", metavar="URL", help="benchmark this OpenAI-compatible endpoint (no cluster involved)")
@click.option("--model", metavar="NAME", help="served model name (default: the profile's model.served_name)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="run directory "
              "(default ./runs/<timestamp>-<profile or model>)")
@click.option("--suite", "suites", multiple=True, metavar="SUITE",
              help="prefill, decode, concurrency, agent, longctx, warm-prefix, peak, quality, soak (repeatable; "
                   "default: the profile's bench.suites, else prefill, decode, concurrency)")
@click.option("--record", is_flag=True, help="record grade: 3 repeats; the run must have usage-counted tokens "
              "and no errors, else the command fails (exit 4) after writing everything")
@click.option("--force", is_flag=True, help="bench even when the cluster check fails (recorded), and write into "
              "a non-empty --out")
@click.option("--lengths", callback=_int_list, metavar="N,N,...", help="prompt lengths in tokens for prefill "
              "(and the longctx ladder), e.g. 8K,32K,128K")
@click.option("--concurrency", callback=_int_list, metavar="N,N,...", help="concurrency levels (and agent "
              "session counts), e.g. 1,4,16")
@click.option("--repeats", type=int, help="repeats per point (at least 2; at least 3 with --record)")
@click.option("--duration", "duration_s", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="length of the soak suite")
@click.option("--decode-tokens", type=int, help="tokens out in decode/concurrency/peak (default: profile, 256)")
@click.option("--warmup-seconds", "warmup_s", type=float, default=10.0, show_default=True,
              help="agent suite: warmup before the measure window")
@click.option("--measure-seconds", "measure_s", type=float, default=60.0, show_default=True,
              help="agent suite: the fixed measure window")
@click.option("--label", help="column label in reports (default: the profile, else the engine tag)")
@json_option
@pass_ctx
def bench_run_cmd(c: Ctx, profile: str | None, base_url: str | None, model: str | None, out_dir: str | None,
                  suites: tuple[str, ...], record: bool, force: bool, lengths: tuple[int, ...] | None,
                  concurrency: tuple[int, ...] | None, repeats: int | None, duration_s: float,
                  decode_tokens: int | None, warmup_s: float, measure_s: float, label: str | None,
                  as_json: bool) -> None:
    """Run bench suites against PROFILE's cluster, or against --base-url URL --model NAME."""
    import contextlib

    with contextlib.ExitStack() as stack:
        _bench_run(c, profile, base_url, model, out_dir, suites, record, force, lengths, concurrency, repeats,
                   duration_s, decode_tokens, warmup_s, measure_s, label, as_json, stack)


def bench_check(res: Any, inv: Any, transport: Any, force: bool) -> dict[str, Any]:
    """Pre-bench health check: every law on every node; waivers come from the run record."""
    from .check import run_check
    from .errors import CheckFailed
    from .laws import Waiver
    from .lifecycle import read_record

    rec = read_record(inv, transport)
    waivers = {k: Waiver(k, v) for k, v in (rec.waivers if rec and rec.profile == res.name else {}).items()}
    report = run_check(res, inv, transport, waivers=waivers, bandwidth_s=0)
    fails = [v for v in report.verdicts if v.failed]
    if fails and not force:
        v = fails[0]
        raise CheckFailed(f"pre-bench check: {len(fails)} law(s) fail; first: {v.law} on {v.node}: {v.observed}",
                          hint="fix it, or --force to bench anyway (recorded in every row)")
    facts = [f for f in report.facts.values() if f is not None]
    return {
        "kernel": ",".join(sorted({f.kernel for f in facts if f.kernel})) or None,
        "page_size_kib": ",".join(sorted({str((f.page_size_bytes or 0) // 1024) for f in facts})) or None,
        "clock_lock_mhz": ",".join(sorted({str(f.clock_lock_record[1]) for f in facts
                                           if f.clock_lock_record and f.clock_lock_record[0] == f.boot_id})) or None,
        "waivers": [f"{k}: {w.reason}" for k, w in waivers.items()],
        "unqualified": bool(waivers),
        "check_ok": report.ok,
        "check_failures": [f"{v.law}@{v.node}" for v in fails],
    }


def _bench_run(c: Ctx, profile: str | None, base_url: str | None, model: str | None, out_dir: str | None,
               suites: tuple[str, ...], record: bool, force: bool, lengths: tuple[int, ...] | None,
               concurrency: tuple[int, ...] | None, repeats: int | None, duration_s: float,
               decode_tokens: int | None, warmup_s: float, measure_s: float, label: str | None,
               as_json: bool, stack: Any) -> None:
    import time as _time

    from .bench import runner as bench_runner
    from .bench.cluster_hooks import config_from_profile, prepare
    from .bench.results import HEADLINE
    from .errors import CheckFailed

    telemetry = None
    if base_url:
        config: dict[str, Any] = config_from_profile(c.resolve(profile)) if profile else {}
        model = model or config.get("served_name")
        if not model:
            raise ConfigError("--base-url needs --model NAME (or a PROFILE to take model.served_name from)")
    elif profile:
        inv = c.inventory()
        transport = make_transport(inv, 5.0, 60.0, 120.0)
        stack.callback(transport.close)

        def check_fn(res: Any, inv: Any, force: bool) -> dict[str, Any]:
            return bench_check(res, inv, transport, force)

        base_url, served, config, _ = prepare(c, profile, force, check_fn=check_fn)
        from .layout import bind
        from .telemetry import sampler

        telemetry = sampler(inv, transport, list(bind(c.resolve(profile), inv).nodes))
        model = model or served
    else:
        raise ConfigError("nothing to benchmark", hint="give a PROFILE, or --base-url URL --model NAME")
    chosen = suites or tuple((config.get("bench") or {}).get("suites") or ())
    options = bench_runner.RunOptions(
        suites=chosen or bench_runner.wl.DEFAULT_SUITES, repeats=repeats, record=record, lengths=lengths,
        concurrency=concurrency, decode_tokens=decode_tokens, duration_s=duration_s, label=label,
        agent_warmup_s=warmup_s, agent_measure_s=measure_s)
    out_path = Path(out_dir) if out_dir else Path("runs") / f"{_time.strftime('%Y%m%d-%H%M%S')}-{_slug(profile or model)}"
    if out_path.exists() and any(out_path.iterdir()) and not force:
        raise ConfigError(f"{out_path} is not empty", hint="choose another --out, or --force to write into it")
    progress = None if as_json else (lambda m: err_console().print(f"[dim]{escape(m)}[/]"))
    summary = bench_runner.run(base_url, model, out_path, config, options, telemetry=telemetry, progress=progress)
    if as_json:
        emit_json(asdict(summary))
    else:
        t = Table(box=None, pad_edge=False)
        for col in ("point", "metric", "median", "min", "max", "valid/runs", "flags"):
            t.add_column(col, justify="right" if col in ("median", "min", "max") else "left")
        for p in summary.points:
            if p["suite"] == "quality" and p["point"].count("/") > 1:
                continue  # per-scenario rows live in results.csv
            metric = HEADLINE.get(p["suite"], "")
            m = p["metrics"].get(metric) or {}
            f = (lambda v: "-" if v is None else (f"{v:,.1f}" if abs(v) >= 1 else f"{v:.4f}"))
            t.add_row(p["point"], metric, f(m.get("median")), f(m.get("min")), f(m.get("max")),
                      f"{p['valid_repeats']}/{p['repeats']}", escape(", ".join(p["flags"])[:60]))
        out.print(t)
        for suite, tele in summary.telemetry.items():
            nodes = ", ".join(f"{n} {v['mean_w']:.0f}/{v['peak_w']:.0f} W" for n, v in tele["nodes"].items())
            jpt = tele.get("j_per_completion_token")
            out.print(f"power {suite} (mean/peak): {nodes}" + (f"; {jpt:.2f} J/token" if jpt else ""), markup=False)
        out.print(f"{summary.n_requests} requests, {summary.n_errors} errors, {summary.duration_s:.1f} s; "
                  f"wrote {summary.out_dir}/results.csv, events.jsonl, telemetry.csv, run.json", markup=False)
    if record and not summary.record_grade:
        raise CheckFailed("not record grade: " + "; ".join(summary.record_problems), hint=f"see {summary.out_dir}")


@bench_group.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="where report.md and the plots go (default: RUN_DIR/report for one run, else ./runs/report-<time>)")
@click.option("--html", "html_out", is_flag=True, help="also write report.html")
@click.option("--published", type=click.Path(dir_okay=False), help="published-numbers YAML for the reference "
              "columns (default: the copy shipped with sparkctl)")
@json_option
def bench_report_cmd(run_dirs: tuple[str, ...], out_dir: str | None, html_out: bool, published: str | None,
                     as_json: bool) -> None:
    """Comparison table (markdown, optional HTML) and PNG plots over RUN_DIRS, beside the published figures."""
    import time as _time

    from .bench.report import build_report

    dest = Path(out_dir) if out_dir else (Path(run_dirs[0]) / "report" if len(run_dirs) == 1
                                          else Path("runs") / f"report-{_time.strftime('%Y%m%d-%H%M%S')}")
    rep = build_report(run_dirs, dest, html_out=html_out, published_path=published)
    if as_json:
        emit_json({"files": list(rep.files), "columns": [c.label for c in rep.columns]})
        return
    click.echo(rep.markdown.split("\n## ")[0].rstrip())
    out.print(f"\nwrote {', '.join(rep.files)}", markup=False)


@bench_group.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@json_option
def bench_compare_cmd(run_a: str, run_b: str, as_json: bool) -> None:
    """Per-metric ratios B / A of two runs (median over repeats)."""
    from .bench.report import compare_runs

    a, b, ratios = compare_runs(run_a, run_b)
    if as_json:
        emit_json({"a": a.label, "b": b.label, "ratios": [asdict(r) for r in ratios]})
        return
    t = Table(box=None, pad_edge=False)
    for col in ("point", "metric", a.label, b.label, "B/A"):
        t.add_column(escape(col), justify="left" if col in ("point", "metric") else "right")

    def f(v: float | None) -> str:
        return "-" if v is None else (f"{v:,.1f}" if abs(v) >= 10 else f"{v:.4g}")

    for r in ratios:
        t.add_row(r.point, r.metric, f(r.a), f(r.b), "-" if r.ratio is None else f"{r.ratio:.3f}")
    out.print(t)


@bench_group.command("selftest")
@click.option("--concurrency", callback=_int_list, metavar="N,N,...", help="concurrency levels (default 1,16)")
@json_option
def bench_selftest_cmd(concurrency: tuple[int, ...] | None, as_json: bool) -> None:
    """Check the bench client and metrics against the reference server's closed forms (exit 0 only when ok)."""
    from .bench.selftest import format_report, run_selftest
    from .errors import CheckFailed

    report = run_selftest(concurrency or (1, 16))
    if as_json:
        emit_json(asdict(report))
    else:
        click.echo(format_report(report))
    if not report.ok:
        raise CheckFailed(f"bench selftest failed: {len(report.failures())} checks out of tolerance",
                          hint="a busy machine skews timing: rerun when it is quiet")


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
    from .weights import fetch

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
    from .layout import bind
    from .weights import describe_plan, plan_sync, sync

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


# --------------------------------------------------------------------------- demo


@cli.command("demo")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where the runs and the report go (default ./runs/demo-<time>)")
@click.option("--keep", is_flag=True, help="leave the simulated cluster up at the end")
def demo_cmd(out_dir: str | None, keep: bool) -> None:
    """The whole tour on the SIMULATED 4-node ring: sim up, check, up ds41f, bench, switch TensorFold, bench, report, down."""
    from .sim.paths import default_inventory

    base = Path(out_dir) if out_dir else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    inv = str(default_inventory())
    waive = ["--waive", "page_size", "--reason", "stock 4 KiB kernel, as in the field report"]
    bench = ["--suite", "prefill", "--suite", "decode", "--suite", "concurrency", "--lengths", "8K,32K",
             "--concurrency", "1,4,16", "--decode-tokens", "64", "--force"]
    steps: list[tuple[str, list[str], bool]] = [
        ("build the simulated ring (namespaces, real sshd, simulated GB10 tools)", ["sim", "up", "--nodes", "4"], False),
        ("the inventory: ring order, fabric addresses, routes", ["-i", inv, "inventory"], False),
        ("check every law; apply the clock cap; waive the 64 KiB page size like the field report",
         ["-i", inv, "check", "ds41f-tp4-ring", "--fix", *waive], False),
        ("up ds41f TP4 over the ring", ["-i", inv, "up", "ds41f-tp4-ring", *waive], False),
        ("status", ["-i", inv, "status"], False),
        ("bench ds41f", ["-i", inv, "bench", "ds41f-tp4-ring", *bench, "--out", str(base / "ds41f")], False),
        ("switch to TensorFold", ["-i", inv, "switch", "tensorfold-tp4-ring"], False),
        ("bench TensorFold", ["-i", inv, "bench", "tensorfold-tp4-ring", *bench, "--out", str(base / "tensorfold")],
         False),
        ("report: the two stacks beside the published figures, with plots",
         ["bench", "report", str(base / "ds41f"), str(base / "tensorfold"), "--out", str(base / "report"), "--html"],
         False),
        ("down", ["-i", inv, "down"], True),
    ]
    if not keep:
        steps.append(("remove the simulated cluster", ["sim", "down"], True))
    for i, (title, args, always) in enumerate(steps, 1):
        out.print(f"\n[bold]== {i}/{len(steps)} {escape(title)}[/]  [dim]sparkctl {escape(' '.join(args))}[/]")
        code = main(args)
        if code != 0:
            out.print(f"[bold red]step failed (exit {code})[/]; cleaning up")
            main(["-i", inv, "down"])
            if not keep:
                main(["sim", "down"])
            raise SystemExit(code)
    out.print(f"\n[green]demo complete[/]: report in {base / 'report'}/report.md (and report.html, PNG plots)")


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="sparkctl", standalone_mode=False)
        return 0
    except SparkctlError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if os.environ.get("SPARKCTL_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} "
                   "(a sparkctl bug; rerun with SPARKCTL_DEBUG=1 for the traceback)", err=True)
        return 70


if __name__ == "__main__":
    sys.exit(main())
