"""What a host's fabric ports see, for ``sparkctl inventory discover``: one read-only probe script and its parser.

The script reads, for each of the four CX-7 twin netdevs (docs/reference/spark-facts.md
§2.1: ``enp1s0f0np0``/``enP2p1s0f0np0`` in cage p0, ``enp1s0f1np1``/``enP2p1s0f1np1`` in
p1): the MAC, operstate, ``carrier_changes``, MTU (sysfs, ``Documentation/ABI/testing/
sysfs-class-net``), the speed (``ethtool``), its IPv6 link-local addresses (``ip -6
addr``); the RDMA names (``ibdev2netdev``); then it pings the all-nodes address
``ff02::1%NETDEV`` on every port that is up, for 2 s, all ports at once, and reads the
neighbour table (``ip -6 neigh``) and ``carrier_changes`` again.

Why the ping: a link-local neighbour is in the table only after traffic; an echo request
to ff02::1 is answered by every IPv6 node on the link (RFC 4291 §2.7.1; Linux answers
multicast echoes unless ``net.ipv6.icmp.echo_ignore_multicast`` is set), and to send its
reply each answering node first solicits our address with its own MAC in the
solicitation, which puts that MAC in our table (RFC 4861 §7.2.3). It is a read-only
probe: it changes no configuration, file or address, only the kernel's neighbour cache
(soft state the kernel keeps and expires by itself). It works without root (iputils
``ping`` over an ICMP datagram socket, ``net.ipv4.ping_group_range``, or its file
capability) and needs only the IPv6 link-local address every up port gets by default
(``addr_gen_mode``, ``Documentation/networking/ip-sysctl.rst``).

LLDP (``lldpcli -f json show neighbors``) names the peer's chassis and port directly
where ``lldpd`` runs, but DGX OS does not ship or start it, so the link-local probe is
the one that works on a box as it comes.

What it must not do: import a transport, or change a host beyond that neighbour cache.
"""

from __future__ import annotations

import ipaddress
import re

from sparkctl.facts.batch import frame, split_batch
from sparkctl.facts.net import parse_ethtool, parse_ibdev2netdev, parse_mtu, parse_operstate
from sparkctl.facts.registry import ProbeParseError, int_in, lines, one_line, q, small_file, tool
from sparkctl.facts.system import parse_hostname
from sparkctl.model.cabling import CAGES, NetdevSeen

NETDEVS = tuple(nd for _, twins in CAGES for nd in twins)
PING_DEADLINE_S = 2  # ping -w: seconds of echo requests to ff02::1 per port (all ports at once)
PING_INTERVAL_S = "0.5"  # iputils lets any user go down to 2 ms (ping.c, "cannot flood"); 0.5 s is gentle


def probe_script(sysfs_root: str = "/sys") -> str:
    """The one probe script (POSIX sh, every value quoted), in the batch format (``sparkctl.facts.batch``)."""
    root = sysfs_root.rstrip("/") or "/"

    def sysf(nd: str, attr: str) -> str:
        return f"{root}/class/net/{nd}/{attr}"

    steps: list[tuple[str, str]] = [
        ("hostname", "if have hostname; then hostname; else uname -n; fi"),
        ("ibdev2netdev", tool("ibdev2netdev")),
    ]
    for nd in NETDEVS:
        steps += [
            (f"d.{nd}.mac", small_file(sysf(nd, "address"))),
            (f"d.{nd}.operstate", small_file(sysf(nd, "operstate"))),
            (f"d.{nd}.cc0", small_file(sysf(nd, "carrier_changes"))),
            (f"d.{nd}.mtu", small_file(sysf(nd, "mtu"))),
            (f"d.{nd}.ethtool", tool("ethtool", q(nd))),
            (f"d.{nd}.addr6", tool("ip", "-6", "-o", "addr", "show", "dev", q(nd), "scope", "link")),
        ]
    pings = " ".join(
        f"if [ \"$(cat {q(sysf(nd, 'operstate'))} 2>/dev/null)\" = up ]; then "
        f"{{ ping -6 -n -w {PING_DEADLINE_S} -i {PING_INTERVAL_S} {q('ff02::1%' + nd)} 2>&1 | "
        f"while IFS= read -r l; do echo {q(nd)}\" $l\"; done; }} & fi;"
        for nd in NETDEVS)
    steps.append(("ping", f"have ping || exit 127; {pings} wait"))
    for nd in NETDEVS:
        steps += [
            (f"d.{nd}.neigh", tool("ip", "-6", "neigh", "show", "dev", q(nd))),
            (f"d.{nd}.cc1", small_file(sysf(nd, "carrier_changes"))),
        ]
    return frame(steps)


# --------------------------------------------------------------------------- parsers (pure)

_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")


def parse_mac(text: str) -> str:
    mac = one_line("MAC address", text, "sysfs address").lower()
    if not _MAC.fullmatch(mac):
        raise ProbeParseError("MAC address", f"not a MAC: {mac[:30]!r}", "sysfs address")
    return mac


def parse_carrier_changes(text: str) -> int:
    return int_in("carrier changes", one_line("carrier changes", text, "sysfs carrier_changes"), 0, None,
                  "sysfs carrier_changes")


