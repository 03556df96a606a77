"""Read-only facts about a node: one batched shell script, and pure parsers.

What this module owns:

* :func:`build_script` -- ONE POSIX ``sh`` script that prints every fact of a
  node between markers, so a single round trip gathers them all::

      @@sparkctl:manifest:hostname kernel ...@@      (the sections to expect)
      @@sparkctl:section:NAME@@
      <the command's stdout, byte for byte>
      <one newline added by the script>
      @@sparkctl:rc:NAME:<exit code>@@
      ...
      @@sparkctl:done@@

  Every value interpolated into it is ``shlex``-quoted; it contains no
  backslash (so a login shell such as fish that rewrites backslashes inside
  single quotes cannot corrupt it) and assumes no login shell, no ``.bashrc``
  and no ``/usr/sbin`` on ``PATH``. A missing command exits 127 in its own
  subshell: the fact becomes "not available", the batch goes on.
* the pure parsers ``parse_X(text) -> value``: each raises
  :class:`ProbeParseError` on output it cannot read, never anything else
  (``tests/test_probes.py`` feeds them real captured output, and fuzzes them);
* :func:`parse_batch`, which never raises: a section it cannot read becomes an
  entry of ``NodeFacts.unreadable`` ("cannot read X on node Y: ...");
* :func:`gather`, which runs the script through any runner
  ``run(command) -> (exit_code, stdout, stderr)`` and parses the result.

What it must not do: import a transport (SSH lives in ``sparkctl.transport.ssh``),
change anything on a node, or read a clock.

Clock lock (``GpuFacts.clock_lock_max_mhz``): real ``nvidia-smi`` (580
drivers) prints NO field holding the limits set with ``-lgc``; neither
``-q -d CLOCK`` nor any ``--query-gpu`` field reports them, and
``clocks.max.sm`` stays the hardware maximum (3003 MHz on GB10) under a lock.
What the real driver does show is the event reason *Applications Clocks
Setting* (NVML ``0x2``, alias ``UserDefinedClocks``) while a lock holds the
clock down under load. So: ``clock_lock_max_mhz`` is read from an explicit
lock section or key when one is printed (a "...Lock..." section such as
``Locked Clocks`` with a ``Max``/``Graphics``/``SM`` entry, or a key such as
``Locked Graphics Clock Max`` / ``gpuClkMax``; ``N/A``/``None`` = no lock), and
is ``None`` otherwise; ``GpuFacts.user_clock_limit_active`` says whether the
driver reports the user-defined-clocks reason. Whoever applies a lock should
also record what it applied.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkctl.model.inventory import Node

T = TypeVar("T")

# The four ConnectX-7 PCIe functions of a DGX Spark (spark-facts.md §3.4).
CX7_FUNCTIONS = ("0000:01:00.0", "0000:01:00.1", "0002:01:00.0", "0002:01:00.1")
# GID slots read per RoCE device: the RoCEv2 IPv4 GID is usually index 3 and has
# been seen at 4 and 5 (spark-facts.md §2.2); 16 slots leave room for more drift.
GID_SLOTS = 16
GPU_QUERY_FIELDS = (
    "name", "compute_cap", "driver_version", "clocks.sm", "clocks.max.sm",
    "clocks_event_reasons.active", "power.draw", "temperature.gpu",
)
# Engine command lines as the rendered launch scripts start them (docs/engines.md),
# one ERE for grep on the node and for Python here. The [x]yz classes keep grep
# from matching its own command line.
ENGINE_REGEX = ("(^|/| |-m )([d]s41f|[t]ensorfold|[v]llm|[l]lama-server)([ .:]|$)|[s]glang[.]launch_server"
                "|[l]lama_cpp[.]server|[d]ocker run .*sparkctl-engine|/opt/sparkctl/[l]aunch[.]sh")
ENGINE_PATTERN = re.compile(ENGINE_REGEX, re.IGNORECASE)
MARKER_PREFIX = "@@sparkctl:"
# How long the node may take to answer /v1/models; the brief: curl -m 3.
MODELS_TIMEOUT_S = 3

# NVML clocks event reason bits (nvmlClocksEventReasons; UserDefinedClocks is an
# alias of ApplicationsClocksSetting) and the labels nvidia-smi -q prints.
REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
REASON_LABELS: dict[str, str] = {
    "idle": "gpu_idle",
    "gpu idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "display clock setting": "display_clock_setting",
}


class ProbeParseError(Exception):
    """A probe's output could not be read. ``what`` names the fact."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"cannot read {what}: {detail}")
        self.what = what
        self.detail = detail


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class GpuFacts:
    name: str
    compute_cap: str | None  # "12.1"
    driver: str | None
    sm_mhz: int | None
    max_sm_mhz: int | None
    clock_lock_max_mhz: int | None  # see the module docstring
    event_reasons: tuple[str, ...]  # active reasons, REASON_BITS names
    power_w: float | None
    temp_c: int | None

    @property
    def user_clock_limit_active(self) -> bool:
        """The driver reports the clock held by a user setting (``-lgc``/``-ac``)."""
        return "applications_clocks_setting" in self.event_reasons


@dataclass(frozen=True)
class LinkFacts:
    netdev: str
    rdma: str | None
    operstate: str | None  # up | down | ... (sysfs operstate)
    mtu: int | None
    ipv4: str | None  # "10.20.0.1/24", None when the netdev has no address
    speed_mbps: int | None  # None: ethtool says Unknown! (link down)
    link_detected: bool | None
    gid_index_rocev2_ipv4: int | None


@dataclass(frozen=True)
class PcieFacts:
    bdf: str
    cap_gts: float
    cap_width: int
    sta_gts: float
    sta_width: int
    downgraded: bool


@dataclass(frozen=True)
class EngineProc:
    pid: int
    args: str


@dataclass(frozen=True)
class WeightsPaths:
    """Where on a node the weights agent, its hash cache and the weights are (see
    :func:`sparkctl.ops.weights.probe_paths`, which owns them)."""

    agent: str
    hash_cache: str
    root: str


@dataclass(frozen=True)
class WeightsSummary:
    """What sparkctl's hash cache vouches for at the weights path (``weights_agent.py summary``).

    ``kind``: ``dir`` or ``file``; ``missing`` (nothing at the path); ``no-agent``
    (sparkctl never fetched or synced here, so nothing is vouched for).
    ``digest`` is equal on two nodes exactly when they hold the same files; it
    is None while any file is unverified (changed since this node hashed it).
    """

    kind: str
    files: int = 0
    bytes: int = 0
    digest: str | None = None
    n_unverified: int = 0
    unverified: tuple[str, ...] = ()
    partial: int = 0


