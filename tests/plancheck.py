"""The plan-equals-execution checker: every command a transport ran is one a plan's step lists.

:class:`Recorder` wraps a transport's ``_run`` (the one door every ``run``,
``run_all``, ``put`` and ``put_all`` goes through) and keeps every command and
every write, with its node, its sudo and, for a write, the SHA-256 of the bytes.
:func:`unplanned` returns what a plan does not list (``sparkctl.plan.steps.calls``:
a step's commands, the node -> command maps in its params, its files and its
record), save :data:`READ_ONLY`, the reads that gathering facts makes before or
between plans (they change nothing), each with why it is there.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkctl.model import wheels
from sparkctl.plan.planner import ALIVE_COMMAND
from sparkctl.plan.steps import Plan, calls
from sparkctl.transport.base import put_files

# Read-only fact gathering, run outside any plan (it changes nothing). Each: (why, pattern, with sudo?).
READ_ONLY: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    ("a stack's run record on the state node, read before planning (ops.lock.read_record) and after a run for "
     "its result (the default stack's record.json, another stack's stacks/NAME.json)",
     re.compile(r"cat '?/var/lib/sparkctl/(record|stacks/[A-Za-z0-9_.-]+)\.json'? 2>/dev/null \|\| true"), False),
    ("every stack's record on the state node in one round trip, read before locking (ops.executor.lock_scope, "
     "down_scope) and again under the lock to plan (ops.lock.read_records_command)",
     re.compile(r"for f in '?/var/lib/sparkctl/record\.json'? '?/var/lib/sparkctl/stacks'?/\*\.json; do .*", re.S),
     False),
    ("serve.gateway: what its node holds (platform, free disk, installed wheels, the unit's state, the hashes of "
     "its files), read as root before planning: its env file is 0600 root (ops.executor.gather_gateway)",
     re.compile(re.escape(wheels.PLATFORM_COMMAND) + r" 2>/dev/null \|\| true\n.*", re.S), True),
    ("serve.gateway as `status` sees it: the unit's state and smg's workers, in one round trip to the gateway's "
     "node, the operator's key on stdin (ops.gatewayops.status_command)",
     re.compile(r"echo \"active=\$\(systemctl is-active sparkctl-gateway\.service .*", re.S), False),
    ("which engines run, read before planning `up`/`switch` (ops.executor.gather_up_facts)",
     re.compile(re.escape(ALIVE_COMMAND)), False),
    ("the netplan files, read as root before planning `fabric apply` (ops.fabric.read_netplan; 0600 root files)",
     re.compile(r"sh -c '.*netplan.*", re.S), True),
    ("the supervisor's events: its pid once the launch step saw it start, then its progress (ops.supervise)",
     re.compile(r"(cat|tail -n \d+) '?/var/lib/sparkctl/supervisor\.jsonl'? 2>/dev/null \|\| true"), False),
)


@dataclass(frozen=True)
class Ran:
    node: str
    kind: str  # run | put
    text: str  # the command, or the path written
    sudo: bool
    sha256: str | None = None  # put: of the bytes written


class Recorder:
    """Every command and write a transport makes, as :class:`Ran` (wraps its ``_run``)."""

    def __init__(self, transport: Any) -> None:
        self.log: list[Ran] = []
        inner = transport._run

        def run(node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
                cancel: Any) -> Any:
            if label.startswith("put "):  # one session writes the node's files: each is a write of its own
                for path, _mode, data in put_files(shlex.split(cmd), stdin or b""):
                    self.log.append(Ran(node, "put", path, bool(sudo), hashlib.sha256(data).hexdigest()))
            else:
                self.log.append(Ran(node, "run", cmd, bool(sudo)))
            return inner(node, cmd, label=label, sudo=sudo, timeout_s=timeout_s, stdin=stdin, cancel=cancel)

        transport._run = run


def _plans(plans: Iterable[Plan | Mapping[str, Any]]) -> list[Plan]:
    return [p if isinstance(p, Plan) else Plan.from_dict(p) for p in plans]


def unplanned(plans: Iterable[Plan | Mapping[str, Any]], ran: Iterable[Ran]) -> list[Ran]:
    """What ran that no step of ``plans`` lists (and no :data:`READ_ONLY` read explains)."""
    runs: set[tuple[str, str, bool]] = set()
    puts: set[tuple[str, str, bool, str | None]] = set()
    for plan in _plans(plans):
        for step in plan.all_steps():
            for c in calls(step):
                if c.kind == "run":
                    runs.add((c.node, c.text, c.sudo))
                else:
                    puts.add((c.node, c.text, c.sudo, c.sha256))
    out = []
    for r in ran:
        if r.kind == "run":
            if (r.node, r.text, r.sudo) in runs:
                continue
            if any(p.fullmatch(r.text) and (r.sudo is False or sudo) for _why, p, sudo in READ_ONLY):
                continue
        elif (r.node, r.text, r.sudo, r.sha256) in puts or (r.node, r.text, r.sudo, None) in puts:
            continue  # a record's bytes are decided when it is written (its time, its steps): path and sudo
        out.append(r)
    return out
