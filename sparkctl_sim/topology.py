"""From an inventory to a simulated cluster, and the inventory the sim writes.

``sim_inventory_text`` writes the inventory a user points sparkctl at (the same
format as a real one; only the hosts, keys and, in rootless mode, the roots
differ). ``spec_from_inventory`` turns the derived fabric plan (links, routes,
addresses) into the :class:`~sparkctl_sim.spec.ClusterSpec` the namespace
machinery builds, so the simulated cables carry exactly the addresses sparkctl
computed.

SIMULATION ONLY.
"""

from __future__ import annotations

import getpass
from pathlib import Path

from sparkctl.model.inventory import Inventory
from sparkctl.model.switched import group_name
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode, SimRoute, SimSwitchPort

NAMES = tuple(f"spark-{c}" for c in "abcdefghijklmnop")  # up to 16 (a switched cluster)
SWITCH_SIZES = (2, 4, 8, 16)
ROOT_MGMT = "10.201.0.{}"  # on the sim's host bridge (sparkbr0)
ROOTLESS_MGMT = "127.201.0.{}"  # loopback: any 127/8 address routes via lo
ROOTLESS_SSH_PORT = 22200


def sim_inventory_text(nodes: int, root: Path, rootless: bool, topology: str = "cables") -> str:
    """``topology``: "cables" (1 box, a pair, the 4-node ring) or "switch" (2 to 16 nodes, each node's
    p0 to the simulated switch: its two twins on the port groups' subnets, sparkctl_sim.switch)."""
    if topology == "switch":
        if nodes not in SWITCH_SIZES:
            raise ValueError(f"a simulated switched cluster has {', '.join(map(str, SWITCH_SIZES))} nodes")
        if rootless:
            raise ValueError("a simulated switch needs root (namespaces and bridges)")
    elif nodes not in (1, 2, 4):
        raise ValueError("a simulated cluster has 1, 2 or 4 nodes")
    names = NAMES[:nodes]
    if topology == "switch":
        cables = [f"[{n}:p0, switch]" for n in names]
    elif nodes == 4:
        cables = [f"[{a}:p0, {b}:p1]" for a, b in zip(names, names[1:] + names[:1])]
    elif nodes == 2:
        cables = [f"[{names[0]}:p0, {names[1]}:p0]"]  # one DAC, same port on both ends
    else:
        cables = []
    user = "root" if not rootless else getpass.getuser()
    lines = [
        "# SIMULATED cluster written by `sparkctl sim up` (network namespaces and real sshd",
        "# on this machine; the GB10 tools and engines are simulated). Same format as a",
        "# real inventory: only hosts, keys and roots differ.",
        "cluster:",
        f"  name: sim-{'switch' if topology == 'switch' else 'ring' if nodes == 4 else 'pair' if nodes == 2 else 'single'}",
        f"  fabric_pool: {'127.20.0.0/16' if rootless else '10.40.0.0/16' if topology == 'switch' else '10.20.0.0/16'}",
        "  fabric_mtu_bytes: 9000",
        *(["switch: {name: sim-switch, mtu_bytes: 9216}   # p0 twin 0 on 10.40.0.0/24, twin 1 on 10.40.1.0/24"]
          if topology == "switch" else []),
        "defaults:",
        f"  ssh_user: {user}",
        f"  ssh_identity: {root / 'id_ed25519'}",
        f"  known_hosts: {root / 'known_hosts'}",
        "  sudo: false",
        "nodes:",
    ]
    for i, n in enumerate(names, 1):
        if rootless:
            nd = root / "nodes" / n
            lines.append(f"  - {{name: {n}, host: {ROOTLESS_MGMT.format(10 + i)}, ssh_port: {ROOTLESS_SSH_PORT + i}, "
                         f"prefix: {nd / 'fs'}, sysfs_root: {nd / 'sysfs'}}}")
        else:
            lines.append(f"  - {{name: {n}, host: {ROOT_MGMT.format(10 + i)}}}")
    lines.append("cables:" + ("" if cables else " []"))
    lines += [f"  - {c}" for c in cables]
    return "\n".join(lines) + "\n"


def spec_from_inventory(inv: Inventory, rootless: bool) -> ClusterSpec:
    ring = inv.topology == "ring"
    nodes = tuple(SimNode(name=n.name, mgmt_ip=n.host, ssh_port=n.ssh_port, ip_forward=ring and bool(inv.routes_for(n.name)))
                  for n in inv.nodes)
    links = tuple(
        SimLink(a_node=lk.a.node, a_ifname=lk.a.netdev, a_cidr=f"{lk.a.address}/24",
                b_node=lk.b.node, b_ifname=lk.b.netdev, b_cidr=f"{lk.b.address}/24", mtu=inv.mtu)
        for lk in inv.links if lk.a.node != lk.b.node
    )
    routes = tuple(SimRoute(node=r.node, dst_cidr=r.dst, via=r.via, dev=r.dev) for r in inv.routes)
    ports = tuple(SimSwitchPort(node=lk.a.node, ifname=lk.a.netdev, cidr=f"{lk.a.address}/24",
                                group=group_name(lk.a.port, lk.twin), mtu=inv.mtu)
                  for lk in inv.links if lk.a.node == lk.b.node)
    return ClusterSpec(nodes=nodes, links=links, routes=routes, rootless=rootless, switch_ports=ports,
                       switch_mtu=inv.switch_mtu or 9216)
