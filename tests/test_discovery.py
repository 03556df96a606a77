"""The discovery core (sparkctl.model.cabling) and the probe's parsers (sparkctl.facts.discovery).

Synthetic clusters: every twin netdev gets a MAC and its EUI-64 link-local address; a
cable joins twin k of one cage to twin k of the other, so each end answers the other's
ff02::1 ping and sits in its neighbour table (as the kernel leaves it, RFC 4861 §7.2.3).
"""

from __future__ import annotations

import subprocess
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.facts.discovery import parse_addr6, parse_neigh, parse_ping, parse_probe, probe_script
from sparkctl.model.cabling import CAGES, Finding, HostSeen, NetdevSeen, PortEnd, eui64_mac, find_topology, inventory_text
from sparkctl.model.inventory import loads_inventory

TWINS = dict(CAGES)


def mac_of(node: str, nd: str) -> str:
    h = zlib.crc32(f"{node}/{nd}".encode()) & 0xFFFFFF
    return f"4c:bb:47:{h >> 16 & 0xFF:02x}:{h >> 8 & 0xFF:02x}:{h & 0xFF:02x}"


def ll_of(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 2, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    import ipaddress

    return str(ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui)))


def cluster(names: list[str], cables: list[tuple[str, str]], *, down: set[str] = frozenset(),
            flaps: set[str] = frozenset(), strangers: set[str] = frozenset(), segment: list[str] | None = None,
            ) -> list[HostSeen]:
    """Hosts as the probe reads them. cables: ("a:p0", "b:p1"); down/flaps/strangers: "node:netdev";
    segment: "node:port" ends all on one switch segment."""
    links: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for x, y in cables:
        (an, ap), (bn, bp) = x.split(":"), y.split(":")
        for k in (0, 1):
            a, b = (an, TWINS[ap][k]), (bn, TWINS[bp][k])
            links.setdefault(a, []).append(b)
            links.setdefault(b, []).append(a)
    for e in segment or []:
        n, p = e.split(":")
        for k in (0, 1):
            me = (n, TWINS[p][k])
            for o in segment or []:
                on, op = o.split(":")
                if (on, op) != (n, p):
                    links.setdefault(me, []).append((on, TWINS[op][k]))
    hosts = []
    for n in names:
        nds = {}
        for _cage, twins in CAGES:
            for nd in twins:
                mac = mac_of(n, nd)
                peers = [p for p in links.get((n, nd), []) if f"{p[0]}:{p[1]}" not in down]
                up = bool(peers) and f"{n}:{nd}" not in down
                answered = [ll_of(mac)] + [ll_of(mac_of(*p)) for p in peers] if up else []
                neigh = {ll_of(mac_of(*p)): mac_of(*p) for p in peers} if up else {}
                if up and f"{n}:{nd}" in strangers:
                    answered.append("fe80::1234:5678:9abc:def0")
                nds[nd] = NetdevSeen(netdev=nd, mac=mac, operstate="up" if up else "down",
                                     carrier_changes=(4, 6 if f"{n}:{nd}" in flaps else 4), mtu=9000,
                                     speed_mbps=200000 if up else None, own=(ll_of(mac),),
                                     answered=tuple(answered), neighbours=neigh)
        hosts.append(HostSeen(name=n, host=f"192.168.1.{101 + len(hosts)}", netdevs=nds, probe_s=2.0))
    return hosts


RING = ["spark-a", "spark-b", "spark-c", "spark-d"]
RING_CABLES = [("spark-a:p0", "spark-b:p1"), ("spark-b:p0", "spark-c:p1"), ("spark-c:p0", "spark-d:p1"),
               ("spark-d:p0", "spark-a:p1")]


