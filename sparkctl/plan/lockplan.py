"""The node locks as plan steps: take them first, release them last (branch ``finally``). Pure.

A lock is one ``mkdir`` per node (``locks/<node>.d`` on the state node, the
inventory's first node) with a holder file inside; an operation locks exactly
the nodes it may change (its scope: ``up``/``switch`` of a stack its layout's
nodes and its own live stack's; ``down --stack`` that stack's; ``fabric
apply``, ``image sync``, a plain ``down`` every node), all of them in one
script, all or nothing. ``up``/``switch`` also claim the served name they will
serve (``locks/name-<sha>.d``, scope key ``name:NAME``): two stacks on disjoint
nodes cannot both start serving one name: while the first runs, the second is
refused (``LockHeld``, naming the holder); run again, its planner reads the
first's record under the lock and refuses the name (``StackConflict``). Every command the lock runs is fixed at planning time
and listed in its step (the scope's dirs are in the script); what varies from
run to run (who holds it, since when) travels on the command's stdin and is
printed beside it, the way a ``put`` step's bytes travel beside its path:

* ``lock``: :data:`ACQUIRE_SCRIPT` (stdin: the holder line); when a dir is
  held, it prints that dir and its holder line, and removes the dirs this run
  made (a refused attempt holds nothing). :data:`HOLDER_ALIVE_SCRIPT` (stdin:
  that holder line) asks the head whether a supervisor holder still runs, and
  a holder judged gone is broken by :data:`BREAK_SCRIPT` (stdin: the holder
  line judged, so only that holder's dirs go);
* ``unlock``: :data:`RELEASE_SCRIPT` (stdin: this run's ``"run": TOKEN``):
  exactly the scope's dirs this run still holds, a no-op for a dir that is
  someone else's (a supervisor it was handed to);
* ``sparkctl unlock`` (:func:`unlock_plan`, printed by ``sparkctl plan unlock``):
  :data:`UNLOCK_SCRIPT` removes the scope's dirs whoever holds them, each
  holder printed first: the recovery from a holder that is gone.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import LOCK_DIR, LOCKS_DIR, NAME_KEY, name_lock_dir, node_lock_dir, under
from sparkctl.model.profiles import Resolved
from sparkctl.plan.steps import FINALLY, Plan, Step

# One mkdir per node, in inventory order, then each holder file. A dir already there
# stops it: the dirs this run made are removed again (only those whose holder line is
# ours), so a refused acquisition holds nothing. A lock dir is only ever left without
# a holder by a process killed between mkdir and the write; a failed write of the
# holder (a full disk) removes what this run made, so a full disk never leaves a lock.
ACQUIRE_SCRIPT = """\
IFS= read -r info || true
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

# Whether the holder on stdin (a supervisor of `switch --supervise` on the head) still runs:
# its pid is alive and runs the plan runner. Reads only.
HOLDER_ALIVE_SCRIPT = (
    "IFS= read -r info || true; p=$(printf '%s\\n' \"$info\" | sed -n 's/.*\"pid\": *\\([0-9][0-9]*\\).*/\\1/p' "
    "| head -n 1); "
    "if [ -n \"$p\" ] && [ -d \"/proc/$p\" ] && tr '\\000' ' ' < \"/proc/$p/cmdline\" 2>/dev/null | "
    "grep -qE 'supervisor|planrun'; then echo alive; else echo gone; fi")

# Break only the locks of the holder judged gone: the same holder line (stdin), each dir
# renamed away in one step.
BREAK_SCRIPT = ("IFS= read -r want || true; for d in {dirs}; do grep -qxF -- \"$want\" \"$d/holder\" 2>/dev/null && "
                "mv \"$d\" \"$d.stale.$$\" && rm -rf \"$d.stale.$$\"; done; true")

# Release only this run's locks (stdin: '"run": "TOKEN"', a part of the holder line).
RELEASE_SCRIPT = ("IFS= read -r run || true; for d in {dirs}; do grep -qF -- \"$run\" \"$d/holder\" 2>/dev/null "
                  "&& rm -rf \"$d\"; done; true")

# `sparkctl unlock`: whoever holds them (a process that is gone), each dir's holder printed, then the dir removed.
UNLOCK_SCRIPT = 'for d in {dirs}; do [ -d "$d" ] || continue; cat "$d/holder" 2>/dev/null; rm -rf "$d"; done; true'


def lock_dirs(inv: Inventory, nodes: Sequence[str] | None = None) -> dict[str, str]:
    """key -> its lock dir on the state node: each node in inventory order (every node when ``nodes``
    is None), then each served name the scope claims (its ``name:NAME`` keys, :data:`NAME_KEY`)."""
    head = inv.nodes[0].name
    want = set(inv.names if nodes is None else nodes)
    out = {n: under(inv.node(head).prefix, node_lock_dir(n)) for n in inv.names if n in want}
    for k in nodes or ():
        if k.startswith(NAME_KEY):
            out[k] = under(inv.node(head).prefix, name_lock_dir(k[len(NAME_KEY):]))
    return out


