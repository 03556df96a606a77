"""Laws about the fabric: cabled links (state, speed, MTU, address, GID, DF ping, relay) and the AC cycle.

On a switched cluster the fabric law judges each node's switch ports (state, speed, MTU, address,
GID); the pings between them are the switch_subnet law's (sparkctl.plan.laws.switch).

Pure checks over NodeFacts and the active probes' results. Nothing here touches a host.
"""

from __future__ import annotations

from sparkctl.model.inventory import Endpoint, Link
from sparkctl.model.netplanfile import foreign, split_ports
from sparkctl.plan.laws.base import (
    AC_CYCLE_FIX,
    BANDWIDTH_FLOOR_GBPS,
    FAIL,
    NOMINAL_SPEED_MBPS,
    OK,
    Context,
    Verdict,
    facts_of,
)
from sparkctl.plan.laws.hardware import slot_share

# --------------------------------------------------------------------------- fabric


def _cabled_links(ctx: Context) -> list[Link]:
    nodes = set(ctx.nodes)
    return [lk for lk in ctx.inventory.links if lk.a.node in nodes and lk.b.node in nodes and lk.a.node != lk.b.node]


def _end_verdicts(ctx: Context, ep: Endpoint, cable: str) -> list[Verdict]:
    out: list[Verdict] = []
    mtu = ctx.inventory.mtu
    f = facts_of(ctx, ep.node)
    if f is None:
        return out
    lf = f.links.get(ep.netdev) if getattr(f, "links", None) else None
    if lf is None:
        out.append(Verdict("fabric", ep.node, FAIL, "interface missing", ep.netdev,
                           f"{ep.netdev} not found on {ep.node}: check the inventory's port names", cable))
        return out
    problems = []
    if lf.operstate != "up":
        problems.append(f"link {lf.operstate}")
    if lf.speed_mbps is not None and lf.speed_mbps < NOMINAL_SPEED_MBPS and lf.operstate == "up":
        problems.append(f"speed {lf.speed_mbps} Mb/s")
    if lf.mtu != mtu:
        problems.append(f"MTU {lf.mtu}")
    want_addr = f"{ep.address}/24"
    if lf.ipv4 != want_addr:
        problems.append(f"address {lf.ipv4 or 'none'}")
    if lf.operstate == "up" and lf.gid_index_rocev2_ipv4 is None:
        problems.append(f"no RoCEv2 IPv4 GID on {ep.rdma}")
    # netplan merges every file's addresses for a device (netplan doc/netplan-generate.md): a foreign
    # file on this port (NVIDIA's playbook leaves /etc/netplan/40-cx7.yaml) is a second address and GID
    others = [nf.path for nf in foreign(getattr(f, "netplan_files", None) or ())
              if ep.netdev in split_ports(nf, (ep.netdev,))[0]]
    if others:
        problems.append(f"{', '.join(others)} also configures {ep.netdev}")
    if problems:
        fix = []
        if any(p.startswith("link") for p in problems):
            fix.append(f"check the cable {cable} (seated at both ends?) and `ip link set {ep.netdev} up`")
        if any(p.startswith("MTU") for p in problems):
            fix.append(f"set MTU {mtu} on {ep.node}:{ep.netdev} (both ends must match)")
        if others:
            fix.append(f"run `sparkctl fabric apply`: it takes {', '.join(others)} into its backup when the "
                       "file configures fabric ports only (`fabric restore` puts it back), and refuses, "
                       "naming it, when it configures another interface too")
        if any(p.startswith("address") for p in problems) and not others:
            fix.append("run `sparkctl fabric apply` (pushes and applies the netplan file on every node)")
        if any(p.startswith("speed") for p in problems):
            fix.append(AC_CYCLE_FIX)
        if any(p.startswith("no RoCE") for p in problems):
            fix.append("re-apply the address; the GID appears once the interface has its IPv4 address")
        out.append(Verdict("fabric", ep.node, FAIL, "; ".join(problems),
                           f"up, {NOMINAL_SPEED_MBPS} Mb/s, MTU {mtu}, {want_addr}", "; ".join(fix), cable))
    else:
        out.append(Verdict("fabric", ep.node, OK,
                           f"up {lf.speed_mbps} Mb/s MTU {lf.mtu} GID {lf.gid_index_rocev2_ipv4}",
                           f"up, MTU {mtu}", subject=f"{ep.netdev}"))
    return out


