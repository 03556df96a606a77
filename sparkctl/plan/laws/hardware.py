"""Laws about the hardware under the fabric: the CX-7's PCIe link (``pcie_link``).

Pure checks over NodeFacts (``pcie`` from the lspci fact, sparkctl.facts.pci). Nothing here touches a host.
"""

from __future__ import annotations

from sparkctl.plan.laws.base import (
    AC_CYCLE_FIX,
    FAIL,
    OK,
    SKIP,
    Context,
    Verdict,
    facts_of,
)


def check_pcie_link(ctx: Context) -> list[Verdict]:
    """Every CX-7 function trained at its maximum: LnkSta speed and width equal LnkCap's."""
    out: list[Verdict] = []
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        unreadable = {k: v for k, v in getattr(f, "unreadable", {}).items() if k.startswith("pcie.")}
        for key, why in unreadable.items():
            out.append(Verdict("pcie_link", node, FAIL, "unreadable", "LnkSta = LnkCap", why, key[len("pcie."):]))
        pcie = getattr(f, "pcie", None) or {}
        if not pcie and not unreadable:
            out.append(Verdict("pcie_link", node, SKIP, "no PCIe link read (lspci not available?)", "LnkSta = LnkCap"))
        for bdf, p in sorted(pcie.items()):
            seen = f"{p.sta_gts:g} GT/s x{p.sta_width}"
            want = f"{p.cap_gts:g} GT/s x{p.cap_width}"
            if p.downgraded or p.sta_gts < p.cap_gts or p.sta_width < p.cap_width:
                out.append(Verdict("pcie_link", node, FAIL, seen, want,
                                   f"the CX-7 function {bdf} on {node} trained below its maximum: {AC_CYCLE_FIX}; "
                                   "if it stays down, reseat the cable and check `lspci -vv -s " + bdf + "`", bdf))
            else:
                out.append(Verdict("pcie_link", node, OK, seen, want, subject=bdf))
    return out
