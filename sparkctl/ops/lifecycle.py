"""up, down, switch: the only code that changes hosts.

Every operation follows its plan (``sparkctl.plan.planner``), fans each step out to all
nodes and waits for all, and never leaves the cluster half-up: a failure stops
what this run started and the record says so; a failed ``switch`` brings the
previous stack back and proves it serves its own model name. Ctrl-C is handled
the same way.
"""

from __future__ import annotations

import getpass
import json
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import httpx

from sparkctl.errors import (
    CheckFailed,
    Interrupted,
    LifecycleError,
    LockHeld,
    LockUnavailable,
    Ref,
    SparkctlError,
)
from sparkctl.facts import probes
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import Layout, Rank, bind
from sparkctl.model.profiles import Resolved, resolve
from sparkctl.model.record import LOCK_DIR, RECORD_PATH, NodeRecord, RunRecord
from sparkctl.model.resources import Roots
from sparkctl.ops.check import CheckReport, run_check
from sparkctl.ops.localstate import cluster_dir, read_json, write_json
from sparkctl.plan import laws
from sparkctl.plan.planner import plan_up
from sparkctl.plan.render import DETACHED, LOG_DIR, UNIT, Rendering, render, under
from sparkctl.plan.render import (
    _env as template_env,  # one jinja environment: StrictUndefined, the sh filter
)
from sparkctl.transport.ssh import CommandResult, Transport

Progress = Callable[[str, str, str], None]  # (node or "*", phase, message)

STOP_SCRIPT = """\
set -u
unit={unit}; detached={detached}
if [ -e "$unit" ] && command -v systemctl >/dev/null 2>&1; then systemctl stop sparkctl-engine 2>/dev/null || true; fi
if [ -e "$detached" ]; then sh "$detached" stop >/dev/null 2>&1 || true; fi
if command -v docker >/dev/null 2>&1; then docker rm -f sparkctl-engine >/dev/null 2>&1 || true; fi
i=0
while [ "$i" -lt {wait_ds} ]; do
  if ps -eo pid,args | grep -iE -e {pattern} >/dev/null 2>&1; then sleep 0.1; i=$((i + 1)); else break; fi
done
left=$(ps -eo pid,args | grep -iE -e {pattern} | awk '{{print $1}}' | tr '\\n' ' ')
if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; sleep 0.2; fi
left=$(ps -eo pid,args | grep -iE -e {pattern} | awk '{{print $1}}' | tr '\\n' ' ')
ports=""
for p in {ports}; do
  if (ss -ltnH 2>/dev/null || true) | awk '{{print $4}}' | grep -qE "[:.]$p\\$"; then ports="$ports $p"; fi
done
echo "left:$left"
echo "ports:$ports"
"""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    seconds: float


@dataclass(frozen=True)
class UpResult:
    profile: str
    action: str  # started | restarted | noop
    record: RunRecord | None
    phases: tuple[PhaseTime, ...]
    check: CheckReport | None
    ready_s: float = 0.0  # time spent waiting for the engine (not sparkctl's own overhead)
    restarted_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DownResult:
    stopped: tuple[str, ...]
    leftovers: Mapping[str, str]  # node -> processes or ports still there
    leaks: Mapping[str, float]  # node -> GiB held with no engine
    clocks_reset: tuple[str, ...] = ()


@dataclass(frozen=True)
class SwitchResult:
    serving: str  # the profile serving now
    switched: bool
    rolled_back: bool
    downtime_s: float
    error: str = ""
    up: UpResult | None = None


# --------------------------------------------------------------------------- helpers


def head_node(inv: Inventory) -> str:
    """Where the record and the lock live: the inventory's first node."""
    return inv.nodes[0].name


def _p(inv: Inventory, node: str, path: str) -> str:
    return under(inv.node(node).prefix, path)


def _sudo(inv: Inventory, node: str) -> bool:
    return inv.node(node).sudo


def _fail_on(results: Mapping[str, CommandResult], what: str) -> None:
    bad = {n: r for n, r in results.items() if not r.ok}
    if bad:
        n, r = sorted(bad.items())[0]
        detail = r.error or (r.stderr.strip().splitlines() or [f"exit {r.exit_code}"])[-1]
        raise LifecycleError(f"{what} failed on {', '.join(sorted(bad))}: {detail}", Ref(node=n))


def read_record(inv: Inventory, transport: Transport) -> RunRecord | None:
    head = head_node(inv)
    r = transport.run(head, f"cat {shlex.quote(_p(inv, head, RECORD_PATH))} 2>/dev/null || true")
    text = r.stdout.strip() if r.ok else ""
    data: Any = None
    if text:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    if data is None:
        data = read_json(cluster_dir(inv) / "record.json")
    return RunRecord.from_dict(data) if data else None


def write_record(inv: Inventory, transport: Transport, rec: RunRecord) -> None:
    """Atomic on the head (temp + rename by the transport) and in the local cache."""
    head = head_node(inv)
    data = json.dumps(rec.to_dict(), indent=2, sort_keys=True).encode() + b"\n"
    write_json(cluster_dir(inv) / "record.json", rec.to_dict())
    r = transport.put(head, _p(inv, head, RECORD_PATH), data, 0o644, sudo=_sudo(inv, head))
    if not r.ok:
        raise LifecycleError(f"cannot write the run record on {head}: {r.error or r.stderr.strip()}", Ref(node=head),
                             hint="the local cache has it; check the disk on the head node")


# --------------------------------------------------------------------------- the lock


# The lock: one mkdir, then the holder file. A lock dir is only ever left
# without a holder by a process killed between the two; a failed write of the
# holder (a full disk) removes the dir again, so a full disk never leaves a lock.
_ACQUIRE_SCRIPT = """\
d={d}
mkdir -p {parent} || exit 3
if err=$(mkdir "$d" 2>&1); then
  if out=$( {{ printf '%s\\n' {info} > "$d/holder"; }} 2>&1 ); then echo acquired; exit 0; fi
  rm -rf "$d"; echo "cannot write $d/holder: ${{out:-write error}}" >&2; exit 3
elif [ -d "$d" ]; then
  echo held; cat "$d/holder" 2>/dev/null; exit 0
fi
echo "$err" >&2; exit 3
"""

# Whether a holder on the head (the supervisor of `switch --supervise`) still runs.
_HEAD_HOLDER_ALIVE = ("p={pid}; if [ -d /proc/$p ] && tr '\\000' ' ' < /proc/$p/cmdline 2>/dev/null | "
                      "grep -q supervisor; then echo alive; else echo gone; fi")


