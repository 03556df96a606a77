"""Commands that reach the nodes: check, hw-change, trust, up, down, switch, status, logs, unlock."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

import click
from rich.table import Table

from sparkctl.cli.base import (
    Ctx,
    NodeProgress,
    cli,
    emit_json,
    err_console,
    escape,
    inventory_option,
    json_option,
    make_transport,
    out,
    parse_waivers,
    pass_ctx,
    print_engine_warnings,
    print_plan,
    print_verdicts,
    secrets_from_env,
    set_option,
    with_transport_options,
    with_waive_options,
)
from sparkctl.errors import CheckFailed, ConfigError, LifecycleError, SwitchDegraded


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
    from sparkctl.ops.check import clear_hw_change_if_done, run_check
    from sparkctl.ops.executor import plan_runner

    res = c.resolve(profile, sets)
    inv = c.inventory()
    print_engine_warnings(res, inv)
    waivers = parse_waivers(waive, reason)
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        say = None if as_json else (lambda m: err_console().print(f"[dim]{escape(m)}[/]"))
        report = run_check(res, inv, tr, waivers=waivers, fix=fix, bandwidth_s=bandwidth_s, progress=say,
                           fix_runner=plan_runner(inv, tr, say or (lambda _m: None)))
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
        bad = [v for v in report.verdicts if v.failed]
        first = f"; first: {bad[0].law} on {bad[0].node}" if bad else ""
        raise CheckFailed(f"check {profile}: {len(bad)} law(s) fail{first}",
                          hint="each failing law's fix is in the verdicts above; --waive LAW --reason WHY accepts one")




@cli.command("hw-change")
@inventory_option
@click.option("--note", required=True, help="what changed (a cable moved, a card reseated, ...)")
@click.option("--node", "nodes", multiple=True, help="affected nodes (default: all)")
@with_transport_options
@pass_ctx
def hw_change_cmd(c: Ctx, note: str, nodes: tuple[str, ...], connect_timeout_s: float, command_timeout_s: float,
                  deadline_s: float) -> None:
    """Record a cable or PCIe change: `check` fails until the nodes are AC power-cycled."""
    from sparkctl.ops.check import record_hw_change

    inv = c.inventory()
    _known_nodes(inv, nodes)
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
    from sparkctl.transport import (
        TransportSettings,
        default_known_hosts,
        fetch_host_key,
        trust,
    )

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


_F = TypeVar("_F", bound=Callable[..., Any])


def _stack_option(what: str) -> Callable[[_F], _F]:
    return click.option("--stack", "stack", default=None, metavar="NAME",
                        help=f"{what} (a profile's topology.stack; `default` when unset)")


def _known_nodes(inv: Any, nodes: Sequence[str]) -> None:
    """Every ``--node`` names a node of the inventory, or a ConfigError naming the one that does not."""
    for n in nodes:
        if n not in inv.names:
            raise ConfigError(f"--node {n}: not in the inventory", hint=f"nodes: {', '.join(inv.names)}")


def _up_summary(result: Any) -> None:
    if result.action == "noop":
        out.print(f"{result.profile}: already serving with the same rendered files; nothing to do")
        return
    rec = result.record
    phases = ", ".join(f"{p.phase} {p.seconds:.1f}s" for p in result.phases)
    own = sum(p.seconds for p in result.phases if p.phase != "ready")
    out.print(f"[green]{result.profile} serving[/] {rec.served_name} on "
              f"{', '.join(rec.heads)}:{rec.port} ({result.action}; {phases}; sparkctl's own time {own:.1f} s)")


@cli.command("plan")
@click.argument("action", type=click.Choice(["up", "down", "switch", "fabric", "gateway-down", "unlock"]))
@click.argument("profile", required=False)
@inventory_option
@set_option
@with_waive_options
@click.option("--supervise", is_flag=True, help="switch: show what this side runs and what the head's runner runs")
@click.option("--reset-clocks", is_flag=True, help="down: also reset the GPU clock lock")
@_stack_option("down: only this stack; the others keep serving")
@click.option("--assume-fresh", is_flag=True, help="read nothing from the nodes: plan for a cluster where nothing "
              "runs and no record exists (touches no host)")
@click.option("--persist", is_flag=True, help="up: as `up --persist` (--set serve.persist=true)")
@click.option("--gateway-node", default=None, help="gateway-down: the gateway's node (default: the records')")
@click.option("--force", is_flag=True, help="gateway-down: even while a live stack serves through it")
@click.option("--node", "nodes", multiple=True, metavar="NODE", help="unlock: only these nodes' locks")
@with_transport_options
@json_option
@pass_ctx
def plan_cmd(c: Ctx, action: str, profile: str | None, sets: tuple[str, ...], waive: tuple[str, ...],
             reason: str | None, supervise: bool, reset_clocks: bool, stack: str | None, assume_fresh: bool,
             persist: bool, gateway_node: str | None, force: bool, nodes: tuple[str, ...],
             connect_timeout_s: float, command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """The exact steps `up|down|switch PROFILE` (or `fabric apply [PROFILE]`, `gateway down`, `unlock`) would run
    now, every command and file.

    It reads the run record on the head, which engines run and whether the
    endpoint serves (to know what changed), and changes nothing on any host.
    """
    from sparkctl.ops.executor import plan_for
    from sparkctl.ops.lock import holder_info
    from sparkctl.ops.supervise import plan_supervised
    from sparkctl.plan.steps import describe

    if nodes and action != "unlock":
        raise click.UsageError("--node goes with `plan unlock`")
    if action == "unlock":  # reads nothing: the same step whatever holds the locks
        from sparkctl.plan.lockplan import unlock_plan

        inv = c.inventory()
        _known_nodes(inv, nodes)
        print_plan(unlock_plan(inv, list(nodes) or None), as_json)
        return
    if action == "gateway-down":  # reads the records only
        from sparkctl.ops.gatewayops import plan_gateway_down
        from sparkctl.ops.lock import read_records

        inv = c.inventory()
        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            gplan = plan_gateway_down(inv, read_records(inv, tr), holder_info("gateway down"), gateway_node, force)
        print_plan(gplan, as_json)
        return
    if action in ("up", "switch") and not profile:
        raise click.UsageError(f"plan {action} needs a PROFILE")
    if stack is not None and action != "down":
        raise click.UsageError("--stack goes with `plan down` (a profile names its own stack: topology.stack)")
    if persist:
        sets = (*sets, "serve.persist=true")
    res = c.resolve(profile, sets) if action != "down" and profile else None
    inv = c.inventory()
    if action == "fabric":  # reads the nodes' netplan files only (--assume-fresh: nothing)
        from sparkctl.ops.fabric import plan_apply, read_netplan

        netplan = None
        if not assume_fresh:
            with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
                netplan = read_netplan(inv, tr)
        fplan, _files = plan_apply(inv, c.roots(), res, secrets_from_env(res) if res else {}, netplan,
                                   holder_info("fabric apply"))
        print_plan(fplan, as_json)
        return
    if res is not None:
        print_engine_warnings(res, inv)
    op = f"{action} --supervise" if supervise and action == "switch" else action
    kw: dict[str, Any] = dict(sets=sets, waivers=parse_waivers(waive, reason),
                              secrets=secrets_from_env(res) if res else {},
                              holder=holder_info(f"{op} {profile or ''}".strip()))

    def make(tr: Any) -> tuple[list[Any], Any]:
        if op == "switch --supervise":  # both parts: this side's (grant, push, launch) and the head's
            assert res is not None
            sp = plan_supervised(res, inv, tr, c.roots(), **kw)
            return [sp.operator, sp.head], sp.rendering
        plan, rendering, _x = plan_for(action, res, inv, tr, c.roots(), reset_clocks=reset_clocks,
                                       stack=stack if action == "down" else None, **kw)
        return [plan], rendering

    if assume_fresh:
        plans, _r = make(None)
    else:
        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            plans, _r = make(tr)
    ranks = [asdict(r) for r in _r.layout.ranks] if _r is not None else []
    if as_json:
        doc = plans[0].to_dict() if len(plans) == 1 else {"operator": plans[0].to_dict(), "head": plans[1].to_dict()}
        emit_json({**doc, "ranks": ranks, "inventory": inv.file, "topology": inv.topology})
        return
    if res is not None and _r is not None:
        p = res.profile
        out.print(f"{res.name}: {p.engine.name} {p.engine.version}, {p.model.served_name}, TP{p.topology.tp_size} "
                  f"x{p.topology.replicas} {p.topology.layout} on {inv.topology} ({inv.file})")
        order = "in inventory order, behind the switch" if inv.topology == "switch" else "follow the ring"
        out.print(f"ranks ({order}): " + "  ".join(
            f"{r.node}=rank {r.rank}{'/replica ' + str(r.replica) if p.topology.replicas > 1 else ''} ({r.host_ip})"
            for r in _r.layout.ranks))
    for i, pl in enumerate(plans):
        if len(plans) > 1:
            out.print("[bold]" + ("on this machine, before the handover" if i == 0 else
                                  "on the head, by the plan runner") + "[/]")
        for line in describe(pl):
            out.print(escape(line), soft_wrap=True)


@cli.command("up")
@click.argument("profile")
@inventory_option
@set_option
@with_waive_options
@click.option("--persist", is_flag=True, help="enable the engine units so the stack comes back after a reboot "
              "(the same as --set serve.persist=true)")
@with_transport_options
@json_option
@pass_ctx
def up_cmd(c: Ctx, profile: str, sets: tuple[str, ...], waive: tuple[str, ...], reason: str | None, persist: bool,
           connect_timeout_s: float, command_timeout_s: float, deadline_s: float, as_json: bool) -> None:
    """Check, push, start PROFILE's ranks in order and wait until it serves its model name."""
    from sparkctl.ops.executor import up

    if persist:
        sets = (*sets, "serve.persist=true")
    res = c.resolve(profile, sets)
    inv = c.inventory()
    waivers = parse_waivers(waive, reason)
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = up(res, inv, tr, c.roots(), sets=sets, waivers=waivers, secrets=secrets_from_env(res),
                    progress=NodeProgress(quiet=as_json))
    if as_json:
        emit_json({"profile": result.profile, "action": result.action,
                   "phases": {p.phase: round(p.seconds, 3) for p in result.phases},
                   "ready_s": round(result.ready_s, 3), "record": result.record.to_dict() if result.record else None,
                   "steps": [dict(s) for s in result.steps]})
    else:
        _up_summary(result)