def same_cycle(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = len(a)
    rots = [tuple(b[(i + k) % n] for k in range(n)) for i in range(n)]
    return a in rots or tuple(reversed(a)) in rots


def test_the_hand_written_ring_is_found_and_its_inventory_is_the_same() -> None:
    hosts = cluster(RING, RING_CABLES)
    f = find_topology(hosts)
    assert f.ok and f.topology == "ring" and f.order == tuple(RING), f
    assert f.cables == tuple((PortEnd(a.split(":")[0], a.split(":")[1]), PortEnd(b.split(":")[0], b.split(":")[1]))
                             for a, b in RING_CABLES)
    inv = loads_inventory(inventory_text(f, hosts, cluster="spark-ring"))
    hand = loads_inventory(open("inventory.yaml").read())
    assert inv.topology == "ring" and inv.ring_order == hand.ring_order
    assert [(lk.subnet, lk.a.address, lk.b.address, lk.a.netdev) for lk in inv.links] == \
        [(lk.subnet, lk.a.address, lk.b.address, lk.a.netdev) for lk in hand.links]  # the same addresses


@settings(max_examples=60, deadline=None)
@given(st.permutations(RING))
def test_any_order_of_the_hosts_gives_the_same_ring(perm: list[str]) -> None:
    f = find_topology(cluster(list(perm), RING_CABLES))
    assert f.ok and f.topology == "ring", f.problems
    assert f.order[0] == perm[0]  # the first host given is the head
    assert same_cycle(f.order, tuple(RING))


@settings(max_examples=80, deadline=None)
@given(st.permutations(RING), st.lists(st.sampled_from(["p0", "p1"]), min_size=4, max_size=4))
def test_any_cycle_with_any_cage_order_is_a_ring_in_its_own_order(cyc: list[str], flip: list[str]) -> None:
    # a ring cabled in the order cyc, each node's outgoing cage chosen at random
    cables = [(f"{cyc[i]}:{flip[i]}", f"{cyc[(i + 1) % 4]}:{'p1' if flip[(i + 1) % 4] == 'p0' else 'p0'}")
              for i in range(4)]
    f = find_topology(cluster(RING, cables))
    assert f.ok and f.topology == "ring", f.problems
    assert same_cycle(f.order, tuple(cyc))
    inv = loads_inventory(inventory_text(f, cluster(RING, cables), cluster="x"))
    assert same_cycle(inv.ring_order, tuple(cyc))


def test_two_crossed_cables_make_two_pairs_not_a_ring() -> None:
    crossed = [("spark-a:p0", "spark-b:p1"), ("spark-b:p0", "spark-a:p1"), ("spark-c:p0", "spark-d:p1"),
               ("spark-d:p0", "spark-c:p1")]
    f = find_topology(cluster(RING, crossed))
    assert not f.ok and f.topology is None
    assert all(p.startswith("not one ring of 4") for p in f.problems) and len(f.problems) == 4, f.problems


def test_a_missing_cable_is_a_path_not_a_ring() -> None:
    f = find_topology(cluster(RING, RING_CABLES[:3]))
    assert not f.ok
    assert "not one ring of 4: spark-a has 1 cable(s) to the others (p0 to spark-b:p1)" in f.problems, f.problems


def test_a_cable_to_no_host_given_is_named() -> None:
    hosts = cluster(RING[:2], [("spark-a:p0", "spark-b:p0")])
    # spark-a:p1 is up, and only a stranger (a box not on the command line) answers it
    a = hosts[0]
    nd = TWINS["p1"][0]
    nds = dict(a.netdevs)
    nds[nd] = NetdevSeen(netdev=nd, mac=a.netdevs[nd].mac, operstate="up", own=a.netdevs[nd].own,
                         answered=(*a.netdevs[nd].own, "fe80::1:2:3:4"), carrier_changes=(1, 1))
    f = find_topology([HostSeen(a.name, a.host, nds), hosts[1]])
    assert not f.ok
    assert f.problems == ("spark-a:p1 (enp1s0f1np1) is up but its cable goes nowhere among these hosts "
                          "(answered only by 1 address(es) of no host given)",)


def test_an_up_port_nothing_answers_is_named() -> None:
    hosts = cluster(RING[:2], [("spark-a:p0", "spark-b:p0")])
    a = hosts[0]
    nd = TWINS["p1"][1]
    nds = {**a.netdevs, nd: NetdevSeen(netdev=nd, mac=a.netdevs[nd].mac, operstate="up", own=a.netdevs[nd].own,
                                       answered=a.netdevs[nd].own)}
    f = find_topology([HostSeen(a.name, a.host, nds), hosts[1]])
    assert f.problems == ("spark-a:p1 (enP2p1s0f1np1) is up but its cable goes nowhere among these hosts "
                          "(nothing answered)",)


def test_a_box_cabled_to_itself_is_named() -> None:
    f = find_topology(cluster_self())
    assert "spark-a:p0 (enp1s0f0np0) is cabled to its own box (spark-a:p1)" in f.problems, f.problems
    assert "spark-a:p1 (enP2p1s0f1np1) is cabled to its own box (spark-a:p0)" in f.problems, f.problems
    assert not any("goes nowhere" in p and p.startswith("spark-a") for p in f.problems), f.problems


def cluster_self() -> list[HostSeen]:
    # spark-a's p0 runs to its own p1; its p1 twins answer its p0 twins (and the other way round)
    hosts = cluster(RING[:2], [])
    a = hosts[0]
    nds = dict(a.netdevs)
    for k in (0, 1):
        x, y = TWINS["p0"][k], TWINS["p1"][k]
        for me, other in ((x, y), (y, x)):
            om = a.netdevs[other].mac
            nds[me] = NetdevSeen(netdev=me, mac=a.netdevs[me].mac, operstate="up", own=a.netdevs[me].own,
                                 answered=(*a.netdevs[me].own, ll_of(om)), neighbours={ll_of(om): om})
    return [HostSeen(a.name, a.host, nds), hosts[1]]


def test_the_self_cable_is_seen_by_address_when_no_neighbour_entry_exists() -> None:
    # a reply between two local addresses never leaves the box: no neighbour entry, only the address
    hosts = cluster_self()
    a = hosts[0]
    nds = {nd: NetdevSeen(**{**s.__dict__, "neighbours": {}}) for nd, s in a.netdevs.items()}
    f = find_topology([HostSeen(a.name, a.host, nds), hosts[1]])
    assert "spark-a:p0 (enp1s0f0np0) is cabled to its own box (spark-a:p1)" in f.problems, f.problems


def test_a_flapping_port_is_named() -> None:
    f = find_topology(cluster(RING, RING_CABLES, flaps={"spark-c:enP2p1s0f0np0"}))
    assert not f.ok
    assert f.problems == ("spark-c:p0 (enP2p1s0f0np0) flaps: its carrier changed 2 time(s) in 2 s "
                          "(reseat or replace the cable)",)


def test_a_port_taken_down_breaks_the_ring_and_says_where() -> None:
    down = {"spark-a:" + nd for nd in TWINS["p0"]}
    f = find_topology(cluster(RING, RING_CABLES, down=down))
    assert not f.ok and any(p.startswith("not one ring of 4: spark-a has 1 cable") for p in f.problems), f.problems


def test_one_twin_down_is_a_note_and_the_ring_stands() -> None:
    f = find_topology(cluster(RING, RING_CABLES, down={"spark-b:enP2p1s0f0np0"}))
    assert f.ok and f.topology == "ring"
    assert "spark-b:p0: twin enP2p1s0f0np0 is down while enp1s0f0np0 is up" in f.notes


def test_a_pair_and_a_single() -> None:
    f = find_topology(cluster(RING[:2], [("spark-b:p1", "spark-a:p0")]))
    assert f.ok and f.topology == "pair" and f.cables == ((PortEnd("spark-a", "p0"), PortEnd("spark-b", "p1")),)
    inv = loads_inventory(inventory_text(f, cluster(RING[:2], [("spark-b:p1", "spark-a:p0")]), cluster="p"))
    assert inv.topology == "pair"
    s = find_topology(cluster(RING[:1], []))
    assert s.ok and s.topology == "single"
    assert loads_inventory(inventory_text(s, cluster(RING[:1], []), cluster="one")).topology == "single"
    lonely = find_topology(cluster(RING[:2], []))
    assert not lonely.ok and lonely.problems[0] == "spark-a: no fabric cable to any of the other hosts"


def test_a_switch_is_recognised_from_several_hosts_on_one_port() -> None:
    eight = [f"spark-{i}" for i in range(8)]
    f = find_topology(cluster(eight, [], segment=[f"{n}:p0" for n in eight]))
    assert f.topology == "switch" and f.ok, f.problems
    assert len(f.segments) == 1 and {e.node for e in f.segments[0]} == set(eight)
    hosts = cluster(eight, [], segment=[f"{n}:p0" for n in eight])
    inv = loads_inventory(inventory_text(f, hosts, cluster="eight"))
    assert inv.topology == "switch" and inv.names == tuple(eight)
    # each node's p0 twins on the two p0 port-group subnets, one host number per node in the given order
    assert len({lk.subnet for lk in inv.links}) == 2 and len(inv.links) == 16


def test_a_switch_on_the_p1_cage_writes_only_p1_cables() -> None:
    four = [f"spark-{i}" for i in range(4)]
    hosts = cluster(four, [], segment=[f"{n}:p1" for n in four])
    f = find_topology(hosts)
    text = inventory_text(f, hosts, cluster="four")
    assert '- ["spark-0:p1", switch]' in text and "p0" not in text.split("cables:")[1]
    assert loads_inventory(text).topology == "switch"


def test_a_host_off_the_switch_is_named() -> None:
    names = [f"spark-{i}" for i in range(4)]
    f = find_topology(cluster(names, [], segment=[f"{n}:p0" for n in names[:3]]))
    assert not f.ok and "spark-3: no port reaches the switch the others share" in f.problems


def test_negative_control_a_ring_with_no_answers_is_not_found() -> None:
    hosts = cluster(RING, RING_CABLES)
    mute = [HostSeen(h.name, h.host, {nd: NetdevSeen(**{**s.__dict__, "answered": s.own, "neighbours": {}})
                                      for nd, s in h.netdevs.items()}) for h in hosts]
    f = find_topology(mute)
    assert not f.ok and len(f.problems) == 16  # every up twin of every host: goes nowhere


def test_eui64_mac() -> None:
    assert eui64_mac("fe80::4ebb:47ff:fee8:9f39") == "4c:bb:47:e8:9f:39"  # spark-facts.md §2.2: a Spark's GID
    assert eui64_mac("fe80::54a4:74f4:3735:33ad") is None  # a stable-privacy address carries no MAC


def test_finding_to_dict() -> None:
    d = Finding("ring", order=("a",), problems=()).to_dict()
    assert d["ok"] is True and d["topology"] == "ring"


# --------------------------------------------------------------------------- parsers


def test_parse_ping_iputils_lines() -> None:
    # iputils' format (a real capture of ping ff02::1%enp4s0 on a LAN, its layout kept)
    text = ("enp1s0f0np0 PING ff02::1%enp1s0f0np0(ff02::1%enp1s0f0np0) 56 data bytes\n"
            "enp1s0f0np0 64 bytes from fe80::54a4:74f4:3735:33ad%enp1s0f0np0: icmp_seq=1 ttl=64 time=0.023 ms\n"
            "enp1s0f0np0 64 bytes from fe80::da9d:67ff:fe26:463f%enp1s0f0np0: icmp_seq=1 ttl=64 time=0.243 ms (DUP!)\n"
            "enp1s0f0np0 64 bytes from fe80::da9d:67ff:fe26:463f%enp1s0f0np0: icmp_seq=2 ttl=64 time=0.2 ms (DUP!)\n"
            "enp1s0f1np1 ping: connect: Network is unreachable\n")
    assert parse_ping(text) == {"enp1s0f0np0": ("fe80::54a4:74f4:3735:33ad", "fe80::da9d:67ff:fe26:463f")}


def test_parse_neigh_and_addr6() -> None:
    assert parse_neigh("fe80::a4fa:d5ff:fefb:75a lladdr A6:FA:D5:FB:07:5A STALE\nfe80::9 FAILED\n"
                       "fe80::8 lladdr 02:00:00:00:00:08 router REACHABLE\n") == {
        "fe80::a4fa:d5ff:fefb:75a": "a6:fa:d5:fb:07:5a", "fe80::8": "02:00:00:00:00:08"}
    assert parse_addr6("7: enp1s0f0np0    inet6 fe80::a82e:8aff:fe57:647c/64 scope link \\       "
                       "valid_lft forever preferred_lft forever\n") == ("fe80::a82e:8aff:fe57:647c",)


def test_the_probe_script_is_posix_sh_and_parses_when_run_here() -> None:
    script = probe_script()
    assert "\\" not in script  # a login shell that rewrites backslashes cannot corrupt it (facts.batch)
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    # this machine has no CX-7 netdevs: every one is absent, nothing is pinged, nothing raises
    r = subprocess.run(["sh", "-c", probe_script("/nonexistent-sys")], capture_output=True, text=True, timeout=60)
    hostname, seen, _bad = parse_probe(r.stdout)
    assert hostname and seen == {}


def test_parse_probe_of_a_cut_off_output() -> None:
    hostname, seen, bad = parse_probe("@@sparkctl:manifest:hostname@@\n@@sparkctl:section:hostname@@\nspark-a\n")
    assert hostname is None and seen == {} and "the probe's output was cut off" in bad


# --------------------------------------------------------------------------- the command's edges


def test_host_arguments() -> None:
    from sparkctl.errors import ConfigError
    from sparkctl.ops.discover import HostArg, parse_host_arg

    assert parse_host_arg("10.0.0.1") == HostArg(None, None, "10.0.0.1", None)
    assert parse_host_arg("spark-a=nvidia@spark-a.lan:2222") == HostArg("spark-a", "nvidia", "spark-a.lan", 2222)
    assert parse_host_arg("b=[fd00::1]:22") == HostArg("b", None, "fd00::1", 22)
    for bad in ("a b", "x=y=z", "-oProxyCommand=x@h", "h:99999", "Root@h"):
        with pytest.raises(ConfigError):
            parse_host_arg(bad)


def test_discover_never_overwrites_without_force(tmp_path) -> None:
    from sparkctl.cli.main import main

    out = tmp_path / "inv.yaml"
    out.write_text("keep me\n")
    assert main(["inventory", "discover", "10.0.0.1", "--output", str(out)]) == 2
    assert out.read_text() == "keep me\n"


def test_inventory_without_a_subcommand_still_shows_the_inventory(capsys) -> None:
    from sparkctl.cli.main import main

    assert main(["-i", "inventory.yaml", "inventory", "--json"]) == 0
    assert '"topology": "ring"' in capsys.readouterr().out


def probe_output(h: HostSeen, *, hostname: str | None = None) -> str:
    """What the probe script prints on a host that sees ``h`` (the batch format, sparkctl.facts.batch)."""
    secs = [("hostname", hostname or h.name), ("ibdev2netdev", "\n".join(
        f"{'roce' + nd[2:].replace('np0', '').replace('np1', '')} port 1 ==> {nd} ({'Up' if s.up else 'Down'})"
        for nd, s in h.netdevs.items()))]
    pings = []
    for nd, s in h.netdevs.items():
        secs += [(f"d.{nd}.mac", s.mac), (f"d.{nd}.operstate", s.operstate), (f"d.{nd}.cc0", str(s.carrier_changes[0])),
                 (f"d.{nd}.mtu", str(s.mtu)),
                 (f"d.{nd}.ethtool", f"\tSpeed: {s.speed_mbps}Mb/s\n\tLink detected: yes" if s.up else
                  "\tSpeed: Unknown!\n\tLink detected: no"),
                 (f"d.{nd}.addr6", "\n".join(f"7: {nd}    inet6 {a}/64 scope link \\       valid_lft forever" for a in s.own))]
        pings += [f"{nd} 64 bytes from {a}%{nd}: icmp_seq=1 ttl=64 time=0.1 ms" for a in s.answered]
    secs.append(("ping", "\n".join(pings)))
    for nd, s in h.netdevs.items():
        secs += [(f"d.{nd}.neigh", "\n".join(f"{a} lladdr {m} STALE" for a, m in s.neighbours.items())),
                 (f"d.{nd}.cc1", str(s.carrier_changes[1]))]
    body = "".join(f"@@sparkctl:section:{n}@@\n{t}\n@@sparkctl:rc:{n}:0@@\n" for n, t in secs)
    return body + "@@sparkctl:done@@\n"


def test_discover_over_a_fake_transport_names_nodes_by_hostname_and_finds_the_ring() -> None:
    from sparkctl.facts.batch import remote_command
    from sparkctl.model.cabling import SshSettings
    from sparkctl.ops.discover import discover
    from sparkctl.transport import FakeTransport, reply

    hosts = cluster(RING, RING_CABLES)
    cmd = remote_command(probe_script())
    addrs = [f"10.0.0.{i + 1}" for i in range(4)]
    script = {(a, cmd): reply(probe_output(h, hostname=f"{h.name}.lab.example")) for a, h in zip(addrs, hosts)}
    fakes: list[FakeTransport] = []

    def make(nodes):  # type: ignore[no-untyped-def]
        assert [n.ssh_user for n in nodes] == ["nvidia", "nvidia", "admin", "nvidia"]
        fakes.append(FakeTransport(script, nodes=[n.name for n in nodes]))
        return fakes[0]

    events: list[tuple[str, str]] = []
    args = [addrs[2], addrs[0], "admin@" + addrs[3], addrs[1]]
    d = discover(args, SshSettings(), make, lambda n, phase, _m: events.append((n, phase)))
    assert d.finding.ok and d.finding.topology == "ring" and d.finding.order[0] == "spark-c"
    assert same_cycle(d.finding.order, tuple(RING))
    assert {n for n, p in events if p == "read"} == set(args[:2] + [addrs[3], addrs[1]])
    assert [c.command for c in fakes[0].calls] == [cmd] * 4  # one read-only script per host, nothing else
    assert d.unreadable == {}
    assert d.hosts[0].netdevs["enp1s0f0np0"].speed_mbps == 200000


def test_discover_names_the_hosts_that_do_not_answer() -> None:
    from sparkctl.errors import TransportError
    from sparkctl.facts.batch import remote_command
    from sparkctl.model.cabling import SshSettings
    from sparkctl.ops.discover import discover
    from sparkctl.transport import FakeTransport, reply

    cmd = remote_command(probe_script())
    script = {("10.0.0.1", cmd): reply(probe_output(cluster(RING[:1], [])[0])),
              ("10.0.0.2", cmd): reply(error="unreachable: connection refused")}
    with pytest.raises(TransportError, match="1 of 2 host"):
        discover(["10.0.0.1", "10.0.0.2"], SshSettings(), lambda nodes: FakeTransport(script), lambda *a: None)


def test_rdma_names_other_than_a_sparks_go_into_the_inventory() -> None:
    hosts = cluster(RING[:2], [("spark-a:p0", "spark-b:p0")])
    renamed = {nd: NetdevSeen(**{**s.__dict__, "rdma": f"mlx5_{k}"}) for k, (nd, s) in enumerate(hosts[1].netdevs.items())}
    hosts = [HostSeen(hosts[0].name, hosts[0].host, {nd: NetdevSeen(**{**s.__dict__, "rdma": None})
                                                     for nd, s in hosts[0].netdevs.items()}),
             HostSeen(hosts[1].name, hosts[1].host, renamed)]
    f = find_topology(hosts)
    inv = loads_inventory(inventory_text(f, hosts, cluster="p"))
    assert inv.node("spark-b").ports["p0"].rdma == ("mlx5_0", "mlx5_1")
    assert inv.node("spark-a").ports["p0"].rdma == ("rocep1s0f0", "roceP2p1s0f0")  # unknown: a Spark's names
    assert inv.link_between("spark-a", "spark-b").b.rdma == "mlx5_0"


def test_a_cage_with_no_netdevs_is_a_note_and_half_a_cage_a_problem() -> None:
    four = [f"spark-{i}" for i in range(4)]
    hosts = cluster(four, [], segment=[f"{n}:p0" for n in four])
    p1 = set(CAGES[1][1])
    bare = [HostSeen(h.name, h.host, {nd: s for nd, s in h.netdevs.items() if nd not in p1}) for h in hosts]
    f = find_topology(bare)
    assert f.ok and f.topology == "switch", f.problems
    assert "spark-0:p1: no netdev of this cage" in " ".join(f.notes)
    half = [HostSeen(h.name, h.host, {nd: s for nd, s in h.netdevs.items() if nd != CAGES[1][1][0]}) for h in hosts]
    g = find_topology(half)
    assert not g.ok and any("the host has no such netdev" in p for p in g.problems)
