"""One node's row of ``sparkctl status``, from its facts: the one definition of those fields. Pure.

``sparkctl status`` (on the operator's machine, over SSH) and the head's status page
(``sparkctl.node.statuspage``, from each node's exporter) both build a node's row here,
so the page shows the same field names and values ``status --json`` does; and the part of
the drift that a node's own facts decide (a rank not running, earlyoom not active, the
clock lock lost). What it must not do: run anything, read a clock, import pydantic (it is
imported on the nodes, from sparkctl's zip).
"""

from __future__ import annotations

from typing import Any

from sparkctl.facts.nodefacts import NodeFacts


def node_row(f: NodeFacts) -> dict[str, Any]:
    """The facts part of a reachable node's row (``status --json`` ``nodes[]``)."""
    gpu = f.gpu
    return {
        "engine_procs": len(f.engines or []),
        "alive": bool(f.engines),
        "sm_mhz": gpu.sm_mhz if gpu else None,
        "power_w": gpu.power_w if gpu else None,
        "temp_c": gpu.temp_c if gpu else None,
        "mem_available_gib": mem_gib(f.mem_available_kib),
        "clock_lock": clock_lock(f),
        "served_models": f.served_models,
        # what systemd did with the engine unit (the record cannot be updated by systemd)
        "unit": ({"enabled": f.engine_unit.unit_file_state, "active": f.engine_unit.active_state,
                  "result": f.engine_unit.result, "restarts": f.engine_unit.n_restarts}
                 if f.engine_unit else None),
        # law memory_watchdog: earlyoom's unit state (systemctl is-active), None when not read
        "watchdog": (f.watchdog.active or "not installed") if f.watchdog and f.watchdog.installed
                    else ("not installed" if f.watchdog else None),
    }


def mem_gib(kib: int | None) -> float | None:
    return round(kib / 1024 / 1024, 1) if kib else None


def clock_lock(f: NodeFacts) -> int | None:
    """The clock lock sparkctl recorded for THIS boot (a lock does not survive a reboot), MHz."""
    rec = f.clock_lock_record
    return rec[1] if rec and rec[0] == f.boot_id else None


def rank_drift(node: str, rank: int, row: dict[str, Any], state: str, clock_cap_mhz: int | None,
               engine_unit_result: str | None, engine_unit_restarts: int) -> list[str]:
    """What a ranked node's own facts say is off against the record (``status`` drift lines)."""
    out: list[str] = []
    if engine_unit_result == "start-limit-hit":
        # systemd.unit(5): started StartLimitBurst= times within StartLimitIntervalSec=, so it stays down
        out.append(f"{node}: rank {rank} stays down: its engine unit failed {engine_unit_restarts + 1} starts "
                   "and hit its start limit (Result=start-limit-hit; journalctl -u sparkctl-engine, "
                   "engine.log); fix it, then `sparkctl up`")
    elif state == "serving" and not row.get("alive"):
        out.append(f"{node}: rank {rank} is not running")
    if state == "serving" and row.get("watchdog") not in ("active", None):
        out.append(f"{node}: memory watchdog (earlyoom) {row['watchdog']}: an over-commit would hang "
                   "the box; `sparkctl up` restarts it (`sparkctl fabric apply` installs it)")
    if clock_cap_mhz and row.get("clock_lock") != clock_cap_mhz:
        out.append(f"{node}: clock lock {row.get('clock_lock') or 'lost'} (record: 0,{clock_cap_mhz} MHz)")
    return out
