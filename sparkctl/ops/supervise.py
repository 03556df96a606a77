"""``switch --supervise``: the switch plan, run on the head by ``sparkctl/remote/planrun.py``.

The operator's side takes the lock, runs the plan's first steps (the check and
the clock cap: they change no stack), then hands the rest of the SAME plan (its
steps and its rollback branch, as JSON, with the files' bytes in a 0600 blob
store) to the plan runner started detached on the head. The runner reaches its
peers by ssh over the fabric with a key of its own, takes the lock over, and
ends with the new stack serving (phase "done") or the previous one serving its
own name again (phase "rolled-back"). One switch/rollback logic, two places.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from sparkctl.errors import LifecycleError, Ref, SparkctlError
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    SUPERVISOR_EVENTS,
    SUPERVISOR_LOG,
    SUPERVISOR_PID,
    SUPERVISOR_PLAN,
    SUPERVISOR_PROBE,
    SUPERVISOR_RUNNER,
)
from sparkctl.model.profiles import Resolved
from sparkctl.model.resources import Roots
from sparkctl.model.stacks import stack_of
from sparkctl.ops.executor import (
    Progress,
    TransportBackend,
    _check_fn,
    add_wheel_blobs,
    lock_scope,
    plan_for,
    run_plan,
)
from sparkctl.ops.lock import (
    ClusterLock,
    head_node,
    node_path,
    node_sudo,
    now_iso,
    read_record,
    read_records,
    write_record,
)
from sparkctl.ops.nodessh import fabric_address_from, provision, ssh_argv  # noqa: F401 - re-exported
from sparkctl.plan import laws
from sparkctl.plan.steps import Plan
from sparkctl.transport import Transport

FINAL_PHASES = ("done", "rolled-back", "failed", "aborted")
# The steps the operator's side runs itself before the handover: they change no stack.
OPERATOR_PHASES = ("check", "clock")


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



def _provision_supervisor_ssh(inv: Inventory, transport: Transport, head: str, say: Progress) -> dict[str, str]:
    """The supervisor's key, authorized on every peer for the head (sparkctl.ops.nodessh, shared with image sync)."""
    addrs = provision(inv, transport, head, [n for n in inv.names if n != head])
    say("*", "supervisor-ssh", f"supervisor key authorized on {', '.join(addrs) or 'no peers'}; "
                               f"fabric host keys for {head} from verified connections")
    return addrs


def split_plan(plan: Plan) -> tuple[Plan, Plan]:
    """(what the operator runs, what the runner on the head runs): one plan, cut at the handover."""
    k = next((i for i, s in enumerate(plan.steps) if s.phase not in OPERATOR_PHASES), len(plan.steps))
    mine = replace(plan, steps=plan.steps[:k], branches={})
    theirs = replace(plan, op="switch --supervise", steps=plan.steps[k:])
    return mine, theirs


def switch_supervised(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
                      sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
                      secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
                      wait: bool = False, wait_timeout_s: float | None = None,
                      skip_check: bool = False) -> SupervisedSwitch:
    """Run the switch plan's check and clock here, then hand the rest of it to a runner on the head."""
    say = progress or (lambda *_: None)
    waivers = dict(waivers or {})
    head = head_node(inv)
    op = f"switch --supervise {res.name}"
    stack = stack_of(res)
    guard = None
    try:
        try:
            scope = lock_scope(res, inv, read_records(inv, transport))
        except SparkctlError as exc:
            raise exc.in_phase(op, "plan") from None
        guard = ClusterLock(inv, transport, op, nodes=scope)
        guard.acquire()
        plan, rendering, extra = plan_for("switch", res, inv, transport, roots, sets=sets, waivers=waivers,
                                          secrets=secrets, skip_check=skip_check, locked=scope)
        assert rendering is not None
        if rendering.layout.heads()[0].node != head:
            raise LifecycleError(f"{res.name} serves from {rendering.layout.heads()[0].node}, not from {head} "
                                 "where the supervisor runs", hint="use `switch` without --supervise")
        prev = read_record(inv, transport, stack)
        mine, theirs = split_plan(plan)
        backend = TransportBackend(inv, transport, say, rendering, extra,
                                   check=_check_fn(res, inv, transport, waivers, say))
        add_wheel_blobs(plan, backend)  # serve.gateway: the head's runner pushes them from the blob store
        state = run_plan(mine, backend)
        if state.result != "done":
            f = state.failed
            assert f is not None
            cause = f.cause if isinstance(f.cause, SparkctlError) else LifecycleError(f.detail, Ref(node=f.node))
            raise cause.in_phase(op, f.step["phase"])
        addrs = _provision_supervisor_ssh(inv, transport, head, say)
        doc = handover_document(inv, head, theirs, backend, addrs, res, prev)
        result = _launch(inv, transport, head, doc, prev, res.name, op, say, list(guard.dirs().values()))
    except SparkctlError as exc:
        raise exc.in_phase(op, "lock") if exc.phase is None and guard and not guard.held else exc from None
    finally:
        if guard:
            guard.release()  # a no-op once the supervisor holds the lock: the holder is no longer us
    if not wait:
        return result
    return _follow(inv, transport, result, say, wait_timeout_s or (res.profile.serve.ready_timeout_s * 2 + 120))


