#!/usr/bin/env python3
"""Runs a sparkctl plan: the one interpreter of ``up``, ``down`` and ``switch`` steps.

Used in two places with the same code: by the executor on the operator's side
(``sparkctl.ops.executor``, whose backend is sparkctl's SSH transport), and on
the head node by a supervised switch (``python3 planrun.py supervise ...``,
whose backend runs commands locally and over ssh to the peers). Standard
library only: this file is pushed to the head with the one readiness probe
and the file writer it imports (``endpoint_probe.py``, ``putfiles.py``), beside it.

The plan (see ``sparkctl/plan/steps.py``) is a list of steps; each fans out to
its nodes and waits for all. A failed step leads to the branch its
``on_fail`` names (``stop`` or ``rollback``), whose own failures lead on the
same way; ``continue`` records the failure and goes on. Ctrl-C stops what the
run started (branch ``stop``, record "stopped") and never rolls back.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

if __package__:  # imported: the operator's executor
    from sparkctl.remote import endpoint_probe, putfiles
else:  # run on the head as ``python3 planrun.py``: endpoint_probe.py and putfiles.py are pushed beside it
    import endpoint_probe  # type: ignore[import-not-found,no-redef]
    import putfiles  # type: ignore[import-not-found,no-redef]

Res = dict[str, Any]  # {"ok": bool, "exit_code": int | None, "stdout": str, "stderr": str, "error": str}


class Backend(Protocol):
    """What :func:`execute` asks of the side it runs on: ``ops.executor.TransportBackend`` (the
    operator's, over sparkctl's transport) or :class:`HeadBackend` (the head's, in a supervised switch)."""

    def emit(self, node: str, phase: str, message: str) -> None: ...  # node or "*"
    def now(self) -> str: ...  # ISO 8601, UTC: the record's updated_at
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool,
              api_key: Mapping[str, str] | None = None, via: str | None = None) -> tuple[bool, str]:
        """The one readiness probe (``endpoint_probe``); ``api_key`` names where the key is, never the key."""
        ...

    def run_all(self, commands: Mapping[str, str], sudo: Mapping[str, bool], timeout_s: float | None,
                stdin: Mapping[str, str] | None = None) -> dict[str, Res]:
        """One fan-out; ``sudo`` and ``stdin`` per node (a node without stdin reads none)."""
        ...
    def put_all(self, files: Mapping[str, Sequence[Mapping[str, Any]]], sudo: Mapping[str, bool]) -> dict[str, Res]: ...
    def write_record(self, node: str, path: str, data: Mapping[str, Any], sudo: bool,
                     remove_on_failure: str | None) -> Res:
        """Write the record atomically; when that fails and it claims nothing serves, run
        ``remove_on_failure`` (the step's listed ``rm -f``): no record also says nothing serves."""
        ...
    def leaks(self, results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]: ...  # node -> GiB held
    def check(self, step: Mapping[str, Any]) -> str: ...  # runs only the step's listed probe scripts
    def lock(self, step: Mapping[str, Any]) -> str: ...  # the node locks; only the step's listed commands


class StepFailed(Exception):
    """A step did not reach its end; ``cause`` is the backend's own exception, if any."""

    def __init__(self, step: dict[str, Any], detail: str, node: str | None = None, cause: BaseException | None = None,
                 hint: str | None = None) -> None:
        super().__init__(detail)
        self.step, self.detail, self.node, self.cause, self.hint = step, detail, node, cause, hint

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step["id"], "phase": self.step["phase"], "node": self.node, "detail": self.detail}


@dataclass
class RunState:
    """What a run did, as :func:`execute` returns it (and carries in the KeyboardInterrupt it re-raises)."""

    op: str  # "switch NAME": the record's note names it
    result: str = ""  # done | failed | interrupted
    outcomes: list[dict[str, Any]] = field(default_factory=list)  # per step run: id, phase, ok, seconds, detail
    failure: dict[str, Any] | None = None  # the main line's failure: step, phase, node, detail
    failed: StepFailed | None = None  # ... as raised
    branches: list[str] = field(default_factory=list)  # entered, in order
    completed: list[str] = field(default_factory=list)  # branches that ran to their end
    branch_failure: StepFailed | None = None  # the first failure inside a branch
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # run step id -> node -> stdout
    soft_failures: list[StepFailed] = field(default_factory=list)  # steps with on_fail "continue" that failed
    left: dict[str, str] = field(default_factory=dict)  # node -> what the stop step found still running
    leaks: dict[str, float] = field(default_factory=dict)  # node -> GiB held with no engine
    interrupted: bool = False
    record: dict[str, Any] | None = None  # the last record written
    current: dict[str, Any] | None = None  # the step running
    interrupted_in: str = ""  # Ctrl-C inside a branch: "BRANCH at step ID" (it did not finish)


