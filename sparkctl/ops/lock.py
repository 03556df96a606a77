"""The locks and the run records on the state node: the two things every operation shares.

The state node is the inventory's first node. Each stack's record is written
there atomically (:func:`sparkctl.model.paths.record_path`) and cached on the
operator's side. A lock is one ``mkdir`` per node (``locks/<node>.d`` on the
state node): an operation locks exactly the nodes it may change (``up`` of a
stack: its nodes and the nodes its stack ran on before; ``fabric apply`` and a
``down`` of everything: every node), so two operations on disjoint node sets
do not block each other and overlapping ones do.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparkctl.errors import LifecycleError, LockHeld, LockUnavailable, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    DEFAULT_STACK,
    LAWS_VERDICTS,
    LOCK_DIR,
    LOCKS_DIR,
    RECORD,
    STACKS_DIR,
    node_lock_dir,
    record_path,
    under,
)
from sparkctl.model.record import RunRecord
from sparkctl.ops.localstate import cluster_dir, read_json, write_json
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


def read_records_command(inv: Inventory) -> str:
    """Every stack's record on the state node, in one round trip, each after a marker line."""
    head = head_node(inv)
    q = shlex.quote
    return (f"for f in {q(node_path(inv, head, RECORD))} {q(node_path(inv, head, STACKS_DIR))}/*.json; do "
            f"[ -f \"$f\" ] || continue; printf '\\n{_MARK}%s\\n' \"$f\"; cat \"$f\" 2>/dev/null; done; true")


def parse_records(text: str) -> dict[str, RunRecord]:
    """The output of :func:`read_records_command` -> records by stack (an unreadable one is skipped)."""
    out: dict[str, RunRecord] = {}
    for chunk in text.split("\n" + _MARK)[1:]:
        path, _, body = chunk.partition("\n")
        rec = _parse_one(body, Path(path.strip()).stem)
        if rec is not None:
            out[rec.stack] = rec
    return out


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


def read_records(inv: Inventory, transport: Transport) -> dict[str, RunRecord]:
    """Every stack's run record, by stack name.

    The state node's copies when it answers, with the operator's cached copy of a stack
    the node has none of only when that copy claims nothing runs (a record the head could
    not keep: a full disk); when the state node does not answer, the cache alone.
    """
    r = transport.run(head_node(inv), read_records_command(inv))
    cached = _cached_records(inv)
    if not r.ok:
        return cached
    out = parse_records(r.stdout)
    for stack, rec in cached.items():
        if stack not in out and not rec.live:
            out[stack] = rec
    return dict(sorted(out.items()))


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


def write_verdicts(inv: Inventory, transport: Transport, profile: str, at: str, verdicts: list[dict[str, Any]]) -> None:
    """The last verdict of every law, on the head (what `status` and the head's exporter show)."""
    head = head_node(inv)
    data = json.dumps({"profile": profile, "at": at, "verdicts": verdicts}, indent=1, sort_keys=True).encode() + b"\n"
    r = transport.put(head, node_path(inv, head, LAWS_VERDICTS), data, 0o644, sudo=node_sudo(inv, head))
    if not r.ok:
        raise LifecycleError(f"cannot write {LAWS_VERDICTS} on {head}: {r.error or r.stderr.strip()}", Ref(node=head))


def read_verdicts(inv: Inventory, transport: Transport) -> dict[str, Any] | None:
    head = head_node(inv)
    r = transport.run(head, f"cat {shlex.quote(node_path(inv, head, LAWS_VERDICTS))} 2>/dev/null || true")
    try:
        data = json.loads(r.stdout) if r.ok and r.stdout.strip() else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def write_record(inv: Inventory, transport: Transport, rec: RunRecord) -> None:
    """Atomic on the state node (temp + rename by the transport) and in the local cache."""
    head = head_node(inv)
    data = json.dumps(rec.to_dict(), indent=2, sort_keys=True).encode() + b"\n"
    write_json(local_record_path(inv, rec.stack), rec.to_dict())
    r = transport.put(head, node_path(inv, head, record_path(rec.stack)), data, 0o644, sudo=node_sudo(inv, head))
    if not r.ok:
        raise LifecycleError(f"cannot write the run record on {head}: {r.error or r.stderr.strip()}", Ref(node=head),
                             hint="the local cache has it; check the disk on the head node")


# --------------------------------------------------------------------------- the lock


# The lock of a node set: one mkdir per node, in inventory order, then each holder
# file, in one script on the state node. A dir already there stops it: the dirs this
# run made are removed again (only those whose holder line is ours), so a refused
# acquisition holds nothing. A lock dir is only ever left without a holder by a
# process killed between mkdir and the write; a failed write of the holder (a full
# disk) removes what this run made, so a full disk never leaves a lock.
_ACQUIRE_SCRIPT = """\
info={info}
mkdir -p {parent} || exit 3
undo() {{ for m in {dirs}; do grep -qxF -- "$info" "$m/holder" 2>/dev/null && rm -rf "$m"; done; }}
for d in {dirs}; do
  if err=$(mkdir "$d" 2>&1); then
    if out=$( {{ printf '%s\\n' "$info" > "$d/holder"; }} 2>&1 ); then continue; fi
    rm -rf "$d"; undo; echo "cannot write $d/holder: ${{out:-write error}}" >&2; exit 3
  elif [ -d "$d" ]; then
    undo; echo held; echo "$d"; cat "$d/holder" 2>/dev/null; exit 0
  fi
  undo; echo "$err" >&2; exit 3
done
echo acquired
"""

# Whether a holder on the head (the supervisor of `switch --supervise`) still runs.
_HEAD_HOLDER_ALIVE = ("p={pid}; if [ -d /proc/$p ] && tr '\\000' ' ' < /proc/$p/cmdline 2>/dev/null | "
                      "grep -qE 'supervisor|planrun'; then echo alive; else echo gone; fi")


