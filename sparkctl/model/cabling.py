"""Cables found instead of typed: from what each host sees on its fabric ports to a topology.

What this module owns:

* the observations (:class:`NetdevSeen`, :class:`HostSeen`): per twin netdev its
  MAC, link state, carrier changes between two reads, MTU, speed, its own IPv6
  link-local addresses, who answered the all-nodes ping and the neighbour
  table's MAC for each (read by ``sparkctl.facts.discovery``);
* :func:`find_topology`, the pure core: which port of which host faces which
  port of which other host, then a pair, a ring (its order from the first
  host, along its p0 cable first: the inventory's convention), a switch (one
  port seeing several hosts on one segment), or the list of problems, one line
  each (a cable that goes nowhere, a box cabled to itself, a flapping port, a
  ring that is not a ring);
* :func:`inventory_text`: the inventory YAML of a pair or a ring, in the
  schema ``sparkctl.model.inventory`` loads (addresses follow from it: one /24
  per twin per cable, host number = position + 1).

Pure: no SSH, no sockets, no clock.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkctl.model.schema import default_ports

CAGES = tuple((cage, spec.netdevs) for cage, spec in default_ports().items())  # p0, p1 and their twins


@dataclass(frozen=True)
class NetdevSeen:
    """One twin netdev as its host reported it (``None``: the host could not read it)."""

    netdev: str
    rdma: str | None = None
    mac: str | None = None
    operstate: str | None = None  # sysfs operstate: up, down, lowerlayerdown, ...
    carrier_changes: tuple[int | None, int | None] = (None, None)  # before and after the probe
    mtu: int | None = None
    speed_mbps: int | None = None
    own: tuple[str, ...] = ()  # this netdev's IPv6 link-local addresses
    answered: tuple[str, ...] = ()  # addresses that answered the ff02::1 ping on this netdev
    neighbours: Mapping[str, str] = field(default_factory=dict)  # IPv6 -> MAC (ip -6 neigh)

    @property
    def up(self) -> bool:
        return self.operstate == "up"

    @property
    def flaps(self) -> int:
        a, b = self.carrier_changes
        return b - a if a is not None and b is not None and b > a else 0


@dataclass(frozen=True)
class HostSeen:
    name: str  # the node name it will have in the inventory
    host: str  # the management address it was reached at
    netdevs: Mapping[str, NetdevSeen]
    probe_s: float = 0.0  # seconds between the two carrier_changes reads


@dataclass(frozen=True)
class PortEnd:
    node: str
    port: str  # p0 / p1

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


@dataclass(frozen=True)
class Finding:
    """What the hosts' ports show. ``topology`` is single, pair, ring or switch; ``problems``
    are one line each (then nothing is written); ``order`` is the ring order (head first)."""

    topology: str | None
    order: tuple[str, ...] = ()
    cables: tuple[tuple[PortEnd, PortEnd], ...] = ()
    segments: tuple[tuple[PortEnd, ...], ...] = ()  # switch: the port ends sharing one segment
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and self.topology is not None

    def to_dict(self) -> dict[str, object]:
        return {"topology": self.topology, "order": list(self.order), "ok": self.ok,
                "cables": [[str(a), str(b)] for a, b in self.cables],
                "segments": [[str(e) for e in seg] for seg in self.segments],
                "problems": list(self.problems), "notes": list(self.notes)}


def _norm_mac(mac: str | None) -> str | None:
    return mac.lower() if mac else None


def eui64_mac(addr: str) -> str | None:
    """The MAC inside an EUI-64 link-local address (RFC 4291 appendix A), when it is one."""
    try:
        ip = ipaddress.IPv6Address(addr.split("%")[0])
    except ValueError:
        return None
    b = ip.packed[8:]
    if b[3:5] != b"\xff\xfe":
        return None
    mac = bytes([b[0] ^ 0x02, b[1], b[2], b[5], b[6], b[7]])
    return ":".join(f"{x:02x}" for x in mac)


def _index(hosts: Sequence[HostSeen]) -> tuple[dict[str, PortEnd], dict[str, PortEnd]]:
    by_mac: dict[str, PortEnd] = {}
    by_addr: dict[str, PortEnd] = {}
    for h in hosts:
        for cage, twins in CAGES:
            for nd in twins:
                seen = h.netdevs.get(nd)
                if seen is None:
                    continue
                if (mac := _norm_mac(seen.mac)):
                    by_mac[mac] = PortEnd(h.name, cage)
                for a in seen.own:
                    by_addr[a.lower()] = PortEnd(h.name, cage)
    return by_mac, by_addr


def _peers(seen: NetdevSeen, by_mac: Mapping[str, PortEnd], by_addr: Mapping[str, PortEnd]) -> tuple[set[PortEnd], int]:
    """The port ends that answered on this netdev, and how many answers came from no host given."""
    own = {a.lower() for a in seen.own}
    neigh = {k.lower(): _norm_mac(v) for k, v in seen.neighbours.items()}
    found: set[PortEnd] = set()
    strangers = 0
    for addr in dict.fromkeys(a.lower() for a in seen.answered):
        if addr in own:
            continue  # the host's own answer (multicast loops back)
        mac = neigh.get(addr) or eui64_mac(addr)
        end = by_mac.get(mac) if mac else None
        end = end or by_addr.get(addr)
        if end is None:
            strangers += 1
        else:
            found.add(end)
    return found, strangers


def find_topology(hosts: Sequence[HostSeen]) -> Finding:
    """The pair, ring or switch the hosts' ports show, or the problems that prevent one."""
    problems: list[str] = []
    notes: list[str] = []
    names = [h.name for h in hosts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        return Finding(None, problems=(f"two hosts call themselves {dup[0]!r}: name them NAME=HOST",))
    by_mac, by_addr = _index(hosts)
    faces: dict[PortEnd, set[PortEnd]] = {}  # a cage -> the cages that answered it
    switched: dict[PortEnd, set[PortEnd]] = {}
    for h in hosts:
        for cage, twins in CAGES:
            me = PortEnd(h.name, cage)
            views: dict[str, set[PortEnd]] = {}
            if not any(nd in h.netdevs for nd in twins):
                # neither twin of the cage is there (a cage with no module, or its netdevs not created):
                # nothing can run over it; half a cage (one twin only) stays a problem below
                notes.append(f"{me}: no netdev of this cage ({', '.join(twins)}); it carries nothing")
                continue
            for nd in twins:
                seen = h.netdevs.get(nd)
                if seen is None:
                    problems.append(f"{me} ({nd}): the host has no such netdev")
                    continue
                if seen.flaps:
                    problems.append(f"{me} ({nd}) flaps: its carrier changed {seen.flaps} time(s) in "
                                    f"{h.probe_s:.0f} s (reseat or replace the cable)")
                if not seen.up:
                    continue
                peers, strangers = _peers(seen, by_mac, by_addr)
                own = sorted(str(p) for p in peers if p.node == h.name)
                if own:
                    problems.append(f"{me} ({nd}) is cabled to its own box ({', '.join(own)})")
                    peers = {p for p in peers if p.node != h.name}
                if len({p.node for p in peers}) > 1:
                    switched.setdefault(me, set()).update(peers)
                elif not peers and not own:
                    what = (f"answered only by {strangers} address(es) of no host given" if strangers
                            else "nothing answered")
                    problems.append(f"{me} ({nd}) is up but its cable goes nowhere among these hosts ({what})")
                views[nd] = peers
            up = [nd for nd in twins if nd in views]
            down = [nd for nd in twins if nd in h.netdevs and nd not in views]
            if up and down:
                notes.append(f"{me}: twin {down[0]} is down while {up[0]} is up")
            found = set().union(*views.values()) if views else set()
            if found and me not in switched:
                faces[me] = found
    if switched:
        return _switch(hosts, switched, faces, problems, notes)
    cables: list[tuple[PortEnd, PortEnd]] = []
    for me, found in faces.items():
        if len(found) > 1:
            problems.append(f"{me}: its twins face different ports ({', '.join(sorted(map(str, found)))})")
            continue
        other = next(iter(found))
        back = faces.get(other)
        if back is not None and back != {me}:
            problems.append(f"{me} sees {other}, but {other} sees {', '.join(sorted(map(str, back)))}")
            continue
        if (other, me) not in cables and (me, other) not in cables:
            cables.append((me, other))
    if problems:
        return Finding(None, cables=tuple(cables), problems=tuple(dict.fromkeys(problems)), notes=tuple(notes))
    return _direct(names, cables, notes)


def _switch(hosts: Sequence[HostSeen], switched: Mapping[PortEnd, set[PortEnd]], faces: Mapping[PortEnd, set[PortEnd]],
            problems: list[str], notes: list[str]) -> Finding:
    """One port seeing several hosts: a switch segment. Group the cages by what they see."""
    segments: list[set[PortEnd]] = []
    for me, peers in list(switched.items()) + list(faces.items()):
        members = {me, *peers}
        joined = [s for s in segments if s & members]
        for s in joined:
            segments.remove(s)
            members |= s
        segments.append(members)
    on_switch = {e.node for s in segments if len(s) > 2 for e in s}
    for h in hosts:
        if h.name not in on_switch:
            problems.append(f"{h.name}: no port reaches the switch the others share")
    segs = tuple(tuple(sorted(s, key=str)) for s in sorted(segments, key=lambda s: sorted(map(str, s))))
    return Finding("switch" if not problems else None, order=tuple(h.name for h in hosts), segments=segs,
                   problems=tuple(dict.fromkeys(problems)), notes=tuple(notes))


def _direct(names: list[str], cables: list[tuple[PortEnd, PortEnd]], notes: list[str]) -> Finding:
    cabled = {e.node for c in cables for e in c}
    lonely = [n for n in names if n not in cabled]
    if len(names) == 1:
        return Finding("single", order=tuple(names), notes=tuple(notes))
    if lonely:
        return Finding(None, cables=tuple(cables), notes=tuple(notes),
                       problems=tuple(f"{n}: no fabric cable to any of the other hosts" for n in lonely))
    if len(names) == 2:
        cables.sort(key=lambda c: (c[0].node != names[0], c[0].port if c[0].node == names[0] else c[1].port))
        cables = [c if c[0].node == names[0] else (c[1], c[0]) for c in cables]
        return Finding("pair", order=tuple(names), cables=tuple(cables), notes=tuple(notes))
    return _ring(names, cables, notes)


def _ring(names: list[str], cables: list[tuple[PortEnd, PortEnd]], notes: list[str]) -> Finding:
    adj: dict[str, list[tuple[PortEnd, PortEnd]]] = {n: [] for n in names}
    for a, b in cables:
        adj[a.node].append((a, b))
        adj[b.node].append((b, a))
    bad = [f"{n} has {len(adj[n])} cable(s) to the others "
           f"({', '.join(f'{a.port} to {b}' for a, b in sorted(adj[n], key=lambda t: t[0].port)) or '-'})"
           for n in names if len(adj[n]) != 2 or len({b.node for _, b in adj[n]}) != 2]
    order = [names[0]]
    ring_cables: list[tuple[PortEnd, PortEnd]] = []
    if not bad:
        prev, (a, b) = None, sorted(adj[names[0]], key=lambda t: t[0].port)[0]
        while True:
            ring_cables.append((a, b))
            if b.node == names[0]:
                break
            order.append(b.node)
            prev = a.node
            a, b = next((x, y) for x, y in adj[b.node] if y.node != prev)
            if len(order) > len(names):
                break
    if bad or len(order) != len(names):
        if not bad:
            rest = sorted(set(names) - set(order))
            bad = [f"{' -> '.join(order)} closes without {', '.join(rest)}"]
        return Finding(None, cables=tuple(cables), notes=tuple(notes),
                       problems=tuple(f"not one ring of {len(names)}: {b}" for b in bad))
    for a, b in ring_cables:
        if (a.port, b.port) != ("p0", "p1"):
            notes.append(f"{a} runs to {b} (the convention is port 0 to port 1 of the next node; it works either way)")
    return Finding("ring", order=tuple(order), cables=tuple(ring_cables), notes=tuple(notes))


# --------------------------------------------------------------------------- the inventory file


@dataclass(frozen=True)
class SshSettings:
    user: str = "nvidia"
    port: int = 22
    identity: str | None = None
    known_hosts: str | None = None
    sudo: bool = True


def _yaml_str(s: str) -> str:
    import json

    return json.dumps(s)  # a JSON string is a YAML scalar, quoted and escaped


def _ports(h: HostSeen) -> str:
    """``ports:`` when ibdev2netdev names the RDMA devices otherwise than a Spark does (``mlx5_N`` on some hosts)."""
    spec = default_ports()
    rdma = {cage: tuple(h.netdevs[nd].rdma if nd in h.netdevs else None for nd in twins) for cage, twins in CAGES}
    if all(r is None or r == d for cage, twins in rdma.items() for r, d in zip(twins, spec[cage].rdma)):
        return ""
    if any(r is None for twins in rdma.values() for r in twins):
        return ""  # half known: the Spark's names stay, `check` judges them
    cages = ", ".join(f"{cage}: {{netdevs: [{', '.join(spec[cage].netdevs)}], rdma: [{', '.join(map(str, rdma[cage]))}]}}"
                      for cage, _ in CAGES)
    return f", ports: {{{cages}}}"


def inventory_text(finding: Finding, hosts: Sequence[HostSeen], *, cluster: str, fabric_pool: str = "10.20.0.0/16",
                   mtu: int = 9000, ssh: SshSettings = SshSettings()) -> str:
    """The inventory of a pair, ring, switch or single host found by :func:`find_topology` (nodes in ring order;
    on a switch in the order the hosts were given, each port that shares the switch segment cabled to it)."""
    if not finding.ok or finding.topology not in ("single", "pair", "ring", "switch"):
        raise ValueError(f"no inventory for a finding that is {finding.topology or 'not ok'}")
    by_name = {h.name: h for h in hosts}
    out = [f"# Written by `sparkctl inventory discover` from what the hosts' fabric ports saw: a {finding.topology}"
           + (f", {' -> '.join(finding.order)} -> {finding.order[0]}" if finding.topology == "ring" else "") + ".",
           "# The fabric addresses follow from the cables (one /24 per twin per cable); `sparkctl inventory` shows them.",
           "cluster:", f"  name: {_yaml_str(cluster)}", f"  fabric_pool: {_yaml_str(fabric_pool)}",
           f"  fabric_mtu_bytes: {mtu}"]
    if finding.topology == "switch":
        # What the switch ports carry cannot be read from the hosts: the schema's default (9216) is what
        # NVIDIA's switch playbook sets; say so, the operator knows the switch.
        out += ["switch:                         # mtu_bytes: what the switch ports carry (not seen from the hosts)",
                "  name: switch", "  mtu_bytes: 9216"]
    out += ["defaults:", f"  ssh_user: {_yaml_str(ssh.user)}"]
    if ssh.port != 22:
        out.append(f"  ssh_port: {ssh.port}")
    if ssh.identity:
        out.append(f"  ssh_identity: {_yaml_str(ssh.identity)}")
    if ssh.known_hosts:
        out.append(f"  known_hosts: {_yaml_str(ssh.known_hosts)}")
    out += [f"  sudo: {'true' if ssh.sudo else 'false'}", "nodes:                          # head first"]
    out += [f"  - {{name: {_yaml_str(n)}, host: {_yaml_str(by_name[n].host)}{_ports(by_name[n])}}}" for n in finding.order]
    if finding.topology == "switch":
        rank = {n: i for i, n in enumerate(finding.order)}
        ends = sorted({e for seg in finding.segments if len(seg) > 2 for e in seg}, key=lambda e: (rank[e.node], e.port))
        out.append("cables:")
        out += [f"  - [{_yaml_str(str(e))}, switch]" for e in ends]
        return "\n".join(out) + "\n"
    out.append("cables:" + ("" if finding.cables else " []"))
    out += [f"  - [{_yaml_str(str(a))}, {_yaml_str(str(b))}]" for a, b in finding.cables]
    return "\n".join(out) + "\n"
