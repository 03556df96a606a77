"""``sparkctl status``: what runs, measured against the record. Read-only."""

from __future__ import annotations

import shlex
from typing import Any

import httpx

from sparkctl.facts import probes
from sparkctl.model.inventory import Inventory
from sparkctl.model.record import LOCK_DIR, RunRecord
from sparkctl.ops.readiness import metric_value
from sparkctl.ops.lock import read_record
from sparkctl.ops.supervise import supervisor_progress
from sparkctl.plan.render import TOKENS_METRIC, under
from sparkctl.transport.ssh import Transport


def cluster_status(inv: Inventory, transport: Transport) -> dict[str, Any]:
    # The supervisor's events first: it writes its final record before its final
    # event, so a final phase seen here implies the record read next is final too.
    supervisor = supervisor_progress(inv, transport)
    rec: RunRecord | None = read_record(inv, transport)
    nodes = list(inv.names)
    heads = set(rec.heads) if rec else set()
    scripts = {n: probes.remote_command(probes.build_script(inv.node(n), endpoint_port=rec.port if (rec and n in heads) else None))
               for n in nodes}
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
            gpu = f.gpu
            row.update({
                "engine_procs": len(f.engines or []),
                "alive": bool(f.engines),
                "sm_mhz": gpu.sm_mhz if gpu else None,
                "power_w": gpu.power_w if gpu else None,
                "temp_c": gpu.temp_c if gpu else None,
                "mem_available_gib": round(f.mem_available_kib / 1024 / 1024, 1) if f.mem_available_kib else None,
                "clock_lock": (f.clock_lock_record[1] if f.clock_lock_record and f.clock_lock_record[0] == f.boot_id
                               else None),
                "served_models": f.served_models,
                # what systemd did with the engine unit (the record cannot be updated by systemd)
                "unit": ({"enabled": f.engine_unit.unit_file_state, "active": f.engine_unit.active_state,
                          "result": f.engine_unit.result, "restarts": f.engine_unit.n_restarts}
                         if f.engine_unit else None),
            })
            if nr:
                row.update({"rank": nr.rank, "replica": nr.replica, "engine": rec.engine if rec else None})
                u = f.engine_unit
                if u and u.result == "start-limit-hit":
                    # systemd.unit(5): started StartLimitBurst= times within StartLimitIntervalSec=, so it stays down
                    drift.append(f"{n}: rank {nr.rank} stays down: its engine unit failed {u.n_restarts + 1} starts "
                                 "and hit its start limit (Result=start-limit-hit; journalctl -u sparkctl-engine, "
                                 "engine.log); fix it, then `sparkctl up`")
                elif rec and rec.state == "serving" and not f.engines:
                    drift.append(f"{n}: rank {nr.rank} is not running")
                if rec and rec.clock_cap_mhz and row["clock_lock"] != rec.clock_cap_mhz:
                    drift.append(f"{n}: clock lock {row['clock_lock'] or 'lost'} (record: 0,{rec.clock_cap_mhz} MHz)")
                for path, sha in nr.files.items():
                    got = hashes.get(n, {}).get(path)
                    if got != sha:
                        drift.append(f"{n}: {path} {'missing' if got is None else 'changed by hand'}")
        elif nr:
            drift.append(f"{n}: unreachable ({r.error})")
        out_nodes.append(row)
    endpoint: dict[str, Any] = {}
    if rec:
        for h in rec.heads:
            url = f"http://{inv.node(h).host}:{rec.port}"
            metric = TOKENS_METRIC.get(rec.engine)
            try:
                with httpx.Client(timeout=3, trust_env=False) as c:
                    models = [m.get("id") for m in c.get(f"{url}/v1/models").json().get("data", [])]
                    tokens = metric_value(c.get(f"{url}/metrics").text, metric) if metric else None
                endpoint[h] = {"url": url, "models": models, "serves_record": rec.served_name in models,
                               "tokens_generated": tokens}
            except (httpx.HTTPError, ValueError) as exc:
                endpoint[h] = {"url": url, "error": f"{type(exc).__name__}"}
            if rec.state == "serving" and not endpoint[h].get("serves_record"):
                drift.append(f"{h}: endpoint does not serve {rec.served_name}")
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
            "supervisor": supervisor}
