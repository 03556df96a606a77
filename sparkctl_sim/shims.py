"""GB10 vendor-tool shims for the simulated DGX Spark cluster.

Each simulated node runs these instead of ``nvidia-smi``, ``ibdev2netdev``,
``show_gids``, ``ethtool``, ``lspci``, ``uname``, ``getconf``, ``apt-mark`` and
``ib_write_bw``. The output formats copy the real tools as captured on real
Sparks (docs: /work/shared/reference/spark-facts.md; verbatim copies under
tests/fixtures/spark/), so that sparkctl's probes parse the simulation exactly
as they parse the hardware.

What this module owns:

* pure formatters ``tool(state, args, ...) -> ToolResult`` (no I/O, no clock,
  no uid lookups: the clock, the euid, the netdev facts and the GPU process
  list are arguments);
* the GB10 clock/power model (:func:`gpu_sample`) and the RoCE GID table
  (:func:`gid_table`) that several tools share;
* the edges: :func:`read_netdevs` (the REAL kernel of the namespace the shim
  runs in), :func:`write_sysfs_infiniband`, :func:`install_shims` and
  :func:`main`, the only function that reads the state file, ``/sys``,
  ``/proc`` or the clock, writes state, prints or exits.

What it must not do: import anything outside the standard library (every shim
call starts a fresh interpreter), or send traffic anywhere (``ib_write_bw`` is
a model, not a benchmark).

SIMULATION ONLY: nothing on the real-hardware path imports this module.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl_sim import nodestate

State = dict[str, Any]

STATE_ENV = "SPARKCTL_SIM_STATE"
TOOLS = (
    "nvidia-smi",
    "ibdev2netdev",
    "show_gids",
    "ethtool",
    "lspci",
    "uname",
    "getconf",
    "apt-mark",
    "ib_write_bw",
    "ps",
)

# RoCE device -> (netdev, PCI function). Order is ibdev2netdev's on spark-5c2d
# (spark-facts.md §2.1); ls(1) in a UTF-8 locale lists /sys/class/infiniband the
# same way.
ROCE_DEVICES: tuple[tuple[str, str, str], ...] = (
    ("rocep1s0f0", "enp1s0f0np0", "0000:01:00.0"),
    ("rocep1s0f1", "enp1s0f1np1", "0000:01:00.1"),
    ("roceP2p1s0f0", "enP2p1s0f0np0", "0002:01:00.0"),
    ("roceP2p1s0f1", "enP2p1s0f1np1", "0002:01:00.1"),
)
NETDEV_OF = {dev: nd for dev, nd, _ in ROCE_DEVICES}
BDF_OF_NETDEV = {nd: bdf for _, nd, bdf in ROCE_DEVICES}
GID_TABLE_LEN = 256  # mlx5 RoCE ports expose 256 GID slots
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SPARK_OUI = (0x4C, 0xBB, 0x47)  # real Spark MACs: enP7s7 4c:bb:47:80:2a:60 (§3.2)


@dataclass(frozen=True)
class ToolResult:
    """What one shim invocation produced.

    ``new_state`` is the whole state after a mutating command (``-lgc``,
    ``apt-mark hold``), else None. ``exec_argv`` asks main() to hand over to
    a real binary (e.g. ``getconf`` for anything but PAGESIZE).
    """

    stdout: str
    stderr: str = ""
    exit_code: int = 0
    new_state: State | None = None
    exec_argv: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Netdev:
    """Facts about one netdev as the namespace's kernel reports them."""

    name: str
    operstate: str  # /sys/class/net/<if>/operstate: up, down, lowerlayerdown, unknown, ...
    mtu: int = 1500
    ipv4: tuple[tuple[str, int], ...] = ()  # (address, prefixlen), in `ip addr` order

    @property
    def link_up(self) -> bool:
        # "unknown" is what carrier-less virtual links (dummy) report while admin up.
        return self.operstate in ("up", "unknown")

    @property
    def admin_up(self) -> bool:
        return self.operstate != "down"


Netdevs = Mapping[str, Netdev]


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int
    type: str = "C"


@dataclass(frozen=True)
class GpuSample:
    """One instant of the GB10 as nvidia-smi would report it."""

    busy: bool
    sm_mhz: int
    power_w: float
    temp_c: int
    util_pct: int
    pstate: str
    reasons: int  # clocks_event_reasons bitmask (NVML values)


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str  # "IB/RoCE v1" or "RoCE v2", exactly as sysfs gid_attrs/types/N
    netdev: str
    ipv4: str | None = None


def _result(out: str = "", err: str = "", rc: int = 0, new_state: State | None = None) -> ToolResult:
    return ToolResult(stdout=out, stderr=err, exit_code=rc, new_state=new_state)


def _jitter(*parts: object) -> float:
    """A deterministic value in [0, 1) from the parts (no RNG, no clock)."""
    return (zlib.crc32(":".join(str(p) for p in parts).encode()) & 0xFFFFFFFF) / 2**32


def _copy_state(state: State) -> State:
    return json.loads(json.dumps(state))


# --------------------------------------------------------------------------
# GB10 model
# --------------------------------------------------------------------------

IDLE_SM_MHZ = 208  # idle P8 reading from a GB10 parser fixture (§1.3)
BOOST_SM_MHZ = 2450  # busy uncapped readings: 2385, 2398, 2405, 2450, 2476 (§1.2, §1.3)
CAP_POWER_W = 34.5  # busy at -lgc 0,2000: 33-36 W (field reports)
PEAK_POWER_W = 64.5  # busy uncapped: 63-66 W
IDLE_POWER_W = 4.0  # idle 3-5 W (3W, 4W tables; 3.74 W, 5.30 W readings)

REASON_IDLE = 0x1
REASON_APP_CLOCKS = 0x2
REASON_SW_POWER_CAP = 0x4
REASONS_LAYOUT = (  # (label, bit, extra indent) as nvidia-smi -q prints them (§1.2)
    ("Idle", 0x1, 0),
    ("Applications Clocks Setting", 0x2, 0),
    ("SW Power Cap", 0x4, 0),
    ("HW Slowdown", 0x8, 0),
    ("HW Thermal Slowdown", 0x40, 4),
    ("HW Power Brake Slowdown", 0x80, 4),
    ("Sync Boost", 0x10, 0),
    ("SW Thermal Slowdown", 0x20, 0),
    ("Display Clock Setting", 0x100, 0),
)


def _busy_power(target_mhz: float) -> float:
    """Power at a busy clock: 34.5 W at 2000 MHz, 64.5 W at boost, linear-ish."""
    if target_mhz >= 2000:
        return CAP_POWER_W + (target_mhz - 2000) * (PEAK_POWER_W - CAP_POWER_W) / (BOOST_SM_MHZ - 2000)
    frac = max(0.0, (target_mhz - IDLE_SM_MHZ) / (2000 - IDLE_SM_MHZ))
    return IDLE_POWER_W + 2 + frac * (CAP_POWER_W - IDLE_POWER_W - 2)


