"""The simulated node's ``earlyoom``: Debian's earlyoom 1.7, as a stand-in that acts on the node only.

SIMULATION ONLY. Why not the real binary: the simulated nodes share this
machine's PID namespace, and earlyoom picks its victim among every process in
/proc, so the real one on a node would kill this machine's processes (the test
runner is a ``python3`` that sparkctl's ``--prefer`` matches). A PID namespace of
its own (``unshare -p --fork --mount-proc``, root mode only) does not help: earlyoom
would see itself alone, none of the node's engines. Moving each node's whole process
tree (sshd, its sessions, the engines) into one would let it see them, but not their
memory: a simulated engine holds none (its GiB are the state file's ``engine_mem_gib``),
so the kernel's oom_score and VmRSS that earlyoom ranks by (kill.c) would rank a ~30 MB
Python engine beside sshd and bash, and its choice would measure this machine, not the
node; and the pids in the state file, which the host-side tools (``sim``'s kill_engines,
nodestate.settle) read, would be another namespace's. tests/test_earlyoom_sim.py judges the
stand-in by the real binary instead (``--dryrun``: the same arguments read into the same
limits, the same refusals). This stand-in
follows earlyoom v1.7's source (github.com/rfjakob/earlyoom, tag v1.7):

* arguments (main.c, getopt_long "m:s:M:S:kingN:dvr:ph" plus --prefer, --avoid,
  --dryrun, --help): ``-m/-s PERCENT[,KILL]``, ``-M/-S SIZE[,KILL]`` in KiB
  turned into percent of MemTotal (the lower of -m and -M when both), KILL
  defaults to TERM/2 (msg.c parse_term_kill_tuple), the same fatal exit codes
  (13 bad option, 14 -r, 15 -m/-M, 16 -s/-S, 6 bad regex) and start-up lines;
* the poll loop (main.c poll_loop, lowmem_sig, sleep_time_ms): memory AND swap at
  or below the limits (with no swap, swap free counts as 0 %: meminfo.c), a
  sleep of 100 to 1000 ms from the headroom, ``-r`` reports on stdout;
* the victim (kill.c is_larger): the highest badness, oom_score plus 300 when the
  name (comm) matches --prefer, minus 300 when it matches --avoid; ties go to the
  larger VmRSS; never pid 1 or itself. SIGTERM, then SIGKILL when memory falls to
  the kill limit while it waits (kill_wait: up to 100 polls of 100 ms).

The differences, on purpose: the candidates are the processes whose memory the
node's simulated /proc/meminfo counts (the engines in its state file's
``engine_mem_gib``), with oom_score = 1000 x held / MemTotal as the kernel's
oom_badness roughly is; other processes hold no simulated memory and a real
earlyoom would rank them near 0. After a kill the state file is settled so the
dead engine's memory is given back (or leaked, on a leaky kernel), as the kernel
would. /proc/meminfo is the node's own (bind-mounted by sparkctl_sim.clusterboot).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl_sim import nodestate
from sparkctl_sim.envnames import STATE_ENV

VERSION = "v1.7"
BADNESS_PREFER, BADNESS_AVOID = 300, -300  # kill.c
MIN_SLEEP_MS, MAX_SLEEP_MS, FILL_RATE_KIB_PER_MS = 100, 1000, 6000  # main.c sleep_time_ms


class Fatal(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Mem:
    total_kib: int
    avail_kib: int
    swap_total_kib: int
    swap_free_kib: int

    @property
    def avail_pct(self) -> float:
        return self.avail_kib * 100 / self.total_kib

    @property
    def swap_free_pct(self) -> float:  # meminfo.c: 0 when there is no swap
        return self.swap_free_kib * 100 / self.swap_total_kib if self.swap_total_kib else 0.0


@dataclass(frozen=True)
class Config:
    mem_term_pct: float = 10.0
    mem_kill_pct: float = 5.0
    swap_term_pct: float = 10.0
    swap_kill_pct: float = 5.0
    report_s: float = 1.0
    prefer: str | None = None
    avoid: str | None = None
    dryrun: bool = False


def parse_meminfo(text: str) -> Mem:
    v = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.strip():
            v[key] = int(rest.split()[0])
    return Mem(v["MemTotal"], v["MemAvailable"], v.get("SwapTotal", 0), v.get("SwapFree", 0))


def _part(text: str, upper: float) -> float:
    m = re.match(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", text)
    if not m:  # strtod parsed nothing: all of it is garbage (msg.c parse_part)
        raise ValueError(f"trailing garbage '{text}'")
    if text[m.end():]:
        raise ValueError(f"trailing garbage '{text[m.end():]}'")
    val = float(m.group(1))
    if val < 0:
        raise ValueError(f"negative value: {val:f}")
    if val > upper:
        raise ValueError(f"value {val:f} exceeds limit {int(upper)}")
    return val


def term_kill(text: str, upper: float) -> tuple[float, float]:
    """msg.c parse_term_kill_tuple: "TERM[,KILL]", KILL = TERM/2 when absent."""
    first, comma, second = text.partition(",")
    term = _part(first, upper)
    kill = _part(second, upper) if comma else term / 2
    term = max(term, kill)
    if term == 0 and kill == 0:
        raise ValueError("both SIGTERM and SIGKILL values are zero")
    return term, kill


def parse_args(argv: Sequence[str], mem: Mem) -> Config:
    cfg: dict[str, object] = {}
    m_pct = mm = s_pct = ss = None
    args = list(argv)
    i = 0
    takes = set("msMSNr")
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            if name in ("prefer", "avoid"):
                if not eq:
                    i += 1
                    if i >= len(args):
                        raise Fatal(13, f"earlyoom: option '--{name}' requires an argument")
                    val = args[i]
                cfg[name] = val
            elif name == "dryrun":
                cfg["dryrun"] = True
            elif name == "help":
                raise Fatal(0, "Usage: earlyoom [OPTION]... (SIMULATED stand-in of earlyoom v1.7)")
            else:
                raise Fatal(13, f"earlyoom: unrecognized option '{a}'")
            i += 1
            continue
        if not a.startswith("-") or a == "-":
            break
        j = 1
        while j < len(a):
            c = a[j]
            if c not in "msMSkingNdvrph":
                raise Fatal(13, f"earlyoom: invalid option -- '{c}'\nTry 'earlyoom --help' for more information.")
            if c in takes:
                val = a[j + 1:] or (args[i + 1] if i + 1 < len(args) else None)
                if val is None:
                    raise Fatal(13, f"earlyoom: option requires an argument -- '{c}'")
                if not a[j + 1:]:
                    i += 1
                try:
                    if c == "m":
                        m_pct = term_kill(val, 99)
                    elif c == "s":
                        s_pct = term_kill(val, 100)
                    elif c == "M":
                        mm = term_kill(val, mem.total_kib * 100 / 99)
                    elif c == "S":
                        ss = term_kill(val, mem.swap_total_kib * 100 / 99) if mem.swap_total_kib else None
                    elif c == "r":
                        r = float(val) if re.match(r"^\s*[+-]?\d", val) else 0.0
                        if r < 0:
                            raise Fatal(14, f"fatal: -r: invalid interval '{val}'")
                        cfg["report_s"] = r
                except ValueError as e:
                    code = 15 if c in "mM" else 16
                    raise Fatal(code, f"fatal: -{c}: {e}") from None
                break
            if c == "v":
                raise Fatal(0, "")
            if c == "h":
                raise Fatal(0, "Usage: earlyoom [OPTION]... (SIMULATED stand-in of earlyoom v1.7)")
            j += 1
        i += 1
    if i < len(args):
        raise Fatal(13, f"fatal: extra argument not understood: '{args[i]}'")
    mt, mk = m_pct or (10.0, 5.0)
    if mm is not None:  # main.c: "-M" merged with "-m", the lower of both
        mt_m, mk_m = 100 * mm[0] / mem.total_kib, 100 * mm[1] / mem.total_kib
        mt, mk = (min(mt, mt_m), min(mk, mk_m)) if m_pct else (mt_m, mk_m)
    st, sk = s_pct or (10.0, 5.0)
    if ss is not None:
        st_s, sk_s = 100 * ss[0] / mem.swap_total_kib, 100 * ss[1] / mem.swap_total_kib
        st, sk = (min(st, st_s), min(sk, sk_s)) if s_pct else (st_s, sk_s)
    for key in ("prefer", "avoid"):
        if key in cfg:
            try:
                re.compile(str(cfg[key]))
            except re.error:
                raise Fatal(6, f"fatal: could not compile regexp '{cfg[key]}'") from None
    return Config(mt, mk, st, sk, float(cfg.get("report_s", 1.0)),  # type: ignore[arg-type]
                  cfg.get("prefer"), cfg.get("avoid"), bool(cfg.get("dryrun")))  # type: ignore[arg-type]


def lowmem_sig(cfg: Config, m: Mem) -> int:
    if m.avail_pct <= cfg.mem_kill_pct and m.swap_free_pct <= cfg.swap_kill_pct:
        return signal.SIGKILL
    if m.avail_pct <= cfg.mem_term_pct and m.swap_free_pct <= cfg.swap_term_pct:
        return signal.SIGTERM
    return 0


def sleep_ms(cfg: Config, m: Mem) -> int:
    head = max(0.0, (m.avail_pct - cfg.mem_term_pct) * 10 * (m.total_kib / 1024))
    return int(min(MAX_SLEEP_MS, max(MIN_SLEEP_MS, head / FILL_RATE_KIB_PER_MS)))


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    rss_kib: int
    badness: int


def choose(cfg: Config, procs: Sequence[Proc], me: int) -> Proc | None:
    """kill.c is_larger over the candidates: badness first, then VmRSS; never pid 1 or itself."""
    victim: Proc | None = None
    for p in procs:
        if p.pid <= 1 or p.pid == me or p.rss_kib == 0:
            continue
        bad = p.badness
        if cfg.prefer and re.search(cfg.prefer, p.name):
            bad += BADNESS_PREFER
        if cfg.avoid and re.search(cfg.avoid, p.name):
            bad += BADNESS_AVOID
        p = Proc(p.pid, p.name, p.rss_kib, bad)
        if victim is None or (p.badness, p.rss_kib) > (victim.badness, victim.rss_kib):
            victim = p
    return victim


def startup_lines(cfg: Config, m: Mem) -> list[str]:
    out = [f"earlyoom {VERSION}"]
    if cfg.dryrun:
        out.append("dryrun mode enabled, will not kill anything")
    if cfg.prefer:
        out.append(f"Preferring to kill process names that match regex '{cfg.prefer}'")
    if cfg.avoid:
        out.append(f"Will avoid killing process names that match regex '{cfg.avoid}'")
    out += [f"mem total: {m.total_kib // 1024:4d} MiB, swap total: {m.swap_total_kib // 1024:4d} MiB",
            f"sending SIGTERM when mem <= {cfg.mem_term_pct:5.2f}% and swap <= {cfg.swap_term_pct:5.2f}%,",
            f"        SIGKILL when mem <= {cfg.mem_kill_pct:5.2f}% and swap <= {cfg.swap_kill_pct:5.2f}%"]
    return out


def mem_stats(m: Mem) -> str:
    return (f"mem avail: {m.avail_kib // 1024:5d} of {m.total_kib // 1024:5d} MiB ({m.avail_pct:5.2f}%), "
            f"swap free: {m.swap_free_kib // 1024:4d} of {m.swap_total_kib // 1024:4d} MiB ({m.swap_free_pct:5.2f}%)")


# --------------------------------------------------------------------------- edges


def _read_mem() -> Mem:
    with open("/proc/meminfo", encoding="ascii") as fh:
        return parse_meminfo(fh.read())


def _candidates(state_path: str, total_kib: int) -> list[Proc]:
    st = nodestate.load(state_path)
    out = []
    for pid_s, gib in (st.get("engine_mem_gib") or {}).items():
        try:
            pid = int(pid_s)
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                name = fh.read().strip()
        except (ValueError, OSError):
            continue
        kib = int(float(gib) * 1024 * 1024)
        out.append(Proc(pid, name, kib, int(1000 * kib / total_kib)))
    return out


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _kill(cfg: Config, sig: int, victim: Proc, state_path: str) -> None:
    name = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
    _warn(f'sending {name} to process {victim.pid} uid {os.getuid()} "{victim.name}": '
          f"badness {victim.badness}, VmRSS {victim.rss_kib // 1024} MiB")
    if cfg.dryrun:
        _warn("dryrun, not actually sending any signal")
        return
    try:
        os.kill(victim.pid, sig)
    except OSError as e:
        _warn(f"kill failed: {e.strerror}")
        return
    for i in range(100):  # kill.c kill_wait
        if sig != signal.SIGKILL:
            m = _read_mem()
            if m.avail_pct <= cfg.mem_kill_pct and m.swap_free_pct <= cfg.swap_kill_pct:
                sig = signal.SIGKILL
                os.kill(victim.pid, sig)
                _warn(f"escalating to SIGKILL after {i * 0.1:.1f} seconds")
        if not nodestate.pid_alive(victim.pid):
            nodestate.settle_file(state_path)  # the kernel takes the dead engine's memory back
            _warn(f"process exited after {i * 0.1:.1f} seconds")
            return
        time.sleep(0.1)
    nodestate.settle_file(state_path)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    state_path = os.environ.get(STATE_ENV, "")
    if not state_path:
        print(f"earlyoom: {STATE_ENV} is not set (simulated node state file)", file=sys.stderr)
        return 127
    if "earlyoom" not in (nodestate.load(state_path).get("packages") or {}):
        # the package is not installed on this node: the shell's answer (bash: command not found)
        print("earlyoom: command not found", file=sys.stderr)
        return 127
    print(f"earlyoom {VERSION}", file=sys.stderr)
    mem = _read_mem()
    try:
        cfg = parse_args(args, mem)
    except Fatal as e:
        if e.message:
            print(e.message, file=sys.stderr)
        return e.code
    for line in startup_lines(cfg, mem)[1:]:
        _warn(line)
    report_ms = 0
    while True:
        m = _read_mem()
        sig = lowmem_sig(cfg, m)
        if sig:
            _warn(mem_stats(m))
            kind, t, s = (("SIGKILL", cfg.mem_kill_pct, cfg.swap_kill_pct) if sig == signal.SIGKILL
                          else ("SIGTERM", cfg.mem_term_pct, cfg.swap_term_pct))
            _warn(f"low memory! at or below {kind} limits: mem {t:5.2f}%, swap {s:5.2f}%")
            victim = choose(cfg, _candidates(state_path, m.total_kib), os.getpid())
            if lowmem_sig(cfg, _read_mem()) == 0:
                _warn("memory situation has recovered while selecting victim")
            elif victim is None:
                _warn("Could not find a process to kill. Sleeping 1 second.")
                time.sleep(1)
            else:
                _kill(cfg, sig, victim, state_path)
        elif cfg.report_s and report_ms <= 0:
            print(mem_stats(m), flush=True)
            report_ms = int(cfg.report_s * 1000)
        ms = sleep_ms(cfg, m)
        time.sleep(ms / 1000)
        report_ms -= ms


if __name__ == "__main__":
    sys.exit(main())
