"""``switch --supervise`` as plans: what the operator runs, and what the runner on the head runs. Pure.

One switch plan (``switchplan.plan_switch``, between the lock steps) is cut at the
handover (:func:`split`). The operator's part keeps the lock, the check and the
clock cap (they change no stack) and adds every step that hands the rest over:

* ``supervisor-grant``: the supervisor's public key in sparkctl's
  authorized_keys on every peer (with that node's sudo), and
  ``supervisor-grant-user`` in the login user's ``~/.ssh/authorized_keys`` (a
  real host's sshd reads that one; a simulated node reads sparkctl's);
* ``supervisor-key``: the key (0600) and the peers' verified fabric host keys
  on the head;
* ``supervisor-push``: the plan file (the head's plan, how to reach each node,
  the files' bytes; 0600), the runner and the readiness probe and file writer it imports;
* ``record-switching``: the previous stack's record says a supervised switch
  runs (only when something serves); a launch that fails puts it back
  (branch ``restore-record``);
* ``launch``: the runner started with ``setsid`` on the head, which takes over
  every node lock of the stack the operator took (the lock step's nodes; its
  holder carries its own run token) and writes ``started``; the step waits for
  that line.

The head's part is the rest of the same plan with its rollback branch, and a
``finally`` that releases exactly those node locks, while the runner holds them. Nothing is decided after
planning: the rollback record's note is the planner's (``rollback_note``).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    NODE_AUTHORIZED_KEYS,
    SUPERVISOR_EVENTS,
    SUPERVISOR_KEY,
    SUPERVISOR_KNOWN_HOSTS,
    SUPERVISOR_LOG,
    SUPERVISOR_PID,
    SUPERVISOR_PLAN,
    SUPERVISOR_PROBE,
    SUPERVISOR_PUTFILES,
    SUPERVISOR_RUNNER,
    under,
)
from sparkctl.model.record import RunRecord
from sparkctl.plan import lockplan
from sparkctl.plan.planner import record_step
from sparkctl.plan.steps import FINALLY, FileRef, Plan, Step

# The steps the operator's side runs itself before the handover: they change no stack.
OPERATOR_PHASES = ("lock", "check", "clock")
ROLLBACK_NOTE = "rolled back by supervisor"
STARTED_WAIT_S = 15  # the runner writes "started" within a second; 15 s is a runner that did not start

# Idempotent: a line already in the file is not added again.
_ADD_LINE = ("f={f}; mkdir -p \"$(dirname \"$f\")\"; touch \"$f\"; chmod 600 \"$f\"; "
             "grep -qxF {line} \"$f\" || printf '%s\\n' {line} >> \"$f\"")


@dataclass(frozen=True)
class Handover:
    """What the operator's part puts on the head, as bytes (hashed into the plan, never printed)."""

    head: str
    peers: tuple[str, ...]
    grant_line: str  # the supervisor key's authorized_keys line on the peers
    key: bytes
    known_hosts: bytes | None  # the peers' verified host keys; None: not read (--assume-fresh)
    runner: bytes
    probe: bytes
    putfiles: bytes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(plan: Plan) -> tuple[Plan, Plan]:
    """(what the operator runs, what the runner on the head runs): one plan, cut at the handover."""
    k = next((i for i, s in enumerate(plan.steps) if s.phase not in OPERATOR_PHASES), len(plan.steps))
    mine = replace(plan, steps=plan.steps[:k], branches={b: v for b, v in plan.branches.items() if b == FINALLY})
    theirs = replace(plan, op="switch --supervise", steps=plan.steps[k:],
                     branches={b: v for b, v in plan.branches.items() if b != FINALLY})
    return mine, theirs


def supervisor_token(holder: Mapping[str, Any]) -> str:
    """The run token of the runner's lock: the operator's, marked, so neither releases the other's."""
    return f"{holder['run']}/supervisor"


def lock_nodes(plan: Plan) -> list[str] | None:
    """The nodes the plan's ``lock`` step locks (None: it has none, or it locks every node)."""
    step = next((s for s in plan.steps if s.kind == "lock"), None)
    return list(step.params["nodes"]) if step is not None and "nodes" in step.params else None


def head_plan(theirs: Plan, inv: Inventory, holder: Mapping[str, Any], nodes: Sequence[str] | None) -> Plan:
    """The runner's plan: the rest of the switch, then the release of the node locks it was handed."""
    return replace(theirs, branches={**theirs.branches,
                                     FINALLY: (lockplan.unlock_step(inv, supervisor_token(holder), nodes),)})


def launch_command(inv: Inventory, head: str, holder: Mapping[str, Any], nodes: Sequence[str] | None = None) -> str:
    """Start the runner detached (setsid) on the head, then wait for its ``started`` line."""
    q = shlex.quote

    def at(p: str) -> str:
        return under(inv.node(head).prefix, p)

    events, log = at(SUPERVISOR_EVENTS), at(SUPERVISOR_LOG)
    # the runner adds its pid and "supervisor pid N on HEAD": what the lock's stale check looks for
    sup = {"since": holder["since"], "operation": holder["operation"], "host": head, "run": supervisor_token(holder)}
    dirs = list(lockplan.lock_dirs(inv, nodes).values())  # every node lock of the stack, handed over
    argv = ["python3", at(SUPERVISOR_RUNNER), "supervise", at(SUPERVISOR_PLAN), events, at(SUPERVISOR_PID),
            json.dumps(dirs), json.dumps(sup)]
    return (f"mkdir -p {q(log.rsplit('/', 1)[0])} && : > {q(events)} || exit 1; "
            f"setsid {' '.join(q(a) for a in argv)} </dev/null >>{q(log)} 2>&1 & echo \"pid:$!\"; "
            f"i=0; while [ \"$i\" -lt {STARTED_WAIT_S * 10} ]; do "
            f"grep -q '\"phase\": \"started\"' {q(events)} 2>/dev/null && exit 0; sleep 0.1; i=$((i + 1)); done; "
            f"echo \"the supervisor did not start; see {log}\" >&2; exit 1")


