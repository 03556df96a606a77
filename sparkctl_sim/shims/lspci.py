"""``lspci`` for the CX-7 PCIe functions and the root ports above them (link
speed/width, -vvv capability blocks, ``-PP`` bus paths, what a non-root user
cannot read).

A link trains to what both of its ends support (PCI Express Base Specification,
link training), so a function's LnkSta is the narrower of its own state
(``pcie.gen_gts``/``pcie.width``: a degraded link) and its root port's LnkCap
(``pcie.root_ports.DDDD.width``). A GX10-style node: ``sparkctl sim set NODE
pcie.root_ports.0002.width=2``, the second CX-7 controller behind a two-lane root
port (NVIDIA developer forum thread 367853: LnkCap x4, ``LnkSta ... Width x2
(downgraded)``, "the upstream port at 0002:00:00.0 only exposes x2 lanes").
pciutils marks ``(downgraded)`` against the function's own LnkCap
(ls-caps.c ``link_compare``), whatever the port can give. The root port's name
line is not from a capture (nothing reads it); its capability lines follow
ls-caps.c (``Express (v2) Root Port (Slot-)``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl_sim.shims.common import ROCE_DEVICES, State, ToolResult, _result

LSPCI_NAME = "Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]"
ROOT_PORT_NAME = "PCI bridge: NVIDIA Corporation Device"
# the root port above each CX-7 controller (spark-facts.md §3.4: root ports 0000:00:00.0, 0002:00:00.0)
ROOT_PORTS = ("0000:00:00.0", "0002:00:00.0")


def _gts(v: float) -> str:
    return f"{int(v)}GT/s" if float(v).is_integer() else f"{v:g}GT/s"


def _root_cap(state: State, domain: str) -> tuple[float, int]:
    """The LnkCap of the root port of ``domain`` (``pcie.root_ports.DDDD``; Gen5 x4 by default)."""
    rp = state.get("pcie", {}).get("root_ports", {}).get(domain, {})
    return float(rp.get("gen_gts", 32)), int(rp.get("width", 4))


def _pcie_of(state: State, bdf: str) -> tuple[float, int]:
    """The trained link of a CX-7 function: its own state, capped by its root port's LnkCap."""
    pc = state.get("pcie", {})
    over = pc.get("functions", {}).get(bdf, {})
    gts, width = float(over.get("gen_gts", pc.get("gen_gts", 32))), int(over.get("width", pc.get("width", 4)))
    root_gts, root_width = _root_cap(state, bdf[:4])
    return min(gts, root_gts), min(width, root_width)


def _bdf_match(pattern: str, bdf: str) -> bool:
    """lspci -s [[[domain:]bus:]slot][.func] matching."""
    dom, bus, rest = bdf.split(":")
    slot, func = rest.split(".")
    p = pattern
    pfunc = None
    if "." in p:
        p, pfunc = p.rsplit(".", 1)
    parts = p.split(":") if p else []
    want = {"func": pfunc}
    if len(parts) == 3:
        want.update(dom=parts[0], bus=parts[1], slot=parts[2])
    elif len(parts) == 2:
        want.update(bus=parts[0], slot=parts[1])
    elif len(parts) == 1:
        want.update(slot=parts[0])
    have = {"dom": dom, "bus": bus, "slot": slot, "func": func}
    for k, v in want.items():
        if v in (None, "", "*"):
            continue
        try:
            if int(v, 16) != int(have[k], 16):
                return False
        except ValueError:
            return False
    return True


