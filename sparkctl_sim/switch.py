"""The simulated switch: a network namespace holding one Linux bridge per port group.

NVIDIA's playbook "Connect Multiple DGX Spark through a Switch"
(github.com/NVIDIA/dgx-spark-playbooks, nvidia/multi-sparks-through-switch/README.md)
cables one cage of each Spark to a QSFP switch whose Spark-facing ports are in one
bridge ("all ports are part of a single layer-2 domain"), the two logical interfaces
of the cage on two subnets. The simulated switch is stricter: one bridge per port
group (the same cage's same twin on every node, one subnet each; a VLAN per subnet on
a real switch), so a port on the wrong group answers no peer instead of answering
across subnets by ARP flux. Each node's twin is one end of a veth pair named as on a
Spark (``enp1s0f1np1``, ``enP2p1s0f1np1``); the other end (``swNN``) is the switch
port, enslaved to its group's bridge at the switch's MTU. The switch port is always up,
so a node's port has carrier exactly while the node has it up (a lit QSFP cable to a
powered switch). The switch lives in its own namespace, like the real one outside the
boxes: the host's network is not touched.

SIMULATION ONLY.
"""

from __future__ import annotations

from sparkctl_sim import netns as nx
from sparkctl_sim.clusterroot import SimPaths, _ledger_add, netns_name
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec, SimSwitchPort

SWITCH_NS = nx.NETNS_PREFIX + "switch"


def bridge_name(group: str) -> str:
    """The bridge of one port group: ``pg-p0.0`` .. ``pg-p1.1``."""
    return f"pg-{group}"


def port_name(spec: ClusterSpec, sp: SimSwitchPort) -> str:
    """The switch side of a node's twin: ``sw00``, ``sw01``, ... in the spec's order."""
    return f"sw{spec.switch_ports.index(sp):02d}"


def ensure(p: SimPaths, spec: ClusterSpec) -> None:
    """Build (or converge) the switch: its namespace, a bridge per port group, a veth per node twin."""
    if not spec.switch_ports:
        return
    _ledger_add(p, "namespaces", SWITCH_NS)
    nx.netns_add(SWITCH_NS)
    have = {e["ifname"] for e in nx.links(SWITCH_NS)}
    for group in sorted({sp.group for sp in spec.switch_ports}):
        br = bridge_name(group)
        if br not in have:
            nx.ip(SWITCH_NS, "link", "add", br, "type", "bridge")
        # no STP: a port forwards as soon as it is up (an unmanaged switch's edge port)
        nx.ip(SWITCH_NS, "link", "set", br, "mtu", str(spec.switch_mtu), "up")
    for sp in spec.switch_ports:
        ns, sw = netns_name(sp.node), port_name(spec, sp)
        node_end = nx.link_info(sp.ifname, ns)
        if node_end is None or sw not in have:
            if node_end is not None:
                nx.ip(ns, "link", "delete", sp.ifname)
            if sw in have:
                nx.ip(SWITCH_NS, "link", "delete", sw)
            nx.run(["ip", "link", "add", sp.ifname, "netns", ns, "type", "veth", "peer", "name", sw,
                    "netns", SWITCH_NS])
        nx.ip(SWITCH_NS, "link", "set", sw, "alias", f"{sp.node}:{sp.ifname}")
        nx.ip(SWITCH_NS, "link", "set", sw, "mtu", str(spec.switch_mtu))
        nx.ip(SWITCH_NS, "link", "set", sw, "master", bridge_name(sp.group))
        nx.ip(SWITCH_NS, "link", "set", sw, "up")


def find_port(spec: ClusterSpec, node: str, ifname: str) -> SimSwitchPort:
    for sp in spec.switch_ports:
        if (sp.node, sp.ifname) == (node, ifname):
            return sp
    raise SimError(f"{node}:{ifname} is not cabled to the simulated switch",
                   "switch ports: " + ", ".join(f"{s.node}:{s.ifname}" for s in spec.switch_ports[:4]) + ", ...")


def move_port(spec: ClusterSpec, node: str, ifname: str, group: str) -> str:
    """Miscable one twin: its switch port joins another port group's bridge (a cable in the wrong
    switch port, or a port in the wrong VLAN). The node sees nothing: link up, its MTU and address."""
    sp = find_port(spec, node, ifname)
    groups = sorted({s.group for s in spec.switch_ports})
    if group not in groups:
        raise SimError(f"no port group {group!r} on the simulated switch", "groups: " + ", ".join(groups))
    # a cable moved to another switch port: the node's port loses carrier meanwhile, and the kernel
    # flushes its neighbour entries on that device (net/ipv4/arp.c, NETDEV_CHANGE: neigh_carrier_down)
    sw = port_name(spec, sp)
    nx.ip(SWITCH_NS, "link", "set", sw, "down")
    nx.ip(SWITCH_NS, "link", "set", sw, "master", bridge_name(group))
    nx.ip(SWITCH_NS, "link", "set", sw, "up")
    return f"{node}:{ifname} now in {bridge_name(group)} (cabled as {sp.group})"
