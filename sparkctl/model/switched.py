"""A switched cluster: every node's fabric ports run to one switch, one subnet per port group.

NVIDIA's playbook "Connect Multiple DGX Spark through a Switch"
(github.com/NVIDIA/dgx-spark-playbooks, nvidia/multi-sparks-through-switch/README.md)
puts the switch ports in one layer-2 domain and the two logical interfaces of a cage
(``enp1s0f1np1`` and ``enP2p1s0f1np1``) on **different** subnets ("assigning two
distinct network interfaces to the same subnet causes ... NCCL communication
failures"), each node with the same host number on both. sparkctl does the same per
port group: the same cage's same twin on every node shares one /24 (p0 twin 0, p0
twin 1, p1 twin 0, p1 twin 1: consecutive /24s of ``fabric_pool``, or
``switch.subnets``). No node relays for another: there are no routes and no
forwarding on a switched cluster.

Pure: no SSH, no sockets, no clock.
"""

from __future__ import annotations

import ipaddress
from typing import Any, TypeAlias

from sparkctl.errors import InventoryError
from sparkctl.model.schema import SwitchSpec
from sparkctl.model.yamlsrc import Located

# sparkctl.model.inventory imports this module: its Node, Cable and Link are typed Any here
Node: TypeAlias = Any
Cable: TypeAlias = Any
Link: TypeAlias = Any

PORT_GROUPS = (("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1))


def group_name(port: str, twin: int) -> str:
    """A port group's name, as messages and the simulator's bridges use it: ``p0.0`` .. ``p1.1``."""
    return f"{port}.{twin}"


def subnets(pool: ipaddress.IPv4Network, spec: SwitchSpec | None, src: Located, used: set[str] | None = None
            ) -> dict[tuple[str, int], ipaddress.IPv4Network]:
    """Each port group's /24: ``switch.subnets`` where given, else consecutive /24s of the pool.

    Only the cages in ``used`` (some node's cable runs from them) must not share a subnet."""
    derived = list(pool.subnets(new_prefix=24))
    out: dict[tuple[str, int], ipaddress.IPv4Network] = {}
    where: dict[ipaddress.IPv4Network, tuple[str, int]] = {}
    for k, (port, twin) in enumerate(PORT_GROUPS):
        given = spec.subnets.get(port) if spec is not None and spec.subnets else None  # type: ignore[call-overload]
        ref = src.ref(("switch", "subnets", port, twin))
        if given is None:
            net = derived[k]
        else:
            try:
                net = ipaddress.IPv4Network(given[twin], strict=True)
            except ValueError as exc:
                raise InventoryError(f"switch subnet {given[twin]!r} is not an IPv4 network: {exc}", ref,
                                     hint="e.g. 10.40.0.0/24") from None
            if net.prefixlen != 24:
                raise InventoryError(f"switch subnet {net} is not a /24", ref,
                                     hint="one /24 per port group: host numbers follow the inventory order")
        if used is not None and port not in used:
            continue
        for other, g in where.items():
            if net.overlaps(other):
                raise InventoryError(
                    f"port groups {group_name(*g)} and {group_name(port, twin)} share subnet {net}: "
                    "two interfaces of one node would hold addresses on one subnet", ref,
                    hint="give every port group (cage and twin) its own /24, as NVIDIA's switch playbook "
                         "does (192.168.100.0/24 and 192.168.101.0/24 for the two twins)")
        where[net] = (port, twin)
        out[(port, twin)] = net
    return out


def ends(nodes: tuple[Node, ...], cables: list[Cable], pool: ipaddress.IPv4Network,
         spec: SwitchSpec | None, src: Located) -> list[tuple[int, int, str, str, str, str, str, str]]:
    """Per node per twin of each switch-facing cage: (cable, twin, subnet, node, port, netdev, rdma,
    address); the inventory makes each a Link whose ``a`` and ``b`` are that one end."""
    by_name = {n.name: n for n in nodes}
    nets = subnets(pool, spec, src, {c.a_port for c in cables})
    out: list[tuple[int, int, str, str, str, str, str, str]] = []
    for port, twin in PORT_GROUPS:
        net = nets.get((port, twin))
        if net is None:
            continue
        for i, c in enumerate(cables):
            if c.a_port != port:
                continue
            node = by_name[c.a_node]
            if node.index + 1 >= net.num_addresses - 1:
                raise InventoryError(f"subnet {net} has no host number for node {node.name}",
                                     src.ref(("nodes", node.index, "name")))
            out.append((i, twin, str(net), node.name, port, node.ports[port].netdevs[twin],
                        node.ports[port].rdma[twin], str(net.network_address + node.index + 1)))
    _every_pair_meets(nodes, cables, src)
    return out


def _every_pair_meets(nodes: tuple[Node, ...], cables: list[Cable], src: Located) -> None:
    """Two nodes on no common port group cannot reach each other: different subnets, no router."""
    ports: dict[str, set[str]] = {n.name: set() for n in nodes}
    for c in cables:
        ports[c.a_node].add(c.a_port)
    head = nodes[0]
    for n in nodes[1:]:
        if not ports[n.name] & ports[head.name]:
            raise InventoryError(
                f"node {n.name!r} is on the switch by {'/'.join(sorted(ports[n.name]))} only and "
                f"{head.name!r} by {'/'.join(sorted(ports[head.name]))} only: they share no switch subnet",
                src.ref(("nodes", n.index, "name")),
                hint="cable the same cage of every node to the switch (NVIDIA's switch playbook: "
                     "\"use the same CX7 port on all Spark systems\")")


def check_mtu(fabric_mtu: int, spec: SwitchSpec | None, src: Located) -> None:
    if spec is not None and fabric_mtu > spec.mtu_bytes:
        raise InventoryError(
            f"fabric_mtu_bytes {fabric_mtu} is more than the switch carries ({spec.mtu_bytes})",
            src.ref(("cluster", "fabric_mtu_bytes")),
            hint=f"set the switch ports' MTU to at least {fabric_mtu} (then switch.mtu_bytes), "
                 f"or lower fabric_mtu_bytes to {spec.mtu_bytes}")


def shared_groups(links_: tuple[Link, ...], group: list[str]) -> list[tuple[str, int]]:
    """The port groups every node of ``group`` is on, in PORT_GROUPS order."""
    have: dict[str, set[tuple[str, int]]] = {n: set() for n in group}
    for lk in links_:
        if lk.a.node in have:
            have[lk.a.node].add((lk.a.port, lk.twin))
    common = set.intersection(*have.values()) if have else set()
    return [g for g in PORT_GROUPS if g in common]
