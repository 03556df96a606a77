"""The gateway seen and stopped from the operator's side: ``status``'s view of it, ``gateway down``.

Which gateway: the records say (each stack's ``gateway`` entry: its node, URL, port).
:func:`gateway_status` asks each gateway's node once, in ONE round trip (its unit's state and
smg's ``GET /workers`` through ``gateway_ctl.py list``, with the operator's key on stdin, never
on a command line), and measures what smg lists against the records: every backend of a stack
recorded serving must be listed ``ready`` serving its name. :func:`plan_gateway_down` is the
plan ``sparkctl gateway down`` runs (and ``sparkctl plan gateway-down`` prints): the lock of
every node, then the unit stopped and disabled; refused while a live stack routes through it,
unless ``force``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from sparkctl.errors import ConfigError, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import GATEWAY_CONFIG, GATEWAY_CTL, under
from sparkctl.model.record import RunRecord
from sparkctl.ops.readiness import operator_key
from sparkctl.plan import lockplan
from sparkctl.plan.gatewayplan import UNIT_NAME
from sparkctl.plan.steps import Plan, Step
from sparkctl.transport import Transport

_LISTED = "==> sparkctl-gateway-listed "


def gateways_of(records: Mapping[str, RunRecord]) -> dict[str, dict[str, Any]]:
    """gateway node -> its latest record entry, with the stacks whose records name it (live or not:
    ``down`` leaves the gateway running) and the live ones."""
    out: dict[str, dict[str, Any]] = {}
    for rec in sorted(records.values(), key=lambda r: r.updated_at):
        g = rec.gateway or {}
        node = g.get("node")
        if not node:
            continue
        prev = out.get(str(node), {})
        out[str(node)] = {**g, "stacks": [*prev.get("stacks", []), rec.stack],
                          "live": [*prev.get("live", []), *([rec.stack] if rec.live else [])],
                          "api_key_env": rec.api_key_env or prev.get("api_key_env")}
    return dict(sorted(out.items()))


def status_command(inv: Inventory, node: str) -> str:
    """The unit's state and smg's workers, in one round trip (the key, if any, on stdin)."""
    prefix = inv.node(node).prefix
    ctl, cfg = shlex.quote(under(prefix, GATEWAY_CTL)), shlex.quote(under(prefix, GATEWAY_CONFIG))
    return (f"echo \"active=$(systemctl is-active {UNIT_NAME} 2>/dev/null || true)\"; "
            f"if [ -e {ctl} ] && [ -e {cfg} ]; then out=$(python3 {ctl} list --config {cfg} --key-stdin 2>&1); "
            f"rc=$?; echo '{_LISTED}'\"$rc\"; printf '%s\\n' \"$out\"; else echo '{_LISTED}absent'; fi")


def parse_status(text: str) -> tuple[str, str | None, str]:
    """(the unit's state, the ctl's exit code or "absent" or None, what it printed)."""
    head, sep, rest = text.partition(_LISTED)
    active = next((ln.partition("=")[2].strip() for ln in head.splitlines() if ln.startswith("active=")), "")
    if not sep:
        return active, None, ""
    rc, _, body = rest.partition("\n")
    return active, rc.strip(), body.strip()


def one_gateway(inv: Inventory, transport: Transport, node: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One gateway: where, its port, up or not, its backends per model (as smg lists them)."""
    out: dict[str, Any] = {"node": node, "port": entry.get("port"), "metrics_port": entry.get("metrics_port"),
                           "url": entry.get("url"), "stacks": list(entry.get("stacks", [])),
                           "live_stacks": list(entry.get("live", [])), "active": False, "up": False,
                           "backends": {}}
    key = operator_key(entry.get("api_key_env"))
    if key.problem:
        out.update(state="needs key", error=key.problem)
    if node not in inv.names:
        return {**out, "state": "unknown", "error": f"{node} is not in the inventory"}
    r = transport.run(node, status_command(inv, node), stdin=(key.key or "") + "\n")
    if not r.ok and r.exit_code is None:
        return {**out, "state": "unreachable", "error": r.error or r.stderr.strip()}
    active, rc, body = parse_status(r.stdout)
    out["active"] = active == "active"
    if rc == "absent":
        return {**out, "state": "not installed", "unit": active}
    if rc != "0":
        if "state" in out:  # needs key: what the gateway said is that
            return out
        refused = "HTTP 401" in body
        return {**out, "state": "key refused" if refused else "down", "unit": active,
                "error": body.splitlines()[-1][:200] if body else f"exit {rc}"}
    try:
        workers = json.loads(body)
    except ValueError:
        return {**out, "state": "down", "unit": active, "error": "the gateway's worker list did not parse"}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for w in workers if isinstance(workers, list) else []:
        by_model.setdefault(str(w.get("model_id") or "?"), []).append(
            {"url": w.get("url"), "status": w.get("status"), "healthy": bool(w.get("is_healthy", True))})
    out.update(state="up", up=True, unit=active, backends=dict(sorted(by_model.items())))
    out.pop("error", None)
    return out


