"""The simulated `docker` CLI: `docker run` (flags, validation, containers as processes) and the verb table.

SIMULATION ONLY (sparkctl_sim.procshims documents the deliberate differences).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl_sim import dockerimages, imagefs
from sparkctl_sim.shimbase import (
    Containers,
    ShimError,
    _daemonize,
    _exit_code_from_status,
    _killpg,
    _log_crash,
    _now_iso,
    _proc_start_ticks,
    _run_dir,
    _set_memlock_unlimited,
    docker_usage_error,
    wait_status,
)

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
                raise docker_usage_error(f"unknown shorthand flag: '{bad}' in {arg}", "run")
        if flag in DOCKER_BOOL_FLAGS:
            if eq and inline not in ("true", "false"):
                raise docker_usage_error(
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
                    raise docker_usage_error(f"flag needs an argument: {flag}", "run")
                value = args[i + 1]
                i += 2
            key = DOCKER_VALUE_FLAGS[flag]
            if key in REPEATABLE:
                values.setdefault(key, []).append(value)
            else:
                values[key] = value
            continue
        if flag.startswith("--"):
            raise docker_usage_error(f"unknown flag: {flag}", "run")
        raise docker_usage_error(f"unknown shorthand flag: '{flag[1:2]}' in {flag}", "run")
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
            raise docker_usage_error(
                f'invalid argument "{item}" for "--ulimit" flag: invalid ulimit argument: {item}', "run")
    for item in spec.volume:
        parts = item.split(":")
        if len(parts) < 2 or len(parts) > 3 or not parts[0] or not parts[1]:
            raise docker_usage_error(f'invalid argument "{item}" for "-v, --volume" flag', "run")
        if len(parts) == 3 and not set(parts[2].split(",")) <= {"ro", "rw", "z", "Z", "shared",
                                                               "rshared", "slave", "rslave",
                                                               "private", "rprivate"}:
            raise _daemon_error(f'invalid mode: {parts[2]}')
    if spec.shm_size is not None and not SIZE_RE.match(spec.shm_size):
        raise docker_usage_error(
            f'invalid argument "{spec.shm_size}" for "--shm-size" flag: invalid size: '
            f"'{spec.shm_size}'", "run")
    for item in spec.env:
        name = item.partition("=")[0]
        if not name:
            raise docker_usage_error(
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


def _container_env(spec: RunSpec, image_env: dict[str, str], site: Path | None = None) -> dict[str, str]:
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
    # the simulated image's site-packages: its torch (torch.cuda.nccl.version(): what it was
    # built against) and the libnccl that `import torch` loads (sparkctl_sim/imagefs.py)
    stub = str(site) if site is not None else str(Path(__file__).resolve().parent / "containerpy")
    env["PYTHONPATH"] = stub + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _resolve_exec(argv0: str, env: dict[str, str]) -> str | None:
    if "/" in argv0:
        return argv0 if os.access(argv0, os.X_OK) and os.path.isfile(argv0) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def docker_run(args: Sequence[str]) -> int:
    spec = parse_docker_run(args)
    # A one-shot container with no network (sparkctl's nccl fact asks the image's torch
    # for its NCCL) cannot be a multi-node engine: the engine heuristic does not apply.
    one_shot = spec.rm and not spec.detach and spec.network == "none"
    gaps = [] if one_shot else multinode_engine_gaps(spec)
    if gaps:
        raise _daemon_error(
            f"sparkctl sim refuses to start image {spec.image!r}: a multi-node engine "
            "container on a DGX Spark needs " + "; ".join(gaps) + " (missing).")
    # The node's image store is the truth (sparkctl_sim.dockerimages). An image not
    # there is pulled (docker run's default --pull=missing), which the simulated
    # registry refuses for everything it does not publish; the CLI's text is
    # "Unable to find image 'X' locally" then the daemon's error (docker/cli
    # cli/command/container/create.go, exit 125).
    image = dockerimages.run_config(spec.image)
    if image is None:
        raise ShimError(
            f"Unable to find image '{dockerimages.normalize(spec.image)}' locally\n"
            f"docker: {dockerimages.pull_error(spec.image)}.\n"
            "See 'docker run --help'.", 125)
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
    image_env = dict(image.get("env") or {})
    try:
        site = imagefs.site_packages(_run_dir().parent.parent.parent, image["config_digest"], image["sim"], image_env)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        raise _daemon_error(f"sparkctl sim: cannot lay out the image's file system: {exc}") from None
    env = _container_env(spec, image_env, site)
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
            "id": cid, "name": name, "image": spec.image, "image_id": image["id"], "command": argv,
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
                code = _finish_container(store, rec, proc, wait_status(proc.pid))
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
        status = wait_status(proc.pid)
        _killpg(proc.pid, signal.SIGKILL)  # closes the pipes held by stragglers
        for t in pumps:
            t.join(timeout=2)
    return _finish_container(store, rec, proc, status)
