"""``sparkctl status``: what runs, measured against each stack's record. Read-only."""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.facts.batch import build_script, parse_batch, remote_command
from sparkctl.facts.statusrow import node_row, rank_drift
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import DEFAULT_STACK, ENV_FILE, under
from sparkctl.model.record import SERVING_STATES, Route, RunRecord, on_node_host, operator_route
from sparkctl.ops.gatewayops import gateway_status
from sparkctl.ops.lock import held_command, read_state
from sparkctl.ops.readiness import OperatorKey, operator_key
from sparkctl.ops.supervise import supervisor_progress
from sparkctl.plan.render import API_KEY_VAR, TOKENS_METRIC
from sparkctl.remote.endpoint_probe import auth_headers, mask, metric_value
from sparkctl.transport import Transport
from sparkctl.transport.forward import forward


def _on_node_endpoint(inv: Inventory, rec: RunRecord, head: str) -> dict[str, Any]:
    """What the head's ``models`` fact asks: the address its engine listens on (serve.bind), and
    the head's 0600 env file when the endpoint wants a key (the fact reads the key there)."""
    serves = rec.serves_on(head)
    return {"endpoint_port": serves.port if serves else rec.port, "endpoint_host": on_node_host(rec.listen.get(head)),
            "endpoint_key": (under(inv.node(head).prefix, ENV_FILE), API_KEY_VAR) if rec.api_key_env else None}


def endpoint_status(transport: Transport, route: Route, served_name: str, metric: str | None,
                    key: OperatorKey) -> dict[str, Any]:
    """One head's endpoint as the operator reaches it (:func:`operator_route`). ``state``:
    serving, not serving (answers, without the record's model), needs key (the operator's
    variable is unset: nothing is asked), key refused (HTTP 401 with the key), down."""
    out: dict[str, Any] = {"url": route.url, **({"via": route.via} if route.via else {})}
    if key.problem:
        return {**out, "state": "needs key", "error": key.problem}
    try:
        with forward(transport, route.via, route.host, route.port) if route.via else _direct(route) as (host, port):
            base = f"http://{host}:{port}"
            with httpx.Client(timeout=3, trust_env=False, headers=auth_headers(key.key)) as c:
                r = c.get(f"{base}/v1/models")
                if r.status_code == 401:
                    return {**out, "state": "key refused",
                            "error": f"HTTP 401 with the key from ${key.env}" if key.key
                            else "HTTP 401: the endpoint wants a key the record does not name"}
                models = [m.get("id") for m in r.json().get("data", [])]
                tokens = metric_value(c.get(f"{base}/metrics").text, metric) if metric else None
    except (httpx.HTTPError, ValueError, AttributeError, SparkctlError) as exc:
        text = exc.one_line() if isinstance(exc, SparkctlError) else type(exc).__name__
        return {**out, "state": "down", "error": mask(text, key.key)}
    return {**out, "state": "serving" if served_name in models else "not serving", "models": models,
            "serves_record": served_name in models, "tokens_generated": tokens}


@contextmanager
def _direct(route: Route) -> Iterator[tuple[str, int]]:
    yield route.host, route.port


def _claims(records: Mapping[str, RunRecord]) -> dict[str, RunRecord]:
    """node -> the record that speaks for it: the live stack running there, else the latest
    record that ran there (a stopped or failed stack still names its ranks)."""
    out: dict[str, RunRecord] = {}
    for r in sorted(records.values(), key=lambda r: (r.live, r.updated_at)):
        for n in (*r.heads, *r.nodes):
            out[n] = r  # live records sort last: they win
    return out


def main_record(records: Mapping[str, RunRecord], stack: str | None = None) -> RunRecord | None:
    """The one record a single-stack reader means: the asked stack's, the default stack's, or the only one."""
    if stack is not None:
        return records.get(stack)
    if DEFAULT_STACK in records:
        return records[DEFAULT_STACK]
    return next(iter(records.values())) if len(records) == 1 else None


