"""The planner: (resolved profile, inventory, rendering, facts, previous record) -> Plan. Pure.

``switch`` (plain and rolling) is in ``sparkctl.plan.switchplan``, built from these steps.

``sparkctl plan up|down|switch`` prints these plans, and the executor
(``sparkctl.ops.executor``) runs exactly these steps, nothing else. The facts
the planner needs (the run record, which engines run, whether the endpoint
serves) are read by the caller before planning and named in ``Plan.reads``.

Rules the plans encode:
- a failure before anything is stopped (check, clock, the "starting" record)
  leaves the previous stack serving: ``on_fail: abort``;
- after that, ``up`` stops what it started and records "failed" (branch
  ``stop``); ``switch`` brings the previous stack back and proves it serves its
  own name (branch ``rollback``, which itself falls back to ``stop``);
- a rank cannot rejoin its communicator: ``up`` restarts whole replicas whose
  files changed, and nothing when nothing changed and everything serves.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sparkctl.model import clocklock, paths, watchdog
from sparkctl.model.engines import ENGINE_REGEX
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import profile_ref
from sparkctl.model.paths import (
    CLOCK_UNIT,
    DEFAULT_STACK,
    DETACHED,
    ENGINE_LOG,
    ENV_FILE,
    UNIT,
    gateway_record_path,
    laws_path,
    record_path,
    under,
)
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import NodeRecord, RunRecord, operator_route
from sparkctl.model.stacks import model_identity, refusal, stack_of
from sparkctl.plan import contracts, gatewayplan
from sparkctl.plan.laws.memory import FRACTION_ENGINES, drop_caches_if_short_command
from sparkctl.plan.render import API_KEY_VAR, Rendering, bind_host
from sparkctl.plan.steps import FileRef, Plan, Step

STOP_SCRIPT = """\
set -u
unit={unit}; detached={detached}
if [ -e "$unit" ] && command -v systemctl >/dev/null 2>&1; then systemctl stop sparkctl-engine 2>/dev/null || true; fi
if [ -e "$detached" ]; then sh "$detached" stop >/dev/null 2>&1 || true; fi
if command -v docker >/dev/null 2>&1; then docker rm -f sparkctl-engine >/dev/null 2>&1 || true; fi
i=0
while [ "$i" -lt {wait_ds} ]; do
  if ps -eo pid,args | grep -iE -e {pattern} >/dev/null 2>&1; then sleep 0.1; i=$((i + 1)); else break; fi
done
left=$(ps -eo pid,args | grep -iE -e {pattern} | awk '{{print $1}}' | tr '\\n' ' ')
if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; sleep 0.2; fi
left=$(ps -eo pid,args | grep -iE -e {pattern} | awk '{{print $1}}' | tr '\\n' ' ')
ports=""
for p in {ports}; do
  if (ss -ltnH 2>/dev/null || true) | awk '{{print $4}}' | grep -qE "[:.]$p\\$"; then ports="$ports $p"; fi