@cli.command("down")
@inventory_option
@click.option("--reset-clocks", is_flag=True, help="also reset the GPU clock lock (nvidia-smi -rgc)")
@_stack_option("stop only this stack and lock only its nodes; the other stacks keep serving")
@with_transport_options
@json_option
@pass_ctx
def down_cmd(c: Ctx, reset_clocks: bool, stack: str | None, connect_timeout_s: float, command_timeout_s: float,
             deadline_s: float, as_json: bool) -> None:
    """Stop what sparkctl started (every stack, or --stack NAME), verify processes gone and ports closed (idempotent)."""
    from sparkctl.ops.executor import down

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = down(inv, tr, reset_clocks=reset_clocks, progress=NodeProgress(quiet=as_json), stack=stack)
    if as_json:
        emit_json({"stopped": list(result.stopped), "leftovers": dict(result.leftovers), "leaks_gib": dict(result.leaks),
                   "clocks_reset": list(result.clocks_reset), "steps": [dict(s) for s in result.steps]})
    else:
        out.print(f"stopped sparkctl engines on {', '.join(result.stopped)}")
        for n, what in result.leftovers.items():
            out.print(f"[bold red]still there[/] on {n}: {escape(what)}")
        for n, gib in result.leaks.items():
            out.print(f"[yellow]memory not given back[/] on {n}: {gib:.1f} GiB held with no engine (reboot {n})")
        if result.clocks_reset:
            out.print(f"clock lock reset on {', '.join(result.clocks_reset)}")
    if result.leftovers:
        from sparkctl.errors import LifecycleError, Ref

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
    from sparkctl.ops.executor import switch
    from sparkctl.ops.supervise import switch_supervised

    res = c.resolve(profile, sets)
    inv = c.inventory()
    waivers = parse_waivers(waive, reason)
    if wait and not supervise:
        raise click.UsageError("--wait goes with --supervise")
    if supervise:
        with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
            sup = switch_supervised(res, inv, tr, c.roots(), sets=sets, waivers=waivers,
                                    secrets=secrets_from_env(res), progress=NodeProgress(quiet=as_json), wait=wait)
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
        if wait and sup.phase == "left-degraded":
            last = sup.events[-1].get("message", "") if sup.events else ""
            raise SwitchDegraded(f"supervised switch to {profile} ended degraded: {last}",
                                 hint=f"`sparkctl status` shows which head serves which profile; `sparkctl switch "
                                      f"{profile}` again resumes; its log: {sup.log} on {sup.head}")
        if wait and sup.phase != "done":
            raise LifecycleError(f"supervised switch to {profile} ended {sup.phase}", hint=f"its log: {sup.log} on {sup.head}")
        return
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        result = switch(res, inv, tr, c.roots(), sets=sets, waivers=waivers, secrets=secrets_from_env(res),
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
        raise LifecycleError(f"switch to {profile} failed" + (f"; {result.serving} serves again" if result.rolled_back else ""),
                             hint="the failure is above (or in --json's error)")


@cli.command("status")
@inventory_option
@click.option("--watch", "watch_s", type=float, default=None, metavar="SECONDS", help="refresh every SECONDS")
@_stack_option("only this stack and its nodes")
@with_transport_options
@json_option
@pass_ctx
def status_cmd(c: Ctx, watch_s: float | None, stack: str | None, connect_timeout_s: float, command_timeout_s: float,
               deadline_s: float, as_json: bool) -> None:
    """What runs on every node, stack by stack, and where it drifted from each stack's record."""
    from sparkctl.ops.status import cluster_status

    inv = c.inventory()
    with make_transport(inv, connect_timeout_s, command_timeout_s, deadline_s) as tr:
        while True:
            st = cluster_status(inv, tr, stack=stack)
            if as_json:
                emit_json(st)
            else:
                _print_status(st)
            if watch_s is None:
                break
            time.sleep(watch_s)


def _print_status(st: dict[str, Any]) -> None:
    stacks = st.get("stacks") or []
    for s in stacks:
        rec = s["record"]
        name = "" if s["stack"] == "default" and len(stacks) == 1 else f"stack {escape(s['stack'])}: "
        out.print(f"{name}[bold]{rec['profile']}[/] ({rec['engine']} {rec['engine_version']}, {rec['served_name']}"
                  f" on {', '.join(rec['nodes'])}): {rec['state']} since {rec['started_at']}"
                  + (f"; waivers: {', '.join(rec['waivers'])}" if rec["waivers"] else ""))
        for head, r in (rec.get("replicas") or {}).items():  # degraded: which head serves which profile
            out.print(f"  {escape(head)}: {escape(str(r.get('profile')))} ({escape(str(r.get('served_name')))} "
                      f"on {escape('+'.join(r.get('nodes') or ()))}, port {r.get('port')})")
        if rec["state"] == "degraded" and rec.get("note"):
            out.print(f"  [yellow]{escape(rec['note'])}[/]")
    if not stacks:
        out.print("no sparkctl record: nothing started by sparkctl")
    many = len(stacks) > 1
    t = Table(box=None, pad_edge=False)
    for col in (("node",) + (("stack",) if many else ()) + ("rank", "engine", "alive", "SM MHz", "cap", "W", "C",
                                                            "MemAvail GiB", "earlyoom")):
        t.add_column(col)
    for n in st["nodes"]:
        first = (n["node"],) + ((escape(str(n.get("stack") or "-")),) if many else ())
        if not n["reachable"]:
            t.add_row(*first, "-", "-", f"[red]unreachable[/] {escape(str(n['error']))[:40]}", "", "", "", "", "", "")
            continue
        t.add_row(*first, str(n.get("rank", "-")), str(n.get("engine") or "-"),
                  "[green]yes[/]" if n["alive"] else "no", str(n["sm_mhz"]), str(n["clock_lock"] or "-"),
                  str(n["power_w"]), str(n["temp_c"]), str(n["mem_available_gib"]),
                  ("[green]active[/]" if n.get("watchdog") == "active" else f"[red]{escape(str(n.get('watchdog')))}[/]")
                  if n.get("watchdog") else "-")
    out.print(t)
    for h, e in st["endpoint"].items():
        where = f"endpoint {e['url']}" + (f" (through {e['via']})" if e.get("via") else "")
        if e.get("state") == "needs key":  # the operator's variable is unset: nothing was asked
            out.print(f"{where}: [yellow]{escape(e['error'])}[/]")
        elif "error" in e:
            out.print(f"{where}: [red]{escape(e['error'])}[/]")
        else:
            out.print(f"{where}: serves {', '.join(e['models'])}; tokens generated {e['tokens_generated']}")
    if st.get("gateways"):
        from sparkctl.cli.gateway import print_gateways

        print_gateways(st["gateways"])
    for s in stacks:
        laws = s.get("laws") or {}
        bad = [v for v in laws.get("verdicts") or [] if v.get("status") in ("fail", "warn")]
        if laws:
            name = "" if len(stacks) == 1 else f"{escape(s['stack'])}: "
            out.print(f"{name}laws judged {escape(str(laws.get('at')))} for {escape(str(laws.get('profile')))}: "
                      + (", ".join(f"{escape(str(v.get('law')))} {v.get('status')} on {escape(str(v.get('node')))}"
                                   for v in bad[:6]) or "all ok"))
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

    from sparkctl.model.paths import LOG_DIR, under

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
@click.option("--node", "nodes", multiple=True, metavar="NODE", help="only these nodes' locks (default: every node)")
@pass_ctx
def unlock_cmd(c: Ctx, nodes: tuple[str, ...]) -> None:
    """Remove the locks left by a process that is gone (every node's and served name's, or --node NODE's).

    One plan step on the head, which `sparkctl plan unlock` prints."""
    from sparkctl.ops.unlock import break_locks

    inv = c.inventory()
    _known_nodes(inv, nodes)
    with make_transport(inv, 5.0, 30.0, 60.0) as tr:
        holder = break_locks(inv, tr, NodeProgress(), list(nodes) or None)
    out.print(f"lock removed (was: {escape(holder) or 'none'})")
