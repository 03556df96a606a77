"""The shims' edges: reading the namespace's real netdevs and /proc, the
wrappers written into a node's bin/, the dispatch by tool name and
:func:`main`, the only function that reads the state file or the clock, writes
state, prints or exits (``python3 -m sparkctl_sim.shims TOOL ARGS...``)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from sparkctl_sim import nodestate
from sparkctl_sim.shims.common import (
    BDF_OF_NETDEV,
    STATE_ENV,
    TOOLS,
    VIEW_TOOLS,
    Netdev,
)
from sparkctl_sim.shims.run import MUTATORS, run_tool

# Lean on purpose: every call of a shim that has no rendered view starts `python3 -S` here, so
# the tools' formatters, subprocess, shlex and pathlib are imported where they are used.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

# --------------------------------------------------------------------------
# Edges: the real kernel, /proc, the state file
# --------------------------------------------------------------------------


def read_netdevs(
    names: Sequence[str] = tuple(BDF_OF_NETDEV), sys_class_net: str = "/sys/class/net"
) -> dict[str, Netdev]:
    """Operstate/MTU from sysfs and IPv4 from ``ip -j addr show`` in the CURRENT
    network namespace. Missing netdevs are left out.

    sysfs shows the namespace's devices only when it was mounted inside that
    namespace (``ip netns exec`` does so; a bare ``unshare -n`` does not), so a
    netdev absent from sysfs but known to netlink takes netlink's operstate/MTU.
    """
    import subprocess

    links: dict[str, dict[str, Any]] = {}
    try:
        raw = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
        links = {link.get("ifname", ""): link for link in json.loads(raw or "[]")}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    out = {}
    for n in names:
        link = links.get(n, {})
        ipv4 = tuple(
            (a["local"], int(a.get("prefixlen", 32))) for a in link.get("addr_info", []) if a.get("family") == "inet"
        )
        base = os.path.join(sys_class_net, n)
        try:
            with open(os.path.join(base, "operstate")) as fh:
                oper = fh.read().strip()
            with open(os.path.join(base, "mtu")) as fh:
                mtu = int(fh.read().strip())
        except (OSError, ValueError):
            if not link or "operstate" not in link:
                continue
            oper, mtu = str(link["operstate"]).lower(), int(link.get("mtu", 1500))
        out[n] = Netdev(name=n, operstate=oper, mtu=mtu, ipv4=ipv4)
    return out


def read_process_names(pids: Sequence[int], proc: str = "/proc") -> dict[int, str]:
    """Live pid -> name as nvidia-smi shows it (argv[0] after setproctitle, else comm)."""
    out = {}
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as fb:
                argv0 = fb.read().split(b"\0")[0].decode(errors="replace")
            if not argv0:
                with open(f"{proc}/{pid}/comm") as fh:
                    argv0 = fh.read().strip()
            name = argv0.split(" ")[0]
        except OSError:
            continue
        out[pid] = name
    return out


def install_shims(
    bin_dir: str | os.PathLike[str],
    python: str = sys.executable,
    *,
    state_path: str | os.PathLike[str] | None = None,
    package_root: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write one ``#!/bin/sh`` wrapper per tool into ``bin_dir``: the tool's rendered view
    when it has one (:mod:`.rendered`), else ``python3 -S`` (no ``site``: the shims use
    the standard library only) on this package.

    ``state_path`` bakes in a default ``SPARKCTL_SIM_STATE`` (sshd drops the
    caller's environment); ``package_root`` (default: the directory holding
    this ``sparkctl`` package) is put on PYTHONPATH so the wrappers work
    without an installed sparkctl.
    """
    import pathlib
    import shlex

    Path = pathlib.Path  # noqa: N806 - the name the annotations use
    d = Path(bin_dir)
    d.mkdir(parents=True, exist_ok=True)
    root = Path(package_root) if package_root else Path(__file__).resolve().parents[2]
    pre = f"PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
    if state_path is not None:
        sp = shlex.quote(str(Path(state_path).resolve()))
        pre += f"{STATE_ENV}=${{{STATE_ENV}:-{sp}}}\nexport {STATE_ENV}\n"
    from sparkctl_sim.shims.rendered import ensure_views, wrapper

    written = []
    for tool in TOOLS:
        p = d / tool
        p.write_text(wrapper(tool, str(Path(python).absolute()), pre))
        p.chmod(0o755)
        written.append(p)
    if state_path is not None:
        ensure_views(state_path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m sparkctl_sim.shims TOOL ARGS...``: the only impure entry."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TOOLS:
        sys.stderr.write(f"usage: python3 -m sparkctl_sim.shims {{{','.join(TOOLS)}}} ARGS...\n")
        return 2
    tool, args = argv[0], argv[1:]
    path = os.environ.get(STATE_ENV)
    if path and (tool in VIEW_TOOLS or tool == "nvidia-smi"):
        # render on read: the state has no views (a write dropped them), or nvidia-smi's ran out
        try:
            renew = tool == "nvidia-smi" and bool(args) and (args[0].startswith("--query-gpu=") or args[0] == "-q")
            if renew or not nodestate.views_ready(path):
                from sparkctl_sim.shims import rendered

                rendered.ensure_views(path, renew=renew and tuple(args) in rendered.SMI_LINES)
        except (OSError, ValueError):  # no state file: the tool's own answer says so below
            pass
    if tool in ("apt-get", "dpkg-query"):  # the node's package database (sparkctl_sim.debpkg)
        from sparkctl_sim import debpkg

        return debpkg.main(tool, args)
    if tool == "earlyoom":  # Debian's earlyoom, acting on this node only (sparkctl_sim.earlyoomsim)
        from sparkctl_sim import earlyoomsim

        return earlyoomsim.main(args)
    if not path:
        sys.stderr.write(f"{tool}: {STATE_ENV} is not set (simulated node state file)\n")
        return 127
    needs_net = tool in ("ibdev2netdev", "show_gids", "ethtool", "ib_write_bw")
    netdevs = read_netdevs() if needs_net else {}
    euid = os.geteuid()
    now = time.time()
    if tool in MUTATORS and MUTATORS[tool](args):
        from sparkctl_sim.shims.rendered import renderer

        with nodestate.edit(path, views=renderer(path)) as state:
            res = run_tool(tool, state, args, now=now, euid=euid, netdevs=netdevs)
            if res.new_state is not None:
                state.clear()
                state.update(res.new_state)
    else:
        state = nodestate.load(path)
        procs = None
        if tool == "nvidia-smi":
            from sparkctl_sim.shims.gb10 import gpu_processes

            pids = [int(p) for p in state.get("engine_mem_gib", {})]
            procs = gpu_processes(state, read_process_names(pids))
        res = run_tool(tool, state, args, now=now, euid=euid, netdevs=netdevs, processes=procs)
    if res.exec_argv is not None:
        exe = res.exec_argv[0]
        if os.path.isabs(exe) and os.access(exe, os.X_OK):
            sys.stdout.flush()
            os.execv(exe, list(res.exec_argv))
        sys.stderr.write(f"{tool}: option not simulated: {' '.join(args)}\n")
        return 64
    try:
        sys.stdout.write(res.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # `nvidia-smi | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.stderr.write(res.stderr)
    return res.exit_code


