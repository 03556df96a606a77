"""What the simulated docker and systemctl shims share: their environment, records, processes.

SIMULATION ONLY (see sparkctl_sim.procshims for the shims and their deliberate
differences from the real tools). Standard library only: the shims start on every call.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import re as _re
import resource
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sparkctl_sim.envnames import (  # noqa: F401 - re-exported: the shims' environment
    PREFIX_ENV,
    RUN_DIR_ENV,
    SERVICE_PASSENV_ENV,
    SHIMMED_TOOLS_ENV,
    UNIT_DIR_ENV,
)

# earlyoom: Debian's unit runs /usr/bin/earlyoom; a node's is the stand-in (sparkctl_sim.earlyoomsim)
DEFAULT_SHIMMED_TOOLS = ("nvidia-smi", "docker", "systemctl", "earlyoom")
DEFAULT_SERVICE_PASSENV = (
    "PATH", "HOME", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "PYENV_ROOT", "PYENV_VERSION",
)
# systemd's default TimeoutStopSec is 90 s; a simulated stop never needs that long.
STOP_TIMEOUT_CAP_S = 10.0
DOCKER_STOP_DEFAULT_S = 10.0  # `docker stop` default grace period
START_LIMIT_BURST = 5  # systemd's DefaultStartLimitBurst
START_LIMIT_INTERVAL_S = 10.0  # systemd's DefaultStartLimitIntervalSec
# The exit statuses systemd's forked child reports when it fails before the exec
# (src/basic/exit-status.h: EXIT_CHDIR = 200, EXIT_EXEC = 203, EXIT_STDOUT = 209,
# EXIT_STDERR = 210; names from exit_status_mappings in src/basic/exit-status.c).
EXIT_CHDIR, EXIT_EXEC, EXIT_STDOUT, EXIT_STDERR = 200, 203, 209, 210
EXIT_STATUS_NAMES = {EXIT_CHDIR: "CHDIR", EXIT_EXEC: "EXEC", EXIT_STDOUT: "STDOUT",
                     EXIT_STDERR: "STDERR"}
# systemd.exec(5), "RuntimeDirectory=, StateDirectory=, CacheDirectory=, LogsDirectory=,
# ConfigurationDirectory=": relative names under these roots (system units).
EXEC_DIRECTORY_ROOTS = {"RuntimeDirectory": "/run", "StateDirectory": "/var/lib",
                        "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log",
                        "ConfigurationDirectory": "/etc"}


class ShimError(Exception):
    """A refusal the shim reports the way the real tool does."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# ---------------------------------------------------------------------------
# shared helpers: state files, process identity


def _run_dir() -> Path:
    value = os.environ.get(RUN_DIR_ENV)
    if not value:
        raise ShimError(f"sparkctl sim: {RUN_DIR_ENV} is not set (the per-node run dir)", 1)
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (guards against pid reuse)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    if fields[0] == "Z":  # a zombie is dead for every purpose here
        return None
    return int(fields[19])