@dataclass(frozen=True)
class NodeFacts:
    """Everything one probe batch read on a node. A fact that could not be read
    is None (or absent from its dict) and explained in ``unreadable`` (output
    present but unreadable, or cut off) or ``not_available`` (the command does
    not exist on the node), both keyed by section name (``kernel``, ``gpu``,
    ``net.enp1s0f0np0.ethtool`` ...)."""

    node: str
    hostname: str | None = None
    kernel: str | None = None
    page_size_bytes: int | None = None
    held_packages: list[str] | None = None
    boot_id: str | None = None
    uptime_s: float | None = None
    mem_total_kib: int | None = None
    mem_available_kib: int | None = None
    disk_free_gib: float | None = None
    gpu: GpuFacts | None = None
    links: dict[str, LinkFacts] = field(default_factory=dict)
    pcie: dict[str, PcieFacts] = field(default_factory=dict)
    engines: list[EngineProc] | None = None
    listening_ports: set[int] | None = None
    served_models: list[str] | None = None
    clock_lock_record: tuple[str, int] | None = None  # (boot_id, cap MHz) written when sparkctl locked the clock
    weights: WeightsSummary | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    not_available: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.unreadable and not self.not_available


# --------------------------------------------------------------------------- the script

# Human names of the sections, for messages.
SECTION_TITLES: dict[str, str] = {
    "hostname": "hostname",
    "kernel": "kernel release",
    "page_size": "page size",
    "held_packages": "held packages",
    "boot_id": "boot id",
    "uptime": "uptime",
    "meminfo": "memory (meminfo)",
    "disk": "free disk space",
    "weights": "the weights (sparkctl's hash cache)",
    "gpu": "GPU state (nvidia-smi --query-gpu)",
    "gpu_clocks": "GPU clocks (nvidia-smi -q)",
    "ibdev2netdev": "RDMA device map (ibdev2netdev)",
    "gids": "RoCE GID tables",
    "engines": "engine processes",
    "ports": "listening TCP ports",
    "models": "served models (/v1/models)",
}
_NET_TITLES = {"operstate": "link state", "mtu": "MTU", "ipv4": "IPv4 address", "ethtool": "link speed (ethtool)"}
_SECTION_NAME = re.compile(r"[A-Za-z0-9_.:-]+")

_PRELUDE = """\
PATH="${PATH:-/usr/bin:/bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
LC_ALL=C
export LC_ALL
sec() { echo "@@sparkctl:section:$1@@"; }
end() { echo; echo "@@sparkctl:rc:$1:$2@@"; }
have() { command -v "$1" >/dev/null 2>&1; }
"""


def _q(value: object) -> str:
    return shlex.quote(str(value))


def section_title(name: str) -> str:
    if name in SECTION_TITLES:
        return SECTION_TITLES[name]
    parts = name.split(".")
    if parts[0] == "net" and len(parts) == 3:
        return f"{_NET_TITLES.get(parts[2], parts[2])} of {parts[1]}"
    if parts[0] == "pcie":
        return f"PCIe link of {name[5:]}"
    return name


def _netdevs(node: Node) -> list[str]:
    seen: list[str] = []
    for port in node.ports.values():
        for nd in port.netdevs:
            if nd not in seen:
                seen.append(nd)
    return seen