def name_claim(res: Resolved) -> list[str]:
    """The served name ``up``/``switch`` of ``res`` claims for the run (a scope key ``name:NAME``):
    another stack's ``up`` on other nodes cannot start serving it meanwhile. None for a declared
    shared name (topology.shared_name: several stacks serve it on purpose)."""
    p = res.profile
    return [] if p.topology.shared_name else [f"{NAME_KEY}{p.model.served_name}"]


def claimed_name(key: str) -> str | None:
    """The served name of a scope key ``name:NAME``; None for a node."""
    return key[len(NAME_KEY):] if key.startswith(NAME_KEY) else None


def _dirs(inv: Inventory, nodes: Sequence[str] | None) -> str:
    return " ".join(shlex.quote(d) for d in lock_dirs(inv, nodes).values())


def run_marker(token: str) -> str:
    """The part of a holder line that names its run: what the release looks for."""
    return json.dumps({"run": token})[1:-1]


def _what(inv: Inventory, nodes: Sequence[str] | None) -> str:
    scope = [k for k in lock_dirs(inv, nodes) if claimed_name(k) is None]
    names = [repr(claimed_name(k)) for k in lock_dirs(inv, nodes) if claimed_name(k) is not None]
    what = "every node" if scope == list(inv.names) else ", ".join(scope)
    return what + (f" and the served name {', '.join(names)}" if names else "")


def lock_step(inv: Inventory, holder: Mapping[str, Any], nodes: Sequence[str] | None = None) -> Step:
    """Lock ``nodes`` (every node when None); ``holder``: the holder file's fields
    (holder, since, operation, host, pid, run)."""
    head = inv.nodes[0].name
    q = shlex.quote
    dirs = _dirs(inv, nodes)
    line = json.dumps(dict(holder))
    return Step("lock", "lock", "lock", (head,), f"lock {_what(inv, nodes)} (one mkdir per node on {head}, all or "
                "none; a holder that is provably gone is broken)",
                changes=f"the locks of {_what(inv, nodes)} on {head}, held by this run",
                commands={head: ACQUIRE_SCRIPT.format(parent=q(under(inv.node(head).prefix, LOCKS_DIR)),
                                                      dirs=dirs)},
                sudo={head: inv.node(head).sudo}, timeout_s=30,
                params={"stdin": {head: line}, "holder": dict(holder), "nodes": list(lock_dirs(inv, nodes)),
                        "holder_alive": {head: HOLDER_ALIVE_SCRIPT},
                        "break_stale": {head: BREAK_SCRIPT.format(dirs=dirs)}})


def unlock_step(inv: Inventory, token: str, nodes: Sequence[str] | None = None) -> Step:
    """Release the locks of ``nodes`` (every node when None) this run (``token``) still holds."""
    head = inv.nodes[0].name
    return Step("unlock", "unlock", "run", (head,), f"release the locks of {_what(inv, nodes)} this run still holds",
                changes=f"the locks of {_what(inv, nodes)} on {head} removed",
                commands={head: RELEASE_SCRIPT.format(dirs=_dirs(inv, nodes))},
                sudo={head: inv.node(head).sudo}, timeout_s=30, params={"stdin": {head: run_marker(token)}},
                on_fail="continue")


def with_lock(plan: Plan, inv: Inventory, holder: Mapping[str, Any], nodes: Sequence[str] | None = None) -> Plan:
    """``plan`` between locking ``nodes`` (its first step) and releasing them (branch ``finally``)."""
    return replace(plan, steps=(lock_step(inv, holder, nodes), *plan.steps),
                   branches={**plan.branches, FINALLY: (unlock_step(inv, str(holder["run"]), nodes),)})


def unlock_plan(inv: Inventory, nodes: Sequence[str] | None = None) -> Plan:
    """``sparkctl unlock``: remove the locks of ``nodes`` whoever holds them; with None every node's,
    every served name's claim (``locks/name-*.d``: the names are hashed, so a glob) and the one
    cluster lock of a sparkctl before stacks. The step's output is the holders it removed."""
    head = inv.nodes[0].name
    prefix = inv.node(head).prefix
    dirs = [shlex.quote(d) for d in lock_dirs(inv, nodes).values()]
    what = _what(inv, nodes)
    if nodes is None:
        dirs += [shlex.quote(under(prefix, LOCK_DIR)), shlex.quote(under(prefix, LOCKS_DIR)) + "/name-*.d"]
        what += " and every served name's claim"
    step = Step("break-locks", "unlock", "run", (head,), f"remove the locks of {what} on {head}, whoever holds them "
                "(each holder printed)", changes=f"the locks of {what} on {head} removed",
                commands={head: UNLOCK_SCRIPT.format(dirs=" ".join(dirs))}, sudo={head: inv.node(head).sudo},
                timeout_s=30)
    return Plan("unlock", None, (step,))
