"""The fault matrix of issue #7 on the SIMULATED ring: faults x phases x commands.

Owns three things, kept apart:

* the matrix (pure): which cells exist, which are N/A and why, what each cell
  starts from and what counts as success (:func:`matrix`, :func:`plan_for`);
* the judgement (pure): a snapshot of the ring (served model names, engine
  processes per node, the record's text, the lock) -> final state, orphans,
  record integrity, whether the record agrees (:func:`classify`, :func:`judge`);
* the driver (:class:`Ring`, :func:`run_cell`): puts the ring in the cell's start
  state through the CLI, runs the command as a subprocess with
  ``SPARKCTL_PROGRESS_JSONL`` set, injects the fault through
  :mod:`sparkctl_sim.cluster` (what ``sparkctl sim fault`` calls) when the
  progress stream reaches the cell's phase, heals, and observes.

It judges sparkctl from the outside only (CLI, SSH, HTTP): no hook in the
lifecycle code. Must not: touch anything but a simulated cluster.
SIMULATION ONLY.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- the matrix (pure)

FAULTS: dict[str, str] = {
    "rank_killed": "SIGKILL every engine process on spark-c (`sim fault spark-c kill-engine`)",
    "link_down": "spark-c's fabric cable to spark-d down (`sim fault spark-c link-down`)",
    "sshd_stopped": "sshd on spark-c stopped: new SSH connections refused (`sim fault spark-c sshd-stop`)",
    "unreachable": "spark-c's management port down: SSH times out (`sim fault spark-c unreachable`)",
    "disk_full": "the head's /var/lib/sparkctl (record and lock) full (`sim fault spark-a disk-full`)",
    "sigint": "SIGINT to sparkctl's process group (Ctrl-C)",
    "second_operator": "a second sparkctl on the same cluster at the same time",
}
COMMANDS = ("up", "switch", "down")
PHASES = ("before_push", "during_start", "during_ready", "while_serving", "during_stop")
# The progress event (its "phase" field) at which the fault is injected.
TRIGGER = {"before_push": "check", "during_start": "start", "during_ready": "waiting", "during_stop": "stop"}
HEAD = "spark-a"
FAULT_NODE = {"rank_killed": "spark-c", "link_down": "spark-c", "sshd_stopped": "spark-c",
              "unreachable": "spark-c", "disk_full": HEAD}
LINK_IFACE = "enp1s0f0np0"  # spark-c:p0, cabled to spark-d:p1

OLD = "ds41f-tp4-ring"  # what switch replaces
NEW = "tensorfold-tp4-ring"  # what up and switch bring up, what down stops
SERVED = {OLD: "deepseek-v4.1-flash", NEW: "dsv41-flash-tensorfold"}
ENGINE = {OLD: "ds41f serve", NEW: "tensorfold serve"}
PORT = 8000
# ds41f on the stock 4 KiB kernel of the sim; a readiness deadline that ends a
# stuck rendezvous within the cell (the profiles' own is 30 min for real loads).
WAIVE = ("--waive", "page_size", "--reason", "stock 4 KiB kernel (fault matrix)")
SETS = ("--set", "serve.ready_timeout_s=60")
TIMEOUTS = ("--connect-timeout", "3", "--command-timeout", "20", "--deadline", "40")


@dataclass(frozen=True)
class Cell:
    command: str
    phase: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.command}/{self.phase}/{self.fault}"

    @property
    def node(self) -> str | None:
        """The node the fault hits (None for SIGINT and a second operator)."""
        return FAULT_NODE.get(self.fault)


def na_reason(cell: Cell) -> str | None:
    """Why a cell is not meaningful, or None when it runs."""
    c, ph, f = cell.command, cell.phase, cell.fault
    if c == "down" and ph in ("before_push", "during_start", "during_ready"):
        return "down pushes, starts and waits for nothing; its phases are while-serving and during-stop"
    if c != "down" and ph == "during_stop":
        return "up and switch stop the old stack in stop-stale, between before-push and during-start"
    if ph == "while_serving" and f == "sigint":
        return "no sparkctl runs while the stack serves: a SIGINT before the command is no fault"
    if ph == "while_serving" and f == "second_operator":
        return "no first operator runs while the stack serves: two commands in turn are ordinary use"
    if c == "up" and ph == "before_push" and f == "rank_killed":
        return "up starts from a stopped ring: no rank runs before its push (a dead rank under up: while-serving)"
    return None


def matrix() -> list[tuple[Cell, str | None]]:
    """Every cell, command-major, with its N/A reason (None: it runs)."""
    out = []
    for c in COMMANDS:
        for ph in PHASES:
            for f in FAULTS:
                cell = Cell(c, ph, f)
                out.append((cell, na_reason(cell)))
    return out


# One cell per fault kind, each in another (command, phase) where it can be, for CI.
REDUCED = (
    Cell("up", "during_ready", "rank_killed"),
    Cell("switch", "during_ready", "link_down"),
    Cell("switch", "before_push", "sshd_stopped"),
    Cell("down", "while_serving", "unreachable"),
    Cell("switch", "during_start", "disk_full"),
    Cell("switch", "during_ready", "sigint"),
    # not down/during_stop: a `down` takes ~1 s, and on a loaded machine it was over
    # before the second operator asked for the lock (then both ran, one after the other)
    Cell("up", "during_start", "second_operator"),
)


@dataclass(frozen=True)
class Plan:
    start: str  # "stopped" | a profile serving
    argv: tuple[str, ...]
    success: str  # the final state of a command that exits 0
    fallback: tuple[str, ...]  # the final states a failed command may leave (stated, never half-up)
    second: tuple[str, ...] = ()  # the second operator's command


def _up_argv(profile: str) -> tuple[str, ...]:
    return ("up", profile, *SETS, *(WAIVE if profile == OLD else ()))


def plan_for(cell: Cell) -> Plan:
    if cell.command == "up":
        start = f"serving {NEW}" if cell.phase == "while_serving" else "stopped"
        return Plan(start, _up_argv(NEW), f"serving {NEW}", ("stopped",), second=("down",))
    if cell.command == "switch":
        return Plan(f"serving {OLD}", ("switch", NEW, *SETS), f"serving {NEW}", (f"serving {OLD}", "stopped"),
                    second=("down",))
    return Plan(f"serving {NEW}", ("down",), "stopped", ("stopped",), second=_up_argv(OLD))


# --------------------------------------------------------------------------- judgement (pure)

RECORD_KEYS = ("profile", "digest", "engine", "served_name", "port", "heads", "nodes", "state", "started_at", "schema")


@dataclass(frozen=True)
class Snapshot:
    served: tuple[str, ...] | None  # /v1/models on the head's port, None when nothing answers
    procs: Mapping[str, tuple[str, ...]]  # node -> engine-related process lines
    record_text: str | None  # the head's record.json, None when absent
    state_dir: tuple[str, ...]  # names in the head's /var/lib/sparkctl
    lock_held: bool


def record_integrity(text: str | None, names: Sequence[str]) -> tuple[bool, str, dict[str, Any] | None]:
    """(intact, problem, parsed). Absent is intact (it claims nothing runs)."""
    from sparkctl.model.record import SCHEMA, STATES, RunRecord

    partial = [n for n in names if n.startswith(".sparkctl-put.") or n.endswith(".tmp")]
    if partial:
        return False, f"partial files beside the record: {', '.join(partial)}", None
    if text is None:
        return True, "", None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return False, f"record.json does not parse: {exc}", None
    if not isinstance(data, dict):
        return False, "record.json is not an object", None
    missing = [k for k in RECORD_KEYS if k not in data]
    if missing:
        return False, f"record.json lacks {', '.join(missing)}", data
    if data["state"] not in STATES or data["schema"] != SCHEMA:
        return False, f"record.json state {data['state']!r} / schema {data['schema']!r} unknown", data
    try:
        RunRecord.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        return False, f"record.json does not load: {type(exc).__name__}: {exc}", data
    return True, "", data


def _engine_of(line: str) -> str | None:
    for profile, needle in ENGINE.items():
        if needle in line:
            return profile
    return None


def classify(snap: Snapshot) -> tuple[str, int, list[str]]:
    """(final state, orphan processes, details). Final: "serving P", "stopped" or "mixed: ..."."""
    engines = {n: [_engine_of(x) for x in lines if "sparkctl_sim.engine " in x] for n, lines in snap.procs.items()}
    serving = next((p for p, name in SERVED.items() if snap.served and name in snap.served), None)
    everything = sum(len(v) for v in snap.procs.values())
    if serving and all(e.count(serving) == 1 for e in engines.values()):
        orphans, detail = 0, []
        for n, lines in snap.procs.items():
            for x in lines:
                other = _engine_of(x)
                if other is not None and other != serving:
                    orphans += 1
                    detail.append(f"{n}: {x[:90]}")
        return f"serving {serving}", orphans, detail
    if not snap.served and everything == 0:
        return "stopped", 0, []
    alive = {n: [e for e in v if e] for n, v in engines.items() if v}
    detail = [f"{n}: {x[:90]}" for n, lines in snap.procs.items() for x in lines]
    return f"mixed: serves {list(snap.served or [])}, engines {alive}", everything, detail


@dataclass
class Outcome:
    cell: str
    status: str  # ok | FAIL | n/a
    reason: str = ""  # the N/A reason
    seconds: float = 0.0
    exit_code: int | None = None
    message: str = ""
    names_node: bool | None = None
    names_phase: bool | None = None
    injected_in: str = ""  # the last progress phase before the fault landed
    final_state: str = ""
    record_state: str = ""
    record_agrees: bool | None = None
    record_intact: bool | None = None
    orphans: int | None = None
    lock_left: bool | None = None
    second_exit: int | None = None
    second_message: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(cell: Cell, plan: Plan, out: Outcome, snap: Snapshot) -> Outcome:
    """Fill the final state, record and orphan fields, and the problems, from a settled snapshot."""
    final, orphans, detail = classify(snap)
    intact, problem, data = record_integrity(snap.record_text, snap.state_dir)
    out.final_state, out.orphans, out.record_intact = final, orphans, intact
    out.record_state = "absent" if snap.record_text is None else (
        f"{data.get('state')} {data.get('profile')}" if data else "unreadable")
    claims = f"serving {data['profile']}" if data and data.get("state") == "serving" else "stopped"
    out.record_agrees = claims == final
    out.lock_left = snap.lock_held
    p = out.problems
    if orphans:
        p.append(f"{orphans} orphan process(es): " + "; ".join(detail[:4]))
    if not intact:
        p.append(f"record: {problem}")
    if final.startswith("mixed"):
        p.append(f"no stated final state: {final}")
    elif not out.record_agrees:
        p.append(f"the record says {claims!r}, the ring is {final!r}")
    if snap.lock_held:
        p.append("the cluster lock is still held after every sparkctl exited")
    # A second operator that succeeded ran before or after the first (the lock
    # serialized them): its own goal is then a stated final state too.
    also: tuple[str, ...] = ()
    if cell.fault == "second_operator" and out.second_exit == 0:
        also = ("stopped",) if plan.second == ("down",) else (f"serving {OLD}",)
        out.notes.append("the second operator ran too (one after the other: the lock serialized them)")
    if out.exit_code is None:
        p.append("the command did not finish")
    elif out.exit_code == 0:
        if final not in (plan.success, *also):
            p.append(f"exit 0 but the ring is {final!r}, not {plan.success!r}")
    else:
        if final not in (plan.success, *plan.fallback, *also) and not final.startswith("mixed"):
            p.append(f"failed into {final!r}; expected one of {[plan.success, *plan.fallback]}")
        out.names_phase = " in phase " in out.message
        if not out.names_phase:
            p.append("the error does not name the phase")
        if cell.node is not None:
            out.names_node = cell.node in out.message
            if not out.names_node:
                p.append(f"the error does not name {cell.node}")
    if cell.fault == "second_operator":
        if out.second_exit == 6:
            ok = HEAD in out.second_message and " in phase " in out.second_message
            if not ok:
                p.append("the second operator's refusal does not name the head and the phase")
        elif out.second_exit is not None and out.second_exit != 0:
            p.append(f"the second operator failed with exit {out.second_exit}: {out.second_message[:120]}")
    out.status = "FAIL" if p else "ok"
    return out


# --------------------------------------------------------------------------- the driver

ENGINE_PS = ("ps -eo pid,args | grep -E '[s]parkctl.sim.engine |[d]ocker run|[s]ystemctl start sparkctl|"
             "[l]aunch.sh|[r]un-detached|[l]lama_cpp.server' || true")
STATE_DIR = "/var/lib/sparkctl"


def _message(stdout: str, stderr: str) -> str:
    errs = [ln for ln in stderr.splitlines() if ln.startswith(("error:", "interrupted", "internal error"))]
    return "\n".join([*errs, *(ln for ln in stdout.splitlines() if ln.strip())]).strip()


class Ring:
    """The simulated ring of one run: its CLI, SSH, HTTP and faults."""

    def __init__(self, root: Path, inventory: Path, env: Mapping[str, str], work: Path,
                 say: Callable[[str], None] | None = None) -> None:
        from sparkctl.model.inventory import load_inventory

        self.root, self.inventory, self.env, self.work = root, inventory, dict(env), work
        self.inv = load_inventory(inventory)
        self.say = say or (lambda _m: None)
        work.mkdir(parents=True, exist_ok=True)

    # -- access
    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sparkctl.cli", "-i", str(self.inventory), *args]

    def sparkctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def ssh(self, node: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        from sparkctl_sim import cluster

        return subprocess.run([*cluster.ssh_argv(self.root, node), command], capture_output=True, text=True,
                              timeout=timeout)

    def served(self) -> tuple[str, ...] | None:
        import httpx

        try:
            r = httpx.get(f"http://{self.inv.node(HEAD).host}:{PORT}/v1/models", timeout=3, trust_env=False)
            return tuple(m.get("id") for m in r.json().get("data", []))
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def snapshot(self) -> Snapshot:
        def ps(n: str) -> tuple[str, ...]:
            r = self.ssh(n, ENGINE_PS)
            if r.returncode != 0:
                return (f"(ps failed on {n}: {r.stderr.strip()[:80]})",)
            return tuple(x.strip() for x in r.stdout.splitlines() if x.strip())

        with ThreadPoolExecutor(max_workers=5) as pool:
            procs_f = {n: pool.submit(ps, n) for n in self.inv.names}
            head = self.ssh(HEAD, f"cd {STATE_DIR} && ls -A; echo ---; cat record.json 2>/dev/null || echo __absent__; "
                                  "echo; echo ---; ls -d locks/*.d >/dev/null 2>&1 && echo locked || true")
            procs = {n: f.result() for n, f in procs_f.items()}
        listing, _, rest = head.stdout.partition("---\n")
        text, _, lock = rest.rpartition("---\n")
        text = text.strip()
        return Snapshot(self.served(), procs, None if text == "__absent__" else text,
                        tuple(listing.split()), "locked" in lock)

    def settled(self, deadline_s: float = 45.0) -> Snapshot:
        """Poll until the ring is in a stated state with no orphans (ranks of a broken
        communicator take a heartbeat timeout to exit), or the deadline passes."""
        t_end = time.monotonic() + deadline_s
        while True:
            snap = self.snapshot()
            final, orphans, _ = classify(snap)
            if (not final.startswith("mixed") and orphans == 0) or time.monotonic() > t_end:
                return snap
            time.sleep(1.0)

    # -- faults (what `sparkctl sim fault` calls)
    def inject(self, fault: str) -> None:
        from sparkctl_sim import cluster

        node = FAULT_NODE.get(fault)
        if fault == "rank_killed":
            cluster.kill_engines(self.root, node)  # type: ignore[arg-type]
        elif fault == "link_down":
            cluster.link_down(self.root, node, LINK_IFACE)  # type: ignore[arg-type]
        elif fault == "sshd_stopped":
            cluster.stop_sshd(self.root, node)  # type: ignore[arg-type]
        elif fault == "unreachable":
            cluster.unreachable(self.root, node)  # type: ignore[arg-type]
        elif fault == "disk_full":
            cluster.disk_full(self.root, node, STATE_DIR)  # type: ignore[arg-type]
        else:
            raise ValueError(fault)

    def heal(self) -> None:
        """Every fault off, idempotent: reachable, sshd up, link up, disk free."""
        from sparkctl_sim import cluster

        for n in self.inv.names:
            cluster.reachable(self.root, n)
            cluster.start_sshd(self.root, n)
            cluster.disk_ok(self.root, n)
        cluster.link_up(self.root, FAULT_NODE["link_down"], LINK_IFACE)

    def reset_to(self, start: str) -> None:
        """The cell's start state through the CLI: everything stopped, then maybe a stack up."""
        self.heal()
        if self.snapshot().lock_held:
            self.sparkctl("unlock")
        r = self.sparkctl("down", *TIMEOUTS)
        if r.returncode != 0:
            raise RuntimeError(f"reset: down failed: {r.stdout}{r.stderr}")
        # A healed fault must leave a sound ring: the fabric law over every path.
        r = self.sparkctl("check", NEW, "--bandwidth", "0", "--json", *TIMEOUTS)
        if r.returncode != 0:
            try:
                bad = [v for v in json.loads(r.stdout)["verdicts"] if v["status"] == "fail" and
                       v["law"] not in ("served_model", "clock_cap")]
            except (ValueError, KeyError):
                bad = [{"law": "?", "node": "?", "observed": r.stderr.strip()[-200:]}]
            if bad:
                raise RuntimeError("reset: the healed ring fails its check: "
                                   + "; ".join(f"{v['law']} on {v['node']}: {v['observed']}" for v in bad))
        if start != "stopped":
            profile = start.split()[1]
            r = self.sparkctl(*_up_argv(profile), *TIMEOUTS)
            if r.returncode != 0:
                raise RuntimeError(f"reset: up {profile} failed: {r.stdout}{r.stderr}")


