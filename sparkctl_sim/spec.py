"""What the simulated cluster must build: plain data, derived from an inventory.

``sparkctl_sim.cluster`` consumes a :class:`ClusterSpec`; the adapter from a
real :class:`sparkctl.model.inventory.Inventory` lives in ``sparkctl_sim.plan`` so the
namespace machinery never depends on the inventory model.

SIMULATION ONLY.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimLink:
    """One twin of one cable: a veth pair between two nodes' netdevs."""

    a_node: str
    a_ifname: str  # e.g. enp1s0f0np0
    a_cidr: str  # e.g. 10.20.0.1/24
    b_node: str
    b_ifname: str  # e.g. enp1s0f1np1
    b_cidr: str
    mtu: int = 9000


@dataclass(frozen=True)
class SimRoute:
    """A static route on one node: reach ``dst_cidr`` via ``via`` out of ``dev``."""

    node: str
    dst_cidr: str
    via: str
    dev: str


@dataclass(frozen=True)
class SimSwitchPort:
    """One twin of a node's cage cabled to the simulated switch: a veth pair from the node's netdev
    to a port of the switch's bridge for its port group (sparkctl_sim.switch)."""

    node: str
    ifname: str  # e.g. enp1s0f1np1, as on a Spark
    cidr: str  # e.g. 10.40.0.3/24
    group: str  # the port group (p0.0 .. p1.1): one bridge each
    mtu: int = 9000


@dataclass(frozen=True)
class SimNode:
    name: str  # inventory name and hostname (UTS namespace)
    mgmt_ip: str  # address on the host bridge (root mode) or a 127/8 address (no-root mode)
    ssh_port: int
    kernel_release: str = "6.17.0-1029-nvidia"
    ip_forward: bool = False  # ring nodes relay for their non-neighbours


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[SimNode, ...]
    links: tuple[SimLink, ...]
    routes: tuple[SimRoute, ...] = ()
    # A switched cluster: every node's switch-facing twins, and the MTU the switch ports carry.
    switch_ports: tuple[SimSwitchPort, ...] = ()
    switch_mtu: int = 9216
    mgmt_cidr: str = "10.201.0.1/24"  # the host (operator) side of the management bridge
    bridge: str = "sparkbr0"
    rootless: bool = False
    # Fresh nodes as they come out of the box: fabric ports up without addresses or routes,
    # forwarding off, Docker's iptables rules installed at boot. False: pre-configured
    # (addresses, routes and forwarding from the spec), the fast path of older tests.
    fresh: bool = False
    # How NVIDIA's "Connect two Sparks" playbook left the nodes: "" none, "link-local" or
    # "static" (its /etc/netplan/40-cx7.yaml: sparkctl_sim.playbook).
    playbook: str = ""
    # The management link under NetworkManager, as a desktop install leaves it (sparkctl_sim.netplansim).
    network_manager: bool = False
    # Fresh nodes: unattended-upgrades holds the dpkg lock this many simulated seconds after
    # the first boot (sparkctl_sim.debpkg); one real second is `speedup` simulated ones.
    dpkg_lock_s: float = 0.0
    speedup: float = 1.0
    extra: dict[str, str] = field(default_factory=dict)
