"""The simulated `systemctl`: the supervisor, start/stop/enable/status and the verb table.

SIMULATION ONLY (sparkctl_sim.procshims documents the deliberate differences).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from sparkctl_sim.shimbase import (
    EXIT_STATUS_NAMES,
    EXIT_STDERR,
    EXIT_STDOUT,
    STOP_TIMEOUT_CAP_S,
    ShimError,
    _alive,
    _daemonize,
    _group_alive,
    _killpg,
    _log_crash,
    _now_iso,
    _proc_start_ticks,
    _read_json,
    _run_dir,
    _wait_until,
    wait_status,
)
from sparkctl_sim.systemdexec import (
    OutputSetupError,
    _open_output,
    _service_env,
    _spawn_unit_process,
)
from sparkctl_sim.systemdunits import ExecCommand, Unit, Units, _unit_name


def _journal_line(units: Units, name: str, text: str) -> None:
    with open(units.journal(name), "a", encoding="utf-8") as fh:
        fh.write(f"{_now_iso()} systemd[1]: {name}: {text}\n")


def _outputs(units: Units, unit: Unit) -> tuple[Any, Any]:
    """Both streams, or :class:`OutputSetupError` with systemd's status (see _open_output)."""
    try:
        out = _open_output(unit.standard_output, units.journal(unit.name))
    except OSError as exc:
        raise OutputSetupError("output", EXIT_STDOUT, exc) from exc
    if unit.standard_error == "inherit":
        return out, out
    try:
        return out, _open_output(unit.standard_error, units.journal(unit.name))
    except OSError as exc:
        out.close()
        raise OutputSetupError("error", EXIT_STDERR, exc) from exc


def _output_failure(units: Units, unit: Unit, cmd: ExecCommand, exc: OutputSetupError) -> None:
    # The two lines systemd's child logs (src/core/execute.c: "Failed to set up
    # standard output: %m", then "Failed at step STDOUT spawning %s: %m").
    _journal_line(units, unit.name, f"Failed to set up standard {exc.stream}: {exc.strerror}")
    _journal_line(units, unit.name, f"Failed at step {EXIT_STATUS_NAMES[exc.status]} spawning "
                                    f"{cmd.words[0]}: {exc.strerror}")


def _run_control(units: Units, unit: Unit, key: str, env: dict[str, str],
                 timeout_s: float = STOP_TIMEOUT_CAP_S) -> tuple[bool, int]:
    """Run the ExecStartPre/Post/Stop/StopPost commands of ``key``, in order.

    Returns (ok, exit status of the last command run).
    """
    status = 0
    for cmd in unit.exec.get(key, []):
        try:
            out, err = _outputs(units, unit)
        except OutputSetupError as exc:
            _output_failure(units, unit, cmd, exc)
            if cmd.ignore_failure:
                continue
            return False, exc.status
        try:
            proc = _spawn_unit_process(unit, cmd, env, out, err)
        except OSError as exc:
            _journal_line(units, unit.name, f"{key}: {exc}")
            if cmd.ignore_failure:
                continue
            return False, 203
        finally:
            out.close()
            if err is not out:
                err.close()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        _killpg(proc.pid, signal.SIGKILL)
        status = rc if rc >= 0 else 128 - rc
        if rc != 0 and not cmd.ignore_failure:
            _journal_line(units, unit.name, f"{key} {shlex.join(cmd.words)} failed with {status}")
            return False, status
    return True, status


def _clean_exit(status: int) -> bool:
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status) in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)
    return os.WEXITSTATUS(status) == 0


START_LIMIT_HIT = ("Job for {name} failed because the start of the service was attempted too often.\n"
                   "See \"systemctl status {name}\" and \"journalctl -xeu {name}\" for details.\n"
                   "To force a start use \"systemctl reset-failed {name}\"\n"
                   "followed by \"systemctl start {name}\" again.")


def _take_start(unit: Unit, cur: dict[str, Any]) -> bool:
    """Whether the start rate limit lets one more start through (and count it in ``cur``).

    systemd counts EVERY start of the unit, the operator's and the automatic
    restarts alike: "Units which are started more than burst times within an
    interval time span are not permitted to start any more" (systemd.unit(5),
    StartLimitIntervalSec=, StartLimitBurst=); 0 for either disables it. The
    counter lives in the manager's memory, so a reboot forgets it (here: the
    record is in /run, emptied at boot), and ``systemctl reset-failed`` resets it
    (systemctl(1), reset-failed: "the start rate limit counter ... is reset").
    Wall-clock times: the starts are counted across processes.
    """
    now = time.time()
    interval, burst = unit.start_limit_interval_s, unit.start_limit_burst
    if interval <= 0 or burst <= 0:
        return True
    starts = [t for t in cur.get("starts", []) if now - float(t) < interval]
    if len(starts) >= burst:
        cur["starts"] = starts
        return False
    cur["starts"] = [*starts, now]
    return True