def gpu_sample(state: State, now: float) -> GpuSample:
    """The GPU at time ``now``: busy whenever an engine holds memory.

    The jitter is a pure function of hostname and the whole second, so two
    reads within one second agree and tests are repeatable.
    """
    gpu = state["gpu"]
    host = state.get("hostname", "")
    sec = int(now)
    lock = gpu.get("clock_lock_mhz")
    lock_min, lock_max = (int(lock[0]), int(lock[1])) if lock else (0, gpu["max_sm_mhz"])
    busy = bool(state.get("engine_mem_gib"))
    base_temp = int(gpu.get("temp_c", 43))
    if busy:
        boost = BOOST_SM_MHZ - 60 + int(_jitter(host, sec, "sm") * 100)  # 2390..2489
        if lock and lock_max < boost:
            # a lock at/below the boost point holds; the driver reports a nearby
            # value (1976 for 2000, §1.5)
            sm = max(lock_min, lock_max - int(_jitter(host, sec, "lk") * 25))
            target = float(lock_max)
            reasons = REASON_APP_CLOCKS
        else:
            sm = boost
            target = float(BOOST_SM_MHZ)
            reasons = 0
        power = _busy_power(target) + (_jitter(host, sec, "pw") - 0.5) * 2.4
        temp = base_temp + 10 + int(power / 6)
        util = 94 + int(_jitter(host, sec, "ut") * 7)
        return GpuSample(True, sm, round(power, 2), temp, util, "P0", reasons)
    sm = IDLE_SM_MHZ
    if lock and lock_min > IDLE_SM_MHZ:
        sm = min(lock_min, lock_max)
    power = IDLE_POWER_W - 0.5 + _jitter(host, sec, "pw") * 1.4 + (sm - IDLE_SM_MHZ) * 0.004
    return GpuSample(False, sm, round(power, 2), base_temp, 0, "P8", REASON_IDLE)


def gpu_processes(state: State, names: Mapping[int, str] | None = None) -> list[GpuProcess]:
    """GPU compute processes from state["engine_mem_gib"].

    ``names`` maps live pids to process names (main() reads /proc); pids
    missing from it are dead and not listed. None lists every pid as
    ``VLLM::EngineCore`` (handy for tests).
    """
    out = []
    for pid_s, gib in sorted(state.get("engine_mem_gib", {}).items(), key=lambda kv: int(kv[0])):
        pid = int(pid_s)
        if names is None:
            name = "VLLM::EngineCore"
        elif pid in names:
            name = names[pid]
        else:
            continue
        out.append(GpuProcess(pid=pid, name=name, used_mib=int(float(gib) * 1024)))
    return out


# --------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------

_SMI_RULE = "+" + "-" * 89 + "+"
_SMI_GRID = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


def _smi_timestamp(now: float) -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now))


def _proc_name_cell(name: str) -> str:
    return name if len(name) <= 32 else "..." + name[-29:]


