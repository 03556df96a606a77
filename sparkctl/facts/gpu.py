"""GPU facts from ``nvidia-smi``: the ``--query-gpu`` csv line, the ``-q``
clocks and event reasons, and the bench's one-line telemetry read.

What this module owns: the pure parsers of nvidia-smi output, the NVML
clocks-event-reason names, and the :class:`~sparkctl.facts.registry.Fact`
entries ``gpu`` and ``gpu_clocks``. It must not run anything.

Units: ``--format=csv`` prints units in the header (``clocks.sm [MHz]``) and,
without ``nounits``, after each value (``2190 MHz``); a unit that is not the
one the field is reported in is refused, never stripped and trusted. The
``-q`` text always carries units (``2398 MHz``) and is read only with them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sparkctl.facts.registry import Fact, ProbeParseError, lines, q
from sparkctl.facts.registry import tool as tool_cmd

if TYPE_CHECKING:  # no pydantic on a node (sparkctl.node.bundle)
    from sparkctl.model.inventory import Node

T = TypeVar("T")
SMI = "nvidia-smi"

GPU_QUERY_FIELDS = (
    "name", "compute_cap", "driver_version", "clocks.sm", "clocks.max.sm",
    "clocks_event_reasons.active", "power.draw", "temperature.gpu",
)

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

# --------------------------------------------------------------------------- csv

_NA = {"n/a", "[n/a]", "not supported", "[not supported]", "[unknown error]", "unknown error",
       "[insufficient permissions]", "insufficient permissions", "[gpu is lost]", "not available"}
_UNITS = ("MHz", "W", "%", "MiB", "C", "us")
_NUM_UNIT = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)\s*(" + "|".join(map(re.escape, _UNITS)) + r")")
_HEADER_CELL = re.compile(r"(\S+)(?:\s+\[([^\]]*)\])?")
# The unit each field family is reported in (nvidia-smi --help-query-gpu):
# clocks in MHz, power in W, memory in MiB, utilization and fan speed in %.
# Temperatures carry no unit in csv; a "C" suffix is accepted as degrees.
_FIELD_UNITS: tuple[tuple[str, str | None], ...] = (
    ("clocks_event_reasons", None), ("clocks_throttle_reasons", None),
    ("clocks.", "MHz"), ("power.", "W"), ("enforced.power.", "W"), ("memory.", "MiB"),
    ("utilization.", "%"), ("fan.speed", "%"), ("temperature.", "C"),
)


def field_unit(name: str) -> str | None | bool:
    """The unit ``name`` is reported in; None: none; False: not known here."""
    for prefix, unit in _FIELD_UNITS:
        if name.startswith(prefix):
            return unit
    return False


def smi_value(raw: str) -> str | None:
    """One csv cell of ``nvidia-smi --format=csv``: a number's unit stripped, N/A -> None."""
    v = raw.strip()
    if v.lower() in _NA:
        return None
    m = _NUM_UNIT.fullmatch(v)
    return m.group(1) if m else v


def _cell(field: str, raw: str, what: str) -> str | None:
    v = raw.strip()
    if v.lower() in _NA:
        return None
    m = _NUM_UNIT.fullmatch(v)
    if not m:
        return v
    want = field_unit(field)
    if want is not False and m.group(2) != want:
        raise ProbeParseError(what, f"{field} reads {v[:30]!r}: expected {want or 'no unit'}", SMI)
    return m.group(1)


def parse_smi_csv(text: str, fields: Iterable[str], what: str = "nvidia-smi csv") -> list[dict[str, str | None]]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``:
    one dict per GPU line. A header line, when present, must name ``fields``,
    and the units it gives must be the fields' own."""
    names = list(fields)
    rows: list[dict[str, str | None]] = []
    found = lines(text)
    if not found:
        raise ProbeParseError(what, "no output", SMI)
    for i, line in enumerate(found):
        cells = [c.strip() for c in line.split(",")]
        if i == 0 and cells and cells[0].split(" [")[0] == names[0]:
            header = [_HEADER_CELL.fullmatch(c) for c in cells]
            if [h.group(1) if h else c for h, c in zip(header, cells)] != names:
                raise ProbeParseError(what, f"header {line[:60]!r} does not match the query", SMI)
            for h in header:
                assert h is not None
                want = field_unit(h.group(1))
                if h.group(2) is not None and want is not False and h.group(2) != want:
                    raise ProbeParseError(what, f"header gives {h.group(1)} in [{h.group(2)}], "
                                                f"expected {want or 'no unit'}", SMI)
            continue
        if len(cells) != len(names):
            raise ProbeParseError(what, f"expected {len(names)} fields, got {len(cells)} in {line[:60]!r}", SMI)
        rows.append({n: _cell(n, c, what) for n, c in zip(names, cells)})
    if not rows:
        raise ProbeParseError(what, "no GPU line", SMI)
    return rows