def _supervise(units: Units, unit: Unit, report_fd: int, invocation: str) -> int:
    """Body of the detached supervisor of a simple/exec service (systemd's role)."""
    name = unit.name
    me = {"pid": os.getpid(), "start": _proc_start_ticks(os.getpid())}
    reported = False

    def report(message: str) -> None:
        nonlocal reported
        if not reported:
            os.write(report_fd, message.encode())
            os.close(report_fd)
            reported = True

    try:
        while True:
            try:
                env = _service_env(unit)
            except ShimError as exc:
                _journal_line(units, name, exc.message)
                units.update(name, ActiveState="failed", SubState="failed", Result="resources",
                             MainPID=0)
                report("fail resources")
                return 1
            ok, status = _run_control(units, unit, "ExecStartPre", env)
            if not ok:
                units.update(name, ActiveState="failed", SubState="failed", Result="exit-code",
                             MainPID=0, ExecMainStatus=status)
                report("fail control")
                return 1
            main = unit.exec["ExecStart"][0]
            try:
                out, err = _outputs(units, unit)
            except OutputSetupError as exc:
                _output_failure(units, unit, main, exc)
                units.update(name, ActiveState="failed", SubState="failed", Result="exit-code",
                             MainPID=0, ExecMainStatus=exc.status, ExecMainCode="exited",
                             InactiveEnterTimestamp=_now_iso())
                # As for 203/EXEC below: the fork succeeded, so a Type=simple start succeeds.
                report("ok 0" if unit.type == "simple" else "fail exec")
                return 1
            # A stop that came while this start was under way wins: systemd's manager
            # serializes jobs, so a stop queued during an auto-restart leaves the unit dead
            # and starts nothing after it (systemd.service(5), Restart=: a service stopped
            # with systemctl stop is not restarted). The check and the spawn are one step
            # under the lock `_stop` takes to read MainPID: either that stop sees this pid
            # and kills it, or no process is spawned.
            spawn_error: OSError | None = None
            try:
                with units.lock(name):
                    cur = _read_json(units.state_path(name)) or {}
                    cancelled = bool(cur.get("stop_requested")) or cur.get("invocation") != invocation
                    if not cancelled:
                        try:
                            proc = _spawn_unit_process(unit, main, env, out, err)
                        except OSError as exc:
                            spawn_error = exc
                        else:
                            cur.update(ActiveState="active", SubState="running", MainPID=proc.pid,
                                       main_start=_proc_start_ticks(proc.pid), supervisor=me,
                                       ActiveEnterTimestamp=_now_iso(), Result="success",
                                       ExecMainStatus=None, ExecMainCode=None)
                            units.save_state(name, cur)
            finally:
                out.close()
                if err is not out:
                    err.close()
            if cancelled:
                report("fail cancelled")
                return 0
            if spawn_error is not None:
                _journal_line(units, name, f"Failed at step EXEC spawning: {spawn_error}")
                units.update(name, ActiveState="failed", SubState="failed", Result="exit-code",
                             MainPID=0, ExecMainStatus=203, ExecMainCode="exited")
                # Type=simple reports success before the exec; Type=exec waits for it.
                report("ok 0" if unit.type == "simple" else "fail exec")
                return 1
            _journal_line(units, name, f"Started {unit.description or name} (MainPID {proc.pid}).")
            report(f"ok {proc.pid}")
            env_post = dict(env, MAINPID=str(proc.pid))
            _run_control(units, unit, "ExecStartPost", env_post)
            status = wait_status(proc.pid)
            # KillMode=control-group: whatever is left of the group dies with the main process.
            _killpg(proc.pid, signal.SIGTERM)
            if not _wait_until(lambda: not _group_alive(proc.pid), 1.0):
                _killpg(proc.pid, signal.SIGKILL)
            with units.lock(name):
                cur = _read_json(units.state_path(name)) or {}
                stopping = bool(cur.get("stop_requested"))
                clean = _clean_exit(status)
                if os.WIFSIGNALED(status):
                    code_kind, code = "killed", os.WTERMSIG(status)
                else:
                    code_kind, code = "exited", os.WEXITSTATUS(status)
                if stopping and cur.get("stop_timed_out"):
                    result = "timeout"
                elif clean:
                    result = "success"
                else:
                    result = "signal" if code_kind == "killed" else "exit-code"
                failed = result != "success"
                cur.update(MainPID=0, ExecMainStatus=code, ExecMainCode=code_kind, Result=result,
                           InactiveEnterTimestamp=_now_iso(),
                           ActiveState="failed" if failed else "inactive",
                           SubState="failed" if failed else "dead")
                want_restart = (not stopping and (
                    unit.restart == "always"
                    or (unit.restart == "on-failure" and failed)
                    or (unit.restart == "on-success" and not failed)
                    or (unit.restart == "on-abnormal" and code_kind == "killed")))
                # The restart is a start like any other: it passes the rate limit or the
                # unit stays failed with Result=start-limit-hit (systemd.unit(5)).
                if want_restart and not _take_start(unit, cur):
                    want_restart = False
                    cur.update(ActiveState="failed", SubState="failed", Result="start-limit-hit")
                    _journal_line(units, name, "Start request repeated too quickly.")
                    _journal_line(units, name, "Failed with result 'start-limit-hit'.")
                if want_restart:
                    cur.update(ActiveState="activating", SubState="auto-restart",
                               NRestarts=int(cur.get("NRestarts", 0)) + 1)
                units.save_state(name, cur)
            _journal_line(units, name, f"Main process exited, code={code_kind}, status={code}; "
                                       f"result {result}")
            if not want_restart:
                if stopping:
                    _run_control(units, unit, "ExecStopPost", env)
                return 0
            time.sleep(unit.restart_sec_s)
            with units.lock(name):
                cur = _read_json(units.state_path(name)) or {}
                # stopped meanwhile, or stopped and started again by a newer supervisor
                if cur.get("stop_requested") or cur.get("invocation") != invocation:
                    return 0
    finally:
        report("fail supervisor")