def build_script(node: Node, weights_path: str | None = None, endpoint_port: int | None = None,
                 weights: WeightsPaths | None = None) -> str:
    """The batched probe script for ``node`` (POSIX sh; see the module docstring).

    ``weights``: also ask the weights agent what its hash cache vouches for."""
    sysfs, proc = node.sysfs_root.rstrip("/") or "/", node.proc_root.rstrip("/") or "/"
    steps: list[tuple[str, str]] = []

    def add(name: str, body: str) -> None:
        if not _SECTION_NAME.fullmatch(name):  # names reach the shell unquoted
            raise ValueError(f"unsafe probe section name {name!r}")
        steps.append((name, body))

    def tool(cmd: str, *args: str) -> str:
        return f"have {_q(cmd)} || exit 127; {_q(cmd)} {' '.join(args)}".rstrip()

    def cat(path: str) -> str:
        return f"cat {_q(path)}"

    add("hostname", "if have hostname; then hostname; else uname -n; fi")
    add("kernel", tool("uname", "-r"))
    add("page_size", tool("getconf", "PAGESIZE"))
    add("held_packages", tool("apt-mark", "showhold"))
    add("boot_id", cat(f"{proc}/sys/kernel/random/boot_id"))
    add("uptime", cat(f"{proc}/uptime"))
    add("meminfo", cat(f"{proc}/meminfo"))
    # df needs an existing path: climb from the weights dir to its nearest existing parent.
    add("disk", (
        f"d={_q(weights_path or '/')}; "
        'while [ ! -e "$d" ]; do case "$d" in */*) d=${d%/*}; [ -n "$d" ] || d=/ ;; *) d=. ;; esac; done; '
        + tool("df", "-Pk", '"$d"')
    ))
    if weights is not None:
        # what the agent's hash cache vouches for (stat only, nothing hashed); exit 3:
        # sparkctl never fetched or synced on this node
        add("weights", (
            f"[ -e {_q(weights.agent)} ] || exit 3; have python3 || exit 127; "
            f"python3 -S {_q(weights.agent)} summary --dir {_q(weights.root)} --hash-cache {_q(weights.hash_cache)}"
        ))
    add("gpu", tool("nvidia-smi", f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv,noheader,nounits"))
    # The Clocks Event Reasons block belongs to the PERFORMANCE display group.
    add("gpu_clocks", tool("nvidia-smi", "-q", "-d", "CLOCK,PERFORMANCE"))
    # What sparkctl applied with nvidia-smi -lgc, and in which boot: the 580 driver
    # does not report an applied lock, and the lock does not survive a reboot.
    lock_file = (node.prefix.rstrip("/") or "") + CLOCK_LOCK_FILE
    add("clock_lock", f"[ -e {_q(lock_file)} ] || exit 3; cat {_q(lock_file)}")
    add("ibdev2netdev", tool("ibdev2netdev"))
    for nd in _netdevs(node):
        base = f"{sysfs}/class/net/{nd}"
        add(f"net.{nd}.operstate", cat(f"{base}/operstate"))
        add(f"net.{nd}.mtu", cat(f"{base}/mtu"))
        add(f"net.{nd}.ipv4", tool("ip", "-4", "-o", "addr", "show", "dev", _q(nd)))
        add(f"net.{nd}.ethtool", tool("ethtool", _q(nd)))
    ib = f"{sysfs}/class/infiniband"
    slots = " ".join(str(n) for n in range(GID_SLOTS))
    add("gids", (
        f"[ -d {_q(ib)} ] || exit 2; "
        f"for d in {_q(ib)}/*; do "
        '[ -d "$d/ports/1" ] || continue; p="$d/ports/1"; '
        f"for n in {slots}; do "
        'g=$(cat "$p/gids/$n" 2>/dev/null) || continue; '
        't=$(cat "$p/gid_attrs/types/$n" 2>/dev/null); '
        'v=$(cat "$p/gid_attrs/ndevs/$n" 2>/dev/null); '
        "printf '%s|%s|%s|%s|%s' \"${d##*/}\" \"$n\" \"$g\" \"$v\" \"$t\"; echo; "
        "done; done"
    ))
    for bdf in CX7_FUNCTIONS:
        plain = f"lspci -vv -s {_q(bdf)}"
        body = tool("lspci", "-vv", "-s", _q(bdf))
        if node.sudo:  # capabilities (LnkCap/LnkSta) are shown to root only
            body = f"have lspci || exit 127; {{ have sudo && sudo -n {plain} 2>/dev/null; }} || {plain}"
        add(f"pcie.{bdf}", body)
    # The [x]yz classes keep grep from matching its own command line; the header
    # line proves ps ran. parse_engines filters again (it is the contract).
    add("engines", tool("ps", "-eo", "pid,args") + " | grep -iE -e '^ *PID ' -e "
        + _q(ENGINE_REGEX))
    add("ports", (
        "if have ss; then ss -ltnpH 2>/dev/null || ss -ltnp; "
        f"else cat {_q(proc + '/net/tcp')} && {{ cat {_q(proc + '/net/tcp6')} 2>/dev/null; true; }}; fi"
    ))
    if endpoint_port is not None:
        url = f"http://127.0.0.1:{int(endpoint_port)}/v1/models"
        py = ("import sys,urllib.request as u;"
              f"sys.stdout.write(u.urlopen(sys.argv[1],timeout={MODELS_TIMEOUT_S}).read().decode())")
        add("models", (
            f"if have curl; then curl -s -m {MODELS_TIMEOUT_S} {_q(url)}; "
            f"elif have python3; then python3 -c {_q(py)} {_q(url)}; else exit 127; fi"
        ))

    names = " ".join(n for n, _ in steps)
    lines = [_PRELUDE, f"echo {_q(f'{MARKER_PREFIX}manifest:{names}@@')}"]
    for name, body in steps:
        lines.append(f"sec {name}; ( {body} ); end {name} $?")
    lines.append(f"echo {_q(MARKER_PREFIX + 'done@@')}")
    return "\n".join(lines) + "\n"


CLOCK_LOCK_FILE = "/var/lib/sparkctl/clock-lock"


def parse_clock_lock(text: str) -> tuple[str, int]:
    """``<boot_id> <cap MHz>``, as written by the clock-cap remedy and unit."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit() or len(parts[0]) != 36:
        raise ProbeParseError("clock lock record", f"expected '<boot_id> <MHz>', got {text.strip()[:60]!r}")
    return parts[0], int(parts[1])


def remote_command(script: str) -> str:
    """The command line to hand to a transport: ``sh -c '<script>'`` (no login shell)."""
    return f"sh -c {_q(script)}"


# --------------------------------------------------------------------------- helpers


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def _one_line(what: str, text: str) -> str:
    lines = _lines(text)
    if not lines:
        raise ProbeParseError(what, "no output")
    if len(lines) > 1:
        raise ProbeParseError(what, f"expected one line, got {len(lines)}")
    return lines[0].strip()


def _int(what: str, s: str, lo: int | None = None, hi: int | None = None) -> int:
    if not re.fullmatch(r"[0-9]+", s):
        raise ProbeParseError(what, f"not a number: {s[:40]!r}")
    v = int(s)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ProbeParseError(what, f"{v} is out of range")
    return v


# --------------------------------------------------------------------------- OS parsers

_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")


def parse_hostname(text: str) -> str:
    line = _one_line("hostname", text)
    if not _HOSTNAME.fullmatch(line):
        raise ProbeParseError("hostname", f"not a host name: {line[:40]!r}")
    return line


_KERNEL = re.compile(r"[0-9]+\.[0-9]+(?:\.[0-9]+)?[A-Za-z0-9._+~-]*")


def parse_kernel(text: str) -> str:
    """``uname -r``: e.g. ``6.17.0-1021-nvidia``."""
    line = _one_line("kernel release", text)
    if not _KERNEL.fullmatch(line):
        raise ProbeParseError("kernel release", f"not a kernel release: {line[:40]!r}")
    return line


def parse_page_size(text: str) -> int:
    """``getconf PAGESIZE``: a single line, ``4096`` on a Spark."""
    v = _int("page size", _one_line("page size", text), 512, 1 << 24)
    if v & (v - 1):
        raise ProbeParseError("page size", f"{v} is not a power of two")
    return v


_DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?")


def parse_held_packages(text: str) -> list[str]:
    """``apt-mark showhold``: one package per line; nothing held prints nothing."""
    out = []
    for line in _lines(text):
        name = line.strip()
        if not _DEB_NAME.fullmatch(name):
            raise ProbeParseError("held packages", f"not a package name: {name[:40]!r}")
        out.append(name)
    return out


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_boot_id(text: str) -> str:
    line = _one_line("boot id", text)
    if not _UUID.fullmatch(line):
        raise ProbeParseError("boot id", f"not a UUID: {line[:40]!r}")
    return line


def parse_uptime(text: str) -> float:
    """``/proc/uptime``: ``<seconds up> <idle seconds>``."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) [0-9]+(?:\.[0-9]+)?", _one_line("uptime", text))
    if not m:
        raise ProbeParseError("uptime", f"not /proc/uptime: {text.strip()[:40]!r}")
    return float(m.group(1))


@dataclass(frozen=True)
class Meminfo:
    total_kib: int
    available_kib: int


_MEMINFO_LINE = re.compile(r"([A-Za-z0-9_()]+):\s+([0-9]+)(?: kB)?")


def parse_meminfo(text: str) -> Meminfo:
    """``/proc/meminfo``: every line ``Key:  N kB`` (or ``Key: N``); needs
    MemTotal and MemAvailable (GB10 memory is unified: nvidia-smi has none)."""
    values: dict[str, int] = {}
    for line in _lines(text):
        m = _MEMINFO_LINE.fullmatch(line.strip())
        if not m:
            raise ProbeParseError("meminfo", f"unexpected line {line.strip()[:40]!r}")
        values[m.group(1)] = int(m.group(2))
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in values]
    if missing:
        raise ProbeParseError("meminfo", f"no {' or '.join(missing)} line")
    total, avail = values["MemTotal"], values["MemAvailable"]
    if total == 0 or avail > total:
        raise ProbeParseError("meminfo", f"MemAvailable {avail} kB does not fit MemTotal {total} kB")
    return Meminfo(total, avail)


@dataclass(frozen=True)
class DiskFree:
    available_kib: int
    mount: str

    @property
    def free_gib(self) -> float:
        return self.available_kib / (1 << 20)


def parse_df(text: str) -> DiskFree:
    """``df -Pk PATH`` (POSIX format: a header, then one line per file system)."""
    lines = _lines(text)
    if len(lines) < 2 or not lines[0].startswith("Filesystem"):
        raise ProbeParseError("free disk space", "no df -P header")
    if len(lines) != 2:
        raise ProbeParseError("free disk space", f"expected one file system, got {len(lines) - 1}")
    # POSIX: Filesystem, blocks, used, available, capacity, mounted on (a
    # file-system name may contain spaces: read the numbers from the right).
    m = re.fullmatch(r"(.+?)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+%|-)\s+(/.*)", lines[1])
    if not m:
        raise ProbeParseError("free disk space", f"unexpected df line {lines[1][:60]!r}")
    return DiskFree(int(m.group(4)), m.group(6))