@dataclass
class ClusterLock:
    """mkdir-based lock on the head node; the holder's user@host, pid and time inside.

    A lock whose holder is provably gone is broken by the next acquirer: a
    holder on this machine whose pid is dead, or a switch supervisor on the head
    (its ``host`` is the head's node name) whose pid no longer runs the
    supervisor. A holder on another workstation cannot be checked from here.
    """

    inv: Inventory
    transport: Transport
    operation: str
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {__import__('os').getpid()}")

    def _dir(self) -> str:
        head = head_node(self.inv)
        return _p(self.inv, head, LOCK_DIR)

    def acquire(self, break_stale: bool = True) -> None:
        import os

        head = head_node(self.inv)
        d = self._dir()
        info = json.dumps({"holder": self.holder, "since": now_iso(), "operation": self.operation,
                           "host": socket.gethostname(), "pid": os.getpid()})
        cmd = _ACQUIRE_SCRIPT.format(d=shlex.quote(d), parent=shlex.quote(d.rsplit("/", 1)[0] or "/"),
                                     info=shlex.quote(info))
        r = self.transport.run(head, cmd, sudo=_sudo(self.inv, head))
        lines = r.stdout.strip().splitlines()
        if r.ok and lines[:1] == ["acquired"]:
            return
        if not r.ok or lines[:1] != ["held"]:
            raise (LockUnavailable if r.ok is False and not r.error else LifecycleError)(
                f"cannot take the cluster lock on {head}: {r.error or r.stderr.strip() or f'exit {r.exit_code}'}",
                Ref(node=head), hint=f"check the disk and permissions of {d.rsplit('/', 1)[0]} on {head}")
        raw = lines[1] if len(lines) > 1 else ""
        try:
            other = json.loads(raw)
        except ValueError:
            other = {"holder": "unknown (no holder file)", "since": "unknown"}
        if break_stale and raw and self._holder_gone(other):
            q = shlex.quote
            # Break only the lock we judged: the same holder line, renamed away in one step.
            self.transport.run(head, f"d={q(d)}; grep -qxF {q(raw)} \"$d/holder\" 2>/dev/null && "
                                     f"mv \"$d\" \"$d.stale.$$\" && rm -rf \"$d.stale.$$\"; true",
                               sudo=_sudo(self.inv, head))
            return self.acquire(break_stale=False)
        raise LockHeld(
            f"the cluster is locked by {other.get('holder')} since {other.get('since')} "
            f"({other.get('operation', '?')})", Ref(node=head),
            hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock",
        )

    def _holder_gone(self, other: Mapping[str, Any]) -> bool:
        pid = other.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return False
        if other.get("host") == socket.gethostname():
            return not _pid_alive(pid)
        head = head_node(self.inv)
        if other.get("host") == head:  # the supervisor writes the head's node name as its host
            r = self.transport.run(head, _HEAD_HOLDER_ALIVE.format(pid=int(pid)))
            return r.ok and r.stdout.strip() == "gone"
        return False

    def release(self) -> None:
        head = head_node(self.inv)
        d = shlex.quote(self._dir())
        holder = shlex.quote(self.holder)
        self.transport.run(head, f"grep -qF {holder} {d}/holder 2>/dev/null && rm -rf {d}; true",
                           sudo=_sudo(self.inv, head))

    def __enter__(self) -> "ClusterLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _pid_alive(pid: Any) -> bool:
    import os

    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def break_lock(inv: Inventory, transport: Transport) -> str:
    head = head_node(inv)
    d = shlex.quote(_p(inv, head, LOCK_DIR))
    r = transport.run(head, f"cat {d}/holder 2>/dev/null; rm -rf {d}", sudo=_sudo(inv, head))
    return r.stdout.strip()


# --------------------------------------------------------------------------- stop / start


def stop_engines(inv: Inventory, transport: Transport, nodes: Sequence[str], ports: Sequence[int],
                 timeout_s: int = 30) -> dict[str, str]:
    """Stop every sparkctl engine on ``nodes`` and verify: no engine process, ports closed.

    Returns node -> what is still there (empty when clean).
    """
    cmds = {}
    for n in nodes:
        cmds[n] = STOP_SCRIPT.format(
            unit=shlex.quote(_p(inv, n, UNIT)), detached=shlex.quote(_p(inv, n, DETACHED)),
            wait_ds=int(timeout_s * 10), pattern=shlex.quote(probes.ENGINE_REGEX),
            ports=" ".join(str(int(p)) for p in ports) or "0")
    results: dict[str, CommandResult] = {}
    groups: dict[bool, dict[str, str]] = {}
    for n, c in cmds.items():
        groups.setdefault(_sudo(inv, n), {})[n] = c
    for sudo, group in groups.items():
        results.update(transport.run_all(group, sudo=sudo, timeout_s=timeout_s + 15))
    left: dict[str, str] = {}
    for n, r in results.items():
        if r.error:
            left[n] = r.error
            continue
        procs = next((ln[5:].strip() for ln in r.stdout.splitlines() if ln.startswith("left:")), "")
        open_ports = next((ln[6:].strip() for ln in r.stdout.splitlines() if ln.startswith("ports:")), "")
        if procs or open_ports:
            left[n] = " ".join(x for x in (f"pids {procs}" if procs else "", f"ports {open_ports}" if open_ports else "") if x)
    return left


def _start_command(inv: Inventory, node: str, supervisor: str) -> str:
    if supervisor == "systemd":
        return "systemctl start sparkctl-engine"
    return f"sh {shlex.quote(_p(inv, node, DETACHED))} start"


def push_files(inv: Inventory, transport: Transport, rendering: Rendering, nodes: Sequence[str]) -> None:
    """Every node's files, atomically (temp + rename), nodes in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    def push(node: str) -> CommandResult | None:
        for f in rendering.files[node].values():
            r = transport.put(node, f.path, f.text.encode(), f.mode, sudo=_sudo(inv, node))
            if not r.ok:
                return r
        return None

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        failures = {n: r for n, r in zip(nodes, pool.map(push, nodes)) if r is not None}
    _fail_on(failures, "pushing the rendered files")


def tail_logs(inv: Inventory, transport: Transport, nodes: Sequence[str], n: int = 20) -> dict[str, str]:
    cmds = {x: f"tail -n {int(n)} {shlex.quote(_p(inv, x, LOG_DIR + '/engine.log'))} 2>/dev/null || true" for x in nodes}
    res = transport.run_all(cmds)
    return {x: (r.stdout if r.ok else f"({r.error})") for x, r in res.items()}


def engines_alive(inv: Inventory, transport: Transport, nodes: Sequence[str]) -> dict[str, bool]:
    pat = shlex.quote(probes.ENGINE_REGEX)
    res = transport.run_all({n: f"ps -eo pid,args | grep -iE -e {pat} >/dev/null && echo alive || echo dead" for n in nodes})
    return {n: (r.ok and "alive" in r.stdout) for n, r in res.items()}


# --------------------------------------------------------------------------- readiness


@dataclass(frozen=True)
class Readiness:
    ok: bool
    detail: str
    seconds: float


def endpoint_url(inv: Inventory, rank: Rank) -> str:
    return f"http://{inv.node(rank.node).host}:{rank.http_port}"


def metric_value(text: str, name: str) -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name):]
            if rest[:1] in (" ", "{"):
                try:
                    total = (total or 0.0) + float(line.rsplit(None, 1)[-1])
                except ValueError:
                    pass
    return total


def probe_endpoint(url: str, served_name: str, tokens_metric: str | None, timeout_s: float = 5.0,
                   smoke: bool = True) -> tuple[bool, str]:
    """One readiness probe: /v1/models lists the name, a 1-token completion, the counter advances."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as c:
            models = [m.get("id") for m in c.get(f"{url}/v1/models").json().get("data", [])]
            if served_name not in models:
                return False, f"/v1/models lists {models or 'nothing'}, not {served_name!r}"
            if not smoke:
                return True, "model listed"
            before = metric_value(c.get(f"{url}/metrics").text, tokens_metric) if tokens_metric else None
            r = c.post(f"{url}/v1/completions", json={"model": served_name, "prompt": "ping", "max_tokens": 1,
                                                      "temperature": 0})
            if r.status_code != 200:
                return False, f"1-token completion: HTTP {r.status_code} {r.text[:120]}"
            body = r.json()
            usage = body.get("usage")
            finish = ((body.get("choices") or [{}])[0] or {}).get("finish_reason")
            if not usage:
                return False, "1-token completion carried no usage block"
            if int(usage.get("completion_tokens", 0)) < 1 and finish != "stop":
                return False, "1-token completion returned no tokens (a wedged engine answers 200 with nothing)"
            if tokens_metric:
                after = metric_value(c.get(f"{url}/metrics").text, tokens_metric)
                if after is None or before is None or after <= before:
                    return False, f"generated-token counter {tokens_metric} did not advance"
            return True, "serving"
    except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
        return False, f"{type(exc).__name__}: {str(exc)[:120] or 'no answer'}"