def cluster_status(inv: Inventory, transport: Transport, stack: str | None = None) -> dict[str, Any]:
    """Every stack (or ``stack`` alone) measured against its record, and every node (or the stack's).

    ``record`` is the one record a single-stack reader means (:func:`main_record`);
    ``stacks`` has each stack's record, endpoint and drift; ``drift`` all of them.
    """
    # The supervisor's events first: it writes its final record before its final
    # event, so a final phase seen here implies the record read next is final too.
    supervisor = supervisor_progress(inv, transport)
    records, verdicts = read_state(inv, transport)  # one round trip: the records and their laws' verdicts
    if stack is not None:
        if stack not in records:
            raise ConfigError(f"--stack {stack}: no such stack on this cluster",
                              hint=f"stacks: {', '.join(records) or 'none'}")
        records = {stack: records[stack]}
    claims = _claims(records)
    nodes = list(inv.names) if stack is None else [n for n in inv.names if n in claims]
    scripts = {n: remote_command(build_script(
        inv.node(n), **(_on_node_endpoint(inv, claims[n], n) if (n in claims and n in claims[n].heads) else {})))
        for n in nodes}
    results = transport.run_all(scripts)
    hashes: dict[str, dict[str, str]] = {}
    files = {n: claims[n].nodes[n].files for n in nodes if n in claims and n in claims[n].nodes}
    cmds = {n: "sha256sum " + " ".join(shlex.quote(f) for f in fs) + " 2>/dev/null; true" for n, fs in files.items() if fs}
    for n, r in transport.run_all(cmds).items():
        hashes[n] = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines() if len(line.split()) == 2}
    out_nodes = []
    drifts: dict[str, list[str]] = {s: [] for s in records}
    outside: list[str] = []
    for n in nodes:
        r = results[n]
        rec = claims.get(n)
        nr = rec.nodes.get(n) if rec else None
        drift = drifts[rec.stack] if rec else outside
        row: dict[str, Any] = {"node": n, "reachable": r.ok, "error": r.error, "stack": rec.stack if rec else None}
        if r.ok:
            f = parse_batch(n, r.stdout)
            row.update(node_row(f))
            if rec and nr:
                row.update({"rank": nr.rank, "replica": nr.replica, "engine": rec.engine if rec else None})
                u = f.engine_unit
                # a degraded record: a node of a replica left serving is judged as serving (against its own
                # profile's clock cap); one in no replica was stopped on purpose
                serves = rec.serves_on(n)
                state = "serving" if rec.state == "degraded" and serves else rec.state
                drift += rank_drift(n, nr.rank, row, state, serves.clock_cap_mhz if serves else None,
                                    u.result if u else None, u.n_restarts if u else 0)
                for path, sha in nr.files.items():
                    got = hashes.get(n, {}).get(path)
                    if got != sha:
                        drift.append(f"{n}: {path} {'missing' if got is None else 'changed by hand'}")
            if f.engines and not (rec and rec.live) and stack is None and any(x.live for x in records.values()):
                # with several stacks, nothing else would name it: no live stack's stop reaches it
                outside.append(f"{n}: a sparkctl engine runs outside every live stack; `sparkctl down` stops it")
        elif nr:
            drift.append(f"{n}: unreachable ({r.error})")
        out_nodes.append(row)
    endpoints: dict[str, dict[str, Any]] = {s: {} for s in records}
    for rec in records.values():
        key = operator_key(rec.api_key_env)
        for h in rec.heads:
            serves = rec.serves_on(h)
            if h not in inv.names or serves is None:
                continue
            route = operator_route(h, inv.node(h).host, rec.listen.get(h), serves.port)
            e = endpoints[rec.stack][h] = endpoint_status(transport, route, serves.served_name,
                                                          TOKENS_METRIC.get(serves.engine), key)
            if rec.state in SERVING_STATES and not e.get("serves_record"):
                drifts[rec.stack].append(f"{h}: endpoint {e['error']}" if e["state"] == "needs key"
                                         else f"{h}: endpoint does not serve {serves.served_name}")
    # A supervised switch: its last events, and whether it still runs (only when
    # one is under way or has left its events behind).
    for rec in records.values():
        if rec.state == "switching" and supervisor and not supervisor["alive"] \
                and supervisor["phase"] not in ("done", "rolled-back", "failed"):
            drifts[rec.stack].append(f"{supervisor['head']}: the switch supervisor (pid {supervisor['pid']}) is "
                                     "gone before it finished")
        # "starting" or "stopping" with nobody holding its nodes' locks: that run was killed before
        # it could record its outcome (a full disk on the head, SIGKILL, a lost laptop).
        if rec.state in ("starting", "stopping"):
            head = inv.nodes[0].name
            r = transport.run(head, held_command(inv, list(rec.nodes)))
            if r.ok and r.stdout.strip() == "free":
                down = "`sparkctl down`" if rec.stack == DEFAULT_STACK else f"`sparkctl down --stack {rec.stack}`"
                drifts[rec.stack].append(f"{head}: the record says {rec.state} but no sparkctl holds the lock: that "
                                         f"run ended without recording its outcome; `sparkctl up` or {down} "
                                         "settles it")
    gateways, gw_drift = gateway_status(inv, transport, records)
    for s, lines in gw_drift.items():
        drifts[s] += lines
    main = main_record(records, stack)
    merged: dict[str, Any] = {}
    for e in endpoints.values():
        merged.update(e)
    stacks = [{"stack": s, "record": rec.to_dict(), "live": rec.live, "endpoint": endpoints[s], "drift": drifts[s],
               "laws": verdicts.get(s)} for s, rec in records.items()]
    # "laws": the verdicts of the one stack a single-stack reader means (the default's before any record)
    laws = verdicts.get(main.stack if main else (stack or DEFAULT_STACK))
    return {"record": main.to_dict() if main else None, "stacks": stacks, "nodes": out_nodes, "endpoint": merged,
            "drift": [d for s in records for d in drifts[s]] + outside, "supervisor": supervisor,
            "laws": laws, "gateways": gateways}
