"""PCIe facts: the link of each ConnectX-7 function from ``lspci -vv -s BDF``.

What this module owns: the pure parser of the ``LnkCap``/``LnkSta`` lines and
the :class:`~sparkctl.facts.registry.Fact` entry (run with ``sudo -n`` when the
node allows it: pciutils shows capabilities to root only). It must not run
anything.
"""

from __future__ import annotations

import re

from sparkctl.facts.nodefacts import PcieFacts
from sparkctl.facts.registry import Fact, ProbeParseError, ScriptContext, q, tool

# The four ConnectX-7 PCIe functions of a DGX Spark (docs/reference/spark-facts.md §3.4).
CX7_FUNCTIONS = ("0000:01:00.0", "0000:01:00.1", "0002:01:00.0", "0002:01:00.1")

# pciutils ls-caps.c cap_express_link: "LnkCap:\tPort #%d, Speed %s, Width x%d, ..."
# and "LnkSta:\tSpeed %s%s, Width x%d%s", the speed from link_speed() ("2.5GT/s"
# ... "64GT/s", or "unknown"), the marks from link_compare() (" (downgraded)",
# and " (ok)" in older releases). Indentation is tabs; pasted copies have spaces.
_LNKCAP = re.compile(r"^\s*LnkCap:\s*Port #[0-9]+,\s*Speed (\S+?),\s*Width x([0-9]+)", re.MULTILINE)
_LNKSTA = re.compile(
    r"^\s*LnkSta:\s*Speed (\S+?)(?: \((ok|downgraded)\))?,\s*Width x([0-9]+)(?: \((ok|downgraded)\))?",
    re.MULTILINE,
)
_GTS = re.compile(r"([0-9]+(?:\.[0-9]+)?)GT/s")


def _gts(what: str, raw: str, line: str) -> float:
    m = _GTS.fullmatch(raw)
    if not m:
        unknown = " (the link is not trained)" if raw == "unknown" else ""
        raise ProbeParseError(what, f"{line} speed reads {raw[:20]!r}, not <N>GT/s{unknown}", "lspci")
    return float(m.group(1))


def parse_lspci_link(text: str, bdf: str = "") -> PcieFacts:
    """``lspci -vv -s BDF``: LnkCap and LnkSta (spaces or tabs, with or without
    the ``(ok)``/``(downgraded)`` marks of newer pciutils)."""
    what = "PCIe link"
    if not text.strip():
        raise ProbeParseError(what, "lspci printed nothing (no such PCI function?)", "lspci")
    caps, stas = _LNKCAP.findall(text), _LNKSTA.findall(text)
    if not caps or not stas:
        hint = " (lspci shows capabilities to root only)" if "access denied" in text else ""
        raise ProbeParseError(what, f"no {'LnkCap' if not caps else 'LnkSta'} line{hint}", "lspci")
    if len(caps) > 1 or len(stas) > 1:
        raise ProbeParseError(what, f"{len(caps)} LnkCap and {len(stas)} LnkSta lines: more than one device", "lspci")
    (cap_raw, cap_w), (sta_raw, mark1, sta_w, mark2) = caps[0], stas[0]
    cap_gts, sta_gts = _gts(what, cap_raw, "LnkCap"), _gts(what, sta_raw, "LnkSta")
    cw, sw = int(cap_w), int(sta_w)
    marked = "downgraded" in (mark1, mark2)
    return PcieFacts(bdf, cap_gts, cw, sta_gts, sw, marked or sta_gts < cap_gts or sw < cw)


def _lspci(ctx: ScriptContext, bdf: str) -> str:
    plain = f"lspci -vv -s {q(bdf)}"
    if ctx.node.sudo:  # capabilities (LnkCap/LnkSta) are shown to root only
        return f"have lspci || exit 127; {{ have sudo && sudo -n {plain} 2>/dev/null; }} || {plain}"
    return tool("lspci", "-vv", "-s", q(bdf))


PCIE = Fact("pcie.{}", "PCIe link of {}", _lspci, parse_lspci_link, items=lambda c: CX7_FUNCTIONS)
