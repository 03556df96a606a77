"""The GB10 clock/power model that ``nvidia-smi`` reports (idle/boost clocks,
power under a clock cap, throttle reasons), from readings on real Sparks
(docs/reference/spark-facts.md §1)."""

from __future__ import annotations

from collections.abc import Mapping

from sparkctl_sim.shims.common import GpuProcess, GpuSample, State, _jitter

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


