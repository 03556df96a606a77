"""``sparkctl check``: probe every node in parallel, judge every law, optionally fix.

The edge between the pure laws and the hosts: it gathers facts through the
transport (one batched probe script per node, then one fabric probe script per
node), hands them to :func:`sparkctl.plan.laws.judge`, and with ``fix`` runs the
safe remedies (the clock cap, the page cache) as a plan (:func:`fix_plan`, with
the inventory's sudo) and judges again. It changes nothing otherwise. Inside a
plan's check step it runs exactly the probe scripts the step lists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from sparkctl.facts.batch import build_script, parse_batch, remote_command
from sparkctl.facts.engine import EngineProbe
from sparkctl.facts.fabric import FabricTarget, build_fabric_script, parse_fabric
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import Layout, bind
from sparkctl.model.paths import ENV_FILE, under
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import on_node_host
from sparkctl.ops import weights
from sparkctl.ops.hub import local_dir_of
from sparkctl.ops.localstate import cluster_dir, hw_change_path, read_json, write_json
from sparkctl.plan import laws
from sparkctl.plan.laws.images import engine_target
from sparkctl.plan.render import API_KEY_VAR, bind_host
from sparkctl.plan.steps import Plan, Step, describe
from sparkctl.transport import Transport

T = TypeVar("T")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CheckReport:
    profile: str
    nodes: tuple[str, ...]
    verdicts: tuple[laws.Verdict, ...]
    facts: Mapping[str, NodeFacts | None]
    fixed: tuple[str, ...] = ()
    waivers: Mapping[str, laws.Waiver] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(v.failed for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile, "ok": self.ok, "nodes": list(self.nodes), "duration_s": round(self.duration_s, 3),
            "waivers": {k: w.reason for k, w in self.waivers.items()}, "fixed": list(self.fixed),
            "verdicts": [v.__dict__ for v in self.verdicts],
        }


def load_hw_change(inv: Inventory) -> laws.HwChange | None:
    data = read_json(hw_change_path(inv))
    if not data:
        return None
    return laws.HwChange(note=data["note"], at=data["at"], boot_ids=data["boot_ids"], nodes=tuple(data["nodes"]))


def boot_id_command(inv: Inventory, node: str) -> str:
    import shlex

    return f"cat {shlex.quote(inv.node(node).proc_root.rstrip('/') + '/sys/kernel/random/boot_id')}"


def record_hw_change(inv: Inventory, transport: Transport, note: str, nodes: list[str] | None = None) -> laws.HwChange:
    """Record a cable/PCIe change with every affected node's current boot id."""
    from sparkctl.errors import TransportError

    names = nodes or list(inv.names)
    res = transport.run_all({n: boot_id_command(inv, n) for n in names})
    res.raise_for("reading the boot id", TransportError, hint="the record needs every node")
    rec = laws.HwChange(note=note, at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        boot_ids={n: r.stdout.strip() for n, r in res.items()}, nodes=tuple(names))
    write_json(hw_change_path(inv), {"note": rec.note, "at": rec.at, "boot_ids": dict(rec.boot_ids),
                                     "nodes": list(rec.nodes)})
    return rec


def clear_hw_change_if_done(inv: Inventory, report: CheckReport) -> bool:
    """Once every node of a pending change passes the AC-cycle law, the record is closed."""
    path = hw_change_path(inv)
    data = read_json(path)
    if not data:
        return False
    ac = [v for v in report.verdicts if v.law == "ac_cycle" and v.node in data["nodes"]]
    if ac and all(v.status == laws.OK for v in ac) and set(data["nodes"]) <= set(report.nodes):
        path.rename(path.with_name(f"hw-change.done.{int(time.time())}.json"))
        return True
    return False


