"""Read-only views of the model, as plain data for tables and ``--json``. Pure."""

from __future__ import annotations

from typing import Any

from sparkctl.model.inventory import Inventory


def inventory_view(inv: Inventory) -> dict[str, Any]:
    nodes = []
    for n in inv.nodes:
        pos = inv.ring_order.index(n.name) if n.name in inv.ring_order else None
        nodes.append({
            "name": n.name,
            "ring_position": pos,
            "ssh": f"{n.ssh_user}@{n.host}:{n.ssh_port}",
            "sudo": n.sudo,
            "neighbours": list(inv.neighbours(n.name)),
            "primary_address": inv.primary_address(n.name),
            "addresses": [
                {"port": e.port, "netdev": e.netdev, "rdma": e.rdma, "address": e.address}
                for e in sorted(inv.endpoints(n.name), key=lambda e: (e.port, e.netdev))
            ],
        })
    return {
        "file": inv.file,
        "name": inv.name,
        "topology": inv.topology,
        "ring_order": list(inv.ring_order),
        "mtu": inv.mtu,
        "fabric_pool": inv.fabric_pool,
        **({"switch": {"name": inv.switch_name, "mtu": inv.switch_mtu}} if inv.topology == "switch" else {}),
        "nodes": sorted(nodes, key=lambda x: (x["ring_position"] is None, x["ring_position"] or 0)),
        "links": [
            {"cable": lk.cable, "twin": lk.twin, "subnet": lk.subnet,
             "a": f"{lk.a.node}:{lk.a.netdev}={lk.a.address}", "b": f"{lk.b.node}:{lk.b.netdev}={lk.b.address}"}
            for lk in inv.links
        ],
        "routes": [{"node": r.node, "dst": r.dst, "via": r.via, "dev": r.dev} for r in inv.routes],
    }


def ring_picture(inv: Inventory) -> str:
    """A small ASCII ring with the ports at each cable end, e.g.::

        spark-a p0 ------ p1 spark-b
             p1              p0
             |               |
             p0              p1
        spark-d p1 ------ p0 spark-c
    """
    o = list(inv.ring_order)

    def port(node: str, other: str) -> str:
        for c in inv.cables:
            if (c.a_node, c.b_node) == (node, other):
                return c.a_port
            if (c.b_node, c.a_node) == (node, other):
                return c.b_port
        return "??"

    if len(o) != 4:
        return " -> ".join(o + [o[0]])
    a, b, c, d = o
    w = max(len(a), len(d))
    top = f"{a:>{w}} {port(a, b)} ------ {port(b, a)} {b}"
    bot = f"{d:>{w}} {port(d, c)} ------ {port(c, d)} {c}"
    left = " " * (w - 2)
    col_r = len(top) - len(b) - 4  # under b's port
    def row(lhs: str, rhs: str) -> str:
        s = f"{left}{lhs}"
        return s + " " * max(1, col_r - len(s)) + rhs
    return "\n".join([top, row(port(a, d), port(b, c)), row(" |", " |"), row(port(d, a), port(c, b)), bot])
