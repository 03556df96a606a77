"""The cluster model: nodes and cables in, topology and fabric plan out.

From the cables as the operator wired them this module derives the topology
(single, pair, ring, switch), the ring order (ranks follow the physical ring),
each node's neighbours, one /24 per twin per cable from the fabric pool with
stable host numbers, and the static routes that let a ring node reach its
non-neighbours through a neighbour.

Pure after loading: no SSH, no sockets, no clock.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sparkctl.errors import InventoryError
from sparkctl.model import switched
from sparkctl.model.schema import InventoryFile, KernelList, NodeSpec, PortSpec, SwitchSpec, default_ports
from sparkctl.model.yamlsrc import Located, load, loads, pydantic_errors


@dataclass(frozen=True)
class Node:
    """A node with every default applied."""

    name: str
    index: int  # position in the inventory file; fixes host numbers
    host: str
    ssh_user: str
    ssh_port: int
    ssh_identity: str | None
    sudo: bool
    known_hosts: str | None
    prefix: str
    sysfs_root: str
    proc_root: str
    mgmt_iface: str
    ports: dict[str, PortSpec]


@dataclass(frozen=True)
class Endpoint:
    node: str
    port: str  # p0 / p1
    netdev: str
    rdma: str
    address: str  # e.g. 10.20.0.1


@dataclass(frozen=True)
class Link:
    """One twin of one cable: its own /24."""

    cable: int
    twin: int
    subnet: str  # e.g. 10.20.0.0/24
    a: Endpoint
    b: Endpoint

    def end(self, node: str) -> Endpoint:
        return self.a if self.a.node == node else self.b

    def other(self, node: str) -> Endpoint:
        return self.b if self.a.node == node else self.a

    def touches(self, node: str) -> bool:
        return node in (self.a.node, self.b.node)


@dataclass(frozen=True)
class Route:
    node: str
    dst: str
    via: str
    dev: str


@dataclass(frozen=True)
class Cable:
    a_node: str
    a_port: str
    b_node: str
    b_port: str


@dataclass(frozen=True)
class Inventory:
    file: str
    name: str
    nodes: tuple[Node, ...]
    cables: tuple[Cable, ...]
    topology: str  # single | pair | ring | switch
    ring_order: tuple[str, ...]
    links: tuple[Link, ...]
    routes: tuple[Route, ...]
    mtu: int
    fabric_pool: str
    source: Located
    kernels: KernelList = field(default_factory=KernelList)  # laws.kernels: added to the bundled kernel data
    switch_name: str = ""  # a switched cluster's switch (switch.name)
    switch_mtu: int = 0  # the MTU its ports carry (switch.mtu_bytes)
    # switch.roce as NCCL's variables (NCCL_IB_TC, NCCL_IB_SL: schema.RoceSpec); empty off a switch
    nccl_qos: tuple[tuple[str, int], ...] = ()

    # -- lookups (pure) -------------------------------------------------
    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def neighbours(self, name: str) -> tuple[str, ...]:
        seen: list[str] = []
        for link in self.links:
            if link.touches(name):
                other = link.other(name).node
                if other not in seen and other != name:
                    seen.append(other)
        order = {n: i for i, n in enumerate(self.ring_order)}
        return tuple(sorted(seen, key=lambda n: order.get(n, 0)))

    def node_links(self, name: str) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.touches(name))

    def endpoints(self, name: str) -> tuple[Endpoint, ...]:
        return tuple(link.end(name) for link in self.node_links(name))

    def primary_address(self, name: str) -> str | None:
        """The node's own fabric address: twin 0 of its first cabled port (p0 before p1)."""
        eps = sorted(self.endpoints(name), key=lambda e: (e.port, e.netdev != self.node(name).ports[e.port].netdevs[0]))
        return eps[0].address if eps else None

    def routes_for(self, name: str) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.node == name)

    def link_between(self, a: str, b: str, twin: int = 0) -> Link | None:
        for link in self.links:
            if link.touches(a) and link.touches(b) and link.twin == twin:
                return link
        return None

    def is_adjacent_subset(self, names: list[str]) -> bool:
        """Whether ``names`` is a contiguous arc of the ring (or the whole ring)."""
        if self.topology != "ring" or len(names) >= len(self.ring_order):
            return set(names) <= set(self.ring_order)
        n = len(self.ring_order)
        idx = sorted(self.ring_order.index(x) for x in names)
        for start in range(n):
            arc = {(start + k) % n for k in range(len(names))}
            if arc == set(idx):
                return True
        return False