# --------------------------------------------------------------------------- nvidia-smi

_NA = {"n/a", "[n/a]", "not supported", "[not supported]", "[unknown error]", "unknown error",
       "[insufficient permissions]", "insufficient permissions", "[gpu is lost]", "not available"}
_UNIT = re.compile(r"\s*(?:MHz|W|%|MiB|C|us)$")


def smi_value(raw: str) -> str | None:
    """One csv cell of ``nvidia-smi --format=csv``: units stripped, N/A -> None."""
    v = raw.strip()
    if v.lower() in _NA:
        return None
    return _UNIT.sub("", v)


def parse_smi_csv(text: str, fields: Iterable[str], what: str = "nvidia-smi csv") -> list[dict[str, str | None]]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``:
    one dict per GPU line. A header line, when present, must name ``fields``."""
    names = list(fields)
    rows: list[dict[str, str | None]] = []
    lines = _lines(text)
    if not lines:
        raise ProbeParseError(what, "no output")
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.split(",")]
        if i == 0 and cells and cells[0].split(" [")[0] == names[0]:
            header = [c.split(" [")[0] for c in cells]
            if header != names:
                raise ProbeParseError(what, f"header {line[:60]!r} does not match the query")
            continue
        if len(cells) != len(names):
            raise ProbeParseError(what, f"expected {len(names)} fields, got {len(cells)} in {line[:60]!r}")
        rows.append({n: smi_value(c) for n, c in zip(names, cells)})
    if not rows:
        raise ProbeParseError(what, "no GPU line")
    return rows


def _num(what: str, v: str | None, conv: Callable[[str], T]) -> T | None:
    if v is None:
        return None
    try:
        return conv(v)
    except ValueError:
        raise ProbeParseError(what, f"not a number: {v[:30]!r}") from None


def _to_int(v: str) -> int:
    """``2190`` or ``2190.0``; anything else raises ValueError."""
    if not re.fullmatch(r"-?[0-9]+(?:\.[0-9]+)?", v):
        raise ValueError(v)
    return int(float(v))


def decode_reasons(mask: int) -> tuple[str, ...]:
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    bit = 0x200
    while rest:
        if rest & bit:
            names.append(f"reason_0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


@dataclass(frozen=True)
class GpuQuery:
    name: str
    compute_cap: str | None
    driver: str | None
    sm_mhz: int | None
    max_sm_mhz: int | None
    event_reasons_mask: int | None
    power_w: float | None
    temp_c: int | None


def parse_gpu_query(text: str) -> GpuQuery:
    """The GPU_QUERY_FIELDS csv line (first GPU; a Spark has one)."""
    what = "GPU state"
    row = parse_smi_csv(text, GPU_QUERY_FIELDS, what)[0]
    name = row["name"]
    if not name or not re.fullmatch(r"[A-Za-z0-9 ._()-]+", name):
        raise ProbeParseError(what, f"not a GPU name: {str(name)[:40]!r}")
    cc = row["compute_cap"]
    if cc is not None and not re.fullmatch(r"[0-9]+\.[0-9]+", cc):
        raise ProbeParseError(what, f"not a compute capability: {cc[:20]!r}")
    drv = row["driver_version"]
    if drv is not None and not re.fullmatch(r"[0-9]+(?:\.[0-9]+)+", drv):
        raise ProbeParseError(what, f"not a driver version: {drv[:20]!r}")
    mask = row["clocks_event_reasons.active"]
    if mask is not None and not re.fullmatch(r"0x[0-9a-fA-F]+", mask):
        raise ProbeParseError(what, f"not a reasons bitmask: {mask[:30]!r}")

    def mhz(key: str) -> int | None:
        v = _num(what, row[key], _to_int)
        if v is not None and not 0 <= v <= 100_000:
            raise ProbeParseError(what, f"{key} {v} out of range")
        return v

    power = _num(what, row["power.draw"], float)
    temp = _num(what, row["temperature.gpu"], _to_int)
    return GpuQuery(
        name=name, compute_cap=cc, driver=drv, sm_mhz=mhz("clocks.sm"), max_sm_mhz=mhz("clocks.max.sm"),
        event_reasons_mask=int(mask, 16) if mask else None, power_w=power, temp_c=temp,
    )


@dataclass(frozen=True)
class SmiClocks:
    """What ``nvidia-smi -q -d CLOCK,PERFORMANCE`` says about clocks."""

    sm_mhz: int | None
    max_sm_mhz: int | None
    applications_mhz: int | None
    default_applications_mhz: int | None
    lock_max_mhz: int | None
    event_reasons: tuple[str, ...] | None  # None: no Clocks Event Reasons block


_KV = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*)$")
_MHZ = re.compile(r"([0-9]+)\s*MHz")
_LOCK_WORD = re.compile(r"\block")  # "Locked Clocks", not "Clocks"
_NO_LOCK = {"n/a", "none", "not set", "disabled", "not locked", "unlocked", "default", "[n/a]"}


def parse_smi_q_clocks(text: str) -> SmiClocks:
    """``nvidia-smi -q`` text (any subset of sections). Key/value lines sit
    under an indented section title; key lines before any title (the real
    capture cut the ``Clocks`` title) count as the ``Clocks`` section."""
    what = "GPU clocks"
    section = "clocks"
    values: dict[tuple[str, str], str] = {}
    reasons: list[str] | None = None
    lock_max: int | None = None
    lock_seen = False  # a lock field was printed (possibly "N/A": no lock)
    saw_any = False
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("=") or re.match(r"GPU [0-9A-Fa-f]+:", raw):
            continue
        m = _KV.match(raw)
        if not m or (m.group(3) == "" and ":" not in raw):
            title = raw.strip()
            if not re.fullmatch(r"[A-Za-z0-9 ._/()-]+", title):
                raise ProbeParseError(what, f"unexpected line {title[:40]!r}")
            section = title.lower()
            if section == "clocks event reasons":
                reasons = []
            continue
        key, val = m.group(2).strip().lower(), m.group(3).strip()
        saw_any = True
        values.setdefault((section, key), val)
        if section == "clocks event reasons":
            if val.lower() not in ("active", "not active", "n/a"):
                raise ProbeParseError(what, f"event reason {key!r} reads {val[:20]!r}")
            if val.lower() == "active":
                assert reasons is not None
                reasons.append(REASON_LABELS.get(key, re.sub(r"[^a-z0-9]+", "_", key).strip("_")))
        lock_section = bool(_LOCK_WORD.search(section))
        if (lock_section or _LOCK_WORD.search(key) or key == "gpuclkmax") and (
                "max" in key or (lock_section and key in ("graphics", "sm", "gpu"))):
            lock_seen = True
            mm = _MHZ.fullmatch(val) or re.fullmatch(r"([0-9]+)", val)
            if mm:
                v = int(mm.group(1))
                lock_max = v if lock_max is None or key.endswith("max") else lock_max
            elif val.lower() not in _NO_LOCK:
                raise ProbeParseError(what, f"clock lock reads {val[:30]!r}")
    if not saw_any:
        raise ProbeParseError(what, "no key : value lines")

    def mhz(section: str, key: str) -> int | None:
        v = values.get((section, key))
        if v is None or v.lower() in _NA:
            return None
        mm = _MHZ.fullmatch(v)
        if not mm:
            raise ProbeParseError(what, f"{section}/{key} reads {v[:30]!r}")
        return int(mm.group(1))

    sm, mx = mhz("clocks", "sm"), mhz("max clocks", "sm")
    if sm is None and mx is None and reasons is None and not lock_seen:
        raise ProbeParseError(what, "neither clocks nor event reasons in the output")
    return SmiClocks(
        sm_mhz=sm, max_sm_mhz=mx, applications_mhz=mhz("applications clocks", "graphics"),
        default_applications_mhz=mhz("default applications clocks", "graphics"),
        lock_max_mhz=lock_max if lock_max else None,
        event_reasons=tuple(reasons) if reasons is not None else None,
    )


# --------------------------------------------------------------------------- RDMA / links


@dataclass(frozen=True)
class IbMapping:
    rdma: str
    port: int
    netdev: str
    up: bool | None


_IBDEV = re.compile(r"(\S+) port ([0-9]+) ==> (\S+)(?: \((Up|Down)\))?")


def parse_ibdev2netdev(text: str) -> dict[str, IbMapping]:
    """``ibdev2netdev``: ``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)``, any order. Keyed by netdev."""
    out: dict[str, IbMapping] = {}
    for line in _lines(text):
        m = _IBDEV.fullmatch(line.strip())
        if not m:
            raise ProbeParseError("ibdev2netdev", f"unexpected line {line.strip()[:50]!r}")
        up = None if m.group(4) is None else m.group(4) == "Up"
        out[m.group(3)] = IbMapping(m.group(1), int(m.group(2)), m.group(3), up)
    if not out:
        raise ProbeParseError("ibdev2netdev", "no RDMA devices listed")
    return out


_OPERSTATES = {"up", "down", "unknown", "dormant", "lowerlayerdown", "notpresent", "testing"}


def parse_operstate(text: str) -> str:
    line = _one_line("link state", text)
    if line not in _OPERSTATES:
        raise ProbeParseError("link state", f"not an operstate: {line[:30]!r}")
    return line


def parse_mtu(text: str) -> int:
    return _int("MTU", _one_line("MTU", text), 68, 65536)


def parse_ipv4(text: str) -> str | None:
    """``ip -4 -o addr show dev IF`` (or an ``ip -br addr`` line): the first
    IPv4 ``addr/prefix``; no output means no address."""
    found: list[str] = []
    for line in _lines(text):
        m = re.search(r"\binet ([0-9.]+/[0-9]+)", line) or re.fullmatch(
            r"\S+\s+[A-Z]+\s+([0-9.]+/[0-9]+)(?:\s.*)?", line.strip())
        if not m:
            raise ProbeParseError("IPv4 address", f"unexpected line {line.strip()[:50]!r}")
        try:
            found.append(str(ipaddress.IPv4Interface(m.group(1))))
        except ValueError:
            raise ProbeParseError("IPv4 address", f"not an IPv4 address: {m.group(1)!r}") from None
    return found[0] if found else None


@dataclass(frozen=True)
class Ethtool:
    speed_mbps: int | None
    link_detected: bool | None


def parse_ethtool(text: str) -> Ethtool:
    """``ethtool IF`` (whole or grepped): ``Speed: 200000Mb/s`` / ``Unknown!``, ``Link detected: yes``."""
    speed: int | None = None
    detected: bool | None = None
    seen = False
    for line in _lines(text):
        s = line.strip()
        if s.startswith("Speed:"):
            v = s[6:].strip()
            m = re.fullmatch(r"([0-9]+)Mb/s", v)
            if m:
                speed = int(m.group(1))
            elif not v.startswith("Unknown"):
                raise ProbeParseError("link speed", f"Speed reads {v[:30]!r}")
            seen = True
        elif s.startswith("Link detected:"):
            v = s[14:].strip()
            if v not in ("yes", "no"):
                raise ProbeParseError("link speed", f"Link detected reads {v[:30]!r}")
            detected = v == "yes"
            seen = True
    if not seen:
        raise ProbeParseError("link speed", "no Speed or Link detected line")
    return Ethtool(speed, detected)


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str | None  # "RoCE v2" | "IB/RoCE v1" | None (empty slot)
    netdev: str | None


_GID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


def parse_gid_dump(text: str) -> dict[str, dict[int, Gid]]:
    """The ``gids`` section: ``DEV|N|gid|ndev|type`` per readable slot, made
    from ``class/infiniband/DEV/ports/1/{gids,gid_attrs/ndevs,gid_attrs/types}/N``."""
    out: dict[str, dict[int, Gid]] = {}
    for line in _lines(text):
        parts = line.split("|")
        if len(parts) != 5:
            raise ProbeParseError("RoCE GID tables", f"unexpected line {line[:50]!r}")
        dev, n, gid, nd, typ = (p.strip() for p in parts)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", dev) or not n.isdigit() or not _GID.fullmatch(gid):
            raise ProbeParseError("RoCE GID tables", f"unexpected line {line[:50]!r}")
        if typ not in ("", "RoCE v2", "IB/RoCE v1"):
            raise ProbeParseError("RoCE GID tables", f"unknown GID type {typ[:20]!r}")
        out.setdefault(dev, {})[int(n)] = Gid(int(n), gid, typ or None, nd or None)
    if not out:
        raise ProbeParseError("RoCE GID tables", "no RoCE device under class/infiniband")
    return out


def parse_show_gids(text: str) -> dict[str, dict[int, Gid]]:
    """``show_gids`` (tab-separated, with or without its header and footer)."""
    out: dict[str, dict[int, Gid]] = {}
    for line in _lines(text):
        if line.startswith(("DEV", "---", "n_gids_found")):
            continue
        cells = [c.strip() for c in line.split("\t")]
        cells = [c for c in cells if c]
        if len(cells) not in (6, 7) or not cells[2].isdigit() or not _GID.fullmatch(cells[3]):
            raise ProbeParseError("show_gids", f"unexpected line {line[:50]!r}")
        ver, nd = cells[-2], cells[-1]
        typ = {"v1": "IB/RoCE v1", "v2": "RoCE v2"}.get(ver)
        if typ is None:
            raise ProbeParseError("show_gids", f"unknown version {ver!r}")
        out.setdefault(cells[0], {})[int(cells[2])] = Gid(int(cells[2]), cells[3], typ, nd)
    if not out:
        raise ProbeParseError("show_gids", "no GID rows")
    return out


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``...:ffff:c0a8:640a`` -> 192.168.100.10)."""
    if not gid.startswith(_V4_MAPPED):
        return None
    hi, lo = gid[len(_V4_MAPPED):].split(":")
    return str(ipaddress.IPv4Address(int(hi + lo, 16)))