def wait_ready(inv: Inventory, transport: Transport, layout: Layout, p: Any, tokens_metric: str | None,
               progress: Progress, deadline_s: float) -> Readiness:
    t0 = time.monotonic()
    nodes = list(layout.nodes)
    last = ""
    pending = {h.node: h for h in layout.heads()}
    next_logs = 0.0
    while True:
        elapsed = time.monotonic() - t0
        for node, head in list(pending.items()):
            ok, detail = probe_endpoint(endpoint_url(inv, head), p.model.served_name, tokens_metric,
                                        smoke=p.serve.smoke_request)
            if ok:
                progress(node, "ready", f"{p.model.served_name} serving after {elapsed:.1f} s")
                del pending[node]
            else:
                last = detail
        if not pending:
            return Readiness(True, "serving", time.monotonic() - t0)
        if time.monotonic() >= next_logs:
            alive = engines_alive(inv, transport, nodes)
            dead = [n for n, a in alive.items() if not a]
            tails = tail_logs(inv, transport, nodes, 1)
            for n in nodes:
                progress(n, "waiting", f"{elapsed:5.1f}s  {tails.get(n, '').strip()[-100:]}")
            if dead:
                return Readiness(False, f"rank on {', '.join(dead)} exited before the endpoint was ready", elapsed)
            next_logs = time.monotonic() + 2.0
        if elapsed > deadline_s:
            return Readiness(False, f"not ready within {deadline_s:.0f} s: {last}", elapsed)
        time.sleep(0.3)


# --------------------------------------------------------------------------- up


def _record_for(res: Resolved, rendering: Rendering, sets: Sequence[str], state: str,
                waivers: Mapping[str, laws.Waiver], started_at: str) -> RunRecord:
    p = res.profile
    nodes = {}
    for r in rendering.layout.ranks:
        nodes[r.node] = NodeRecord(rank=r.rank, replica=r.replica, hash=rendering.node_hash(r.node),
                                   files={k: f.sha256 for k, f in rendering.files[r.node].items()},
                                   supervisor=res.for_node(r.node).supervisor)
    return RunRecord(profile=res.name, sets=tuple(sets), digest=res.digest(), engine=p.engine.name,
                     engine_version=p.engine.version, served_name=p.model.served_name, port=p.serve.port,
                     heads=tuple(h.node for h in rendering.layout.heads()), nodes=nodes, state=state,
                     started_at=started_at, updated_at=now_iso(), clock_cap_mhz=p.laws.clock_cap_mhz,
                     waivers={k: w.reason for k, w in waivers.items()})


@dataclass
class _Where:
    """The phase an operation is in, so every error it raises can name it.

    ``with where:`` around the operation re-raises its sparkctl errors and
    Ctrl-C as :meth:`annotate` makes them.
    """

    op: str
    phase: str = "lock"

    def __enter__(self) -> _Where:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, (SparkctlError, KeyboardInterrupt)):
            new = self.annotate(exc)
            if new is not exc:
                raise new from None

    def annotate(self, exc: BaseException) -> BaseException:
        """The same error, its message prefixed with the operation and the phase (once)."""
        if isinstance(exc, KeyboardInterrupt):
            return Interrupted(f"{self.op} interrupted in phase {self.phase}",
                               hint="what this run started was stopped; `sparkctl status` shows what runs")
        if isinstance(exc, SparkctlError) and " in phase " not in exc.message:
            new = type(exc)(f"{self.op} failed in phase {self.phase}: {exc.message}", exc.ref, exc.hint)
            new.phase = self.phase  # type: ignore[attr-defined]
            return new
        return exc


# Phases of `up` that change no stack: a failure there leaves the previous one serving.
UNCHANGED_PHASES = ("lock", "plan", "check", "clock")


def _write_not_serving(inv: Inventory, transport: Transport, rec: RunRecord) -> None:
    """Record a state that claims nothing serves; if the head cannot take the write
    (a full disk), remove its record instead: no record also claims nothing serves,
    and a stale "serving" must never outlive the stack it describes."""
    try:
        write_record(inv, transport, rec)
    except LifecycleError:
        head = head_node(inv)
        transport.run(head, f"rm -f {shlex.quote(_p(inv, head, RECORD_PATH))}", sudo=_sudo(inv, head))
        raise


def up(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
       sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
       secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
       skip_check: bool = False, lock: bool = True) -> UpResult:
    say = progress or (lambda *_: None)
    waivers = dict(waivers or {})
    where = _Where(f"up {res.name}")
    guard = ClusterLock(inv, transport, f"up {res.name}") if lock else None
    with where:
        if guard:
            guard.acquire()
        try:
            return _up(res, inv, transport, roots, sets, waivers, secrets or {}, say, skip_check, where)
        finally:
            if guard:
                guard.release()