def render_smi_table(
    state: State, now: float, processes: Sequence[GpuProcess], sample: GpuSample | None = None
) -> str:
    """The default ``nvidia-smi`` table, GB10 layout (§1.1)."""
    gpu = state["gpu"]
    s = sample or gpu_sample(state, now)
    ver = gpu["driver"]
    lines = [
        _smi_timestamp(now) + " " * 7,  # nvidia-smi pads the date line with spaces
        _SMI_RULE,
        f"| NVIDIA-SMI {ver:<23}Driver Version: {ver:<15}CUDA Version: {gpu['cuda']:<9}|",
        _SMI_GRID,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
        f"|{0:>4}  {gpu['name'][:30]:<31}{'On':<3} |{gpu['bus_id']:>19} {'Off':>3} |{'N/A':>21} |",
        f"| {'N/A':>3}  {str(s.temp_c) + 'C':>4}   {s.pstate:>3}{str(round(s.power_w)) + 'W':>16} / {'N/A':>4}  "
        f"| {'Not Supported':<23}|{str(s.util_pct) + '%':>8}{'Default':>13} |",
        f"|{'':41}|{'':24}|{'N/A':>21} |",
        _SMI_GRID,
        "",
        _SMI_RULE,
        "|" + " Processes:".ljust(89) + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    if processes:
        for p in processes:
            lines.append(
                f"|{0:>5}   {'N/A':<3}  {'N/A':<3}  {p.pid:>14}{p.type:>7}   "
                f"{_proc_name_cell(p.name):<32}{str(p.used_mib) + 'MiB':>14} |"
            )
    else:
        lines.append("|" + "  No running processes found".ljust(89) + "|")
    lines.append(_SMI_RULE)
    return "\n".join(lines) + "\n"


def _mhz(v: int) -> tuple[str, str]:
    return (str(v), f"{v} MHz")


_NA = ("[N/A]", "[N/A]")


def _query_fields(state: State, now: float) -> dict[str, tuple[str, tuple[str, ...], tuple[str, str]]]:
    """Canonical query-gpu field -> (header unit suffix, aliases, (nounits value, units value))."""
    gpu = state["gpu"]
    s = gpu_sample(state, now)
    app = gpu["default_app_mhz"]
    mx = gpu["max_sm_mhz"]
    host = state.get("hostname", "")
    uuid_hex = "%08x" % zlib.crc32(host.encode())
    uuid = f"GPU-{uuid_hex}-5a1e-{uuid_hex[:4]}-b10c-{uuid_hex}{uuid_hex[:4]}"
    # value is (nounits form, units form)
    table: dict[str, tuple[str, tuple[str, ...], tuple[str, str]]] = {
        "timestamp": ("", (), (time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + ".%03d" % int(now * 1000 % 1000),) * 2),
        "driver_version": ("", (), (gpu["driver"],) * 2),
        "count": ("", (), ("1", "1")),
        "name": ("", ("gpu_name",), (gpu["name"],) * 2),
        "index": ("", (), ("0", "0")),
        "pci.bus_id": ("", ("gpu_bus_id",), (gpu["bus_id"],) * 2),
        "uuid": ("", ("gpu_uuid",), (uuid, uuid)),
        "compute_cap": ("", (), (gpu["compute_cap"],) * 2),
        "persistence_mode": ("", (), ("Enabled", "Enabled")),
        "compute_mode": ("", (), ("Default", "Default")),
        "pstate": ("", (), (s.pstate, s.pstate)),
        "fan.speed": (" [%]", (), ("[N/A]", "[N/A]")),
        "temperature.gpu": ("", (), (str(s.temp_c),) * 2),
        "temperature.memory": ("", (), ("N/A", "N/A")),
        "utilization.gpu": (" [%]", (), (str(s.util_pct), f"{s.util_pct} %")),
        "utilization.memory": (" [%]", (), _NA),
        "memory.total": (" [MiB]", (), _NA),
        "memory.reserved": (" [MiB]", (), _NA),
        "memory.used": (" [MiB]", (), _NA),
        "memory.free": (" [MiB]", (), _NA),
        "power.draw": (" [W]", (), (f"{s.power_w:.2f}", f"{s.power_w:.2f} W")),
        "power.draw.average": (" [W]", (), (f"{s.power_w:.2f}", f"{s.power_w:.2f} W")),
        "power.draw.instant": (" [W]", (), (f"{s.power_w:.2f}", f"{s.power_w:.2f} W")),
        "power.limit": (" [W]", (), _NA),
        "enforced.power.limit": (" [W]", (), _NA),
        "power.default_limit": (" [W]", (), _NA),
        "power.min_limit": (" [W]", (), _NA),
        "power.max_limit": (" [W]", (), _NA),
        "clocks.current.graphics": (" [MHz]", ("clocks.gr",), _mhz(s.sm_mhz)),
        "clocks.current.sm": (" [MHz]", ("clocks.sm",), _mhz(s.sm_mhz)),
        "clocks.current.memory": (" [MHz]", ("clocks.mem",), _NA),
        "clocks.current.video": (" [MHz]", ("clocks.video",), _mhz(s.sm_mhz * 2 // 3)),
        "clocks.applications.graphics": (" [MHz]", ("clocks.applications.gr",), _mhz(app)),
        "clocks.applications.memory": (" [MHz]", ("clocks.applications.mem",), _NA),
        "clocks.default_applications.graphics": (" [MHz]", ("clocks.default_applications.gr",), _mhz(app)),
        "clocks.max.graphics": (" [MHz]", ("clocks.max.gr",), _mhz(mx)),
        "clocks.max.sm": (" [MHz]", (), _mhz(mx)),
        "clocks.max.memory": (" [MHz]", ("clocks.max.mem",), _NA),
        "clocks_event_reasons.active": ("", ("clocks_throttle_reasons.active",), (f"0x{s.reasons:016x}",) * 2),
        "clocks_event_reasons.supported": ("", ("clocks_throttle_reasons.supported",), ("0x00000000000001ff",) * 2),
    }
    return table


def _csv_query(
    fields_arg: str, lookup: Mapping[str, tuple[str, tuple[str, str]]]
) -> tuple[list[tuple[str, str, tuple[str, str]]], str | None]:
    """Resolve field names; return (resolved, error message or None)."""
    resolved = []
    for raw in [f.strip() for f in fields_arg.split(",") if f.strip()]:
        hit = lookup.get(raw)
        if hit is None:
            return [], f'Field "{raw}" is not a valid field to query.\n\n'
        resolved.append((hit[0], hit[1][0], hit[1][1]))
    return resolved, None


def _parse_format(fmt: str | None) -> tuple[bool, bool] | str:
    """--format value -> (header, units), or an error text."""
    if fmt is None:
        return "Please specify --format=csv for the query.\n"  # nvidia-smi refuses a bare query
    opts = [o.strip() for o in fmt.split(",")]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return f'Invalid format "{fmt}".\n'
    return ("noheader" not in opts, "nounits" not in opts)


def smi_query_gpu(state: State, fields_arg: str, fmt: str | None, now: float) -> ToolResult:
    """``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]`` (§1.3)."""
    parsed = _parse_format(fmt)
    if isinstance(parsed, str):
        return _result(parsed, rc=2)
    header, units = parsed
    table = _query_fields(state, now)
    lookup: dict[str, tuple[str, tuple[str, str]]] = {}
    for canon, (unit, aliases, value) in table.items():
        lookup[canon] = (canon + unit, value)
        for a in aliases:
            lookup[a] = (canon + unit, value)
    resolved, err = _csv_query(fields_arg, lookup)
    if err:
        return _result(err, rc=2)
    out = []
    if header:
        out.append(", ".join(h if units else h.split(" [")[0] for h, _, _ in resolved))
    out.append(", ".join(u if units else n for _, n, u in resolved))
    return _result("\n".join(out) + "\n")


def smi_query_apps(state: State, fields_arg: str, fmt: str | None, processes: Sequence[GpuProcess]) -> ToolResult:
    """``nvidia-smi --query-compute-apps=...``: header says used_gpu_memory (§1.4)."""
    parsed = _parse_format(fmt)
    if isinstance(parsed, str):
        return _result(parsed, rc=2)
    header, units = parsed
    gpu = state["gpu"]
    names = {
        "pid": "pid",
        "process_name": "process_name",
        "name": "process_name",
        "used_memory": "used_gpu_memory [MiB]",
        "used_gpu_memory": "used_gpu_memory [MiB]",
        "gpu_name": "gpu_name",
        "gpu_bus_id": "gpu_bus_id",
        "gpu_uuid": "gpu_uuid",
    }
    wanted = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for f in wanted:
        if f not in names:
            return _result(f'Field "{f}" is not a valid field to query.\n\n', rc=2)
    uuid = _query_fields(state, 0.0)["uuid"][2][0]
    out = []
    if header:
        out.append(", ".join(names[f] if units else names[f].split(" [")[0] for f in wanted))
    for p in processes:
        vals = {
            "pid": str(p.pid),
            "process_name": p.name,
            "name": p.name,
            "used_memory": f"{p.used_mib} MiB" if units else str(p.used_mib),
            "used_gpu_memory": f"{p.used_mib} MiB" if units else str(p.used_mib),
            "gpu_name": gpu["name"],
            "gpu_bus_id": gpu["bus_id"],
            "gpu_uuid": uuid,
        }
        out.append(", ".join(vals[f] for f in wanted))
    return _result("".join(line + "\n" for line in out))


def _kv(indent: int, key: str, value: object) -> str:
    # 580 drivers pad "indent + key" to 55 columns (§1.2)
    return f"{' ' * indent + key:<55}: {value}"


def _sec(indent: int, title: str) -> str:
    return " " * indent + title


QUERY_SECTIONS = ("CLOCK", "PERFORMANCE", "POWER", "TEMPERATURE", "MEMORY", "UTILIZATION", "COMPUTE", "PIDS")


def render_smi_q(
    state: State,
    now: float,
    processes: Sequence[GpuProcess],
    display: Sequence[str] = (),
    sample: GpuSample | None = None,
) -> str:
    """``nvidia-smi -q [-d SECTIONS]``. GB10 specifics: memory N/A, power limits N/A,
    ``Supported Clocks : N/A``. Section order follows the one real GB10 excerpt
    (Clocks ... Max Clocks, then Clocks Event Reasons)."""
    gpu = state["gpu"]
    s = sample or gpu_sample(state, now)
    want = {d.upper() for d in display}
    show_all = not want
    uptime_s = max(0.0, now - state["boot_time"]) if state.get("boot_time") else 0.0
    L = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", _smi_timestamp(now)),
        _kv(0, "Driver Version", gpu["driver"]),
        _kv(0, "CUDA Version", gpu["cuda"]),
        "",
        _kv(0, "Attached GPUs", 1),
        f"GPU {gpu['bus_id']}",
    ]
    if show_all:
        uuid = _query_fields(state, now)["uuid"][2][0]
        L += [
            _kv(4, "Product Name", gpu["name"]),
            _kv(4, "Product Brand", "NVIDIA"),
            _kv(4, "Product Architecture", "Blackwell"),
            _kv(4, "Display Mode", "Disabled"),
            _kv(4, "Display Attached", "No"),
            _kv(4, "Display Active", "Disabled"),
            _kv(4, "Persistence Mode", "Enabled"),
            _kv(4, "Addressing Mode", "ATS"),
            _sec(4, "MIG Mode"),
            _kv(8, "Current", "N/A"),
            _kv(8, "Pending", "N/A"),
            _kv(4, "Accounting Mode", "Disabled"),
            _kv(4, "Accounting Mode Buffer Size", 4000),
            _sec(4, "Driver Model"),
            _kv(8, "Current", "N/A"),
            _kv(8, "Pending", "N/A"),
            _kv(4, "Serial Number", "N/A"),
            _kv(4, "GPU UUID", uuid),
            _kv(4, "Minor Number", 0),
            _kv(4, "VBIOS Version", "9A.0B.25.00.00"),
            _kv(4, "MultiGPU Board", "No"),
            _kv(4, "GSP Firmware Version", gpu["driver"]),
            _sec(4, "PCI"),
            _kv(8, "Bus", "0x01"),
            _kv(8, "Device", "0x00"),
            _kv(8, "Domain", "0x000F"),
            _kv(8, "Bus Id", gpu["bus_id"]),
            _kv(4, "Fan Speed", "N/A"),
        ]
    if show_all or "MEMORY" in want:
        L += [
            _sec(4, "FB Memory Usage"),
            _kv(8, "Total", "N/A"),
            _kv(8, "Reserved", "N/A"),
            _kv(8, "Used", "N/A"),
            _kv(8, "Free", "N/A"),
            _sec(4, "BAR1 Memory Usage"),
            _kv(8, "Total", "N/A"),
            _kv(8, "Used", "N/A"),
            _kv(8, "Free", "N/A"),
        ]
    if show_all or "COMPUTE" in want:
        L.append(_kv(4, "Compute Mode", "Default"))
    if show_all or "UTILIZATION" in want:
        L += [
            _sec(4, "Utilization"),
            _kv(8, "GPU", f"{s.util_pct} %"),
            _kv(8, "Memory", "N/A"),
            _kv(8, "Encoder", "0 %"),
            _kv(8, "Decoder", "0 %"),
            _kv(8, "JPEG", "0 %"),
            _kv(8, "OFA", "0 %"),
        ]
    if show_all or "TEMPERATURE" in want:
        L += [
            _sec(4, "Temperature"),
            _kv(8, "GPU Current Temp", f"{s.temp_c} C"),
            _kv(8, "GPU T.Limit Temp", "50 C"),  # "an artificial 50°C T.Limit" (§1.2)
            _kv(8, "GPU Shutdown T.Limit Temp", "N/A"),
            _kv(8, "GPU Slowdown T.Limit Temp", "N/A"),
            _kv(8, "GPU Max Operating T.Limit Temp", "N/A"),
            _kv(8, "GPU Target Temperature", "N/A"),
            _kv(8, "Memory Current Temp", "N/A"),
            _kv(8, "Memory Max Operating T.Limit Temp", "N/A"),
        ]
    if show_all or "POWER" in want:
        L += [
            _sec(4, "GPU Power Readings"),
            _kv(8, "Average Power Draw", f"{s.power_w:.2f} W"),
            _kv(8, "Instantaneous Power Draw", f"{s.power_w:.2f} W"),
            _kv(8, "Current Power Limit", "N/A"),
            _kv(8, "Requested Power Limit", "N/A"),
            _kv(8, "Default Power Limit", "N/A"),
            _kv(8, "Min Power Limit", "N/A"),
            _kv(8, "Max Power Limit", "N/A"),
            _sec(4, "Module Power Readings"),
            _kv(8, "Average Power Draw", "N/A"),
            _kv(8, "Instantaneous Power Draw", "N/A"),
            _kv(8, "Current Power Limit", "N/A"),
            _kv(8, "Requested Power Limit", "N/A"),
            _kv(8, "Default Power Limit", "N/A"),
            _kv(8, "Min Power Limit", "N/A"),
            _kv(8, "Max Power Limit", "N/A"),
        ]
    if show_all or "CLOCK" in want:
        app = gpu["default_app_mhz"]
        mx = gpu["max_sm_mhz"]
        L += [
            _sec(4, "Clocks"),
            _kv(8, "Graphics", f"{s.sm_mhz} MHz"),
            _kv(8, "SM", f"{s.sm_mhz} MHz"),
            _kv(8, "Memory", "N/A"),
            _kv(8, "Video", f"{s.sm_mhz * 2 // 3} MHz"),
            _sec(4, "Applications Clocks"),
            _kv(8, "Graphics", f"{app} MHz"),
            _kv(8, "Memory", "N/A"),
            _sec(4, "Default Applications Clocks"),
            _kv(8, "Graphics", f"{app} MHz"),
            _kv(8, "Memory", "N/A"),
            _sec(4, "Deferred Clocks"),
            _kv(8, "Memory", "N/A"),
            _sec(4, "Max Clocks"),
            _kv(8, "Graphics", f"{mx} MHz"),
            _kv(8, "SM", f"{mx} MHz"),
            _kv(8, "Memory", "N/A"),
            _kv(8, "Video", f"{mx * 2 // 3} MHz"),
            _sec(4, "Max Customer Boost Clocks"),
            _kv(8, "Graphics", "N/A"),
            _sec(4, "Clock Policy"),
            _kv(8, "Auto Boost", "N/A"),
            _kv(8, "Auto Boost Default", "N/A"),
            _kv(4, "Supported Clocks", "N/A"),
        ]
    if show_all or "PERFORMANCE" in want:
        # cumulative event-reason counters: GB10s under load spend ~28% of uptime
        # SW-power-capped (33.9e9 us over 33 h, §1.2)
        sw_cap_us = int(uptime_s * 0.28e6)
        L += [
            _kv(4, "Performance State", s.pstate),
            _sec(4, "Clocks Event Reasons"),
        ]
        for label, bit, extra in REASONS_LAYOUT:
            L.append(_kv(8 + extra, label, "Active" if s.reasons & bit else "Not Active"))
        L += [
            _sec(4, "Clocks Event Reasons Counters"),
            _kv(8, "SW Power Capping", f"{sw_cap_us} us"),
            _kv(8, "Sync Boost", "0 us"),
            _kv(8, "SW Thermal Slowdown", "0 us"),
            _kv(8, "HW Thermal Slowdown", "0 us"),
            _kv(8, "HW Power Braking", "0 us"),
        ]
    if show_all or "PIDS" in want:
        if processes:
            L.append(_sec(4, "Processes"))
            for p in processes:
                L += [
                    _kv(8, "GPU instance ID", "N/A"),
                    _kv(8, "Compute instance ID", "N/A"),
                    _kv(8, "Process ID", p.pid),
                    _kv(12, "Type", p.type),
                    _kv(12, "Name", p.name),
                    _kv(12, "Used GPU Memory", f"{p.used_mib} MiB"),
                ]
        else:
            L.append(_kv(4, "Processes", "None"))
    return "\n".join(L) + "\n\n"


def _no_clock_permission(gpu: State) -> ToolResult:
    return _result(
        f"The current user does not have permission to change clocks for GPU {gpu['bus_id']}.\n"
        "Terminating early due to previous errors.\n",
        rc=4,
    )


def smi_lock_clocks(state: State, value: str, euid: int) -> ToolResult:
    """``nvidia-smi -lgc MIN,MAX`` (root only, exit 4 otherwise; §1.5)."""
    gpu = state["gpu"]
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or parts[0] < 0 or parts[0] > parts[1]:
        return _result(f'Invalid clock values "{value}" for --lock-gpu-clocks.\n', rc=2)
    if euid != 0:
        return _no_clock_permission(gpu)
    new = _copy_state(state)
    new["gpu"]["clock_lock_mhz"] = parts
    return _result(
        f'GPU clocks set to "(gpuClkMin {parts[0]}, gpuClkMax {parts[1]})" for GPU {gpu["bus_id"]}\nAll done.\n',
        new_state=new,
    )


def smi_reset_clocks(state: State, euid: int) -> ToolResult:
    if euid != 0:
        return _no_clock_permission(state["gpu"])
    new = _copy_state(state)
    new["gpu"]["clock_lock_mhz"] = None
    return _result("All done.\n", new_state=new)


def nvidia_smi(
    state: State,
    args: Sequence[str],
    *,
    now: float,
    euid: int,
    processes: Sequence[GpuProcess] | None = None,
) -> ToolResult:
    """Dispatch one ``nvidia-smi`` command line."""
    procs = list(processes) if processes is not None else gpu_processes(state)
    opts: dict[str, str] = {}
    display: list[str] = []
    flags: set[str] = set()
    valued = {
        "--query-gpu": "query_gpu",
        "--query-compute-apps": "query_apps",
        "--format": "fmt",
        "-lgc": "lgc",
        "--lock-gpu-clocks": "lgc",
        "-d": "display",
        "--display": "display",
        "-i": "id",
        "--id": "id",
    }
    plain = {"-q": "q", "--query": "q", "-rgc": "rgc", "--reset-gpu-clocks": "rgc", "-L": "L", "--list-gpus": "L"}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, val = a.partition("=")
        if a in plain:
            flags.add(plain[a])
            i += 1
            continue
        if name in valued:
            if not eq:
                if i + 1 >= len(args):
                    return _result(f'Option "{a}" requires a value.\n', rc=2)
                val = args[i + 1]
                i += 1
            slot = valued[name]
            if slot == "display":
                display += [d for d in val.split(",") if d]
            else:
                opts[slot] = val
            i += 1
            continue
        return _result("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n", rc=2)
    if opts.get("id", "0") not in ("0", state["gpu"]["bus_id"]):
        return _result(f"No devices were found matching the identifier {opts['id']}.\n", rc=6)
    lgc = opts.get("lgc")
    rgc = "rgc" in flags
    q = "q" in flags
    list_gpus = "L" in flags
    query_gpu = opts.get("query_gpu")
    query_apps = opts.get("query_apps")
    fmt = opts.get("fmt")
    if lgc is not None:
        return smi_lock_clocks(state, lgc, euid)
    if rgc:
        return smi_reset_clocks(state, euid)
    if query_gpu is not None:
        return smi_query_gpu(state, query_gpu, fmt, now)
    if query_apps is not None:
        return smi_query_apps(state, query_apps, fmt, procs)
    if list_gpus:
        uuid = _query_fields(state, now)["uuid"][2][0]
        return _result(f"GPU 0: {state['gpu']['name']} (UUID: {uuid})\n")
    if q or display:
        bad = [d for d in display if d.upper() not in QUERY_SECTIONS]
        if bad:
            return _result(f"Invalid display option: {bad[0]}\n", rc=2)
        return _result(render_smi_q(state, now, procs, display))
    return _result(render_smi_table(state, now, procs))


# --------------------------------------------------------------------------
# RDMA identity: ibdev2netdev, GID table, show_gids, sysfs
# --------------------------------------------------------------------------


def ibdev2netdev(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)`` per device (§2.1).

    A twin netdev missing from the namespace reads (Down): a real Spark always
    has all four.
    """
    out = []
    for dev, nd, _ in ROCE_DEVICES:
        up = nd in netdevs and netdevs[nd].link_up
        out.append(f"{dev} port 1 ==> {nd} ({'Up' if up else 'Down'})")
    return _result("\n".join(out) + "\n")


def netdev_mac(hostname: str, netdev: str) -> str:
    """A stable Spark-like MAC (4c:bb:47:xx:xx:xx) for a twin netdev."""
    h = zlib.crc32(f"{hostname}/{netdev}".encode()) & 0xFFFFFF
    b = SPARK_OUI + ((h >> 16) & 0xFF, (h >> 8) & 0xFF, h & 0xFF)
    return ":".join(f"{x:02x}" for x in b)


def _link_local_gid(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    groups = ["fe80", "0000", "0000", "0000"] + [f"{eui[k]:02x}{eui[k + 1]:02x}" for k in range(0, 8, 2)]
    return ":".join(groups)


def _ipv4_gid(ip: str) -> str:
    o = [int(x) for x in ip.split(".")]
    return f"0000:0000:0000:0000:0000:ffff:{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"


def gid_shift(state: State, netdev: str) -> int:
    """How far the RoCEv2 IPv4 GID drifted past index 3 (state["gid_index_shift"])."""
    return int(state.get("gid_index_shift", {}).get(netdev, 0))


def gid_table(state: State, dev: str, netdevs: Netdevs) -> dict[int, Gid]:
    """The populated GID slots of one RoCE device (port 1).

    0/1: link-local v1/v2; then per IPv4 address a v1 and a v2 entry (2/3 on a
    fresh box; the v2 entry of the first address lands ``gid_shift`` slots
    later, leaving a zero hole, as seen on drifted Sparks, §2.2/§2.4). An
    admin-down or missing netdev has no GIDs (the kernel drops them on
    NETDEV_DOWN).
    """
    nd = NETDEV_OF[dev]
    facts = netdevs.get(nd)
    if facts is None or not facts.admin_up:
        return {}
    ll = _link_local_gid(netdev_mac(state.get("hostname", ""), nd))
    table = {0: Gid(0, ll, "IB/RoCE v1", nd), 1: Gid(1, ll, "RoCE v2", nd)}
    shift = gid_shift(state, nd)

    def free_from(k: int) -> int:
        while k in table:
            k += 1
        return k

    for n, (ip, _plen) in enumerate(facts.ipv4):
        g = _ipv4_gid(ip)
        k1 = free_from(2)
        table[k1] = Gid(k1, g, "IB/RoCE v1", nd, ip)
        k2 = free_from(k1 + 1 + (shift if n == 0 else 0))
        table[k2] = Gid(k2, g, "RoCE v2", nd, ip)
    return {k: v for k, v in table.items() if k < GID_TABLE_LEN}


def roce_v2_ipv4_gid_index(state: State, dev: str, netdevs: Netdevs) -> int | None:
    """Index of the first RoCE v2 IPv4-mapped GID (what NCCL_IB_GID_INDEX should be)."""
    for k, g in sorted(gid_table(state, dev, netdevs).items()):
        if g.type == "RoCE v2" and g.ipv4:
            return k
    return None


def show_gids(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """The Mellanox ``show_gids`` script's output (§2.2), tabs and all."""
    devs = [d for d, _, _ in ROCE_DEVICES]
    if args:
        if args[0] not in devs:
            return _result("", f"ls: cannot access '/sys/class/infiniband/{args[0]}/ports/': No such file or directory\n", 2)
        devs = [args[0]]
    out = [
        "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV",
        "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---",
    ]
    n = 0
    for dev in devs:
        table = gid_table(state, dev, netdevs)
        for k in sorted(table, key=str):  # the script walks `ls gids/`: 0 1 10 100 ... 2
            g = table[k]
            ver = g.type[g.type.index("v") :]
            if g.ipv4:
                out.append(f"{dev}\t1\t{k}\t{g.gid}\t{g.ipv4}  \t{ver}\t{g.netdev}")
            else:
                out.append(f"{dev}\t1\t{k}\t{g.gid}\t\t\t{ver}\t{g.netdev}")
            n += 1
    out.append(f"n_gids_found={n}")
    return _result("\n".join(out) + "\n")


def _port_rate(state: State, nd: str, up: bool) -> str:
    if not up:
        return "40 Gb/sec (4X QDR)\n"  # what a down CX-7 port reads on a Spark (§2.4)
    speed = int(state["links"].get(nd, {}).get("speed_mbps", 200000))
    name = {200000: "4X HDR", 100000: "4X EDR", 50000: "2X HDR", 40000: "4X QDR", 25000: "1X EDR"}.get(speed, "4X HDR")
    return f"{speed // 1000} Gb/sec ({name})\n"


def render_sysfs_infiniband(state: State, netdevs: Netdevs) -> dict[str, str | None]:
    """Relative path -> content of ``class/infiniband/...`` (None = must not exist).

    Empty slots keep a zero ``gids/N`` but have no ``gid_attrs/{types,ndevs}/N``
    file: the real kernel fails those reads, and every Spark script reads
    them with ``2>/dev/null``.
    """
    files: dict[str, str | None] = {}
    for dev, nd, _ in ROCE_DEVICES:
        base = f"class/infiniband/{dev}/ports/1"
        table = gid_table(state, dev, netdevs)
        for k in range(GID_TABLE_LEN):
            g = table.get(k)
            files[f"{base}/gids/{k}"] = (g.gid if g else ZERO_GID) + "\n"
            files[f"{base}/gid_attrs/types/{k}"] = (g.type + "\n") if g else None
            files[f"{base}/gid_attrs/ndevs/{k}"] = (g.netdev + "\n") if g else None
        up = nd in netdevs and netdevs[nd].link_up
        files[f"{base}/rate"] = _port_rate(state, nd, up)
        files[f"{base}/state"] = "4: ACTIVE\n" if up else "1: DOWN\n"
        files[f"{base}/phys_state"] = "5: LinkUp\n" if up else "3: Disabled\n"
        files[f"{base}/link_layer"] = "Ethernet\n"
    return files


def write_sysfs_infiniband(root_dir: str | os.PathLike[str], state: State, netdevs: Netdevs) -> None:
    """Write the ``class/infiniband`` tree under ``root_dir`` (a sysfs_root, or a
    tmpfs to mount over /sys/class/infiniband: then pass its parent-of-parent).
    Rewrites in place; removes attrs of slots that became empty."""
    root = Path(root_dir)
    for rel, content in render_sysfs_infiniband(state, netdevs).items():
        p = root / rel
        if content is None:
            p.unlink(missing_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            if p.read_text() == content:
                continue
        except FileNotFoundError:
            pass
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, p)


# --------------------------------------------------------------------------
# ethtool, lspci
# --------------------------------------------------------------------------

CX7_LINK_MODES = (  # in ethtool link-mode bit order
    "1000baseKX/Full",
    "10000baseKR/Full",
    "40000baseKR4/Full",
    "40000baseCR4/Full",
    "40000baseSR4/Full",
    "40000baseLR4/Full",
    "25000baseCR/Full",
    "25000baseKR/Full",
    "25000baseSR/Full",
    "50000baseCR2/Full",
    "50000baseKR2/Full",
    "100000baseKR4/Full",
    "100000baseSR4/Full",
    "100000baseCR4/Full",
    "100000baseLR4_ER4/Full",
    "50000baseKR/Full",
    "50000baseSR/Full",
    "50000baseCR/Full",
    "50000baseLR_ER_FR/Full",
    "50000baseDR/Full",
    "100000baseKR2/Full",
    "100000baseSR2/Full",
    "100000baseCR2/Full",
    "100000baseLR2_ER2_FR2/Full",
    "100000baseDR2/Full",
    "200000baseKR4/Full",
    "200000baseSR4/Full",
    "200000baseLR4_ER4_FR4/Full",
    "200000baseDR4/Full",
    "200000baseCR4/Full",
)


def _modes(prefix: str, modes: Sequence[str]) -> list[str]:
    pad = " " * len(prefix)
    return [f"\t{prefix}{modes[0]}"] + [f"\t{pad}{m}" for m in modes[1:]]


def ethtool(state: State, args: Sequence[str], netdevs: Netdevs, *, euid: int) -> ToolResult:
    """``ethtool IFACE`` (full settings) and ``ethtool -i IFACE`` (§3.1)."""
    if not args:
        return _result("", "ethtool: bad command line argument(s)\nFor more information run ethtool -h\n", 1)
    if args[0] in ("-i", "--driver") and len(args) == 2:
        iface = args[1]
        if iface not in BDF_OF_NETDEV:
            return _result("", "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n", 1)
        return _result(
            "driver: mlx5_core\n"
            f"version: {state['kernel_release']}\n"
            "firmware-version: 28.45.4028 (NVD0000000087)\n"
            "expansion-rom-version: \n"
            f"bus-info: {BDF_OF_NETDEV[iface]}\n"
            "supports-statistics: yes\n"
            "supports-test: yes\n"
            "supports-eeprom-access: no\n"
            "supports-register-dump: no\n"
            "supports-priv-flags: yes\n"
        )
    if len(args) != 1 or args[0].startswith("-"):
        return ToolResult("", "", 0, exec_argv=("ethtool", *args))
    iface = args[0]
    facts = netdevs.get(iface)
    if facts is None and iface not in BDF_OF_NETDEV:
        return _result("", "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n", 1)
    up = facts is not None and facts.link_up
    link = state["links"].get(iface, {})
    L = [f"Settings for {iface}:", "\tSupported ports: [ Backplane ]"]
    L += _modes("Supported link modes:   ", CX7_LINK_MODES)
    L += [
        "\tSupported pause frame use: Symmetric",
        "\tSupports auto-negotiation: Yes",
        "\tSupported FEC modes: None\t RS\t BASER",
    ]
    L += _modes("Advertised link modes:  ", CX7_LINK_MODES)
    L += [
        "\tAdvertised pause frame use: Symmetric",
        "\tAdvertised auto-negotiation: Yes",
        "\tAdvertised FEC modes: RS",
    ]
    if up:
        L += [f"\tSpeed: {int(link.get('speed_mbps', 200000))}Mb/s", "\tLanes: 4", "\tDuplex: Full"]
    else:
        L += ["\tSpeed: Unknown!", "\tDuplex: Unknown! (255)"]
    L += ["\tAuto-negotiation: on", "\tPort: Direct Attach Copper", "\tPHYAD: 0", "\tTransceiver: internal"]
    err = ""
    if euid == 0:
        L += ["\tSupports Wake-on: d", "\tWake-on: d"]
    else:
        err = "netlink error: Operation not permitted\n"  # WOL_GET needs CAP_NET_ADMIN
    L += ["\tCurrent message level: 0x00000004 (4)", "\t\t\t       link"]
    L.append(f"\tLink detected: {'yes' if up else 'no'}")
    return _result("\n".join(L) + "\n", err)


LSPCI_NAME = "Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]"


def _gts(v: float) -> str:
    return f"{int(v)}GT/s" if float(v).is_integer() else f"{v:g}GT/s"


def _pcie_of(state: State, bdf: str) -> tuple[float, int]:
    pc = state.get("pcie", {})
    over = pc.get("functions", {}).get(bdf, {})
    return float(over.get("gen_gts", pc.get("gen_gts", 32))), int(over.get("width", pc.get("width", 4)))


def _bdf_match(pattern: str, bdf: str) -> bool:
    """lspci -s [[[domain:]bus:]slot][.func] matching."""
    dom, bus, rest = bdf.split(":")
    slot, func = rest.split(".")
    p = pattern
    pfunc = None
    if "." in p:
        p, pfunc = p.rsplit(".", 1)
    parts = p.split(":") if p else []
    want = {"func": pfunc}
    if len(parts) == 3:
        want.update(dom=parts[0], bus=parts[1], slot=parts[2])
    elif len(parts) == 2:
        want.update(bus=parts[0], slot=parts[1])
    elif len(parts) == 1:
        want.update(slot=parts[0])
    have = {"dom": dom, "bus": bus, "slot": slot, "func": func}
    for k, v in want.items():
        if v in (None, "", "*"):
            continue
        try:
            if int(v, 16) != int(have[k], 16):
                return False
        except ValueError:
            return False
    return True


def _lspci_block(state: State, bdf: str, vvv: bool, euid: int) -> list[str]:
    gts, width = _pcie_of(state, bdf)
    func = int(bdf[-1])
    L = [
        f"{bdf} {LSPCI_NAME}",
        "\tSubsystem: Mellanox Technologies Device 0026",
        "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+",
        "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-",
        "\tLatency: 0",
        "\tInterrupt: pin A routed to IRQ 255",
        f"\tRegion 0: Memory at {0x1800000000 + int(bdf[:4], 16) * 0x10000000 + func * 0x2000000:x}"
        " (64-bit, prefetchable) [size=32M]",
    ]
    if euid != 0:
        # unprivileged lspci cannot read extended config space: no LnkSta
        return L + ["\tCapabilities: <access denied>", "\tKernel driver in use: mlx5_core", "\tKernel modules: mlx5_core", ""]
    speed = _gts(gts) + ("" if gts >= 32 else " (downgraded)")
    wid = f"x{width}" + ("" if width >= 4 else " (downgraded)")
    L += [
        "\tCapabilities: [60] Express (v2) Endpoint, MSI 00",
        "\t\tDevCap:\tMaxPayload 512 bytes, PhantFunc 0, Latency L0s unlimited, L1 unlimited",
        "\t\t\tExtTag+ AttnBtn- AttnInd- PwrInd- RBE+ FLReset+ SlotPowerLimit 0W",
        "\t\tDevCtl:\tCorrErr+ NonFatalErr+ FatalErr+ UnsupReq+",
        "\t\t\tRlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+ FLReset-",
        "\t\t\tMaxPayload 256 bytes, MaxReadReq 4096 bytes",
        "\t\tDevSta:\tCorrErr- NonFatalErr- FatalErr- UnsupReq- AuxPwr- TransPend-",
        "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x4, ASPM not supported",
        "\t\t\tClockPM- Surprise- LLActRep- BwNot- ASPMOptComp+",
        "\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+",
        "\t\t\tExtSynch- ClockPM- AutWidDis- BWInt- AutBWInt-",
        f"\t\tLnkSta:\tSpeed {speed}, Width {wid}",
        "\t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-",
        "\t\tDevCap2: Completion Timeout: Range ABC, TimeoutDis+ NROPrPrP- LTR-",
        "\t\tLnkCtl2: Target Link Speed: 32GT/s, EnterCompliance- SpeedDis-",
        "\tCapabilities: [100 v1] Advanced Error Reporting",
        "\tKernel driver in use: mlx5_core",
        "\tKernel modules: mlx5_core",
        "",
    ]
    if vvv:
        L.insert(-3, "\tCapabilities: [1c0 v1] Secondary PCI Express")
    return L


def lspci(state: State, args: Sequence[str], *, euid: int) -> ToolResult:
    """``lspci [-v|-vv|-vvv] [-s BDF] [-D]`` for the four CX-7 functions (§3.4)."""
    verbose = 0
    sel: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-s":
            sel = args[i + 1] if i + 1 < len(args) else ""
            i += 2
            continue
        if a.startswith("-s") and len(a) > 2:
            sel = a[2:]
        elif a.startswith("-v") and set(a[1:]) == {"v"}:
            verbose = max(verbose, len(a) - 1)
        elif a in ("-D", "-nn", "-n", "-k"):
            pass
        else:
            return _result("", f"lspci: invalid option -- '{a.lstrip('-')[:1]}'\n", 2)
        i += 1
    bdfs = [bdf for _, _, bdf in ROCE_DEVICES if sel is None or _bdf_match(sel, bdf)]
    if verbose < 2:
        return _result("".join(f"{b} {LSPCI_NAME}\n" for b in bdfs))
    out: list[str] = []
    for b in bdfs:
        out += _lspci_block(state, b, verbose >= 3, euid)
    return _result("".join(line + "\n" for line in out))


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
    free = max(0, avail - cached - buffers - sreclaim // 2)
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


# --------------------------------------------------------------------------
# ib_write_bw
# --------------------------------------------------------------------------

_IB_LINE = "-" * 87
_IB_MTUS = (4096, 2048, 1024, 512, 256)


def _roce_mtu(netdev_mtu: int) -> int:
    # active RoCE MTU: largest IB MTU that fits the netdev MTU minus headers
    return next((m for m in _IB_MTUS if m + 100 <= netdev_mtu), 256)


def _gid_bytes(ip: str) -> str:
    return ":".join(["00"] * 10 + ["255", "255"] + [f"{int(o):02d}" for o in ip.split(".")])


def rail_bandwidth_gbps(state: State, dev: str) -> float:
    """Model BW average of one twin: healthy 92-111 Gb/s, stale ~13.4 Gb/s,
    scaled down with the link speed and capped by the PCIe link."""
    nd = NETDEV_OF[dev]
    link = state["links"].get(nd, {})
    host = state.get("hostname", "")
    if link.get("stale"):
        return round(13.35 + _jitter(host, dev, "stale") * 0.2, 2)  # 13.41 / 13.49 seen (§4.1)
    bw = 92.5 + _jitter(host, dev, "bw") * 18.0
    bw *= min(1.0, int(link.get("speed_mbps", 200000)) / 200000)
    gts, width = _pcie_of(state, BDF_OF_NETDEV[nd])
    enc = 128 / 130 if gts >= 8 else 0.8
    bw = min(bw, gts * width * enc * 0.9)
    return round(bw, 2)


def ib_write_bw(state: State, args: Sequence[str], netdevs: Netdevs) -> ToolResult:
    """Client side of ``ib_write_bw ... --report_gbits SERVER`` as a model: no
    traffic, the report layout of perftest 4.5/6.x (§4.1). Without SERVER it
    prints the server banner and returns (no server side is simulated)."""
    dev = ROCE_DEVICES[0][0]
    gid_index: int | None = None
    qps, size, iters, duration = 1, 65536, 5000, None
    rdma_cm = infinite = gbits = False
    link_type = "Ethernet"
    server = None
    i = 0
    with_value = {"-d", "--ib-dev", "-i", "--ib-port", "-p", "--port", "-x", "--gid-index", "-q", "--qp",
                  "-s", "--size", "-n", "--iters", "-D", "--duration", "-m", "--mtu", "--force-link", "-t", "--tx-depth"}
    while i < len(args):
        a = args[i]
        v = args[i + 1] if a in with_value and i + 1 < len(args) else None
        if a in with_value and v is None:
            return _result("", f" Option {a} requires an argument\n", 1)
        try:
            if a in ("-d", "--ib-dev"):
                dev = v  # type: ignore[assignment]
            elif a in ("-x", "--gid-index"):
                gid_index = int(v)  # type: ignore[arg-type]
            elif a in ("-q", "--qp"):
                qps = int(v)  # type: ignore[arg-type]
            elif a in ("-s", "--size"):
                size = int(v)  # type: ignore[arg-type]
            elif a in ("-n", "--iters"):
                iters = int(v)  # type: ignore[arg-type]
            elif a in ("-D", "--duration"):
                duration = int(v)  # type: ignore[arg-type]
            elif a == "--force-link":
                link_type = "IB" if v == "IB" else "Ethernet"
        except ValueError:
            return _result("", f" Invalid value for {a}: {v}\n", 1)
        if a in with_value:
            i += 2
            continue
        if a == "--report_gbits":
            gbits = True
        elif a in ("-R", "--rdma_cm"):
            rdma_cm = True
        elif a == "--run_infinitely":
            infinite = True
        elif a in ("-F", "--CPU-freq", "-a", "--all", "-b", "--bidirectional"):
            pass
        elif a.startswith("-"):
            return _result("", f"ib_write_bw: unrecognized option '{a}'\n", 1)
        else:
            server = a
        i += 1
    if dev not in NETDEV_OF:
        return _result("", f" IB device {dev} not found\n Unable to find the Infiniband/RoCE device\n", 1)
    nd = NETDEV_OF[dev]
    facts = netdevs.get(nd)
    if facts is None or not facts.link_up:
        return _result("", " Port number 1 state is Down\n Couldn't set the link layer\n Couldn't get context for the device\n", 1)
    table = gid_table(state, dev, netdevs)
    auto = roce_v2_ipv4_gid_index(state, dev, netdevs)
    idx = gid_index if gid_index is not None else (auto if auto is not None else 0)
    head = []
    if infinite or duration:
        head.append("  WARNING: BW peak won't be measured in this run.")
    if server is None:
        return _result(
            "\n************************************\n* Waiting for client to connect... *\n************************************\n"
        )
    head += [
        _IB_LINE,
        "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {dev}",
        f" Number of qps   : {qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON",
        " ibv_wr* API     : ON",
        " TX depth        : 128",
        " CQ Moderation   : 1",
        f" Mtu             : {_roce_mtu(facts.mtu)}[B]",
        f" Link type       : {link_type}",
        *([f" GID index       : {idx}"] if link_type == "Ethernet" else []),
        " Max inline data : 0[B]",
        f" rdma_cm QPs\t : {'ON' if rdma_cm else 'OFF'}",
        f" Data ex. method : {'rdma_cm' if rdma_cm else 'Ethernet'}",
        _IB_LINE,
    ]
    g = table.get(idx)
    if g is None:
        return _result(
            "\n".join(head) + "\n",
            f" Failed to modify QP {0x129 + 0} to RTR\n Unable to Connect the HCA's through the link\n",
            1,
        )
    host = state.get("hostname", "")
    for q in range(qps):
        psn = zlib.crc32(f"{host}{dev}{q}".encode()) & 0xFFFFFF
        if rdma_cm:
            head.append(f" local address: LID 0000 QPN {0x129 + q:#06x} PSN {psn:#x}")
        else:
            head.append(f" local address: LID 0000 QPN {0x129 + q:#06x} PSN {psn:#x} RKey 0x184300 VAddr 0x00ec99bedad000")
            head.append(" GID: " + (_gid_bytes(g.ipv4) if g.ipv4 else ":".join(["00"] * 16)))
    rpsn = zlib.crc32(f"{server}{dev}".encode()) & 0xFFFFFF
    for q in range(qps):
        if rdma_cm:
            head.append(f" remote address: LID 0000 QPN {0x129 + q:#06x} PSN {rpsn + q:#x}")
        else:
            head.append(f" remote address: LID 0000 QPN {0x129 + q:#06x} PSN {rpsn + q:#x} RKey 0x184300 VAddr 0x00ffeec955d000")
            remote = _gid_bytes(server) if server.count(".") == 3 else ":".join(["00"] * 16)
            head.append(" GID: " + remote)
    head.append(_IB_LINE)
    if not (g.type == "RoCE v2" and g.ipv4):
        # a wrong -x: header, no result row, exit 0 (§4.1 known failure mode)
        return _result("\n".join(head) + "\n")
    unit = "Gb/sec" if gbits else "MB/sec"
    head.append(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    bw = rail_bandwidth_gbps(state, dev)
    rate_mpps = bw * 1e9 / 8 / size / 1e6
    n = int(rate_mpps * 1e6 * duration) if duration else iters
    peak = 0.0 if (infinite or duration) else bw + 0.01
    # without --report_gbits perftest reports 2^20 bytes/s ("MB/sec", "MiB/sec" from
    # 24.07): format_factor 0x100000 in print_report_bw (perftest src/perftest_parameters.c)
    mib = 1e9 / 8 / 0x100000
    shown_bw, shown_peak = (bw, peak) if gbits else (bw * mib, peak * mib)
    rows = 2 if infinite else 1
    for _ in range(rows):
        head.append(f" {size:<7}    {n:<7}          {shown_peak:<7.2f}            {shown_bw:<7.2f}\t\t   {rate_mpps:<7.6f}")
    if not infinite:
        head.append(_IB_LINE)
    return _result("\n".join(head) + "\n")


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
        base = Path(sys_class_net) / n
        try:
            oper = (base / "operstate").read_text().strip()
            mtu = int((base / "mtu").read_text().strip())
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
            argv0 = (Path(proc) / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            name = argv0.split(" ")[0] if argv0 else (Path(proc) / str(pid) / "comm").read_text().strip()
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
    """Write one ``#!/bin/sh`` wrapper per tool into ``bin_dir``.

    ``state_path`` bakes in a default ``SPARKCTL_SIM_STATE`` (sshd drops the
    caller's environment); ``package_root`` (default: the directory holding
    this ``sparkctl`` package) is put on PYTHONPATH so the wrappers work
    without an installed sparkctl.
    """
    d = Path(bin_dir)
    d.mkdir(parents=True, exist_ok=True)
    root = Path(package_root) if package_root else Path(__file__).resolve().parents[1]
    pre = f"PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
    if state_path is not None:
        sp = shlex.quote(str(Path(state_path).resolve()))
        pre += f"{STATE_ENV}=${{{STATE_ENV}:-{sp}}}\nexport {STATE_ENV}\n"
    written = []
    for tool in TOOLS:
        p = d / tool
        p.write_text(
            f"#!/bin/sh\n{pre}exec {shlex.quote(str(Path(python).absolute()))} -m sparkctl_sim.shims {shlex.quote(tool)} \"$@\"\n"
        )
        p.chmod(0o755)
        written.append(p)
    return written


_MUTATORS = {
    "nvidia-smi": lambda a: any(x in ("-rgc", "--reset-gpu-clocks") or x.startswith(("-lgc", "--lock-gpu-clocks")) for x in a),
    "apt-mark": lambda a: bool(a) and a[0] in ("hold", "unhold"),
}


def run_tool(tool: str, state: State, args: Sequence[str], *, now: float, euid: int,
             netdevs: Netdevs | None = None, processes: Sequence[GpuProcess] | None = None) -> ToolResult:
    """Pure dispatch by tool name (netdevs default to none present)."""
    nds = netdevs or {}
    if tool == "nvidia-smi":
        return nvidia_smi(state, args, now=now, euid=euid, processes=processes)
    if tool == "ibdev2netdev":
        return ibdev2netdev(state, args, nds)
    if tool == "show_gids":
        return show_gids(state, args, nds)
    if tool == "ethtool":
        return ethtool(state, args, nds, euid=euid)
    if tool == "lspci":
        return lspci(state, args, euid=euid)
    if tool == "uname":
        return uname(state, args)
    if tool == "getconf":
        return getconf(state, args)
    if tool == "apt-mark":
        return apt_mark(state, args, euid=euid)
    if tool == "ib_write_bw":
        return ib_write_bw(state, args, nds)
    return _result("", f"sparkctl shims: unknown tool {tool!r}\n", 127)


def filter_ps(text: str, keep_pid: Callable[[int], bool]) -> str:
    """Keep the header and the rows whose PID column ``keep_pid`` accepts. Pure."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    header = lines[0].split()
    if "PID" not in header:
        return text
    col = header.index("PID")
    out = [lines[0]]
    for line in lines[1:]:
        parts = line.split()
        if len(parts) > col and parts[col].isdigit() and keep_pid(int(parts[col])):
            out.append(line)
    return "".join(out)


def ps_this_node(args: Sequence[str]) -> int:
    """``ps`` as a real node sees it. SIMULATION: the simulated nodes share one
    PID namespace, so rows of processes in another network namespace (another
    node, or the host) are dropped."""
    import subprocess

    real = next((p for p in ("/bin/ps", "/usr/bin/ps") if os.access(p, os.X_OK)), None)
    if real is None:
        sys.stderr.write("ps: not found\n")
        return 127
    r = subprocess.run([real, *args], capture_output=True, text=True)
    try:
        me = os.readlink("/proc/self/ns/net")
    except OSError:
        me = None

    def mine(pid: int) -> bool:
        try:
            return me is None or os.readlink(f"/proc/{pid}/ns/net") == me
        except OSError:
            return False

    sys.stdout.write(filter_ps(r.stdout, mine))
    sys.stderr.write(r.stderr)
    try:  # dead engines' memory: settled whenever someone looks at the processes
        nodestate.settle_file(os.environ.get(STATE_ENV))
    except (OSError, ValueError):
        pass
    return r.returncode


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m sparkctl_sim.shims TOOL ARGS...``: the only impure entry."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TOOLS:
        sys.stderr.write(f"usage: python3 -m sparkctl_sim.shims {{{','.join(TOOLS)}}} ARGS...\n")
        return 2
    tool, args = argv[0], argv[1:]
    if tool == "ps":
        return ps_this_node(args)
    path = os.environ.get(STATE_ENV)
    if not path:
        sys.stderr.write(f"{tool}: {STATE_ENV} is not set (simulated node state file)\n")
        return 127
    needs_net = tool in ("ibdev2netdev", "show_gids", "ethtool", "ib_write_bw")
    netdevs = read_netdevs() if needs_net else {}
    euid = os.geteuid()
    now = time.time()
    if tool in _MUTATORS and _MUTATORS[tool](args):
        with nodestate.edit(path) as state:
            res = run_tool(tool, state, args, now=now, euid=euid, netdevs=netdevs)
            if res.new_state is not None:
                state.clear()
                state.update(res.new_state)
    else:
        state = nodestate.load(path)
        procs = None
        if tool == "nvidia-smi":
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


if __name__ == "__main__":
    raise SystemExit(main())
