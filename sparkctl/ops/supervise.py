"""``switch --supervise``: the switch plan, handed to ``sparkctl/remote/planrun.py`` on the head.

The operator's side takes the lock (the plan's first step), reads and plans,
then runs its part of the plan (:mod:`sparkctl.plan.supervised`): the check and
the clock cap, the supervisor's key grant on the peers, the push of the head's
plan and its runner, the "switching" record and the runner's launch. The rest of
the SAME plan (its steps and its rollback branch, as JSON, with the files' bytes
in a 0600 blob store) runs on the head: the runner reaches its peers by ssh over
the fabric with a key of its own, takes the lock over, and ends with the new
stack serving (phase "done") or the previous one serving its own name again
(phase "rolled-back"). One switch/rollback logic, two places. ``sparkctl plan
switch --supervise`` prints both parts (:func:`plan_supervised`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from sparkctl.errors import LifecycleError, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import SUPERVISOR_EVENTS, SUPERVISOR_LOG, SUPERVISOR_PID
from sparkctl.model.profiles import Resolved
from sparkctl.model.resources import Roots
from sparkctl.model.stacks import stack_of
from sparkctl.ops import nodessh
from sparkctl.ops.executor import (
    Progress,
    TransportBackend,
    add_wheel_blobs,
    check_step,
    plan_for,
    plan_under_lock,
    planned_scope,
    raise_failure,
    run_plan,
    take_lock,
)
from sparkctl.ops.lock import head_node, holder_info, node_path, now_iso, read_record
from sparkctl.plan import laws, supervised
from sparkctl.plan.render import Rendering
from sparkctl.plan.steps import Plan
from sparkctl.transport import Transport

# "left-degraded" (not "degraded": that is a step phase of its branches): a rolling switch's way back
# failed part way, or a resumed one's replica did not come up; the record says which head serves
# which profile (planrun.supervise, exit 8 there)
FINAL_PHASES = ("done", "rolled-back", "left-degraded", "failed", "aborted")


@dataclass(frozen=True)
class SupervisedSwitch:
    profile: str
    previous: str | None
    head: str
    pid: int
    log: str
    events_path: str
    events: tuple[dict[str, Any], ...] = ()  # with --wait: every event, the last one final

    @property
    def phase(self) -> str:
        return self.events[-1].get("phase", "") if self.events else "started"


@dataclass(frozen=True)
class SupervisedPlan:
    operator: Plan  # what this side runs
    head: Plan  # what the runner on the head runs
    rendering: Rendering
    extra: tuple[Rendering, ...]
    previous: Any  # the record read before planning (None: nothing serves)
    addrs: Mapping[str, str]  # peer -> the fabric address the head reaches it at
    handover: supervised.Handover
    blobs: Mapping[str, bytes]  # sha256 -> bytes of what the operator's put steps write


def _blobs(renderings: Sequence[Rendering], plan: Plan) -> dict[str, str]:
    """The bytes the head's plan writes, by sha256: the renderings' files (the gateway's too) and
    the pinned wheels its put steps push (serve.gateway)."""
    raw = {f.sha256: f.text.encode() for rd in renderings for files in (*rd.files.values(), *rd.aux.values())
           for f in files.values()}
    add_wheel_blobs(plan, raw)
    return {sha: base64.b64encode(data).decode() for sha, data in raw.items()}


def plan_supervised(res: Resolved, inv: Inventory, transport: Transport | None, roots: Roots, *,
                    sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
                    secrets: Mapping[str, str] | None = None, skip_check: bool = False,
                    holder: Mapping[str, Any] | None = None, locked: Sequence[str] | None = None
                    ) -> SupervisedPlan:
    """Read the facts (the record, the engines, the peers' host keys over verified SSH) and plan
    both parts. Changes nothing on any host (the supervisor's key pair is made here, once, locally).
    ``locked``: the nodes the caller holds the locks of (its stack's): the runner is handed every one."""
    head = head_node(inv)
    holder = dict(holder or holder_info(f"switch --supervise {res.name}"))
    plan, rendering, extra = plan_for("switch", res, inv, transport, roots, sets=sets, waivers=waivers,
                                      secrets=secrets, skip_check=skip_check, holder=holder, locked=locked,
                                      rollback_note=supervised.ROLLBACK_NOTE)
    assert rendering is not None
    if rendering.layout.heads()[0].node != head:
        raise LifecycleError(f"{res.name} serves from {rendering.layout.heads()[0].node}, not from {head} "
                             "where the supervisor runs", hint="use `switch` without --supervise")
    prev = read_record(inv, transport, stack_of(res)) if transport is not None else None
    prev = prev if prev is not None and prev.state == "serving" and prev.profile != res.name else None
    peers = tuple(n for n in inv.names if n != head)
    addrs = {n: nodessh.fabric_address_from(inv, head, n) for n in peers}
    key, pub = nodessh.local_key(inv)
    known = nodessh.known_hosts(inv, transport, head, list(peers)) if transport is not None else None
    remote = resources.files("sparkctl.remote")
    hand = supervised.Handover(head, peers, nodessh.grant_line(inv, head, pub), key, known,
                               remote.joinpath("planrun.py").read_bytes(),
                               remote.joinpath("endpoint_probe.py").read_bytes(),
                               remote.joinpath("putfiles.py").read_bytes())
    mine, theirs = supervised.split(plan)
    theirs = supervised.head_plan(theirs, inv, holder, supervised.lock_nodes(plan))
    doc = supervised.handover_document(inv, head, theirs, _blobs([rendering, *extra], theirs), addrs,
                                       {n: nodessh.ssh_argv(inv, head, n, addrs[n]) for n in peers},
                                       res.profile.model.served_name, prev)
    operator = supervised.operator_plan(mine, inv, hand, doc, prev, res.name, holder, now_iso())
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (doc, key, known or b"", hand.runner, hand.probe,
                                                      hand.putfiles)}
    return SupervisedPlan(operator, theirs, rendering, extra, prev, addrs, hand, blobs)


def switch_supervised(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
                      sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
                      secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
                      wait: bool = False, wait_timeout_s: float | None = None,
                      skip_check: bool = False) -> SupervisedSwitch:
    """Run the operator's part of the supervised switch plan; the runner on the head runs the rest."""
    say = progress or (lambda *_: None)
    head = head_node(inv)
    op = f"switch --supervise {res.name}"
    scope = planned_scope(op, res, inv, transport)
    holder = take_lock(inv, transport, op, say, scope)
    sp = plan_under_lock(op, inv, transport, holder, say, lambda: plan_supervised(
        res, inv, transport, roots, sets=sets, waivers=dict(waivers or {}), secrets=secrets,
        skip_check=skip_check, holder=holder, locked=scope), scope)
    backend = TransportBackend(inv, transport, say, sp.rendering, sp.extra,
                               check=check_step(inv, transport, roots, say))
    backend.blobs.update(sp.blobs)
    nodessh.forget(inv, head)  # until the files are all written, nothing is vouched for
    state = run_plan(sp.operator, backend, done=("lock",))
    if state.result != "done":
        raise_failure(state, op)
    nodessh.remember(inv, head, list(sp.addrs), sp.handover.known_hosts or b"", nodessh.SUPERVISOR,
                     sp.handover.grant_line)
    say("*", "supervisor-ssh", f"supervisor key authorized on {', '.join(sp.addrs.values()) or 'no peers'}; "
                               f"fabric host keys for {head} from verified connections")
    result = _started(inv, transport, head, state, sp, res.name, say)
    if not wait:
        return result
    return _follow(inv, transport, result, say, wait_timeout_s or (res.profile.serve.ready_timeout_s * 2 + 120))


def _started(inv: Inventory, transport: Transport, head: str, state: Any, sp: SupervisedPlan, profile: str,
             say: Progress) -> SupervisedSwitch:
    """The launch step waited for the runner's "started" line; its pid, from that line (a read)."""
    out = state.outputs.get("launch", {}).get(head, "")
    pid = next((int(x[4:]) for x in out.split() if x.startswith("pid:") and x[4:].isdigit()), 0)
    first = next((e for e in read_supervisor_events(inv, transport) if e.get("phase") == "started"), None)
    if first is not None:
        pid = int(first.get("pid") or pid)
    events, log = node_path(inv, head, SUPERVISOR_EVENTS), node_path(inv, head, SUPERVISOR_LOG)
    say(head, "supervisor", f"pid {pid} switches to {profile}; progress in {events}")
    return SupervisedSwitch(profile, sp.previous.profile if sp.previous else None, head, pid, log, events)


def _follow(inv: Inventory, transport: Transport, result: SupervisedSwitch, say: Progress,
            timeout_s: float) -> SupervisedSwitch:
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        evs = read_supervisor_events(inv, transport)
        for e in evs[seen:]:
            say(e.get("node", "*"), e.get("phase", "?"), e.get("message", ""))
        seen = len(evs)
        if evs and evs[-1].get("phase") in FINAL_PHASES:
            return replace(result, events=tuple(evs))
        time.sleep(0.5)
    raise LifecycleError(f"the supervisor on {result.head} did not finish in time", Ref(node=result.head),
                         hint="`sparkctl status` shows its progress; it keeps going without you")


def read_supervisor_events(inv: Inventory, transport: Transport, tail: int | None = None) -> list[dict[str, Any]]:
    head = head_node(inv)
    path = shlex.quote(node_path(inv, head, SUPERVISOR_EVENTS))
    cmd = f"tail -n {int(tail)} {path} 2>/dev/null || true" if tail else f"cat {path} 2>/dev/null || true"
    r = transport.run(head, cmd)
    out = []
    for line in r.stdout.splitlines() if r.ok else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def supervisor_progress(inv: Inventory, transport: Transport, tail: int = 10) -> dict[str, Any] | None:
    """The supervisor's last events and whether it still runs; None when there never was one."""
    head = head_node(inv)
    q = shlex.quote
    ev, pidf = node_path(inv, head, SUPERVISOR_EVENTS), node_path(inv, head, SUPERVISOR_PID)
    r = transport.run(head, f"[ -e {q(ev)} ] || exit 0; echo exists; p=$(cat {q(pidf)} 2>/dev/null); echo \"pid:$p\"; "
                            f"if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then echo alive; fi; "
                            f"tail -n {int(tail)} {q(ev)}")
    if not r.ok or "exists" not in r.stdout.splitlines()[:1]:
        return None
    lines = r.stdout.splitlines()
    pid = next((ln[4:] for ln in lines if ln.startswith("pid:")), "")
    events = []
    for ln in lines:
        if ln.startswith("{"):
            try:
                events.append(json.loads(ln))
            except ValueError:
                pass
    return {"head": head, "pid": int(pid) if pid.isdigit() else None, "alive": "alive" in lines[:3],
            "phase": events[-1].get("phase") if events else None, "events": events,
            "log": node_path(inv, head, SUPERVISOR_LOG)}
