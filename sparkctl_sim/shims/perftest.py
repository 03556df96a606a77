"""``ib_write_bw`` (perftest) as a model, not a benchmark: the report layout
and units perftest prints, bandwidth from the node's rail state."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from sparkctl_sim.shims.common import (
    BDF_OF_NETDEV,
    NETDEV_OF,
    ROCE_DEVICES,
    Netdevs,
    State,
    ToolResult,
    _jitter,
    _result,
)
from sparkctl_sim.shims.ibdev import gid_table, roce_v2_ipv4_gid_index
from sparkctl_sim.shims.lspci import _pcie_of

# --------------------------------------------------------------------------
# ib_write_bw
# --------------------------------------------------------------------------

_IB_LINE = "-" * 87
_IB_MTUS = (4096, 2048, 1024, 512, 256)


def _roce_mtu(netdev_mtu: int) -> int:
    # active RoCE MTU: largest IB MTU that fits the netdev MTU minus headers
    return next((m for m in _IB_MTUS if m + 100 <= netdev_mtu), 256)


def _gid_bytes(ip: str) -> str:
    return ":".join(["00"] * 10 + ["255", "255"] + [f"{int(o):02d}" for o in ip.split(".")])


def rail_bandwidth_gbps(state: State, dev: str) -> float:
    """Model BW average of one twin: healthy 92-111 Gb/s, stale ~13.4 Gb/s,
    scaled down with the link speed and capped by the PCIe link."""
    nd = NETDEV_OF[dev]
    link = state["links"].get(nd, {})
    host = state.get("hostname", "")
    if link.get("stale"):
        return round(13.35 + _jitter(host, dev, "stale") * 0.2, 2)  # 13.41 / 13.49 seen (§4.1)
    bw = 92.5 + _jitter(host, dev, "bw") * 18.0
    bw *= min(1.0, int(link.get("speed_mbps", 200000)) / 200000)
    gts, width = _pcie_of(state, BDF_OF_NETDEV[nd])
    enc = 128 / 130 if gts >= 8 else 0.8
    bw = min(bw, gts * width * enc * 0.9)
    return round(bw, 2)


def ib_write_bw(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """Client side of ``ib_write_bw ... --report_gbits SERVER`` as a model: no
    traffic, the report layout of perftest 4.5/6.x (§4.1). Without SERVER it
    prints the server banner and returns (no server side is simulated)."""
    dev = ROCE_DEVICES[0][0]
    gid_index: int | None = None
    qps, size, iters, duration = 1, 65536, 5000, None
    rdma_cm = infinite = gbits = False
    link_type = "Ethernet"
    server = None
    i = 0
    with_value = {"-d", "--ib-dev", "-i", "--ib-port", "-p", "--port", "-x", "--gid-index", "-q", "--qp",
                  "-s", "--size", "-n", "--iters", "-D", "--duration", "-m", "--mtu", "--force-link", "-t", "--tx-depth"}
    while i < len(args):
        a = args[i]
        v = args[i + 1] if a in with_value and i + 1 < len(args) else None
        if a in with_value and v is None:
            return _result("", f" Option {a} requires an argument\n", 1)
        try:
            if a in ("-d", "--ib-dev"):
                dev = v  # type: ignore[assignment]
            elif a in ("-x", "--gid-index"):
                gid_index = int(v)  # type: ignore[arg-type]
            elif a in ("-q", "--qp"):
                qps = int(v)  # type: ignore[arg-type]
            elif a in ("-s", "--size"):
                size = int(v)  # type: ignore[arg-type]
            elif a in ("-n", "--iters"):
                iters = int(v)  # type: ignore[arg-type]
            elif a in ("-D", "--duration"):
                duration = int(v)  # type: ignore[arg-type]
            elif a == "--force-link":
                link_type = "IB" if v == "IB" else "Ethernet"
        except ValueError:
            return _result("", f" Invalid value for {a}: {v}\n", 1)
        if a in with_value:
            i += 2
            continue
        if a == "--report_gbits":
            gbits = True
        elif a in ("-R", "--rdma_cm"):
            rdma_cm = True
        elif a == "--run_infinitely":
            infinite = True
        elif a in ("-F", "--CPU-freq", "-a", "--all", "-b", "--bidirectional"):
            pass
        elif a.startswith("-"):
            return _result("", f"ib_write_bw: unrecognized option '{a}'\n", 1)
        else:
            server = a
        i += 1
    if dev not in NETDEV_OF:
        return _result("", f" IB device {dev} not found\n Unable to find the Infiniband/RoCE device\n", 1)
    nd = NETDEV_OF[dev]
    facts = netdevs.get(nd)
    if facts is None or not facts.link_up:
        return _result("", " Port number 1 state is Down\n Couldn't set the link layer\n"
                       " Couldn't get context for the device\n", 1)
    table = gid_table(state, dev, netdevs)
    auto = roce_v2_ipv4_gid_index(state, dev, netdevs)
    idx = gid_index if gid_index is not None else (auto if auto is not None else 0)
    head = []
    if infinite or duration:
        head.append("  WARNING: BW peak won't be measured in this run.")
    if server is None:
        return _result(
            "\n************************************\n* Waiting for client to connect... *\n************************************\n"
        )
    head += [
        _IB_LINE,
        "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {dev}",
        f" Number of qps   : {qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON",
        " ibv_wr* API     : ON",
        " TX depth        : 128",
        " CQ Moderation   : 1",
        f" Mtu             : {_roce_mtu(facts.mtu)}[B]",
        f" Link type       : {link_type}",
        *([f" GID index       : {idx}"] if link_type == "Ethernet" else []),
        " Max inline data : 0[B]",
        f" rdma_cm QPs\t : {'ON' if rdma_cm else 'OFF'}",
        f" Data ex. method : {'rdma_cm' if rdma_cm else 'Ethernet'}",
        _IB_LINE,
    ]
    g = table.get(idx)
    if g is None:
        return _result(
            "\n".join(head) + "\n",
            f" Failed to modify QP {0x129 + 0} to RTR\n Unable to Connect the HCA's through the link\n",
            1,
        )
    host = state.get("hostname", "")
    for q in range(qps):
        psn = zlib.crc32(f"{host}{dev}{q}".encode()) & 0xFFFFFF
        if rdma_cm:
            head.append(f" local address: LID 0000 QPN {0x129 + q:#06x} PSN {psn:#x}")
        else:
            head.append(f" local address: LID 0000 QPN {0x129 + q:#06x} PSN {psn:#x} RKey 0x184300 VAddr 0x00ec99bedad000")
            head.append(" GID: " + (_gid_bytes(g.ipv4) if g.ipv4 else ":".join(["00"] * 16)))
    rpsn = zlib.crc32(f"{server}{dev}".encode()) & 0xFFFFFF
    for q in range(qps):
        if rdma_cm:
            head.append(f" remote address: LID 0000 QPN {0x129 + q:#06x} PSN {rpsn + q:#x}")
        else:
            head.append(f" remote address: LID 0000 QPN {0x129 + q:#06x} PSN {rpsn + q:#x} RKey 0x184300 VAddr 0x00ffeec955d000")
            remote = _gid_bytes(server) if server.count(".") == 3 else ":".join(["00"] * 16)
            head.append(" GID: " + remote)
    head.append(_IB_LINE)
    if not (g.type == "RoCE v2" and g.ipv4):
        # a wrong -x: header, no result row, exit 0 (§4.1 known failure mode)
        return _result("\n".join(head) + "\n")
    unit = "Gb/sec" if gbits else "MB/sec"
    head.append(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    bw = rail_bandwidth_gbps(state, dev)
    rate_mpps = bw * 1e9 / 8 / size / 1e6
    n = int(rate_mpps * 1e6 * duration) if duration else iters
    peak = 0.0 if (infinite or duration) else bw + 0.01
    # without --report_gbits perftest reports 2^20 bytes/s ("MB/sec", "MiB/sec" from
    # 24.07): format_factor 0x100000 in print_report_bw (perftest src/perftest_parameters.c)
    mib = 1e9 / 8 / 0x100000
    shown_bw, shown_peak = (bw, peak) if gbits else (bw * mib, peak * mib)
    rows = 2 if infinite else 1
    for _ in range(rows):
        head.append(f" {size:<7}    {n:<7}          {shown_peak:<7.2f}            {shown_bw:<7.2f}\t\t   {rate_mpps:<7.6f}")
    if not infinite:
        head.append(_IB_LINE)
    return _result("\n".join(head) + "\n")


