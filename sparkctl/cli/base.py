"""What every command group shares: the context, the root group, common options, output helpers.

Only the cli package prints, prompts or exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sparkctl import __version__
from sparkctl.errors import ConfigError
from sparkctl.model.inventory import Inventory, load_inventory
from sparkctl.model.profiles import Resolved, resolve
from sparkctl.model.resources import Roots
from sparkctl.ops.localstate import registered_inventory

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
        registered = registered_inventory()  # what `sparkctl sim up` (or any generator) registered
        if registered is not None:
            return str(registered)
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


def print_plan(plan: Any, as_json: bool) -> None:
    """A plan as `--dry-run` and `sparkctl plan` show it: its JSON, or its lines as they are."""
    from sparkctl.plan.steps import describe

    if as_json:
        emit_json(plan.to_dict())
        return
    for line in describe(plan):
        out.print(escape(line))


PLUGIN_GROUP = "sparkctl.commands"
# What a plugin needs beyond the product, and how to get it (the wheel's extras).
PLUGIN_EXTRA = {"sim": "sim", "demo": "sim"}


def _plugins() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=PLUGIN_GROUP)}


class PluginGroup(click.Group):
    """The root group, plus the commands registered by entry points (loaded when named)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_plugins()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        ep = _plugins().get(name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except ImportError as exc:
            return _missing_extra(name, exc)
        return loaded if isinstance(loaded, click.Command) else None


def _missing_extra(name: str, exc: ImportError) -> click.Command:
    extra = PLUGIN_EXTRA.get(name, name)

    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"(needs the {extra} extra: pip install 'sparkctl[{extra}]')")
    def unavailable() -> None:
        raise ConfigError(f"`sparkctl {name}` needs the {extra} extra: pip install 'sparkctl[{extra}]'",
                          hint=f"missing module: {getattr(exc, 'name', None) or exc}")

    return unavailable


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
        obj = ctx.find_object(Ctx)
        assert obj is not None  # the group's callback made it before any option's
        obj.inventory_path = value


inventory_option = click.option("-i", "--inventory", metavar="FILE", expose_value=False, callback=_set_inventory,
                                help="inventory file (same as the global -i)")
set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="override a profile value (repeatable), e.g. --set laws.clock_cap_mhz=2100")
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output")



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

    from sparkctl.transport import SSHTransport, TransportSettings

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # we report connection errors ourselves
    return SSHTransport(inv.nodes, TransportSettings(connect_timeout_s, command_timeout_s, deadline_s))


STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "waived": "magenta", "skip": "dim"}


def print_verdicts(report: Any) -> None:
    """One table, law x node (the worst verdict in each cell), then every non-ok verdict with its fix."""
    order = {"fail": 0, "warn": 1, "waived": 2, "ok": 3, "skip": 4}
    laws_seen = list(dict.fromkeys(v.law for v in report.verdicts))
    # A cell wraps (and folds a word longer than its column), never cuts: the verdict is what the operator reads.
    t = Table(box=None, pad_edge=False)
    t.add_column("law", overflow="fold")
    for n in report.nodes:
        t.add_column(n, overflow="fold")
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
            cells.append(f"[{STATUS_STYLE.get(worst.status, '')}]{worst.status}[/] {escape(note)}")
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
    from sparkctl.plan.laws import LAWS, Waiver

    ids = {law.id for law in LAWS}
    waivable = sorted(law.id for law in LAWS if law.waivable)
    out = {}
    for w in waive:
        if w not in ids:
            raise ConfigError(f"--waive {w}: no such law", hint=f"laws: {', '.join(sorted(ids))}")
        if w not in waivable:
            raise ConfigError(f"--waive {w}: this law cannot be waived (a waiver would change nothing)",
                              hint=f"waivable laws: {', '.join(waivable)}; fix the cause (docs/LAWS.md, {w})")
        if not reason or not reason.strip():
            raise ConfigError(f"--waive {w} needs --reason \"...\"", hint="a waiver is recorded with its reason")
        out[w] = Waiver(w, reason.strip())
    return out


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_engine_warnings(res: Resolved, inv: Inventory) -> None:
    """On stderr: 'not validated against <engine> <version>' and what the engine's contract refuses."""
    from sparkctl.plan.render import engine_warnings

    for w in engine_warnings(res, inv):
        err_console().print(f"[yellow]warning:[/] {escape(w)}")




class NodeProgress:
    """Per-node progress lines: phase, elapsed, last log line (rich live table on a terminal).

    With ``SPARKCTL_PROGRESS_JSONL=PATH`` every event is also appended to PATH as
    one JSON line (``t``, ``elapsed_s``, ``pid``, ``node``, ``phase``, ``message``),
    flushed at once, for tools that follow a run (tools/fault_matrix.py does).
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


def secrets_from_env(res: Resolved) -> dict[str, str]:
    names = {n for node in [None, *res.node_layers] for n in (res.for_node(node) if node else res.profile).engine.secret_env}
    # the endpoint's API key (serve.api_key_env): a secret like the others
    names |= {k for node in [None, *res.node_layers]
              if (k := (res.for_node(node) if node else res.profile).serve.api_key_env)}
    return {n: os.environ[n] for n in names if n in os.environ}