def _up(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, sets: Sequence[str],
        waivers: dict[str, laws.Waiver], secrets: Mapping[str, str], say: Progress, skip_check: bool,
        where: _Where) -> UpResult:
    phases: list[PhaseTime] = []
    t = time.monotonic()

    def phase(name: str, nxt: str) -> None:
        nonlocal t
        now = time.monotonic()
        phases.append(PhaseTime(name, now - t))
        t = now
        where.phase = nxt

    where.phase = "plan"
    p = res.profile
    rendering = render(res, inv, roots, secrets, reveal_secrets=True)
    layout = rendering.layout
    steps = plan_up(res, inv, rendering)
    say("*", "plan", f"{len(steps)} steps on {', '.join(layout.nodes)}")
    prev = read_record(inv, transport)
    phase("plan", "check")

    # No-op or partial restart: compare the stable per-node hashes with the record.
    changed = list(layout.nodes)
    if prev and prev.profile == res.name and prev.state == "serving" and set(prev.nodes) == set(layout.nodes):
        changed = [n for n in layout.nodes if prev.nodes[n].hash != rendering.node_hash(n)]
        alive = engines_alive(inv, transport, list(layout.nodes))
        healthy = all(alive.values()) and all(
            probe_endpoint(endpoint_url(inv, h), p.model.served_name, None, smoke=False)[0] for h in layout.heads())
        if not changed and healthy:
            say("*", "noop", f"{res.name} already serving with the same files on every node: nothing to do")
            return UpResult(res.name, "noop", prev, tuple(phases), None)
        if not healthy:
            changed = list(layout.nodes)
    # A rank cannot rejoin its communicator: restart whole replicas that changed.
    replicas = {layout.rank_of(n).replica for n in changed}
    restart = [r.node for r in layout.ranks if r.replica in replicas]

    report = None
    if not skip_check:
        say("*", "check", "probing every node and judging the laws")
        report = run_check(res, inv, transport, waivers=waivers, fix=False, bandwidth_s=0,
                           progress=lambda m: say("*", "check", m))
        # served_model: the endpoint about to be replaced; clock_cap: applied next.
        failures = [v for v in report.verdicts if v.failed and v.law not in ("served_model", "clock_cap")]
        phase("check", "clock")
        if failures:
            first = failures[0]
            where.phase = "check"
            raise CheckFailed(f"{len(failures)} law(s) fail; first: {first.law} on {first.node}: {first.observed}",
                              Ref(node=first.node), hint=first.fix or "run `sparkctl check PROFILE` for the table")
    where.phase = "clock"
    if p.laws.clock_cap_mhz is not None:
        cmds = {n: " && ".join(laws.clock_lock_commands(p.laws.clock_cap_mhz, inv.node(n).prefix, inv.node(n).proc_root))
                for n in layout.nodes}
        say("*", "clock", f"nvidia-smi -lgc 0,{p.laws.clock_cap_mhz} on {len(cmds)} nodes")
        _fail_on(transport.run_all(cmds, sudo=any(_sudo(inv, n) for n in cmds)), "applying the clock cap")
        phase("clock", "stop-stale")
    where.phase = "stop-stale"
    started_at = now_iso()
    # Stop what runs: the previous stack anywhere in the inventory, or the replicas we restart.
    stale_nodes = list(inv.names) if not prev or prev.profile != res.name or restart == list(layout.nodes) else restart
    ports = sorted({p.serve.port, p.serve.master_port} | ({prev.port} if prev else set()))
    # The record changes before the cluster does: if the head cannot take it (a full
    # disk), nothing has been touched yet and the previous record still tells the truth.
    rec = _record_for(res, rendering, sets, "starting", waivers, started_at)
    write_record(inv, transport, replace(rec, note=f"replacing {prev.profile}" if prev and prev.profile != res.name
                                         else rec.note))

    started: list[str] = []
    try:
        say("*", "stop-stale", f"stopping sparkctl engines on {', '.join(stale_nodes)}")
        left = stop_engines(inv, transport, stale_nodes, ports, p.serve.stop_timeout_s)
        if left:
            n, what = sorted(left.items())[0]
            raise LifecycleError(f"could not stop the previous engine on {n}: {what}", Ref(node=n, command="stop"),
                                 hint="stop it by hand; a new rank must never join an old head's rendezvous")
        phase("stop-stale", "push")
        say("*", "push", f"writing {sum(len(rendering.files[n]) for n in restart)} files to {len(restart)} nodes")
        push_files(inv, transport, rendering, restart)
        phase("push", "start")
        # A fresh log per start, so progress and failure reports show this run's lines.
        logs = {n: f"f={shlex.quote(_p(inv, n, LOG_DIR + '/engine.log'))}; [ -e \"$f\" ] && mv -f \"$f\" \"$f.1\"; true"
                for n in restart}
        transport.run_all(logs, sudo=any(_sudo(inv, n) for n in restart))
        systemd_nodes = [n for n in restart if res.for_node(n).supervisor == "systemd"]
        if systemd_nodes:
            _fail_on(transport.run_all({n: "systemctl daemon-reload" for n in systemd_nodes},
                                       sudo=any(_sudo(inv, n) for n in systemd_nodes)), "systemctl daemon-reload")
        for group in layout.start_sequence():
            group = tuple(r for r in group if r.node in restart)
            if not group:
                continue
            say("*", "start", ", ".join(f"{r.node} (rank {r.rank})" for r in group))
            cmds = {r.node: _start_command(inv, r.node, res.for_node(r.node).supervisor) for r in group}
            started.extend(cmds)
            _fail_on(transport.run_all(cmds, sudo=any(_sudo(inv, n) for n in cmds)), "starting the engine")
        phase("start", "ready")
        from sparkctl.plan.render import TOKENS_METRIC

        ready = wait_ready(inv, transport, layout, p, p.serve.tokens_metric or TOKENS_METRIC[p.engine.name], say,
                           p.serve.ready_timeout_s)
        if not ready.ok:
            tails = tail_logs(inv, transport, list(layout.nodes), 15)
            raise LifecycleError(f"{res.name} did not become ready: {ready.detail}", Ref(node=layout.heads()[0].node),
                                 hint="last log lines:\n" + "\n".join(
                                     f"  [{n}] {line}" for n in layout.nodes for line in tails[n].splitlines()[-6:]))
        phase("ready", "record")
        rec = replace(rec, state="serving", updated_at=now_iso(), note="")
        write_record(inv, transport, rec)
        phase("record", "done")
        return UpResult(res.name, "started" if restart == list(layout.nodes) else "restarted", rec, tuple(phases),
                        report, ready_s=ready.seconds, restarted_nodes=tuple(restart))
    except BaseException as exc:
        # Never half-up: stop what this run started (and what it was stopping), and say so in the record.
        say("*", "rollback", f"stopping what was started ({type(exc).__name__})")
        stop_engines(inv, transport, list(dict.fromkeys([*layout.nodes, *stale_nodes])), ports,
                     p.serve.stop_timeout_s)
        try:
            failed = _record_for(res, rendering, sets, "failed" if not isinstance(exc, KeyboardInterrupt) else "stopped",
                                 waivers, started_at)
            _write_not_serving(inv, transport, replace(
                failed, note=f"{where.op} {'interrupted' if isinstance(exc, KeyboardInterrupt) else 'failed'} "
                             f"in phase {where.phase}: {type(exc).__name__}: {exc}"[:300]))
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise


# --------------------------------------------------------------------------- down


def down(inv: Inventory, transport: Transport, *, reset_clocks: bool = False, progress: Progress | None = None,
         lock: bool = True) -> DownResult:
    say = progress or (lambda *_: None)
    where = _Where("down")
    guard = ClusterLock(inv, transport, "down") if lock else None
    with where:
        if guard:
            try:
                guard.acquire()
            except LockUnavailable as exc:
                # Stopping is what an operator needs most on a full disk, and no other
                # sparkctl can hold or take the lock while no lock dir can be made.
                say("*", "lock", f"{exc.message}: stopping without the lock")
                guard = None
        try:
            return _down(inv, transport, reset_clocks, say, where)
        finally:
            if guard:
                guard.release()


