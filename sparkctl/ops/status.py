"""``sparkctl status``: what runs, measured against the record. Read-only."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from sparkctl.errors import SparkctlError
from sparkctl.facts import probes
from sparkctl.facts.statusrow import node_row, rank_drift
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import ENV_FILE
from sparkctl.model.record import LOCK_DIR, RunRecord
from sparkctl.ops.lock import read_record, read_verdicts
from sparkctl.ops.readiness import (
    OperatorKey,
    Route,
    on_node_host,
    operator_key,
    operator_route,
)
from sparkctl.ops.supervise import supervisor_progress
from sparkctl.plan.render import API_KEY_VAR, TOKENS_METRIC, under
from sparkctl.remote.endpoint_probe import auth_headers, mask, metric_value
from sparkctl.transport.forward import forward
from sparkctl.transport.ssh import Transport


def _on_node_endpoint(inv: Inventory, rec: RunRecord, head: str) -> dict[str, Any]:
    """What the head's ``models`` fact asks: the address its engine listens on (serve.bind), and
    the head's 0600 env file when the endpoint wants a key (the fact reads the key there)."""
    return {"endpoint_port": rec.port, "endpoint_host": on_node_host(rec.listen.get(head)),
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


def cluster_status(inv: Inventory, transport: Transport) -> dict[str, Any]:
    # The supervisor's events first: it writes its final record before its final
    # event, so a final phase seen here implies the record read next is final too.
    supervisor = supervisor_progress(inv, transport)
    rec: RunRecord | None = read_record(inv, transport)
    nodes = list(inv.names)
    heads = set(rec.heads) if rec else set()
    scripts = {n: probes.remote_command(probes.build_script(
        inv.node(n), **(_on_node_endpoint(inv, rec, n) if (rec and n in heads) else {}))) for n in nodes}
    results = transport.run_all(scripts)
    hashes: dict[str, dict[str, str]] = {}
    if rec:
        cmds = {n: "sha256sum " + " ".join(shlex.quote(f) for f in r.files) + " 2>/dev/null; true"
                for n, r in rec.nodes.items() if r.files}
        for n, r in transport.run_all(cmds).items():
            hashes[n] = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines() if len(line.split()) == 2}
    out_nodes = []
    drift: list[str] = []
    for n in nodes:
        r = results[n]
        nr = rec.nodes.get(n) if rec else None
        row: dict[str, Any] = {"node": n, "reachable": r.ok, "error": r.error}
        if r.ok:
            f = probes.parse_batch(n, r.stdout)
            row.update(node_row(f))
            if nr:
                row.update({"rank": nr.rank, "replica": nr.replica, "engine": rec.engine if rec else None})
                u = f.engine_unit
                drift += rank_drift(n, nr.rank, row, rec.state if rec else "", rec.clock_cap_mhz if rec else None,
                                    u.result if u else None, u.n_restarts if u else 0)
                for path, sha in nr.files.items():
                    got = hashes.get(n, {}).get(path)
                    if got != sha:
                        drift.append(f"{n}: {path} {'missing' if got is None else 'changed by hand'}")
        elif nr:
            drift.append(f"{n}: unreachable ({r.error})")
        out_nodes.append(row)
    endpoint: dict[str, Any] = {}
    if rec:
        key = operator_key(rec.api_key_env)
        for h in rec.heads:
            route = operator_route(h, inv.node(h).host, rec.listen.get(h), rec.port)
            endpoint[h] = endpoint_status(transport, route, rec.served_name, TOKENS_METRIC.get(rec.engine), key)
            if rec.state == "serving" and not endpoint[h].get("serves_record"):
                drift.append(f"{h}: endpoint {endpoint[h]['error']}" if endpoint[h]["state"] == "needs key"
                             else f"{h}: endpoint does not serve {rec.served_name}")
    # A supervised switch: its last events, and whether it still runs (only when
    # one is under way or has left its events behind).
    if rec and rec.state == "switching" and supervisor and not supervisor["alive"] \
            and supervisor["phase"] not in ("done", "rolled-back", "failed"):
        drift.append(f"{supervisor['head']}: the switch supervisor (pid {supervisor['pid']}) is gone before it finished")
    # "starting" or "stopping" with nobody holding the lock: that run was killed before
    # it could record its outcome (a full disk on the head, SIGKILL, a lost laptop).
    if rec and rec.state in ("starting", "stopping"):
        head = inv.nodes[0].name
        lock = shlex.quote(under(inv.node(head).prefix, LOCK_DIR))
        r = transport.run(head, f"test -d {lock} && echo held || echo free")
        if r.ok and r.stdout.strip() == "free":
            drift.append(f"{head}: the record says {rec.state} but no sparkctl holds the lock: that run ended "
                         "without recording its outcome; `sparkctl up` or `sparkctl down` settles it")
    return {"record": rec.to_dict() if rec else None, "nodes": out_nodes, "endpoint": endpoint, "drift": drift,
            "supervisor": supervisor, "laws": read_verdicts(inv, transport)}
