"""The cluster lock and the run record on the head: the two things every operation shares.

The lock is one ``mkdir`` on the head (the inventory's first node); the record is
written there atomically and cached on the operator's side.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sparkctl.errors import LifecycleError, LockHeld, LockUnavailable, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import LAWS_VERDICTS, LOCK_DIR, RECORD, under
from sparkctl.model.record import RunRecord
from sparkctl.ops.localstate import cluster_dir, read_json, write_json
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
    """Atomic on the head (temp + rename by the transport) and in the local cache."""
    head = head_node(inv)
    data = json.dumps(rec.to_dict(), indent=2, sort_keys=True).encode() + b"\n"
    write_json(cluster_dir(inv) / "record.json", rec.to_dict())
    r = transport.put(head, node_path(inv, head, RECORD), data, 0o644, sudo=node_sudo(inv, head))
    if not r.ok:
        raise LifecycleError(f"cannot write the run record on {head}: {r.error or r.stderr.strip()}", Ref(node=head),
                             hint="the local cache has it; check the disk on the head node")


# --------------------------------------------------------------------------- the lock


# The lock: one mkdir, then the holder file. A lock dir is only ever left
# without a holder by a process killed between the two; a failed write of the
# holder (a full disk) removes the dir again, so a full disk never leaves a lock.
_ACQUIRE_SCRIPT = """\
d={d}
mkdir -p {parent} || exit 3
if err=$(mkdir "$d" 2>&1); then
  if out=$( {{ printf '%s\\n' {info} > "$d/holder"; }} 2>&1 ); then echo acquired; exit 0; fi
  rm -rf "$d"; echo "cannot write $d/holder: ${{out:-write error}}" >&2; exit 3
elif [ -d "$d" ]; then
  echo held; cat "$d/holder" 2>/dev/null; exit 0
fi
echo "$err" >&2; exit 3
"""

# Whether a holder on the head (the supervisor of `switch --supervise`) still runs.
_HEAD_HOLDER_ALIVE = ("p={pid}; if [ -d /proc/$p ] && tr '\\000' ' ' < /proc/$p/cmdline 2>/dev/null | "
                      "grep -qE 'supervisor|planrun'; then echo alive; else echo gone; fi")


@dataclass
class ClusterLock:
    """mkdir-based lock on the head node; the holder's user@host, pid and time inside.

    A lock whose holder is provably gone is broken by the next acquirer: a
    holder on this machine whose pid is dead, or a switch supervisor on the head
    (its ``host`` is the head's node name) whose pid no longer runs the
    supervisor. A holder on another workstation cannot be checked from here.
    """

    inv: Inventory
    transport: Transport
    operation: str
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}")

    def _dir(self) -> str:
        head = head_node(self.inv)
        return node_path(self.inv, head, LOCK_DIR)

    held: bool = False

    def acquire(self, break_stale: bool = True) -> None:
        head = head_node(self.inv)
        d = self._dir()
        info = json.dumps({"holder": self.holder, "since": now_iso(), "operation": self.operation,
                           "host": socket.gethostname(), "pid": os.getpid()})
        cmd = _ACQUIRE_SCRIPT.format(d=shlex.quote(d), parent=shlex.quote(d.rsplit("/", 1)[0] or "/"),
                                     info=shlex.quote(info))
        r = self.transport.run(head, cmd, sudo=node_sudo(self.inv, head))
        lines = r.stdout.strip().splitlines()
        if r.ok and lines[:1] == ["acquired"]:
            self.held = True
            return
        if not r.ok or lines[:1] != ["held"]:
            raise (LockUnavailable if r.ok is False and not r.error else LifecycleError)(
                f"cannot take the cluster lock on {head}: {r.error or r.stderr.strip() or f'exit {r.exit_code}'}",
                Ref(node=head), hint=f"check the disk and permissions of {d.rsplit('/', 1)[0]} on {head}")
        raw = lines[1] if len(lines) > 1 else ""
        try:
            other = json.loads(raw)
        except ValueError:
            other = {"holder": "unknown (no holder file)", "since": "unknown"}
        if break_stale and raw and self._holder_gone(other):
            q = shlex.quote
            # Break only the lock we judged: the same holder line, renamed away in one step.
            self.transport.run(head, f"d={q(d)}; grep -qxF {q(raw)} \"$d/holder\" 2>/dev/null && "
                                     f"mv \"$d\" \"$d.stale.$$\" && rm -rf \"$d.stale.$$\"; true",
                               sudo=node_sudo(self.inv, head))
            return self.acquire(break_stale=False)
        raise LockHeld(
            f"the cluster is locked by {other.get('holder')} since {other.get('since')} "
            f"({other.get('operation', '?')})", Ref(node=head),
            hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock",
        )

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
        d = shlex.quote(self._dir())
        holder = shlex.quote(self.holder)
        self.transport.run(head, f"grep -qF {holder} {d}/holder 2>/dev/null && rm -rf {d}; true",
                           sudo=node_sudo(self.inv, head))

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


def break_lock(inv: Inventory, transport: Transport) -> str:
    head = head_node(inv)
    d = shlex.quote(node_path(inv, head, LOCK_DIR))
    r = transport.run(head, f"cat {d}/holder 2>/dev/null; rm -rf {d}", sudo=node_sudo(inv, head))
    return r.stdout.strip()


