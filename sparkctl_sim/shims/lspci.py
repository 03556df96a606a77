"""``lspci`` for the CX-7 PCIe functions (link speed/width, -vvv capability
blocks, what a non-root user cannot read)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl_sim.shims.common import ROCE_DEVICES, State, ToolResult, _result

LSPCI_NAME = "Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]"


def _gts(v: float) -> str:
    return f"{int(v)}GT/s" if float(v).is_integer() else f"{v:g}GT/s"


def _pcie_of(state: State, bdf: str) -> tuple[float, int]:
    pc = state.get("pcie", {})
    over = pc.get("functions", {}).get(bdf, {})
    return float(over.get("gen_gts", pc.get("gen_gts", 32))), int(over.get("width", pc.get("width", 4)))


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


def lspci(state: State, args: Sequence[str], *, euid: int) -> ToolResult:
    """``lspci [-v|-vv|-vvv] [-s BDF] [-D]`` for the four CX-7 functions (§3.4)."""
    verbose = 0
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
        elif a in ("-D", "-nn", "-n", "-k"):
            pass
        else:
            return _result("", f"lspci: invalid option -- '{a.lstrip('-')[:1]}'\n", 2)
        i += 1
    bdfs = [bdf for _, _, bdf in ROCE_DEVICES if sel is None or _bdf_match(sel, bdf)]
    if verbose < 2:
        return _result("".join(f"{b} {LSPCI_NAME}\n" for b in bdfs))
    out: list[str] = []
    for b in bdfs:
        out += _lspci_block(state, b, verbose >= 3, euid)
    return _result("".join(line + "\n" for line in out))