def operator_plan(mine: Plan, inv: Inventory, handover: Handover, plan_file: bytes, prev: RunRecord | None,
                  profile: str, holder: Mapping[str, Any], started_at: str) -> Plan:
    """The operator's part: the lock, check and clock, then every step of the handover."""
    head, peers = handover.head, handover.peers
    q = shlex.quote
    sudo = {n: inv.node(n).sudo for n in inv.names}

    def at(p: str) -> str:
        return under(inv.node(head).prefix, p)

    steps: list[Step] = list(mine.steps)
    if peers:
        grant = {n: _ADD_LINE.format(f=q(under(inv.node(n).prefix, NODE_AUTHORIZED_KEYS)), line=q(handover.grant_line))
                 for n in peers}
        steps.append(Step("supervisor-grant", "supervisor", "run", tuple(peers),
                          f"authorize the supervisor's key for {head} on its peers (restrict, from= its fabric "
                          "addresses)", changes="sparkctl's authorized_keys on the peers", commands=grant,
                          sudo={n: sudo[n] for n in peers}, timeout_s=30))
        # On a real host sshd reads the ssh user's ~/.ssh/authorized_keys; a simulated node
        # (SPARKCTL_SIM_NODE in its session) reads the file above, and its ~ is the host's.
        user = {n: "[ -n \"${SPARKCTL_SIM_NODE:-}\" ] && exit 0; " + _ADD_LINE.format(
            f="\"$HOME/.ssh/authorized_keys\"", line=q(handover.grant_line)).replace("mkdir -p", "mkdir -m 700 -p")
            for n in peers}
        steps.append(Step("supervisor-grant-user", "supervisor", "run", tuple(peers),
                          "the same line in the login user's ~/.ssh/authorized_keys (what a real host's sshd reads)",
                          changes="~/.ssh/authorized_keys on the peers", commands=user,
                          sudo={n: False for n in peers}, timeout_s=30))
    kh = handover.known_hosts
    steps.append(Step("supervisor-key", "supervisor", "put", (head,),
                      f"put the supervisor's key and its peers' verified fabric host keys on {head}",
                      changes=f"{SUPERVISOR_KEY} (0600) and {SUPERVISOR_KNOWN_HOSTS} on {head}",
                      files={head: (FileRef(at(SUPERVISOR_KEY), 0o600, _sha(handover.key)),
                                    FileRef(at(SUPERVISOR_KNOWN_HOSTS), 0o644, _sha(kh) if kh is not None else ""))},
                      sudo={head: sudo[head]}))
    steps.append(Step("supervisor-push", "supervisor", "put", (head,),
                      "put the head's plan (0600: it holds the files' bytes), the plan runner, its readiness probe and "
                      "its file writer",
                      changes="the supervisor's plan file, planrun.py, endpoint_probe.py and putfiles.py",
                      files={head: (FileRef(at(SUPERVISOR_PLAN), 0o600, _sha(plan_file)),
                                    FileRef(at(SUPERVISOR_PROBE), 0o644, _sha(handover.probe)),
                                    FileRef(at(SUPERVISOR_PUTFILES), 0o644, _sha(handover.putfiles)),
                                    FileRef(at(SUPERVISOR_RUNNER), 0o755, _sha(handover.runner)))},
                      sudo={head: sudo[head]}))
    branches: dict[str, tuple[Step, ...]] = {}
    if prev is not None:
        # Recorded before the supervisor starts, so its final record can never be overwritten by ours.
        switching = prev.with_state("switching", started_at,
                                    f"switching to {profile}: supervised on {head}, log {at(SUPERVISOR_LOG)}")
        steps.append(record_step(inv, "record-switching", "supervisor", head, switching,
                                 f"record that a supervised switch to {profile} runs"))
        branches["restore-record"] = (record_step(inv, "record-restore", "supervisor", head, prev,
                                                  f"record {prev.profile} serving, as before", on_fail="continue"),)
    launch = {head: launch_command(inv, head, holder, lock_nodes(mine))}
    steps.append(Step("launch", "supervisor", "run", (head,),
                      f"start the plan runner detached on {head} (setsid); it takes the node locks over and runs the "
                      "head's plan", changes="the supervisor's pid file, events and log; the lock's holder",
                      commands=launch, sudo={head: sudo[head]}, timeout_s=STARTED_WAIT_S + 15,
                      on_fail="restore-record" if prev is not None else "abort"))
    return replace(mine, op="switch --supervise", steps=tuple(steps), branches={**branches, **mine.branches})


def handover_document(inv: Inventory, head: str, plan: Plan, blobs: Mapping[str, str], addrs: Mapping[str, str],
                      ssh: Mapping[str, Sequence[str]], served_name: str, prev: RunRecord | None) -> bytes:
    """The plan file the runner executes: the plan, how to reach each node, the files' bytes (base64)."""
    nodes = {n: {"ssh": None if n == head else list(ssh[n]), "sudo": inv.node(n).sudo,
                 "fabric_address": None if n == head else addrs[n]} for n in inv.names}
    doc = {"version": 1, "head": head, "plan": plan.to_dict(), "nodes": nodes, "blobs": dict(blobs),
           "served_name": served_name,
           "previous": prev.profile if prev is not None and any(b == "rollback" or b.startswith("rollback-")
                                                              for b in plan.branches) else None,
           "previous_served_name": prev.served_name if prev is not None else None}
    return json.dumps(doc, sort_keys=True).encode()