def _down(inv: Inventory, transport: Transport, reset_clocks: bool, say: Progress, where: _Where) -> DownResult:
    where.phase = "plan"
    prev = read_record(inv, transport)
    nodes = list(inv.names)
    ports = sorted({prev.port} if prev else set())
    if prev:
        # reverse start order: heads last started with workers-first, so stop heads first
        order = list(prev.heads) + [n for n in prev.nodes if n not in prev.heads]
        nodes = order + [n for n in inv.names if n not in order]
    where.phase = "stop"
    record_error: LifecycleError | None = None
    if prev and prev.state not in ("stopped", "failed"):
        # Before anything stops: an interrupted or half-done down never leaves "serving" behind.
        try:
            _write_not_serving(inv, transport, prev.with_state("stopping", now_iso(), "down in progress"))
        except LifecycleError as exc:
            record_error = exc  # down still stops everything; the error is reported at the end
    say("*", "stop", f"stopping sparkctl engines on {', '.join(nodes)}")
    try:
        left = stop_engines(inv, transport, nodes, ports)
    except KeyboardInterrupt:
        if prev and record_error is None:
            try:
                _write_not_serving(inv, transport, prev.with_state(
                    "failed", now_iso(), "down interrupted in phase stop: ranks may still run; run down again"))
            except LifecycleError:
                pass
        raise
    where.phase = "record"
    if prev and prev.state != "stopped" and record_error is None:
        note = "down" if not left else "down left " + "; ".join(f"{n}: {w}" for n, w in sorted(left.items()))
        try:
            _write_not_serving(inv, transport, prev.with_state("stopped" if not left else "failed", now_iso(),
                                                               note[:300]))
        except LifecycleError as exc:
            record_error = exc
    if record_error is not None:
        raise LifecycleError(f"engines stopped{' except on ' + ', '.join(sorted(left)) if left else ''}, but "
                             f"{record_error.message}; the head's record was removed (no record: nothing runs)",
                             record_error.ref, hint=record_error.hint)
    where.phase = "verify"
    # The leak law: memory not given back after the engines are gone.
    leaks: dict[str, float] = {}
    for n, r in transport.run_all({n: f"cat {shlex.quote(inv.node(n).proc_root.rstrip('/') + '/meminfo')}"
                                   for n in nodes}).items():
        if r.ok:
            try:
                m = probes.parse_meminfo(r.stdout)
                held = (m.total_kib - m.available_kib) / 1024 / 1024
                if held > laws.LEAK_THRESHOLD_GIB:
                    leaks[n] = held
            except probes.ProbeParseError:
                pass
    reset: list[str] = []
    if reset_clocks:
        rs = transport.run_all({n: "nvidia-smi -rgc && rm -f "
                                + shlex.quote(_p(inv, n, "/var/lib/sparkctl/clock-lock")) for n in nodes},
                               sudo=any(_sudo(inv, n) for n in nodes))
        reset = [n for n, r in rs.items() if r.ok]
    return DownResult(tuple(nodes), left, leaks, tuple(reset))


# --------------------------------------------------------------------------- switch


def switch(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *, sets: Sequence[str] = (),
           waivers: Mapping[str, laws.Waiver] | None = None, secrets: Mapping[str, str] | None = None,
           progress: Progress | None = None) -> SwitchResult:
    """Down the current stack, up the new one; on failure bring the previous one back.

    Ctrl-C does not roll back: what this run started is stopped and the record
    says so (the operator asked sparkctl to stop, not to start something else).
    """
    say = progress or (lambda *_: None)
    where = _Where(f"switch {res.name}")
    with where, ClusterLock(inv, transport, f"switch {res.name}"):
        return _switch(res, inv, transport, roots, sets, waivers, secrets, progress, say, where)


def _switch(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, sets: Sequence[str],
            waivers: Mapping[str, laws.Waiver] | None, secrets: Mapping[str, str] | None, progress: Progress | None,
            say: Progress, where: _Where) -> SwitchResult:
    where.phase = "plan"
    prev = read_record(inv, transport)
    prev_res = None
    if prev and prev.state == "serving" and prev.profile != res.name:
        prev_res = resolve(prev.profile, roots, prev.sets)
    t_down = time.monotonic()
    try:
        result = up(res, inv, transport, roots, sets=sets, waivers=waivers, secrets=secrets, progress=progress,
                    lock=False)
        # The old endpoint serves through plan, check and clock; it is gone from
        # stop-stale until the new one is ready.
        unavailable = sum(p.seconds for p in result.phases if p.phase in ("stop-stale", "push", "start", "ready"))
        return SwitchResult(res.name, True, False, unavailable if prev_res else 0.0, up=result)
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: restore the previous stack
        if prev_res is None or getattr(exc, "phase", None) in UNCHANGED_PHASES:
            raise  # nothing was stopped: the previous stack serves on, the record says so
        say("*", "rollback", f"{res.name} failed ({exc}); bringing {prev.profile} back")  # type: ignore[union-attr]
        prev_waivers = {k: laws.Waiver(k, v) for k, v in prev.waivers.items()}  # type: ignore[union-attr]
        where.phase = "rollback"
        try:
            up(prev_res, inv, transport, roots, sets=prev.sets, waivers=prev_waivers,  # type: ignore[union-attr]
               secrets=secrets, progress=progress, lock=False, skip_check=True)
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception as exc2:  # noqa: BLE001
            raise LifecycleError(f"switch to {res.name} failed ({exc}) and restoring {prev_res.name} failed too: "
                                 f"{exc2}", getattr(exc2, "ref", None) or getattr(exc, "ref", None),
                                 hint="`sparkctl status` shows what runs; `sparkctl up` a profile") from None
        # prove the restored stack serves its own name
        head = next(iter(prev.heads))  # type: ignore[union-attr]
        ok, detail = probe_endpoint(f"http://{inv.node(head).host}:{prev.port}", prev.served_name, None,  # type: ignore[union-attr]
                                    smoke=True)
        if not ok:
            raise LifecycleError(f"switch {res.name} failed and in phase rollback restored {prev_res.name}, but it "
                                 f"does not serve {prev.served_name}: {detail}", Ref(node=head))  # type: ignore[union-attr]
        return SwitchResult(prev_res.name, False, True, time.monotonic() - t_down,
                            error=exc.one_line() if isinstance(exc, SparkctlError) else str(exc))


# --------------------------------------------------------------------------- supervised switch
#
# `switch --supervise`: the operator's side checks, renders and stages the new
# stack's files on every node, then hands the switch (and the cluster lock) to a
# POSIX sh supervisor started detached on the head. The supervisor reaches its
# peers by ssh over the fabric with a key of its own, keeps the files in place
# for the way back, and either ends with the new stack serving (phase "done") or
# with the previous one serving its own name again (phase "rolled-back").

SUPERVISOR_SCRIPT = "/var/lib/sparkctl/supervisor.sh"
SUPERVISOR_EVENTS = "/var/lib/sparkctl/supervisor.jsonl"
SUPERVISOR_PID = "/var/lib/sparkctl/supervisor.pid"
SUPERVISOR_MANIFEST = "/var/lib/sparkctl/supervisor-manifest.json"
SUPERVISOR_LOG = "/var/log/sparkctl/supervisor.log"
SUPERVISOR_KEY = "/var/lib/sparkctl/id_supervisor"
SUPERVISOR_KNOWN_HOSTS = "/var/lib/sparkctl/known_hosts"
STAGED_DIR = "/var/lib/sparkctl/staged"
PREVIOUS_DIR = "/var/lib/sparkctl/previous"
NODE_AUTHORIZED_KEYS = "/etc/sparkctl/authorized_keys"
FINAL_PHASES = ("done", "rolled-back", "failed", "aborted")


