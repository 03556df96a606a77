"""The switch_subnet law: every fabric port on one switch subnet answers its peers at jumbo MTU.

Behind a switch a port's own facts (link up, MTU, address: the fabric law) do not show
that the switch carries its frames: a switch port left at MTU 1500, in the wrong VLAN or
bridge, or a cable in another node's cage looks healthy from the node. NVIDIA's switch
playbook (github.com/NVIDIA/dgx-spark-playbooks, nvidia/multi-sparks-through-switch/README.md)
needs all ports in one layer-2 domain; NCCL then needs every rank to reach every other on
each subnet it uses. The check: the don't-fragment pings of MTU-28 bytes that ``check``
sends on each subnet between every pair of ports of one replica's nodes and between each
port and the next around the subnet, once per pair, from either end (one echo and its reply
cross both switch ports both ways: sparkctl.ops.check ``switch_pairs``); a pair counts as
probed, and as silent, whichever end sent the ping. A port's peers, for its verdict, are
the ones it was probed with.

Pure: verdicts over the probes' results.
"""

from __future__ import annotations

from collections import defaultdict

from sparkctl.model.switched import group_name
from sparkctl.plan.laws.base import FAIL, OK, SKIP, Context, Verdict

LAW = "switch_subnet"


def check_switch_subnet(ctx: Context) -> list[Verdict]:
    inv = ctx.inventory
    if inv.topology != "switch":
        return []
    nodes = [n for n in ctx.nodes if n not in ctx.unreachable]
    mtu = inv.mtu
    size = mtu - 28
    # (node, netdev) -> its link; the probes go by the netdev they leave from
    ends = {(lk.a.node, lk.a.netdev): lk for lk in inv.links if lk.a.node in nodes}
    members: dict[str, list[str]] = defaultdict(list)  # subnet -> nodes on it
    for (node, _), lk in ends.items():
        members[lk.subnet].append(node)
    failed: dict[str, set[tuple[str, str]]] = defaultdict(set)  # subnet -> {(from, to)} without an answer
    probed: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for pr in ctx.link_probes:
        on = ends.get((pr.node, pr.netdev))
        if on is None or pr.df_ping_ok is None:
            continue
        probed[on.subnet].add((pr.node, pr.peer))
        if pr.df_ping_ok is False:
            failed[on.subnet].add((pr.node, pr.peer))

    def probed_with(node: str, subnet: str) -> list[str]:
        return [m for m in members[subnet] if m != node
                and ((node, m) in probed[subnet] or (m, node) in probed[subnet])]

    out: list[Verdict] = []
    for (node, netdev), lk in sorted(ends.items(), key=lambda kv: (kv[1].subnet, kv[0])):
        group = group_name(lk.a.port, lk.twin)
        where = f"{netdev} ({group}, {lk.subnet})"
        if not any(m != node for m in members[lk.subnet]):
            out.append(Verdict(LAW, node, SKIP, f"no peer on {lk.subnet}", "peers on the subnet", subject=netdev))
            continue
        peers = probed_with(node, lk.subnet)
        if not peers:
            out.append(Verdict(LAW, node, SKIP, "not probed (no fabric probes ran)",
                               f"{size}-byte DF pings on {lk.subnet}", subject=netdev))
            continue
        silent = sorted({p for p in peers if (node, p) in failed[lk.subnet] or (p, node) in failed[lk.subnet]})
        # a port no peer reaches and that reaches no peer is the one to fix; its peers are only its witnesses
        if silent and len(silent) == len(peers) and len(peers) > 1 or silent and len(peers) == 1:
            out.append(Verdict(
                LAW, node, FAIL, f"{node}:{where} answers none of its {len(peers)} peers at {size}-byte DF pings",
                f"every peer on {lk.subnet} answers a {size}-byte don't-fragment ping",
                f"check {node}:{netdev}'s cable to {inv.switch_name} (the same cage as the other nodes'), that the "
                f"switch port is up, in the same layer-2 domain as its peers and carries MTU {mtu} "
                f"(switch.mtu_bytes), and that {netdev} has MTU {mtu} and {lk.a.address}/24 "
                "(`sparkctl fabric apply`)", netdev))
            continue
        culprits = {p for p in silent if _answers_none(p, probed_with(p, lk.subnet), failed[lk.subnet])}
        rest = [p for p in silent if p not in culprits]
        if rest:
            out.append(Verdict(
                LAW, node, FAIL, f"no {size}-byte DF answer between {node}:{netdev} and {', '.join(rest)}",
                f"every peer on {lk.subnet} answers a {size}-byte don't-fragment ping",
                f"MTU or path between {node} and {', '.join(rest)} on {group}: set MTU {mtu} on both ports and on "
                f"their switch ports", netdev))
        else:
            note = f" (not {', '.join(sorted(culprits))}, which answers no peer)" if culprits else ""
            out.append(Verdict(LAW, node, OK, f"{len(peers) - len(culprits)} of {len(peers)} peers answer "
                               f"{size}-byte DF pings{note}", f"every peer on {lk.subnet}", subject=netdev))
    return out


def _answers_none(node: str, peers: list[str], failed: set[tuple[str, str]]) -> bool:
    """``node`` was probed with more than one peer and answered none of them."""
    return len(peers) > 1 and all((node, p) in failed or (p, node) in failed for p in peers)
