"""Bind a profile to an inventory: which node runs which rank of which replica.

Ranks follow the physical ring from the head. A replica's nodes must be joined
by cables (a pair is two adjacent nodes; a ring layout takes the whole ring),
and the profile's TP size must match the nodes it asks for. Behind a switch
(layout ``switch``, or ``pair``) any nodes make a replica, in inventory order:
its ranks use the port groups all of them are on (sparkctl.model.switched),
so NCCL_IB_HCA and the master address are on subnets every rank shares.

Pure: no SSH, no sockets, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.errors import ProfileError, Ref
from sparkctl.model import switched
from sparkctl.model.inventory import Inventory, Link
from sparkctl.model.profiles import Resolved


@dataclass(frozen=True)
class Rank:
    node: str
    rank: int
    replica: int
    world_size: int
    host_ip: str  # this node's fabric address inside its replica
    master_addr: str
    master_port: int
    http_port: int
    socket_ifnames: tuple[str, ...]  # twin-0 netdevs of the links the replica uses
    hca: tuple[str, ...]  # every RoCE twin of those links
    netdev_for_hca: tuple[tuple[str, str], ...]  # (rdma, netdev) pairs, for GID resolution

    @property
    def is_head(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Layout:
    replicas: tuple[tuple[Rank, ...], ...]
    layout: str
    start_order: str

    @property
    def ranks(self) -> tuple[Rank, ...]:
        return tuple(r for rep in self.replicas for r in rep)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(r.node for r in self.ranks)

    def rank_of(self, node: str) -> Rank:
        return next(r for r in self.ranks if r.node == node)

    def heads(self) -> tuple[Rank, ...]:
        return tuple(rep[0] for rep in self.replicas)

    def start_sequence(self) -> tuple[tuple[Rank, ...], ...]:
        """Groups of ranks started together, in order (one group per phase)."""
        heads = tuple(r for r in self.ranks if r.is_head)
        workers = tuple(r for r in self.ranks if not r.is_head)
        groups = (workers, heads) if self.start_order == "workers-first" else (heads, workers)
        return tuple(g for g in groups if g)

    def stop_sequence(self) -> tuple[tuple[Rank, ...], ...]:
        return tuple(reversed(self.start_sequence()))


def profile_ref(res: Resolved, key: str) -> Ref:
    """Where ``key`` of a resolved profile was set (its file and line, or ``--set``)."""
    return _ref(res, key)


def _ref(res: Resolved, key: str) -> Ref:
    chain = res.explain(key) if key else []
    src = chain[-1].source if chain else None
    if src and src.kind == "cli":
        return Ref(key=f"--set {key}")
    if src and src.file:
        return Ref(file=src.file, line=src.line, key=key)
    return Ref(file=res.files[0], key=key)


def bind(res: Resolved, inv: Inventory) -> Layout:
    p = res.profile
    topo = p.topology
    wanted = list(topo.nodes) if topo.nodes else list(inv.ring_order)
    for n in wanted:
        if n not in inv.names:
            raise ProfileError(
                f"node {n!r} is not in the inventory {inv.file}", _ref(res, "topology.nodes"),
                hint=f"inventory nodes: {', '.join(inv.names)}",
            )
    if len(set(wanted)) != len(wanted):
        raise ProfileError("a node is listed twice", _ref(res, "topology.nodes"))
    order = {n: i for i, n in enumerate(inv.ring_order)}
    nodes = sorted(wanted, key=lambda n: order[n])
    per = topo.tp_size * topo.pp_size  # nodes per replica
    need = per * topo.replicas
    if len(nodes) != need:
        pp = f" x pp_size {topo.pp_size}" if topo.pp_size > 1 else ""
        raise ProfileError(
            f"tp_size {topo.tp_size}{pp} x replicas {topo.replicas} needs {need} nodes, "
            f"but the profile asks for {len(nodes)} ({', '.join(nodes)})",
            _ref(res, "topology.tp_size"),
            hint="set topology.nodes to exactly the nodes this stack runs on, or change tp_size",
        )
    if topo.layout == "switch" and inv.topology != "switch":
        raise ProfileError(
            f"layout switch needs a switched inventory; {inv.file} is a {inv.topology}",
            _ref(res, "topology.layout"),
            hint="cable the nodes to a switch ([NODE:p0, switch]), or use layout pair or ring")
    if topo.layout == "ring":
        if inv.topology != "ring":
            raise ProfileError(
                f"layout ring needs a ring inventory; {inv.file} is a {inv.topology}",
                _ref(res, "topology.layout"),
                hint="behind a switch use layout switch (any tp_size >= 2)" if inv.topology == "switch"
                else "use a pair profile on two nodes",
            )
        if topo.replicas != 1 or len(nodes) != len(inv.ring_order):
            raise ProfileError(
                f"layout ring must use the whole ring ({len(inv.ring_order)} nodes); "
                f"{len(nodes)} nodes break the ring",
                _ref(res, "topology.nodes"), hint="a subset of a ring is a pair: use layout pair and tp_size 2",
            )
    groups = [nodes[i * per:(i + 1) * per] for i in range(topo.replicas)]
    if topo.layout == "pair" and inv.topology != "switch":
        for g in groups:
            if inv.link_between(g[0], g[1]) is None:
                raise ProfileError(
                    f"nodes {g[0]} and {g[1]} are not joined by a cable: this subset breaks the ring",
                    _ref(res, "topology.nodes"),
                    hint=f"pick two neighbours; in ring order: {' -> '.join(inv.ring_order)}",
                )
    replicas = []
    for ri, g in enumerate(groups):
        links = [lk for lk in inv.links if lk.a.node in g and lk.b.node in g and lk.a.node != lk.b.node] \
            if len(g) > 1 else []
        if inv.topology == "switch" and len(g) > 1:
            shared = switched.shared_groups(inv.links, g)
            if not shared:  # the inventory refuses this for the head; a replica of others may still split
                raise ProfileError(
                    f"replica {ri} ({', '.join(g)}) shares no switch subnet", _ref(res, "topology.nodes"),
                    hint="pick nodes cabled to the switch by the same cage")
            links = [lk for lk in inv.links if lk.a.node in g and (lk.a.port, lk.twin) in shared]
        ranks = []
        head_ip = _host_ip(g[0], g, links, inv)
        for k, node in enumerate(g):
            mine = [lk.end(node) for lk in sorted(links, key=lambda lk: (lk.end(node).port, lk.twin))
                    if lk.touches(node)]
            ranks.append(Rank(
                node=node, rank=k, replica=ri, world_size=len(g),
                host_ip=_host_ip(node, g, links, inv), master_addr=head_ip,
                master_port=p.serve.master_port, http_port=p.serve.port,
                socket_ifnames=tuple(e.netdev for e in mine if e.netdev == inv.node(node).ports[e.port].netdevs[0]),
                hca=tuple(e.rdma for e in mine),
                netdev_for_hca=tuple((e.rdma, e.netdev) for e in mine),
            ))
        replicas.append(tuple(ranks))
    return Layout(tuple(replicas), topo.layout, topo.start_order)


def _host_ip(node: str, group: list[str], links: list[Link], inv: Inventory) -> str:
    if len(group) == 1:
        return inv.primary_address(node) or "127.0.0.1"
    mine = sorted((lk for lk in links if lk.touches(node)), key=lambda lk: (lk.end(node).port, lk.twin))
    return mine[0].end(node).address if mine else (inv.primary_address(node) or "127.0.0.1")
