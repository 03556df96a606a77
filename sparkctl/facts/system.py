"""OS facts: host name, kernel (uname), page size (getconf), held packages
(apt-mark), boot id, uptime, memory (/proc/meminfo), free disk (df) and
sparkctl's own clock-lock record.

What this module owns: the pure parsers of those outputs and their
:class:`~sparkctl.facts.registry.Fact` entries. It must not run anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.facts.registry import (
    ExitCode,
    Fact,
    ProbeParseError,
    ScriptContext,
    cat,
    int_in,
    lines,
    one_line,
    q,
    small_file,
    tool,
)
from sparkctl.model import clocklock

# --------------------------------------------------------------------------- parsers

_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")


def parse_hostname(text: str) -> str:
    line = one_line("hostname", text, "hostname")
    if not _HOSTNAME.fullmatch(line):
        raise ProbeParseError("hostname", f"not a host name: {line[:40]!r}", "hostname")
    return line


_KERNEL = re.compile(r"[0-9]+\.[0-9]+(?:\.[0-9]+)?[A-Za-z0-9._+~-]*")


def parse_kernel(text: str) -> str:
    """``uname -r``: e.g. ``6.17.0-1021-nvidia``."""
    line = one_line("kernel release", text, "uname -r")
    if not _KERNEL.fullmatch(line):
        raise ProbeParseError("kernel release", f"not a kernel release: {line[:40]!r}", "uname -r")
    return line


def parse_page_size(text: str) -> int:
    """``getconf PAGESIZE``: a single line, ``4096`` on a Spark."""
    t = "getconf PAGESIZE"
    v = int_in("page size", one_line("page size", text, t), 512, 1 << 24, t)
    if v & (v - 1):
        raise ProbeParseError("page size", f"{v} is not a power of two", t)
    return v


_DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?")


def parse_held_packages(text: str) -> list[str]:
    """``apt-mark showhold``: one package per line; nothing held prints nothing."""
    out = []
    for line in lines(text):
        name = line.strip()
        if not _DEB_NAME.fullmatch(name):
            raise ProbeParseError("held packages", f"not a package name: {name[:40]!r}", "apt-mark showhold")
        out.append(name)
    return out


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_boot_id(text: str) -> str:
    line = one_line("boot id", text, "boot_id")
    if not _UUID.fullmatch(line):
        raise ProbeParseError("boot id", f"not a UUID: {line[:40]!r}", "boot_id")
    return line


def parse_uptime(text: str) -> float:
    """``/proc/uptime``: ``<seconds up> <idle seconds>``."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) [0-9]+(?:\.[0-9]+)?", one_line("uptime", text, "/proc/uptime"))
    if not m:
        raise ProbeParseError("uptime", f"not /proc/uptime: {text.strip()[:40]!r}", "/proc/uptime")
    return float(m.group(1))


@dataclass(frozen=True)
class Meminfo:
    total_kib: int
    available_kib: int
    free_kib: int  # MemFree: what cudaMemGetInfo reports as free on GB10's unified memory (page cache is not free)
    cached_kib: int | None = None  # Cached: the page cache (fs/proc/meminfo.c); None when the text has no line


# The kernel prints every /proc/meminfo value in kB ("%8lu kB", fs/proc/meminfo.c
# show_val_kb), the HugePages_* counts without a unit.
_MEMINFO_LINE = re.compile(r"([A-Za-z0-9_()]+):\s+([0-9]+)( kB)?")
_NEEDS_KB = ("MemTotal", "MemFree", "MemAvailable")


def parse_meminfo(text: str) -> Meminfo:
    """``/proc/meminfo``: every line ``Key:  N kB`` (or ``Key: N``); needs
    MemTotal, MemFree and MemAvailable in kB (GB10 memory is unified: nvidia-smi has none)."""
    t = "/proc/meminfo"
    values: dict[str, int] = {}
    for line in lines(text):
        m = _MEMINFO_LINE.fullmatch(line.strip())
        if not m:
            raise ProbeParseError("meminfo", f"unexpected line {line.strip()[:40]!r}", t)
        if m.group(1) in _NEEDS_KB and not m.group(3):
            raise ProbeParseError("meminfo", f"{m.group(1)} has no kB unit: {line.strip()[:40]!r}", t)
        values[m.group(1)] = int(m.group(2))
    missing = [k for k in _NEEDS_KB if k not in values]
    if missing:
        raise ProbeParseError("meminfo", f"no {' or '.join(missing)} line", t)
    total, avail, free = values["MemTotal"], values["MemAvailable"], values["MemFree"]
    if total == 0 or avail > total:
        raise ProbeParseError("meminfo", f"MemAvailable {avail} kB does not fit MemTotal {total} kB", t)
    if free > total:
        raise ProbeParseError("meminfo", f"MemFree {free} kB does not fit MemTotal {total} kB", t)
    return Meminfo(total, avail, free, values.get("Cached"))