def rocev2_ipv4_gid_index(table: Mapping[int, Gid], netdev: str | None = None, ipv4: str | None = None) -> int | None:
    """The lowest slot holding a RoCE v2 IPv4-mapped GID (of ``ipv4`` when given,
    of ``netdev`` when the slot names one); None when there is none."""
    want = ipv4.split("/")[0] if ipv4 else None
    for n in sorted(table):
        g = table[n]
        if g.type != "RoCE v2" or g.gid == _ZERO_GID:
            continue
        addr = gid_ipv4(g.gid)
        if addr is None or (want and addr != want):
            continue
        if netdev and g.netdev and g.netdev != netdev:
            continue
        return n
    return None


# --------------------------------------------------------------------------- PCIe

_LNKCAP = re.compile(r"^\s*LnkCap:\s*Port #[0-9]+,\s*Speed ([0-9.]+)GT/s,\s*Width x([0-9]+)", re.MULTILINE)
_LNKSTA = re.compile(
    r"^\s*LnkSta:\s*Speed ([0-9.]+)GT/s(?: \((ok|downgraded)\))?,\s*Width x([0-9]+)(?: \((ok|downgraded)\))?",
    re.MULTILINE,
)


def parse_lspci_link(text: str, bdf: str = "") -> PcieFacts:
    """``lspci -vv -s BDF``: LnkCap and LnkSta (spaces or tabs, with or without
    the ``(ok)``/``(downgraded)`` marks of newer pciutils)."""
    what = "PCIe link"
    if not text.strip():
        raise ProbeParseError(what, "lspci printed nothing (no such PCI function?)")
    cap, sta = _LNKCAP.search(text), _LNKSTA.search(text)
    if not cap or not sta:
        hint = " (lspci shows capabilities to root only)" if "access denied" in text else ""
        raise ProbeParseError(what, f"no {'LnkCap' if not cap else 'LnkSta'} line{hint}")
    try:
        cap_gts, sta_gts = float(cap.group(1)), float(sta.group(1))
    except ValueError:
        raise ProbeParseError(what, "unreadable link speed") from None
    cap_w, sta_w = int(cap.group(2)), int(sta.group(3))
    marked = "downgraded" in (sta.group(2), sta.group(4))
    return PcieFacts(bdf, cap_gts, cap_w, sta_gts, sta_w, marked or sta_gts < cap_gts or sta_w < cap_w)


