"""Network facts: the RDMA device map (ibdev2netdev), the RoCE GID tables
(sysfs, and pasted ``show_gids``), link state and MTU (sysfs), the IPv4
address (ip) and the link speed (ethtool).

What this module owns: the pure parsers of those outputs, the GID helpers
(the RoCE v2 IPv4 GID index, which drifts on Sparks: docs/reference/spark-facts.md §2.2) and
the :class:`~sparkctl.facts.registry.Fact` entries. It must not run anything.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sparkctl.facts.registry import (
    NOT_FOUND,
    ExitCode,
    Fact,
    ProbeParseError,
    ScriptContext,
    int_in,
    lines,
    one_line,
    q,
    small_file,
    tool,
)

# GID slots read per RoCE device: the RoCEv2 IPv4 GID is usually index 3 and has
# been seen at 4 and 5 (docs/reference/spark-facts.md §2.2); 16 slots leave room for more drift.
GID_SLOTS = 16

# --------------------------------------------------------------------------- ibdev2netdev


@dataclass(frozen=True)
class IbMapping:
    rdma: str
    port: int
    netdev: str
    up: bool | None


_IBDEV = re.compile(r"(\S+) port ([0-9]+) ==> (\S+)(?: \((Up|Down)\))?")


def parse_ibdev2netdev(text: str) -> dict[str, IbMapping]:
    """``ibdev2netdev``: ``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)``, any order. Keyed by netdev."""
    out: dict[str, IbMapping] = {}
    for line in lines(text):
        m = _IBDEV.fullmatch(line.strip())
        if not m:
            raise ProbeParseError("RDMA device map", f"unexpected line {line.strip()[:50]!r}", "ibdev2netdev")
        up = None if m.group(4) is None else m.group(4) == "Up"
        out[m.group(3)] = IbMapping(m.group(1), int(m.group(2)), m.group(3), up)
    if not out:
        raise ProbeParseError("RDMA device map", "no RDMA devices listed", "ibdev2netdev")
    return out


# --------------------------------------------------------------------------- sysfs, ip

_OPERSTATES = {"up", "down", "unknown", "dormant", "lowerlayerdown", "notpresent", "testing"}


def parse_operstate(text: str) -> str:
    line = one_line("link state", text, "sysfs operstate")
    if line not in _OPERSTATES:
        raise ProbeParseError("link state", f"not an operstate: {line[:30]!r}", "sysfs operstate")
    return line


def parse_mtu(text: str) -> int:
    """``class/net/IF/mtu``: bytes, no unit (the kernel prints ``%u``)."""
    return int_in("MTU", one_line("MTU", text, "sysfs mtu"), 68, 65536, "sysfs mtu")


def parse_ipv4(text: str) -> str | None:
    """``ip -4 -o addr show dev IF`` (or an ``ip -br addr`` line): the first
    IPv4 ``addr/prefix``; no output means no address."""
    found: list[str] = []
    for line in lines(text):
        m = re.search(r"\binet ([0-9.]+/[0-9]+)", line) or re.fullmatch(
            r"\S+\s+[A-Z]+\s+([0-9.]+/[0-9]+)(?:\s.*)?", line.strip())
        if not m:
            raise ProbeParseError("IPv4 address", f"unexpected line {line.strip()[:50]!r}", "ip")
        try:
            found.append(str(ipaddress.IPv4Interface(m.group(1))))
        except ValueError:
            raise ProbeParseError("IPv4 address", f"not an IPv4 address: {m.group(1)!r}", "ip") from None
    return found[0] if found else None


# --------------------------------------------------------------------------- ethtool


@dataclass(frozen=True)
class Ethtool:
    speed_mbps: int | None  # None: unknown (``Speed: Unknown!``, or no Speed line at all)
    link_detected: bool | None  # None: no Link detected line


# ethtool prints the speed only when the kernel reports one, as "\tSpeed: %uMb/s",
# and "\tSpeed: Unknown!" for 0, 0xffff and 0xffffffff (SPEED_UNKNOWN)
# (ethtool netlink/settings.c, linkmodes_reply_cb / dump_link_modes); the ioctl
# path (ethtool.c dump_link_caps) prints the same two forms. No Speed line at
# all is therefore "unknown" too, never 0.
_SPEED = re.compile(r"([0-9]+)Mb/s")


def parse_ethtool(text: str) -> Ethtool:
    """``ethtool IF`` (whole or grepped): ``Speed: 200000Mb/s`` / ``Unknown!`` /
    absent, ``Link detected: yes|no``. Needs one of the two lines."""
    t, what = "ethtool", "link speed"
    speeds: set[int | None] = set()
    detected: set[bool] = set()
    for line in lines(text):
        s = line.strip()
        if s.startswith("Speed:"):
            v = s[6:].strip()
            m = _SPEED.fullmatch(v)
            if m:
                speeds.add(int(m.group(1)))
            elif v == "Unknown!":
                speeds.add(None)
            else:
                raise ProbeParseError(what, f"Speed reads {v[:30]!r} (ethtool prints <N>Mb/s or Unknown!)", t)
        elif s.startswith("Link detected:"):
            v = s[14:].strip()
            if v not in ("yes", "no"):
                raise ProbeParseError(what, f"Link detected reads {v[:30]!r}", t)
            detected.add(v == "yes")
    if not speeds and not detected:
        raise ProbeParseError(what, "no Speed or Link detected line", t)
    if len(speeds) > 1 or len(detected) > 1:
        raise ProbeParseError(what, "two different Speed or Link detected lines (two interfaces pasted?)", t)
    return Ethtool(next(iter(speeds), None), next(iter(detected), None))


# --------------------------------------------------------------------------- GIDs


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str | None  # "RoCE v2" | "IB/RoCE v1" | None (empty slot)
    netdev: str | None


_GID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"
_DEV = re.compile(r"[A-Za-z0-9_.-]+")
_VERSIONS = {"v1": "IB/RoCE v1", "v2": "RoCE v2"}


def parse_gid_dump(text: str) -> dict[str, dict[int, Gid]]:
    """The ``gids`` section: ``DEV|N|gid|ndev|type`` per readable slot, made
    from ``class/infiniband/DEV/ports/1/{gids,gid_attrs/ndevs,gid_attrs/types}/N``."""
    what, t = "RoCE GID tables", "sysfs gids"
    out: dict[str, dict[int, Gid]] = {}
    for line in lines(text):
        parts = line.split("|")
        if len(parts) != 5:
            raise ProbeParseError(what, f"unexpected line {line[:50]!r}", t)
        dev, n, gid, nd, typ = (p.strip() for p in parts)
        if not _DEV.fullmatch(dev) or not n.isdigit() or not _GID.fullmatch(gid):
            raise ProbeParseError(what, f"unexpected line {line[:50]!r}", t)
        if typ not in ("", "RoCE v2", "IB/RoCE v1"):
            raise ProbeParseError(what, f"unknown GID type {typ[:20]!r}", t)
        out.setdefault(dev, {})[int(n)] = Gid(int(n), gid, typ or None, nd or None)
    if not out:
        raise ProbeParseError(what, "no RoCE device under class/infiniband", t)
    return out


def _is_ipv4(s: str) -> bool:
    try:
        ipaddress.IPv4Address(s)
    except ValueError:
        return False
    return True


def parse_show_gids(text: str) -> dict[str, dict[int, Gid]]:
    """``show_gids``, with or without its header and ``n_gids_found=`` footer.

    The script prints ``DEV\\tPORT\\tINDEX\\tGID\\t[IPv4 ]\\tVER\\tNETDEV`` with
    ``echo -e`` (NVIDIA's show_gids, as copied in IBM/DPFS
    experiments/scripts/show_gids.sh): the IPv4 cell is empty for non-IPv4
    GIDs and the netdev cell is empty when ``gid_attrs/ndevs`` is unreadable.
    A table pasted from a terminal has spaces instead of tabs, so cells are
    told apart by their content, not their separators: 5 to 7 cells; the
    IPv4 cell, when present, must be the address the GID maps.
    """
    what, t = "RoCE GID table", "show_gids"
    out: dict[str, dict[int, Gid]] = {}
    rows = 0
    footer: int | None = None
    for line in lines(text):
        cells = line.split()
        if (cells[0] == "DEV" and "INDEX" in cells) or set(line.strip()) <= set("- \t"):
            continue
        if cells[0].startswith("n_gids_found="):
            n = cells[0].partition("=")[2]
            if len(cells) != 1 or not n.isdigit():
                raise ProbeParseError(what, f"unexpected footer {line.strip()[:40]!r}", t)
            footer = int(n)
            continue
        if not 5 <= len(cells) <= 7 or not _DEV.fullmatch(cells[0]) or not cells[1].isdigit() \
                or not cells[2].isdigit() or not _GID.fullmatch(cells[3]):
            raise ProbeParseError(what, f"unexpected line {line.strip()[:60]!r}", t)
        rest = cells[4:]
        ipv4 = rest.pop(0) if rest and _is_ipv4(rest[0]) else None
        if not rest or rest[0] not in _VERSIONS:
            raise ProbeParseError(what, f"no v1/v2 version cell in {line.strip()[:60]!r}", t)
        ver = rest.pop(0)
        nd = rest.pop(0) if rest else None
        if rest or (nd is not None and not _DEV.fullmatch(nd)):
            raise ProbeParseError(what, f"unexpected cells after the version in {line.strip()[:60]!r}", t)
        mapped = gid_ipv4(cells[3])
        if ipv4 is not None and mapped is not None and ipv4 != mapped:
            raise ProbeParseError(what, f"IPv4 {ipv4} is not the address of GID {cells[3]}", t)
        index = int(cells[2])
        table = out.setdefault(cells[0], {})
        if index in table:
            raise ProbeParseError(what, f"GID index {index} of {cells[0]} listed twice", t)
        table[index] = Gid(index, cells[3], _VERSIONS[ver], nd)
        rows += 1
    if not out:
        raise ProbeParseError(what, "no GID rows", t)
    if footer is not None and footer != rows:
        raise ProbeParseError(what, f"n_gids_found={footer} but {rows} rows (table cut?)", t)
    return out


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``...:ffff:c0a8:640a`` -> 192.168.100.10)."""
    if not gid.startswith(_V4_MAPPED):
        return None
    hi, lo = gid[len(_V4_MAPPED):].split(":")
    return str(ipaddress.IPv4Address(int(hi + lo, 16)))