def subnet_pairs(ends: Sequence[T]) -> list[tuple[T, T]]:
    """Each unordered pair of ``ends`` once, as (the one that pings, the one it pings).

    One echo and its reply carry the payload both ways at the same size, so a pair that
    answers a don't-fragment ping at jumbo MTU has carried jumbo frames in both directions
    through both switch ports: pinging it again from the other end adds nothing the
    switch_subnet law reads (it counts a pair probed from either end). Spread so that every
    port sends about half of its subnet's pings (the k-th pings the next (N-1)/2 around the
    list, and the one across when N is even, from the first half), not the first all and
    the last none: the slowest node sets the check's time.
    """
    n = len(ends)
    out = []
    for k, me in enumerate(ends):
        for d in range(1, (n - 1) // 2 + 1):
            out.append((me, ends[(k + d) % n]))
        if n % 2 == 0 and k < n // 2:
            out.append((me, ends[k + n // 2]))
    return out


def switch_pairs(ends: Sequence[T], groups: Sequence[Sequence[T]]) -> list[tuple[T, T]]:
    """The pairs of one switch subnet's ``ends`` that the switch_subnet law pings: every pair
    inside each of ``groups`` (the ends of one replica's nodes: one NCCL world, whose ranks
    all reach each other), and each end with the next around the subnet, so every port, a
    node outside any replica too, proves jumbo frames both ways through the switch and has
    two witnesses on the subnet. Replicas never exchange a byte over the fabric, so a pair
    across two of them carries nothing this launch needs: the pings grow with the nodes times
    the replica's size, not with the square of the nodes (16 nodes as four TP4 replicas:
    28 pairs per subnet, not 120). A pair appears once, pinged from either end as
    :func:`subnet_pairs` spreads it."""
    out: list[tuple[T, T]] = []
    seen: set[frozenset[T]] = set()

    def add(a: T, b: T) -> None:
        if a != b and frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            out.append((a, b))

    for g in groups:
        for a, b in subnet_pairs([e for e in ends if e in g]):
            add(a, b)
    if len(ends) > 1:
        for k, me in enumerate(ends):
            add(me, ends[(k + 1) % len(ends)])
    return out


def _fabric_targets(inv: Inventory, nodes: tuple[str, ...], groups: Sequence[Sequence[str]] = ()
                    ) -> dict[str, list[FabricTarget]]:
    """What each of ``nodes`` probes; ``groups``: the replicas' node sets (a switch's pairs)."""
    targets: dict[str, list[FabricTarget]] = {n: [] for n in nodes}
    inside = set(nodes)
    for i, lk in enumerate(inv.links):
        if lk.a.node == lk.b.node or lk.a.node not in inside or lk.b.node not in inside:
            continue
        for me, peer in ((lk.a, lk.b), (lk.b, lk.a)):
            targets[me.node].append(FabricTarget("df", me.netdev, peer.node, peer.address))
        targets[lk.b.node].append(FabricTarget("bw-server", lk.b.netdev, lk.a.node, "", lk.b.rdma, 18515 + i))
        targets[lk.a.node].append(FabricTarget("bw-client", lk.a.netdev, lk.b.node, lk.b.address, lk.a.rdma,
                                               18515 + i))
    if inv.topology == "switch":
        # the pairs of ports the switch_subnet law reads, one subnet per port group
        on: dict[str, list[Any]] = {}
        for lk in inv.links:
            if lk.a.node in inside and lk.a.node == lk.b.node:
                on.setdefault(lk.subnet, []).append(lk.a)
        for ends in on.values():
            for me, peer in switch_pairs(ends, [[e for e in ends if e.node in g] for g in groups]):
                targets[me.node].append(FabricTarget("df", me.netdev, peer.node, peer.address))
    if inv.topology == "ring":
        for n in nodes:
            for other in nodes:
                if other != n and other not in inv.neighbours(n):
                    addr = inv.primary_address(other)
                    if addr:
                        targets[n].append(FabricTarget("relay", "", other, addr))
    return targets


def probe_scripts(res: Resolved, inv: Inventory) -> dict[str, str]:
    """The one batched probe script per node that ``check`` runs (reads only): what a check step lists."""
    layout = bind(res, inv)
    heads = {r.node for r in layout.heads()}
    p = res.profile

    def head_endpoint(n: str) -> dict[str, Any]:
        # serve.bind and serve.api_key_env: the models fact asks the address the engine listens on,
        # with the key from the head's 0600 env file (sparkctl.facts.services)
        r = next(h for h in layout.heads() if h.node == n)
        return {"endpoint_host": on_node_host(bind_host(res.for_node(n), r, inv.node(n).host)),
                "endpoint_key": (under(inv.node(n).prefix, ENV_FILE), API_KEY_VAR) if p.serve.api_key_env else None}

    return {
        n: remote_command(build_script(
            inv.node(n), weights_path=p.model.weights_path, endpoint_port=p.serve.port if n in heads else None,
            weights=weights.probe_paths(inv, n, local_dir_of(p.model.weights_path, p.model.local_dir)),
            engine=EngineProbe(*engine_target(p)), **(head_endpoint(n) if n in heads else {})))
        for n in layout.nodes
    }


def fabric_scripts(inv: Inventory, nodes: tuple[str, ...], bandwidth_s: int = 0,
                   groups: Sequence[Sequence[str]] = ()) -> tuple[dict[str, str], dict[str, list[FabricTarget]]]:
    """The fabric probe script per node among ``nodes`` (reads only) and the targets each probes;
    ``groups``: the nodes of each replica (:func:`replica_groups`)."""
    targets = _fabric_targets(inv, nodes, groups)
    return ({n: remote_command(build_fabric_script(t, inv.mtu, bandwidth_s))
             for n, t in targets.items() if t}, targets)


def replica_groups(layout: Layout) -> tuple[tuple[str, ...], ...]:
    """The nodes of each replica of ``layout``: one NCCL world each."""
    return tuple(tuple(dict.fromkeys(r.node for r in rep)) for rep in layout.replicas)


def check_probes(res: Resolved, inv: Inventory) -> tuple[dict[str, str], dict[str, str]]:
    """The scripts a plan's check step lists: the batched probe and the fabric probe, per node."""
    layout = bind(res, inv)
    return probe_scripts(res, inv), fabric_scripts(inv, tuple(layout.nodes), groups=replica_groups(layout))[0]


def run_check(
    res: Resolved,
    inv: Inventory,
    transport: Transport,
    *,
    waivers: Mapping[str, laws.Waiver] | None = None,
    fix: bool = False,
    bandwidth_s: int = 0,
    fabric: bool = True,
    progress: Progress | None = None,
    planned: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
    fix_runner: Callable[[Plan], Any] | None = None,
) -> CheckReport:
    """``planned``: (the probe scripts, the fabric probe scripts) a plan's check step lists: only
    those run (the fabric ones only when every node answered the first). ``fix``: the safe
    remedies become a plan (:func:`fix_plan`) that ``fix_runner`` runs (the executor's)."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    layout = bind(res, inv)
    nodes = layout.nodes
    heads = {r.node for r in layout.heads()}
    waivers = dict(waivers or {})
    p = res.profile

    def gather() -> tuple[dict[str, NodeFacts | None], dict[str, str]]:
        say(f"probing {len(nodes)} nodes (one batched script each)")
        scripts = dict(planned[0]) if planned is not None else probe_scripts(res, inv)
        results = transport.run_all(scripts)
        facts: dict[str, NodeFacts | None] = {}
        unreachable: dict[str, str] = {}
        for n in nodes:
            r = results[n]
            if r.error:
                facts[n] = None
                unreachable[n] = r.error
            else:
                facts[n] = parse_batch(n, r.stdout)
        return facts, unreachable

    facts, unreachable = gather()
    link_probes: list[laws.LinkProbe] = []
    relay_ok: dict[tuple[str, str], bool] = {}
    if fabric:
        answered = tuple(n for n in nodes if facts.get(n) is not None)
        scripts, targets = fabric_scripts(inv, answered if planned is None else nodes, bandwidth_s,
                                          replica_groups(layout))
        if planned is not None:  # exactly the listed scripts, or none when a node did not answer
            scripts = dict(planned[1]) if len(answered) == len(nodes) else {}
        if scripts:
            say("probing the fabric (don't-fragment pings" + (", ib_write_bw" if bandwidth_s else "") + ", relay)")
            results = transport.run_all(scripts)
            for n, r in results.items():
                if r.error:
                    continue
                for t, reached, bw in parse_fabric(targets[n], r.stdout):
                    if t.kind == "relay" and reached is not None:
                        relay_ok[(n, t.peer)] = reached
                    elif t.kind == "df" and reached is not None:
                        link_probes.append(laws.LinkProbe(n, t.netdev, t.peer, t.address, df_ping_ok=reached))
                    elif t.kind == "bw-client" and bw is not None:
                        link_probes.append(laws.LinkProbe(n, t.netdev, t.peer, t.address, bandwidth_gbps=bw))
    hw = load_hw_change(inv)
    stale_path = cluster_dir(inv) / "stale-links.json"
    stale_seen: dict[str, str] = dict(read_json(stale_path) or {})

    def context() -> laws.Context:
        endpoint = {}
        for h in heads:
            f = facts.get(h)
            if f is not None:
                endpoint[h] = f.served_models if f.served_models is not None else None
        return laws.Context(profile=p, inventory=inv, nodes=nodes, facts=facts, unreachable=unreachable,
                            waivers=waivers, hw_change=hw, link_probes=tuple(link_probes), relay_ok=relay_ok,
                            endpoint_models=endpoint, stale_seen=stale_seen, profile_name=res.name)

    verdicts = laws.judge(context())
    if fabric and bandwidth_s:
        # Remember when each stale link was first seen, so a later check can say
        # that a reboot in between did not clear it; forget the healthy ones.
        now_stale = laws.stale_links(context())
        seen = {}
        for node, items in now_stale.items():
            f = facts.get(node)
            for nd, _ in items:
                key = f"{node}:{nd}"
                seen[key] = stale_seen.get(key) or (f.boot_id if f and f.boot_id else "")
        if seen != stale_seen:
            write_json(stale_path, seen)
    fixed: list[str] = []
    if fix:
        plan = fix_plan(res.name, inv, context(), verdicts)
        if plan.steps:
            for line in describe(plan):
                say(line)
            if fix_runner is None:
                raise ValueError("check --fix runs its remedies as a plan: pass fix_runner (ops.executor.plan_runner)")
            outcomes = fix_runner(plan)
            for o in outcomes:
                fixed.append(f"{o['id']}: {'ok' if o['ok'] else o['detail']}")
            say("re-probing after the fixes")
            facts, unreachable = gather()
            verdicts = laws.judge(context())
    return CheckReport(profile=res.name, nodes=nodes, verdicts=tuple(verdicts), facts=facts, fixed=tuple(fixed),
                       waivers=waivers, duration_s=time.perf_counter() - t0)


def fix_plan(profile: str, inv: Inventory, ctx: laws.Context, verdicts: Sequence[laws.Verdict]) -> Plan:
    """``check --fix``: one step per law with a safe remedy, its commands in order on each node
    (stopping at the first that fails there), as root where the inventory allows sudo. Pure."""
    steps: list[Step] = []
    for law in laws.LAWS:
        if law.remedy is None:
            continue
        remedy = law.remedy(ctx, [v for v in verdicts if v.law == law.id])
        if remedy is None or not remedy.safe or not remedy.commands:
            continue
        cmds = {n: " && ".join(cs) for n, cs in remedy.commands.items() if cs}
        steps.append(Step(f"fix-{law.id}", "fix", "run", tuple(cmds), f"the remedy of law {law.id}"
                          + (f": {remedy.text}" if remedy.text else ""), changes=f"what law {law.id} fixes",
                          commands=cmds, sudo={n: inv.node(n).sudo for n in cmds}, on_fail="continue"))
    return Plan("check --fix", profile, tuple(steps), reads=("every law's facts on " + ", ".join(ctx.nodes),))
