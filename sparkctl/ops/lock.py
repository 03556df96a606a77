"""The locks and the run records on the state node: the two things every operation shares.

The state node is the inventory's first node. Each stack's record is written
there atomically (:func:`sparkctl.model.paths.record_path`) by the plans'
``record`` steps, and cached on the operator's side. A lock is one ``mkdir``
per node (``locks/<node>.d`` on the state node), taken and released by plan
steps (:mod:`sparkctl.plan.lockplan`; :func:`take` runs the ``lock`` step): an
operation locks exactly the nodes it may change (``up`` of a stack: its nodes
and the nodes its stack ran on before; ``fabric apply`` and a ``down`` of
everything: every node), so two operations on disjoint node sets do not block
each other and overlapping ones do.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shlex
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparkctl.errors import LifecycleError, LockHeld, LockUnavailable, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    DEFAULT_STACK,
    LAWS_DIR,
    LAWS_VERDICTS,
    LOCKS_DIR,
    RECORD,
    STACKS_DIR,
    laws_path,
    record_path,
    under,
)
from sparkctl.model.record import RunRecord
from sparkctl.ops.localstate import cluster_dir, read_json
from sparkctl.plan import lockplan
from sparkctl.transport import Transport


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def head_node(inv: Inventory) -> str:
    """The state node: where the records and the locks live (the inventory's first node)."""
    return inv.nodes[0].name


def node_path(inv: Inventory, node: str, path: str) -> str:
    return under(inv.node(node).prefix, path)


def node_sudo(inv: Inventory, node: str) -> bool:
    return inv.node(node).sudo


def local_record_path(inv: Inventory, stack: str = DEFAULT_STACK) -> Path:
    """The operator's cached copy of a stack's record (the default stack's keeps its old name)."""
    base = cluster_dir(inv)
    return base / "record.json" if stack == DEFAULT_STACK else base / "stacks" / f"{stack}.json"


_MARK = "==> sparkctl-record "
_LAWS_MARK = "==> sparkctl-laws "


def read_records_command(inv: Inventory) -> str:
    """Every stack's record and laws' verdicts on the state node, in one round trip, each after a marker line."""
    head = head_node(inv)
    q = shlex.quote
    return (f"for f in {q(node_path(inv, head, RECORD))} {q(node_path(inv, head, STACKS_DIR))}/*.json; do "
            f"[ -f \"$f\" ] || continue; printf '\\n{_MARK}%s\\n' \"$f\"; cat \"$f\" 2>/dev/null; done; "
            f"for f in {q(node_path(inv, head, LAWS_VERDICTS))} {q(node_path(inv, head, LAWS_DIR))}/*.json; do "
            f"[ -f \"$f\" ] || continue; printf '\\n{_LAWS_MARK}%s\\n' \"$f\"; cat \"$f\" 2>/dev/null; done; true")


def _chunks(text: str) -> list[tuple[str, str, str]]:
    """(kind: record | laws, path, body) of each file in :func:`read_records_command`'s output, in order."""
    out: list[tuple[str, str, str]] = []
    for chunk in text.split("\n==> sparkctl-")[1:]:
        head, _, body = chunk.partition("\n")
        kind, _, path = head.partition(" ")
        if kind in ("record", "laws"):
            out.append((kind, path.strip(), body))
    return out


def parse_records(text: str) -> dict[str, RunRecord]:
    """The output of :func:`read_records_command` -> records by stack (an unreadable one is skipped)."""
    return parse_state(text)[0]


def parse_state(text: str) -> tuple[dict[str, RunRecord], dict[str, dict[str, Any]]]:
    """The output of :func:`read_records_command` -> (records by stack, laws' verdicts by stack).

    ``laws.json`` is the stack "default"'s verdicts (the one file before stacks), ``laws/NAME.json``
    stack NAME's; a file that does not parse as a JSON object is skipped."""
    records: dict[str, RunRecord] = {}
    verdicts: dict[str, dict[str, Any]] = {}
    for kind, path, body in _chunks(text):
        stem = Path(path).stem
        if kind == "record":
            rec = _parse_one(body, stem)
            if rec is not None:
                records[rec.stack] = rec
            continue
        try:
            data = json.loads(body)
        except ValueError:
            continue
        if isinstance(data, dict):
            stack = DEFAULT_STACK if Path(path).parent.name != Path(LAWS_DIR).name else stem
            verdicts[stack] = data
    return records, dict(sorted(verdicts.items()))


def _parse_one(text: str, stem: str) -> RunRecord | None:
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            return None
        if not data.get("stack") and stem != "record":
            data = {**data, "stack": stem}
        return RunRecord.from_dict(data)
    except (ValueError, KeyError, TypeError):
        return None


def _cached_records(inv: Inventory) -> dict[str, RunRecord]:
    out: dict[str, RunRecord] = {}
    files = [local_record_path(inv)] + sorted((cluster_dir(inv) / "stacks").glob("*.json"))
    for f in files:
        data = read_json(f) if f.is_file() else None
        if isinstance(data, dict):
            rec = _parse_one(json.dumps(data), f.stem)
            if rec is not None:
                out[rec.stack] = rec
    return out


def read_state(inv: Inventory, transport: Transport) -> tuple[dict[str, RunRecord], dict[str, dict[str, Any]]]:
    """Every stack's run record and its laws' last verdicts, by stack name, in one round trip.

    The state node's copies when it answers, with the operator's cached copy of a stack
    the node has none of only when that copy claims nothing runs (a record the head could
    not keep: a full disk); when the state node does not answer, the cache alone (and no verdicts).
    """
    r = transport.run(head_node(inv), read_records_command(inv))
    cached = _cached_records(inv)
    if not r.ok:
        return cached, {}
    out, verdicts = parse_state(r.stdout)
    for stack, rec in cached.items():
        if stack not in out and not rec.live:
            out[stack] = rec
    return dict(sorted(out.items())), verdicts


def read_records(inv: Inventory, transport: Transport) -> dict[str, RunRecord]:
    """Every stack's run record, by stack name (:func:`read_state` without the verdicts)."""
    return read_state(inv, transport)[0]


def read_record(inv: Inventory, transport: Transport, stack: str = DEFAULT_STACK) -> RunRecord | None:
    """One stack's record (the default stack's: the one record of a cluster before stacks)."""
    head = head_node(inv)
    r = transport.run(head, f"cat {shlex.quote(node_path(inv, head, record_path(stack)))} 2>/dev/null || true")
    text = r.stdout.strip() if r.ok else ""
    rec = _parse_one(text, stack) if text else None
    if rec is None:
        data = read_json(local_record_path(inv, stack))
        rec = _parse_one(json.dumps(data), stack) if isinstance(data, dict) else None
    return rec


def write_verdicts(transport: Transport, target: Mapping[str, Any], profile: str, at: str,
                   verdicts: list[dict[str, Any]]) -> None:
    """The last verdict of every law, where the check step lists it (``params["verdicts"]``:
    the state node, the stack's path, its sudo; :func:`sparkctl.plan.planner.verdicts_target`):
    what `status` and the head's exporter show, per stack."""
    node, path = str(target["node"]), str(target["path"])
    doc = {"profile": profile, "at": at, "verdicts": verdicts, "stack": str(target.get("stack") or DEFAULT_STACK)}
    data = json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"
    r = transport.put(node, path, data, 0o644, sudo=bool(target.get("sudo")))
    if not r.ok:
        raise LifecycleError(f"cannot write {path} on {node}: {r.error or r.stderr.strip()}", Ref(node=node))


def read_verdicts(inv: Inventory, transport: Transport, stack: str = DEFAULT_STACK) -> dict[str, Any] | None:
    """One stack's laws' verdicts (``status`` reads them all with the records: :func:`read_state`)."""
    head = head_node(inv)
    r = transport.run(head, f"cat {shlex.quote(node_path(inv, head, laws_path(stack)))} 2>/dev/null || true")
    try:
        data = json.loads(r.stdout) if r.ok and r.stdout.strip() else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


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

    All the step's node locks or none. A lock whose holder is provably gone is broken by
    the next acquirer: a holder on this machine whose pid is dead, or a switch supervisor
    on the head (its ``host`` is the head's node name) whose pid no longer runs the
    supervisor. A holder on another workstation cannot be checked from here.
    """
    head = step["nodes"][0]
    sudo = bool(step.get("sudo", {}).get(head))
    p = step["params"]
    scope = list(p.get("nodes") or [])
    if not scope:
        return "nothing to lock"
    dirs = lockplan.lock_dirs(inv, scope)
    parent = node_path(inv, head, LOCKS_DIR)
    for _ in range(len(dirs) + 1):  # each round breaks the locks of at most one stale holder
        r = transport.run(head, step["commands"][head], sudo=sudo, timeout_s=step.get("timeout_s"),
                          stdin=p["stdin"][head])
        lines = r.stdout.strip().splitlines()
        if r.ok and lines[:1] == ["acquired"]:
            return "acquired"
        if not r.ok or lines[:1] != ["held"]:
            raise (LockUnavailable if r.ok is False and not r.error else LifecycleError)(
                f"cannot take the lock on {head}: {r.error or r.stderr.strip() or f'exit {r.exit_code}'}",
                Ref(node=head), hint=f"check the disk and permissions of {parent} on {head}")
        d = lines[1] if len(lines) > 1 else ""
        node = next((n for n, path in dirs.items() if path == d), "?")
        name = lockplan.claimed_name(node)
        raw = lines[2] if len(lines) > 2 else ""
        try:
            other = json.loads(raw)
        except ValueError:
            other = {"holder": "unknown (no holder file)", "since": "unknown"}
        if raw and _holder_gone(transport, head, sudo, p, other, raw):
            transport.run(head, p["break_stale"][head], sudo=sudo, stdin=raw)
            continue
        if name is not None:
            raise LockHeld(f"the served name {name!r} is being claimed by {other.get('holder')} since "
                           f"{other.get('since')} ({other.get('operation', '?')})", Ref(node=head),
                           hint="another stack is starting to serve that name; when it is done, `sparkctl status` "
                                "shows it (a second stack may serve the name only as a declared replica: "
                                "topology.shared_name); if that process is gone, `sparkctl unlock` removes the claim")
        whole = {k for k in dirs if lockplan.claimed_name(k) is None} == set(inv.names)
        what = "the cluster" if whole and len(dirs) > 1 else node
        raise LockHeld(
            f"{what} is locked by {other.get('holder')} since {other.get('since')} "
            f"({other.get('operation', '?')}{'' if what == node else ', holding ' + node})", Ref(node=head),
            hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock")
    raise LockHeld(f"the locks of {', '.join(dirs)} kept changing hands", Ref(node=head),
                   hint="another sparkctl is busy on these nodes; try again")


def _holder_gone(transport: Transport, head: str, sudo: bool, params: Mapping[str, Any],
                 other: Mapping[str, Any], raw: str) -> bool:
    pid = other.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if other.get("host") == socket.gethostname():
        return not _pid_alive(pid)
    if other.get("host") == head:  # the supervisor writes the head's node name as its host
        r = transport.run(head, params["holder_alive"][head], sudo=sudo, stdin=raw)
        return r.ok and r.stdout.strip() == "gone"
    return False


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def held_command(inv: Inventory, nodes: Sequence[str]) -> str:
    """Prints ``held`` when any of ``nodes`` is locked, else ``free`` (run on the state node)."""
    dirs = " ".join(shlex.quote(d) for d in lockplan.lock_dirs(inv, nodes).values()) or "/nonexistent"
    return f"for d in {dirs}; do [ -d \"$d\" ] && {{ echo held; exit 0; }}; done; echo free"