def _v6(s: str) -> str | None:
    try:
        return str(ipaddress.IPv6Address(s.split("%")[0]))
    except ValueError:
        return None


def parse_addr6(text: str) -> tuple[str, ...]:
    """``ip -6 -o addr show dev IF scope link``: ``5: IF    inet6 fe80::1/64 scope link ...``."""
    out = []
    for line in lines(text):
        m = re.search(r"\binet6 ([0-9a-fA-F:]+)/[0-9]+", line)
        if not m or (a := _v6(m.group(1))) is None:
            raise ProbeParseError("IPv6 addresses", f"unexpected line {line.strip()[:60]!r}", "ip -6 addr")
        out.append(a)
    return tuple(out)


def parse_neigh(text: str) -> dict[str, str]:
    """``ip -6 neigh show dev IF``: ``fe80::1 lladdr 4c:bb:47:00:00:01 STALE`` (entries without a
    link-layer address, FAILED or INCOMPLETE, are skipped)."""
    out: dict[str, str] = {}
    for line in lines(text):
        words = line.split()
        addr = _v6(words[0]) if words else None
        if addr is None:
            raise ProbeParseError("IPv6 neighbours", f"unexpected line {line.strip()[:60]!r}", "ip -6 neigh")
        if "lladdr" in words[:-1]:
            mac = words[words.index("lladdr") + 1].lower()
            if _MAC.fullmatch(mac):
                out[addr] = mac
    return out


# iputils ping: "64 bytes from fe80::a02:8eff:fe9e:cf67%enp4s0: icmp_seq=1 ttl=64 time=0.796 ms"
# (ping/ping6_common.c, print_echo_reply / pr_addr: the scope id after '%'), "(DUP!)" after repeats.
_REPLY = re.compile(r"(\S+) [0-9]+ bytes from ([0-9a-fA-F:]+)(?:%\S+)?: icmp_seq=.*")


def parse_ping(text: str) -> dict[str, tuple[str, ...]]:
    """The prefixed ping lines: netdev -> the addresses that answered (in order, each once)."""
    out: dict[str, list[str]] = {}
    for line in lines(text):
        m = _REPLY.fullmatch(line.strip())
        if m and (a := _v6(m.group(2))) is not None and a not in out.setdefault(m.group(1), []):
            out[m.group(1)].append(a)
    return {k: tuple(v) for k, v in out.items()}


def node_name(hostname: str) -> str:
    """The inventory name of a host: its hostname's first label."""
    return hostname.split(".")[0]


def parse_probe(stdout: str) -> tuple[str | None, dict[str, NetdevSeen], list[str]]:
    """(hostname, netdev -> what it saw, what could not be read) from the probe's output. Never raises."""
    _manifest, sections, done = split_batch(stdout)
    unreadable: list[str] = [] if done else ["the probe's output was cut off"]

    def get(name: str, parse, what: str):  # type: ignore[no-untyped-def]
        sec = sections.get(name)
        if sec is None or sec.rc != 0:
            why = ("no answer" if sec is None or sec.rc is None else "command not found" if sec.rc == 127
                   else f"exit code {sec.rc}")
            unreadable.append(f"{what}: {why}")
            return None
        try:
            return parse(sec.text)
        except ProbeParseError as exc:
            unreadable.append(f"{what}: {exc.detail}")
            return None

    hostname = get("hostname", parse_hostname, "hostname")
    rdma = get("ibdev2netdev", parse_ibdev2netdev, "RDMA device map (ibdev2netdev)") or {}
    ping_sec = sections.get("ping")
    answered = parse_ping(ping_sec.text) if ping_sec is not None else {}
    if ping_sec is not None and ping_sec.rc == 127:
        unreadable.append("ping: command not found (iputils-ping)")
    seen: dict[str, NetdevSeen] = {}
    for nd in NETDEVS:
        if (sec := sections.get(f"d.{nd}.operstate")) is None or sec.rc != 0:
            continue  # no class/net/ND: the host has no such netdev (or the output was cut off before it)
        eth = get(f"d.{nd}.ethtool", parse_ethtool, f"ethtool {nd}")
        seen[nd] = NetdevSeen(
            netdev=nd, rdma=rdma[nd].rdma if nd in rdma else None,
            mac=get(f"d.{nd}.mac", parse_mac, f"MAC of {nd}"),
            operstate=get(f"d.{nd}.operstate", parse_operstate, f"link state of {nd}"),
            carrier_changes=(get(f"d.{nd}.cc0", parse_carrier_changes, f"carrier changes of {nd}"),
                             get(f"d.{nd}.cc1", parse_carrier_changes, f"carrier changes of {nd}")),
            mtu=get(f"d.{nd}.mtu", parse_mtu, f"MTU of {nd}"),
            speed_mbps=eth.speed_mbps if eth is not None else None,
            own=get(f"d.{nd}.addr6", parse_addr6, f"IPv6 addresses of {nd}") or (),
            answered=answered.get(nd, ()),
            neighbours=get(f"d.{nd}.neigh", parse_neigh, f"IPv6 neighbours of {nd}") or {},
        )
    return hostname, seen, list(dict.fromkeys(unreadable))