done
echo "left:$left"
echo "ports:$ports"
"""

ALIVE_COMMAND = f"ps -eo pid,args | grep -iE -e {shlex.quote(ENGINE_REGEX)} >/dev/null && echo alive || echo dead"


@dataclass(frozen=True)
class UpFacts:
    """What ``up`` reads before it plans (it changes nothing)."""

    record: RunRecord | None = None  # the record of the profile's own stack (topology.stack)
    alive: Mapping[str, bool] = field(default_factory=dict)  # node -> an engine process runs
    healthy: bool = False  # every head's /v1/models lists the served name
    others: tuple[RunRecord, ...] = ()  # the records of every other stack (only live ones count)
    # a degraded record: the heads of its replicas of this profile found serving it (alive, the name
    # answered); None: not read (the record is trusted)
    serving: tuple[str, ...] | None = None


# --------------------------------------------------------------------------- commands


def stop_command(inv: Inventory, node: str, ports: Sequence[int], timeout_s: int) -> str:
    prefix = inv.node(node).prefix
    return STOP_SCRIPT.format(unit=shlex.quote(under(prefix, UNIT)), detached=shlex.quote(under(prefix, DETACHED)),
                              wait_ds=int(timeout_s * 10), pattern=shlex.quote(ENGINE_REGEX),
                              ports=" ".join(str(int(p)) for p in ports) or "0")


ENGINE_UNIT = posixpath.basename(UNIT)
CLOCK_CAP_UNIT = posixpath.basename(CLOCK_UNIT)


def start_command(inv: Inventory, node: str, supervisor: str, persist: bool = False) -> str:
    if supervisor == "systemd":
        # A persisted unit carries a start limit that counts the operator's starts too: a
        # few `up`s in a row would hit it. reset-failed resets the counter (systemctl(1)).
        return (f"systemctl reset-failed {ENGINE_UNIT} 2>/dev/null; " if persist else "") + \
            "systemctl start sparkctl-engine"
    return f"sh {shlex.quote(under(inv.node(node).prefix, DETACHED))} start"


def rotate_log_command(inv: Inventory, node: str) -> str:
    """A fresh log per start, so progress and failure reports show this run's lines."""
    log = shlex.quote(under(inv.node(node).prefix, ENGINE_LOG))
    return f"f={log}; [ -e \"$f\" ] && mv -f \"$f\" \"$f.1\"; true"


def tail_command(inv: Inventory, node: str, lines: int) -> str:
    return f"tail -n {int(lines)} {shlex.quote(under(inv.node(node).prefix, ENGINE_LOG))} 2>/dev/null || true"


def watch_command(inv: Inventory, node: str) -> str:
    """The ready wait's look at a rank, one round trip: "alive" or "dead", then the log's last line."""
    return f"{ALIVE_COMMAND}; {tail_command(inv, node, 1)}"


def meminfo_command(inv: Inventory, node: str) -> str:
    return f"cat {shlex.quote(inv.node(node).proc_root.rstrip('/') + '/meminfo')}"


def endpoint_url(inv: Inventory, node: str, port: int) -> str:
    return f"http://{inv.node(node).host}:{port}"


def head_listen(res: Resolved, rendering: Rendering, inv: Inventory) -> dict[str, str]:
    """serve.bind, per head: the address its engine listens on (the rendered --host)."""
    return {h.node: bind_host(res.for_node(h.node), h, inv.node(h.node).host) for h in rendering.layout.heads()}


def record_for(res: Resolved, rendering: Rendering, sets: Sequence[str], state: str, waivers: Mapping[str, str],
               started_at: str, note: str = "", listen: Mapping[str, str] | None = None,
               gateway: Mapping[str, Any] | None = None) -> RunRecord:
    """``listen``: per head, the address its engine listens on (:func:`head_listen`)."""
    p = res.profile
    nodes = {r.node: NodeRecord(rank=r.rank, replica=r.replica, hash=rendering.node_hash(r.node),
                                files={k: f.sha256 for k, f in rendering.files[r.node].items()},
                                supervisor=res.for_node(r.node).supervisor) for r in rendering.layout.ranks}
    return RunRecord(profile=res.name, sets=tuple(sets), digest=res.digest(), engine=p.engine.name,
                     engine_version=p.engine.version, served_name=p.model.served_name, port=p.serve.port,
                     heads=tuple(h.node for h in rendering.layout.heads()), nodes=nodes, state=state,
                     started_at=started_at, updated_at=started_at, clock_cap_mhz=p.laws.clock_cap_mhz,
                     waivers=dict(waivers), note=note, api_key_env=p.serve.api_key_env, listen=dict(listen or {}),
                     stack=stack_of(res), model=model_identity(res), shared_name=p.topology.shared_name,
                     gateway=dict(gateway or {}))


# --------------------------------------------------------------------------- steps


def _fan(inv: Inventory, cmds: Mapping[str, object]) -> dict[str, bool]:
    return {n: inv.node(n).sudo for n in cmds}