def _last_line(r: Res) -> str:
    return r.get("error") or ((r.get("stderr") or "").strip().splitlines() or [f"exit {r.get('exit_code')}"])[-1]


def _fan(step: dict[str, Any], backend: Backend, commands: dict[str, str] | None = None,
         timeout_s: float | None = None) -> dict[str, Res]:
    """Run the step's commands (or one of its params' command maps) with the step's sudo."""
    cmds = commands if commands is not None else step.get("commands", {})
    stdin = (step.get("params") or {}).get("stdin") if commands is None else None
    return backend.run_all(cmds, step.get("sudo", {}), timeout_s or step.get("timeout_s"),
                           **({"stdin": stdin} if stdin else {}))


def _run(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    res = _fan(step, backend)
    state.outputs[step["id"]] = {n: r.get("stdout", "") for n, r in res.items()}
    bad = sorted(n for n, r in res.items() if not r["ok"])
    if bad:
        raise StepFailed(step, f"{step['summary']} failed on {', '.join(bad)}: {_last_line(res[bad[0]])}", bad[0])
    return f"{len(res)} nodes"


def _stop(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    res = _fan(step, backend)
    left: dict[str, str] = {}
    for n, r in res.items():
        if r.get("error"):
            left[n] = r["error"]
            continue
        out = r.get("stdout", "")
        if not any(ln.startswith("left:") for ln in out.splitlines()):
            left[n] = f"no answer from the stop script: {_last_line(r)}"
            continue
        procs = next((ln[5:].strip() for ln in out.splitlines() if ln.startswith("left:")), "")
        ports = next((ln[6:].strip() for ln in out.splitlines() if ln.startswith("ports:")), "")
        if procs or ports:
            left[n] = " ".join(x for x in (f"pids {procs}" if procs else "", f"ports {ports}" if ports else "") if x)
    state.left.update(left)
    if left:
        n = sorted(left)[0]
        raise StepFailed(step, f"could not stop the engine on {n}: {left[n]}", n,
                         hint="stop it by hand; a new rank must never join an old head's rendezvous")
    return "clean"


def _put(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    res = backend.put_all(step.get("files", {}), step.get("sudo", {}))
    bad = sorted(n for n, r in res.items() if not r["ok"])
    if bad:
        raise StepFailed(step, f"pushing the rendered files failed on {', '.join(bad)}: {_last_line(res[bad[0]])}",
                         bad[0])
    return f"{sum(len(v) for v in step.get('files', {}).values())} files"


def _ready(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    p = step["params"]
    t0 = backend.monotonic()
    pending = dict(p["endpoints"])
    last, next_watch = "", 0.0
    dead_once: set[str] = set()  # answered "dead" at the last watch
    unanswered: dict[str, str] = {}  # node -> why its last liveness check got no answer
    while True:
        elapsed = backend.monotonic() - t0
        for node, url in list(pending.items()):
            key = {"api_key": p["api_key"]} if p.get("api_key") else {}  # names where the key is, never the key
            if (p.get("via") or {}).get(node):  # serve.bind: fabric; only the head reaches the address
                key["via"] = p["via"][node]
            ok, detail = backend.probe(url, p["served_name"], p.get("metric"), bool(p.get("smoke", True)), **key)
            if ok:
                backend.emit(node, step["phase"], f"{p['served_name']} serving after {elapsed:.1f} s")
                del pending[node]
            else:
                last = detail
        if not pending:
            return f"serving after {elapsed:.1f} s"
        if backend.monotonic() >= next_watch:
            # One round trip per rank: "alive"/"dead" on the first line, the log's last line after it.
            watch = _fan(step, backend, p["watch"], 30)
            # Only an answer is evidence: a check that did not get through (an SSH session refused
            # or reset under load, a timeout) says nothing about the rank, and one "dead" can be a
            # process between two execs. A rank is dead when it answers "dead" twice in a row.
            answered = {n: r for n, r in watch.items() if r["ok"]}
            unanswered = {n: _last_line(r) for n, r in watch.items() if n not in answered}
            now_dead = {n for n, r in answered.items() if r.get("stdout", "").partition("\n")[0].strip() != "alive"}
            dead = sorted(now_dead & dead_once)
            dead_once = now_dead
            for n in p["watch"]:
                log_line = watch.get(n, {}).get("stdout", "").partition("\n")[2] if n in answered else ""
                backend.emit(n, "waiting", f"{elapsed:5.1f}s  {log_line.strip()[-100:]}")
            if dead:
                _not_ready(step, backend, f"rank on {', '.join(dead)} exited before the endpoint was ready")
            next_watch = backend.monotonic() + (0.5 if now_dead else 2.0)  # a dead answer is confirmed soon
        if elapsed > float(p["deadline_s"]):
            silent = "; ".join(f"{n} did not answer the liveness check: {w}" for n, w in sorted(unanswered.items()))
            _not_ready(step, backend, f"not ready within {float(p['deadline_s']):.0f} s: {last}"
                       + (f" ({silent})" if silent else ""))
        backend.sleep(0.3)


def _not_ready(step: dict[str, Any], backend: Backend, detail: str) -> None:
    p = step["params"]
    tails = _fan(step, backend, p.get("tail_on_failure", {}), 30)
    lines = [f"  [{n}] {line}" for n in p.get("tail_on_failure", {})
             for line in tails.get(n, {}).get("stdout", "").splitlines()[-6:]]
    head = next(iter(p["endpoints"]))
    raise StepFailed(step, f"{p.get('profile', 'the stack')} did not become ready: {detail}", head,
                     hint="last log lines:\n" + "\n".join(lines) if lines else None)


def _record(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    p = step["params"]
    data = dict(p["record"])
    data["updated_at"] = backend.now()
    failure = state.failure
    if state.interrupted and p.get("note_if_interrupted"):  # what serves still serves (a rolling switch)
        data["note"] = p["note_if_interrupted"]
    elif state.interrupted:
        data["state"] = "stopped"
    if p.get("note_from_failure") and failure:
        verb = "interrupted" if state.interrupted else "failed"
        data["note"] = f"{state.op} {verb} in phase {failure['phase']}: {failure['detail']}"[:300]
    if p.get("state_if_left") and state.left:
        data["state"] = p["state_if_left"]
        data["note"] = ("down left " + "; ".join(f"{n}: {w}" for n, w in sorted(state.left.items())))[:300]
    data["steps"] = [{k: o[k] for k in ("id", "phase", "ok", "seconds")} for o in state.outcomes]
    node = step["nodes"][0]
    r = backend.write_record(node, p["path"], data, bool(step.get("sudo", {}).get(node)),
                             (p.get("remove_on_failure") or {}).get(node))
    if not r["ok"]:
        raise StepFailed(step, f"cannot write the run record on {step['nodes'][0]}: {_last_line(r)}",
                         step["nodes"][0], hint="check the disk on the head node")
    state.record = data
    m = p.get("mirror")
    if m:  # the gateway's node's copy (its unit's rebuild reads it): the state node's record stays the truth
        rm = backend.write_record(str(m["node"]), str(m["path"]), data, bool(m.get("sudo")), None)
        if not rm["ok"]:
            return f"{data['state']}; its copy on {m['node']} not written ({_last_line(rm)}): a restart of the " \
                   "gateway there rebuilds from the older copy"
    return str(data["state"])


def _leaks(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    state.leaks = backend.leaks(_fan(step, backend))
    return f"{len(state.leaks)} nodes hold memory" if state.leaks else "no leak"


def _check(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    return backend.check(step)


def _lock(step: dict[str, Any], backend: Backend, state: RunState) -> str:
    return backend.lock(step)


# One function per step kind (sparkctl.plan.steps.KINDS); a new kind is one entry here.
KINDS = {"run": _run, "stop": _stop, "put": _put, "ready": _ready, "record": _record, "leaks": _leaks,
         "check": _check, "lock": _lock}


def _step(step: dict[str, Any], backend: Backend, state: RunState) -> None:
    state.current = step
    backend.emit("*", step["phase"], step["summary"])
    t0 = backend.monotonic()
    outcome = {"id": step["id"], "phase": step["phase"], "ok": False, "seconds": 0.0, "detail": ""}
    state.outcomes.append(outcome)
    try:
        outcome["detail"] = KINDS[step["kind"]](step, backend, state)
        outcome["ok"] = True
    except StepFailed as f:
        outcome["detail"] = f.detail
        if step.get("on_fail") == "continue":
            state.soft_failures.append(f)
            return
        raise
    except (KeyboardInterrupt, SystemExit):
        outcome["detail"] = "interrupted"
        raise
    except Exception as exc:  # the backend's own error (a refused host key, a failed check): keep it
        outcome["detail"] = str(exc)[:300]
        failed = StepFailed(step, str(exc), getattr(getattr(exc, "ref", None), "node", None), cause=exc)
        if step.get("on_fail") == "continue":
            state.soft_failures.append(failed)
            return
        raise failed from exc
    finally:
        outcome["seconds"] = round(backend.monotonic() - t0, 3)


def _branch(plan: dict[str, Any], name: str, backend: Backend, state: RunState) -> None:
    """Run branch ``name``; a failure in it leads to its own ``on_fail`` branch."""
    seen: list[str] = []
    while name not in ("abort", "continue") and name not in seen:
        seen.append(name)
        state.branches.append(name)
        try:
            for s in plan["branches"].get(name, []):
                _step(s, backend, state)
            state.completed.append(name)
            return
        except StepFailed as f:
            state.branch_failure = f  # the first failure of a branch stays: what the operator must hear
            name = f.step.get("on_fail", "abort")


def execute(plan: dict[str, Any], backend: Backend, done: Sequence[str] = ()) -> RunState:
    """Run ``plan``; returns what happened. Re-raises KeyboardInterrupt (its argument: the
    RunState) after stopping what was started. Branch ``finally`` runs last, whatever happened.

    ``done``: ids of leading steps the caller already ran with this same plan's step (the
    operator's executor takes the lock, step ``lock``, before it reads the facts it plans from)."""
    state = RunState(f"{plan['op']} {plan.get('profile') or ''}".strip())
    try:
        _main(plan, backend, state, done)
    finally:
        for s in plan.get("branches", {}).get("finally", []):
            try:
                _step(s, backend, state)
            except StepFailed as f:
                state.soft_failures.append(f)
    return state


def _main(plan: dict[str, Any], backend: Backend, state: RunState, done: Sequence[str]) -> None:
    try:
        for s in plan["steps"]:
            if s["id"] in done:
                state.outcomes.append({"id": s["id"], "phase": s["phase"], "ok": True, "seconds": 0.0,
                                       "detail": "before planning"})
                continue
            _step(s, backend, state)
        state.result = "done"
    except StepFailed as f:
        state.failure, state.failed = f.as_dict(), f
        try:
            _branch(plan, f.step.get("on_fail", "abort"), backend, state)
        except KeyboardInterrupt:
            _again(state)
        state.result = "failed"
    except KeyboardInterrupt:
        cur = state.current or {"id": "?", "phase": "?"}
        state.interrupted = True
        state.failure = {"step": cur["id"], "phase": cur["phase"], "node": None, "detail": "interrupted"}
        try:
            if cur.get("on_interrupt"):  # the plan names it (a rolling switch: what serves keeps serving)
                _branch(plan, cur["on_interrupt"], backend, state)
            elif cur.get("on_fail", "abort") != "abort":
                _branch(plan, "stop", backend, state)  # Ctrl-C stops what was started; it never rolls back
        except KeyboardInterrupt:
            _again(state)
        state.result = "interrupted"
        raise KeyboardInterrupt(state) from None


def _again(state: RunState) -> None:
    """Ctrl-C inside a branch (a way back, a stop under way): the branch ends where it is, nothing
    else runs but branch ``finally``; the state names the branch and the step it stopped in."""
    cur = state.current or {"id": "?", "phase": "?"}
    state.interrupted = True
    state.interrupted_in = f"{state.branches[-1] if state.branches else '?'} at step {cur['id']}"
    state.result = "interrupted"
    raise KeyboardInterrupt(state) from None


# --------------------------------------------------------------------------- on the head: a supervised switch


def _atomic_write(path: str, data: bytes, mode: int) -> None:
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    tmp = f"{path}.planrun.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _api_key(spec: Mapping[str, str] | None) -> str | None:
    """The endpoint's key on the head: the runner's environment, else the 0600 env file rendered for
    the engine (``VAR='value'`` lines quoted for sh; the runner reads it as root)."""
    if not spec:
        return None
    if os.environ.get(spec.get("env", "")):
        return os.environ[spec["env"]]
    try:
        with open(spec["file"], encoding="utf-8") as fh:
            for line in fh:
                name, eq, value = line.rstrip("\n").partition("=")
                if eq and name == spec["var"]:
                    words = shlex.split(value)
                    return words[0] if words else None
    except (OSError, KeyError, ValueError):
        return None
    return None


def _probe(url: str, served_name: str, metric: str | None, smoke: bool,
           api_key: Mapping[str, str] | None = None, via: str | None = None) -> tuple[bool, str]:
    """The one readiness probe (``endpoint_probe.probe_endpoint``) with the key as the head holds it.

    ``via``: the head, whose own address ``url`` is: this runner runs there and asks it directly."""
    return endpoint_probe.probe_endpoint(url, served_name, metric, smoke=smoke, api_key=_api_key(api_key))


class HeadBackend:
    """Commands on the head run here; on a peer, through ssh over the fabric with the supervisor's key."""

    def __init__(self, nodes: dict[str, dict[str, Any]], blobs: dict[str, str], events: str) -> None:
        self.nodes, self.blobs, self.events = nodes, blobs, events

    def emit(self, node: str, phase: str, message: str) -> None:
        line = json.dumps({"t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "epoch": int(time.time()),
                           "pid": os.getpid(), "phase": phase, "node": node, "message": message[:400]})
        with open(self.events, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def now(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    probe = staticmethod(_probe)

    def _argv(self, node: str, command: str, sudo: bool) -> list[str]:
        info = self.nodes[node]
        if info.get("ssh"):  # a peer; its sudo is explicit, the head's runner already has the head's
            return [*info["ssh"], f"sudo -n sh -c {shlex.quote(command)}" if sudo else command]
        return ["sh", "-c", command]

    def _one(self, node: str, command: str, sudo: bool, timeout_s: float | None, stdin: bytes | None = None) -> Res:
        try:
            p = subprocess.run(self._argv(node, command, sudo), input=stdin, capture_output=True,
                               stdin=None if stdin is not None else subprocess.DEVNULL,
                               timeout=timeout_s or 120, check=False)
        except subprocess.TimeoutExpired:
            return {"ok": False, "exit_code": None, "stdout": "", "stderr": "", "error": f"timed out on {node}"}
        except OSError as exc:
            return {"ok": False, "exit_code": None, "stdout": "", "stderr": "", "error": str(exc)}
        return {"ok": p.returncode == 0, "exit_code": p.returncode, "stdout": p.stdout.decode(errors="replace"),
                "stderr": p.stderr.decode(errors="replace"), "error": ""}

    def run_all(self, commands: Mapping[str, str], sudo: Mapping[str, bool], timeout_s: float | None,
                stdin: Mapping[str, str] | None = None) -> dict[str, Res]:
        if not commands:
            return {}
        feed = {n: v.encode() for n, v in (stdin or {}).items()}
        with ThreadPoolExecutor(max_workers=len(commands)) as pool:
            futs = {n: pool.submit(self._one, n, c, bool(sudo.get(n)), timeout_s, feed.get(n))
                    for n, c in commands.items()}
            return {n: f.result() for n, f in futs.items()}

    def _write(self, node: str, files: Sequence[tuple[str, int, bytes]], sudo: bool) -> Res:
        """The node's files in one session, as the operator's transport writes them (putfiles.py)."""
        try:
            cmd = shlex.join(putfiles.put_command([(path, mode, len(data)) for path, mode, data in files]))
        except ValueError as exc:
            return {"ok": False, "exit_code": None, "stdout": "", "stderr": "", "error": str(exc)}
        return self._one(node, cmd, sudo, 60, stdin=b"".join(data for _, _, data in files))

    def _put_node(self, node: str, files: Sequence[Mapping[str, Any]], sudo: bool) -> Res:
        return self._write(node, [(f["path"], int(str(f["mode"]), 8), base64.b64decode(self.blobs[f["sha256"]]))
                                  for f in files], sudo)

    def put_all(self, files: Mapping[str, Sequence[Mapping[str, Any]]], sudo: Mapping[str, bool]) -> dict[str, Res]:
        with ThreadPoolExecutor(max_workers=max(1, len(files))) as pool:
            futs = {n: pool.submit(self._put_node, n, fs, bool(sudo.get(n, self.nodes[n].get("sudo"))))
                    for n, fs in files.items()}
            return {n: f.result() for n, f in futs.items()}

    def write_record(self, node: str, path: str, data: Mapping[str, Any], sudo: bool,
                     remove_on_failure: str | None) -> Res:
        """The record is on the head, where this runner runs as root: written here, atomically;
        its copy on the gateway's node (a peer), through ssh, atomically there."""
        blob = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
        if node not in self.nodes:
            return {"ok": False, "exit_code": None, "stdout": "", "stderr": "", "error": f"{node}: not reachable from "
                    "the supervisor (not one of the plan's nodes)"}
        if self.nodes[node].get("ssh"):
            return self._write(node, [(path, 0o644, blob)], sudo)
        try:
            _atomic_write(path, blob, 0o644)
            return {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "error": ""}
        except OSError as exc:
            if data.get("state") != "serving" and remove_on_failure:
                # no record claims nothing serves; a stale "serving" must not outlive its stack
                self._one(node, remove_on_failure, sudo, 30)
            return {"ok": False, "exit_code": None, "stdout": "", "stderr": "", "error": str(exc)}

    def leaks(self, results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        return {}

    def check(self, step: Mapping[str, Any]) -> str:
        raise RuntimeError("the check runs on the operator's side before the supervisor starts")

    def lock(self, step: Mapping[str, Any]) -> str:
        raise RuntimeError("the operator takes the lock; the supervisor is handed it at its start")


FINAL = {"done": "done", "failed+rollback": "rolled-back"}


def supervise(plan_path: str, events: str, pid_file: str, lock_dirs: Sequence[str], holder: dict[str, Any]) -> int:
    with open(plan_path, encoding="utf-8") as fh:
        doc = json.load(fh)
    backend = HeadBackend(doc["nodes"], doc["blobs"], events)
    _atomic_write(pid_file, f"{os.getpid()}\n".encode(), 0o644)
    # The locks the operator took (one dir per node of the stack) are handed over: the
    # same directories, this process as holder.
    mine = {**holder, "pid": os.getpid(), "holder": f"supervisor pid {os.getpid()} on {holder.get('host')}"}
    for lock_dir in lock_dirs:
        os.makedirs(lock_dir, exist_ok=True)
        _atomic_write(os.path.join(lock_dir, "holder"), (json.dumps(mine) + "\n").encode(), 0o644)

    def terminated(_sig: int, _frame: Any) -> None:
        backend.emit("*", "aborted", "supervisor terminated by a signal")
        raise SystemExit(143)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminated)
    # The plan's branch "finally" releases the lock at the end, if it is still this run's.
    backend.emit(doc["head"], "started", f"supervisor pid {os.getpid()}: switching from "
                                         f"{doc.get('previous') or 'nothing'} to {doc['plan']['profile']}")
    try:
        state = execute(doc["plan"], backend)
    except KeyboardInterrupt:
        backend.emit("*", "aborted", "supervisor interrupted")
        return 130
    phase, message, rc = outcome(state, doc)
    backend.emit("*", phase, message)
    return rc


def outcome(state: RunState, doc: Mapping[str, Any]) -> tuple[str, str, int]:
    """The supervisor's last event (phase, message) and exit status, from how its plan ended."""
    failure = state.failure or {}
    detail = str(failure.get("detail"))
    if state.result == "done":
        return "done", f"{doc['plan']['profile']} serves {doc['served_name']}", 0
    if state.completed and (state.record or {}).get("state") == "degraded":  # some replicas serve: the record says which
        return "left-degraded", f"{str((state.record or {}).get('note'))[:300]} ({detail[:200]})", 8
    if any(b == "rollback" or b.startswith("rollback-") for b in state.completed):  # rollback-K: a rolling switch
        return "rolled-back", (f"{doc.get('previous')} serves {doc.get('previous_served_name')} again "
                               f"({detail[:200]})"), 1
    return "failed", f"{detail[:300]}; nothing serves", 2


def main(argv: list[str]) -> int:
    if len(argv) != 6 or argv[0] != "supervise":
        sys.stderr.write("usage: planrun.py supervise PLAN EVENTS PID_FILE LOCK_DIRS_JSON HOLDER_JSON\n")
        return 2
    # LOCK_DIRS_JSON: a JSON list of lock dirs; a plain path is one lock dir (as before stacks)
    dirs = json.loads(argv[4]) if argv[4].startswith("[") else [argv[4]]
    return supervise(argv[1], argv[2], argv[3], [str(d) for d in dirs], json.loads(argv[5]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
