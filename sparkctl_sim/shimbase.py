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
from collections.abc import Iterator
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