def record_step(inv: Inventory, sid: str, phase: str, head: str, rec: RunRecord, summary: str, *,
                 on_fail: str = "abort", note_from_failure: bool = False, state_if_left: str | None = None,
                 note_if_interrupted: str | None = None) -> Step:
    """Write ``rec`` on the head (atomically, with the inventory's sudo there) at its stack's record path;
    when that write fails and the record claims nothing serves, ``rm -f`` it: no record also says nothing serves."""
    path = under(inv.node(head).prefix, record_path(rec.stack))
    params: dict[str, object] = {"record": rec.to_dict(), "path": path}
    if rec.state not in ("serving", "degraded"):  # a degraded stack still serves: its record stays
        params["remove_on_failure"] = {head: f"rm -f {shlex.quote(path)}"}
    if note_from_failure:
        params["note_from_failure"] = True
    if state_if_left:
        params["state_if_left"] = state_if_left
    if note_if_interrupted:  # a Ctrl-C's branch keeps this record's state, with this note
        params["note_if_interrupted"] = note_if_interrupted
    gw = str((rec.gateway or {}).get("node") or "")
    changes = f"the run record on {head}: {rec.state}"
    if gw and gw != head and gw in inv.names:
        # the gateway's unit rebuilds its backends from the records on its own node (gateway_ctl rebuild):
        # a copy of this one goes there in the same step, after the state node's (docs/gateway.md)
        params["mirror"] = {"node": gw, "path": under(inv.node(gw).prefix, gateway_record_path(rec.stack)),
                            "sudo": inv.node(gw).sudo}
        changes += f", and its copy on the gateway's node {gw}"
    return Step(sid, phase, "record", (head,), summary, changes=changes,
                sudo={head: inv.node(head).sudo}, params=params, on_fail=on_fail)


def verdicts_target(inv: Inventory, stack: str = DEFAULT_STACK) -> dict[str, Any]:
    """Where a check step keeps the laws' verdicts: on the state node beside the stack's record
    (:func:`sparkctl.model.paths.laws_path`), with its sudo (a write the step lists)."""
    head = inv.nodes[0].name
    return {"node": head, "path": under(inv.node(head).prefix, laws_path(stack)), "sudo": inv.node(head).sudo,
            "stack": stack}


def _stop_step(inv: Inventory, sid: str, phase: str, nodes: Sequence[str], ports: Sequence[int], timeout_s: int,
               summary: str, on_fail: str) -> Step:
    cmds = {n: stop_command(inv, n, ports, timeout_s) for n in nodes}
    return Step(sid, phase, "stop", tuple(nodes), summary, changes="sparkctl engines stopped",
                commands=cmds, sudo=_fan(inv, cmds), timeout_s=timeout_s + 15, on_fail=on_fail)