def _switch_ends(ctx: Context) -> list[tuple[Endpoint, str]]:
    """A switched cluster's ports: each node's end with what it is cabled to (the switch, the subnet)."""
    nodes = set(ctx.nodes)
    inv = ctx.inventory
    return [(lk.a, f"{lk.a.node}:{lk.a.netdev} <-> {inv.switch_name} ({lk.subnet})")
            for lk in inv.links if lk.a.node in nodes and lk.a.node == lk.b.node]


def check_fabric(ctx: Context) -> list[Verdict]:
    out: list[Verdict] = []
    mtu = ctx.inventory.mtu
    ends = [(ep, f"{lk.a.node}:{lk.a.netdev} <-> {lk.b.node}:{lk.b.netdev}")
            for lk in _cabled_links(ctx) for ep in (lk.a, lk.b)]
    if ctx.inventory.topology == "switch":
        ends = _switch_ends(ctx)
    for ep, cable in ends:
        out.extend(_end_verdicts(ctx, ep, cable))
    if ctx.inventory.topology == "switch":
        # the don't-fragment pings between ports on one switch subnet are the switch_subnet law's
        return out
    for probe in ctx.link_probes:
        if probe.df_ping_ok is False:
            out.append(Verdict("fabric", probe.node, FAIL, "don't-fragment ping failed",
                               f"{mtu - 28}-byte DF ping to {probe.peer_address}",
                               f"MTU mismatch or dead path between {probe.node}:{probe.netdev} and {probe.peer}: "
                               f"set MTU {mtu} at both ends", probe.netdev))
    for (src, dst), ok in ctx.relay_ok.items():
        if not ok:
            out.append(Verdict("fabric", src, FAIL, f"{dst} unreachable", "reachable through the relay",
                               "run `sparkctl fabric apply`: the relays need IP forwarding (net.ipv4.ip_forward=1), "
                               "the routes, and a DOCKER-USER rule accepting the fabric subnets (Docker's FORWARD "
                               "DROP policy looks exactly like a dead cable)", f"-> {dst}"))
    return out


def stale_links(ctx: Context) -> dict[str, list[tuple[str, str]]]:
    """node -> [(netdev, description)] for every twin measured below the floor, at both ends."""
    out: dict[str, list[tuple[str, str]]] = {}
    for probe in ctx.link_probes:
        lk = next((lk for lk in ctx.inventory.links if lk.touches(probe.node) and lk.touches(probe.peer)
                   and lk.end(probe.node).netdev == probe.netdev), None)
        # A twin behind a narrower slot (the GX10's x2 root port) carries that share of a full one.
        share = min([slot_share(ctx, probe.node, probe.netdev)]
                    + ([slot_share(ctx, lk.other(probe.node).node, lk.other(probe.node).netdev)] if lk else []))
        floor = BANDWIDTH_FLOOR_GBPS * share
        if probe.bandwidth_gbps is None or probe.bandwidth_gbps >= floor:
            continue
        desc = f"{probe.bandwidth_gbps:.1f} Gb/s, link up at nominal speed" + (
            f" (below {floor:.0f} Gb/s, what its PCIe slot allows)" if share < 1.0 else "")
        out.setdefault(probe.node, []).append((probe.netdev, f"{probe.netdev} {desc}"))
        if lk is not None:
            peer = lk.other(probe.node)
            out.setdefault(peer.node, []).append((peer.netdev, f"{peer.netdev} {desc} (measured from {probe.node})"))
    return out


def check_ac_cycle(ctx: Context) -> list[Verdict]:
    if not ctx.profile.laws.ac_cycle:
        return []
    out: list[Verdict] = []
    stale = stale_links(ctx)
    hw = ctx.hw_change
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        boot = getattr(f, "boot_id", None)
        reasons = []
        if hw and node in hw.nodes and hw.boot_ids.get(node) == boot:
            reasons.append(f"not rebooted since the hardware change '{hw.note}' ({hw.at})")
        if node in stale:
            rebooted = any(ctx.stale_seen.get(f"{node}:{nd}") not in (None, boot) for nd, _ in stale[node])
            rebooted = rebooted or bool(hw and node in hw.nodes and hw.boot_ids.get(node) != boot)
            reasons.append("stale link: " + "; ".join(d for _, d in stale[node])
                           + ("; the node has rebooted since, and a warm reboot did not clear it" if rebooted else ""))
        if reasons:
            out.append(Verdict("ac_cycle", node, FAIL, "; ".join(reasons), "booted after the change, links at full rate",
                               f"{node} and its cable peers: {AC_CYCLE_FIX}"))
        else:
            out.append(Verdict("ac_cycle", node, OK, "no pending change" if not hw else "booted since the change",
                               "links at full rate"))
    return out
