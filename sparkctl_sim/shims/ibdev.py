"""RDMA identity of the four CX-7 RoCE functions: ``ibdev2netdev``, the GID
table the kernel derives from the netdevs' addresses, ``show_gids`` and the
sysfs tree ``/sys/class/infiniband`` (docs/reference/spark-facts.md §2.1, §2.2, §2.4)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from sparkctl_sim.shims.common import (
    GID_TABLE_LEN,
    NETDEV_OF,
    ROCE_DEVICES,
    SPARK_OUI,
    ZERO_GID,
    Gid,
    Netdevs,
    State,
    ToolResult,
    _result,
)

# --------------------------------------------------------------------------
# RDMA identity: ibdev2netdev, GID table, show_gids, sysfs
# --------------------------------------------------------------------------


def ibdev2netdev(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)`` per device (§2.1).

    A twin netdev missing from the namespace reads (Down): a real Spark always
    has all four.
    """
    out = []
    for dev, nd, _ in ROCE_DEVICES:
        up = nd in netdevs and netdevs[nd].link_up
        out.append(f"{dev} port 1 ==> {nd} ({'Up' if up else 'Down'})")
    return _result("\n".join(out) + "\n")


def netdev_mac(hostname: str, netdev: str) -> str:
    """A stable Spark-like MAC (4c:bb:47:xx:xx:xx) for a twin netdev."""
    h = zlib.crc32(f"{hostname}/{netdev}".encode()) & 0xFFFFFF
    b = SPARK_OUI + ((h >> 16) & 0xFF, (h >> 8) & 0xFF, h & 0xFF)
    return ":".join(f"{x:02x}" for x in b)


