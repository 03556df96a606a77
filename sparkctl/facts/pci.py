"""PCIe facts: the link of each ConnectX-7 function from ``lspci -vv -s BDF``, and its slot.

What this module owns: the pure parser of the ``LnkCap``/``LnkSta`` lines and
the :class:`~sparkctl.facts.registry.Fact` entry (run with ``sudo -n`` when the
node allows it: pciutils shows capabilities to root only). It must not run
anything.

What the slot can give: a link trains to the narrower of its two ends, so the
function's own ``LnkCap`` is not what it can reach when the port above it has
fewer lanes. The ASUS Ascent GX10 wires its second CX-7 controller to a root
port of two lanes: ``0002:01:00.x`` show ``LnkCap ... Width x4`` and ``LnkSta
... Width x2 (downgraded)`` for good, "the upstream port at 0002:00:00.0 only
exposes x2 lanes" (NVIDIA developer forum thread 367853, "ASUS Ascent GX10 —
Second ConnectX-7 PCIe slot wired at Gen5 x2 instead of x4"). So the command
also finds the upstream port with ``lspci -PP -D -s BDF`` (pciutils lspci.c
``show_slot_path``: ``DDDD:BB:DD.F/BB:DD.F``, the bridges first) and prints its
``lspci -vv`` block after a line ``upstream DDDD:BB:DD.F``.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sparkctl.facts.nodefacts import PcieFacts
from sparkctl.facts.registry import Fact, ProbeParseError, ScriptContext, q

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


_UPSTREAM = re.compile(r"^upstream ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])[ \t]*$", re.MULTILINE)


def parse_lspci_link(text: str, bdf: str = "") -> PcieFacts:
    """``lspci -vv -s BDF``: LnkCap and LnkSta (spaces or tabs, with or without
    the ``(ok)``/``(downgraded)`` marks of newer pciutils); then, after a line
    ``upstream BDF``, the upstream port's ``lspci -vv`` block, whose LnkCap is
    what the slot can give (absent or unreadable: the slot is not known)."""
    m = _UPSTREAM.search(text)
    own = text[:m.start()] if m else text
    link = replace(_parse_one(own), bdf=bdf)
    if m is None:
        return link
    caps = _LNKCAP.findall(text[m.end():])
    if len(caps) != 1:  # access denied, or not a PCIe port: the slot stays unknown (judged strictly)
        return link
    try:
        slot_gts = _gts("upstream PCIe port", caps[0][0], "LnkCap")
    except ProbeParseError:
        return link
    return replace(link, slot=m.group(1).lower(), slot_gts=slot_gts, slot_width=int(caps[0][1]))


def _parse_one(text: str) -> PcieFacts:
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
    return PcieFacts("", cap_gts, cw, sta_gts, sw, marked or sta_gts < cap_gts or sw < cw)


def _vv(ctx: ScriptContext, target: str) -> str:
    """``lspci -vv -s TARGET`` (TARGET already shell-safe), as root when the node allows."""
    plain = f"lspci -vv -s {target}"
    if ctx.node.sudo:  # capabilities (LnkCap/LnkSta) are shown to root only
        return f"{{ {{ have sudo && sudo -n {plain} 2>/dev/null; }} || {plain}; }}"
    return plain


# The upstream port from the bus path: DDDD:00:00.0/01:00.0 -> DDDD:00:00.0; a deeper path
# (a switch) ends in BB:DD.F of the same domain. A function on a root bus has no "/": no slot read.
_UPSTREAM_SH = ('p=$(lspci -PP -D -s {bdf} 2>/dev/null) || exit 0; path=${{p%%[[:space:]]*}}; '
                'case "$path" in */*) ;; *) exit 0;; esac; dom=${{path%%:*}}; par=${{path%/*}}; par=${{par##*/}}; '
                'case "$par" in *:*:*) up=$par;; *) up=$dom:$par;; esac; echo "upstream $up"; {vv}; exit 0')


def _lspci(ctx: ScriptContext, bdf: str) -> str:
    return (f"have lspci || exit 127; {_vv(ctx, q(bdf))} || exit $?; "
            + _UPSTREAM_SH.format(bdf=q(bdf), vv=_vv(ctx, '"$up"')))


PCIE = Fact("pcie.{}", "PCIe link of {}", _lspci, parse_lspci_link, items=lambda c: CX7_FUNCTIONS)
