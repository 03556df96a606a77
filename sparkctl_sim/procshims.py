"""`docker` and `systemctl` stand-ins for the simulated nodes.

SIMULATION ONLY. The simulated Spark nodes have neither a Docker engine nor
systemd, yet sparkctl renders real ``docker run`` command lines and real unit
files. These shims execute those artefacts faithfully as plain processes, so an
end-to-end test proves that what was rendered is what a real node would accept:

* ``docker run`` parses docker's real flags, refuses unknown ones the way the
  docker CLI does (exit 125, ``unknown flag: --x``) and refuses to start any
  image without the four settings a multi-node engine needs on a Spark
  (``--network host``, ``--ipc host``, ``--device /dev/infiniband``,
  ``--ulimit memlock=-1``). A container is a process in its own session; its
  environment is the caller's plus ``--env-file`` and ``-e`` values (no shell
  ever sees them).
* ``systemctl`` reads unit files from ``$SPARKCTL_SIM_UNIT_DIR``, parses them
  with systemd's rules (quoting, ``$VAR``/``${VAR}`` expansion, environment
  files) and supervises ``Type=simple|exec`` services in a detached supervisor
  process; ``Type=oneshot`` runs synchronously.

State (container and unit records, logs) lives under ``$SPARKCTL_SIM_RUN_DIR``
(one per node). Records are JSON files written atomically (temp + rename) under
an ``flock``. Standard library only: the shims start on every call, so they
must start fast.

What this module must not do: import anything from the non-simulation code
paths, or talk to the network.

Deliberate differences from the real tools (documented, not accidental):

docker
  - No images, layers or mount namespace: the command runs on the node's own
    filesystem, so ``-v a:b`` is recorded and honest only when ``a == b`` (as
    sparkctl renders it). ``-w DIR`` must exist on the node.
  - An optional image catalogue (JSON, ``$SPARKCTL_SIM_DOCKER_IMAGES``) maps an
    image reference to ``{"entrypoint": [...], "cmd": [...], "env": {...},
    "workdir": "..."}``. Without a catalogue every image exists and has no
    entrypoint; with one, other images are refused as not found.
  - ``docker logs`` replays one merged stdout+stderr log.
  - ``--ulimit memlock`` is applied with ``setrlimit`` when permitted;
    ``--gpus``, ``--runtime``, ``--cap-add``, ``--shm-size`` and ``--init`` are
    validated and recorded only.
systemctl
  - Unit processes get systemd's clean environment, except that ``PATH``,
    ``HOME``, ``PYTHONPATH``, ``LANG``/``LC_ALL``/``TZ``, ``PYENV_*`` and every
    ``SPARKCTL_SIM_*`` variable are passed through from the caller (simulation
    plumbing; override the list with ``$SPARKCTL_SIM_SERVICE_PASSENV``).
  - A "control group" is the main process's process group: a child that calls
    ``setsid`` escapes it (as a docker container escapes a unit's cgroup).
  - Absolute paths ``/usr/bin/X``, ``/usr/sbin/X``, ``/bin/X``, ``/sbin/X`` of
    shimmed tools (``nvidia-smi``, ``docker``, ``systemctl`` and the names in
    ``$SPARKCTL_SIM_SHIMMED_TOOLS``) are resolved on ``PATH`` instead, so
    ``ExecStart=/usr/bin/nvidia-smi -lgc 0,2000`` reaches the node's shim.
  - ``StandardOutput=append:|file:|truncate:PATH`` into a directory that does not
    exist fails the command with status 209/STDOUT (210/STDERR), checked BEFORE
    ``LogsDirectory=``/``StateDirectory=``/``RuntimeDirectory=``/``CacheDirectory=``/
    ``ConfigurationDirectory=`` are created, in systemd's own order (see
    :func:`_open_output`). Those directories are created under the node's root
    (``$SPARKCTL_SIM_PREFIX``, ``/`` on a namespaced node), as systemd creates
    ``/var/log/NAME`` etc.
  - ``TimeoutStopSec`` is capped at 10 s; ``User=``/``Group=`` are recorded
    and ignored; ``Restart=on-failure|always`` restarts with ``RestartSec``
    (default 100 ms) up to 5 times in 10 s.
  - Command lines: quoting, C escapes, ``$$``, ``${VAR}`` inside words, and
    ``$VAR`` as a whole word (split on whitespace) are implemented; the
    prefixes ``-``, ``@``, ``:``, ``+``, ``!``, ``!!`` are understood (the
    privilege ones are no-ops). Unsupported: ``;``-separated command lists on
    one line, specifiers other than ``%% %n %N %p %i %t``, drop-in directories,
    templates (``foo@.service``), ``Type=forking|notify|dbus``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import re
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

RUN_DIR_ENV = "SPARKCTL_SIM_RUN_DIR"
UNIT_DIR_ENV = "SPARKCTL_SIM_UNIT_DIR"
IMAGES_ENV = "SPARKCTL_SIM_DOCKER_IMAGES"
SHIMMED_TOOLS_ENV = "SPARKCTL_SIM_SHIMMED_TOOLS"
SERVICE_PASSENV_ENV = "SPARKCTL_SIM_SERVICE_PASSENV"
PREFIX_ENV = "SPARKCTL_SIM_PREFIX"  # the node's root: "/" when namespaced, a directory rootless

DEFAULT_SHIMMED_TOOLS = ("nvidia-smi", "docker", "systemctl")
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


# ===========================================================================
# docker


DOCKER_VALUE_FLAGS = {
    "--name": "name", "--network": "network", "--net": "network", "--ipc": "ipc",
    "--device": "device", "--ulimit": "ulimit", "--cap-add": "cap_add",
    "--shm-size": "shm_size", "-e": "env", "--env": "env", "--env-file": "env_file",
    "-v": "volume", "--volume": "volume", "--gpus": "gpus", "--runtime": "runtime",
    "--entrypoint": "entrypoint", "-w": "workdir", "--workdir": "workdir",
}
DOCKER_BOOL_FLAGS = {"--rm": "rm", "-d": "detach", "--detach": "detach", "--init": "init"}
REPEATABLE = {"device", "ulimit", "cap_add", "env", "env_file", "volume"}
NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SIZE_RE = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


@dataclass
class RunSpec:
    """A parsed ``docker run`` command line."""

    image: str
    command: list[str]
    name: str | None = None
    rm: bool = False
    detach: bool = False
    init: bool = False
    network: str | None = None
    ipc: str | None = None
    gpus: str | None = None
    runtime: str | None = None
    entrypoint: str | None = None
    workdir: str | None = None
    shm_size: str | None = None
    device: list[str] = field(default_factory=list)
    ulimit: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    env_file: list[str] = field(default_factory=list)
    volume: list[str] = field(default_factory=list)


def _docker_usage_error(message: str, sub: str) -> ShimError:
    return ShimError(f"{message}\nSee 'docker {sub} --help'.", 125)


def _daemon_error(message: str, code: int = 125) -> ShimError:
    return ShimError(f"docker: Error response from daemon: {message}", code)


def parse_docker_run(args: Sequence[str]) -> RunSpec:
    """Parse ``docker run`` arguments (after ``run``) the way the docker CLI does.

    Flags stop at the first non-flag word (the image); everything after the
    image is the command, untouched.
    """
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if not arg.startswith("--") and len(arg) > 2:
            # -eK=V / -w/dir (value glued to a short flag) or -dit style bundles
            short = arg[:2]
            if short in DOCKER_VALUE_FLAGS:
                flag, eq, inline = short, "=", arg[2:].removeprefix("=")
            elif all(f"-{c}" in DOCKER_BOOL_FLAGS for c in arg[1:]):
                for c in arg[1:]:
                    values[DOCKER_BOOL_FLAGS[f"-{c}"]] = True
                i += 1
                continue
            else:
                bad = next(c for c in arg[1:] if f"-{c}" not in DOCKER_BOOL_FLAGS)
                raise _docker_usage_error(f"unknown shorthand flag: '{bad}' in {arg}", "run")
        if flag in DOCKER_BOOL_FLAGS:
            if eq and inline not in ("true", "false"):
                raise _docker_usage_error(
                    f'invalid argument "{inline}" for "{flag}" flag: strconv.ParseBool: '
                    f'parsing "{inline}": invalid syntax', "run")
            values[DOCKER_BOOL_FLAGS[flag]] = inline != "false"
            i += 1
            continue
        if flag in DOCKER_VALUE_FLAGS:
            if eq:
                value = inline
                i += 1
            else:
                if i + 1 >= len(args):
                    raise _docker_usage_error(f"flag needs an argument: {flag}", "run")
                value = args[i + 1]
                i += 2
            key = DOCKER_VALUE_FLAGS[flag]
            if key in REPEATABLE:
                values.setdefault(key, []).append(value)
            else:
                values[key] = value
            continue
        if flag.startswith("--"):
            raise _docker_usage_error(f"unknown flag: {flag}", "run")
        raise _docker_usage_error(f"unknown shorthand flag: '{flag[1:2]}' in {flag}", "run")
    if i >= len(args):
        raise ShimError(
            "docker: 'docker run' requires at least 1 argument.\n"
            "See 'docker run --help'.", 125)
    spec = RunSpec(image=args[i], command=list(args[i + 1:]), **values)
    _validate_run_spec(spec)
    return spec


def _validate_run_spec(spec: RunSpec) -> None:
    if spec.name is not None and not NAME_RE.match(spec.name):
        raise _daemon_error(
            f'Invalid container name ({spec.name}), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.')
    for item in spec.ulimit:
        kind, eq, limits = item.partition("=")
        parts = limits.split(":")
        if not eq or not kind or len(parts) > 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts):
            raise _docker_usage_error(
                f'invalid argument "{item}" for "--ulimit" flag: invalid ulimit argument: {item}', "run")
    for item in spec.volume:
        parts = item.split(":")
        if len(parts) < 2 or len(parts) > 3 or not parts[0] or not parts[1]:
            raise _docker_usage_error(f'invalid argument "{item}" for "-v, --volume" flag', "run")
        if len(parts) == 3 and not set(parts[2].split(",")) <= {"ro", "rw", "z", "Z", "shared",
                                                               "rshared", "slave", "rslave",
                                                               "private", "rprivate"}:
            raise _daemon_error(f'invalid mode: {parts[2]}')
    if spec.shm_size is not None and not SIZE_RE.match(spec.shm_size):
        raise _docker_usage_error(
            f'invalid argument "{spec.shm_size}" for "--shm-size" flag: invalid size: '
            f"'{spec.shm_size}'", "run")
    for item in spec.env:
        name = item.partition("=")[0]
        if not name:
            raise _docker_usage_error(
                f'invalid argument "{item}" for "-e, --env" flag: invalid environment '
                f'variable: {item}', "run")


def multinode_engine_gaps(spec: RunSpec) -> list[str]:
    """The settings a multi-node engine container needs on a Spark that are missing.

    Labels-free heuristic: every image is treated as an engine, because every
    container sparkctl starts is one. Shared memory and RDMA need the host IPC
    namespace, host networking (the fabric netdevs), the InfiniBand verbs
    devices, and unlimited locked memory for registered buffers.
    """
    gaps = []
    if spec.network != "host":
        gaps.append("--network host (NCCL must see the fabric netdevs)")
    if spec.ipc != "host":
        gaps.append("--ipc host (NCCL shared-memory transport between ranks)")
    if not any(d.split(":")[0].rstrip("/") == "/dev/infiniband" for d in spec.device):
        gaps.append("--device /dev/infiniband (RDMA verbs devices for the RoCE fabric)")
    if not any(u.partition("=")[0] == "memlock" and u.partition("=")[2].split(":")[0] == "-1"
               for u in spec.ulimit):
        gaps.append("--ulimit memlock=-1 (RDMA registers pinned memory)")
    return gaps


def parse_docker_env_file(text: str, host_env: dict[str, str], source: str) -> list[tuple[str, str]]:
    """Parse docker's ``--env-file`` format: ``KEY=VALUE`` lines, ``#`` comments.

    No quote processing and no expansion: the value is everything after the
    first ``=``, verbatim. A line with only a name takes the host's value (and
    is dropped when the host has none), as docker does.
    """
    out: list[tuple[str, str]] = []
    text = text.removeprefix("\ufeff")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = line.partition("=")
        if not name:
            raise ShimError(
                f"docker: invalid env file ({source}): line {lineno}: "
                "no variable name on line '{raw}'.", 125)
        if any(c.isspace() for c in name):
            raise ShimError(
                f"docker: invalid env file ({source}): variable '{name}' contains whitespaces.", 125)
        if eq:
            out.append((name, value))
        elif name in host_env:
            out.append((name, host_env[name]))
    return out


def _container_env(spec: RunSpec, image_env: dict[str, str]) -> dict[str, str]:
    host_env = dict(os.environ)
    env = dict(host_env)
    env.update(image_env)
    pairs: list[tuple[str, str]] = []
    for path in spec.env_file:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ShimError(f"docker: open {path}: {exc.strerror.lower()}.", 125) from exc
        pairs.extend(parse_docker_env_file(text, host_env, path))
    for item in spec.env:  # -e comes after --env-file, so it wins
        name, eq, value = item.partition("=")
        if eq:
            pairs.append((name, value))
        elif name in host_env:
            pairs.append((name, host_env[name]))
    env.update(pairs)
    return env


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


def _load_image_catalogue() -> dict[str, Any] | None:
    path = os.environ.get(IMAGES_ENV)
    if not path:
        return None
    data = _read_json(Path(path))
    if data is None:
        raise ShimError(f"sparkctl sim: cannot read image catalogue {path}", 125)
    return data


def _resolve_exec(argv0: str, env: dict[str, str]) -> str | None:
    if "/" in argv0:
        return argv0 if os.access(argv0, os.X_OK) and os.path.isfile(argv0) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def docker_run(args: Sequence[str]) -> int:
    spec = parse_docker_run(args)
    gaps = multinode_engine_gaps(spec)
    if gaps:
        raise _daemon_error(
            f"sparkctl sim refuses to start image {spec.image!r}: a multi-node engine "
            "container on a DGX Spark needs " + "; ".join(gaps) + " (missing).")
    catalogue = _load_image_catalogue()
    image: dict[str, Any] = {}
    if catalogue is not None:
        if spec.image not in catalogue:
            raise ShimError(
                f"Unable to find image '{spec.image}' locally\n"
                f"docker: Error response from daemon: pull access denied for {spec.image}, "
                "repository does not exist or may require 'docker login'.\n"
                "See 'docker run --help'.", 125)
        image = catalogue[spec.image] or {}
    entrypoint = [spec.entrypoint] if spec.entrypoint else list(image.get("entrypoint") or [])
    if spec.entrypoint is not None and spec.entrypoint == "":
        entrypoint = []
    command = spec.command or ([] if spec.entrypoint else list(image.get("cmd") or []))
    argv = entrypoint + command
    if not argv:
        raise _daemon_error("No command specified.")
    workdir = spec.workdir or image.get("workdir") or None
    if workdir and not os.path.isdir(workdir):
        raise _daemon_error(
            f"sparkctl sim: working directory {workdir!r} does not exist on this node "
            "(the sim has no container filesystem).")
    env = _container_env(spec, dict(image.get("env") or {}))
    exe = _resolve_exec(argv[0], env)
    if exe is None:
        raise _daemon_error(
            "failed to create task for container: failed to create shim task: OCI runtime "
            "create failed: runc create failed: unable to start container process: "
            f'exec: "{argv[0]}": executable file not found in $PATH: unknown.', 127)

    store = Containers(_run_dir())
    cid = secrets.token_hex(32)
    with store.lock():
        existing = {r["name"]: r["id"] for r in store.all()}
        name = spec.name or f"sim_{cid[:12]}"
        if name in existing:
            raise _daemon_error(
                f'Conflict. The container name "/{name}" is already in use by container '
                f'"{existing[name]}". You have to remove (or rename) that container to be '
                "able to reuse that name.")
        rec: dict[str, Any] = {
            "id": cid, "name": name, "image": spec.image, "command": argv,
            "created_at": _now_iso(), "started_at": None, "finished_at": None,
            "status": "created", "exit_code": None, "pid": None, "pid_start": None,
            "monitor_pid": None, "monitor_start": None, "rm": spec.rm, "detach": spec.detach,
            "network": spec.network, "ipc": spec.ipc, "devices": spec.device,
            "ulimits": spec.ulimit, "cap_add": spec.cap_add, "shm_size": spec.shm_size,
            "volumes": spec.volume, "gpus": spec.gpus, "runtime": spec.runtime,
            "init": spec.init, "workdir": workdir,
            # names only: values may be secrets (HF tokens) and this file is not 0600
            "env_keys": sorted(env),
        }
        store.save(rec)
    if spec.detach:
        return _docker_run_detached(store, rec, exe, argv, env, workdir)
    return _docker_run_foreground(store, rec, exe, argv, env, workdir)


def _spawn_container(exe: str, argv: list[str], env: dict[str, str], workdir: str | None,
                     stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, executable=exe, env=env, cwd=workdir, stdin=subprocess.DEVNULL,
        stdout=stdout, stderr=stderr, start_new_session=True,
        preexec_fn=_set_memlock_unlimited,  # noqa: PLW1509 - single-threaded here
    )


def _finish_container(store: Containers, rec: dict[str, Any], proc: subprocess.Popen[bytes],
                      status: int) -> int:
    code = _exit_code_from_status(status)
    # When PID 1 of a container exits, the kernel kills the rest of its pid
    # namespace; the sim's stand-in is the container's process group.
    _killpg(proc.pid, signal.SIGKILL)
    if rec["rm"]:
        store.remove(rec["id"])
    else:
        store.update(rec["id"], status="exited", exit_code=code, finished_at=_now_iso())
    return code


def _wait_status(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 255 << 8


def _docker_run_detached(store: Containers, rec: dict[str, Any], exe: str, argv: list[str],
                         env: dict[str, str], workdir: str | None) -> int:
    read_fd, write_fd = os.pipe()
    if _daemonize():
        os.close(read_fd)
        code = 1
        try:
            with open(store.log_path(rec["id"]), "ab", buffering=0) as log:
                try:
                    proc = _spawn_container(exe, argv, env, workdir, log, log)
                except OSError as exc:
                    os.write(write_fd, f"error {exc}".encode())
                    store.update(rec["id"], status="exited", exit_code=126, finished_at=_now_iso())
                    os._exit(1)
                store.update(rec["id"], status="running", pid=proc.pid,
                             pid_start=_proc_start_ticks(proc.pid), started_at=_now_iso(),
                             monitor_pid=os.getpid(), monitor_start=_proc_start_ticks(os.getpid()))
                os.write(write_fd, b"ok")
                os.close(write_fd)
                code = _finish_container(store, rec, proc, _wait_status(proc.pid))
        except BaseException:
            _log_crash(store.root / "monitor-crash.log")
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        answer = fh.read().decode()
    if answer != "ok":
        store.remove(rec["id"])
        raise _daemon_error(f"failed to create task for container: {answer or 'monitor died'}", 126)
    print(rec["id"], flush=True)
    return 0


def _pump(src: Any, dst_fd: int, log: Any, log_lock: threading.Lock) -> None:
    while True:
        chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
        if not chunk:
            break
        with contextlib.suppress(OSError):
            os.write(dst_fd, chunk)
        with log_lock:
            log.write(chunk)


def _docker_run_foreground(store: Containers, rec: dict[str, Any], exe: str, argv: list[str],
                           env: dict[str, str], workdir: str | None) -> int:
    with open(store.log_path(rec["id"]), "ab", buffering=0) as log:
        try:
            proc = _spawn_container(exe, argv, env, workdir, subprocess.PIPE, subprocess.PIPE)
        except OSError as exc:
            store.remove(rec["id"])
            raise _daemon_error(f"failed to create task for container: {exc}", 126) from exc
        store.update(rec["id"], status="running", pid=proc.pid,
                     pid_start=_proc_start_ticks(proc.pid), started_at=_now_iso(),
                     monitor_pid=os.getpid(), monitor_start=_proc_start_ticks(os.getpid()))

        def forward(signum: int, _frame: Any) -> None:  # docker's --sig-proxy
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, forward)
        log_lock = threading.Lock()
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, 1, log, log_lock), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, 2, log, log_lock), daemon=True)]
        for t in pumps:
            t.start()
        status = _wait_status(proc.pid)
        _killpg(proc.pid, signal.SIGKILL)  # closes the pipes held by stragglers
        for t in pumps:
            t.join(timeout=2)
    return _finish_container(store, rec, proc, status)


def _docker_opts(args: Sequence[str], sub: str, bools: dict[str, str],
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
                    raise _docker_usage_error(f"flag needs an argument: {flag}", sub)
                key = valued[flag]
                if key == "filter":
                    opts.setdefault(key, []).append(value)
                else:
                    opts[key] = value
                continue
            if flag.startswith("--"):
                raise _docker_usage_error(f"unknown flag: {flag}", sub)
            raise _docker_usage_error(f"unknown shorthand flag: '{flag[1:2]}' in {flag}", sub)
        rest.append(arg)
        i += 1
    return opts, rest


_TEMPLATE_RE = re.compile(r"\{\{\s*(json\s+)?\.([A-Za-z0-9_.]*)\s*\}\}")


def _render_template(template: str, data: dict[str, Any]) -> str:
    """The subset of Go templates the shim supports: ``{{.A.B}}`` and ``{{json .A}}``."""

    def lookup(match: re.Match[str]) -> str:
        value: Any = data
        for part in filter(None, match.group(2).split(".")):
            if not isinstance(value, dict) or part not in value:
                raise ShimError(
                    f"template parsing error: template: :1:2: executing \"\" at <.{match.group(2)}>: "
                    f"map has no entry for key \"{part}\"", 1)
            value = value[part]
        if match.group(1):
            return json.dumps(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "<no value>"
        if isinstance(value, (dict, list)):
            return json.dumps(value)
        return str(value)

    out = _TEMPLATE_RE.sub(lookup, template)
    return out.replace("\\t", "\t").replace("\\n", "\n")


def _human_status(rec: dict[str, Any]) -> str:
    if rec["status"] == "running":
        return "Up"
    if rec["status"] == "exited":
        return f"Exited ({rec.get('exit_code')})"
    return "Created"


def _ps_view(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "ID": rec["id"][:12], "Names": rec["name"], "Image": rec["image"],
        "Command": '"' + shlex.join(rec["command"])[:20] + '"', "CreatedAt": rec["created_at"],
        "Status": _human_status(rec), "State": rec["status"], "Ports": "",
    }


def _inspect_view(rec: dict[str, Any]) -> dict[str, Any]:
    running = rec["status"] == "running"
    return {
        "Id": rec["id"], "Name": "/" + rec["name"], "Created": rec["created_at"],
        "Path": rec["command"][0], "Args": rec["command"][1:],
        "State": {
            "Status": rec["status"], "Running": running, "Paused": False, "Restarting": False,
            "Dead": False, "Pid": rec["pid"] if running else 0,
            "ExitCode": rec.get("exit_code") or 0,
            "StartedAt": rec.get("started_at") or "", "FinishedAt": rec.get("finished_at") or "",
        },
        "Config": {"Image": rec["image"], "Env": rec.get("env_keys", []),
                   "Cmd": rec["command"], "WorkingDir": rec.get("workdir") or ""},
        "HostConfig": {
            "NetworkMode": rec.get("network") or "default", "IpcMode": rec.get("ipc") or "private",
            "AutoRemove": rec.get("rm", False), "Devices": rec.get("devices", []),
            "Ulimits": rec.get("ulimits", []), "CapAdd": rec.get("cap_add", []),
            "ShmSize": rec.get("shm_size"), "Binds": rec.get("volumes", []),
            "Runtime": rec.get("runtime") or "runc", "Init": rec.get("init", False),
        },
    }


def docker_ps(args: Sequence[str]) -> int:
    opts, rest = _docker_opts(
        args, "ps", {"-a": "all", "--all": "all", "-q": "quiet", "--quiet": "quiet",
                     "--no-trunc": "no_trunc"},
        {"--filter": "filter", "-f": "filter", "--format": "format"})
    if rest:
        raise ShimError('"docker ps" accepts no arguments.\nSee \'docker ps --help\'.', 1)
    recs = Containers(_run_dir()).all()
    if not opts.get("all"):
        recs = [r for r in recs if r["status"] == "running"]
    for flt in opts.get("filter", []):
        key, _, value = flt.partition("=")
        if key == "name":
            recs = [r for r in recs if re.search(value, r["name"])]
        elif key == "id":
            recs = [r for r in recs if r["id"].startswith(value)]
        elif key == "status":
            recs = [r for r in recs if r["status"] == value]
        else:
            raise ShimError(f"Error response from daemon: invalid filter '{key}'", 1)
    if opts.get("quiet"):
        for rec in recs:
            print(rec["id"] if opts.get("no_trunc") else rec["id"][:12])
        return 0
    fmt = opts.get("format")
    if fmt:
        body = fmt.removeprefix("table ")  # the header line of `table` is not reproduced
        for rec in recs:
            print(_render_template(body, _ps_view(rec)))
        return 0
    print(f"{'CONTAINER ID':<15}{'IMAGE':<25}{'COMMAND':<25}{'STATUS':<15}NAMES")
    for rec in recs:
        v = _ps_view(rec)
        print(f"{v['ID']:<15}{v['Image']:<25}{v['Command']:<25}{v['Status']:<15}{v['Names']}")
    return 0


def _no_such(ref: str) -> ShimError:
    return ShimError(f"Error response from daemon: No such container: {ref}", 1)


def _stop_container(store: Containers, rec: dict[str, Any], sig: int, timeout_s: float) -> None:
    if rec["status"] != "running":
        return
    pid = rec["pid"]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

    def done() -> bool:
        cur = _read_json(store.records / f"{rec['id']}.json")
        return cur is None or cur.get("status") != "running" or not _alive(pid, rec["pid_start"])

    if not _wait_until(done, timeout_s):
        _killpg(pid, signal.SIGKILL)
    _killpg(pid, signal.SIGKILL)  # the rest of the "pid namespace"
    # Give the monitor a moment to record the exit (and --rm to remove).
    _wait_until(lambda: (cur := _read_json(store.records / f"{rec['id']}.json")) is None
                or cur.get("status") != "running", 3.0)
    store.all()  # reconcile when the monitor is gone


def _parse_signal(name: str) -> int:
    name = name.upper()
    if name.isdigit():
        return int(name)
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError as exc:
        raise ShimError(f"invalid signal: {name}", 1) from exc


def docker_stop(args: Sequence[str]) -> int:
    opts, refs = _docker_opts(args, "stop", {}, {"-t": "time", "--time": "time",
                                                 "--timeout": "time", "-s": "signal",
                                                 "--signal": "signal"})
    if not refs:
        raise ShimError("\"docker stop\" requires at least 1 argument.\n"
                        "See 'docker stop --help'.", 1)
    timeout_s = float(opts.get("time", DOCKER_STOP_DEFAULT_S))
    sig = _parse_signal(opts.get("signal", "SIGTERM"))
    store = Containers(_run_dir())
    code = 0
    for ref in refs:
        rec = store.find(ref)
        if rec is None:
            print(_no_such(ref).message, file=sys.stderr)
            code = 1
            continue
        _stop_container(store, rec, sig, timeout_s)
        print(ref)
    return code


def docker_kill(args: Sequence[str]) -> int:
    opts, refs = _docker_opts(args, "kill", {}, {"-s": "signal", "--signal": "signal"})
    sig = _parse_signal(opts.get("signal", "SIGKILL"))
    store = Containers(_run_dir())
    code = 0
    for ref in refs:
        rec = store.find(ref)
        if rec is None or rec["status"] != "running":
            msg = (_no_such(ref).message if rec is None else
                   f"Error response from daemon: cannot kill container: {ref}: "
                   f"container {rec['id']} is not running")
            print(msg, file=sys.stderr)
            code = 1
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["pid"], sig)
        print(ref)
    return code


def docker_rm(args: Sequence[str]) -> int:
    opts, refs = _docker_opts(args, "rm", {"-f": "force", "--force": "force",
                                           "-v": "volumes", "--volumes": "volumes"}, {})
    if not refs:
        raise ShimError("\"docker rm\" requires at least 1 argument.\n"
                        "See 'docker rm --help'.", 1)
    store = Containers(_run_dir())
    code = 0
    for ref in refs:
        rec = store.find(ref)
        if rec is None:
            print(_no_such(ref).message, file=sys.stderr)
            code = 1
            continue
        if rec["status"] == "running":
            if not opts.get("force"):
                print(f'Error response from daemon: cannot remove container "/{rec["name"]}": '
                      "container is running: stop the container before removing or force remove",
                      file=sys.stderr)
                code = 1
                continue
            _stop_container(store, rec, signal.SIGKILL, 2.0)
        store.remove(rec["id"])
        print(ref)
    return code


def docker_inspect(args: Sequence[str]) -> int:
    opts, refs = _docker_opts(args, "inspect", {}, {"-f": "format", "--format": "format",
                                                    "--type": "type"})
    store = Containers(_run_dir())
    code = 0
    views = []
    for ref in refs:
        rec = store.find(ref)
        if rec is None:
            print(f"Error: No such object: {ref}", file=sys.stderr)
            code = 1
            continue
        views.append(_inspect_view(rec))
    if "format" in opts:
        for view in views:
            print(_render_template(opts["format"], view))
    else:
        print(json.dumps(views, indent=4))
    return code


def docker_logs(args: Sequence[str]) -> int:
    opts, refs = _docker_opts(args, "logs", {"-f": "follow", "--follow": "follow",
                                             "-t": "timestamps", "--timestamps": "timestamps"},
                              {"-n": "tail", "--tail": "tail"})
    if len(refs) != 1:
        raise ShimError("\"docker logs\" requires exactly 1 argument.\n"
                        "See 'docker logs --help'.", 1)
    store = Containers(_run_dir())
    rec = store.find(refs[0])
    if rec is None:
        raise _no_such(refs[0])
    path = store.log_path(rec["id"])
    out = sys.stdout.buffer
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return 0
    with fh:
        data = fh.read()
        tail = opts.get("tail", "all")
        if tail != "all":
            n = int(tail)
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-n:]) if n > 0 else b""
        out.write(data)
        out.flush()
        if opts.get("follow"):
            while True:
                chunk = fh.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                    continue
                cur = _read_json(store.records / f"{rec['id']}.json")
                if cur is None or cur.get("status") != "running":
                    out.write(fh.read())
                    out.flush()
                    break
                time.sleep(0.1)
    return 0


def docker_main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("Usage: docker [run|ps|stop|kill|rm|inspect|logs|version] ... (sparkctl sim shim)")
        return 0
    sub, rest = argv[0], list(argv[1:])
    if sub in ("--version", "-v"):
        print("Docker version 28.0.0-sparkctl-sim, build sim")
        return 0
    if sub == "container" and rest:
        sub, rest = rest[0], rest[1:]
    handlers = {"run": docker_run, "ps": docker_ps, "stop": docker_stop, "kill": docker_kill,
                "rm": docker_rm, "inspect": docker_inspect, "logs": docker_logs}
    if sub == "version":
        print("Client: Docker Engine - sparkctl sim\n Version: 28.0.0-sparkctl-sim")
        return 0
    if sub not in handlers:
        raise ShimError(f"docker: '{sub}' is not a docker command.\nSee 'docker --help'", 1)
    return handlers[sub](rest)


# ===========================================================================
# systemd: unit files, environment files, command lines

_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}


def split_systemd_words(text: str) -> list[str]:
    """Split a systemd setting into words (extract_first_word with unquoting and C escapes).

    Double and single quotes group words and are removed; backslash escapes
    (``\\n``, ``\\t``, ``\\"``, ``\\\\``, ``\\xNN``, octal ``\\NNN``) are decoded
    both inside and outside quotes. ``$`` is left alone for the later
    variable expansion step.
    """
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\n":
            i += 1
        if i >= n:
            return words
        buf: list[str] = []
        quote: str | None = None
        while i < n:
            c = text[i]
            if quote is None and c in " \t\n":
                break
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError("trailing backslash")
                i, decoded = _decode_escape(text, i + 1)
                buf.append(decoded)
                continue
            if quote is None and c in "\"'":
                quote = c
            elif quote is not None and c == quote:
                quote = None
            else:
                buf.append(c)
            i += 1
        if quote is not None:
            raise ValueError(f"unbalanced quotes in: {text}")
        words.append("".join(buf))


def _decode_escape(text: str, i: int) -> tuple[int, str]:
    c = text[i]
    if c in _C_ESCAPES:
        return i + 1, _C_ESCAPES[c]
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 1:i + 3]):
        return i + 3, chr(int(text[i + 1:i + 3], 16))
    if re.fullmatch(r"[0-7]{3}", text[i:i + 3]):
        return i + 3, chr(int(text[i:i + 3], 8))
    if c == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 1:i + 5]):
        return i + 5, chr(int(text[i + 1:i + 5], 16))
    raise ValueError(f"invalid escape \\{c}")


def expand_systemd_argv(words: Sequence[str], env: dict[str, str]) -> list[str]:
    """systemd's variable substitution on an already-unquoted command line.

    ``${VAR}`` (anywhere in a word) is replaced by the exact value; a word that
    is exactly ``$VAR`` is replaced by the value split at whitespace (zero or
    more words); ``$$`` is a literal ``$``; a ``$NAME`` inside a longer word
    is left as it is. Unset variables expand to nothing.
    """
    out: list[str] = []
    for word in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(_expand_curly(word, env))
    return out


def _expand_curly(word: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        return "$" if m.group(0) == "$$" else env.get(m.group(1), "")

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word)


def parse_systemd_env_file(text: str) -> list[tuple[str, str]]:
    """Parse an ``EnvironmentFile=`` the way systemd does (no variable expansion).

    ``KEY=VALUE`` per line, ``#``/``;`` comments, whitespace around unquoted
    values trimmed, single quotes literal, double quotes with ``\\"``,
    ``\\\\``, ``\\$`` and ``\\``` escapes, backslash-newline continues a line.
    Lines without ``=`` and invalid names are ignored (systemd logs them).
    """
    out: list[tuple[str, str]] = []
    state = "pre_key"
    key: list[str] = []
    val: list[str] = []
    last_ws = -1  # index in val after which only unquoted trailing whitespace follows

    def push() -> None:
        k = "".join(key).rstrip()
        v = "".join(val)
        if last_ws >= 0:
            v = v[:last_ws]
        if ENV_NAME_RE.match(k):
            out.append((k, v))

    for c in text + "\n":
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif not c.isspace():
                key, state = [c], "key"
        elif state == "key":
            if c == "\n":
                state = "pre_key"  # a name without '=' is ignored
            elif c == "=":
                val, last_ws, state = [], -1, "pre_value"
            else:
                key.append(c)
        elif state == "pre_value":
            if c == "\n":
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif not c.isspace():
                val.append(c)
                state = "value"
        elif state == "value":
            if c == "\n":
                push()
                state = "pre_key"
            elif c == "\\":
                last_ws = -1
                state = "value_escape"
            else:
                if c.isspace():
                    if last_ws < 0:
                        last_ws = len(val)
                else:
                    last_ws = -1
                val.append(c)
        elif state == "value_escape":
            state = "value"
            if c != "\n":
                val.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                val.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                val.append(c)
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                val.append(c)
            elif c != "\n":
                val.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c == "\n":
                state = "pre_key"
        elif state == "comment_escape":
            state = "comment"
    return out


_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0,
               "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0}


def parse_timespan_s(text: str) -> float:
    """systemd time span (``90``, ``5s``, ``1min 30s``, ``500ms``, ``infinity``) in seconds."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    total = 0.0
    pos = 0
    for m in re.finditer(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)", text):
        if m.start() != pos or m.group(2) not in _TIME_UNITS:
            raise ValueError(f"invalid time span: {text}")
        total += float(m.group(1)) * _TIME_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"invalid time span: {text}")
    return total


@dataclass(frozen=True)
class ExecCommand:
    """One ``Exec*=`` line: prefix flags plus the unquoted words (not yet expanded)."""

    words: tuple[str, ...]
    ignore_failure: bool = False  # '-'
    argv0_override: bool = False  # '@': second word is argv[0]
    no_expand: bool = False  # ':'
    line: str = ""


# Settings systemd knows that the sim accepts and does not act on.
_IGNORED_KEYS = {
    "Unit": {"After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "Conflicts",
             "Documentation", "StartLimitIntervalSec", "StartLimitBurst", "ConditionPathExists",
             "AssertPathExists", "DefaultDependencies"},
    "Service": {"Group", "KillMode", "TimeoutStartSec", "TimeoutSec", "SuccessExitStatus",
                "LimitNOFILE", "LimitCORE", "LimitSTACK", "Nice", "SyslogIdentifier",
                "PIDFile", "NotifyAccess", "OOMScoreAdjust", "SendSIGKILL", "UMask",
                "StandardInput", "Delegate", "CPUAffinity"},
    "Install": {"Alias", "Also", "DefaultInstance"},
}
_MULTI_EXEC = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop", "ExecStopPost")


@dataclass
class Unit:
    """A parsed service unit; ``warnings`` are what systemd would log and ignore."""

    name: str
    path: str
    text: str
    description: str = ""
    type: str = "simple"
    exec: dict[str, list[ExecCommand]] = field(default_factory=dict)
    environment: list[tuple[str, str]] = field(default_factory=list)
    environment_files: list[tuple[str, bool]] = field(default_factory=list)  # (path, optional)
    working_directory: str | None = None
    working_directory_optional: bool = False
    restart: str = "no"
    restart_sec_s: float = 0.1
    kill_signal: int = int(signal.SIGTERM)
    timeout_stop_s: float = 90.0
    user: str | None = None
    standard_output: str = "journal"
    standard_error: str = "inherit"
    remain_after_exit: bool = False
    limit_memlock: str | None = None
    exec_directories: list[tuple[str, str]] = field(default_factory=list)  # (setting, name)
    wanted_by: list[str] = field(default_factory=list)
    required_by: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _specifiers(value: str, unit_name: str) -> str:
    prefix = unit_name.rsplit(".", 1)[0]
    table = {"%": "%", "n": unit_name, "N": prefix, "p": prefix, "i": "", "t": "/run"}

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in table:
            raise ValueError(f"unsupported specifier %{m.group(1)}")
        return table[m.group(1)]

    return re.sub(r"%(.)", sub, value)


def _parse_exec(value: str) -> ExecCommand:
    flags = ""
    while value and value[0] in "-@:+!":
        flags += value[0]
        value = value[1:]
    words = split_systemd_words(value)
    if ";" in words:
        raise ValueError("';'-separated command lists are not supported by the sim")
    if not words:
        raise ValueError("empty command")
    return ExecCommand(tuple(words), ignore_failure="-" in flags, argv0_override="@" in flags,
                       no_expand=":" in flags, line=value)


def parse_unit(name: str, path: str, text: str) -> Unit:
    """Parse a service unit file with systemd's syntax rules (see module docstring)."""
    unit = Unit(name=name, path=path, text=text)
    section = ""
    logical: list[tuple[int, str]] = []
    pending = ""
    start_line = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if pending and stripped[:1] in ("#", ";"):
            continue  # comment lines inside a continuation are skipped
        if not pending:
            start_line = lineno
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append((start_line, pending + stripped))
        pending = ""
    if pending:
        logical.append((start_line, pending))
    for lineno, line in logical:
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        where = f"{path}:{lineno}"
        if not eq:
            unit.warnings.append(f"{where}: Missing '=', ignoring line.")
            continue
        try:
            _apply_setting(unit, section, key, value)
        except ValueError as exc:
            unit.warnings.append(f"{where}: Invalid value for {key}=: {exc}; ignoring.")
        except KeyError:
            unit.warnings.append(f"{where}: Unknown key name '{key}' in section '{section}', "
                                 "ignoring.")
    return unit


def _apply_setting(unit: Unit, section: str, key: str, value: str) -> None:  # noqa: C901
    if key in _IGNORED_KEYS.get(section, set()):
        return
    if section == "Unit" and key == "Description":
        unit.description = value
    elif section == "Service" and key in _MULTI_EXEC:
        if value == "":
            unit.exec[key] = []  # an empty assignment resets the list
        else:
            unit.exec.setdefault(key, []).append(_parse_exec(_specifiers(value, unit.name)))
    elif section == "Service" and key == "Type":
        if value not in ("simple", "exec", "oneshot", "forking", "notify", "dbus", "idle"):
            raise ValueError(value)
        unit.type = value
    elif section == "Service" and key == "Environment":
        if value == "":
            unit.environment = []
        for word in split_systemd_words(_specifiers(value, unit.name)):
            k, eq, v = word.partition("=")
            if not eq or not ENV_NAME_RE.match(k):
                raise ValueError(f"invalid environment assignment {word!r}")
            unit.environment.append((k, v))
    elif section == "Service" and key == "EnvironmentFile":
        if value == "":
            unit.environment_files = []
            return
        optional = value.startswith("-")
        unit.environment_files.append((_specifiers(value.lstrip("-"), unit.name), optional))
    elif section == "Service" and key == "WorkingDirectory":
        unit.working_directory_optional = value.startswith("-")
        unit.working_directory = _specifiers(value.lstrip("-"), unit.name) or None
    elif section == "Service" and key == "Restart":
        if value not in ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog",
                         "on-abort", "always"):
            raise ValueError(value)
        unit.restart = value
    elif section == "Service" and key == "RestartSec":
        unit.restart_sec_s = parse_timespan_s(value)
    elif section == "Service" and key == "KillSignal":
        unit.kill_signal = _parse_signal(value)
    elif section == "Service" and key in ("TimeoutStopSec",):
        unit.timeout_stop_s = parse_timespan_s(value)
    elif section == "Service" and key == "User":
        unit.user = value  # recorded, ignored: the sim runs everything as the caller
    elif section == "Service" and key in ("StandardOutput", "StandardError"):
        kind = value.partition(":")[0]
        if kind not in ("inherit", "null", "journal", "kmsg", "tty", "journal+console",
                        "kmsg+console", "append", "file", "truncate", "syslog"):
            raise ValueError(value)
        value = _specifiers(value, unit.name)
        if key == "StandardOutput":
            unit.standard_output = value
        else:
            unit.standard_error = value
    elif section == "Service" and key == "RemainAfterExit":
        unit.remain_after_exit = value.lower() in ("yes", "true", "1", "on")
    elif section == "Service" and key == "LimitMEMLOCK":
        unit.limit_memlock = value
    elif section == "Service" and key in EXEC_DIRECTORY_ROOTS:
        if value == "":
            unit.exec_directories = [d for d in unit.exec_directories if d[0] != key]
            return
        for name in split_systemd_words(_specifiers(value, unit.name)):
            name = name.partition(":")[0]  # NAME:SYMLINK; the symlink part is not simulated
            # systemd refuses absolute names and ".." (src/core/load-fragment.c,
            # config_parse_exec_directories: "... is not valid, ignoring").
            parts = name.split("/")
            if name.startswith("/") or any(x in ("", ".", "..") for x in parts):
                raise ValueError(f"{key}= path is not valid: {name}")
            unit.exec_directories.append((key, name))
    elif section == "Install" and key == "WantedBy":
        unit.wanted_by.extend(value.split())
    elif section == "Install" and key == "RequiredBy":
        unit.required_by.extend(value.split())
    else:
        raise KeyError(key)


# ===========================================================================
# systemctl: state and supervision


def _unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


class Units:
    """Loaded units and their runtime records for one simulated node."""

    def __init__(self, run_dir: Path) -> None:
        unit_dir = os.environ.get(UNIT_DIR_ENV)
        if not unit_dir:
            raise ShimError(f"sparkctl sim: {UNIT_DIR_ENV} is not set", 1)
        self.unit_dir = Path(unit_dir)
        self.root = run_dir / "systemd"
        self.loaded = self.root / "loaded"
        self.loaded.mkdir(parents=True, exist_ok=True)

    def lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        return _locked(self.root / f"{name}.lock")

    def state_path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def journal(self, name: str) -> Path:
        return self.root / f"{name}.journal.log"

    def state(self, name: str) -> dict[str, Any]:
        rec = _read_json(self.state_path(name)) or {}
        rec.setdefault("ActiveState", "inactive")
        rec.setdefault("SubState", "dead")
        rec.setdefault("MainPID", 0)
        rec.setdefault("Result", "success")
        rec.setdefault("NRestarts", 0)
        # A supervisor that vanished (SIGKILLed, node power-cycled) leaves a unit
        # that systemd would have seen die: report what the processes say.
        if rec["ActiveState"] in ("active", "activating", "deactivating") and rec.get("supervisor"):
            sup = rec["supervisor"]
            if not _alive(sup.get("pid"), sup.get("start")) and not _alive(
                    rec["MainPID"], rec.get("main_start")):
                if not (rec["ActiveState"] == "active" and rec.get("SubState") == "exited"):
                    rec.update(ActiveState="failed", SubState="failed", MainPID=0, Result="signal")
        return rec

    def save_state(self, name: str, rec: dict[str, Any]) -> None:
        _write_json_atomic(self.state_path(name), rec)

    def update(self, name: str, **changes: Any) -> dict[str, Any]:
        with self.lock(name):
            rec = _read_json(self.state_path(name)) or {}
            rec.update(changes)
            self.save_state(name, rec)
            return rec

    def disk_path(self, name: str) -> Path:
        return self.unit_dir / name

    def daemon_reload(self) -> None:
        for old in self.loaded.glob("*"):
            old.unlink()
        if self.unit_dir.is_dir():
            for path in self.unit_dir.iterdir():
                if path.is_file() and not path.is_symlink() and path.suffix == ".service":
                    shutil.copyfile(path, self.loaded / path.name)

    def load(self, name: str) -> Unit | None:
        """The unit as systemd has it loaded: the last daemon-reload's copy.

        A unit never loaded is read from disk on demand (as systemd does); a
        loaded unit whose file changed since keeps its old definition and the
        caller is warned, exactly like ``systemctl`` does.
        """
        snap = self.loaded / name
        disk = self.disk_path(name)
        if not snap.exists():
            if not disk.is_file():
                return None
            shutil.copyfile(disk, snap)
        text = snap.read_text(encoding="utf-8")
        try:
            if disk.read_text(encoding="utf-8") != text:
                print(f"Warning: The unit file, source configuration file or drop-ins of {name} "
                      "changed on disk. Run 'systemctl daemon-reload' to reload units.",
                      file=sys.stderr)
        except OSError:
            pass
        return parse_unit(name, str(disk), text)


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

    restarts: list[float] = []
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
            try:
                proc = _spawn_unit_process(unit, main, env, out, err)
            except OSError as exc:
                _journal_line(units, name, f"Failed at step EXEC spawning: {exc}")
                units.update(name, ActiveState="failed", SubState="failed", Result="exit-code",
                             MainPID=0, ExecMainStatus=203, ExecMainCode="exited")
                # Type=simple reports success before the exec; Type=exec waits for it.
                report("ok 0" if unit.type == "simple" else "fail exec")
                return 1
            finally:
                out.close()
                if err is not out:
                    err.close()
            units.update(name, ActiveState="active", SubState="running", MainPID=proc.pid,
                         main_start=_proc_start_ticks(proc.pid), supervisor=me,
                         ActiveEnterTimestamp=_now_iso(), Result="success",
                         ExecMainStatus=None, ExecMainCode=None, stop_requested=False)
            _journal_line(units, name, f"Started {unit.description or name} (MainPID {proc.pid}).")
            report(f"ok {proc.pid}")
            env_post = dict(env, MAINPID=str(proc.pid))
            _run_control(units, unit, "ExecStartPost", env_post)
            status = _wait_status(proc.pid)
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
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < START_LIMIT_INTERVAL_S]
                if want_restart and len(restarts) >= START_LIMIT_BURST:
                    want_restart = False
                    cur.update(ActiveState="failed", SubState="failed", Result="start-limit-hit")
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
            restarts.append(time.monotonic())
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
    cur = units.state(name)
    if cur["ActiveState"] in ("active", "activating"):
        return 0
    job_failed = (f"Job for {name} failed because the control process exited with error code.\n"
                  f"See \"systemctl status {name}\" and \"journalctl -xeu {name}\" for details.")
    base = {"Id": name, "Type": unit.type, "Restart": unit.restart, "User": unit.user or "",
            "FragmentPath": unit.path, "KillSignal": unit.kill_signal,
            "TimeoutStopSec": min(unit.timeout_stop_s, STOP_TIMEOUT_CAP_S),
            "Description": unit.description, "stop_requested": False, "stop_timed_out": False,
            "ExecMainStatus": None, "ExecMainCode": None, "invocation": secrets.token_hex(8)}
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
    if answer == "fail resources":
        raise ShimError(f"Job for {name} failed because of unavailable resources or another "
                        "system error.", 1)
    raise ShimError(job_failed, 1)


def _stop(units: Units, name: str) -> int:
    unit = units.load(name)
    if unit is None and not units.state_path(name).exists():
        raise ShimError(f"Failed to stop {name}: Unit {name} not loaded.", 5)
    cur = units.state(name)
    if cur["ActiveState"] in ("inactive", "failed"):
        return 0
    timeout_s = min(float(cur.get("TimeoutStopSec") or STOP_TIMEOUT_CAP_S), STOP_TIMEOUT_CAP_S)
    kill_signal = int(cur.get("KillSignal") or signal.SIGTERM)
    units.update(name, stop_requested=True, ActiveState="deactivating", SubState="stop-sigterm")
    pid = int(cur.get("MainPID") or 0)
    if unit is not None and pid:
        try:
            env = _service_env(unit)
        except ShimError:
            env = {"PATH": os.environ.get("PATH", os.defpath)}
        _run_control(units, unit, "ExecStop", dict(env, MAINPID=str(pid)), timeout_s)
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


# ===========================================================================
# entry points


def install_procshims(bin_dir: Path, python: str = sys.executable) -> list[Path]:
    """Write ``docker`` and ``systemctl`` sh wrappers into ``bin_dir``.

    The wrappers run this module with an absolute interpreter and put the
    directory that holds the ``sparkctl`` package on ``PYTHONPATH``, so they
    work in a clean environment (an SSH session, a systemd unit).
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    package_root = str(Path(__file__).resolve().parents[1])
    written = []
    for tool in ("docker", "systemctl"):
        path = bin_dir / tool
        body = (
            "#!/bin/sh\n"
            "# sparkctl SIMULATION shim: see sparkctl/sim/procshims.py\n"
            f"PYTHONPATH={shlex.quote(package_root)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            f"exec {shlex.quote(python)} -m sparkctl_sim.procshims {tool} \"$@\"\n"
        )
        tmp = path.with_name(f".{tool}.tmp")
        tmp.write_text(body, encoding="utf-8")
        tmp.chmod(0o755)
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``docker ARGS`` or ``systemctl ARGS``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("docker", "systemctl"):
        print("usage: python3 -m sparkctl_sim.procshims docker|systemctl ARGS...", file=sys.stderr)
        return 2
    tool, rest = args[0], args[1:]
    try:
        return docker_main(rest) if tool == "docker" else systemctl_main(rest)
    except ShimError as exc:
        print(exc.message, file=sys.stderr)
        return exc.code
    except ValueError as exc:  # a malformed unit or argument, reported like systemd does
        print(f"{tool}: {exc}", file=sys.stderr)
        return 1
    finally:
        if rest and rest[0] in ("stop", "rm", "kill", "restart"):
            # An engine killed before it gave its memory back: settle the node's
            # simulated memory now, as the driver would when the process is gone.
            from sparkctl_sim import nodestate

            with contextlib.suppress(OSError, ValueError):
                time.sleep(0.05)
                nodestate.settle_file(os.environ.get("SPARKCTL_SIM_STATE"))


def _entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