def _bring_up(res: Resolved, inv: Inventory, rendering: Rendering, restart: Sequence[str], prefix: str,
              on_fail: str, only_heads: Sequence[str] | None = None) -> list[Step]:
    """push, fresh logs, daemon-reload, start group by group, ready: the steps that make a stack serve.

    ``only_heads``: the ready step waits for these heads alone and watches only ``restart``
    (a rolling switch brings up one replica while the others serve)."""
    p = res.profile
    lay = rendering.layout
    steps: list[Step] = []
    files = {n: tuple(FileRef(f.path, f.mode, f.sha256) for f in sorted(rendering.files[n].values(),
                                                                       key=lambda f: f.path)) for n in restart}
    count = sum(len(v) for v in files.values())
    steps.append(Step(f"{prefix}push", "push", "put", tuple(restart),
                      f"write {count} files atomically (temp name, then rename)",
                      changes=f"{res.name}'s rendered files", files=files, sudo=_fan(inv, files),
                      on_fail=on_fail))
    logs = {n: rotate_log_command(inv, n) for n in restart}
    steps.append(Step(f"{prefix}logs", "push", "run", tuple(restart), "keep the last engine log as engine.log.1",
                      changes="engine.log moved aside", commands=logs, sudo=_fan(inv, logs), on_fail="continue"))
    systemd = [n for n in restart if res.for_node(n).supervisor == "systemd"]
    if systemd:
        cmds = {n: "systemctl daemon-reload" for n in systemd}
        steps.append(Step(f"{prefix}reload", "reload", "run", tuple(systemd), "systemctl daemon-reload",
                          changes="systemd reads the new unit", commands=cmds, sudo=_fan(inv, cmds), on_fail=on_fail))
    for i, group in enumerate(lay.start_sequence(), 1):
        group = tuple(r for r in group if r.node in restart)
        if not group:
            continue
        cmds = {r.node: start_command(inv, r.node, res.for_node(r.node).supervisor,
                                      res.for_node(r.node).serve.persist) for r in group}
        who = ", ".join(f"{r.node} (rank {r.rank}{' head' if r.is_head else ''})" for r in group)
        steps.append(Step(f"{prefix}start-{i}", "start", "run", tuple(cmds), f"start {who}",
                          changes=f"{res.name} ranks running", commands=cmds, sudo=_fan(inv, cmds), on_fail=on_fail))
    # Only what the engine serves with the rendered flags (its contract, sparkctl.plan.contracts): None
    # waits without /metrics (the served name and a usage-carrying 1-token completion). Engines without
    # a contract keep the table (readiness_metric falls back to TOKENS_METRIC).
    head = lay.heads()[0].node
    metric = p.serve.tokens_metric or contracts.readiness_metric(p.engine.name, p.engine.version,
                                                                 rendering.argv.get(head, ()))
    heads = [h.node for h in lay.heads() if only_heads is None or h.node in only_heads]
    watched = list(lay.nodes) if only_heads is None else [n for n in lay.nodes if n in restart]
    listen = head_listen(res, rendering, inv)
    routes = {h: operator_route(h, inv.node(h).host, listen.get(h), p.serve.port) for h in heads}
    steps.append(Step(
        f"{prefix}ready", "ready", "ready", tuple(heads),
        f"wait up to {p.serve.ready_timeout_s} s: /v1/models lists {p.model.served_name!r}"
        + (f", a 1-token completion, {metric} advances" if p.serve.smoke_request else ""),
        # serve.bind: the address each head's engine listens on; "via" names the head whose SSH
        # connection the operator's probe goes through when only the head reaches that address
        # (its fabric link). The supervised runner runs on the head and asks the address itself.
        params={"profile": res.name, "endpoints": {h: r.url for h, r in routes.items()},
                **({"via": {h: r.via for h, r in routes.items() if r.via}} if any(r.via for r in routes.values())
                   else {}),
                "served_name": p.model.served_name, "metric": metric if p.serve.smoke_request else None,
                "smoke": bool(p.serve.smoke_request), "deadline_s": float(p.serve.ready_timeout_s),
                "watch": {n: watch_command(inv, n) for n in watched},
                "tail_on_failure": {n: tail_command(inv, n, 15) for n in watched},
                # serve.api_key_env: where the probe finds the key (the operator's variable; on the
                # head, the 0600 env file), never the key itself: plans are printed
                **({"api_key": {"env": p.serve.api_key_env, "var": API_KEY_VAR,
                                "file": under(inv.node(head).prefix, ENV_FILE)}} if p.serve.api_key_env else {})},
        on_fail=on_fail))
    return steps