@dataclass(frozen=True)
class SupervisedSwitch:
    profile: str
    previous: str | None
    head: str
    pid: int
    log: str
    events_path: str
    events: tuple[dict[str, Any], ...] = ()  # with --wait: every event, the last one final

    @property
    def phase(self) -> str:
        return self.events[-1].get("phase", "") if self.events else "started"


def _staged(inv: Inventory, node: str, profile: str, path: str) -> str:
    return _p(inv, node, f"{STAGED_DIR}/{profile}") + path


def _as_node(inv: Inventory, node: str, head: str, cmd: str) -> str:
    """A command as the supervisor runs it on ``node``; the head's already runs with its sudo."""
    if node != head and _sudo(inv, node):
        return f"sudo -n sh -c {shlex.quote(cmd)}"
    return cmd


def fabric_address_from(inv: Inventory, head: str, peer: str) -> str:
    """The address the head reaches ``peer`` at over the fabric: a shared link, else the peer's own."""
    link = inv.link_between(head, peer)
    if link is not None:
        return link.end(peer).address
    addr = inv.primary_address(peer)
    if not addr:
        raise LifecycleError(f"{peer} has no fabric address the supervisor on {head} could reach", Ref(node=peer),
                             hint="a supervised switch needs a cabled fabric between the head and every peer")
    return addr


def _known_hosts_name(addr: str, port: int) -> str:
    return addr if port == 22 else f"[{addr}]:{port}"


def _provision_supervisor_ssh(inv: Inventory, transport: Transport, head: str, say: Progress) -> dict[str, str]:
    """The supervisor's key pair, authorized on every peer; the head's known_hosts for the fabric.

    The key pair is generated once on the operator's side. Host keys come from the
    operator's own verified connections (no trust-on-first-use from the head).
    Returns peer -> fabric address.
    """
    import os
    import subprocess

    local = cluster_dir(inv) / "id_supervisor"
    local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not local.exists() or not local.with_suffix(".pub").exists():
        local.unlink(missing_ok=True)
        local.with_suffix(".pub").unlink(missing_ok=True)
        r = subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", f"sparkctl-supervisor@{inv.name}",
                            "-f", str(local)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise LifecycleError(f"ssh-keygen failed: {r.stderr.strip()}", hint="is OpenSSH's ssh-keygen installed?")
    os.chmod(local, 0o600)
    pub = local.with_suffix(".pub").read_text().strip()
    fetch = getattr(transport, "fetch_host_key", None)
    if fetch is None:
        raise LifecycleError("a supervised switch needs the SSH transport (to read the peers' host keys)")
    peers = [n for n in inv.names if n != head]
    addrs = {n: fabric_address_from(inv, head, n) for n in peers}
    head_addrs = sorted({e.address for e in inv.endpoints(head)})
    # restrict: no forwarding or pty; from=: only the head's fabric addresses may use the key.
    opts = "restrict" + (f',from="{",".join(head_addrs)}"' if head_addrs else "")
    line = f"{opts} {pub}"
    known: list[str] = []
    for n in peers:
        try:
            ktype, _fp, blob = fetch(n)
        except Exception as exc:  # noqa: BLE001 - a transport error names the node
            raise LifecycleError(f"cannot read the host key of {n}: {exc}", Ref(node=n)) from None
        known.append(f"{_known_hosts_name(addrs[n], inv.node(n).ssh_port)} {ktype} {blob}")
    q = shlex.quote
    add = ("f={f}; mkdir -p \"$(dirname \"$f\")\"; touch \"$f\"; chmod 600 \"$f\"; "
           "grep -qxF {line} \"$f\" || printf '%s\\n' {line} >> \"$f\"")
    for sudo in (True, False):
        cmds = {n: add.format(f=q(_p(inv, n, NODE_AUTHORIZED_KEYS)), line=q(line)) for n in peers if _sudo(inv, n) == sudo}
        if cmds:
            _fail_on(transport.run_all(cmds, sudo=sudo), "authorizing the supervisor's key")
    # On a real host sshd reads the ssh user's ~/.ssh/authorized_keys; a simulated node
    # (SPARKCTL_SIM_NODE in its session) reads the file above, and its ~ is the host's.
    user = {n: ("[ -n \"${SPARKCTL_SIM_NODE:-}\" ] && exit 0; "
                + add.format(f="\"$HOME/.ssh/authorized_keys\"", line=q(line)).replace("mkdir -p", "mkdir -m 700 -p"))
            for n in peers}
    if user:
        _fail_on(transport.run_all(user), "authorizing the supervisor's key in ~/.ssh/authorized_keys")
    hs = _sudo(inv, head)
    for path, data, mode in ((SUPERVISOR_KEY, local.read_bytes(), 0o600),
                             (SUPERVISOR_KNOWN_HOSTS, ("\n".join(known) + "\n").encode(), 0o644)):
        r = transport.put(head, _p(inv, head, path), data, mode, sudo=hs)
        if not r.ok:
            raise LifecycleError(f"cannot write {path} on {head}: {r.error or r.stderr.strip()}", Ref(node=head))
    say("*", "supervisor-ssh", f"supervisor key authorized on {', '.join(peers) or 'no peers'}; "
                               f"fabric host keys for {head} from verified connections")
    return addrs


