"""up, down, switch: the only code that changes hosts.

Every operation follows its plan (``sparkctl.plan``), fans each step out to all
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

from . import laws, probes
from .check import CheckReport, run_check
from .errors import CheckFailed, LifecycleError, LockHeld, Ref
from .inventory import Inventory
from .layout import Layout, Rank
from .plan import plan_up
from .profiles import Resolved, resolve
from .record import LOCK_DIR, RECORD_PATH, NodeRecord, RunRecord
from .render import DETACHED, LOG_DIR, UNIT, Rendering, render, under
from .resources import Roots
from .state import cluster_dir, read_json, write_json
from .transport import CommandResult, Transport

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


@dataclass
class ClusterLock:
    """mkdir-based lock on the head node; the holder's user@host, pid and time inside."""

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
        d = shlex.quote(self._dir())
        info = json.dumps({"holder": self.holder, "since": now_iso(), "operation": self.operation,
                           "host": socket.gethostname(), "pid": os.getpid()})
        cmd = (f"mkdir -p {shlex.quote(self._dir().rsplit('/', 1)[0])} && mkdir {d} 2>/dev/null && "
               f"printf '%s\\n' {shlex.quote(info)} > {d}/holder && echo acquired || cat {d}/holder 2>/dev/null")
        r = self.transport.run(head, cmd, sudo=_sudo(self.inv, head))
        if not r.ok and "acquired" not in r.stdout:
            raise LifecycleError(f"cannot take the cluster lock on {head}: {r.error or r.stderr.strip()}",
                                 Ref(node=head))
        if "acquired" in r.stdout:
            return
        try:
            other = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            other = {"holder": "unknown", "since": "unknown"}
        if break_stale and other.get("host") == socket.gethostname() and not _pid_alive(other.get("pid")):
            self.transport.run(head, f"rm -rf {d}", sudo=_sudo(self.inv, head))
            return self.acquire(break_stale=False)
        raise LockHeld(
            f"the cluster is locked by {other.get('holder')} since {other.get('since')} "
            f"({other.get('operation', '?')})", Ref(node=head),
            hint="wait for it to finish; if that process is gone, `sparkctl unlock` removes the lock",
        )

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


def _metric_value(text: str, name: str) -> float | None:
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
            before = _metric_value(c.get(f"{url}/metrics").text, tokens_metric) if tokens_metric else None
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
                after = _metric_value(c.get(f"{url}/metrics").text, tokens_metric)
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


def up(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *,
       sets: Sequence[str] = (), waivers: Mapping[str, laws.Waiver] | None = None,
       secrets: Mapping[str, str] | None = None, progress: Progress | None = None,
       skip_check: bool = False, lock: bool = True) -> UpResult:
    say = progress or (lambda *_: None)
    waivers = dict(waivers or {})
    guard = ClusterLock(inv, transport, f"up {res.name}") if lock else None
    if guard:
        guard.acquire()
    try:
        return _up(res, inv, transport, roots, sets, waivers, secrets or {}, say, skip_check)
    finally:
        if guard:
            guard.release()