def _lspci_block(state: State, bdf: str, vvv: bool, euid: int) -> list[str]:
    gts, width = _pcie_of(state, bdf)
    func = int(bdf[-1])
    L = [
        f"{bdf} {LSPCI_NAME}",
        "\tSubsystem: Mellanox Technologies Device 0026",
        "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+",
        "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-",
        "\tLatency: 0",
        "\tInterrupt: pin A routed to IRQ 255",
        f"\tRegion 0: Memory at {0x1800000000 + int(bdf[:4], 16) * 0x10000000 + func * 0x2000000:x}"
        " (64-bit, prefetchable) [size=32M]",
    ]
    if euid != 0:
        # unprivileged lspci cannot read extended config space: no LnkSta
        return L + ["\tCapabilities: <access denied>", "\tKernel driver in use: mlx5_core", "\tKernel modules: mlx5_core", ""]
    speed = _gts(gts) + ("" if gts >= 32 else " (downgraded)")
    wid = f"x{width}" + ("" if width >= 4 else " (downgraded)")
    L += [
        "\tCapabilities: [60] Express (v2) Endpoint, MSI 00",
        "\t\tDevCap:\tMaxPayload 512 bytes, PhantFunc 0, Latency L0s unlimited, L1 unlimited",
        "\t\t\tExtTag+ AttnBtn- AttnInd- PwrInd- RBE+ FLReset+ SlotPowerLimit 0W",
        "\t\tDevCtl:\tCorrErr+ NonFatalErr+ FatalErr+ UnsupReq+",
        "\t\t\tRlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+ FLReset-",
        "\t\t\tMaxPayload 256 bytes, MaxReadReq 4096 bytes",
        "\t\tDevSta:\tCorrErr- NonFatalErr- FatalErr- UnsupReq- AuxPwr- TransPend-",
        "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x4, ASPM not supported",
        "\t\t\tClockPM- Surprise- LLActRep- BwNot- ASPMOptComp+",
        "\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+",
        "\t\t\tExtSynch- ClockPM- AutWidDis- BWInt- AutBWInt-",
        f"\t\tLnkSta:\tSpeed {speed}, Width {wid}",
        "\t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-",
        "\t\tDevCap2: Completion Timeout: Range ABC, TimeoutDis+ NROPrPrP- LTR-",
        "\t\tLnkCtl2: Target Link Speed: 32GT/s, EnterCompliance- SpeedDis-",
        "\tCapabilities: [100 v1] Advanced Error Reporting",
        "\tKernel driver in use: mlx5_core",
        "\tKernel modules: mlx5_core",
        "",
    ]
    if vvv:
        L.insert(-3, "\tCapabilities: [1c0 v1] Secondary PCI Express")
    return L


def _root_block(state: State, bdf: str, euid: int) -> list[str]:
    cap_gts, cap_width = _root_cap(state, bdf[:4])
    # the port's link runs at what the function below it trained to (the same link, seen from above)
    gts, width = min(_pcie_of(state, f) for _, _, f in ROCE_DEVICES if f[:4] == bdf[:4])
    L = [f"{bdf} {ROOT_PORT_NAME}",
         "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+",
         "\tBus: primary=00, secondary=01, subordinate=01, sec-latency=0"]
    if euid != 0:
        return L + ["\tCapabilities: <access denied>", "\tKernel driver in use: pcieport", ""]
    speed = _gts(gts) + ("" if gts >= cap_gts else " (downgraded)")
    wid = f"x{width}" + ("" if width >= cap_width else " (downgraded)")
    return L + [
        "\tCapabilities: [70] Express (v2) Root Port (Slot-), MSI 00",
        f"\t\tLnkCap:\tPort #0, Speed {_gts(cap_gts)}, Width x{cap_width}, ASPM not supported",
        "\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+",
        f"\t\tLnkSta:\tSpeed {speed}, Width {wid}",
        "\tKernel driver in use: pcieport",
        "",
    ]


def _slot_name(bdf: str, path: int) -> str:
    """pciutils lspci.c show_slot_path/show_slot_name with -D: the root port first for -P/-PP."""
    if not path or bdf in ROOT_PORTS:
        return bdf
    dom, rest = bdf[:4], bdf[5:]
    return f"{dom}:00:00.0/" + (rest if path > 1 else rest.split(":", 1)[1])


def lspci(state: State, args: Sequence[str], *, euid: int) -> ToolResult:
    """``lspci [-v|-vv|-vvv] [-s BDF] [-D] [-P|-PP]`` for the CX-7 functions and their root ports (§3.4)."""
    verbose = 0
    path = 0
    sel: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-s":
            sel = args[i + 1] if i + 1 < len(args) else ""
            i += 2
            continue
        if a.startswith("-s") and len(a) > 2:
            sel = a[2:]
        elif a.startswith("-v") and set(a[1:]) == {"v"}:
            verbose = max(verbose, len(a) - 1)
        elif a.startswith("-P") and set(a[1:]) == {"P"}:
            path = max(path, len(a) - 1)
        elif a in ("-D", "-nn", "-n", "-k"):
            pass
        else:
            return _result("", f"lspci: invalid option -- '{a.lstrip('-')[:1]}'\n", 2)
        i += 1
    every = sorted(ROOT_PORTS + tuple(bdf for _, _, bdf in ROCE_DEVICES))
    bdfs = [bdf for bdf in every if sel is None or _bdf_match(sel, bdf)]
    if verbose < 2:
        return _result("".join(f"{_slot_name(b, path)} {ROOT_PORT_NAME if b in ROOT_PORTS else LSPCI_NAME}\n"
                               for b in bdfs))
    out: list[str] = []
    for b in bdfs:
        out += _root_block(state, b, euid) if b in ROOT_PORTS else _lspci_block(state, b, verbose >= 3, euid)
    return _result("".join(line + "\n" for line in out))