def _ssh_prefix(inv: Inventory, head: str, peer: str, addr: str) -> str:
    n = inv.node(peer)
    argv = ["ssh", "-F", "/dev/null", "-n", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={_p(inv, head, SUPERVISOR_KNOWN_HOSTS)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-i", _p(inv, head, SUPERVISOR_KEY), "-p", str(n.ssh_port), f"{n.ssh_user}@{addr}"]
    return " ".join(shlex.quote(a) for a in argv)


def _ready_probe(served_name: str) -> tuple[str, str]:
    """(substring of /v1/models with whitespace removed, 1-token completion body)."""
    pattern = '"id":' + json.dumps(served_name, ensure_ascii=False).replace(" ", "")
    body = json.dumps({"model": served_name, "prompt": "ping", "max_tokens": 1, "temperature": 0})
    return pattern, body


def _backup_cmd(inv: Inventory, node: str, paths: Sequence[str]) -> str:
    """Copy each file in place to previous/ (or mark it absent), for the way back."""
    prev_dir = _p(inv, node, PREVIOUS_DIR)
    lines = [f"rm -rf {shlex.quote(prev_dir)}", f"mkdir -p {shlex.quote(prev_dir)}"]
    for path in sorted(set(paths)):
        b = prev_dir + path
        lines.append(f"mkdir -p {shlex.quote(b.rsplit('/', 1)[0])} && "
                     f"if [ -e {shlex.quote(path)} ]; then cp -p {shlex.quote(path)} {shlex.quote(b)}; "
                     f"else : > {shlex.quote(b + '.absent')}; fi")
    return " && ".join(lines) if len(lines) > 2 else "; ".join(lines)


def _restore_cmd(inv: Inventory, node: str, paths: Sequence[str], systemd: bool) -> str:
    prev_dir = _p(inv, node, PREVIOUS_DIR)
    lines = ["set -e"]
    for path in sorted(set(paths)):
        b, q = prev_dir + path, shlex.quote
        lines.append(f"if [ -e {q(b)} ]; then cp -p {q(b)} {q(path + '.sparkctl-new')} && "
                     f"mv -f {q(path + '.sparkctl-new')} {q(path)}; elif [ -e {q(b + '.absent')} ]; then rm -f {q(path)}; fi")
    if systemd:
        lines.append("systemctl daemon-reload")
    return "\n".join(lines)


def _install_cmd(inv: Inventory, node: str, profile: str, rendering: Rendering, systemd: bool) -> str:
    q = shlex.quote
    log = _p(inv, node, LOG_DIR + "/engine.log")
    lines = ["set -e"]
    for f in sorted(rendering.files[node].values(), key=lambda f: f.path):
        src, tmp = _staged(inv, node, profile, f.path), f.path + ".sparkctl-new"
        lines.append(f"mkdir -p {q(f.path.rsplit('/', 1)[0] or '/')}; cp {q(src)} {q(tmp)}; chmod {f.mode:o} {q(tmp)}; "
                     f"mv -f {q(tmp)} {q(f.path)}")
    lines.append(f"rm -rf {q(_p(inv, node, f'{STAGED_DIR}/{profile}'))}")
    if systemd:
        lines.append("systemctl daemon-reload")
    # a fresh log per start, as `up` does
    lines.append(f"f={q(log)}; if [ -e \"$f\" ]; then mv -f \"$f\" \"$f.1\"; fi")
    return "\n".join(lines)


def switch_supervised(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
                      sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
                      secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
                      wait: bool = False, wait_timeout_s: float | None = None,
                      skip_check: bool = False) -> SupervisedSwitch:
    """Stage the new stack, then hand the switch to a detached supervisor on the head.

    Returns as soon as the supervisor has taken the lock (or, with ``wait``,
    when it reports a final phase). Nothing is stopped on the operator's side.
    """
    say = progress or (lambda *_: None)
    waivers = dict(waivers or {})
    head = head_node(inv)
    guard = ClusterLock(inv, transport, f"switch --supervise {res.name}")
    guard.acquire()
    try:
        p = res.profile
        prev = read_record(inv, transport)
        if not skip_check:
            say("*", "check", "probing every node and judging the laws")
            report = run_check(res, inv, transport, waivers=waivers, fix=False, bandwidth_s=0,
                               progress=lambda m: say("*", "check", m))
            failures = [v for v in report.verdicts if v.failed and v.law not in ("served_model", "clock_cap")]
            if failures:
                first = failures[0]
                raise CheckFailed(f"{len(failures)} law(s) fail; first: {first.law} on {first.node}: {first.observed}",
                                  Ref(node=first.node), hint=first.fix or "run `sparkctl check PROFILE` for the table")
        rendering = render(res, inv, roots, secrets or {}, reveal_secrets=True)
        layout = rendering.layout
        if layout.heads()[0].node != head:
            raise LifecycleError(f"{res.name} serves from {layout.heads()[0].node}, not from {head} where the "
                                 "supervisor runs", hint="use `switch` without --supervise")
        if p.laws.clock_cap_mhz is not None:
            cmds = {n: " && ".join(laws.clock_lock_commands(p.laws.clock_cap_mhz, inv.node(n).prefix,
                                                             inv.node(n).proc_root)) for n in layout.nodes}
            _fail_on(transport.run_all(cmds, sudo=any(_sudo(inv, n) for n in cmds)), "applying the clock cap")
        # 1. stage the new files beside their final paths (atomic puts)
        say("*", "stage", f"staging {sum(len(rendering.files[n]) for n in layout.nodes)} files on "
                          f"{len(layout.nodes)} nodes")
        staged = Rendering(layout, {n: {_staged(inv, n, res.name, f.path): replace(f, path=_staged(inv, n, res.name, f.path))
                                        for f in rendering.files[n].values()} for n in layout.nodes})
        push_files(inv, transport, staged, list(layout.nodes))
        # 2. the supervisor's own ssh to its peers
        addrs = _provision_supervisor_ssh(inv, transport, head, say)
        # 3. the plan, rendered into one script
        prev_res = resolve(prev.profile, roots, prev.sets) if prev and prev.state == "serving" else None
        prev_layout = bind(prev_res, inv) if prev_res else None
        all_ports = sorted({p.serve.port, p.serve.master_port} | ({prev.port} if prev else set()))
        new_systemd = {n for n in layout.nodes if res.for_node(n).supervisor == "systemd"}
        prev_systemd = {n for n, r in prev.nodes.items() if r.supervisor == "systemd"} if prev_res and prev else set()
        prev_files = {n: list(r.files) for n, r in prev.nodes.items()} if prev_res and prev else {}
        nodes_info: dict[str, dict[str, Any]] = {}
        for n in inv.names:
            touched = list(rendering.files.get(n, {})) + prev_files.get(n, [])
            stop = STOP_SCRIPT.format(
                unit=shlex.quote(_p(inv, n, UNIT)), detached=shlex.quote(_p(inv, n, DETACHED)),
                wait_ds=int(p.serve.stop_timeout_s * 10), pattern=shlex.quote(probes.ENGINE_REGEX),
                ports=" ".join(str(int(x)) for x in all_ports) or "0")
            nodes_info[n] = {
                "name": n, "head": n == head,
                "ssh": "" if n == head else _ssh_prefix(inv, head, n, addrs[n]),
                "fabric_address": None if n == head else addrs[n],
                "stop": _as_node(inv, n, head, stop),
                "backup": _as_node(inv, n, head, _backup_cmd(inv, n, touched)),
                "restore": _as_node(inv, n, head, _restore_cmd(inv, n, touched, n in prev_systemd)),
                "install": (_as_node(inv, n, head, _install_cmd(inv, n, res.name, rendering, n in new_systemd))
                            if n in rendering.files else ""),
            }
        start_groups = [[{**nodes_info[r.node], "rank": r.rank,
                          "start": _as_node(inv, r.node, head, _start_command(inv, r.node, res.for_node(r.node).supervisor))}
                         for r in g] for g in layout.start_sequence()]
        stop_order = [nodes_info[r.node] for g in layout.stop_sequence() for r in g]
        if prev_layout:
            stop_order = [nodes_info[r.node] for g in prev_layout.stop_sequence() for r in g
                          if r.node not in layout.nodes] + stop_order
        stop_order += [nodes_info[n] for n in inv.names if n not in {x["name"] for x in stop_order}]
        started_at = now_iso()
        new_rec = replace(_record_for(res, rendering, sets, "serving", waivers, started_at),
                          note="switched by the supervisor")
        failed_rec = replace(new_rec, state="failed", note="supervised switch failed; nothing serves")
        pattern, body = _ready_probe(p.model.served_name)
        prev_ctx = None
        if prev_res and prev and prev_layout:
            ppat, pbody = _ready_probe(prev.served_name)
            prev_ctx = {
                "profile": prev.profile, "served_name": prev.served_name, "port": prev.port,
                "pattern": ppat, "body": pbody, "deadline_s": int(prev_res.profile.serve.ready_timeout_s),
                "nodes": list(prev_layout.nodes),
                "start": [[{**nodes_info[r.node], "start": _as_node(inv, r.node, head, _start_command(
                    inv, r.node, prev.nodes[r.node].supervisor if r.node in prev.nodes else "detached"))}
                           for r in g] for g in prev_layout.start_sequence()],
                "record_json": json.dumps(replace(prev, state="serving", updated_at=started_at,
                                                  note="rolled back by supervisor").to_dict(), sort_keys=True),
            }
        events = _p(inv, head, SUPERVISOR_EVENTS)
        ctx = dict(
            version=__import__("sparkctl").__version__, profile=res.name, prev_profile=prev.profile if prev_ctx else None,
            head=head, head_json=json.dumps(head), operation_json=json.dumps(f"switch --supervise {res.name}"),
            events=events, pid_file=_p(inv, head, SUPERVISOR_PID), lock_dir=_p(inv, head, LOCK_DIR), record_path=_p(inv, head, RECORD_PATH),
            nodes=[nodes_info[n] for n in inv.names], stop_order=stop_order, start=start_groups,
            alive_cmd=f"ps -eo pid,args | grep -iE -e {shlex.quote(probes.ENGINE_REGEX)} >/dev/null",
            port=p.serve.port, served_name=p.model.served_name, pattern=pattern, body=body,
            deadline_s=int(p.serve.ready_timeout_s), new_nodes=list(layout.nodes),
            record_json=json.dumps(new_rec.to_dict(), sort_keys=True),
            failed_record_json=json.dumps(failed_rec.to_dict(), sort_keys=True), prev=prev_ctx,
        )
        script = template_env(roots).get_template("supervisor.sh.j2").render(**ctx)
        manifest = {
            "profile": res.name, "previous": prev_ctx and {k: prev_ctx[k] for k in ("profile", "served_name", "port",
                                                                                    "deadline_s", "nodes")},
            "head": head, "endpoint": {"port": p.serve.port, "served_name": p.model.served_name,
                                       "ready_timeout_s": p.serve.ready_timeout_s},
            "start_order": [[r.node for r in g] for g in layout.start_sequence()],
            "previous_start_order": [[r.node for r in g] for g in prev_layout.start_sequence()] if prev_layout else None,
            "stop_order": [x["name"] for x in stop_order],
            "nodes": {n: {"fabric_address": nodes_info[n]["fabric_address"],
                          "supervisor": res.for_node(n).supervisor if n in rendering.files else None,
                          "files": [{"staged": _staged(inv, n, res.name, f.path), "final": f.path, "mode": f"{f.mode:o}"}
                                    for f in sorted(rendering.files.get(n, {}).values(), key=lambda f: f.path)]}
                      for n in inv.names},
        }
        hs = _sudo(inv, head)
        for path, data, mode in ((SUPERVISOR_MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n", 0o644),
                                 (SUPERVISOR_SCRIPT, script, 0o700)):
            r = transport.put(head, _p(inv, head, path), data.encode(), mode, sudo=hs)
            if not r.ok:
                raise LifecycleError(f"cannot write {path} on {head}: {r.error or r.stderr.strip()}", Ref(node=head))
        # 4. start it detached from this session; it takes the lock over and says "started"
        q = shlex.quote
        log = _p(inv, head, SUPERVISOR_LOG)
        launch = (f"mkdir -p {q(log.rsplit('/', 1)[0])} && : > {q(events)} && "
                  f"setsid sh {q(_p(inv, head, SUPERVISOR_SCRIPT))} </dev/null >>{q(log)} 2>&1 & "
                  f"echo \"pid:$!\"")
        # Recorded before the supervisor starts, so its final record can never be overwritten by ours.
        if prev:
            write_record(inv, transport, prev.with_state(
                "switching", now_iso(), f"switching to {res.name}: supervised on {head}, log {log}"))
        r = transport.run(head, launch, sudo=hs)
        pid = next((int(x[4:]) for x in r.stdout.split() if x.startswith("pid:") and x[4:].isdigit()), 0)
        if not r.ok or not pid:
            if prev:
                write_record(inv, transport, prev)
            raise LifecycleError(f"cannot start the supervisor on {head}: {r.error or r.stderr.strip()}", Ref(node=head))
        t0 = time.monotonic()
        while True:
            evs = read_supervisor_events(inv, transport)
            first = next((e for e in evs if e.get("phase") == "started"), None)
            if first is not None:
                pid = int(first.get("pid") or pid)  # setsid may fork: the script's own $$ counts
                break
            if time.monotonic() - t0 > 15:
                raise LifecycleError(f"the supervisor (pid {pid}) on {head} did not start", Ref(node=head),
                                     hint=f"see {log} on {head}")
            time.sleep(0.2)
        say(head, "supervisor", f"pid {pid} switches to {res.name}; progress in {events}")
    finally:
        guard.release()  # a no-op once the supervisor holds the lock: the holder is no longer us
    result = SupervisedSwitch(res.name, prev.profile if prev else None, head, pid, log, events)
    if not wait:
        return result
    deadline = time.monotonic() + (wait_timeout_s or (p.serve.ready_timeout_s * 2 + 120))
    seen = 0
    while time.monotonic() < deadline:
        evs = read_supervisor_events(inv, transport)
        for e in evs[seen:]:
            say(e.get("node", "*"), e.get("phase", "?"), e.get("message", ""))
        seen = len(evs)
        if evs and evs[-1].get("phase") in FINAL_PHASES:
            return replace(result, events=tuple(evs))
        time.sleep(0.5)
    raise LifecycleError(f"the supervisor on {head} did not finish in time", Ref(node=head),
                         hint="`sparkctl status` shows its progress; it keeps going without you")


def read_supervisor_events(inv: Inventory, transport: Transport, tail: int | None = None) -> list[dict[str, Any]]:
    head = head_node(inv)
    path = shlex.quote(_p(inv, head, SUPERVISOR_EVENTS))
    cmd = f"tail -n {int(tail)} {path} 2>/dev/null || true" if tail else f"cat {path} 2>/dev/null || true"
    r = transport.run(head, cmd)
    out = []
    for line in r.stdout.splitlines() if r.ok else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def supervisor_progress(inv: Inventory, transport: Transport, tail: int = 10) -> dict[str, Any] | None:
    """The supervisor's last events and whether it still runs; None when there never was one."""
    head = head_node(inv)
    q = shlex.quote
    ev, pidf = _p(inv, head, SUPERVISOR_EVENTS), _p(inv, head, SUPERVISOR_PID)
    r = transport.run(head, f"[ -e {q(ev)} ] || exit 0; echo exists; p=$(cat {q(pidf)} 2>/dev/null); echo \"pid:$p\"; "
                            f"if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then echo alive; fi; "
                            f"tail -n {int(tail)} {q(ev)}")
    if not r.ok or "exists" not in r.stdout.splitlines()[:1]:
        return None
    lines = r.stdout.splitlines()
    pid = next((ln[4:] for ln in lines if ln.startswith("pid:")), "")
    events = []
    for ln in lines:
        if ln.startswith("{"):
            try:
                events.append(json.loads(ln))
            except ValueError:
                pass
    return {"head": head, "pid": int(pid) if pid.isdigit() else None, "alive": "alive" in lines[:3],
            "phase": events[-1].get("phase") if events else None, "events": events,
            "log": _p(inv, head, SUPERVISOR_LOG)}