def gateway_status(inv: Inventory, transport: Transport, records: Mapping[str, RunRecord]
                   ) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Every gateway the records name, and each stack's drift from it (a backend of a stack recorded
    serving that the gateway does not list ready serving its name; the gateway down while one serves)."""
    gws = []
    drift: dict[str, list[str]] = {}
    for node, entry in gateways_of(records).items():
        g = one_gateway(inv, transport, node, entry)
        gws.append(g)
        listed = {(str(b["url"]).rstrip("/"), m) for m, bs in g["backends"].items() for b in bs
                  if b["status"] == "ready" and b["healthy"]}
        for rec in records.values():
            if rec.state != "serving" or (rec.gateway or {}).get("node") != node:
                continue
            if not g["up"]:
                if g["state"] != "needs key":
                    drift.setdefault(rec.stack, []).append(f"{node}: the gateway is {g['state']}"
                                                           + (f" ({g['error']})" if g.get("error") else ""))
                continue
            for b in rec.gateway.get("backends", []):
                if (str(b["url"]).rstrip("/"), str(b.get("model") or rec.served_name)) not in listed:
                    drift.setdefault(rec.stack, []).append(
                        f"{node}: the gateway does not route {b.get('model') or rec.served_name} to {b['url']}")
    return gws, drift


# --------------------------------------------------------------------------- gateway down


def choose_gateway(inv: Inventory, records: Mapping[str, RunRecord], node: str | None) -> str:
    gws = gateways_of(records)
    if node is not None:
        if node not in inv.names:
            raise ConfigError(f"--node {node}: not in the inventory", hint=f"one of {', '.join(inv.names)}")
        return node
    if len(gws) == 1:
        return next(iter(gws))
    if not gws:
        raise ConfigError("no record names a gateway on this cluster",
                          hint="--node NAME stops a gateway no record names")
    raise ConfigError(f"the records name gateways on {', '.join(gws)}", hint="--node NAME chooses one")


def stop_step(inv: Inventory, node: str) -> Step:
    cmd = (f"systemctl disable --now {UNIT_NAME} 2>/dev/null || systemctl stop {UNIT_NAME}; "
           f"! systemctl is-active --quiet {UNIT_NAME}")
    return Step("gateway-stop", "gateway", "run", (node,), f"stop and disable the gateway on {node} (its files and "
                "installed wheels stay: the next `up` of a profile with serve.gateway starts it again)",
                changes=f"{UNIT_NAME} stopped and disabled", commands={node: cmd},
                sudo={node: inv.node(node).sudo}, timeout_s=60)


def plan_gateway_down(inv: Inventory, records: Mapping[str, RunRecord], holder: Mapping[str, Any],
                      node: str | None = None, force: bool = False) -> Plan:
    """The lock of every node, then the gateway's unit stopped; refused while a live stack routes through it."""
    node = choose_gateway(inv, records, node)
    live = [r for r in records.values() if r.live and (r.gateway or {}).get("node") == node]
    if live and not force:
        names = ", ".join(f"{r.stack} ({r.served_name}, {r.state})" for r in live)
        downs = " and ".join(f"`sparkctl down{'' if r.stack == 'default' else ' --stack ' + r.stack}`" for r in live)
        raise ConfigError(f"the gateway on {node} still serves {names}", Ref(node=node),
                          hint=f"{downs} first; or --force (its clients then get refused connections)")
    note = f"forced: {', '.join(r.stack for r in live)} still recorded live behind it" if live else ""
    plan = Plan("gateway down", None, (stop_step(inv, node),), note=note)
    return lockplan.with_lock(plan, inv, holder)


def gateway_down(inv: Inventory, transport: Transport, *, node: str | None = None, force: bool = False,
                 progress: Any = None) -> dict[str, Any]:
    """Run :func:`plan_gateway_down`: the lock (its first step) before the records it is planned from."""
    from sparkctl.ops.executor import TransportBackend, plan_under_lock, run_plan, take_lock
    from sparkctl.ops.lock import read_records

    say = progress or (lambda *_: None)
    holder = take_lock(inv, transport, "gateway down", say)
    plan = plan_under_lock("gateway down", inv, transport, holder, say,
                           lambda: plan_gateway_down(inv, read_records(inv, transport), holder, node, force))
    state = run_plan(plan, TransportBackend(inv, transport, say), done=("lock",))
    if state.failed is not None:
        f = state.failure or {}
        from sparkctl.errors import LifecycleError

        raise LifecycleError(f"gateway down failed on {f.get('node')}: {f.get('detail')}", Ref(node=f.get("node")),
                             hint=f"journalctl -u {UNIT_NAME} on that node")
    stop = next(s for s in plan.steps if s.id == "gateway-stop")
    return {"node": stop.nodes[0], "forced": bool(plan.note), "note": plan.note, "steps": list(state.outcomes)}
