"""up, down, switch: read the facts, plan, run exactly the plan. The only code that changes hosts this way.

Every operation is three stages, the pyinfra way: gather (the run record, which
engines run, whether the endpoint serves), plan (``sparkctl.plan.planner``,
pure), execute (``sparkctl.remote.planrun.execute`` with sparkctl's transport
as its backend). ``sparkctl plan`` stops after the second stage and prints
what the third would run. The record lists the steps that ran and how they
ended. Never half-up: the plan's failure branches stop what a run started (and
``switch`` brings the previous stack back); Ctrl-C stops and never rolls back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NoReturn, TypeVar

from sparkctl.errors import CheckFailed, ConfigError, Interrupted, LifecycleError, LockHeld, Ref, SparkctlError, SwitchDegraded
from sparkctl.facts.registry import ProbeParseError
from sparkctl.facts.system import parse_meminfo
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import bind, profile_ref
from sparkctl.model.paths import DEFAULT_STACK
from sparkctl.model.profiles import Resolved, resolve
from sparkctl.model.record import RunRecord, operator_route
from sparkctl.model.resources import Roots
from sparkctl.model.stacks import model_identity, refusal, stack_of
from sparkctl.ops import readiness
from sparkctl.ops.check import check_probes, run_check
from sparkctl.ops.localstate import write_json
from sparkctl.ops.lock import holder_info, local_record_path, now_iso, read_record, read_records, take, write_verdicts
from sparkctl.plan import gatewayplan, laws, lockplan, planner, resumeplan
from sparkctl.plan.render import Rendering, render
from sparkctl.plan.steps import FINALLY, Plan
from sparkctl.remote import planrun
from sparkctl.remote.endpoint_probe import probe_endpoint
from sparkctl.transport import CommandResult, Transport

Progress = Callable[[str, str, str], None]  # (node or "*", phase, message)
T = TypeVar("T")


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    seconds: float


@dataclass(frozen=True)
class UpResult:
    profile: str
    action: str  # started | restarted | noop
    record: RunRecord | None
    phases: tuple[PhaseTime, ...]
    check: Any | None
    ready_s: float = 0.0  # time spent waiting for the engine (not sparkctl's own overhead)
    restarted_nodes: tuple[str, ...] = ()
    steps: tuple[dict[str, Any], ...] = ()  # every step that ran: id, phase, ok, seconds, detail


@dataclass(frozen=True)
class DownResult:
    stopped: tuple[str, ...]
    leftovers: Mapping[str, str]  # node -> processes or ports still there
    leaks: Mapping[str, float]  # node -> GiB held with no engine
    clocks_reset: tuple[str, ...] = ()
    steps: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class SwitchResult:
    serving: str  # the profile serving now
    switched: bool
    rolled_back: bool
    downtime_s: float
    error: str = ""
    up: UpResult | None = None


# --------------------------------------------------------------------------- the backend


def _res(r: CommandResult) -> dict[str, Any]:
    return {"ok": r.ok, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr, "error": r.error or ""}


class TransportBackend:
    """What ``planrun.execute`` needs, done with sparkctl's transport from the operator's side."""

    def __init__(self, inv: Inventory, transport: Transport, say: Progress, rendering: Rendering | None = None,
                 extra: Sequence[Rendering] = (), check: Callable[[Mapping[str, Any]], Any] | None = None) -> None:
        """``check``: runs a plan's check step (:func:`check_step`), given the step."""
        self.inv, self.transport, self.say, self._check = inv, transport, say, check
        self.blobs: dict[str, bytes] = {}  # by sha256: two renderings (new and previous) never collide
        for rd in [r for r in (rendering, *extra) if r is not None]:
            for files in (*rd.files.values(), *rd.aux.values()):
                for f in files.values():
                    self.blobs[f.sha256] = f.text.encode()
        self.check_report: Any = None

    def emit(self, node: str, phase: str, message: str) -> None:
        self.say(node, phase, message)

    now = staticmethod(now_iso)
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool,
              api_key: Mapping[str, str] | None = None, via: str | None = None) -> tuple[bool, str]:
        key = readiness.api_key_from_env(api_key) if api_key else None
        if not via:
            return probe_endpoint(url, served_name, metric, smoke=smoke, api_key=key)
        return readiness.probe_via(self.transport, via, url, served_name, metric, smoke=smoke, api_key=key)

    def run_all(self, commands: Mapping[str, str], sudo: Mapping[str, bool], timeout_s: float | None,
                stdin: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """One fan-out, each node with its own sudo (nodes with and without sudo run together)."""
        if not stdin:
            results = self.transport.run_all(commands, sudo={n: bool(sudo.get(n, False)) for n in commands},
                                             timeout_s=timeout_s)
            return {n: _res(r) for n, r in results.items()}
        with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
            futs = {n: pool.submit(self.transport.run, n, c, sudo=bool(sudo.get(n, False)), timeout_s=timeout_s,
                                   stdin=stdin.get(n)) for n, c in commands.items()}
            return {n: _res(f.result()) for n, f in futs.items()}

    def put_all(self, files: Mapping[str, Sequence[Mapping[str, Any]]], sudo: Mapping[str, bool]
                ) -> dict[str, dict[str, Any]]:
        items = {n: [(f["path"], self.blobs[f["sha256"]], int(f["mode"], 8)) for f in fs] for n, fs in files.items()}
        results = self.transport.put_all(items, sudo={n: bool(sudo.get(n, False)) for n in items})
        return {n: _res(r) for n, r in results.items()}

    def write_record(self, node: str, path: str, data: Mapping[str, Any], sudo: bool,
                     remove_on_failure: str | None) -> dict[str, Any]:
        """Atomic on the head and in the local cache; a record that cannot be written and claims
        nothing serves is removed instead, by the step's listed command (no record also claims
        nothing serves)."""
        write_json(local_record_path(self.inv, str(data.get("stack") or DEFAULT_STACK)), dict(data))
        blob = json.dumps(data, indent=2, sort_keys=True).encode() + b"\n"
        r = self.transport.put(node, path, blob, 0o644, sudo=sudo)
        if not r.ok and data.get("state") != "serving" and remove_on_failure:
            self.transport.run(node, remove_on_failure, sudo=sudo)
        return _res(r)

    def leaks(self, results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, r in results.items():
            if not r["ok"]:
                continue
            try:
                m = parse_meminfo(r["stdout"])
            except ProbeParseError:
                continue
            held = (m.total_kib - m.available_kib) / 1024 / 1024
            if held > laws.LEAK_THRESHOLD_GIB:
                out[n] = held
        return out

    def check(self, step: Mapping[str, Any]) -> str:
        if self._check is None:
            raise LifecycleError("this plan has a check step but no check was given")
        self.check_report = self._check(step)
        return "laws hold"

    def lock(self, step: Mapping[str, Any]) -> str:
        return take(self.inv, self.transport, step)


# --------------------------------------------------------------------------- gather, plan


def gather_up_facts(res: Resolved, inv: Inventory, transport: Transport, rendering: Rendering) -> planner.UpFacts:
    """The records (its own stack's and the others'), which engines run, whether the heads
    serve the name: what ``up`` plans from."""
    records = read_records(inv, transport)
    stack = stack_of(res)
    prev = records.get(stack)
    others = tuple(r for s, r in records.items() if s != stack)
    lay = rendering.layout
    if prev and prev.state == "degraded":  # which of its replicas of this profile still serve (the resume keeps those)
        mine = {h: (int(r.get("port", prev.port)), list(r.get("nodes", ()))) for h, r in prev.replicas.items()
                if r.get("profile") == res.name}
    elif prev and prev.profile == res.name and prev.state == "serving":
        mine = {h.node: (res.profile.serve.port, list(lay.nodes)) for h in lay.heads()}
    else:
        return planner.UpFacts(prev, others=others)
    cmds = {n: planner.ALIVE_COMMAND for _, ns in mine.values() for n in ns}
    alive = {n: (r.ok and "alive" in r.stdout) for n, r in transport.run_all(cmds).items()} if cmds else {}
    key = readiness.operator_key(res.profile.serve.api_key_env).key  # a served endpoint with a key answers 401 without
    serving = tuple(h for h, (port, ns) in mine.items() if all(alive.get(n) for n in ns) and readiness.probe_route(
        transport, operator_route(h, inv.node(h).host, prev.listen.get(h), port), res.profile.model.served_name,
        None, smoke=False, api_key=key)[0])
    if prev.state == "degraded":
        return planner.UpFacts(prev, alive, False, others=others, serving=serving)
    return planner.UpFacts(prev, alive, all(alive.values()) and len(serving) == len(mine), others=others)


def _previous(prev: RunRecord | None, res: Resolved, inv: Inventory, roots: Roots,
              secrets: Mapping[str, str]) -> tuple[Resolved, Rendering] | None:
    """The way back's profile: the serving stack's, or a degraded record's other (``resumeplan.other_profile``)."""
    if prev is not None and prev.state == "degraded":
        if (other := resumeplan.other_profile(prev, res.name)) is None:
            return None
        name, sets = other
    elif not prev or prev.state != "serving" or prev.profile == res.name:
        return None
    else:
        name, sets = prev.profile, prev.sets
    try:
        prev_res = resolve(name, roots, sets)
    except SparkctlError:
        return None  # its profile is gone: nothing to roll back to
    return prev_res, render(prev_res, inv, roots, secrets, reveal_secrets=True)


def down_scope(inv: Inventory, records: Mapping[str, RunRecord], stack: str | None
               ) -> tuple[list[RunRecord], list[str] | None]:
    """What ``down`` stops: every record and every node (``stack`` None), or one stack's record
    and nodes (``down --stack``: the other stacks keep serving)."""
    if stack is None:
        return list(records.values()), None
    rec = records.get(stack)
    if rec is None:
        raise ConfigError(f"--stack {stack}: no such stack on this cluster",
                          hint=f"stacks: {', '.join(records) or 'none'} (`sparkctl status` lists them)")
    return [rec], list(rec.nodes)


def lock_scope(res: Resolved, inv: Inventory, records: Mapping[str, RunRecord]) -> list[str]:
    """The nodes ``up``/``switch`` of ``res`` locks: its layout's and its stack's previous ones, then
    the served name it claims (:func:`sparkctl.plan.lockplan.name_claim`).

    Refuses first (nothing locked, nothing changed) a profile whose nodes or served name
    another live stack holds; the planner judges the same again under the lock."""
    lay = bind(res, inv)
    stack = stack_of(res)
    p = res.profile
    why = refusal(stack, lay.nodes, p.model.served_name, model_identity(res), p.topology.shared_name,
                  [r for s, r in records.items() if s != stack], ref=profile_ref(res, "topology.nodes"))
    if why is not None:
        raise why
    prev = records.get(stack)
    nodes = list(lay.nodes)
    if prev is not None and prev.live:
        nodes += [n for n in prev.nodes if n not in nodes]
    return [n for n in inv.names if n in nodes] + lockplan.name_claim(res)


def gather_gateway(res: Resolved, inv: Inventory, transport: Transport | None, roots: Roots,
                   secrets: Mapping[str, str]) -> tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts] | None:
    """serve.gateway: its setup for the node's platform and what its node holds now. Changes nothing.

    Refuses, before any step, a node that cannot take it (no python3, no pinned wheel for its
    interpreter, too little disk): one line, nothing changed."""
    if not res.profile.serve.gateway.enabled:
        return None
    node = gatewayplan.gateway_node(res, inv)
    if transport is None:  # --assume-fresh: a DGX Spark's interpreter, nothing installed
        setup = gatewayplan.render_gateway(res, inv, roots, secrets, None, reveal_secrets=True)
        return setup, gatewayplan.GatewayFacts(setup.platform, None, {}, {}, False)
    # sudo: the env file is 0600 root; its hash decides whether the gateway restarts
    r = transport.run(node, gatewayplan.facts_command(inv, node), sudo=inv.node(node).sudo, timeout_s=30)
    if not r.ok:
        raise LifecycleError(f"cannot read the gateway's node {node}: {r.error or r.stderr.strip()[-200:]}",
                             Ref(node=node))
    facts = gatewayplan.parse_facts(r.stdout)
    if facts.platform is None:
        raise ConfigError(f"the gateway cannot be installed on {node}: no python3 answers there",
                          Ref(node=node, key="serve.gateway"), hint="smg runs under the node's python3 (3.9 or later)")
    setup = gatewayplan.render_gateway(res, inv, roots, secrets, facts.platform, reveal_secrets=True)
    why = gatewayplan.refusal(setup, facts)
    if why:
        raise ConfigError(why, Ref(node=node, key="serve.gateway"), hint="free space under /opt, or serve.gateway.node")
    return setup, facts


def add_wheel_blobs(plan: Plan, blobs: dict[str, bytes], cache_dir: Any = None) -> None:
    """The bytes of every pinned wheel a put step pushes (into ``blobs``, by sha256): fetched into
    the local cache, verified."""
    from sparkctl.model import wheels
    from sparkctl.ops.wheelhouse import fetch_wheel

    pins = {w.sha256: w for w in (*wheels.SMG, *wheels.SETPROCTITLE)}
    for step in plan.all_steps():
        for refs in step.files.values():
            for f in refs:
                if f.sha256 in pins and f.sha256 not in blobs:
                    blobs[f.sha256] = fetch_wheel(pins[f.sha256], cache_dir).read_bytes()


def plan_for(op: str, res: Resolved | None, inv: Inventory, transport: Transport | None, roots: Roots, *,
             sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
             secrets: Mapping[str, str] | None = None, skip_check: bool = False, reset_clocks: bool = False,
             stack: str | None = None, locked: Sequence[str] | None = None,
             holder: Mapping[str, Any] | None = None, rollback_note: str = "rolled back",
             ) -> tuple[Plan, Rendering | None, tuple[Rendering, ...]]:
    """Read the facts and plan ``op`` (up | down | switch). Changes nothing on any host.

    Without a transport nothing is read: the plan is the one for a cluster where
    nothing runs and no record exists (``sparkctl plan --assume-fresh``).
    ``stack``: down only that stack. ``locked``: the nodes the caller holds the locks
    of; a plan that would change any other node (the stack grew while we locked) is refused.
    ``holder``: the lock's holder (:func:`sparkctl.ops.lock.holder_info`): the plan locks
    its nodes first (``locked``, or when None the nodes it may change) and releases them
    last (:func:`lockplan.with_lock`); the executor runs that first step before it reads
    (:func:`take_lock`).
    """
    started = now_iso()
    plan: Plan
    if op == "down":
        records = read_records(inv, transport) if transport is not None else {}
        recs, nodes = down_scope(inv, records, stack)
        if locked is not None and not set(nodes if nodes is not None else inv.names) <= set(locked):
            raise LockHeld(f"stack {stack} changed while its nodes were locked",
                           hint="another sparkctl changed it; run the command again")
        plan = planner.plan_down(inv, recs, nodes=nodes, reset_clocks=reset_clocks, started_at=started)
        scope = locked if locked is not None else nodes
        return (lockplan.with_lock(plan, inv, holder, scope) if holder else plan), None, ()
    assert res is not None
    w = {k: v.reason for k, v in (waivers or {}).items()}
    rendering = render(res, inv, roots, dict(secrets or {}), reveal_secrets=True)
    facts = gather_up_facts(res, inv, transport, rendering) if transport is not None else planner.UpFacts()
    own = planner.own_nodes(rendering, facts.record)
    if locked is not None:
        outside = [n for n in own if n not in locked]
        if outside:
            raise LockHeld(f"stack {stack_of(res)} changed while its nodes were locked: it now also runs on "
                           f"{', '.join(outside)}", hint="another sparkctl changed it; run the command again")
    gateway = gather_gateway(res, inv, transport, roots, dict(secrets or {}))
    if gateway:
        rendering = replace(rendering, aux={gateway[0].node: dict(gateway[0].files)})
    probes = ({}, {}) if skip_check else check_probes(res, inv)
    extra: tuple[Rendering, ...] = ()
    if op == "up":
        plan = planner.plan_up(res, inv, rendering, facts, sets=sets, waivers=w, started_at=started,
                               skip_check=skip_check, gateway=gateway, probes=probes)
    else:
        previous = _previous(facts.record, res, inv, roots, dict(secrets or {}))
        plan = resumeplan.plan_switch(res, inv, rendering, facts, sets=sets, waivers=w, started_at=started,
                                   skip_check=skip_check, previous=previous, gateway=gateway,
                                   rollback_note=rollback_note, probes=probes)
        extra = (previous[1],) if previous else ()
    scope = list(locked) if locked is not None else [*own, *lockplan.name_claim(res)]  # as lock_scope
    return (lockplan.with_lock(plan, inv, holder, scope) if holder else plan), rendering, extra


# --------------------------------------------------------------------------- execute


def check_step(inv: Inventory, transport: Transport, roots: Roots, say: Progress
               ) -> Callable[[Mapping[str, Any]], Any]:
    """A plan's check step, from the step alone: its profile, sets, waivers and ignored laws,
    only the probe scripts it lists (``sparkctl.ops.check.run_check(planned=...)``), and the
    verdicts kept where it lists them (``params["verdicts"]``: status and the exporter's page)."""
    def check(step: Mapping[str, Any]) -> Any:
        p = step["params"]
        res = resolve(p["profile"], roots, tuple(p.get("sets", ())))
        waivers = {law: laws.Waiver(law, reason) for law, reason in (p.get("waivers") or {}).items()}
        report = run_check(res, inv, transport, waivers=waivers, fix=False, bandwidth_s=0,
                           progress=lambda m: say("*", "check", m),
                           planned=(step.get("commands", {}), p.get("fabric_probe", {})))
        if p.get("verdicts"):
            write_verdicts(transport, p["verdicts"], res.name, now_iso(), [dict(v.__dict__) for v in report.verdicts])
        ignore = set(p.get("ignore", ()))
        failures = [v for v in report.verdicts if v.failed and v.law not in ignore]
        if failures:
            first = failures[0]
            raise CheckFailed(f"{len(failures)} law(s) fail; first: {first.law} on {first.node}: {first.observed}",
                              Ref(node=first.node), hint=first.fix or "run `sparkctl check PROFILE` for the table")
        return report
    return check


def raise_failure(state: planrun.RunState, op: str) -> NoReturn:
    f = state.failed
    assert f is not None
    phase = f.step["phase"]
    if isinstance(f.cause, SparkctlError):
        raise f.cause.in_phase(op, phase) from None
    err = LifecycleError(f.detail, Ref(node=f.node), hint=f.hint)
    raise err.in_phase(op, phase) from None


def run_plan(plan: Plan, backend: TransportBackend, done: Sequence[str] = ()) -> planrun.RunState:
    """Execute exactly ``plan`` (``done``: its leading steps already run); KeyboardInterrupt
    becomes Interrupted naming the phase."""
    try:
        return planrun.execute(plan.to_dict(), backend, done)
    except KeyboardInterrupt as exc:
        state = exc.args[0] if exc.args and isinstance(exc.args[0], planrun.RunState) else None
        phase = ((state.failure if state else None) or {}).get("phase", "?")
        raise Interrupted(f"{plan.op} interrupted in phase {phase}", hint=interrupted_hint(state)) from None


def interrupted_hint(state: planrun.RunState | None) -> str:
    """What Ctrl-C left: a branch it cut short; from the last record the run wrote, the others
    serving (a rolling switch's ``degraded-K-K``, ``paused-K``); or what this run started stopped."""
    rec = (state.record or {}) if state is not None else {}
    if state is not None and state.interrupted_in:
        return (f"interrupted inside branch {state.interrupted_in}: it did not finish, the record may not say "
                "what runs; `sparkctl status` shows what runs, `sparkctl down` stops it")
    if rec.get("state") == "degraded":
        return (f"the other replicas serve (record degraded: {str(rec.get('note') or '').removeprefix('degraded: ')});"
                " `sparkctl status` shows which head serves which profile")
    return "what this run started was stopped; `sparkctl status` shows what runs"


def plan_runner(inv: Inventory, transport: Transport, say: Callable[[str], None]
                ) -> Callable[[Plan], list[dict[str, Any]]]:
    """Runs a plan of plain steps (``check --fix``'s remedies) and returns each step's outcome."""
    def run(plan: Plan) -> list[dict[str, Any]]:
        return run_plan(plan, TransportBackend(inv, transport, lambda _n, _p, m: say(m))).outcomes
    return run


def planned_scope(op: str, res: Resolved, inv: Inventory, transport: Transport) -> list[str]:
    """The nodes ``up``/``switch`` of ``res`` locks (:func:`lock_scope` over the records read now);
    a conflict with another live stack is refused here, in phase plan, before anything is locked."""
    try:
        return lock_scope(res, inv, read_records(inv, transport))
    except SparkctlError as exc:
        raise exc.in_phase(op, "plan") from None


def take_lock(inv: Inventory, transport: Transport, op: str, say: Progress, nodes: Sequence[str] | None = None,
              operation: str | None = None) -> dict[str, Any]:
    """Run the plan's first step, ``lock`` of ``nodes`` (every node when None), before the reads
    the plan is made from; the holder (``operation``: what it says it does, ``op`` by default)."""
    holder = holder_info(operation or op)
    state = run_plan(Plan(op, None, (lockplan.lock_step(inv, holder, nodes),)), TransportBackend(inv, transport, say))
    if state.failed is not None:
        raise_failure(state, op)
    return holder


def release_lock(inv: Inventory, transport: Transport, op: str, holder: Mapping[str, Any] | None,
                 say: Progress, nodes: Sequence[str] | None = None) -> None:
    """The plan's branch ``finally`` when planning itself failed (the plan never ran)."""
    if holder:
        run_plan(Plan(op, None, (), {FINALLY: (lockplan.unlock_step(inv, str(holder["run"]), nodes),)}),
                 TransportBackend(inv, transport, say))


def plan_under_lock(op: str, inv: Inventory, transport: Transport, holder: Mapping[str, Any] | None,
                    say: Progress, make: Callable[[], T], nodes: Sequence[str] | None = None) -> T:
    """``make()`` (read and plan) once the locks of ``nodes`` are taken; if it fails, release them
    and say the phase was "plan"."""
    try:
        return make()
    except SparkctlError as exc:
        release_lock(inv, transport, op, holder, say, nodes)
        raise exc.in_phase(op, "plan") from None
    except BaseException:
        release_lock(inv, transport, op, holder, say, nodes)
        raise


def _phases(state: planrun.RunState) -> tuple[PhaseTime, ...]:
    out: dict[str, float] = {}
    for o in state.outcomes:
        out[o["phase"]] = out.get(o["phase"], 0.0) + o["seconds"]
    return tuple(PhaseTime(k, v) for k, v in out.items())


def up(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
       sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
       secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
       skip_check: bool = False, lock: bool = True) -> UpResult:
    say = progress or (lambda *_: None)
    op = f"up {res.name}"
    waivers = dict(waivers or {})
    scope = planned_scope(op, res, inv, transport)
    holder = take_lock(inv, transport, op, say, scope) if lock else None
    plan, rendering, _ = plan_under_lock(op, inv, transport, holder, say, lambda: plan_for(
        "up", res, inv, transport, roots, sets=sets, waivers=waivers, secrets=secrets, skip_check=skip_check,
        holder=holder, locked=scope if lock else None), scope)
    assert rendering is not None
    say("*", "plan", f"{len(plan.steps)} steps on {', '.join(rendering.layout.nodes)}" if not plan.noop
        else plan.note)
    backend = TransportBackend(inv, transport, say, rendering, check=check_step(inv, transport, roots, say))
    add_wheel_blobs(plan, backend.blobs)
    state = run_plan(plan, backend, done=("lock",) if holder else ())
    if plan.noop:
        return UpResult(res.name, "noop", read_record(inv, transport, stack_of(res)), (), None)
    if state.result != "done":
        raise_failure(state, op)
    return _up_result(res, plan, state, backend)


def _up_result(res: Resolved, plan: Plan, state: planrun.RunState, backend: TransportBackend) -> UpResult:
    # every push (a rolling switch pushes replica by replica)
    restarted = tuple(dict.fromkeys(n for s in plan.steps if s.phase == "push" and s.kind == "put" for n in s.nodes))
    whole = not plan.note
    rec = RunRecord.from_dict(state.record) if state.record else None
    ready = sum(o["seconds"] for o in state.outcomes if o["phase"] == "ready")
    return UpResult(res.name, "started" if whole else "restarted", rec, _phases(state), backend.check_report,
                    ready_s=ready, restarted_nodes=restarted, steps=tuple(state.outcomes))


def down(inv: Inventory, transport: Transport, *, reset_clocks: bool = False, progress: Progress | None = None,
         lock: bool = True, stack: str | None = None) -> DownResult:
    """Stop everything sparkctl started (``stack`` None), or one stack, leaving the others serving."""
    from sparkctl.errors import LockUnavailable

    say = progress or (lambda *_: None)
    op = "down" if stack is None else f"down --stack {stack}"
    scope = None if stack is None else down_scope(inv, read_records(inv, transport), stack)[1]
    holder = None
    if lock:
        try:
            holder = take_lock(inv, transport, "down", say, scope, operation=op)
        except LockUnavailable as exc:
            # Stopping is what an operator needs most on a full disk, and no other
            # sparkctl can hold or take the lock while no lock dir can be made.
            say("*", "lock", f"{exc.message}: stopping without the lock")
    plan, _, _ = plan_under_lock("down", inv, transport, holder, say, lambda: plan_for(
        "down", None, inv, transport, Roots(()), reset_clocks=reset_clocks, stack=stack, holder=holder,
        locked=scope if holder else None), scope)
    state = run_plan(plan, TransportBackend(inv, transport, say), done=("lock",) if holder else ())
    record_failures = [f for f in state.soft_failures if f.step["kind"] == "record"]
    left = state.left
    if record_failures:
        f = record_failures[0]
        raise LifecycleError(f"engines stopped{' except on ' + ', '.join(sorted(left)) if left else ''}, but "
                             f"{f.detail}; the head's record was removed (no record: nothing runs)",
                             Ref(node=f.node), hint=f.hint).in_phase("down", f.step["phase"])
    stop = next(s for s in plan.steps if s.kind == "stop")
    reset = next((s for s in plan.steps if s.id == "reset-clocks"), None)
    failed_resets = {f.node for f in state.soft_failures if f.step["id"] == "reset-clocks"}
    return DownResult(tuple(stop.nodes), dict(left), dict(state.leaks),
                      tuple(n for n in (reset.nodes if reset else ()) if n not in failed_resets),
                      steps=tuple(state.outcomes))


def switch(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *, sets: Sequence[str] = (),
           waivers: Mapping[str, laws.Waiver] | None = None, secrets: Mapping[str, str] | None = None,
           progress: Progress | None = None) -> SwitchResult:
    """Replace the serving stack; on failure bring the previous one back (the plan's rollback branch)."""
    say = progress or (lambda *_: None)
    op = f"switch {res.name}"
    waivers = dict(waivers or {})
    stack = stack_of(res)
    scope = planned_scope(op, res, inv, transport)
    holder = take_lock(inv, transport, op, say, scope)
    plan, rendering, extra = plan_under_lock(op, inv, transport, holder, say, lambda: plan_for(
        "switch", res, inv, transport, roots, sets=sets, waivers=waivers, secrets=secrets, holder=holder,
        locked=scope), scope)
    backend = TransportBackend(inv, transport, say, rendering, extra, check=check_step(inv, transport, roots, say))
    add_wheel_blobs(plan, backend.blobs)
    if plan.noop:
        say("*", "noop", plan.note)
    t0 = time.monotonic()
    state = run_plan(plan, backend, done=("lock",))
    if plan.noop:
        return SwitchResult(res.name, True, False, 0.0,
                            up=UpResult(res.name, "noop", read_record(inv, transport, stack), (), None))
    if state.result == "done":
        result = _up_result(res, plan, state, backend)
        # a rolling switch (branches rollback-K) keeps a replica serving throughout
        unavailable = sum(p.seconds for p in result.phases if p.phase in ("stop-stale", "push", "start", "ready"))
        return SwitchResult(res.name, True, False, unavailable if "rollback" in plan.branches else 0.0, up=result)
    f = state.failed
    # a branch that ended with the record written "degraded": a rolling switch's way back that failed
    # part way (degraded-K-J), or a resumed one's replica that did not come up (resume-K)
    if f is not None and state.completed and (state.record or {}).get("state") == "degraded":
        b = state.branch_failure
        rec = RunRecord.from_dict(state.record or {})
        serving = "; ".join(f"{'+'.join(r.get('nodes') or [h])} serve{'s' if len(r.get('nodes') or [h]) == 1 else ''} "
                            f"{r.get('profile')}" for h, r in rec.replicas.items())
        back = (f"rolling back, {b.step['id']} failed in phase {b.step['phase']}: {b.detail}" if b is not None
                else "that replica was taken out and the replicas before it kept")
        raise SwitchDegraded(
            f"switch to {res.name} failed ({f.detail}); {back}; left degraded, nothing serving was stopped: "
            f"{serving}", Ref(node=(b or f).node), hint=f"`sparkctl status` shows which replica serves which "
            f"profile; `sparkctl switch {res.name}` again resumes, or `sparkctl down`")
    rollback = next((b for b in state.branches if b == "rollback" or b.startswith("rollback-")), None)
    if rollback is None:
        raise_failure(state, op)  # nothing was stopped, or nothing to roll back to
    assert f is not None
    first = f.cause.in_phase(op, f.step["phase"]).one_line() if isinstance(f.cause, SparkctlError) else \
        f"{op} failed in phase {f.step['phase']}: {f.detail}"
    if rollback not in state.completed:
        b = state.branch_failure
        assert b is not None
        prev_name = plan.branches[rollback][-1].params["record"]["profile"]
        raise LifecycleError(f"switch to {res.name} failed ({f.detail}) and in phase rollback restoring "
                             f"{prev_name} failed too: {b.detail}", Ref(node=b.node),
                             hint="`sparkctl status` shows what runs; `sparkctl up` a profile")
    prev = read_record(inv, transport, stack)
    # a rolling switch's way back keeps the other replicas serving: no outage
    return SwitchResult(prev.profile if prev else "", False, True,
                        0.0 if rollback.startswith("rollback-") else time.monotonic() - t0, error=first)