def lock_dirs(inv: Inventory, nodes: Sequence[str] | None = None) -> dict[str, str]:
    """node -> its lock dir on the state node, in inventory order (every node when ``nodes`` is None)."""
    head = head_node(inv)
    want = set(inv.names if nodes is None else nodes)
    return {n: node_path(inv, head, node_lock_dir(n)) for n in inv.names if n in want}


@dataclass
class ClusterLock:
    """The lock of a node set (every node by default): one mkdir per node on the state node,
    the holder's user@host, pid and time inside each.

    A lock whose holder is provably gone is broken by the next acquirer: a
    holder on this machine whose pid is dead, or a switch supervisor on the head
    (its ``host`` is the head's node name) whose pid no longer runs the
    supervisor. A holder on another workstation cannot be checked from here.
    """

    inv: Inventory
    transport: Transport
    operation: str
    nodes: Sequence[str] | None = None  # the nodes this operation may change; None = every node
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}")
    held: bool = False

    def dirs(self) -> dict[str, str]:
        return lock_dirs(self.inv, self.nodes)

    def acquire(self, break_stale: bool = True) -> None:
        head = head_node(self.inv)
        dirs = self.dirs()
        if not dirs:
            self.held = True
            return
        parent = node_path(self.inv, head, LOCKS_DIR)
        info = json.dumps({"holder": self.holder, "since": now_iso(), "operation": self.operation,
                           "host": socket.gethostname(), "pid": os.getpid()})
        for _ in range(len(dirs) + 1):  # each round breaks at most one stale lock
            cmd = _ACQUIRE_SCRIPT.format(info=shlex.quote(info), parent=shlex.quote(parent),
                                         dirs=" ".join(shlex.quote(d) for d in dirs.values()))
            r = self.transport.run(head, cmd, sudo=node_sudo(self.inv, head))
            lines = r.stdout.strip().splitlines()
            if r.ok and lines[:1] == ["acquired"]:
                self.held = True
                return
            if not r.ok or lines[:1] != ["held"]:
                raise (LockUnavailable if r.ok is False and not r.error else LifecycleError)(
                    f"cannot take the lock on {head}: {r.error or r.stderr.strip() or f'exit {r.exit_code}'}",
                    Ref(node=head), hint=f"check the disk and permissions of {parent} on {head}")
            d = lines[1] if len(lines) > 1 else ""
            node = next((n for n, p in dirs.items() if p == d), "?")
            raw = lines[2] if len(lines) > 2 else ""
            try:
                other = json.loads(raw)
            except ValueError:
                other = {"holder": "unknown (no holder file)", "since": "unknown"}
            if not (break_stale and raw and self._holder_gone(other)):
                whole = self.nodes is None or set(dirs) == set(self.inv.names)
                what = "the cluster" if whole and len(dirs) > 1 else node
                raise LockHeld(
                    f"{what} is locked by {other.get('holder')} since {other.get('since')} "
                    f"({other.get('operation', '?')}{'' if what == node else ', holding ' + node})",
                    Ref(node=head),
                    hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock")
            q = shlex.quote
            # Break only the lock we judged: the same holder line, renamed away in one step.
            self.transport.run(head, f"d={q(d)}; grep -qxF -- {q(raw)} \"$d/holder\" 2>/dev/null && "
                                     f"mv \"$d\" \"$d.stale.$$\" && rm -rf \"$d.stale.$$\"; true",
                               sudo=node_sudo(self.inv, head))
        raise LockHeld(f"the locks of {', '.join(dirs)} kept changing hands", Ref(node=head),
                       hint="another sparkctl is busy on these nodes; try again")

    def _holder_gone(self, other: Mapping[str, Any]) -> bool:
        pid = other.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return False
        if other.get("host") == socket.gethostname():
            return not _pid_alive(pid)
        head = head_node(self.inv)
        if other.get("host") == head:  # the supervisor writes the head's node name as its host
            r = self.transport.run(head, _HEAD_HOLDER_ALIVE.format(pid=int(pid)))
            return r.ok and r.stdout.strip() == "gone"
        return False

    def release(self) -> None:
        head = head_node(self.inv)
        holder = shlex.quote(self.holder)
        dirs = " ".join(shlex.quote(d) for d in self.dirs().values())
        if not dirs:
            return
        self.transport.run(head, f"for d in {dirs}; do grep -qF -- {holder} \"$d/holder\" 2>/dev/null && "
                                 "rm -rf \"$d\"; done; true", sudo=node_sudo(self.inv, head))

    def __enter__(self) -> "ClusterLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def held_command(inv: Inventory, nodes: Sequence[str]) -> str:
    """Prints ``held`` when any of ``nodes`` is locked, else ``free`` (run on the state node)."""
    dirs = " ".join(shlex.quote(d) for d in lock_dirs(inv, nodes).values()) or "/nonexistent"
    return f"for d in {dirs}; do [ -d \"$d\" ] && {{ echo held; exit 0; }}; done; echo free"


def break_lock(inv: Inventory, transport: Transport, nodes: Sequence[str] | None = None) -> str:
    """Remove the locks of ``nodes`` (every node, and the one lock of a sparkctl before stacks,
    when None); returns the holders that were there."""
    head = head_node(inv)
    dirs = list(lock_dirs(inv, nodes).values()) + ([node_path(inv, head, LOCK_DIR)] if nodes is None else [])
    q = " ".join(shlex.quote(d) for d in dirs)
    r = transport.run(head, f"for d in {q}; do cat \"$d/holder\" 2>/dev/null; rm -rf \"$d\"; done; true",
                      sudo=node_sudo(inv, head))
    return r.stdout.strip()