# --------------------------------------------------------------------------- loading


def load_inventory(path: str | Path) -> Inventory:
    return build(load(path))


def loads_inventory(text: str, file: str = "<inventory>") -> Inventory:
    return build(loads(text, file))


def _parse_file(src: Located) -> InventoryFile:
    if not isinstance(src.data, dict):
        raise InventoryError("an inventory is a mapping with nodes: and cables:", src.ref(()))
    try:
        return InventoryFile.model_validate(src.data)
    except ValidationError as exc:
        raise pydantic_errors(exc, src.ref, InventoryError) from None


def _resolve_node(spec: NodeSpec, index: int, inv: InventoryFile) -> Node:
    d = inv.defaults

    def pick(name: str):  # type: ignore[no-untyped-def]
        v = getattr(spec, name)
        return getattr(d, name) if v is None else v

    return Node(
        name=spec.name, index=index, host=spec.host,
        ssh_user=pick("ssh_user"), ssh_port=pick("ssh_port"), ssh_identity=pick("ssh_identity"),
        sudo=pick("sudo"), known_hosts=pick("known_hosts"), prefix=pick("prefix"),
        sysfs_root=pick("sysfs_root"), proc_root=pick("proc_root"), mgmt_iface=pick("mgmt_iface"),
        ports={str(k): v for k, v in spec.ports.items()} if spec.ports else default_ports(),
    )


def _endpoint(text: str, i: int, side: int, names: list[str], src: Located) -> tuple[str, str]:
    ref = src.ref(("cables", i, side))
    if text == "switch":
        return ("switch", "")
    if not isinstance(text, str) or text.count(":") != 1:
        raise InventoryError(
            f"cable end {text!r} is not NODE:PORT", ref, hint='write e.g. "spark-a:p0" (ports are p0 and p1)'
        )
    node, port = text.split(":")
    if node not in names:
        close = difflib.get_close_matches(node, names, n=1)
        raise InventoryError(
            f"cable end names unknown node {node!r}", ref,
            hint=f"did you mean {close[0]!r}?" if close else f"known nodes: {', '.join(names)}",
        )
    if port not in ("p0", "p1"):
        raise InventoryError(f"port {port!r} does not exist on a DGX Spark", ref, hint="ports are p0 and p1")
    return node, port


