"""OS identity shims: ``uname``, ``getconf``, ``apt-mark`` and the rendered
``/proc/meminfo`` and ``boot_id`` views of a simulated DGX OS node."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl_sim import nodestate
from sparkctl_sim.shims.common import State, ToolResult, _copy_state, _result

# --------------------------------------------------------------------------
# OS identity: uname, getconf, apt-mark, meminfo, boot_id
# --------------------------------------------------------------------------


def _kernel_version_string(release: str) -> str:
    # Ubuntu: 6.17.0-1021-nvidia -> "#21-Ubuntu SMP PREEMPT_DYNAMIC ..." (§5.1)
    try:
        abi = int(release.split("-")[1])
    except (IndexError, ValueError):
        abi = 1
    return f"#{abi % 1000}-Ubuntu SMP PREEMPT_DYNAMIC Wed May 27 19:14:05 UTC 2026"


def uname(state: State, args: Sequence[str]) -> ToolResult:
    """``uname [-asnrvmpio]``: order of fields as coreutils prints them."""
    order = "snrvmpio"
    flags: set[str] = set()
    long = {"--all": "a", "--kernel-name": "s", "--nodename": "n", "--kernel-release": "r",
            "--kernel-version": "v", "--machine": "m", "--processor": "p",
            "--hardware-platform": "i", "--operating-system": "o"}
    for a in args:
        if a in long:
            flags.add(long[a])
        elif a.startswith("-") and not a.startswith("--") and len(a) > 1:
            for c in a[1:]:
                if c not in order + "a":
                    return _result("", f"uname: invalid option -- '{c}'\nTry 'uname --help' for more information.\n", 1)
                flags.add(c)
        else:
            return _result("", f"uname: extra operand '{a}'\nTry 'uname --help' for more information.\n", 1)
    release = state["kernel_release"]
    vals = {"s": "Linux", "n": state["hostname"], "r": release, "v": _kernel_version_string(release),
            "m": "aarch64", "p": "aarch64", "i": "aarch64", "o": "GNU/Linux"}
    if "a" in flags:
        flags = set(order)
    if not flags:
        flags = {"s"}
    return _result(" ".join(vals[c] for c in order if c in flags) + "\n")


def getconf(state: State, args: Sequence[str]) -> ToolResult:
    if list(args) in (["PAGESIZE"], ["PAGE_SIZE"]):
        return _result(f"{int(state['page_size'])}\n")
    return ToolResult("", exec_argv=("/usr/bin/getconf", *args))


def apt_mark(state: State, args: Sequence[str], *, euid: int) -> ToolResult:
    """``apt-mark showhold | hold PKG... | unhold PKG...`` (§5.3)."""
    if not args:
        return _result("", "E: No operation specified\n", 100)
    op, pkgs = args[0], [a for a in args[1:] if not a.startswith("-")]
    held = list(state.get("held_packages", []))
    if op == "showhold":
        sel = sorted(p for p in held if not pkgs or p in pkgs)
        return _result("".join(p + "\n" for p in sel))
    if op not in ("hold", "unhold"):
        return _result("", f"E: Invalid operation {op}\n", 100)
    if not pkgs:
        return _result("", "E: No packages found\n", 100)
    if euid != 0:
        return _result(
            "",
            "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
            "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?\n",
            100,
        )
    out = []
    for p in pkgs:
        if op == "hold":
            if p in held:
                out.append(f"{p} was already set on hold.")
            else:
                held.append(p)
                out.append(f"{p} set on hold.")
        else:
            if p in held:
                held.remove(p)
                out.append(f"Canceled hold on {p}.")
            else:
                out.append(f"{p} was already not on hold.")
    new = _copy_state(state)
    new["held_packages"] = sorted(held)
    return _result("".join(line + "\n" for line in out), new_state=new)


def render_meminfo(state: State) -> str:
    """A full arm64 6.17 ``/proc/meminfo`` whose MemAvailable follows the state."""
    total = int(state["mem_total_kib"])
    avail = nodestate.mem_available_kib(state)
    engines_kib = int((sum(state["engine_mem_gib"].values()) + state["leaked_mem_gib"]) * 1024 * 1024)
    buffers, sreclaim, sunreclaim = 13252, 477572, 520360
    cached = min(3_407_872, max(0, avail - 1_000_000))
    free = max(0, avail - cached - buffers - sreclaim // 2)  # nodestate.mem_free_base_kib
    # The page cache of file reads (nodestate.fill_page_cache): out of MemFree, into Cached;
    # MemAvailable counts it as reclaimable (mm/page_alloc.c si_mem_available).
    in_cache = free - nodestate.mem_free_kib(state)
    free, cached = free - in_cache, cached + in_cache
    anon = max(0, min(total - free - cached - buffers - sreclaim - sunreclaim, 1_712_244 + engines_kib))
    shmem = 3028
    huge_kb = 2048 if int(state.get("page_size", 4096)) == 4096 else 524288
    rows: list[tuple[str, int]] = [
        ("MemTotal", total), ("MemFree", free), ("MemAvailable", avail), ("Buffers", buffers),
        ("Cached", cached), ("SwapCached", 0),
        ("Active", anon // 2 + cached // 2), ("Inactive", anon - anon // 2 + cached - cached // 2),
        ("Active(anon)", anon // 2), ("Inactive(anon)", anon - anon // 2),
        ("Active(file)", cached // 2), ("Inactive(file)", cached - cached // 2),
        ("Unevictable", 24640), ("Mlocked", 24640),
        ("SwapTotal", 16777212), ("SwapFree", 16777212), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 312), ("Writeback", 0), ("AnonPages", anon), ("Mapped", 612_480), ("Shmem", shmem),
        ("KReclaimable", sreclaim), ("Slab", sreclaim + sunreclaim), ("SReclaimable", sreclaim),
        ("SUnreclaim", sunreclaim), ("KernelStack", 23_168), ("PageTables", 31_412), ("SecPageTables", 0),
        ("NFS_Unstable", 0), ("Bounce", 0), ("WritebackTmp", 0),
        ("CommitLimit", total // 2 + 16777212), ("Committed_AS", 6_903_148 + engines_kib),
        ("VmallocTotal", 133_141_626_880), ("VmallocUsed", 101_620), ("VmallocChunk", 0),
        ("Percpu", 27_520),
    ]
    out = [f"{k + ':':<16}{v:>8} kB" for k, v in rows]
    out.append(f"HardwareCorrupted: {0:>5} kB")
    out += [f"{k + ':':<16}{v:>8} kB" for k, v in (
        ("AnonHugePages", 0), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0),
        ("FileHugePages", 0), ("FilePmdMapped", 0), ("CmaTotal", 131_072), ("CmaFree", 69_320),
    )]
    out += [
        f"HugePages_Total:   {0:>5}",
        f"HugePages_Free:    {0:>5}",
        f"HugePages_Rsvd:    {0:>5}",
        f"HugePages_Surp:    {0:>5}",
        f"Hugepagesize:   {huge_kb:>8} kB",
        f"Hugetlb:        {0:>8} kB",
    ]
    return "\n".join(out) + "\n"


def render_boot_id(state: State) -> str:
    return f"{state['boot_id']}\n"


