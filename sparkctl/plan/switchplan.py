"""``switch``: the plain one (stop, start, roll back) and the rolling one (one replica at a time). Pure.

:func:`plan_switch` is ``up`` of the new profile whose failure, once the old
stack is stopped, brings the old one back (branch ``rollback``), built from
the planner's steps (``sparkctl.plan.planner``); where it can, it rolls:

Where the old and the new stack each have two or more replicas, both behind the
same gateway (``serve.gateway``), ``switch`` replaces them replica by replica
(issue 20, item 3), every step in the plan ``sparkctl plan switch`` prints:

* ``rK-gateway-drain``: the old replica(s) on the new replica's nodes are removed
  from the gateway, then their engines must read idle twice (``gateway_ctl drain``);
* ``rK-stop``: stop them and verify (no engine process, ports closed);
* ``rK-push`` .. ``rK-start-i``: the new replica's files and ranks on those nodes;
* ``rK-ready``: the one readiness verdict, for this replica's head only;
* ``rK-gateway-register``: the gateway routes to it;
* ``rK-record``: the record says which nodes serve which profile so far;

then the next replica. The other replicas serve throughout: traffic never leaves
the old stack before a new replica is ready.

A failure from ``rK-stop`` on leads to branch ``rollback-K``: the new replica K is
removed and stopped, the old replica(s) of those nodes are started again (ready,
registered), and each replica already replaced (K-1 .. 1) is drained and given
its old replica back the same way, while the old replicas not yet touched kept
serving. The branch ends with the old profile's record, a note saying what did
not come up.

A failure inside ``rollback-K`` at replica J (K itself, or one replaced before) never
stops what serves: it leads to branch ``degraded-K-J``, which removes J's replicas from
the gateway, stops J's nodes (what did not come back) and records the state
"degraded": the new replicas 1 .. J-1 and the old replicas of J+1 .. n serve on,
the record's ``replicas`` says which head serves which profile, and ``switch``
exits 8 (``ExitStatus.DEGRADED``) naming the node and phase. Only where nothing
would serve does the failure fall back to the switch's ``stop`` branch.

Where no replica can stay up (one replica on either side, e.g. TP4 on four
boxes), the switch is the plain one and its plan says the expected outage
(:func:`outage_text`); behind the gateway the served names are held at 503 +
Retry-After meanwhile (``gateway-hold`` .. ``gateway-release``, docs/gateway.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import Layout
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import RunRecord
from sparkctl.plan import gatewayplan, planner
from sparkctl.plan.render import Rendering
from sparkctl.plan.steps import Plan, Step

BRANCH = "rollback-{k}"


@dataclass(frozen=True)
class Group:
    """One step of the roll: a new replica, and the old replicas on its nodes."""

    index: int  # 1-based, in the order the roll takes
    nodes: tuple[str, ...]  # the new replica's nodes
    new_heads: tuple[str, ...]
    old_nodes: tuple[str, ...]  # the old replicas' nodes (within ``nodes``)
    old_heads: tuple[str, ...]


def groups(new: Layout, old: Layout) -> tuple[list[Group], str]:
    """(the roll's groups, "") when a rolling switch can keep a replica up throughout,
    else ([], why not): the plain switch with its outage."""
    if len(new.replicas) < 2 or len(old.replicas) < 2:
        return [], (f"{'the old' if len(old.replicas) < 2 else 'the new'} stack has one replica: "
                    "no replica can stay up while it is replaced")
    outside = [n for n in old.nodes if n not in new.nodes]
    if outside:
        return [], f"the old stack runs on {', '.join(outside)}, which the new one does not use"
    raw: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []
    for rep in new.replicas:
        nodes = tuple(r.node for r in rep)
        o_nodes: list[str] = []
        o_heads: list[str] = []
        for orep in old.replicas:
            onodes = [r.node for r in orep]
            if set(onodes) & set(nodes):
                if not set(onodes) <= set(nodes):
                    return [], (f"the old replica on {'+'.join(onodes)} spans two new replicas: it cannot be "
                                "replaced while the other serves")
                o_nodes += onodes
                o_heads.append(orep[0].node)
        raw.append((nodes, (rep[0].node,), tuple(o_nodes), tuple(o_heads)))
    # New replicas on nodes no old replica uses come first: they serve before anything stops.
    raw.sort(key=lambda g: bool(g[3]))
    out = [Group(i, *g) for i, g in enumerate(raw, 1)]
    for k, g in enumerate(out):
        if g.old_heads and k == 0 and not any(o.old_heads for o in out[1:]):
            return [], "every old replica is on the first new replica's nodes: none would stay up"
    return out, ""


def _serving_after(k: int, roll: Sequence[Group], gw_entry: Mapping[str, Any], prev: RunRecord
                   ) -> list[dict[str, Any]]:
    """The backends that serve once replica ``k`` is registered (0: before the first drain), as the
    roll goes on: the new replicas 1 .. k and the old ones of k+2 .. n. Replica k+1, drained next,
    is left out: a gateway rebuilt meanwhile never sends it a request while it stops."""
    return [*_only(gw_entry, [h for g in roll[:k] for h in g.new_heads]).get("backends", []),
            *_only(prev.gateway, [h for g in roll[k + 1:] for h in g.old_heads]).get("backends", [])]


def _only(gw: Mapping[str, Any], heads: Sequence[str]) -> dict[str, Any]:
    """The record's gateway entry with only these heads' backends."""
    return {**gw, "backends": [b for b in gw.get("backends", []) if b["head"] in heads]} if gw else {}


def _prefixed(steps: Sequence[Step], prefix: str, phase: str | None = None, on_fail: str | None = None
              ) -> list[Step]:
    out = []
    for s in steps:
        fail = s.on_fail if on_fail is None or s.on_fail == "continue" else on_fail
        out.append(replace(s, id=f"{prefix}{s.id}", phase=phase or s.phase, on_fail=fail))
    return out


def _restore(g: Group, prefix: str, prev: RunRecord, prev_res: Resolved, prev_rendering: Rendering,
             inv: Inventory, on_fail: str = "stop") -> list[Step]:
    """The old replica(s) of ``g`` back on their nodes: files, start, ready, registered."""
    if not g.old_nodes:
        return []
    up = planner._bring_up(prev_res, inv, prev_rendering, list(g.old_nodes), prefix, on_fail, only_heads=g.old_heads)
    steps = [replace(s, phase="rollback", on_fail="continue" if s.on_fail == "continue" else on_fail) for s in up]
    steps += gatewayplan.register_step(_only(prev.gateway, g.old_heads), inv, f"{prefix}gateway-register",
                                       "rollback", on_fail)
    return steps


DEGRADED = "degraded-{k}-{j}"


def _degraded(k: int, j: Group, roll: Sequence[Group], res: Resolved, prev: RunRecord, starting: RunRecord,
              gw_entry: Mapping[str, Any], inv: Inventory, ports: Sequence[int], started_at: str,
              ) -> tuple[str, tuple[Step, ...]] | None:
    """Where the way back of replica ``k`` fails at replica ``j`` (``j`` is ``k``, or one replaced
    before): (branch name, its steps), or None when nothing would serve (the ``stop`` branch then).

    What serves at that point, and is never stopped: the new replicas 1 .. j-1 (not rolled back yet),
    the old replicas of j+1 .. n (given back, or never touched). Only ``j``'s nodes are stopped (what
    did not come back) and removed from the gateway; the record says "degraded" and which head serves
    which profile."""
    new_groups = [g for g in roll if g.index < j.index]
    old_groups = [g for g in roll if g.index > j.index and g.old_heads]
    if not new_groups and not any(g.old_heads for g in old_groups):
        return None
    name = DEGRADED.format(k=k, j=j.index)
    pfx = f"dg{k}-{j.index}-"
    gone = {**gw_entry, "backends": [*_only(gw_entry, j.new_heads).get("backends", []),
                                     *_only(prev.gateway, j.old_heads).get("backends", [])]}
    steps = [*gatewayplan.drain_step(gone, inv, f"{pfx}gateway-deregister", "degraded", wait=False),
             planner._stop_step(inv, f"{pfx}stop", "degraded", j.nodes, ports, res.profile.serve.stop_timeout_s,
                                f"stop what did not come back on {_words(j.nodes)} (replica {j.index}); the "
                                "replicas that serve are left as they are", "continue")]
    fix = f"`sparkctl switch {res.name}` again resumes, or `sparkctl down`"
    rec, serving = _mixed(res, starting, gw_entry, new_groups, _old_entries(prev, old_groups), prev, started_at)
    rec = replace(rec, note=(f"degraded: switch to {res.name} failed at replica {k} and its way back failed at "
                             f"replica {j.index} ({_words(j.nodes)}: stopped); {serving}; {fix}"))
    steps.append(planner.record_step(inv, f"{pfx}record", "degraded", inv.nodes[0].name, rec,
                                     f"record degraded: {serving}", on_fail="abort",
                                     note_if_interrupted=(f"degraded: switch to {res.name} interrupted (Ctrl-C) at "
                                                          f"replica {j.index} ({_words(j.nodes)}: stopped); "
                                                          f"{serving}; {fix}")))
    return name, tuple(steps)


def _mixed(res: Resolved, starting: RunRecord, gw_entry: Mapping[str, Any], new_groups: Sequence[Group],
           old: Mapping[str, Mapping[str, Any]], was: RunRecord, started_at: str) -> tuple[RunRecord, str]:
    """The degraded record (and "A+B serve P; ..." for its note) when the new replicas of
    ``new_groups`` and the heads of ``old`` (head -> its replica entry, as ``was`` recorded it:
    its gateway backend and bind) serve, and nothing else does."""
    new_heads = [h for g in new_groups for h in g.new_heads]
    replicas: dict[str, dict[str, Any]] = {}
    for g in new_groups:
        for h in g.new_heads:
            replicas[h] = {"profile": res.name, "served_name": starting.served_name, "port": starting.port,
                           "engine": starting.engine, "clock_cap_mhz": starting.clock_cap_mhz,
                           "nodes": list(g.nodes), "sets": list(starting.sets)}
    replicas.update({h: dict(e) for h, e in old.items()})
    # every node either stack may still run on stays in the record: down stops them, locks claim them
    nodes = {**was.nodes, **{n: starting.nodes[n] for g in new_groups for n in g.nodes if n in starting.nodes}}
    nodes.update({n: starting.nodes[n] for n in starting.nodes if n not in nodes})
    serving = "; ".join(f"{_words(r['nodes'])} serve {r['profile']}" for r in replicas.values())
    # each head listens where its own profile's serve.bind put it
    binds = {h: starting.listen if h in new_heads else was.listen for h in replicas}
    listen = {h: binds[h][h] for h in replicas if h in binds[h]}
    rec = replace(starting, state="degraded", updated_at=started_at, heads=tuple(replicas), nodes=nodes,
                  listen=listen,
                  gateway={**gw_entry, "backends": [*_only(gw_entry, new_heads).get("backends", []),
                                                    *_only(was.gateway, list(old)).get("backends", [])]},
                  replicas=replicas)
    return rec, serving


def _old_entries(prev: RunRecord, old_groups: Sequence[Group]) -> dict[str, dict[str, Any]]:
    """Per old head of ``old_groups``: its replica entry, from the serving record ``prev``."""
    return {h: {"profile": prev.profile, "served_name": prev.served_name, "port": prev.port, "engine": prev.engine,
                "clock_cap_mhz": prev.clock_cap_mhz, "sets": list(prev.sets),
                "nodes": [n for n in g.old_nodes if n in prev.nodes and h in prev.nodes
                          and prev.nodes[n].replica == prev.nodes[h].replica] or list(g.old_nodes)}
            for g in old_groups for h in g.old_heads}


def _words(nodes: Sequence[str]) -> str:
    return "+".join(nodes)


def plan_rolling(res: Resolved, inv: Inventory, rendering: Rendering, base: Plan, prev: RunRecord,
                 previous: tuple[Resolved, Rendering], gateway: tuple[gatewayplan.GatewaySetup,
                                                                      gatewayplan.GatewayFacts],
                 roll: Sequence[Group], *, sets: Sequence[str], waivers: Mapping[str, str], started_at: str,
                 rollback_note: str) -> Plan:
    """The rolling switch from ``prev`` to ``res``. ``base``: the plain switch's plan (its check,
    clock cap and ``stop`` branch are reused; its other steps are replaced by the roll)."""
    p = res.profile
    prev_res, prev_rendering = previous
    head = inv.nodes[0].name
    ports = sorted({p.serve.port, p.serve.master_port, prev.port})
    setup, gfacts = gateway
    gw_entry = gatewayplan.record_entry(res, inv, rendering, setup)
    n = len(roll)

    steps: list[Step] = [s for s in base.steps if s.phase in ("check", "clock")]
    # The gateway first, before anything stops: running with these files, and the old replicas
    # registered (idempotent: a backend already registered is left as it is).
    steps += gatewayplan.ensure_steps(setup, gfacts, inv, p.serve.persist, "abort")
    steps += [replace(s, summary=s.summary.replace("(they are ready)", f"(still {prev.profile}'s, serving: "
                                                   "idempotent)"))
              for s in gatewayplan.register_step(prev.gateway, inv, "gateway-keep", "gateway", "abort")]
    # gateway.serving: what serves while the roll is under way, the backends a restarted gateway's
    # rebuild registers (gateway_ctl.live_backends); the final record drops it
    starting = planner.record_for(res, rendering, sets, "starting", waivers, started_at,
                                  f"rolling switch from {prev.profile}, one replica at a time",
                                  listen=planner.head_listen(res, rendering, inv),
                                  gateway={**gw_entry, "serving": _serving_after(0, roll, gw_entry, prev)})
    steps.append(planner.record_step(inv, "record-start", "record-start", head, starting,
                                     "record that the rolling switch starts"))
    branches: dict[str, tuple[Step, ...]] = {}
    interrupt: dict[int, str] = {}  # K -> what Ctrl-C in replica K's steps runs
    for g in roll:
        k = g.index
        pfx, rb = f"r{k}-", BRANCH.format(k=k)
        steps += gatewayplan.drain_step(prev.gateway, inv, f"{pfx}gateway-drain", "drain", heads=g.old_heads)
        steps.append(planner._stop_step(inv, f"{pfx}stop", "stop", g.nodes, ports, p.serve.stop_timeout_s,
                                        f"stop {prev.profile} on {_words(g.nodes)} (replica {k} of {n}) and "
                                        "verify: no engine process, ports closed", rb))
        steps += _prefixed(planner._page_cache_step(res, inv, g.nodes), pfx)
        steps += _prefixed(planner._watchdog_step(res, inv, g.nodes, rb), pfx)
        steps += planner._bring_up(res, inv, rendering, list(g.nodes), pfx, rb, only_heads=g.new_heads)
        steps += gatewayplan.register_step(_only(gw_entry, g.new_heads), inv, f"{pfx}gateway-register",
                                           "gateway", rb)
        if k < n:
            done = [x for h in roll[:k] for x in h.nodes]
            left = [x for h in roll[k:] for x in h.old_nodes]
            mid = replace(starting, note=f"rolling switch from {prev.profile}: {_words(done)} serve {res.name}"
                          + (f", {_words(left)} still serve {prev.profile}" if left else ""),
                          gateway={**gw_entry, "serving": _serving_after(k, roll, gw_entry, prev)})
            steps.append(planner.record_step(inv, f"{pfx}record", "record", head, mid,
                                             f"record replica {k} of {n} replaced", on_fail="continue"))
        # The way back from a failure of replica k: its nodes get the old replica(s) back, then
        # every replica already replaced is drained and given its old replica back.
        # A failure on the way back degrades, never stops what serves (branch degraded-K-J).
        def way_back(j: Group, k: int = k) -> str:
            d = _degraded(k, j, roll, res, prev, starting, gw_entry, inv, ports, started_at)
            if d is None:
                return "stop"
            branches[d[0]] = d[1]
            return d[0]

        dk = way_back(g)
        interrupt[k] = dk if dk != "stop" else ""
        back = [*gatewayplan.drain_step(_only(gw_entry, g.new_heads), inv, f"rb{k}-gateway-deregister", "rollback",
                                        wait=False),
                planner._stop_step(inv, f"rb{k}-stop", "rollback", g.nodes, ports, p.serve.stop_timeout_s,
                                   f"stop what {res.name} started on {_words(g.nodes)}", dk)]
        back += _restore(g, f"rb{k}-", prev, prev_res, prev_rendering, inv, dk)
        for j in reversed(roll[:k - 1]):
            jp = f"rb{k}-r{j.index}-"
            dj = way_back(j)
            back += gatewayplan.drain_step(_only(gw_entry, j.new_heads), inv, f"{jp}gateway-drain", "rollback")
            back.append(planner._stop_step(inv, f"{jp}stop", "rollback", j.nodes, ports, p.serve.stop_timeout_s,
                                           f"stop {res.name} on {_words(j.nodes)} (replaced before)", dj))
            back += _restore(j, jp, prev, prev_res, prev_rendering, inv, dj)
        restored = replace(prev, state="serving", updated_at=started_at,
                           note=f"{rollback_note}: {res.name}'s replica on {_words(g.nodes)} did not come up; "
                           f"{prev.profile} serves again")
        # the old stack serves again whatever the record says: a record that cannot be written ends
        # the run (status then names the run that did not record its outcome), it stops nothing
        back.append(planner.record_step(inv, f"rb{k}-record", "rollback", head, restored,
                                        f"record {prev.profile} serving again", on_fail="abort"))
        branches[rb] = tuple(back)
    last = BRANCH.format(k=n)
    steps += planner._persist_step(res, inv, list(rendering.layout.nodes), "", last)
    serving = replace(starting, state="serving", note="", gateway=gw_entry)
    steps.append(planner.record_step(inv, "record", "record", head, serving, f"record {res.name} serving",
                                     on_fail=last))
    # Ctrl-C from replica K's first step until it is registered stops replica K's nodes alone (branch
    # degraded-K-K), never what serves; after its registration (until replica K+1's first step, or
    # after the last replica's until the end) it stops nothing: branch paused-K records what serves
    fix = f"`sparkctl switch {res.name}` again resumes, or `sparkctl down`"
    for g in roll:
        mix, what = _mixed(res, starting, gw_entry, roll[:g.index],
                           _old_entries(prev, [o for o in roll[g.index:] if o.old_heads]), prev, started_at)
        note = (f"degraded: switch to {res.name} interrupted (Ctrl-C) after replica {g.index} "
                f"({_words(g.nodes)}) was registered; {what}; {fix}")
        branches[f"paused-{g.index}"] = (planner.record_step(
            inv, f"ps{g.index}-record", "record", head, replace(mix, note=note), f"record degraded: {what}",
            on_fail="abort", note_if_interrupted=note),)
    marked, cur, registered = [], 0, False
    for s in steps:
        at = next((k for k in interrupt if s.id.startswith(f"r{k}-")), None)
        if at is not None and at != cur:
            cur, registered = at, False
        if cur and (registered or interrupt.get(cur)):
            s = replace(s, on_interrupt=f"paused-{cur}" if registered else interrupt[cur])
        registered = registered or s.id == f"r{cur}-gateway-register"
        marked.append(s)
    steps = marked
    return Plan(base.op, res.name, tuple(steps), {**branches, "stop": base.branches["stop"]},
                reads=(*base.reads, f"the gateway on {setup.node}"),
                outage=rolling_outage(res, prev, roll))


def rolling_outage(res: Resolved, prev: RunRecord, roll: Sequence[Group]) -> str:
    new, old = res.profile.model.served_name, prev.served_name
    text = (f"none expected: {len(roll)} replicas replaced one at a time behind the gateway; the others serve "
            "throughout")
    if new != old:
        text += (f"; the served name changes: requests for {old!r} go to the old replicas still up and get 404 "
                 f"model_not_found once the last one is drained (step r{len(roll)}-gateway-drain); requests for "
                 f"{new!r} get 404 until the first new replica is registered (step r1-gateway-register)")
    return text


def held_names(res: Resolved, prev: RunRecord, gateway: tuple[gatewayplan.GatewaySetup, Any] | None
               ) -> list[str]:
    """The served names a plain switch holds at the gateway (the old one, and the new one if it
    differs): both stacks behind the same gateway, else none."""
    if gateway is None or not prev.gateway or prev.gateway.get("node") != gateway[0].node:
        return []
    return list(dict.fromkeys([prev.served_name, res.profile.model.served_name]))


def hold_seconds(res: Resolved, prev: RunRecord) -> int:
    """How long a hold lasts at most (smg's settle time for the stand-in): the drain, the stop, the
    ready wait and the gateway's own steps; ``gateway-release`` ends it as soon as the new replicas
    are registered."""
    p = res.profile
    return int((prev.gateway or {}).get("drain_timeout_s", 600)) + p.serve.stop_timeout_s \
        + p.serve.ready_timeout_s + 600


def outage_text(res: Resolved, prev: RunRecord, why: str, held: bool) -> str:
    """The expected outage of a plain switch (nothing stays up), as ``plan switch`` prints it."""
    p = res.profile
    secs = p.serve.stop_timeout_s + p.serve.ready_timeout_s
    old, new = prev.served_name, p.model.served_name
    text = (f"{old!r} unavailable from the stop of {prev.profile} until {res.name} is ready"
            f"{' and registered' if held else ''}: up to ~{secs} s (stop up to {p.serve.stop_timeout_s} s, "
            f"ready up to {p.serve.ready_timeout_s} s) ({why})")
    if held:
        names = " and ".join(repr(n) for n in dict.fromkeys([old, new]))
        text += (f"; through the gateway, requests for {names} get 503 with Retry-After: 1 from step gateway-hold "
                 "to gateway-release (never 404; the gateway keeps listening: no refused connection unless its "
                 "own files change and it restarts)")
    else:
        text += "; clients of the replicas' own ports see refused connections"
    if new != old:
        text += f"; afterwards {old!r} gets 404 model_not_found and {new!r} is served"
    return text


# --------------------------------------------------------------------------- the switch


ENSURE_IDS = ("gateway-wheels", "gateway-install", "gateway-push", "gateway-start")


def plan_switch(res: Resolved, inv: Inventory, rendering: Rendering, facts: planner.UpFacts, *, sets: Sequence[str] = (),
                waivers: Mapping[str, str] | None = None, started_at: str = "", skip_check: bool = False,
                previous: tuple[Resolved, Rendering] | None = None, op: str = "switch",
                gateway: tuple[gatewayplan.GatewaySetup, gatewayplan.GatewayFacts] | None = None,
                rollback_note: str = "rolled back",
                probes: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {})) -> Plan:
    """``up`` of the new profile whose failure, once the old stack is stopped, brings the old one back.

    ``rollback_note``: the note of the record the way back writes (a supervised switch says who rolled back)."""
    prev = facts.record
    if previous is None or prev is None or prev.state != "serving" or prev.profile == res.name:
        return planner.plan_up(res, inv, rendering, facts, sets=sets, waivers=waivers, started_at=started_at,
                       skip_check=skip_check, op=op, gateway=gateway, probes=probes)
    base = planner.plan_up(res, inv, rendering, facts, sets=sets, waivers=waivers, started_at=started_at,
                   skip_check=skip_check, op=op, failure_branch="rollback", gateway=gateway, probes=probes)
    roll, why = groups(rendering.layout, previous[1].layout)
    if gateway and not prev.gateway:
        roll, why = [], f"{prev.profile} is not behind the gateway"
    elif gateway and prev.gateway.get("node") != gateway[0].node:
        roll, why = [], f"the gateway moves from {prev.gateway.get('node')} to {gateway[0].node}"
    elif not gateway:
        roll, why = [], "no gateway (serve.gateway) in front of the replicas"
    if roll and gateway:
        return plan_rolling(res, inv, rendering, base, prev, previous, gateway, roll, sets=sets,
                                    waivers=dict(waivers or {}), started_at=started_at, rollback_note=rollback_note)
    prev_res, prev_rendering = previous
    head = inv.nodes[0].name
    ports = sorted({res.profile.serve.port, res.profile.serve.master_port, prev.port})
    new_gw = gatewayplan.record_entry(res, inv, rendering, gateway[0]) if gateway else {}
    back = [*gatewayplan.drain_step(new_gw, inv, "rollback-gateway-deregister", "rollback", wait=False),
            planner._stop_step(inv, "rollback-stop", "rollback", planner.own_nodes(rendering, prev), ports,
                       res.profile.serve.stop_timeout_s, f"stop what {res.name} started", "stop")]
    back += [replace(s, phase="rollback", on_fail="continue" if s.on_fail == "continue" else "stop")
             for s in planner._bring_up(prev_res, inv, prev_rendering, list(prev_rendering.layout.nodes), "rollback-", "stop")]
    back += gatewayplan.register_step(prev.gateway, inv, "rollback-gateway-register", "rollback", "stop")
    steps, branches = list(base.steps), dict(base.branches)
    held = held_names(res, prev, gateway)
    if held:  # no replica stays up: the names answer 503 + Retry-After at the gateway, never 404
        settle = hold_seconds(res, prev)
        # the gateway's files (its ctl, which holds) first, before the record changes: nothing stopped yet
        ensure = [replace(s, on_fail="abort") for s in steps if s.id in ENSURE_IDS]
        steps = [s for s in steps if s.id not in ENSURE_IDS]
        at = next(i for i, s in enumerate(steps) if s.id == "record-start")
        steps[at:at] = ensure
        at = next(i for i, s in enumerate(steps) if s.id in ("gateway-drain", "stop-stale"))
        steps[at:at] = gatewayplan.hold_step(prev.gateway, inv, "gateway-hold", "stop-stale", held, settle)
        at = next(i for i, s in enumerate(steps) if s.id == "gateway-register") + 1
        steps[at:at] = gatewayplan.release_step(prev.gateway, inv, "gateway-release", "gateway", held)
        back += gatewayplan.release_step(prev.gateway, inv, "rollback-gateway-release", "rollback", held)
        # nothing serves at the end of the stop branch: the names are released (404 from then on)
        branches["stop"] = (*branches["stop"][:-1], *gatewayplan.release_step(
            prev.gateway, inv, "gateway-release-stopped", "rollback", held), branches["stop"][-1])
    restored = replace(prev, state="serving", updated_at=started_at, note=rollback_note)
    back.append(planner.record_step(inv, "rollback-record", "rollback", head, restored,
                             f"record {prev_res.name} serving again", on_fail="stop"))
    return replace(base, steps=tuple(steps), branches={"rollback": tuple(back), **branches},
                   reads=(*base.reads, f"{prev.profile}'s profile and files (the way back)"),
                   outage=outage_text(res, prev, why, bool(held)))