def rocev2_ipv4_gid_index(table: Mapping[int, Gid], netdev: str | None = None, ipv4: str | None = None) -> int | None:
    """The lowest slot holding a RoCE v2 IPv4-mapped GID (of ``ipv4`` when given,
    of ``netdev`` when the slot names one); None when there is none."""
    want = ipv4.split("/")[0] if ipv4 else None
    for n in sorted(table):
        g = table[n]
        if g.type != "RoCE v2" or g.gid == _ZERO_GID:
            continue
        addr = gid_ipv4(g.gid)
        if addr is None or (want and addr != want):
            continue
        if netdev and g.netdev and g.netdev != netdev:
            continue
        return n
    return None


# --------------------------------------------------------------------------- facts


def _netdevs(ctx: ScriptContext) -> list[str]:
    return ctx.netdevs


def _gids(ctx: ScriptContext, _: str) -> str:
    ib = f"{ctx.sysfs}/class/infiniband"
    slots = " ".join(str(n) for n in range(GID_SLOTS))
    return (f"[ -d {q(ib)} ] || exit 2; "
            f"for d in {q(ib)}/*; do "
            '[ -d "$d/ports/1" ] || continue; p="$d/ports/1"; '
            f"for n in {slots}; do "
            # the shell's own read, not $(cat ...): 16 slots x 3 files x every device was ~400 processes
            # per probe (tools/exporter_scrape.py); a slot whose gid file cannot be read is skipped, as before
            'g=; { IFS= read -r g || [ -n "$g" ]; } 2>/dev/null <"$p/gids/$n" || continue; '
            't=; { IFS= read -r t || :; } 2>/dev/null <"$p/gid_attrs/types/$n"; '
            'v=; { IFS= read -r v || :; } 2>/dev/null <"$p/gid_attrs/ndevs/$n"; '
            "printf '%s|%s|%s|%s|%s' \"${d##*/}\" \"$n\" \"$g\" \"$v\" \"$t\"; echo; "
            "done; done")