def build(src: Located) -> Inventory:
    inv = _parse_file(src)
    names = [n.name for n in inv.nodes]
    for key in ("name", "host"):
        seen: dict[str, int] = {}
        for i, n in enumerate(inv.nodes):
            v = getattr(n, key)
            if v in seen:
                raise InventoryError(
                    f"duplicate node {key} {v!r} (also nodes[{seen[v]}])",
                    src.ref(("nodes", i, key)),
                    hint="every node needs its own name and management address",
                )
            seen[v] = i
    nodes = tuple(_resolve_node(s, i, inv) for i, s in enumerate(inv.nodes))
    for i, node in enumerate(nodes):
        devs = [d for p in node.ports.values() for d in (*p.netdevs, *p.rdma)] + [node.mgmt_iface]
        dup = [d for d, c in Counter(devs).items() if c > 1]
        if dup:
            raise InventoryError(f"interface {dup[0]!r} named twice on node {node.name}", src.ref(("nodes", i, "ports")))

    cables: list[Cable] = []
    used: dict[tuple[str, str], int] = {}
    for i, (ea, eb) in enumerate(inv.cables):
        an, ap = _endpoint(ea, i, 0, names, src)
        bn, bp = _endpoint(eb, i, 1, names, src)
        if an == bn and an != "switch":
            raise InventoryError(
                f"cable joins node {an!r} to itself", src.ref(("cables", i)),
                hint="a cable runs from one box to another; check the node names",
            )
        for end_node, end_port in ((an, ap), (bn, bp)):
            if end_node == "switch":
                continue
            if (end_node, end_port) in used:
                j = used[(end_node, end_port)]
                raise InventoryError(
                    f"port {end_node}:{end_port} is used twice (also cables[{j}], line {src.line(('cables', j))})",
                    src.ref(("cables", i)), hint="each QSFP cage takes one cable",
                )
            used[(end_node, end_port)] = i
        if an == "switch" and bn == "switch":
            raise InventoryError("cable joins switch to switch", src.ref(("cables", i)))
        if an == "switch":  # keep the node on side a
            an, ap, bn, bp = bn, bp, an, ap
        cables.append(Cable(an, ap, bn, bp))

    topology, ring_order = _topology(nodes, cables, src)
    if inv.switch is not None and topology != "switch":
        raise InventoryError(
            f"switch: is set but no cable runs to it (this inventory is a {topology})", src.ref(("switch",)),
            hint='cable each node to the switch ([NODE:p0, switch]), or remove switch:')
    pool = _pool(inv, src)
    if topology == "switch":
        switched.check_mtu(inv.cluster.fabric_mtu_bytes, inv.switch, src)
        links = tuple(Link(cable=c, twin=t, subnet=net, a=(ep := Endpoint(n, port, dev, rdma, addr)), b=ep)
                      for c, t, net, n, port, dev, rdma, addr in switched.ends(nodes, cables, pool, inv.switch, src))
    else:
        links = _links(nodes, cables, pool, topology, src)
    routes = _routes(links, ring_order) if topology == "ring" else ()
    sw = inv.switch
    return Inventory(
        file=src.file, name=inv.cluster.name, nodes=nodes, cables=tuple(cables), topology=topology,
        ring_order=ring_order, links=links, routes=routes, mtu=inv.cluster.fabric_mtu_bytes,
        fabric_pool=str(pool), source=src, kernels=inv.laws.kernels,
        switch_name=(sw.name if sw else "switch") if topology == "switch" else "",
        switch_mtu=(sw.mtu_bytes if sw else inv.cluster.fabric_mtu_bytes) if topology == "switch" else 0,
        nccl_qos=_nccl_qos(sw) if topology == "switch" and sw else (),
    )


def _nccl_qos(sw: SwitchSpec) -> tuple[tuple[str, int], ...]:
    """switch.roce as NCCL reads it: the traffic class byte is the DSCP shifted past the two ECN bits."""
    out: list[tuple[str, int]] = []
    if sw.roce.dscp is not None:
        out.append(("NCCL_IB_TC", sw.roce.dscp << 2))
    if sw.roce.priority is not None:
        out.append(("NCCL_IB_SL", sw.roce.priority))
    return tuple(out)


def _pool(inv: InventoryFile, src: Located) -> ipaddress.IPv4Network:
    try:
        pool = ipaddress.IPv4Network(inv.cluster.fabric_pool, strict=True)
    except ValueError as exc:
        raise InventoryError(
            f"fabric_pool is not an IPv4 network: {exc}", src.ref(("cluster", "fabric_pool")),
            hint="e.g. 10.20.0.0/16",
        ) from None
    if pool.prefixlen > 23:
        raise InventoryError(
            "fabric_pool must hold at least two /24s", src.ref(("cluster", "fabric_pool")), hint="use a /16"
        )
    return pool