def handover_document(inv: Inventory, head: str, plan: Plan, backend: TransportBackend, addrs: Mapping[str, str],
                      res: Resolved, prev: Any) -> dict[str, Any]:
    """The plan file the runner executes: the plan, how to reach each node, the files' bytes (0600 on the head)."""
    if prev is not None and "rollback" in plan.branches:
        rb = plan.branches["rollback"]
        rec = dict(rb[-1].params["record"], note="rolled back by supervisor")
        plan = replace(plan, branches={**plan.branches, "rollback": (*rb[:-1], replace(rb[-1], params={
            **rb[-1].params, "record": rec}))})
    blobs: dict[str, str] = {}
    import hashlib

    for sha, data in backend.blobs.items():
        assert hashlib.sha256(data).hexdigest() == sha
        blobs[sha] = base64.b64encode(data).decode()
    nodes = {n: {"ssh": None if n == head else ssh_argv(inv, head, n, addrs[n]), "sudo": node_sudo(inv, n),
                  "fabric_address": None if n == head else addrs[n]} for n in inv.names}
    return {"version": 1, "head": head, "plan": plan.to_dict(), "nodes": nodes, "blobs": blobs,
            "served_name": res.profile.model.served_name,
            "previous": prev.profile if prev is not None and "rollback" in plan.branches else None,
            "previous_served_name": prev.served_name if prev is not None else None}


def _launch(inv: Inventory, transport: Transport, head: str, doc: Mapping[str, Any], prev: Any, profile: str,
            op: str, say: Progress, lock_dirs: Sequence[str]) -> SupervisedSwitch:
    hs = node_sudo(inv, head)
    remote = resources.files("sparkctl.remote")
    for path, data, mode in ((SUPERVISOR_PLAN, json.dumps(doc, sort_keys=True).encode(), 0o600),
                             (SUPERVISOR_PROBE, remote.joinpath("endpoint_probe.py").read_bytes(), 0o644),
                             (SUPERVISOR_RUNNER, remote.joinpath("planrun.py").read_bytes(), 0o755)):
        r = transport.put(head, node_path(inv, head, path), data, mode, sudo=hs)
        if not r.ok:
            raise LifecycleError(f"cannot write {path} on {head}: {r.error or r.stderr.strip()}", Ref(node=head))
    q = shlex.quote
    events, log = node_path(inv, head, SUPERVISOR_EVENTS), node_path(inv, head, SUPERVISOR_LOG)
    # the runner adds its pid and "supervisor pid N on HEAD": what the lock's stale check looks for
    holder = {"since": now_iso(), "operation": op, "host": head}
    argv = ["python3", node_path(inv, head, SUPERVISOR_RUNNER), "supervise", node_path(inv, head, SUPERVISOR_PLAN),
            events, node_path(inv, head, SUPERVISOR_PID), json.dumps(list(lock_dirs)), json.dumps(holder)]
    launch = (f"mkdir -p {q(log.rsplit('/', 1)[0])} && : > {q(events)} && "
              f"setsid {' '.join(q(a) for a in argv)} </dev/null >>{q(log)} 2>&1 & echo \"pid:$!\"")
    # Recorded before the supervisor starts, so its final record can never be overwritten by ours.
    if prev:
        write_record(inv, transport, prev.with_state(
            "switching", now_iso(), f"switching to {profile}: supervised on {head}, log {log}"))
    r = transport.run(head, launch, sudo=hs)
    pid = next((int(x[4:]) for x in r.stdout.split() if x.startswith("pid:") and x[4:].isdigit()), 0)
    if not r.ok or not pid:
        if prev:
            write_record(inv, transport, prev)
        raise LifecycleError(f"cannot start the supervisor on {head}: {r.error or r.stderr.strip()}", Ref(node=head))
    t0 = time.monotonic()
    while True:
        evs = read_supervisor_events(inv, transport)
        first = next((e for e in evs if e.get("phase") == "started"), None)
        if first is not None:
            pid = int(first.get("pid") or pid)
            break
        if time.monotonic() - t0 > 15:
            raise LifecycleError(f"the supervisor (pid {pid}) on {head} did not start", Ref(node=head),
                                 hint=f"see {log} on {head}")
        time.sleep(0.2)
    say(head, "supervisor", f"pid {pid} switches to {profile}; progress in {events}")
    return SupervisedSwitch(profile, prev.profile if prev else None, head, pid, log, events)


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