# --------------------------------------------------------------------------- processes, ports, models


def parse_engines(text: str) -> list[EngineProc]:
    """``ps -eo pid,args`` (whole or grepped, header required): the engine
    processes. The probe's own shell (its command line carries the markers) is
    left out."""
    lines = _lines(text)
    if not lines or not re.fullmatch(r"\s*PID\s+(COMMAND|ARGS|CMD)", lines[0]):
        raise ProbeParseError("engine processes", "no ps header line")
    out = []
    for line in lines[1:]:
        m = re.fullmatch(r"\s*([0-9]+)\s+(.*)", line)
        if not m:
            raise ProbeParseError("engine processes", f"unexpected line {line.strip()[:50]!r}")
        args = m.group(2).strip()
        if MARKER_PREFIX in args or not ENGINE_PATTERN.search(args):
            continue
        out.append(EngineProc(int(m.group(1)), args))
    return out


def parse_listening_ports(text: str) -> set[int]:
    """``ss -ltn[p][H]`` or ``/proc/net/tcp[6]``: the TCP ports in LISTEN."""
    ports: set[int] = set()
    for line in _lines(text):
        cells = line.split()
        if cells[0] in ("State", "Netid", "sl"):
            continue
        if cells[0] == "LISTEN" and len(cells) >= 4:
            local = cells[3]
            port = local.rsplit(":", 1)[-1]
            if ":" not in local or not port.isdigit():
                raise ProbeParseError("listening TCP ports", f"unexpected address {local[:40]!r}")
            ports.add(_int("listening TCP ports", port, 0, 65535))
        elif re.fullmatch(r"[0-9]+:", cells[0]) and len(cells) >= 4:
            m = re.fullmatch(r"[0-9A-F]+:([0-9A-F]{4})", cells[1])
            if not m or not re.fullmatch(r"[0-9A-F]{2}", cells[3]):
                raise ProbeParseError("listening TCP ports", f"unexpected /proc/net/tcp line {line[:50]!r}")
            if cells[3] == "0A":  # TCP_LISTEN
                ports.add(int(m.group(1), 16))
        else:
            raise ProbeParseError("listening TCP ports", f"unexpected line {line.strip()[:50]!r}")
    return ports


_WEIGHT_KINDS = ("dir", "file", "missing")


def parse_weights_summary(text: str) -> WeightsSummary:
    """The last JSON line of ``weights_agent.py summary``: a ``summary`` event (or its ``error``)."""
    what = "weights summary"
    doc: Any = None
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            continue
        break
    if not isinstance(doc, dict):
        raise ProbeParseError(what, "no JSON line" if doc is None else "not a JSON object")
    if doc.get("event") == "error":
        raise ProbeParseError(what, f"the agent said: {str(doc.get('message'))[:200]}")
    if doc.get("event") != "summary" or doc.get("kind") not in _WEIGHT_KINDS:
        raise ProbeParseError(what, f"not a summary (event {str(doc.get('event'))[:40]!r}, "
                                    f"kind {str(doc.get('kind'))[:40]!r})")

    def count(key: str) -> int:
        v = doc.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ProbeParseError(what, f"{key} is not a count: {str(v)[:40]!r}")
        return v

    digest = doc.get("digest")
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise ProbeParseError(what, f"digest is not a SHA-256: {str(digest)[:80]!r}")
    listed = doc.get("unverified", [])
    if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
        raise ProbeParseError(what, "unverified is not a list of paths")
    return WeightsSummary(kind=doc["kind"], files=count("files"), bytes=count("bytes"), digest=digest,
                          n_unverified=count("n_unverified"), unverified=tuple(listed), partial=count("partial"))


