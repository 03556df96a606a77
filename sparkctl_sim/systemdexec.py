"""How the simulated systemd starts a unit's process: outputs, exec directories, environment, spawn.

SIMULATION ONLY (sparkctl_sim.procshims documents the deliberate differences).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sparkctl_sim.shimbase import (
    DEFAULT_SERVICE_PASSENV,
    DEFAULT_SHIMMED_TOOLS,
    EXEC_DIRECTORY_ROOTS,
    PREFIX_ENV,
    SERVICE_PASSENV_ENV,
    SHIMMED_TOOLS_ENV,
    ShimError,
    _set_memlock_unlimited,
)
from sparkctl_sim.systemdunits import (
    ExecCommand,
    Unit,
    expand_systemd_argv,
    parse_systemd_env_file,
)


class OutputSetupError(OSError):
    """systemd's child could not open StandardOutput=/StandardError= (209/STDOUT, 210/STDERR)."""

    def __init__(self, stream: str, status: int, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror)
        self.stream = stream
        self.status = status


def _open_output(spec: str, journal: Path) -> Any:
    """Open one standard stream the way systemd's child does (setup_output).

    systemd opens ``append:``/``file:``/``truncate:`` targets with O_CREAT and
    never creates their directory (systemd.exec(5), StandardOutput=); and it
    does so BEFORE it creates LogsDirectory= and the other exec directories:
    src/core/execute.c exec_child() calls setup_output() (``*exit_status =
    EXIT_STDOUT``) well before setup_exec_directory() (systemd issue #27591,
    open; src/core/exec-invoke.c in v255+ keeps the order). So
    ``StandardOutput=append:/var/log/sparkctl/engine.log`` with
    ``LogsDirectory=sparkctl`` fails the first start on a fresh node: 209/STDOUT.
    """
    kind, _, target = spec.partition(":")
    if kind == "null":
        return open(os.devnull, "ab", buffering=0)
    if kind == "append":
        return open(target, "ab", buffering=0)
    if kind == "truncate":
        return open(target, "wb", buffering=0)
    if kind == "file":
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        return os.fdopen(fd, "wb", buffering=0)
    return open(journal, "ab", buffering=0)  # journal, syslog, kmsg, tty, inherit of journal


def _node_root() -> str:
    return os.environ.get(PREFIX_ENV) or "/"


def _make_exec_directories(unit: Unit) -> None:
    """LogsDirectory= & co.: created 0755 with their parents, under the node's root.

    systemd does this in the child after the standard streams are set up and
    before the chdir and the exec (src/core/execute.c, setup_exec_directory;
    mode 0755 by default: systemd.exec(5), LogsDirectoryMode=).
    """
    root = _node_root()
    for key, name in unit.exec_directories:
        base = EXEC_DIRECTORY_ROOTS[key].lstrip("/")
        path = Path(root) / base / name
        path.mkdir(mode=0o755, parents=True, exist_ok=True)


def _service_env(unit: Unit) -> dict[str, str]:
    """systemd's clean environment plus the unit's settings (see module docstring)."""
    passenv = os.environ.get(SERVICE_PASSENV_ENV)
    names = passenv.split(",") if passenv is not None else list(DEFAULT_SERVICE_PASSENV)
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith("SPARKCTL_SIM_")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["INVOCATION_ID"] = secrets.token_hex(16)
    env.update(unit.environment)
    for path, optional in unit.environment_files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            if optional:
                continue
            raise ShimError(f"Failed to load environment files: {path}: {exc.strerror}", 1) from exc
        env.update(parse_systemd_env_file(text))
    return env


def _shimmed_tools() -> set[str]:
    extra = os.environ.get(SHIMMED_TOOLS_ENV, "")
    return set(DEFAULT_SHIMMED_TOOLS) | {t for t in extra.split(",") if t}


def _resolve_unit_exec(path: str, env: dict[str, str]) -> str | None:
    """Where the sim finds an ExecStart binary (see module docstring)."""
    head, _, base = path.rpartition("/")
    if head in ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin") and base in _shimmed_tools():
        return shutil.which(base, path=env.get("PATH"))
    if path.startswith("/"):
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    if "/" in path:
        return None  # systemd refuses relative paths
    return shutil.which(path, path=env.get("PATH"))


def _prepare(cmd: ExecCommand, env: dict[str, str]) -> tuple[str | None, list[str]]:
    words = list(cmd.words) if cmd.no_expand else expand_systemd_argv(cmd.words, env)
    if not words:
        return None, []
    exe = _resolve_unit_exec(words[0], env)
    argv = words[1:] if cmd.argv0_override else words
    return exe, argv


def _spawn_unit_process(unit: Unit, cmd: ExecCommand, env: dict[str, str], out: Any,
                        err: Any) -> subprocess.Popen[bytes]:
    _make_exec_directories(unit)  # after the streams (the caller opened them), before chdir/exec
    exe, argv = _prepare(cmd, env)
    if exe is None or not argv:
        raise FileNotFoundError(f"{cmd.words[0]}: No such file or directory (203/EXEC)")
    cwd = unit.working_directory
    if cwd == "~":
        cwd = env.get("HOME", "/")
    if cwd and not os.path.isdir(cwd):
        if unit.working_directory_optional:
            cwd = None
        else:
            raise NotADirectoryError(f"{cwd}: No such file or directory (200/CHDIR)")
    memlock = unit.limit_memlock

    def preexec() -> None:
        if memlock in ("infinity", "-1"):
            _set_memlock_unlimited()

    return subprocess.Popen(argv, executable=exe, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err, start_new_session=True,
                            preexec_fn=preexec)  # noqa: PLW1509 - no threads here
