"""Laws about the hardware under the fabric: the CX-7's PCIe link (``pcie_link``).

Pure checks over NodeFacts (``pcie`` from the lspci fact, sparkctl.facts.pci: the function's link and
its upstream port's LnkCap). Nothing here touches a host.
"""

from __future__ import annotations

import re
from typing import Any

from sparkctl.plan.laws.base import (
    AC_CYCLE_FIX,
    FAIL,
    OK,
    SKIP,
    Context,
    Verdict,
    facts_of,
)

WANT = "LnkSta = the narrower of LnkCap and the slot's"


def _slot_limit(p: Any) -> tuple[float, int, str]:
    """(speed, width, why) a function can reach: the narrower of its own LnkCap and its slot's.

    A PCIe link trains to what both ends support (PCI Express Base Specification, link
    training: the width and rate both ports advertise), so a CX-7 behind a two-lane root
    port stays at x2 for good (the GX10's second controller, sparkctl.facts.pci)."""
    if p.slot is None or p.slot_gts is None or p.slot_width is None:
        return p.cap_gts, p.cap_width, ""
    gts, width = min(p.cap_gts, p.slot_gts), min(p.cap_width, p.slot_width)
    if (gts, width) == (p.cap_gts, p.cap_width):
        return gts, width, ""
    return gts, width, (f"the slot gives {gts:g} GT/s x{width}: upstream port {p.slot} LnkCap "
                        f"{p.slot_gts:g} GT/s x{p.slot_width}, the CX-7 can {p.cap_gts:g} GT/s x{p.cap_width}")


# systemd's predictable names carry the PCI address: en[P<domain>]p<bus>s<slot>f<function>
# (systemd.net-naming-scheme(7)); np<N> is the port name suffix: enP2p1s0f1np1 = 0002:01:00.1.
_NETDEV_BDF = re.compile(r"en(?:P([0-9]+))?p([0-9]+)s([0-9]+)f([0-9]+)(?:np[0-9]+)?")


def netdev_bdf(netdev: str) -> str | None:
    m = _NETDEV_BDF.fullmatch(netdev)
    if not m:
        return None
    dom, bus, slot, fn = (int(g or 0) for g in m.groups())
    return f"{dom:04x}:{bus:02x}:{slot:02x}.{fn}"


def slot_share(ctx: Context, node: str, netdev: str) -> float:
    """The part of a full CX-7 function's PCIe bandwidth that ``netdev``'s slot gives (1.0: all of it,
    0.5: the GX10's two-lane root port; 1.0 when not known)."""
    f = facts_of(ctx, node)
    bdf = netdev_bdf(netdev)
    p = (getattr(f, "pcie", None) or {}).get(bdf) if bdf else None
    if p is None or not p.cap_gts or not p.cap_width:
        return 1.0
    gts, width, _ = _slot_limit(p)
    return float(min(1.0, (gts * width) / (p.cap_gts * p.cap_width)))


def check_pcie_link(ctx: Context) -> list[Verdict]:
    """Every CX-7 function trained at what its slot can give: LnkSta speed and width equal the
    narrower of its own LnkCap and its upstream port's LnkCap (its own alone when the port was
    not read: then pciutils' ``(downgraded)`` mark counts too)."""
    out: list[Verdict] = []
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        unreadable = {k: v for k, v in getattr(f, "unreadable", {}).items() if k.startswith("pcie.")}
        for key, why in unreadable.items():
            out.append(Verdict("pcie_link", node, FAIL, "unreadable", WANT, why, key[len("pcie."):]))
        pcie = getattr(f, "pcie", None) or {}
        if not pcie and not unreadable:
            out.append(Verdict("pcie_link", node, SKIP, "no PCIe link read (lspci not available?)", WANT))
        for bdf, p in sorted(pcie.items()):
            gts, width, why = _slot_limit(p)
            seen = f"{p.sta_gts:g} GT/s x{p.sta_width}"
            want = f"{gts:g} GT/s x{width}" + (f" ({why})" if why else "")
            marked = p.downgraded and p.slot_width is None  # pciutils compares with the function's LnkCap only
            if marked or p.sta_gts < gts or p.sta_width < width:
                slot = ("" if p.slot is not None else
                        "; its upstream port was not read, so it is judged against its own LnkCap")
                out.append(Verdict("pcie_link", node, FAIL, seen, want,
                                   f"the CX-7 function {bdf} on {node} trained below what its slot gives{slot}: "
                                   f"{AC_CYCLE_FIX}; if it stays down, reseat the cable and check "
                                   f"`lspci -vv -s {bdf}`", bdf))
            else:
                out.append(Verdict("pcie_link", node, OK, seen, want, subject=bdf))
    return out