def _persist_step(res: Resolved, inv: Inventory, nodes: Sequence[str], prefix: str, on_fail: str) -> list[Step]:
    """serve.persist: enable the engine unit (and the clock-cap unit) on every systemd rank.

    After the stack serves, so a start that failed enables nothing. At boot
    systemd starts the units in After= order on each node (the clock cap before
    the engine); across nodes nothing orders them, and nothing needs to: the
    head waits at its rendezvous for the ranks that come later and a worker
    retries its connect until the head listens (torch.distributed's TCPStore:
    the client retries until its timeout, torch/csrc/distributed/c10d/socket.cpp;
    the simulated engines do the same, sparkctl_sim/engines/rendezvous.py).
    A rank that keeps failing stops after serve.restart_burst starts (the unit's
    start limit) and ``status`` reports it.
    """
    cmds: dict[str, str] = {}
    for n in nodes:
        p = res.for_node(n)
        if p.serve.persist and p.supervisor == "systemd":
            units = [ENGINE_UNIT] + ([CLOCK_CAP_UNIT] if p.laws.clock_cap_mhz is not None else [])
            cmds[n] = "systemctl enable " + " ".join(units)
    # A node not persisted this time must not come back at boot with an earlier run's enable:
    # the engine unit is disabled there (guarded: a no-op where it was never enabled).
    off = {n: disable_command(inv, n) for n in nodes if n not in cmds and res.for_node(n).supervisor == "systemd"}
    steps = [] if not off else [
        Step(f"{prefix}unpersist", "persist", "run", tuple(off), "disable the engine unit where serve.persist is "
             "off: nothing comes back at boot that this run did not ask for", changes="engine unit disabled",
             commands=off, sudo=_fan(inv, off), on_fail="continue")]
    if not cmds:
        return steps
    return steps + [Step(f"{prefix}persist", "persist", "run", tuple(cmds),
                 "enable the engine unit" + (" and the clock-cap unit" if res.profile.laws.clock_cap_mhz is not None
                                             else "") + " so the stack comes back after a reboot (serve.persist)",
                 changes="units enabled in multi-user.target", commands=cmds, sudo=_fan(inv, cmds),
                 on_fail=on_fail)]


def disable_command(inv: Inventory, node: str) -> str:
    """Nothing sparkctl stopped comes back at boot (a no-op where the unit was never enabled)."""
    unit = shlex.quote(under(inv.node(node).prefix, UNIT))
    return (f"if [ -e {unit} ] && command -v systemctl >/dev/null 2>&1; then "
            f"systemctl disable {ENGINE_UNIT} >/dev/null 2>&1 || true; fi; true")


def _disable_step(inv: Inventory, sid: str, phase: str, nodes: Sequence[str]) -> Step:
    cmds = {n: disable_command(inv, n) for n in nodes}
    return Step(sid, phase, "run", tuple(nodes), "disable the engine unit: nothing stopped here comes back at boot",
                changes="engine unit disabled", commands=cmds, sudo=_fan(inv, cmds), on_fail="continue")


def _page_cache_step(res: Resolved, inv: Inventory, nodes: Sequence[str]) -> list[Step]:
    """The page_cache law's remedy, where MemFree is short when the step runs.

    On every node that starts a rank, after the stale stack is stopped (the facts
    read by ``check`` came before that, so they cannot say which nodes will be
    short): the command reads /proc/meminfo there and then and drops the caches
    only when MemFree < utilization x MemTotal (sparkctl.plan.laws.memory). A
    node with enough free memory keeps its cache. ``continue`` on failure: the
    engine's own refusal then names the shortfall.
    """
    p = res.profile
    if p.engine.name not in FRACTION_ENGINES or not nodes:
        return []
    util = p.laws.gpu_memory_utilization
    cmds = {n: drop_caches_if_short_command(util, inv.node(n).proc_root) for n in nodes}
    return [Step("drop-caches", "page-cache", "run", tuple(nodes),
                 f"drop the page cache where MemFree < {util:g} x MemTotal (law page_cache)",
                 changes="page cache, dentries and inodes dropped on the nodes that were short",
                 commands=cmds, sudo=_fan(inv, cmds), on_fail="continue")]


def _watchdog_step(res: Resolved, inv: Inventory, nodes: Sequence[str], on_fail: str) -> list[Step]:
    """Law memory_watchdog: earlyoom with this profile's limits on every node that starts a rank.

    Writes /etc/default/earlyoom only when its text differs, then (re)starts earlyoom when
    the file changed or it does not run: an engine never starts unguarded. The package
    itself is `fabric apply`'s (the check before this refuses a node without it)."""
    if not nodes:
        return []
    cmds = {n: watchdog.configure_command(res.for_node(n).laws, inv.node(n).prefix) for n in nodes}
    return [Step("watchdog", "watchdog", "run", tuple(nodes),
                 "earlyoom with this profile's limits (laws.min_free_gib), enabled and running (law memory_watchdog)",
                 changes=f"{paths.EARLYOOM_DEFAULT} where it differed, earlyoom restarted there",
                 commands=cmds, sudo=_fan(inv, cmds), on_fail=on_fail)]


