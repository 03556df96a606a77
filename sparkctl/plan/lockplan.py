"""The cluster lock as plan steps: take it first, release it last (branch ``finally``). Pure.

The lock is one ``mkdir`` on the head (the inventory's first node) with a
holder file inside. Every command the lock runs is fixed at planning time and
listed in its step; what varies from run to run (who holds it, since when)
travels on the command's stdin and is printed beside it, the way a ``put``
step's bytes travel beside its path:

* ``lock``: :data:`ACQUIRE_SCRIPT` (stdin: the holder line); when the lock is
  held, :data:`HOLDER_ALIVE_SCRIPT` asks the head whether a supervisor holder
  still runs, and a holder judged gone is broken by :data:`BREAK_SCRIPT`
  (stdin: the holder line judged, so only that lock goes);
* ``unlock``: :data:`RELEASE_SCRIPT` (stdin: this run's ``"run": TOKEN``),
  a no-op once the lock is someone else's (a supervisor it was handed to).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import LOCK_DIR, under
from sparkctl.plan.steps import FINALLY, Plan, Step

# One mkdir, then the holder file. A lock dir is only ever left without a holder by a
# process killed between the two; a failed write of the holder (a full disk) removes
# the dir again, so a full disk never leaves a lock.
ACQUIRE_SCRIPT = """\
d={d}
IFS= read -r info || true
mkdir -p {parent} || exit 3
if err=$(mkdir "$d" 2>&1); then
  if out=$( {{ printf '%s\\n' "$info" > "$d/holder"; }} 2>&1 ); then echo acquired; exit 0; fi
  rm -rf "$d"; echo "cannot write $d/holder: ${{out:-write error}}" >&2; exit 3
elif [ -d "$d" ]; then
  echo held; cat "$d/holder" 2>/dev/null; exit 0
fi
echo "$err" >&2; exit 3
"""

# Whether the holder recorded in the lock (a supervisor of `switch --supervise` on the head)
# still runs: its pid is alive and runs the plan runner. Reads only.
HOLDER_ALIVE_SCRIPT = (
    "d={d}; p=$(sed -n 's/.*\"pid\": *\\([0-9][0-9]*\\).*/\\1/p' \"$d/holder\" 2>/dev/null | head -n 1); "
    "if [ -n \"$p\" ] && [ -d \"/proc/$p\" ] && tr '\\000' ' ' < \"/proc/$p/cmdline\" 2>/dev/null | "
    "grep -qE 'supervisor|planrun'; then echo alive; else echo gone; fi")

# Break only the lock judged gone: the same holder line (stdin), renamed away in one step.
BREAK_SCRIPT = ("d={d}; IFS= read -r want || true; grep -qxF -- \"$want\" \"$d/holder\" 2>/dev/null && "
                "mv \"$d\" \"$d.stale.$$\" && rm -rf \"$d.stale.$$\"; true")

# Release only this run's lock (stdin: '"run": "TOKEN"', a part of the holder line).
RELEASE_SCRIPT = "d={d}; IFS= read -r run || true; grep -qF -- \"$run\" \"$d/holder\" 2>/dev/null && rm -rf \"$d\"; true"


def lock_dir(inv: Inventory) -> str:
    head = inv.nodes[0].name
    return under(inv.node(head).prefix, LOCK_DIR)


def run_marker(token: str) -> str:
    """The part of a holder line that names its run: what the release looks for."""
    return json.dumps({"run": token})[1:-1]


def lock_step(inv: Inventory, holder: Mapping[str, Any]) -> Step:
    """Take the lock; ``holder``: the holder file's fields (holder, since, operation, host, pid, run)."""
    head = inv.nodes[0].name
    d = lock_dir(inv)
    q = shlex.quote
    line = json.dumps(dict(holder))
    return Step("lock", "lock", "lock", (head,), "take the cluster lock (one mkdir on the head; a holder that "
                "is provably gone is broken)", changes=f"the lock {d} on {head}, held by this run",
                commands={head: ACQUIRE_SCRIPT.format(d=q(d), parent=q(d.rsplit("/", 1)[0] or "/"))},
                sudo={head: inv.node(head).sudo}, timeout_s=30,
                params={"stdin": {head: line}, "holder": dict(holder),
                        "holder_alive": {head: HOLDER_ALIVE_SCRIPT.format(d=q(d))},
                        "break_stale": {head: BREAK_SCRIPT.format(d=q(d))}})


def unlock_step(inv: Inventory, token: str) -> Step:
    head = inv.nodes[0].name
    d = lock_dir(inv)
    return Step("unlock", "unlock", "run", (head,), "release the cluster lock if this run still holds it",
                changes=f"the lock {d} on {head} removed", commands={head: RELEASE_SCRIPT.format(d=shlex.quote(d))},
                sudo={head: inv.node(head).sudo}, timeout_s=30, params={"stdin": {head: run_marker(token)}},
                on_fail="continue")


def with_lock(plan: Plan, inv: Inventory, holder: Mapping[str, Any]) -> Plan:
    """``plan`` between taking the lock (its first step) and releasing it (branch ``finally``)."""
    return replace(plan, steps=(lock_step(inv, holder), *plan.steps),
                   branches={**plan.branches, FINALLY: (unlock_step(inv, str(holder["run"])),)})