def _start(units: Units, name: str) -> int:
    unit = units.load(name)
    if unit is None:
        raise ShimError(f"Failed to start {name}: Unit {name} not found.", 5)
    for warning in unit.warnings:
        _journal_line(units, name, warning)
    if unit.type not in ("simple", "exec", "oneshot"):
        raise ShimError(f"Failed to start {name}: Type={unit.type} is not supported by the "
                        "sparkctl sim (simple, exec, oneshot).", 1)
    if not unit.exec.get("ExecStart"):
        raise ShimError(f"Failed to start {name}: Unit {name} has a bad unit file setting "
                        "(Service has no ExecStart= setting).", 1)
    if unit.type != "oneshot" and len(unit.exec["ExecStart"]) > 1:
        raise ShimError(f"Failed to start {name}: Unit {name} has a bad unit file setting "
                        "(Service has more than one ExecStart= setting, which is only allowed "
                        "for Type=oneshot services).", 1)
    with units.lock(name):
        cur = units.state(name)
        if cur["ActiveState"] in ("active", "activating"):
            return 0
        if not _take_start(unit, cur):
            cur.update(ActiveState="failed", SubState="failed", Result="start-limit-hit", MainPID=0)
            units.save_state(name, cur)
            _journal_line(units, name, "Start request repeated too quickly.")
            raise ShimError(START_LIMIT_HIT.format(name=name), 1)
        units.save_state(name, cur)
    job_failed = (f"Job for {name} failed because the control process exited with error code.\n"
                  f"See \"systemctl status {name}\" and \"journalctl -xeu {name}\" for details.")
    base = {"Id": name, "Type": unit.type, "Restart": unit.restart, "User": unit.user or "",
            "FragmentPath": unit.path, "KillSignal": unit.kill_signal,
            "TimeoutStopSec": min(unit.timeout_stop_s, STOP_TIMEOUT_CAP_S),
            "Description": unit.description, "stop_requested": False, "stop_timed_out": False,
            "ExecMainStatus": None, "ExecMainCode": None, "invocation": secrets.token_hex(8),
            # A start asked for (not an automatic restart) flushes the restart counter
            # (src/core/service.c, service_start: "if (s->flush_n_restarts) s->n_restarts = 0").
            "NRestarts": 0}
    if unit.type == "oneshot":
        units.update(name, ActiveState="activating", SubState="start", MainPID=0,
                     supervisor={"pid": os.getpid(), "start": _proc_start_ticks(os.getpid())},
                     **base)
        try:
            env = _service_env(unit)
        except ShimError as exc:
            _journal_line(units, name, exc.message)
            units.update(name, ActiveState="failed", SubState="failed", Result="resources")
            raise ShimError(f"Job for {name} failed because of unavailable resources or "
                            "another system error.", 1) from exc
        ok, status = _run_control(units, unit, "ExecStartPre", env)
        if ok:
            ok, status = _run_control(units, unit, "ExecStart", env, timeout_s=float("inf"))
        if ok:
            _run_control(units, unit, "ExecStartPost", env)
        state = ("active", "exited") if ok and unit.remain_after_exit else (
            ("inactive", "dead") if ok else ("failed", "failed"))
        units.update(name, ActiveState=state[0], SubState=state[1], ExecMainStatus=status,
                     ExecMainCode="exited", Result="success" if ok else "exit-code")
        if not ok:
            raise ShimError(job_failed, 1)
        return 0
    units.update(name, ActiveState="activating", SubState="start", MainPID=0, supervisor=None,
                 **base)
    read_fd, write_fd = os.pipe()
    if _daemonize():
        os.close(read_fd)
        code = 1
        try:
            code = _supervise(units, unit, write_fd, base["invocation"])
        except BaseException:
            _log_crash(units.journal(name))
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        answer = fh.read().decode()
    if answer.startswith("ok"):
        return 0
    if answer == "fail cancelled":
        # src/shared/bus-wait-for-jobs.c, check_wait_response: result "canceled"
        raise ShimError(f"Job for {name} canceled.", 1)
    if answer == "fail resources":
        raise ShimError(f"Job for {name} failed because of unavailable resources or another "
                        "system error.", 1)
    raise ShimError(job_failed, 1)