def own_nodes(rendering: Rendering, prev: RunRecord | None) -> list[str]:
    """The nodes an ``up`` or ``switch`` of a stack may change, and so locks: the new layout's,
    and those its own stack ran on before while it may still run there. Never another
    stack's (``refusal`` keeps the two apart), never a node no stack claims."""
    nodes = list(rendering.layout.nodes)
    if prev is not None and prev.live:
        nodes += [n for n in prev.nodes if n not in nodes]
    return nodes


def refuse_conflicts(res: Resolved, rendering: Rendering, others: Sequence[RunRecord]) -> None:
    """Raise StackConflict when another live stack holds this profile's nodes or its served name."""
    p = res.profile
    why = refusal(stack_of(res), rendering.layout.nodes, p.model.served_name, model_identity(res),
                  p.topology.shared_name, others, ref=profile_ref(res, "topology.nodes"))
    if why is not None:
        raise why


def _changed(res: Resolved, rendering: Rendering, facts: UpFacts) -> list[str]:
    lay = rendering.layout
    prev = facts.record
    if not (prev and prev.profile == res.name and prev.state == "serving" and set(prev.nodes) == set(lay.nodes)):
        return list(lay.nodes)
    healthy = facts.healthy and all(facts.alive.get(n, False) for n in lay.nodes)
    if not healthy:
        return list(lay.nodes)
    return [n for n in lay.nodes if prev.nodes[n].hash != rendering.node_hash(n)]


