"""The pure dispatch of a tool call by the tool's name (no I/O): what the Python shim
(:mod:`.dispatch`) and the rendered views (:mod:`.rendered`) both compute an answer with.
Each tool's formatter is imported where it is used (the shims start lean)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl_sim.shims.common import GpuProcess, Netdevs, State, ToolResult, _result

MUTATORS = {
    "nvidia-smi": lambda a: any(x in ("-rgc", "--reset-gpu-clocks") or x.startswith(("-lgc", "--lock-gpu-clocks")) for x in a),
    "apt-mark": lambda a: bool(a) and a[0] in ("hold", "unhold"),
}


def run_tool(tool: str, state: State, args: Sequence[str], *, now: float, euid: int,
             netdevs: Netdevs | None = None, processes: Sequence[GpuProcess] | None = None) -> ToolResult:
    """Pure dispatch by tool name (netdevs default to none present)."""
    nds = netdevs or {}
    if tool == "nvidia-smi":
        from sparkctl_sim.shims.nvidia_smi import nvidia_smi

        return nvidia_smi(state, args, now=now, euid=euid, processes=processes)
    if tool in ("ibdev2netdev", "show_gids"):
        from sparkctl_sim.shims import ibdev

        return (ibdev.ibdev2netdev if tool == "ibdev2netdev" else ibdev.show_gids)(state, args, nds)
    if tool == "ethtool":
        from sparkctl_sim.shims.ethtool import ethtool

        return ethtool(state, args, nds, euid=euid)
    if tool == "lspci":
        from sparkctl_sim.shims.lspci import lspci

        return lspci(state, args, euid=euid)
    if tool in ("uname", "getconf", "apt-mark"):
        from sparkctl_sim.shims import system

        if tool == "apt-mark":
            return system.apt_mark(state, args, euid=euid)
        return (system.uname if tool == "uname" else system.getconf)(state, args)
    if tool == "ib_write_bw":
        from sparkctl_sim.shims.perftest import ib_write_bw

        return ib_write_bw(state, args, nds)
    return _result("", f"sparkctl shims: unknown tool {tool!r}\n", 127)