IBDEV2NETDEV = Fact("ibdev2netdev", "RDMA device map (ibdev2netdev)", lambda c, _: tool("ibdev2netdev"),
                    parse_ibdev2netdev)
# operstate first: a netdev without class/net/IF is "gone", and its other facts are not read.
NET_OPERSTATE = Fact("net.{}.operstate", "link state of {}",
                     lambda c, nd: small_file(f"{c.sysfs}/class/net/{nd}/operstate"), parse_operstate,
                     exit_codes=(NOT_FOUND, ExitCode(None, "gone", "no such netdev (class/net/{} is missing)",
                                                     silent_only=True)),
                     items=_netdevs)
NET_MTU = Fact("net.{}.mtu", "MTU of {}", lambda c, nd: small_file(f"{c.sysfs}/class/net/{nd}/mtu"), parse_mtu,
               items=_netdevs)
NET_IPV4 = Fact("net.{}.ipv4", "IPv4 address of {}", lambda c, nd: tool("ip", "-4", "-o", "addr", "show", "dev", q(nd)),
                parse_ipv4, items=_netdevs)
NET_ETHTOOL = Fact("net.{}.ethtool", "link speed (ethtool) of {}", lambda c, nd: tool("ethtool", q(nd)),
                   parse_ethtool, items=_netdevs,
                   # ethtool prints "No data available" and exits 75 when the kernel
                   # answered none of its requests (netlink/settings.c, settings_reply_cb)
                   exit_codes=(NOT_FOUND, ExitCode(75, "unreadable", "ethtool has no data for this netdev "
                                                                     "(exit code 75: the driver answered nothing)")))
GIDS = Fact("gids", "RoCE GID tables", _gids, parse_gid_dump,
            exit_codes=(NOT_FOUND, ExitCode(2, "unreadable", "no class/infiniband directory (RDMA driver not loaded?)")))
