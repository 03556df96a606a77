"""Linux plumbing for the simulated cluster: ip(8), network namespaces, processes.

Owns: running ``ip`` and friends, the names and ownership marks of host-side
objects (namespace prefix, veth prefix, link alias), and finding and killing
processes. It knows nothing about a ``ClusterSpec``; ``sparkctl_sim.cluster``
decides what to build and calls these helpers.

Must not: touch any namespace or link that does not carry the sim's prefix or
alias, print, or exit.

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sparkctl.errors import ExitStatus, SparkctlError
from sparkctl_sim.nodestate import pid_alive  # the process helpers below use it; clusterboot and overcommit call nx.pid_alive

# Every namespace the sim creates starts with this; nothing else is ever deleted.
NETNS_PREFIX = "sparkctl-"
# Host-side ends of management veths (the "switch ports").
HOST_VETH_PREFIX = "spkv-"
# ifalias written on every host-side link the sim creates (bridge, veths): the
# ownership mark checked before deleting anything in the host namespace.
LINK_ALIAS = "sparkctl-sim"
IFNAMSIZ = 15  # Linux interface names are at most 15 bytes


class SimError(SparkctlError):
    """A simulated-cluster operation failed; carries what went wrong and a hint.

    Lives here, not in the product's error tree: sparkctl never imports the simulator.
    """

    exit_code = ExitStatus.SIM  # listed in sparkctl's one table of exit codes

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message, None, hint or None)

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


def run(argv: Sequence[str], *, check: bool = True, timeout_s: float = 30.0,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command without a shell; raise SimError on failure when ``check``."""
    try:
        cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                            input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise SimError(f"{argv[0]}: not found", "install iproute2, openssh-server, util-linux") from exc
    except subprocess.TimeoutExpired as exc:
        raise SimError(f"{shlex.join(argv)}: timed out after {timeout_s:.0f} s") from exc
    if check and cp.returncode != 0:
        raise SimError(f"{shlex.join(argv)} failed (exit {cp.returncode}): {cp.stderr.strip()}")
    return cp


# ---------------------------------------------------------------------------
# namespaces and links


def netns_list() -> list[str]:
    cp = run(["ip", "-j", "netns", "list"], check=False)
    if cp.returncode != 0 or not cp.stdout.strip():
        return []
    return [e["name"] for e in json.loads(cp.stdout)]


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists() or name in netns_list()


def check_owned_netns(name: str) -> None:
    if not name.startswith(NETNS_PREFIX):
        raise SimError(f"refusing to touch network namespace {name!r}",
                       f"the sim only manages namespaces named {NETNS_PREFIX}*")


def netns_add(name: str) -> None:
    check_owned_netns(name)
    if not netns_exists(name):
        run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])


def netns_delete(name: str) -> None:
    check_owned_netns(name)
    if netns_exists(name):
        run(["ip", "netns", "delete", name], check=False)


# ---------------------------------------------------------------------------
# the node's processes: one cgroup each

# A real node's ps lists its own processes only (proc(5): /proc shows the PID namespace it
# was mounted from); the simulated nodes share this machine's, where procps' ps reads the /proc
# files of every process whichever it selects (strace of Debian 12's ``ps -p 1``: status, stat,
# environ and cmdline of all 127). A cgroup per node lists its processes in one small file
# (cgroup.procs; a child starts in its parent's cgroup: the kernel's
# Documentation/admin-guide/cgroup-v2.rst, "Processes"), and ``ps -q PIDS`` reads only those
# (ps(1), -q: "reads the necessary info only for the pids listed"). Membership only: no
# controller is enabled, no limit set. Where this machine lets the sim make none, ps falls back
# to scanning the network namespaces (sparkctl_sim.shims.rendered._ps).
CGROUP_DIR = "sparkctl-sim"


def _cgroup2() -> tuple[Path, str] | None:
    """Where this machine mounts the cgroup2 hierarchy, and the cgroup that mount shows at its top."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    for line in mountinfo.splitlines():  # proc(5): ID PARENT DEV ROOT MOUNTPOINT ... - FSTYPE ...
        fields, _, fs = line.partition(" - ")
        if fs.split(" ", 1)[0] == "cgroup2":
            f = fields.split()
            return Path(f[4]), f[3]
    return None


def node_cgroup(netns: str) -> tuple[Path, str] | None:
    """The cgroup of the node in ``netns``: its directory here and its path in the hierarchy (as
    a cgroup2 mount inside the node shows it), made if missing; None when it cannot be made."""
    check_owned_netns(netns)
    found = _cgroup2()
    if found is None:
        return None
    mount, top = found
    d = mount / CGROUP_DIR / netns
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:  # not root, a read-only cgroupfs (a container)
        return None
    return d, f"{top.rstrip('/')}/{CGROUP_DIR}/{netns}"


def in_cgroup(cgroup: tuple[Path, str] | None, argv: Sequence[str]) -> list[str]:
    """``argv`` started inside ``cgroup`` (:func:`node_cgroup`), and so every process it starts:
    sh writes its own pid to cgroup.procs, then becomes ``argv``; as it was where that fails."""
    if cgroup is None:
        return list(argv)
    return ["sh", "-c", '{ echo $$ >"$0"; } 2>/dev/null || :; exec "$@"', str(cgroup[0] / "cgroup.procs"), *argv]


def cgroup_remove(netns: str) -> None:
    """Remove the node's cgroup once its processes are gone (rmdir refuses one that has any)."""
    check_owned_netns(netns)
    found = _cgroup2()
    if found is not None:
        for d in (found[0] / CGROUP_DIR / netns, found[0] / CGROUP_DIR):
            try:
                d.rmdir()
            except OSError:
                return


