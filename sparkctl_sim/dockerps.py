"""The simulated `docker` container views and verbs: ps, inspect, logs, stop, kill, rm, and the dispatcher.

SIMULATION ONLY (sparkctl_sim.procshims documents the deliberate differences).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from sparkctl_sim import dockerimages
from sparkctl_sim.shimbase import (
    DOCKER_STOP_DEFAULT_S,
    Containers,
    ShimError,
    _alive,
    _killpg,
    _read_json,
    _run_dir,
    _wait_until,
    docker_opts,
    parse_signal,
)

_TEMPLATE_RE = re.compile(r"\{\{\s*(json\s+)?\.([A-Za-z0-9_.]*)\s*\}\}")


def render_template(template: str, data: dict[str, Any]) -> str:
    """The subset of Go templates the shim supports: ``{{.A.B}}`` and ``{{json .A}}``."""

    def lookup(match: re.Match[str]) -> str:
        value: Any = data
        for part in filter(None, match.group(2).split(".")):
            if not isinstance(value, dict) or part not in value:
                raise ShimError(
                    f"template parsing error: template: :1:2: executing \"\" at <.{match.group(2)}>: "
                    f"map has no entry for key \"{part}\"", 1)
            value = value[part]
        if match.group(1):  # docker's `json` template function: json.Encoder, compact, no HTML escaping
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
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
    opts, rest = docker_opts(
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
            print(render_template(body, _ps_view(rec)))
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


def docker_stop(args: Sequence[str]) -> int:
    opts, refs = docker_opts(args, "stop", {}, {"-t": "time", "--time": "time",
                                                 "--timeout": "time", "-s": "signal",
                                                 "--signal": "signal"})
    if not refs:
        raise ShimError("\"docker stop\" requires at least 1 argument.\n"
                        "See 'docker stop --help'.", 1)
    timeout_s = float(opts.get("time", DOCKER_STOP_DEFAULT_S))
    sig = parse_signal(opts.get("signal", "SIGTERM"))
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
    opts, refs = docker_opts(args, "kill", {}, {"-s": "signal", "--signal": "signal"})
    sig = parse_signal(opts.get("signal", "SIGKILL"))
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
    opts, refs = docker_opts(args, "rm", {"-f": "force", "--force": "force",
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
    opts, refs = docker_opts(args, "inspect", {}, {"-f": "format", "--format": "format",
                                                    "--type": "type"})
    if opts.get("type") == "image":
        return dockerimages.docker_image_inspect(refs, opts.get("format"), render_template)
    store = Containers(_run_dir())
    images = dockerimages.node_images()
    code = 0
    views = []
    for ref in refs:
        rec = store.find(ref)
        if rec is None and opts.get("type") != "container" and (img := images.find(ref)) is not None:
            views.append(dockerimages.inspect_view(img, images.kind))  # `docker inspect` also finds images
            continue
        if rec is None:
            print(f"Error: No such object: {ref}", file=sys.stderr)
            code = 1
            continue
        views.append(_inspect_view(rec))
    if "format" in opts:
        for view in views:
            print(render_template(opts["format"], view))
    else:
        print(json.dumps(views, indent=4))
    return code


def docker_logs(args: Sequence[str]) -> int:
    opts, refs = docker_opts(args, "logs", {"-f": "follow", "--follow": "follow",
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


def info_text(kind: str, fmt: str | None) -> str:
    """What ``docker info [--format FMT]`` prints for an image store of ``kind``. Pure.

    The containerd image store reports the snapshotter (``Storage Driver: overlayfs``,
    ``driver-type: io.containerd.snapshotter.v1``); the classic store its graph driver
    (docs.docker.com/engine/storage/containerd/, moby daemon/info.go fillDriverInfo)."""
    if kind == dockerimages.STORE_CONTAINERD:
        view = {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}
    else:
        view = {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"], ["Supports d_type", "true"],
                                                       ["Using metacopy", "false"], ["Native Overlay Diff", "true"],
                                                       ["userxattr", "false"]]}
    view.update({"ServerVersion": "28.0.0-sparkctl-sim", "OperatingSystem": "Ubuntu 24.04 LTS (sparkctl sim)"})
    if fmt is not None:
        return render_template(fmt, view) + "\n"
    lines = ["Server:", " Server Version: " + view["ServerVersion"], " Storage Driver: " + view["Driver"]]
    return "\n".join(lines + [f"  {k}: {v}" for k, v in view["DriverStatus"]]) + "\n"


def docker_info(args: Sequence[str]) -> int:
    """``docker info [--format T]``: the storage driver and its DriverStatus, by image store (:func:`info_text`)."""
    opts, _ = docker_opts(args, "info", {}, {"-f": "format", "--format": "format"})
    sys.stdout.write(info_text(dockerimages.store_kind(_run_dir().parent), opts.get("format")))
    return 0


def docker_main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("Usage: docker [run|ps|stop|kill|rm|inspect|logs|images|image|save|load|pull|tag|rmi|version] ... "
              "(sparkctl sim shim)")
        return 0
    sub, rest = argv[0], list(argv[1:])
    if sub in ("--version", "-v"):
        print("Docker version 28.0.0-sparkctl-sim, build sim")
        return 0
    if sub == "container" and rest:
        sub, rest = rest[0], rest[1:]
    elif sub == "image" and rest:  # docker image inspect|ls|save|load|pull|tag|rm
        verb, rest = rest[0], rest[1:]
        if verb == "inspect":
            opts, refs = docker_opts(rest, "image inspect", {}, {"-f": "format", "--format": "format"})
            if not refs:
                raise ShimError("\"docker image inspect\" requires at least 1 argument.\n"
                                "See 'docker image inspect --help'.", 1)
            return dockerimages.docker_image_inspect(refs, opts.get("format"), render_template)
        sub = {"ls": "images", "list": "images", "rm": "rmi"}.get(verb, verb)
    if sub == "run":  # only `docker run` imports run's modules (every call starts a fresh `python3 -S`)
        from sparkctl_sim.dockershim import docker_run

        return docker_run(rest)
    handlers = {"ps": docker_ps, "stop": docker_stop, "kill": docker_kill,
                "rm": docker_rm, "inspect": docker_inspect, "logs": docker_logs,
                "images": dockerimages.docker_images, "save": dockerimages.docker_save,
                "load": dockerimages.docker_load, "pull": dockerimages.docker_pull,
                "tag": dockerimages.docker_tag, "rmi": dockerimages.docker_rmi}
    if sub == "info":
        return docker_info(rest)
    if sub == "version":
        print("Client: Docker Engine - sparkctl sim\n Version: 28.0.0-sparkctl-sim")
        return 0
    if sub not in handlers:
        raise ShimError(f"docker: '{sub}' is not a docker command.\nSee 'docker --help'", 1)
    return handlers[sub](rest)
