"""Cables moved by hand on a running simulated cluster: two cables' far ends swapped.

What a real operator does when two QSFP cables are crossed: each NIC keeps its MAC, its
interface name and its configuration (netplan/networkd match the interface by name, so
each port keeps the address the inventory gave it); only the box at the other end of
the cable changes. A veth pair cannot be re-peered, so the two pairs are deleted and
made again between the new ends, each end with the MAC, MTU and admin state it had.

The kernel then does what it does for any new link: IPv6 link-local addresses go
through duplicate address detection (RFC 4862 §5.4; the address is "tentative" until
it ends, ``Documentation/networking/ip-sysctl.rst``, ``dad_transmits``), and the call
returns once no end is tentative, as a replugged port settles. One difference from a
real NIC, on purpose not hidden: a new veth's ``carrier_changes`` starts again from 0
where a real port's keeps counting (+2 per replug); sparkctl compares two reads within
one probe, never the absolute count.

The current cabling is kept in ``cabling.json`` in the sim root (the spec keeps the
cabling as designed, as the hand-written inventory does). Crossing the same two ends
again restores them.

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sparkctl_sim import netns as nx
from sparkctl_sim.clusterboot import _write_sysfs, spec_carrier_sync
from sparkctl_sim.clusterroot import SimPaths, _ctx, _find_node, _need_root_mode, _root_lock, netns_name
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec

End = tuple[str, str]  # (node, ifname)
DAD_WAIT_S = 10.0


def _cabling_path(p: SimPaths) -> Path:
    return p.root / "cabling.json"


def current_cabling(p: SimPaths, spec: ClusterSpec) -> dict[End, End]:
    """Each cable end -> the end its cable runs to now."""
    path = _cabling_path(p)
    if path.exists():
        rows = json.loads(path.read_text())
        return {(a[0], a[1]): (b[0], b[1]) for a, b in rows}
    out: dict[End, End] = {}
    for lk in spec.links:
        out[(lk.a_node, lk.a_ifname)] = (lk.b_node, lk.b_ifname)
        out[(lk.b_node, lk.b_ifname)] = (lk.a_node, lk.a_ifname)
    return out


def _end_state(end: End) -> dict[str, object]:
    info = nx.link_info(end[1], netns_name(end[0]))
    if info is None:
        raise SimError(f"{end[0]} has no interface {end[1]!r}")
    return {"mac": info.get("address"), "mtu": info.get("mtu"), "up": "UP" in (info.get("flags") or [])}


def cross(root: Path, x: End, y: End) -> dict[End, End]:
    """Swap the far ends of the cables at ``x`` and ``y``: x now runs where y's cable ran, and y where x's did."""
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "cross")
    for n, _ in (x, y):
        _find_node(spec, n)
    with _root_lock(p):
        cab = current_cabling(p, spec)
        if x not in cab or y not in cab:
            raise SimError(f"{x[0]}:{x[1]} or {y[0]}:{y[1]} is not a cable end", "ends: " +
                           ", ".join(f"{n}:{i}" for n, i in sorted(cab)))
        x2, y2 = cab[x], cab[y]
        if x2 == y or x == y:
            raise SimError("these two ends are the two ends of one cable: nothing to cross")
        state = {e: _end_state(e) for e in (x, x2, y, y2)}
        for e in (x, y):  # deleting one end of a veth deletes its peer too
            nx.ip(netns_name(e[0]), "link", "delete", e[1])
        for a, b in ((x, y2), (y, x2)):
            sa, sb = state[a], state[b]
            nx.run(["ip", "link", "add", a[1], "netns", netns_name(a[0]), "address", str(sa["mac"]),
                    "mtu", str(sa["mtu"]), "type", "veth", "peer", "name", b[1], "netns", netns_name(b[0]),
                    "address", str(sb["mac"]), "mtu", str(sb["mtu"])])
            for e in (a, b):
                if state[e]["up"]:
                    nx.ip(netns_name(e[0]), "link", "set", e[1], "up")
        cab[x], cab[y2], cab[y], cab[x2] = y2, x, x2, y
        _cabling_path(p).write_text(json.dumps(sorted([list(a), list(b)] for a, b in cab.items())))
        nodes = list(dict.fromkeys(e[0] for e in (x, x2, y, y2)))
        for n in nodes:
            if not spec.fresh:  # a fresh node's ports are its own netplan's (clusterinit), not the spec's
                spec_carrier_sync(spec, n)  # networkd configures each port by its name, whatever it faces
            _write_sysfs(p, n)
        _wait_dad([x, x2, y, y2])
    return cab


def _wait_dad(ends: list[End]) -> None:
    deadline = time.monotonic() + DAD_WAIT_S
    while time.monotonic() < deadline:
        busy = [e for e in ends
                if "tentative" in nx.ip(netns_name(e[0]), "-6", "addr", "show", "dev", e[1], check=False).stdout]
        if not busy:
            return
        time.sleep(0.2)
    raise SimError(f"duplicate address detection did not finish on {', '.join(f'{n}:{i}' for n, i in busy)}")