def _alive(pid: int | None, start_ticks: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    ticks = _proc_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for a group made only of zombies: look closer.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_until(predicate: Any, timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)


def _exit_code_from_status(status: int) -> int:
    """A wait status as a shell reports it (128 + signal for a killed process)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _daemonize() -> bool:
    """Double fork + setsid. True in the detached grandchild, False in the caller.

    The caller must reap nothing else: the intermediate child exits at once and
    is waited for here.
    """
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    os.setsid()
    if os.fork():
        os._exit(0)
    # Detach from the caller's stdio: an SSH session must not wait for our EOF.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return True


def _log_crash(where: Path) -> None:
    """A detached helper has no stderr: leave its traceback where a human will look."""
    import traceback

    with contextlib.suppress(OSError), open(where, "a", encoding="utf-8") as fh:
        fh.write(f"{_now_iso()} sparkctl sim shim crashed:\n{traceback.format_exc()}")


def _set_memlock_unlimited() -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


# shared by the docker and systemd shims (kept here: `systemctl` must not import docker's modules)
ENV_NAME_RE = _re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def wait_status(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 255 << 8


def parse_signal(name: str) -> int:
    name = name.upper()
    if name.isdigit():
        return int(name)
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError as exc:
        raise ShimError(f"invalid signal: {name}", 1) from exc


# docker's container records and its small flag parser (here: `docker image inspect` and `docker ps`
# must not import `docker run`'s modules)


class Containers:
    """Container records of one simulated node (``RUN_DIR/docker``)."""

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "docker"
        self.records = self.root / "containers"
        self.logs = self.root / "logs"
        self.records.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.lock_path = self.root / ".lock"

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return _locked(self.lock_path)

    def all(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.records.glob("*.json")):
            rec = _read_json(path)
            if rec is not None:
                out.append(self._reconcile(rec))
        out.sort(key=lambda r: r.get("created_at", ""), reverse=True)
        return out

    def _reconcile(self, rec: dict[str, Any]) -> dict[str, Any]:
        # A container whose monitor vanished (node power-cycled, shim SIGKILLed)
        # and whose process is gone is reported as exited, not running.
        if rec.get("status") == "running" and not _alive(rec.get("pid"), rec.get("pid_start")):
            if not _alive(rec.get("monitor_pid"), rec.get("monitor_start")):
                rec = dict(rec, status="exited", exit_code=rec.get("exit_code") or 255,
                           finished_at=rec.get("finished_at") or _now_iso())
                # no lock: callers may hold it (flock is per open file), and the
                # replace is atomic; a concurrent writer only repeats this verdict
                self.save(rec)
        return rec

    def find(self, ref: str) -> dict[str, Any] | None:
        ref = ref.lstrip("/")
        recs = self.all()
        for rec in recs:
            if rec["name"] == ref or rec["id"] == ref:
                return rec
        matches = [r for r in recs if len(ref) >= 1 and r["id"].startswith(ref)]
        return matches[0] if len(matches) == 1 else None

    def save(self, rec: dict[str, Any]) -> None:
        _write_json_atomic(self.records / f"{rec['id']}.json", rec)

    def update(self, cid: str, **changes: Any) -> dict[str, Any] | None:
        with self.lock():
            rec = _read_json(self.records / f"{cid}.json")
            if rec is None:
                return None
            rec.update(changes)
            self.save(rec)
            return rec

    def remove(self, cid: str) -> None:
        with self.lock():
            with contextlib.suppress(FileNotFoundError):
                (self.records / f"{cid}.json").unlink()
            with contextlib.suppress(FileNotFoundError):
                (self.logs / f"{cid}.log").unlink()

    def log_path(self, cid: str) -> Path:
        return self.logs / f"{cid}.log"


def docker_usage_error(message: str, sub: str) -> ShimError:
    return ShimError(f"{message}\nSee 'docker {sub} --help'.", 125)


def docker_opts(args: Sequence[str], sub: str, bools: dict[str, str],
                 valued: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Tiny pflag-like parser for the non-run subcommands."""
    opts: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and arg != "-":
            flag, eq, inline = arg.partition("=")
            if flag in bools:
                opts[bools[flag]] = True
                i += 1
                continue
            if flag in valued:
                if eq:
                    value = inline
                    i += 1
                elif i + 1 < len(args):
                    value = args[i + 1]
                    i += 2
                else:
                    raise docker_usage_error(f"flag needs an argument: {flag}", sub)
                key = valued[flag]
                if key == "filter":
                    opts.setdefault(key, []).append(value)
                else:
                    opts[key] = value
                continue
            if flag.startswith("--"):
                raise docker_usage_error(f"unknown flag: {flag}", sub)
            raise docker_usage_error(f"unknown shorthand flag: '{flag[1:2]}' in {flag}", sub)
        rest.append(arg)
        i += 1
    return opts, rest