def plan_up(res: Resolved, inv: Inventory, rendering: Rendering, facts: UpFacts, *, sets: Sequence[str] = (),
            waivers: Mapping[str, str] | None = None, started_at: str = "", skip_check: bool = False,
            op: str = "up", failure_branch: str = "stop",
            gateway: tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts] | None = None,
            probes: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {})) -> Plan:
    """``gateway``: serve.gateway's setup and what was read on its node (None: no gateway).
    ``probes``: the check's scripts (node -> the batched probe script, node -> the fabric probe
    script; ``sparkctl.ops.check`` builds them): the check step lists them and runs only them."""
    p = res.profile
    lay = rendering.layout
    waivers = dict(waivers or {})
    prev = facts.record
    head = inv.nodes[0].name
    reads = (f"the run records on {head}", "which engines run on " + ", ".join(lay.nodes),
             "whether " + ", ".join(h.node for h in lay.heads()) + f" serve {p.model.served_name!r}")
    refuse_conflicts(res, rendering, facts.others)
    changed = _changed(res, rendering, facts)
    if not changed and gateway:
        gw_plan = _gateway_only(res, inv, rendering, facts, gateway, started_at, op, reads)
        if gw_plan:
            return gw_plan
    if not changed:
        return Plan(op, res.name, (), reads=reads,
                    note=f"{res.name} already serving with the same files on every node")
    # A rank cannot rejoin its communicator: restart whole replicas that changed.
    replicas = {lay.rank_of(n).replica for n in changed}
    restart = [r.node for r in lay.ranks if r.replica in replicas]
    whole = restart == list(lay.nodes)
    # Every node of this stack, old and new, unless only some replicas restart: never another stack's.
    stale = own_nodes(rendering, prev) if not prev or prev.profile != res.name or whole else restart
    ports = sorted({p.serve.port, p.serve.master_port} | ({prev.port} if prev else set()))

    steps: list[Step] = []
    if not skip_check:
        laws_at = laws_path(stack_of(res))
        steps.append(Step("check", "check", "check", lay.nodes, "probe every node in parallel and judge the laws "
                          f"(a failure stops here); keep the verdicts in {laws_at} on the head",
                          changes=f"the laws' verdicts in {laws_at} on {inv.nodes[0].name}",
                          commands=dict(probes[0]), sudo={n: False for n in probes[0]},
                          params={"profile": res.name, "sets": list(sets), "waivers": waivers,
                                  "ignore": ["served_model", "clock_cap", "page_cache"],
                                  "verdicts": verdicts_target(inv, stack_of(res)),
                                  **({"fabric_probe": dict(probes[1])} if probes[1] else {})}))
    if p.laws.clock_cap_mhz is not None:
        cmds = {n: " && ".join(clocklock.lock_commands(p.laws.clock_cap_mhz, inv.node(n).prefix,
                                                        inv.node(n).proc_root)) for n in lay.nodes}
        steps.append(Step("clock", "clock", "run", lay.nodes, f"lock the GPU clock at {p.laws.clock_cap_mhz} MHz and "
                          "record it for this boot", changes="GPU clock lock", commands=cmds, sudo=_fan(inv, cmds)))
    gw_entry = gatewayplan.record_entry(res, inv, rendering, gateway[0]) if gateway else {}
    starting = record_for(res, rendering, sets, "starting", waivers, started_at,
                          f"replacing {prev.profile}" if prev and prev.profile != res.name else "",
                          listen=head_listen(res, rendering, inv), gateway=gw_entry)
    # The record changes before the cluster does: if the head cannot take it (a full
    # disk), nothing has been touched yet and the previous record still tells the truth.
    steps.append(record_step(inv, "record-start", "record-start", head, starting, "record that this run starts"))
    # serve.gateway: what stops is drained first (removed from the gateway, then idle at the engine).
    if prev and prev.gateway:
        partial = bool(prev) and prev.profile == res.name and not whole  # only some replicas restart
        old_heads = [h for h in prev.heads if h in restart] if partial else None
        steps.extend(gatewayplan.drain_step(prev.gateway, inv, "gateway-drain", "stop-stale", heads=old_heads))
    steps.append(_stop_step(inv, "stop-stale", "stop-stale", stale, ports, p.serve.stop_timeout_s,
                            "stop every sparkctl engine still running (a new rank must never join an old head's "
                            "rendezvous)", failure_branch))
    steps.extend(_page_cache_step(res, inv, restart))
    steps.extend(_watchdog_step(res, inv, restart, failure_branch))
    steps.extend(_bring_up(res, inv, rendering, restart, "", failure_branch))
    if gateway:  # registered only after the ready step: a replica still loading gets no request
        steps.extend(gatewayplan.ensure_steps(gateway[0], gateway[1], inv, p.serve.persist, failure_branch))
        steps.extend(gatewayplan.register_step(gw_entry, inv, "gateway-register", "gateway", failure_branch))
    steps.extend(_persist_step(res, inv, restart, "", failure_branch))
    serving = replace(starting, state="serving", note="")
    steps.append(record_step(inv, "record", "record", head, serving, f"record {res.name} serving",
                              on_fail=failure_branch))
    failed = replace(starting, state="failed")
    stop_nodes = list(dict.fromkeys([*lay.nodes, *stale]))
    persisted = [n for n in stop_nodes if n in lay.nodes and res.for_node(n).serve.persist]
    stop_branch = (
        *gatewayplan.drain_step(gw_entry, inv, "gateway-deregister", "rollback", wait=False),
        *([_disable_step(inv, "disable-started", "rollback", persisted)] if persisted else []),
        _stop_step(inv, "stop-started", "rollback", stop_nodes, ports, p.serve.stop_timeout_s,
                   "stop what this run started", "continue"),
        record_step(inv, "record-failed", "rollback", head, failed, "record that nothing serves",
                     on_fail="continue", note_from_failure=True),
    )
    return Plan(op, res.name, tuple(steps), {"stop": stop_branch}, reads=reads,
                note="" if whole else f"restart only {', '.join(restart)} (files changed on {', '.join(changed)})")