@dataclass(frozen=True)
class DiskFree:
    available_kib: int
    mount: str

    @property
    def free_gib(self) -> float:
        return self.available_kib / (1 << 20)


def parse_df(text: str) -> DiskFree:
    """``df -Pk PATH`` (POSIX format: a header, then one line per file system).

    The block size is read from the header (POSIX: ``1024-blocks`` with ``-k``,
    ``512-blocks`` without); any other header is refused."""
    t, what = "df -Pk", "free disk space"
    found = lines(text)
    if len(found) < 2 or not found[0].startswith("Filesystem"):
        raise ProbeParseError(what, "no df -P header", t)
    unit = re.match(r"Filesystem\s+([0-9]+)-blocks\s", found[0])
    if not unit or unit.group(1) not in ("1024", "512"):
        raise ProbeParseError(what, f"header has no 1024-blocks/512-blocks column: {found[0][:60]!r}", t)
    if len(found) != 2:
        raise ProbeParseError(what, f"expected one file system, got {len(found) - 1}", t)
    # POSIX: Filesystem, blocks, used, available, capacity, mounted on (a
    # file-system name may contain spaces: read the numbers from the right).
    m = re.fullmatch(r"(.+?)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+%|-)\s+(/.*)", found[1])
    if not m:
        raise ProbeParseError(what, f"unexpected df line {found[1][:60]!r}", t)
    return DiskFree(int(m.group(4)) * int(unit.group(1)) // 1024, m.group(6))


CLOCK_LOCK_FILE = clocklock.record_path("/")


def parse_clock_lock(text: str) -> tuple[str, int]:
    """``<boot_id> <cap MHz>``, as written by the clock-cap remedy and unit (sparkctl.model.clocklock)."""
    try:
        lock = clocklock.parse(text)
    except clocklock.ClockLockParseError as exc:
        raise ProbeParseError("clock lock record", str(exc), CLOCK_LOCK_FILE) from None
    return lock.boot_id, lock.cap_mhz


# --------------------------------------------------------------------------- facts

HOSTNAME = Fact("hostname", "hostname", lambda c, _: "if have hostname; then hostname; else uname -n; fi",
                parse_hostname)
KERNEL = Fact("kernel", "kernel release", lambda c, _: tool("uname", "-r"), parse_kernel)
PAGE_SIZE = Fact("page_size", "page size", lambda c, _: tool("getconf", "PAGESIZE"), parse_page_size)
HELD_PACKAGES = Fact("held_packages", "held packages", lambda c, _: tool("apt-mark", "showhold"),
                     parse_held_packages)
BOOT_ID = Fact("boot_id", "boot id", lambda c, _: small_file(f"{c.proc}/sys/kernel/random/boot_id"), parse_boot_id)
UPTIME = Fact("uptime", "uptime", lambda c, _: small_file(f"{c.proc}/uptime"), parse_uptime)
MEMINFO = Fact("meminfo", "memory (meminfo)", lambda c, _: cat(f"{c.proc}/meminfo"), parse_meminfo)


def _df(ctx: ScriptContext, _: str) -> str:
    # df needs an existing path: climb from the weights dir to its nearest existing parent.
    return (f"d={q(ctx.weights_path or '/')}; "
            'while [ ! -e "$d" ]; do case "$d" in */*) d=${d%/*}; [ -n "$d" ] || d=/ ;; *) d=. ;; esac; done; '
            + tool("df", "-Pk", '"$d"'))


DISK = Fact("disk", "free disk space", _df, parse_df)


def _clock_lock(ctx: ScriptContext, _: str) -> str:
    # What sparkctl applied with nvidia-smi -lgc, and in which boot: the 580 driver
    # does not report an applied lock, and the lock does not survive a reboot.
    path = clocklock.record_path(ctx.node.prefix)
    return f"[ -e {q(path)} ] || exit 3; {small_file(path)}"


CLOCK_LOCK = Fact("clock_lock", "clock lock record", _clock_lock, parse_clock_lock,
                  exit_codes=(ExitCode(3, "absent", "no record: sparkctl has not locked the clock here"),),
                  core=False)
