"""CPU pressure over a measurement window: was the machine, or were we, kept off a CPU.

Owns reading Linux PSI (``/proc/pressure/cpu`` "some"), the run-queue wait
of given processes (``/proc/PID/task/*/schedstat``), the machine's busy CPU
time (``/proc/stat``) and given processes' CPU time (``/proc/PID/stat``), and
:class:`PressureMeter`, which takes all four around a window and says whether
it was **starved** (:meth:`Pressure.starved`: PSI above a limit while *other*
processes used the CPU), so a figure measured then is named as the machine's,
not the client's (docs/bench-metrics.md, "CPU starvation").

Must not: print, or decide what a starved figure means for a report (the
self-test and the tools do).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

# Above this CPU pressure (share of a cell's wall time in which some runnable task
# waited for a CPU) other load owns the timing: the client and the server alone
# stay well under it on 2 cores (measured: see docs/bench-metrics.md).
CONTENDED_PSI_PCT = 10.0


def cpu_pressure_total_s() -> float | None:
    """Linux PSI: total seconds some runnable task waited for a CPU (None where PSI is missing)."""
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_delay_s(pids: Sequence[int]) -> float:
    """Seconds the threads of ``pids`` have waited on a run queue (``/proc/PID/task/*/schedstat``, field 2).

    PSI says the machine was contended; this says whether *these* processes
    were the ones kept off a CPU. 0.0 where schedstat is missing.
    """
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def cpu_busy_s() -> float | None:
    """Seconds of CPU the whole machine has spent busy, all cores (``/proc/stat``; None where missing)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user + nice + system + steal: irq/softirq left out (loopback traffic of the measured
    # processes is handled there and charged to no process); steal is a hypervisor's other guests
    busy = v[0] + v[1] + v[2] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user + system, all threads) the processes ``pids`` have used (``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


# Others' CPU (the machine's busy time not used by the measured processes) above
# this many cores: the pressure is not (only) our own (see Pressure.starved).
OTHER_LOAD_CORES = 0.25


@dataclass(frozen=True)
class Pressure:
    """CPU pressure over a window: PSI "some" (% of wall time some task waited for a CPU), our own wait,
    and the CPU others used meanwhile."""

    psi_some_pct: float | None
    own_wait_pct: float
    """Run-queue wait of the measured processes, summed, as % of the window (per process, not per core)."""
    wall_s: float
    other_cores: float | None = None
    """CPU used by processes other than the measured ones, in cores (machine busy - ours) / wall."""

    def starved(self, psi_limit_pct: float, other_limit_cores: float = OTHER_LOAD_CORES) -> bool:
        """PSI above the limit while other processes used more than ``other_limit_cores`` of CPU.

        PSI alone cannot tell a machine busy with other work from the measured
        processes saturating it themselves (then the figure is the capacity,
        not an artefact); the machine's busy time minus ours can.
        """
        if self.psi_some_pct is None or self.psi_some_pct <= psi_limit_pct:
            return False
        return self.other_cores is None or self.other_cores > other_limit_cores


class PressureMeter:
    """``with PressureMeter(pids) as m: ...``; then ``m.result`` (:class:`Pressure`)."""

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = list(pids) or [os.getpid()]
        self.result = Pressure(None, 0.0, 0.0)

    def __enter__(self) -> PressureMeter:
        self._b0, self._o0 = cpu_busy_s(), process_cpu_s(self.pids)
        self._p0, self._d0, self._t0 = cpu_pressure_total_s(), run_delay_s(self.pids), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        p1, d1, t1 = cpu_pressure_total_s(), run_delay_s(self.pids), time.perf_counter()
        b1, o1 = cpu_busy_s(), process_cpu_s(self.pids)
        wall = max(t1 - self._t0, 1e-9)
        psi = None if p1 is None or self._p0 is None else (p1 - self._p0) / wall * 100.0
        other = None if b1 is None or self._b0 is None else max((b1 - self._b0) - (o1 - self._o0), 0.0) / wall
        self.result = Pressure(psi, (d1 - self._d0) / wall * 100.0, wall, other)