def _gateway_only(res: Resolved, inv: Inventory, rendering: Rendering, facts: UpFacts,
                  gateway: tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts], started_at: str, op: str,
                  reads: tuple[str, ...]) -> Plan | None:
    """The stack serves with the same files, but the gateway is missing, stopped or changed: only the gateway."""
    setup, gfacts = gateway
    prev = facts.record
    assert prev is not None
    entry = gatewayplan.record_entry(res, inv, rendering, setup)
    ensure = gatewayplan.ensure_steps(setup, gfacts, inv, res.profile.serve.persist, "abort")
    if prev.gateway == entry and [s.id for s in ensure] == ["gateway-push", "gateway-start"] \
            and "no-op" in ensure[-1].summary:
        return None
    head = inv.nodes[0].name
    rec = replace(prev, gateway=entry, updated_at=started_at)
    steps = [*ensure, *gatewayplan.register_step(entry, inv, "gateway-register", "gateway", "abort"),
             record_step(inv, "record", "record", head, rec, f"record {res.name}'s gateway")]
    return Plan(op, res.name, tuple(steps), reads=(*reads, f"the gateway on {setup.node}"),
                note=f"{res.name} already serving with the same files: only the gateway")


def plan_down(inv: Inventory, records: RunRecord | Sequence[RunRecord] | None, *, nodes: Sequence[str] | None = None,
              reset_clocks: bool = False, started_at: str = "", timeout_s: int = 30) -> Plan:
    """Stop ``nodes`` (every node when None: ``down`` of everything) and record each of
    ``records`` stopped. ``down --stack S`` passes S's record and S's nodes only: the
    other stacks keep serving."""
    head = inv.nodes[0].name
    recs = [records] if isinstance(records, RunRecord) else list(records or ())
    scope = list(inv.names) if nodes is None else [n for n in inv.names if n in set(nodes)]
    ports = sorted({r.port for r in recs})
    # reverse start order: heads last started with workers-first, so stop heads first
    order: list[str] = []
    for r in recs:
        for n in (*r.heads, *r.nodes):
            if n in scope and n not in order:
                order.append(n)
    nodes = order + [n for n in scope if n not in order]

    def sid(base: str, r: RunRecord) -> str:
        return base if r.stack == DEFAULT_STACK else f"{base}-{r.stack}"

    steps: list[Step] = []
    for r in recs:
        if r.state not in ("stopped", "failed"):
            # Before anything stops: an interrupted or half-done down never leaves "serving" behind.
            steps.append(record_step(inv, sid("record-stopping", r), "stop", head,
                                     r.with_state("stopping", started_at, "down in progress"),
                                     f"record that {_stack_words(r)} is stopping", on_fail="continue"))
    for r in recs:
        if r.gateway and r.state not in ("stopped", "failed"):
            # serve.gateway: removed from the gateway and idle at the engine before it stops
            steps.extend(gatewayplan.drain_step(r.gateway, inv, sid("gateway-drain", r), "stop"))
    # Disabled before the stop: a reboot in between must not bring the stack back.
    steps.append(_disable_step(inv, "disable", "stop", nodes))
    steps.append(_stop_step(inv, "stop", "stop", nodes, ports, timeout_s, "stop every sparkctl engine and verify: "
                            "no engine process, ports closed", "continue"))
    for r in recs:
        if r.state != "stopped":
            steps.append(record_step(inv, sid("record", r), "record", head,
                                     r.with_state("stopped", started_at, "down"),
                                     f"record that nothing runs{_stack_suffix(r)}", on_fail="continue",
                                     state_if_left="failed"))
    cmds = {n: meminfo_command(inv, n) for n in nodes}
    steps.append(Step("leaks", "verify", "leaks", tuple(nodes), "read /proc/meminfo: memory not given back with no "
                      "engine (the leak law)", commands=cmds, on_fail="continue"))
    if reset_clocks:
        rc = {n: clocklock.reset_command(inv.node(n).prefix) for n in nodes}
        steps.append(Step("reset-clocks", "verify", "run", tuple(nodes), "nvidia-smi -rgc and forget the clock lock",
                          changes="GPU clocks unlocked", commands=rc, sudo=_fan(inv, rc), on_fail="continue"))
    return Plan("down", ", ".join(r.profile for r in recs) or None, tuple(steps),
                reads=(f"the run record{'s' if len(recs) != 1 else ''} on {head}",))


def _stack_words(r: RunRecord) -> str:
    return "the stack" if r.stack == DEFAULT_STACK else f"stack {r.stack}"


def _stack_suffix(r: RunRecord) -> str:
    return "" if r.stack == DEFAULT_STACK else f" in stack {r.stack}"