def _topology(nodes: tuple[Node, ...], cables: list[Cable], src: Located) -> tuple[str, tuple[str, ...]]:
    names = [n.name for n in nodes]
    if len(nodes) == 1:
        if cables and any(c.b_node != "switch" for c in cables):
            raise InventoryError("a single node cannot be cabled to itself", src.ref(("cables",)))
        return "single", (names[0],)
    degree: Counter[str] = Counter()
    for c in cables:
        degree[c.a_node] += 1
        if c.b_node != "switch":
            degree[c.b_node] += 1
    to_switch = any(c.b_node == "switch" for c in cables)
    for i, n in enumerate(names):
        if degree[n] == 0:
            raise InventoryError(
                f"node {n!r} has no port on the switch" if to_switch else f"node {n!r} has no cable",
                src.ref(("nodes", i, "name")),
                hint=f'add [{n}:p0, switch] under cables:, or remove the node' if to_switch
                else "add its cable under cables:, or remove the node",
            )
    if to_switch:
        direct = next((i for i, c in enumerate(cables) if c.b_node != "switch"), None)
        if direct is not None:
            c = cables[direct]
            raise InventoryError(
                f"cable {c.a_node}:{c.a_port} <-> {c.b_node}:{c.b_port} runs node to node in a switched cluster",
                src.ref(("cables", direct)),
                hint="mixing ring or pair cables and a switch is not supported: cable every node to the switch, "
                     "or none",
            )
        return "switch", tuple(names)
    if len(nodes) == 2:
        return "pair", tuple(names)
    # Three or more nodes, direct cables: they must form exactly one cycle.
    adj: dict[str, list[tuple[str, str, int]]] = {n: [] for n in names}
    for i, c in enumerate(cables):
        adj[c.a_node].append((c.b_node, c.a_port, i))
        adj[c.b_node].append((c.a_node, c.b_port, i))
    bad = next((n for n in names if len(adj[n]) != 2 or len({o for o, _, _ in adj[n]}) != 2), None)
    head = names[0]
    order = [head]
    if bad is None:
        # Follow the head's p0 cable first: port 0 of node i goes to port 1 of node i+1.
        first = sorted(adj[head], key=lambda t: t[1])[0]
        prev, cur = head, first[0]
        while cur != head and len(order) <= len(names):
            order.append(cur)
            nxt = [o for o, _, _ in adj[cur] if o != prev]
            prev, cur = cur, nxt[0]
    if bad is not None or len(order) != len(names):
        where = names.index(bad) if bad is not None else 0
        raise InventoryError(
            f"the cables of these {len(names)} nodes do not form one ring "
            f"(node {bad or head!r} has {len(adj[bad or head])} cables)",
            src.ref(("nodes", where, "name")) if bad is not None else src.ref(("cables",)),
            hint="a ring joins port 0 of each node to port 1 of the next, closing back to the head",
        )
    return "ring", tuple(order)


def _links(
    nodes: tuple[Node, ...], cables: list[Cable], pool: ipaddress.IPv4Network, topology: str, src: Located
) -> tuple[Link, ...]:
    by_name = {n.name: n for n in nodes}
    subnets = list(pool.subnets(new_prefix=24))
    links: list[Link] = []
    if 2 * len(cables) > len(subnets):
        raise InventoryError(
            f"fabric_pool {pool} has {len(subnets)} /24s; {len(cables)} cables need {2 * len(cables)}",
            src.ref(("cluster", "fabric_pool")), hint="use a larger pool, e.g. a /16",
        )
    for i, c in enumerate(cables):
        for twin in (0, 1):
            net = subnets[2 * i + twin]
            ends = []
            for name, port in ((c.a_node, c.a_port), (c.b_node, c.b_port)):
                node = by_name[name]
                ends.append(Endpoint(name, port, node.ports[port].netdevs[twin], node.ports[port].rdma[twin],
                                     str(net.network_address + node.index + 1)))
            links.append(Link(cable=i, twin=twin, subnet=str(net), a=ends[0], b=ends[1]))
    return tuple(links)


def _routes(links: tuple[Link, ...], order: tuple[str, ...]) -> tuple[Route, ...]:
    """Static routes: every subnet a node is not on goes via the nearer neighbour."""
    n = len(order)
    routes: list[Route] = []
    for i, me in enumerate(order):
        fwd, back = order[(i + 1) % n], order[(i - 1) % n]
        for link in links:
            if link.touches(me):
                continue
            # hops to the nearer end of the link, going forward and going back
            ends = [order.index(link.a.node), order.index(link.b.node)]
            d_fwd = min((e - i) % n for e in ends)
            d_back = min((i - e) % n for e in ends)
            gw = fwd if d_fwd <= d_back else back
            hop = next(x for x in links if x.touches(me) and x.touches(gw) and x.twin == link.twin)
            routes.append(Route(node=me, dst=link.subnet, via=hop.end(gw).address, dev=hop.end(me).netdev))
    return tuple(routes)