def _follow(events: Path, proc: subprocess.Popen[str], phase: str, timeout_s: float) -> str | None:
    """Wait for a progress event of ``phase``; the phase of the last event seen, None if the command ended first."""
    seen = 0
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if events.exists():
            lines = events.read_text().splitlines()
            for ln in lines[seen:]:
                try:
                    if json.loads(ln).get("phase") == phase:
                        return phase
                except ValueError:
                    continue
            seen = len(lines)
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def _last_phase(events: Path) -> str:
    try:
        lines = events.read_text().splitlines()
        return json.loads(lines[-1]).get("phase", "") if lines else "(none)"
    except (OSError, ValueError):
        return "?"


def run_cell(ring: Ring, cell: Cell, *, command_timeout_s: float = 300) -> Outcome:
    reason = na_reason(cell)
    if reason:
        return Outcome(cell.id, "n/a", reason=reason)
    plan = plan_for(cell)
    t0 = time.monotonic()
    out = Outcome(cell.id, "FAIL")
    ring.say(f"{cell.id}: start state {plan.start}")
    ring.reset_to(plan.start)
    slug = cell.id.replace("/", "-")
    events = ring.work / f"{slug}.jsonl"
    events.unlink(missing_ok=True)
    if cell.phase == "while_serving":
        ring.inject(cell.fault)
        out.injected_in = "before the command (the stack served)"
    stdout_f, stderr_f = ring.work / f"{slug}.out", ring.work / f"{slug}.err"
    env = {**ring.env, "SPARKCTL_PROGRESS_JSONL": str(events)}
    with open(stdout_f, "w") as so, open(stderr_f, "w") as se:
        # SIGINT back to its default in the child: a driver started in the background
        # (nohup, `&`) inherits it ignored, and so would sparkctl.
        proc = subprocess.Popen(ring.argv(*plan.argv, *TIMEOUTS), env=env, stdout=so, stderr=se, text=True,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
        second: subprocess.Popen[str] | None = None
        if cell.phase in TRIGGER:
            hit = _follow(events, proc, TRIGGER[cell.phase], command_timeout_s)
            if hit is None:
                out.notes.append(f"the command ended before its {TRIGGER[cell.phase]!r} phase: no fault injected")
            else:
                if cell.fault == "sigint":
                    os.killpg(proc.pid, signal.SIGINT)
                elif cell.fault == "second_operator":
                    second = subprocess.Popen(ring.argv(*plan.second, *TIMEOUTS), env=ring.env, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                else:
                    ring.inject(cell.fault)
                out.injected_in = _last_phase(events)
        try:
            proc.wait(timeout=command_timeout_s)
            out.exit_code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.notes.append(f"killed after {command_timeout_s:.0f} s")
        if second is not None:
            s_out, s_err = second.communicate(timeout=command_timeout_s)
            out.second_exit, out.second_message = second.returncode, _message(s_out, s_err)
    out.message = _message(stdout_f.read_text(), stderr_f.read_text())
    ring.heal()
    judge(cell, plan, out, ring.settled())
    out.seconds = round(time.monotonic() - t0, 1)
    ring.say(f"{cell.id}: {out.status} exit {out.exit_code} -> {out.final_state}; {'; '.join(out.problems)}")
    return out


# --------------------------------------------------------------------------- report (pure)


def table(outcomes: Sequence[Outcome]) -> str:
    """A Markdown table: one row per cell."""
    head = ("| cell | result | exit | names node / phase | injected in | final state | record | orphans | "
            "lock left | s |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [head]
    for o in outcomes:
        if o.status == "n/a":
            rows.append(f"| {o.cell} | n/a | | | | {o.reason} | | | | |")
            continue

        def yn(v: bool | None) -> str:
            return "-" if v is None else ("yes" if v else "NO")

        names = f"{yn(o.names_node)} / {yn(o.names_phase)}"
        if o.second_exit is not None:
            names += f" (2nd: exit {o.second_exit})"
        rec = f"{o.record_state}{'' if o.record_intact else ' CORRUPT'}{'' if o.record_agrees else ' (disagrees)'}"
        rows.append(f"| {o.cell} | {o.status} | {o.exit_code} | {names} | {o.injected_in} | {o.final_state} | "
                    f"{rec} | {o.orphans} | {yn(o.lock_left).replace('NO', 'no').replace('yes', 'YES')} | "
                    f"{o.seconds:.0f} |")
    return "\n".join(rows)
