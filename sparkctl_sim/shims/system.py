"""OS identity shims: ``uname``, ``getconf`` and ``apt-mark`` of a simulated DGX OS node
(the rendered ``/proc/meminfo`` and ``boot_id`` views are :mod:`sparkctl_sim.nodestate`'s)."""

from __future__ import annotations

from collections.abc import Sequence

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