def _link_local_gid(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    groups = ["fe80", "0000", "0000", "0000"] + [f"{eui[k]:02x}{eui[k + 1]:02x}" for k in range(0, 8, 2)]
    return ":".join(groups)


def _ipv4_gid(ip: str) -> str:
    o = [int(x) for x in ip.split(".")]
    return f"0000:0000:0000:0000:0000:ffff:{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"


def gid_shift(state: State, netdev: str) -> int:
    """How far the RoCEv2 IPv4 GID drifted past index 3 (state["gid_index_shift"])."""
    return int(state.get("gid_index_shift", {}).get(netdev, 0))


def gid_table(state: State, dev: str, netdevs: Netdevs) -> dict[int, Gid]:
    """The populated GID slots of one RoCE device (port 1).

    0/1: link-local v1/v2; then per IPv4 address a v1 and a v2 entry (2/3 on a
    fresh box; the v2 entry of the first address lands ``gid_shift`` slots
    later, leaving a zero hole, as seen on drifted Sparks, §2.2/§2.4). An
    admin-down or missing netdev has no GIDs (the kernel drops them on
    NETDEV_DOWN).

    ``state["links"][netdev]["link_local_ipv4"]`` (e.g. ``169.254.23.7``) puts
    an IPv4 link-local address's v1/v2 pair on the port BEFORE the fabric
    address, the harder case for whoever picks the GID: netplan's
    ``link-local: [ipv4]`` makes systemd-networkd run IPv4LL
    (``LinkLocalAddressing=ipv4``, systemd.network(5); netplan docs,
    "link-local"), and ib_core adds one GID pair per address in the order the
    addresses appear (drivers/infiniband/core/roce_gid_mgmt.c: the inetaddr
    notifier -> update_gid_ip(GID_ADD); drivers/infiniband/core/cache.c:
    add_modify_gid takes the first free slot), so an address acquired before
    the static one owns the lower indexes. The address itself is not put on
    the veth: only the GID table (what NCCL and the launch script read) shows
    it.
    """
    nd = NETDEV_OF[dev]
    facts = netdevs.get(nd)
    if facts is None or not facts.admin_up:
        return {}
    ll = _link_local_gid(netdev_mac(state.get("hostname", ""), nd))
    table = {0: Gid(0, ll, "IB/RoCE v1", nd), 1: Gid(1, ll, "RoCE v2", nd)}
    shift = gid_shift(state, nd)

    def free_from(k: int) -> int:
        while k in table:
            k += 1
        return k

    extra = state.get("links", {}).get(nd, {}).get("link_local_ipv4")
    addrs = [(str(extra), 16), *facts.ipv4] if extra else list(facts.ipv4)
    first_fabric = True
    for ip, _plen in addrs:
        g = _ipv4_gid(ip)
        k1 = free_from(2)
        table[k1] = Gid(k1, g, "IB/RoCE v1", nd, ip)
        drift = shift if first_fabric and not is_ipv4_link_local(ip) else 0
        first_fabric = first_fabric and is_ipv4_link_local(ip)
        k2 = free_from(k1 + 1 + drift)
        table[k2] = Gid(k2, g, "RoCE v2", nd, ip)
    return {k: v for k, v in table.items() if k < GID_TABLE_LEN}


def roce_v2_ipv4_gid_index(state: State, dev: str, netdevs: Netdevs) -> int | None:
    """Index of the first RoCE v2 IPv4-mapped GID (link-local 169.254/16 included)."""
    for k, g in sorted(gid_table(state, dev, netdevs).items()):
        if g.type == "RoCE v2" and g.ipv4:
            return k
    return None


def is_ipv4_link_local(ip: str) -> bool:
    """169.254.0.0/16 (RFC 3927): never the fabric's address."""
    return ip.startswith("169.254.")


def fabric_gid_index(state: State, dev: str, netdevs: Netdevs) -> int | None:
    """Index of the first RoCE v2 GID of a routable (not link-local) IPv4
    address: what NCCL_IB_GID_INDEX should be."""
    for k, g in sorted(gid_table(state, dev, netdevs).items()):
        if g.type == "RoCE v2" and g.ipv4 and not is_ipv4_link_local(g.ipv4):
            return k
    return None


def show_gids(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """The Mellanox ``show_gids`` script's output (§2.2), tabs and all."""
    devs = [d for d, _, _ in ROCE_DEVICES]
    if args:
        if args[0] not in devs:
            return _result("", f"ls: cannot access '/sys/class/infiniband/{args[0]}/ports/': No such file or directory\n", 2)
        devs = [args[0]]
    out = [
        "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV",
        "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---",
    ]
    n = 0
    for dev in devs:
        table = gid_table(state, dev, netdevs)
        for k in sorted(table, key=str):  # the script walks `ls gids/`: 0 1 10 100 ... 2
            g = table[k]
            ver = g.type[g.type.index("v") :]
            if g.ipv4:
                out.append(f"{dev}\t1\t{k}\t{g.gid}\t{g.ipv4}  \t{ver}\t{g.netdev}")
            else:
                out.append(f"{dev}\t1\t{k}\t{g.gid}\t\t\t{ver}\t{g.netdev}")
            n += 1
    out.append(f"n_gids_found={n}")
    return _result("\n".join(out) + "\n")


def _port_rate(state: State, nd: str, up: bool) -> str:
    if not up:
        return "40 Gb/sec (4X QDR)\n"  # what a down CX-7 port reads on a Spark (§2.4)
    speed = int(state["links"].get(nd, {}).get("speed_mbps", 200000))
    name = {200000: "4X HDR", 100000: "4X EDR", 50000: "2X HDR", 40000: "4X QDR", 25000: "1X EDR"}.get(speed, "4X HDR")
    return f"{speed // 1000} Gb/sec ({name})\n"


def render_sysfs_infiniband(state: State, netdevs: Netdevs) -> dict[str, str | None]:
    """Relative path -> content of ``class/infiniband/...`` (None = must not exist).

    Empty slots keep a zero ``gids/N`` but have no ``gid_attrs/{types,ndevs}/N``
    file: the real kernel fails those reads, and every Spark script reads
    them with ``2>/dev/null``.
    """
    files: dict[str, str | None] = {}
    for dev, nd, _ in ROCE_DEVICES:
        base = f"class/infiniband/{dev}/ports/1"
        table = gid_table(state, dev, netdevs)
        for k in range(GID_TABLE_LEN):
            g = table.get(k)
            files[f"{base}/gids/{k}"] = (g.gid if g else ZERO_GID) + "\n"
            files[f"{base}/gid_attrs/types/{k}"] = (g.type + "\n") if g else None
            files[f"{base}/gid_attrs/ndevs/{k}"] = (g.netdev + "\n") if g else None
        up = nd in netdevs and netdevs[nd].link_up
        files[f"{base}/rate"] = _port_rate(state, nd, up)
        files[f"{base}/state"] = "4: ACTIVE\n" if up else "1: DOWN\n"
        files[f"{base}/phys_state"] = "5: LinkUp\n" if up else "3: Disabled\n"
        files[f"{base}/link_layer"] = "Ethernet\n"
    return files


def write_sysfs_infiniband(root_dir: str | os.PathLike[str], state: State, netdevs: Netdevs) -> None:
    """Write the ``class/infiniband`` tree under ``root_dir`` (a sysfs_root, or a
    tmpfs to mount over /sys/class/infiniband: then pass its parent-of-parent).
    Rewrites in place; removes attrs of slots that became empty."""
    root = Path(root_dir)
    for rel, content in render_sysfs_infiniband(state, netdevs).items():
        p = root / rel
        if content is None:
            p.unlink(missing_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            if p.read_text() == content:
                continue
        except FileNotFoundError:
            pass
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, p)