def _num(what: str, v: str | None, conv: Callable[[str], T]) -> T | None:
    if v is None:
        return None
    try:
        return conv(v)
    except ValueError:
        raise ProbeParseError(what, f"not a number: {v[:30]!r}", SMI) from None


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
        raise ProbeParseError(what, f"not a GPU name: {str(name)[:40]!r}", SMI)
    cc = row["compute_cap"]
    if cc is not None and not re.fullmatch(r"[0-9]+\.[0-9]+", cc):
        raise ProbeParseError(what, f"not a compute capability: {cc[:20]!r}", SMI)
    drv = row["driver_version"]
    if drv is not None and not re.fullmatch(r"[0-9]+(?:\.[0-9]+)+", drv):
        raise ProbeParseError(what, f"not a driver version: {drv[:20]!r}", SMI)
    mask = row["clocks_event_reasons.active"]
    if mask is not None and not re.fullmatch(r"0x[0-9a-fA-F]+", mask):
        raise ProbeParseError(what, f"not a reasons bitmask: {mask[:30]!r}", SMI)

    def mhz(key: str) -> int | None:
        v = _num(what, row[key], _to_int)
        if v is not None and not 0 <= v <= 100_000:
            raise ProbeParseError(what, f"{key} {v} out of range", SMI)
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
                raise ProbeParseError(what, f"unexpected line {title[:40]!r}", SMI)
            section = title.lower()
            if section == "clocks event reasons":
                reasons = []
            continue
        key, val = m.group(2).strip().lower(), m.group(3).strip()
        saw_any = True
        values.setdefault((section, key), val)
        if section == "clocks event reasons":
            if val.lower() not in ("active", "not active", "n/a"):
                raise ProbeParseError(what, f"event reason {key!r} reads {val[:20]!r}", SMI)
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
                raise ProbeParseError(what, f"clock lock reads {val[:30]!r}", SMI)
    if not saw_any:
        raise ProbeParseError(what, "no key : value lines", SMI)

    def mhz(section: str, key: str) -> int | None:
        v = values.get((section, key))
        if v is None or v.lower() in _NA:
            return None
        mm = _MHZ.fullmatch(v)
        if not mm:
            raise ProbeParseError(what, f"{section}/{key} reads {v[:30]!r}", SMI)
        return int(mm.group(1))

    sm, mx = mhz("clocks", "sm"), mhz("max clocks", "sm")
    if sm is None and mx is None and reasons is None and not lock_seen:
        raise ProbeParseError(what, "neither clocks nor event reasons in the output", SMI)
    return SmiClocks(
        sm_mhz=sm, max_sm_mhz=mx, applications_mhz=mhz("applications clocks", "graphics"),
        default_applications_mhz=mhz("default applications clocks", "graphics"),
        lock_max_mhz=lock_max if lock_max else None,
        event_reasons=tuple(reasons) if reasons is not None else None,
    )


# --------------------------------------------------------------------------- facts

GPU = Fact("gpu", "GPU state (nvidia-smi --query-gpu)",
           lambda c, _: tool_cmd(SMI, f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv,noheader,nounits"),
           parse_gpu_query)
# The Clocks Event Reasons block belongs to the PERFORMANCE display group.
GPU_CLOCKS = Fact("gpu_clocks", "GPU clocks (nvidia-smi -q)", lambda c, _: tool_cmd(SMI, "-q", "-d", "CLOCK,PERFORMANCE"),
                  parse_smi_q_clocks)


# --------------------------------------------------------------------------- telemetry (bench, >= 1 Hz)


def telemetry_command(node: Node) -> str:
    """One cheap read of what the bench samples every second."""
    mem = q((node.proc_root.rstrip("/") or "") + "/meminfo")
    return ("nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active "
            f"--format=csv,noheader,nounits 2>/dev/null; grep -m1 '^MemAvailable:' {mem}")


def parse_telemetry(text: str) -> dict[str, Any]:
    """-> {power_w, sm_mhz, temp_c, event_reasons, mem_available_gib}; None where unreadable."""
    out: dict[str, Any] = {"power_w": None, "sm_mhz": None, "temp_c": None, "event_reasons": None,
                           "mem_available_gib": None}
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2] == "kB":
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
