"""The cluster lock and the run record on the head: the two things every operation shares.

The lock is one ``mkdir`` on the head (the inventory's first node), taken and
released by plan steps (:mod:`sparkctl.plan.lockplan`; :func:`take` runs the
``lock`` step); the record is written there by the plans' ``record`` steps,
atomically, and cached on the operator's side.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shlex
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from sparkctl.errors import LifecycleError, LockHeld, LockUnavailable, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import LOCK_DIR, RECORD, under
from sparkctl.model.record import RunRecord
from sparkctl.ops.localstate import cluster_dir, read_json
from sparkctl.plan import lockplan
from sparkctl.transport.ssh import Transport

def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")



def head_node(inv: Inventory) -> str:
    """Where the record and the lock live: the inventory's first node."""
    return inv.nodes[0].name


def node_path(inv: Inventory, node: str, path: str) -> str:
    return under(inv.node(node).prefix, path)


def node_sudo(inv: Inventory, node: str) -> bool:
    return inv.node(node).sudo


def read_record(inv: Inventory, transport: Transport) -> RunRecord | None:
    head = head_node(inv)
    r = transport.run(head, f"cat {shlex.quote(node_path(inv, head, RECORD))} 2>/dev/null || true")
    text = r.stdout.strip() if r.ok else ""
    data: Any = None
    if text:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    if data is None:
        data = read_json(cluster_dir(inv) / "record.json")
    return RunRecord.from_dict(data) if data else None


# --------------------------------------------------------------------------- the lock


def holder_info(operation: str, token: str | None = None) -> dict[str, Any]:
    """This process as a lock holder: who, since when, doing what, and the run's token."""
    pid = os.getpid()
    since = now_iso()
    return {"holder": f"{getpass.getuser()}@{socket.gethostname()} pid {pid}", "since": since,
            "operation": operation, "host": socket.gethostname(), "pid": pid,
            "run": token or f"{socket.gethostname()}:{pid}:{secrets.token_hex(6)}"}


def take(inv: Inventory, transport: Transport, step: Mapping[str, Any]) -> str:
    """Run the plan's ``lock`` step (:func:`sparkctl.plan.lockplan.lock_step`): only its listed commands.

    A lock whose holder is provably gone is broken once: a holder on this machine
    whose pid is dead, or a switch supervisor on the head (its ``host`` is the
    head's node name) whose pid no longer runs the supervisor. A holder on
    another workstation cannot be checked from here.
    """
    head = step["nodes"][0]
    sudo = bool(step.get("sudo", {}).get(head))
    p = step["params"]
    d = lockplan.lock_dir(inv)
    for attempt in (1, 2):
        r = transport.run(head, step["commands"][head], sudo=sudo, timeout_s=step.get("timeout_s"),
                          stdin=p["stdin"][head])
        lines = r.stdout.strip().splitlines()
        if r.ok and lines[:1] == ["acquired"]:
            return "acquired"
        if not r.ok or lines[:1] != ["held"]:
            raise (LockUnavailable if r.ok is False and not r.error else LifecycleError)(
                f"cannot take the cluster lock on {head}: {r.error or r.stderr.strip() or f'exit {r.exit_code}'}",
                Ref(node=head), hint=f"check the disk and permissions of {d.rsplit('/', 1)[0]} on {head}")
        raw = lines[1] if len(lines) > 1 else ""
        try:
            other = json.loads(raw)
        except ValueError:
            other = {"holder": "unknown (no holder file)", "since": "unknown"}
        if attempt == 1 and raw and _holder_gone(transport, head, sudo, p, other):
            transport.run(head, p["break_stale"][head], sudo=sudo, stdin=raw)
            continue
        raise LockHeld(
            f"the cluster is locked by {other.get('holder')} since {other.get('since')} "
            f"({other.get('operation', '?')})", Ref(node=head),
            hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock",
        )
    raise AssertionError("unreachable")


def _holder_gone(transport: Transport, head: str, sudo: bool, params: Mapping[str, Any],
                 other: Mapping[str, Any]) -> bool:
    pid = other.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if other.get("host") == socket.gethostname():
        return not _pid_alive(pid)
    if other.get("host") == head:  # the supervisor writes the head's node name as its host
        r = transport.run(head, params["holder_alive"][head], sudo=sudo)
        return r.ok and r.stdout.strip() == "gone"
    return False


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def break_lock(inv: Inventory, transport: Transport) -> str:
    head = head_node(inv)
    d = shlex.quote(node_path(inv, head, LOCK_DIR))
    r = transport.run(head, f"cat {d}/holder 2>/dev/null; rm -rf {d}", sudo=node_sudo(inv, head))
    return r.stdout.strip()