def parse_models(text: str) -> list[str]:
    """``GET /v1/models``: the ids of the OpenAI ``data`` array (vLLM, SGLang,
    llama.cpp, which adds an Ollama-style ``models`` array, used only when
    ``data`` is missing)."""
    what = "served models"
    if not text.strip():
        raise ProbeParseError(what, "empty response")
    try:
        doc: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProbeParseError(what, f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise ProbeParseError(what, "not a JSON object")
    if isinstance(doc.get("data"), list):
        items, key = doc["data"], "id"
    elif isinstance(doc.get("models"), list):
        items, key = doc["models"], "name"
    else:
        raise ProbeParseError(what, f"no data array (keys: {', '.join(sorted(map(str, doc))[:5])})")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            raise ProbeParseError(what, f"an entry without a string {key!r}")
        out.append(item[key])
    return out


# --------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Section:
    text: str
    rc: int | None  # None: the end marker never came (output cut off)


_MARK = re.compile(r"@@sparkctl:(manifest|section|rc|done)(?::(.*))?@@")


def split_batch(stdout: str) -> tuple[list[str] | None, dict[str, Section], bool]:
    """(manifest, sections, done) from the script's stdout. Never raises."""
    manifest: list[str] | None = None
    sections: dict[str, Section] = {}
    done = False
    name: str | None = None
    buf: list[str] = []

    def close(rc: int | None) -> None:
        nonlocal name, buf
        if name is not None and name not in sections:
            text = "\n".join(buf)
            if rc is None and text.endswith("\n"):
                text = text[:-1]
            sections[name] = Section(text, rc)
        name, buf = None, []

    for line in stdout.split("\n"):
        m = _MARK.fullmatch(line)
        if not m:
            if name is not None:
                buf.append(line)
            continue
        kind, arg = m.group(1), m.group(2) or ""
        if kind == "manifest" and manifest is None:
            manifest = [n for n in arg.split(" ") if _SECTION_NAME.fullmatch(n)]
        elif kind == "section" and _SECTION_NAME.fullmatch(arg):
            close(None)
            name = arg
        elif kind == "rc":
            rc_name, _, rc = arg.rpartition(":")
            if rc_name == name and rc.isdigit():
                close(int(rc))
            elif name is not None:
                buf.append(line)
        elif kind == "done":
            close(None)
            done = True
    close(None)
    return manifest, sections, done


_CORE_SECTIONS = ("hostname", "kernel", "page_size", "held_packages", "boot_id", "uptime", "meminfo", "disk",
                  "gpu", "gpu_clocks", "ibdev2netdev", "gids", "engines", "ports")


# Exit codes that say more than "failed": (section, code) -> detail.
_RC_DETAILS = {
    ("gids", 2): "no class/infiniband directory (RDMA driver not loaded?)",
    ("models", 7): "connection refused (nothing listening on the endpoint port?)",
    ("models", 28): f"no answer within {MODELS_TIMEOUT_S} s",
}


class _Reader:
    def __init__(self, node: str, sections: Mapping[str, Section]) -> None:
        self.node = node
        self.sections = sections
        self.unreadable: dict[str, str] = {}
        self.not_available: dict[str, str] = {}

    def fail(self, key: str, detail: str) -> None:
        self.unreadable.setdefault(key, f"cannot read {section_title(key)} on node {self.node}: {detail}")

    def read(self, key: str, parser: Callable[[str], T]) -> T | None:
        sec = self.sections.get(key)
        if sec is None:
            self.fail(key, "missing from the probe output (output cut off?)")
            return None
        if sec.rc is None:
            self.fail(key, "output cut off before the end of the section")
            return None
        if sec.rc == 127:
            self.not_available[key] = f"{section_title(key)} not available on node {self.node}: command not found"
            return None
        if (key, sec.rc) in _RC_DETAILS:
            self.fail(key, _RC_DETAILS[(key, sec.rc)])
            return None
        if sec.rc != 0 and not sec.text.strip():
            self.fail(key, f"command failed with exit code {sec.rc} and printed nothing")
            return None
        try:
            return parser(sec.text)
        except ProbeParseError as exc:
            rc = f" (exit code {sec.rc})" if sec.rc else ""
            self.fail(key, f"{exc.detail}{rc}")
        except Exception as exc:  # noqa: BLE001 - parse_batch never raises; tests keep parsers honest
            self.fail(key, f"unexpected {type(exc).__name__}: {exc}")
        return None


def parse_batch(node_name: str, stdout: str) -> NodeFacts:
    """Parse the batched script's stdout into :class:`NodeFacts`. Never raises:
    every section it cannot read is explained in ``unreadable``."""
    try:
        return _parse_batch(node_name, stdout)
    except Exception as exc:  # noqa: BLE001 - last resort; must not happen
        return NodeFacts(node=node_name, unreadable={"batch": f"cannot read any fact on node {node_name}: "
                                                              f"{type(exc).__name__}: {exc}"})


def _parse_batch(node: str, stdout: str) -> NodeFacts:
    manifest, sections, done = split_batch(stdout)
    r = _Reader(node, sections)
    expected = list(manifest) if manifest else list(_CORE_SECTIONS)
    expected += [n for n in sections if n not in expected]
    if manifest is None:
        r.unreadable["batch"] = f"cannot read the probe batch on node {node}: no manifest line (not sparkctl output?)"
    elif not done:
        r.unreadable["batch"] = f"cannot read the probe batch on node {node}: output cut off (no done marker)"

    def want(key: str) -> bool:
        return key in expected

    def get(key: str, parser: Callable[[str], T]) -> T | None:
        return r.read(key, parser) if want(key) else None

    mem = get("meminfo", parse_meminfo)
    lock_sec = sections.get("clock_lock")
    clock_lock = None
    if lock_sec is not None and lock_sec.rc == 3:
        clock_lock = None  # no record: sparkctl has not locked the clock on this node
    else:
        clock_lock = get("clock_lock", parse_clock_lock)
    disk = get("disk", parse_df)
    w_sec = sections.get("weights")
    weights = WeightsSummary("no-agent") if w_sec is not None and w_sec.rc == 3 \
        else get("weights", parse_weights_summary)
    held = get("held_packages", parse_held_packages)

    gpu: GpuFacts | None = None
    q = get("gpu", parse_gpu_query)
    clocks = get("gpu_clocks", parse_smi_q_clocks)
    if q is not None:
        if q.event_reasons_mask is not None:
            reasons = decode_reasons(q.event_reasons_mask)
        else:
            reasons = clocks.event_reasons or () if clocks else ()
        gpu = GpuFacts(
            name=q.name, compute_cap=q.compute_cap, driver=q.driver,
            sm_mhz=q.sm_mhz if q.sm_mhz is not None else (clocks.sm_mhz if clocks else None),
            max_sm_mhz=q.max_sm_mhz if q.max_sm_mhz is not None else (clocks.max_sm_mhz if clocks else None),
            clock_lock_max_mhz=clocks.lock_max_mhz if clocks else None,
            event_reasons=reasons, power_w=q.power_w, temp_c=q.temp_c,
        )

    ibmap = get("ibdev2netdev", parse_ibdev2netdev) or {}
    gids = get("gids", parse_gid_dump) or {}
    links: dict[str, LinkFacts] = {}
    netdevs = [k.split(".")[1] for k in expected if k.startswith("net.") and k.endswith(".operstate")]
    for nd in netdevs:
        op_key = f"net.{nd}.operstate"
        sec = sections.get(op_key)
        if sec is not None and sec.rc not in (0, None) and not sec.text.strip():
            r.fail(op_key, f"no such netdev (class/net/{nd} is missing)")
            continue
        operstate = r.read(op_key, parse_operstate)
        mtu = r.read(f"net.{nd}.mtu", parse_mtu)
        ipv4 = r.read(f"net.{nd}.ipv4", parse_ipv4)
        eth = r.read(f"net.{nd}.ethtool", parse_ethtool)
        rdma = ibmap[nd].rdma if nd in ibmap else next(
            (dev for dev, t in gids.items() if any(g.netdev == nd for g in t.values())), None)
        gid_index = rocev2_ipv4_gid_index(gids[rdma], nd, ipv4) if rdma in gids else None
        links[nd] = LinkFacts(
            netdev=nd, rdma=rdma, operstate=operstate, mtu=mtu, ipv4=ipv4,
            speed_mbps=eth.speed_mbps if eth else None, link_detected=eth.link_detected if eth else None,
            gid_index_rocev2_ipv4=gid_index,
        )

    pcie: dict[str, PcieFacts] = {}
    for key in expected:
        if key.startswith("pcie."):
            bdf = key[5:]
            p = r.read(key, lambda t, b=bdf: parse_lspci_link(t, b))  # type: ignore[misc]
            if p is not None:
                pcie[bdf] = p

    return NodeFacts(
        node=node,
        clock_lock_record=clock_lock,
        weights=weights,
        hostname=get("hostname", parse_hostname),
        kernel=get("kernel", parse_kernel),
        page_size_bytes=get("page_size", parse_page_size),
        held_packages=held,
        boot_id=get("boot_id", parse_boot_id),
        uptime_s=get("uptime", parse_uptime),
        mem_total_kib=mem.total_kib if mem else None,
        mem_available_kib=mem.available_kib if mem else None,
        disk_free_gib=round(disk.free_gib, 3) if disk else None,
        gpu=gpu,
        links=links,
        pcie=pcie,
        engines=get("engines", parse_engines),
        listening_ports=get("ports", parse_listening_ports),
        served_models=get("models", parse_models),
        unreadable=r.unreadable,
        not_available=r.not_available,
    )


def gather(
    run: Callable[[str], tuple[int, str, str]],
    node: Node,
    weights_path: str | None = None,
    endpoint_port: int | None = None,
) -> NodeFacts:
    """Run the batched probe on ``node`` in ONE call of ``run`` and parse it.

    ``run(command) -> (exit_code, stdout, stderr)``; whatever it raises (a
    transport error: the node did not answer) propagates: that is the
    transport's verdict, not a fact. A run whose stdout carries no probe output
    yields facts whose every section is unreadable, with stderr's last line.
    """
    code, out, err = run(remote_command(build_script(node, weights_path, endpoint_port)))
    facts = parse_batch(node.name, out)
    if "batch" in facts.unreadable and (code != 0 or err.strip()):
        tail = err.strip().splitlines()[-1][:200] if err.strip() else ""
        facts.unreadable["batch"] += f" (exit code {code}{': ' + tail if tail else ''})"
    return facts


# --------------------------------------------------------------------------- active fabric probes
#
# Not read-only facts but harmless traffic between the nodes' own fabric
# addresses: don't-fragment pings of MTU-28 bytes on every twin, pings to ring
# non-neighbours (through the relay), and optionally ib_write_bw per twin. One
# script per node, all nodes at once: the b end of every twin starts its
# ib_write_bw server, the a end waits a moment and runs the client.


@dataclass(frozen=True)
class FabricTarget:
    kind: str  # df | relay | bw-server | bw-client
    netdev: str
    peer: str
    address: str  # the peer's address (df, relay, bw-client)
    rdma: str = ""
    port: int = 0


def build_fabric_script(targets: Sequence[FabricTarget], mtu: int, bandwidth_s: int = 0) -> str:
    size = int(mtu) - 28
    lines = [_PRELUDE, f"echo {_q(MARKER_PREFIX + 'manifest:fabric@@')}"]
    for i, t in enumerate(targets):
        name = f"fab{i}"
        if t.kind == "df":
            body = f"have ping || exit 127; ping -M do -s {size} -c 1 -W 2 -I {_q(t.netdev)} {_q(t.address)}"
        elif t.kind == "relay":
            body = f"have ping || exit 127; ping -c 1 -W 2 {_q(t.address)}"
        elif t.kind == "bw-server" and bandwidth_s:
            body = (f"have ib_write_bw || exit 127; (ib_write_bw -d {_q(t.rdma)} -p {int(t.port)} -D {int(bandwidth_s)} "
                    "--report_gbits >/dev/null 2>&1 &) ; echo started")
        elif t.kind == "bw-client" and bandwidth_s:
            body = (f"have ib_write_bw || exit 127; sleep 1; ib_write_bw -d {_q(t.rdma)} -p {int(t.port)} "
                    f"-D {int(bandwidth_s)} --report_gbits {_q(t.address)}")
        else:
            continue
        lines.append(f"sec {name}; ( {body} ); end {name} $?")
    lines.append(f"echo {_q(MARKER_PREFIX + 'done@@')}")
    return "\n".join(lines) + "\n"


def parse_ib_write_bw(text: str) -> float:
    """BW average [Gb/sec] from the result row of ``ib_write_bw --report_gbits``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0].isdigit():
            try:
                return float(parts[3])
            except ValueError:
                break
    raise ProbeParseError("ib_write_bw", "no result row (#bytes #iterations BW peak BW average MsgRate)")


def parse_fabric(targets: Sequence[FabricTarget], stdout: str) -> list[tuple[FabricTarget, bool | None, float | None]]:
    """Per target: (target, reached?, bandwidth Gb/s). None = not measured."""
    _, sections, _ = split_batch(stdout)
    out = []
    for i, t in enumerate(targets):
        sec = sections.get(f"fab{i}")
        if sec is None or sec.rc is None or sec.rc == 127:
            out.append((t, None, None))
        elif t.kind in ("df", "relay"):
            out.append((t, sec.rc == 0, None))
        elif t.kind == "bw-client":
            try:
                out.append((t, sec.rc == 0, parse_ib_write_bw(sec.text)))
            except ProbeParseError:
                out.append((t, False, None))
    return out


# --------------------------------------------------------------------------- telemetry (bench, >= 1 Hz)


def telemetry_command(node: Node) -> str:
    """One cheap read of what the bench samples every second."""
    mem = _q((node.proc_root.rstrip("/") or "") + "/meminfo")
    return ("nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active "
            f"--format=csv,noheader,nounits 2>/dev/null; grep -m1 '^MemAvailable:' {mem}")


def parse_telemetry(text: str) -> dict[str, Any]:
    """-> {power_w, sm_mhz, temp_c, event_reasons, mem_available_gib}; None where unreadable."""
    out: dict[str, Any] = {"power_w": None, "sm_mhz": None, "temp_c": None, "event_reasons": None,
                           "mem_available_gib": None}
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out["mem_available_gib"] = round(int(parts[1]) / 1024 / 1024, 2)
        elif line.count(",") == 3:
            vals = [v.strip() for v in line.split(",")]

            def num(v: str) -> float | None:
                try:
                    return float(v)
                except ValueError:
                    return None

            out["power_w"], out["sm_mhz"], out["temp_c"] = num(vals[0]), num(vals[1]), num(vals[2])
            try:
                mask = int(vals[3], 16)
                out["event_reasons"] = ",".join(decode_reasons(mask)) or "none"
            except ValueError:
                pass
    return out