def _stop(units: Units, name: str) -> int:
    unit = units.load(name)
    if unit is None and not units.state_path(name).exists():
        raise ShimError(f"Failed to stop {name}: Unit {name} not loaded.", 5)
    # Read the main pid and ask for the stop in one locked step: a supervisor that is
    # starting the next process (an auto-restart) checks for the stop under the same lock.
    with units.lock(name):
        cur = units.state(name)
        if cur["ActiveState"] in ("inactive", "failed"):
            return 0
        rec = _read_json(units.state_path(name)) or {}
        rec.update(stop_requested=True, ActiveState="deactivating", SubState="stop-sigterm")
        units.save_state(name, rec)
    timeout_s = min(float(cur.get("TimeoutStopSec") or STOP_TIMEOUT_CAP_S), STOP_TIMEOUT_CAP_S)
    kill_signal = int(cur.get("KillSignal") or signal.SIGTERM)
    pid = int(cur.get("MainPID") or 0)
    # systemd.service(5): ExecStop= runs when an active unit stops, a oneshot kept active by
    # RemainAfterExit=yes included (it has no main process left: that is how such a unit undoes
    # what its ExecStart= did)
    remain = unit is not None and unit.type == "oneshot" and cur["ActiveState"] == "active"
    if unit is not None and (pid or remain):
        try:
            env = _service_env(unit)
        except ShimError:
            env = {"PATH": os.environ.get("PATH", os.defpath)}
        _run_control(units, unit, "ExecStop", dict(env, MAINPID=str(pid)) if pid else env, timeout_s)
    if pid and _alive(pid, cur.get("main_start")):
        _killpg(pid, kill_signal)
        _killpg(pid, signal.SIGCONT)  # SendSIGCONT=yes: a stopped process must see the signal
        if not _wait_until(lambda: not _group_alive(pid), timeout_s):
            units.update(name, stop_timed_out=True, SubState="stop-sigkill")
            _killpg(pid, signal.SIGKILL)
    elif pid:
        _killpg(pid, signal.SIGKILL)
    sup = cur.get("supervisor") or {}

    def settled() -> bool:
        state = (_read_json(units.state_path(name)) or {}).get("ActiveState")
        return state in ("inactive", "failed") or not _alive(sup.get("pid"), sup.get("start"))

    if pid:  # no main process (auto-restart pause): nothing to wait for
        _wait_until(settled, 5.0)
    with units.lock(name):
        rec = _read_json(units.state_path(name)) or {}
        if rec.get("ActiveState") not in ("inactive", "failed"):
            # oneshot with RemainAfterExit, or the supervisor is gone: settle here
            rec.update(ActiveState="inactive", SubState="dead", MainPID=0)
        units.save_state(name, rec)
    return 0


