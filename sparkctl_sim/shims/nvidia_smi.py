"""``nvidia-smi`` as a GB10 prints it: the default table, ``--query-gpu`` and
``--query-compute-apps`` CSV, ``-q`` sections, ``-lgc``/``-rgc`` clock locks
(formats: docs/reference/spark-facts.md §1; verbatim captures in tests/fixtures/spark/)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence

from sparkctl_sim.shims.common import (
    GpuProcess,
    GpuSample,
    State,
    ToolResult,
    _copy_state,
    _result,
)
from sparkctl_sim.shims.gb10 import REASONS_LAYOUT, gpu_processes, gpu_sample

# --------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------

_SMI_RULE = "+" + "-" * 89 + "+"
_SMI_GRID = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


# the share of uptime a GB10 under load spends SW-power-capped, in percent (render_smi_q's counter;
# shims/rendered.py computes the same counter in sh from it)
SW_CAP_PCT = 28


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
        sw_cap_us = int(uptime_s * SW_CAP_PCT * 1e4)
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