def _up(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, sets: Sequence[str],
        waivers: dict[str, laws.Waiver], secrets: Mapping[str, str], say: Progress, skip_check: bool) -> UpResult:
    phases: list[PhaseTime] = []
    t = time.monotonic()

    def phase(name: str) -> None:
        nonlocal t
        now = time.monotonic()
        phases.append(PhaseTime(name, now - t))
        t = now

    p = res.profile
    rendering = render(res, inv, roots, secrets, reveal_secrets=True)
    layout = rendering.layout
    steps = plan_up(res, inv, rendering)
    say("*", "plan", f"{len(steps)} steps on {', '.join(layout.nodes)}")
    prev = read_record(inv, transport)
    phase("plan")

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
        phase("check")
        if failures:
            first = failures[0]
            raise CheckFailed(f"{len(failures)} law(s) fail; first: {first.law} on {first.node}: {first.observed}",
                              Ref(node=first.node), hint=first.fix or "run `sparkctl check PROFILE` for the table")
    if p.laws.clock_cap_mhz is not None:
        cmds = {n: " && ".join(laws.clock_lock_commands(p.laws.clock_cap_mhz, inv.node(n).prefix, inv.node(n).proc_root))
                for n in layout.nodes}
        say("*", "clock", f"nvidia-smi -lgc 0,{p.laws.clock_cap_mhz} on {len(cmds)} nodes")
        _fail_on(transport.run_all(cmds, sudo=any(_sudo(inv, n) for n in cmds)), "applying the clock cap")
        phase("clock")
    started_at = now_iso()
    # Stop what runs: the previous stack anywhere in the inventory, or the replicas we restart.
    stale_nodes = list(inv.names) if not prev or prev.profile != res.name or restart == list(layout.nodes) else restart
    ports = sorted({p.serve.port, p.serve.master_port} | ({prev.port} if prev else set()))
    say("*", "stop-stale", f"stopping sparkctl engines on {', '.join(stale_nodes)}")
    left = stop_engines(inv, transport, stale_nodes, ports, p.serve.stop_timeout_s)
    if left:
        n, what = sorted(left.items())[0]
        raise LifecycleError(f"could not stop the previous engine on {n}: {what}", Ref(node=n, command="stop"),
                             hint="stop it by hand; a new rank must never join an old head's rendezvous")
    if prev and prev.profile != res.name:
        write_record(inv, transport, prev.with_state("stopped", now_iso(), f"replaced by {res.name}"))
    phase("stop-stale")

    started: list[str] = []
    try:
        say("*", "push", f"writing {sum(len(rendering.files[n]) for n in restart)} files to {len(restart)} nodes")
        push_files(inv, transport, rendering, restart)
        rec = _record_for(res, rendering, sets, "starting", waivers, started_at)
        write_record(inv, transport, rec)
        phase("push")
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
        phase("start")
        from .render import TOKENS_METRIC

        ready = wait_ready(inv, transport, layout, p, p.serve.tokens_metric or TOKENS_METRIC[p.engine.name], say,
                           p.serve.ready_timeout_s)
        phase("ready")
        if not ready.ok:
            tails = tail_logs(inv, transport, list(layout.nodes), 15)
            raise LifecycleError(f"{res.name} did not become ready: {ready.detail}", Ref(node=layout.heads()[0].node),
                                 hint="last log lines:\n" + "\n".join(
                                     f"  [{n}] {line}" for n in layout.nodes for line in tails[n].splitlines()[-6:]))
        rec = replace(rec, state="serving", updated_at=now_iso())
        write_record(inv, transport, rec)
        phase("record")
        return UpResult(res.name, "started" if restart == list(layout.nodes) else "restarted", rec, tuple(phases),
                        report, ready_s=ready.seconds, restarted_nodes=tuple(restart))
    except BaseException as exc:
        # Never half-up: stop what this run started, and say so in the record.
        say("*", "rollback", f"stopping what was started ({type(exc).__name__})")
        stop_engines(inv, transport, list(layout.nodes), ports, p.serve.stop_timeout_s)
        try:
            failed = _record_for(res, rendering, sets, "failed" if not isinstance(exc, KeyboardInterrupt) else "stopped",
                                 waivers, started_at)
            write_record(inv, transport, replace(failed, note=f"{type(exc).__name__}: {exc}"[:300]))
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise


# --------------------------------------------------------------------------- down


def down(inv: Inventory, transport: Transport, *, reset_clocks: bool = False, progress: Progress | None = None,
         lock: bool = True) -> DownResult:
    say = progress or (lambda *_: None)
    guard = ClusterLock(inv, transport, "down") if lock else None
    if guard:
        guard.acquire()
    try:
        prev = read_record(inv, transport)
        nodes = list(inv.names)
        ports = sorted({prev.port} if prev else set())
        if prev:
            # reverse start order: heads last started with workers-first, so stop heads first
            order = list(prev.heads) + [n for n in prev.nodes if n not in prev.heads]
            nodes = order + [n for n in inv.names if n not in order]
        say("*", "stop", f"stopping sparkctl engines on {', '.join(nodes)}")
        left = stop_engines(inv, transport, nodes, ports)
        if prev and prev.state != "stopped":
            write_record(inv, transport, prev.with_state("stopped" if not left else "failed", now_iso(), "down"))
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
    finally:
        if guard:
            guard.release()


# --------------------------------------------------------------------------- switch


def switch(res: Resolved, inv: Inventory, transport: Transport, roots: Roots, *, sets: Sequence[str] = (),
           waivers: Mapping[str, laws.Waiver] | None = None, secrets: Mapping[str, str] | None = None,
           progress: Progress | None = None) -> SwitchResult:
    """Down the current stack, up the new one; on failure bring the previous one back."""
    say = progress or (lambda *_: None)
    with ClusterLock(inv, transport, f"switch {res.name}"):
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
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: restore the previous stack
            if prev_res is None:
                raise
            say("*", "rollback", f"{res.name} failed ({exc}); bringing {prev.profile} back")  # type: ignore[union-attr]
            prev_waivers = {k: laws.Waiver(k, v) for k, v in prev.waivers.items()}  # type: ignore[union-attr]
            try:
                up(prev_res, inv, transport, roots, sets=prev.sets, waivers=prev_waivers,  # type: ignore[union-attr]
                   secrets=secrets, progress=progress, lock=False, skip_check=True)
            except Exception as exc2:  # noqa: BLE001
                raise LifecycleError(f"switch to {res.name} failed ({exc}) and restoring {prev_res.name} failed too: "
                                     f"{exc2}", hint="`sparkctl status` shows what runs; `sparkctl up` a profile") from None
            # prove the restored stack serves its own name
            head = next(iter(prev.heads))  # type: ignore[union-attr]
            ok, detail = probe_endpoint(f"http://{inv.node(head).host}:{prev.port}", prev.served_name, None,  # type: ignore[union-attr]
                                        smoke=True)
            if not ok:
                raise LifecycleError(f"restored {prev_res.name} but it does not serve {prev.served_name}: {detail}")  # type: ignore[union-attr]
            return SwitchResult(prev_res.name, False, True, time.monotonic() - t_down, error=str(exc))