def _enable(units: Units, name: str) -> list[str]:
    unit = units.load(name)
    if unit is None:
        raise ShimError(f"Failed to enable unit: Unit file {name} does not exist.", 1)
    targets = [(t, "wants") for t in unit.wanted_by] + [(t, "requires") for t in unit.required_by]
    if not targets:
        print(f"The unit files have no installation config (WantedBy=, RequiredBy=, ...).\n"
              f"{name} is static and cannot be enabled this way.", file=sys.stderr)
    messages = []
    for target, kind in targets:
        link_dir = units.unit_dir / f"{target}.{kind}"
        link_dir.mkdir(parents=True, exist_ok=True)
        link = link_dir / name
        if not link.is_symlink():
            link.symlink_to(units.disk_path(name))
            messages.append(f"Created symlink {link} \u2192 {units.disk_path(name)}.")
    return messages


def _disable(units: Units, name: str) -> list[str]:
    messages = []
    if units.unit_dir.is_dir():
        for link in units.unit_dir.glob(f"*.*/{name}"):
            if link.is_symlink():
                link.unlink()
                messages.append(f"Removed \"{link}\".")
    return messages


def _is_enabled(units: Units, name: str) -> str:
    if not units.disk_path(name).is_file():
        return "not-found"
    if any(p.is_symlink() for p in units.unit_dir.glob(f"*.*/{name}")):
        return "enabled"
    unit = units.load(name)
    if unit is not None and not (unit.wanted_by or unit.required_by):
        return "static"
    return "disabled"


def _show_props(units: Units, name: str) -> dict[str, str]:
    cur = units.state(name)
    load = "loaded" if units.disk_path(name).is_file() or (units.loaded / name).exists() else "not-found"
    status = cur.get("ExecMainStatus")
    timeout = cur.get("TimeoutStopSec")
    return {
        "Id": name, "Names": name, "Description": cur.get("Description") or name,
        "LoadState": load, "ActiveState": cur["ActiveState"], "SubState": cur["SubState"],
        "MainPID": str(cur.get("MainPID") or 0), "ExecMainPID": str(cur.get("MainPID") or 0),
        "ExecMainStatus": str(status if status is not None else 0),
        "ExecMainCode": {"exited": "1", "killed": "2"}.get(cur.get("ExecMainCode") or "", "0"),
        "Result": cur.get("Result", "success"), "NRestarts": str(cur.get("NRestarts", 0)),
        "Type": cur.get("Type", "simple"), "Restart": cur.get("Restart", "no"),
        "User": cur.get("User", ""), "FragmentPath": str(units.disk_path(name)),
        "UnitFileState": _is_enabled(units, name) if load == "loaded" else "",
        "KillSignal": str(cur.get("KillSignal") or int(signal.SIGTERM)),
        "TimeoutStopUSec": f"{timeout:g}s" if timeout is not None else "1min 30s",
        "ActiveEnterTimestamp": cur.get("ActiveEnterTimestamp", ""),
        "InactiveEnterTimestamp": cur.get("InactiveEnterTimestamp", ""),
    }


def _status(units: Units, name: str) -> int:
    if not units.disk_path(name).is_file() and not units.state_path(name).exists():
        raise ShimError(f"Unit {name} could not be found.", 4)
    props = _show_props(units, name)
    active = props["ActiveState"]
    dot = {"active": "\u25cf", "failed": "\u00d7"}.get(active, "\u25cb")
    print(f"{dot} {name} - {props['Description']}")
    print(f"     Loaded: {props['LoadState']} ({props['FragmentPath']}; "
          f"{props['UnitFileState'] or 'disabled'})")
    since = props["ActiveEnterTimestamp"] if active == "active" else props["InactiveEnterTimestamp"]
    extra = f" (Result: {props['Result']})" if active == "failed" else ""
    print(f"     Active: {active} ({props['SubState']}){extra} since {since or 'n/a'}")
    if props["MainPID"] != "0":
        print(f"   Main PID: {props['MainPID']}")
    cur = units.state(name)
    if active == "failed" and cur.get("ExecMainCode"):
        # systemctl's "(code=exited, status=209/STDOUT)" (src/systemctl/systemctl-show.c,
        # exit_status_to_string); the sim keeps no PID of a process that never ran.
        code = int(cur.get("ExecMainStatus") or 0)
        label = EXIT_STATUS_NAMES.get(code) if cur["ExecMainCode"] == "exited" else None
        print(f"    Process: (code={cur['ExecMainCode']}, status={code}"
              f"{'/' + label if label else ''})")
    journal = units.journal(name)
    if journal.exists():
        lines = journal.read_text(encoding="utf-8", errors="replace").splitlines()[-10:]
        if lines:
            print()
            print("\n".join(lines))
    return 0 if active == "active" else 3


