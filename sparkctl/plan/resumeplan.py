"""``switch`` from a degraded record: the roll goes on from where it stopped, never from scratch. Pure.

A rolling switch whose way back failed part way (or that was interrupted) leaves the record
"degraded": some heads serve the new profile, some the old one, the replica that did not come
back is stopped (``sparkctl.plan.switchplan``). The record's fix says "`sparkctl switch P`
again". Planned as a plain ``up`` that would stop every replica at once, for minutes; instead
:func:`plan_switch` reads the record's ``replicas`` and sorts each replica of the profile
being switched to into one of three:

* **keep**: a head already serves this profile with the files rendered today (and answers its
  served name when the facts are read: ``UpFacts.serving``). Not touched (registered again at
  the gateway, idempotent).
* **start**: none of its nodes serves anything (stopped on purpose). Started first: nothing
  serves there, so it adds capacity before anything else stops.
* **roll**: its nodes serve the other profile. Replaced as a rolling switch replaces a replica
  (drain, idle twice, stop, start, ready, register), one at a time.

A failure at replica K (branch ``resume-K``) takes K out of the gateway, stops it and, where K
served the other profile and that profile still resolves, gives it back (ready, registered); the
replicas already replaced stay replaced: the record stays "degraded", now with more of the new
profile serving than before, and ``switch`` exits 8. Where the way back fails too, branch
``resume-K-stopped`` leaves K stopped. Ctrl-C while replica K's steps run stops K alone
(``resume-K-stopped``, or ``resume-K`` for a replica started from nothing); Ctrl-C after K is
registered stops nothing (``paused-K``: the record says what serves). Every branch ends with
the degraded record written, so the same command resumes again.

Where the record cannot be read that way (a third profile in it, a replica of the other profile
that spans two new replicas, a single replica, no gateway), :func:`plan_switch` is
:func:`sparkctl.plan.switchplan.plan_switch`, and the plan's note says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import RunRecord
from sparkctl.plan import gatewayplan, planner, switchplan
from sparkctl.plan.render import Rendering
from sparkctl.plan.steps import Plan, Step
from sparkctl.plan.switchplan import Group, _mixed, _only, _prefixed, _restore, _words

KEEP, START, ROLL = "keep", "start", "roll"


@dataclass(frozen=True)
class Part:
    """One replica of the profile switched to, and what its nodes do now."""

    group: Group  # index: the order the resume takes (keep last); old_*: what serves there now
    kind: str  # keep | start | roll
    restorable: bool  # roll only: its old replica can be given back (the other profile resolves)


def other_profile(rec: RunRecord, name: str) -> tuple[str, tuple[str, ...]] | None:
    """The one profile (and its sets) other than ``name`` that a degraded record's replicas serve;
    None when there is none, or more than one."""
    others = {(str(r.get("profile")), tuple(r.get("sets") or ())) for r in rec.replicas.values()
              if r.get("profile") != name}
    return next(iter(others)) if len(others) == 1 else None


def parts(res: Resolved, rendering: Rendering, rec: RunRecord, other: str | None,
          serving: Sequence[str] | None = None) -> tuple[list[Part], str]:
    """(each replica of ``res`` and what to do with it, "") or ([], why it cannot resume).

    ``serving``: the heads found serving ``res`` when the facts were read (None: not read, the
    record is trusted); a replica the record says serves it but that does not is restarted (roll)."""
    lay = rendering.layout
    if len(lay.replicas) < 2:
        return [], "the profile has one replica: no replica can stay up while it is replaced"
    outside = [n for r in rec.replicas.values() for n in r.get("nodes", ()) if n not in lay.nodes]
    if outside:
        return [], f"{_words(outside)} serve but {res.name} does not use them"
    profiles = {r.get("profile") for r in rec.replicas.values()} - {res.name}
    if len(profiles) > 1:
        return [], f"the record's replicas serve {len(profiles) + 1} profiles"
    found: list[tuple[int, Group, str]] = []
    for rep in lay.replicas:
        nodes = tuple(r.node for r in rep)
        there = [(h, r) for h, r in rec.replicas.items() if set(r.get("nodes", ())) & set(nodes)]
        for h, r in there:
            if not set(r.get("nodes", ())) <= set(nodes):
                return [], f"the replica on {_words(r['nodes'])} spans two of {res.name}'s replicas"
        same = [h for h, r in there if r.get("profile") == res.name]
        fresh = all(n in rec.nodes and rec.nodes[n].hash == rendering.node_hash(n) for n in nodes) and (
            serving is None or nodes[0] in serving)
        if same and len(there) == 1 and set(there[0][1].get("nodes", ())) == set(nodes) and same[0] == nodes[0] \
                and fresh:
            found.append((2, Group(0, nodes, (nodes[0],), (), ()), KEEP))
            continue
        old_nodes = tuple(n for _, r in there for n in r.get("nodes", ()))
        kind = ROLL if there else START
        found.append((1 if there else 0, Group(0, nodes, (nodes[0],), old_nodes, tuple(h for h, _ in there)), kind))
    found.sort(key=lambda f: f[0])  # nothing serves on a start's nodes: it goes first; keeps are not touched
    out = []
    for i, (_, g, kind) in enumerate(found, 1):
        restorable = kind == ROLL and other is not None and all(
            rec.replicas[h].get("profile") == other for h in g.old_heads)
        out.append(Part(replace(g, index=i), kind, restorable))
    return out, ""


def _mix(res: Resolved, rec: RunRecord, starting: RunRecord, gw_entry: Mapping[str, Any], all_parts: Sequence[Part],
         new: set[int], stopped: set[int], started_at: str) -> RunRecord:
    """The degraded record when the parts in ``new`` serve ``res``, those in ``stopped`` nothing,
    and the others what they served before (the keeps serve ``res``): ``switchplan._mixed``."""
    serve_new = [t.group for t in all_parts if t.kind == KEEP or t.group.index in new]
    old = {h: rec.replicas[h] for t in all_parts if t.kind != KEEP and t.group.index not in new | stopped
           for h in t.group.old_heads}
    return _mixed(res, starting, gw_entry, serve_new, old, rec, started_at)[0]


def _serving(rec: RunRecord) -> str:
    return "; ".join(f"{_words(r['nodes'])} serve {r['profile']}" for r in rec.replicas.values()) or "nothing serves"


def plan_resume(res: Resolved, inv: Inventory, rendering: Rendering, base: Plan, rec: RunRecord,
                previous: tuple[Resolved, Rendering] | None,
                gateway: tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts], todo: Sequence[Part], *,
                sets: Sequence[str], waivers: Mapping[str, str], started_at: str) -> Plan:
    """The rest of the roll from the degraded ``rec`` to ``res``; ``base``: ``up``'s plan (its check,
    clock cap and ``stop`` branch are reused, its other steps replaced)."""
    p = res.profile
    head = inv.nodes[0].name
    setup, gfacts = gateway
    gw_entry = gatewayplan.record_entry(res, inv, rendering, setup)
    ports = sorted({p.serve.port, p.serve.master_port, rec.port, *(int(r.get("port", rec.port))
                                                                   for r in rec.replicas.values())})
    starting = planner.record_for(res, rendering, sets, "starting", waivers, started_at, "",
                                  listen=planner.head_listen(res, rendering, inv), gateway=gw_entry)
    fix = f"`sparkctl switch {res.name}` again resumes, or `sparkctl down`"
    work = [t for t in todo if t.kind != KEEP]

    def mix(new: set[int], stopped: set[int], what: str) -> RunRecord:
        r = _mix(res, rec, starting, gw_entry, todo, new, stopped, started_at)
        return replace(r, note=f"degraded: {what}; {_serving(r)}; {fix}")

    steps: list[Step] = [s for s in base.steps if s.phase in ("check", "clock")]
    steps += gatewayplan.ensure_steps(setup, gfacts, inv, p.serve.persist, "abort")
    # what serves now stays registered (idempotent), before anything else changes
    steps += [replace(s, summary=s.summary.replace("(they are ready)", "(serving now: idempotent)"))
              for s in gatewayplan.register_step(rec.gateway, inv, "gateway-keep", "gateway", "abort")]
    # the record stays degraded while the roll resumes: a run that dies leaves a record the same
    # command resumes from again
    steps.append(planner.record_step(inv, "record-start", "record-start", head,
                                     mix(set(), set(), f"resuming the switch to {res.name}"),
                                     f"record that the switch to {res.name} resumes"))
    branches: dict[str, tuple[Step, ...]] = {}
    interrupt: dict[int, str] = {}
    paused: dict[int, str] = {}
    for t in work:
        g, k = t.group, t.group.index
        pfx, fail, stop_b = f"r{k}-", f"resume-{k}", f"resume-{k}-stopped"
        done = {w.group.index for w in work if w.group.index < k}
        if t.kind == ROLL:
            steps += gatewayplan.drain_step(rec.gateway, inv, f"{pfx}gateway-drain", "drain", heads=g.old_heads)
        what = (f"stop what serves on {_words(g.nodes)} (replica {k} of {len(work)} to resume) and verify: no "
                "engine process, ports closed") if t.kind == ROLL else \
            f"verify nothing runs on {_words(g.nodes)} (replica {k} of {len(work)}, stopped before): ports closed"
        steps.append(planner._stop_step(inv, f"{pfx}stop", "stop", g.nodes, ports, p.serve.stop_timeout_s, what, fail))
        steps += _prefixed(planner._page_cache_step(res, inv, g.nodes), pfx)
        steps += _prefixed(planner._watchdog_step(res, inv, g.nodes, fail), pfx)
        steps += planner._bring_up(res, inv, rendering, list(g.nodes), pfx, fail, only_heads=g.new_heads)
        steps += gatewayplan.register_step(_only(gw_entry, g.new_heads), inv, f"{pfx}gateway-register",
                                           "gateway", fail)
        after = mix(done | {k}, set(), f"the switch to {res.name} resumed up to replica {k} ({_words(g.nodes)})")
        steps.append(planner.record_step(inv, f"{pfx}record", "record", head, after,
                                         f"record replica {k} of {len(work)} serving {res.name}", on_fail="continue"))
        # the way back from replica k: out of the gateway, stopped, its old replica given back where it had one
        left = mix(done, {k}, f"the switch to {res.name} failed at replica {k} ({_words(g.nodes)}: stopped)")
        stopped = (*gatewayplan.drain_step({**gw_entry, "backends": [
                       *_only(gw_entry, g.new_heads).get("backends", []),
                       *_only(rec.gateway, g.old_heads).get("backends", [])]}, inv, f"rs{k}-gateway-deregister",
                       "degraded", wait=False),
                   planner._stop_step(inv, f"rs{k}-stop", "degraded", g.nodes, ports, p.serve.stop_timeout_s,
                                      f"stop what runs on {_words(g.nodes)} (replica {k}); the replicas that "
                                      "serve are left as they are", "continue"),
                   planner.record_step(inv, f"rs{k}-record", "degraded", head, left, f"record degraded: "
                                       f"{_serving(left)}", on_fail="abort",
                                       note_if_interrupted=left.note.replace(" failed at ", " interrupted (Ctrl-C) at ")))
        if t.restorable and previous is not None:
            back = [*gatewayplan.drain_step(_only(gw_entry, g.new_heads), inv, f"rb{k}-gateway-deregister",
                                            "rollback", wait=False),
                    planner._stop_step(inv, f"rb{k}-stop", "rollback", g.nodes, ports, p.serve.stop_timeout_s,
                                       f"stop what {res.name} started on {_words(g.nodes)}", stop_b)]
            back += _restore(g, f"rb{k}-", rec, previous[0], previous[1], inv, stop_b)
            given = mix(done, set(), f"the switch to {res.name} failed at replica {k} ({_words(g.nodes)}: "
                                     f"{rec.replicas[g.old_heads[0]]['profile']} given back)")
            back.append(planner.record_step(inv, f"rb{k}-record", "rollback", head, given,
                                            f"record degraded: {_serving(given)}", on_fail="abort"))
            branches[fail], branches[stop_b] = tuple(back), stopped
            interrupt[k] = stop_b
        else:
            branches[fail] = tuple(replace(s, id=s.id.replace(f"rs{k}-", f"rb{k}-")) for s in stopped)
            interrupt[k] = fail
        # Ctrl-C once replica k is registered stops nothing: the record says what serves
        stop_here = mix(done | {k}, set(), f"the switch to {res.name} interrupted (Ctrl-C) after replica {k} "
                                           f"({_words(g.nodes)}) was registered")
        paused[k] = f"paused-{k}"
        branches[paused[k]] = (planner.record_step(inv, f"ps{k}-record", "record", head, stop_here,
                                                   f"record degraded: {_serving(stop_here)}", on_fail="abort",
                                                   note_if_interrupted=stop_here.note),)
    # a failure after the last replica is registered: that replica's way back, as in the rolling switch
    last = f"resume-{work[-1].group.index}" if work else "abort"
    steps += planner._persist_step(res, inv, list(rendering.layout.nodes), "", last)
    steps.append(planner.record_step(inv, "record", "record", head, replace(starting, state="serving", note=""),
                                     f"record {res.name} serving", on_fail=last))
    # each step's Ctrl-C: from replica k's first step to its registration, k stops; after it, nothing
    marked, cur, registered = [], 0, False
    for s in steps:
        at = next((w.group.index for w in work if s.id.startswith(f"r{w.group.index}-")), None)
        if at is not None and at != cur:
            cur, registered = at, False
        if cur:
            s = replace(s, on_interrupt=paused[cur] if registered else interrupt[cur])
            registered = registered or s.id == f"r{cur}-gateway-register"
        marked.append(s)
    return Plan(base.op, res.name, tuple(marked), branches,
                reads=(*base.reads, f"the degraded record's replicas, the gateway on {setup.node}"),
                note=f"resuming the switch to {res.name} from a degraded record: " + (", ".join(
                    f"replica {t.group.index} on {_words(t.group.nodes)}: {t.kind}" for t in todo)),
                outage=_outage(res, rec, todo))


def _outage(res: Resolved, rec: RunRecord, todo: Sequence[Part]) -> str:
    text = (f"none expected: {len([t for t in todo if t.kind != KEEP])} replicas started or replaced one at a "
            "time behind the gateway; the others serve throughout")
    olds = {str(r.get("served_name")) for r in rec.replicas.values() if r.get("profile") != res.name}
    new = res.profile.model.served_name
    for old in sorted(olds - {new}):
        text += f"; requests for {old!r} get 404 model_not_found once its last replica is drained"
    if not any(t.kind == KEEP for t in todo):
        text += f"; requests for {new!r} get 404 until the first replica of {res.name} is registered"
    return text


def plan_switch(res: Resolved, inv: Inventory, rendering: Rendering, facts: planner.UpFacts, *,
                sets: Sequence[str] = (), waivers: Mapping[str, str] | None = None, started_at: str = "",
                skip_check: bool = False, previous: tuple[Resolved, Rendering] | None = None, op: str = "switch",
                gateway: tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts] | None = None,
                rollback_note: str = "rolled back", probes: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {}),
                ) -> Plan:
    """``switch``: from a degraded record, the rest of the roll (:func:`plan_resume`); otherwise, or
    when the record cannot be resumed from, :func:`sparkctl.plan.switchplan.plan_switch`.

    ``previous``: from a degraded record, the other profile its replicas serve (the way back of a
    replica that fails); else the serving stack's, as for the plain switch."""
    rec = facts.record
    plain = switchplan.plan_switch(res, inv, rendering, facts, sets=sets, waivers=waivers, started_at=started_at,
                                   skip_check=skip_check, previous=previous, op=op, gateway=gateway,
                                   rollback_note=rollback_note, probes=probes)
    if rec is None or rec.state != "degraded":
        return plain
    other = previous[0].name if previous else None
    todo, why = parts(res, rendering, rec, other, facts.serving)
    if not why and gateway is None:
        why = "no gateway (serve.gateway) in front of the replicas"
    elif not why and rec.gateway.get("node") != gateway[0].node:  # type: ignore[index]
        why = f"the gateway moves from {rec.gateway.get('node')} to {gateway[0].node}"  # type: ignore[index]
    if why or gateway is None:
        return replace(plain, note=f"{plain.note + '; ' if plain.note else ''}not resumed from the degraded record "
                                   f"({why}): every replica restarts")
    return plan_resume(res, inv, rendering, plain, rec, previous, gateway, todo, sets=sets,
                       waivers=dict(waivers or {}), started_at=started_at)