def links(netns: str | None = None, *, details: bool = False) -> list[dict[str, Any]]:
    """``ip -j addr show`` (or ``-d link`` with details) in a namespace or the host."""
    argv = ["ip", "-j"]
    if details:
        argv.append("-d")
    if netns:
        argv += ["-n", netns]
    argv += ["link", "show"] if details else ["addr", "show"]
    cp = run(argv, check=False)
    if cp.returncode != 0 or not cp.stdout.strip():
        return []
    return json.loads(cp.stdout)


def link_info(ifname: str, netns: str | None = None) -> dict[str, Any] | None:
    for entry in links(netns):
        if entry.get("ifname") == ifname:
            return entry
    return None


def ip(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return run(argv, check=check)


def owned_host_links() -> list[dict[str, Any]]:
    """Host-namespace links that carry the sim's alias (bridge and veth ends)."""
    return [e for e in links(None, details=True) if e.get("ifalias") == LINK_ALIAS]


def host_link_delete(ifname: str) -> None:
    """Delete a host link only if it carries the sim's alias."""
    for entry in links(None, details=True):
        if entry.get("ifname") == ifname:
            if entry.get("ifalias") != LINK_ALIAS:
                raise SimError(f"refusing to delete host link {ifname!r}: not created by the sim",
                               f"sim links carry ifalias {LINK_ALIAS!r}")
            run(["ip", "link", "delete", ifname], check=False)
            return


def ns_exec_write(netns: str, path: str, value: str) -> None:
    """Write a /proc/sys value as seen from inside ``netns``."""
    run(["ip", "netns", "exec", netns, "sh", "-c", f"echo {shlex.quote(value)} > {shlex.quote(path)}"])


# ---------------------------------------------------------------------------
# processes


def pid_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pid_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def ns_pids(netns: str) -> list[int]:
    check_owned_netns(netns)
    cp = run(["ip", "netns", "pids", netns], check=False)
    return [int(tok) for tok in cp.stdout.split() if tok.isdigit()]


def _own_lineage() -> set[int]:
    """This process and its ancestors: never kill the caller."""
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def pids_under(root: Path, *, node: str | None = None) -> list[int]:
    """Processes whose command line or sim environment points inside ``root``.

    Session processes (engines, shims) carry ``SPARKCTL_SIM_RUN_DIR`` and
    ``SPARKCTL_SIM_NODE`` from sshd's SetEnv; daemons carry the root in their
    command line (``sshd -f ROOT/nodes/N/sshd_config``).
    """
    root_s = str(root).rstrip("/") + "/"
    skip = _own_lineage()
    found = []
    for pid in all_pids():
        if pid in skip:
            continue
        env = pid_environ(pid)
        run_dir = env.get("SPARKCTL_SIM_RUN_DIR", "")
        by_env = run_dir.startswith(root_s) and (node is None or env.get("SPARKCTL_SIM_NODE") == node)
        cmd = pid_cmdline(pid)
        if node is None:
            by_cmd = root_s in cmd
        else:
            by_cmd = f"{root_s}nodes/{node}/" in cmd
        if by_env or by_cmd:
            found.append(pid)
    return found


def kill_pids(pids: Iterable[int], *, grace_s: float = 0.0) -> list[int]:
    """SIGTERM (when ``grace_s`` > 0) then SIGKILL; wait until they are gone."""
    skip = _own_lineage()
    targets = sorted({p for p in pids if p not in skip and p > 1 and pid_alive(p)})
    if not targets:
        return []
    first = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    for pid in targets:
        with _suppress_gone():
            os.kill(pid, first)
    deadline = time.monotonic() + grace_s
    while grace_s > 0 and time.monotonic() < deadline and any(pid_alive(p) for p in targets):
        time.sleep(0.05)
    for pid in targets:
        if pid_alive(pid):
            with _suppress_gone():
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(pid_alive(p) for p in targets):
        time.sleep(0.02)
    return targets


class _suppress_gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, (ProcessLookupError, PermissionError))


def read_pidfile(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def spawn_detached(argv: Sequence[str], log_path: Path) -> None:
    """Start ``argv`` in a new session, reparented away from the caller.

    ``setsid -f`` forks and its parent exits at once, so the daemon is never our
    child: it cannot become a zombie of a long-lived caller (pytest, the CLI).
    """
    with open(log_path, "ab") as log_fh:
        cp = subprocess.run(["setsid", "-f", *argv], stdin=subprocess.DEVNULL, stdout=log_fh,
                            stderr=subprocess.STDOUT, timeout=10)
    if cp.returncode != 0:
        raise SimError(f"could not start {argv[0]} (setsid exit {cp.returncode})", f"see {log_path}")