_SYSTEMCTL_VERBS = ("daemon-reload", "start", "stop", "restart", "is-active", "is-failed",
                    "is-enabled", "status", "enable", "disable", "show", "reset-failed", "cat")


def systemctl_main(argv: Sequence[str]) -> int:  # noqa: C901 - a verb table
    props: list[str] = []
    flags: set[str] = set()
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-p", "--property"):
            if i + 1 >= len(argv):
                raise ShimError(f"systemctl: option requires an argument -- '{arg}'", 1)
            props.extend(argv[i + 1].split(","))
            i += 2
            continue
        if arg.startswith("--property="):
            props.extend(arg.split("=", 1)[1].split(","))
        elif arg.startswith("-p") and len(arg) > 2:
            props.extend(arg[2:].split(","))
        elif arg in ("--now", "--value", "-q", "--quiet", "--no-pager", "--no-block",
                     "--no-ask-password", "-l", "--full", "--system"):
            flags.add({"-q": "--quiet"}.get(arg, arg))
        elif arg.startswith("-"):
            raise ShimError(f"systemctl: unrecognized option '{arg}'", 1)
        else:
            words.append(arg)
        i += 1
    if not words:
        raise ShimError("sparkctl sim systemctl: a verb is required", 1)
    verb, names = words[0], [_unit_name(n) for n in words[1:]]
    if verb not in _SYSTEMCTL_VERBS:
        raise ShimError(f"Unknown command verb '{verb}'.", 1)
    units = Units(_run_dir())
    quiet = "--quiet" in flags
    if verb == "daemon-reload":
        units.daemon_reload()
        return 0
    if verb == "reset-failed":
        targets = names or [p.name[:-5] for p in units.root.glob("*.json")]
        for name in targets:
            with units.lock(name):
                rec = _read_json(units.state_path(name))
                if rec and rec.get("ActiveState") == "failed":
                    rec.update(ActiveState="inactive", SubState="dead", Result="success",
                               NRestarts=0)
                if rec:
                    rec["starts"] = []  # systemctl(1): reset-failed also resets the start rate limit counter
                    units.save_state(name, rec)
        return 0
    if not names:
        raise ShimError("Too few arguments.", 1)
    if verb == "start":
        for name in names:
            _start(units, name)
        return 0
    if verb == "stop":
        for name in names:
            _stop(units, name)
        return 0
    if verb == "restart":
        for name in names:
            if units.load(name) is None:
                raise ShimError(f"Failed to restart {name}: Unit {name} not found.", 5)
            _stop(units, name)
            _start(units, name)
        return 0
    if verb in ("is-active", "is-failed"):
        hit = False
        for name in names:
            state = units.state(name)["ActiveState"]
            if not quiet:
                print(state)
            hit = hit or (state == "active" if verb == "is-active" else state == "failed")
        return 0 if hit else (3 if verb == "is-active" else 1)
    if verb == "is-enabled":
        results = [_is_enabled(units, n) for n in names]
        if not quiet:
            print("\n".join(results))
        return 0 if any(r in ("enabled", "static") for r in results) else 1
    if verb == "status":
        code = 0
        for name in names:
            code = max(code, _status(units, name))
        return code
    if verb == "enable":
        for name in names:
            for msg in _enable(units, name):
                print(msg, file=sys.stderr)
            if "--now" in flags:
                _start(units, name)
        return 0
    if verb == "disable":
        for name in names:
            for msg in _disable(units, name):
                print(msg, file=sys.stderr)
            if "--now" in flags:
                _stop(units, name)
        return 0
    if verb == "show":
        for n, name in enumerate(names):
            all_props = _show_props(units, name)
            keys = props or list(all_props)
            if n:
                print()
            for key in keys:
                if key in all_props:
                    print(all_props[key] if "--value" in flags else f"{key}={all_props[key]}")
        return 0
    if verb == "cat":
        for name in names:
            path = units.disk_path(name)
            if not path.is_file():
                raise ShimError(f"No files found for {name}.", 1)
            print(f"# {path}")
            print(path.read_text(encoding="utf-8"), end="")
        return 0
    raise AssertionError(verb)
