"""The simulated systemctl fails a unit into a missing log directory the way systemd does,
and runs the rendered engine unit on a node that never saw sparkctl.

systemd opens ``StandardOutput=append:PATH`` before it creates ``LogsDirectory=``
(src/core/execute.c, exec_child; systemd issue #27591): a start into a missing
directory fails with status 209/STDOUT, LogsDirectory= or not. The rendered unit
therefore lets the shell open its log, after systemd created the directories.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import render
from sparkctl_sim import procshims


def _env(tmp: Path, node_root: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    procshims.install_procshims(bin_dir)
    (tmp / "units").mkdir(exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', os.defpath)}"
    env[procshims.RUN_DIR_ENV] = str(tmp / "run")
    env[procshims.UNIT_DIR_ENV] = str(tmp / "units")
    env[procshims.PREFIX_ENV] = str(node_root)
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30)


def _props(env: dict[str, str], unit: str) -> dict[str, str]:
    out = _run(env, "systemctl", "show", "-p", "ActiveState,Result,ExecMainStatus,ExecMainCode", unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def _settled(env: dict[str, str], unit: str) -> dict[str, str]:
    for _ in range(200):  # not a timing assertion: waits for the detached supervisor to record
        props = _props(env, unit)
        if props["ActiveState"] not in ("activating", "active"):
            return props
        time.sleep(0.05)
    return _props(env, unit)


@pytest.mark.parametrize("with_logs_directory", [False, True])
def test_simulated_append_into_a_missing_directory_fails_209_stdout(tmp_path: Path, with_logs_directory: bool) -> None:
    node = tmp_path / "node"
    (node / "var" / "log").mkdir(parents=True)  # a real image has /var/log, not /var/log/sparkctl
    env = _env(tmp_path, node)
    log = node / "var" / "log" / "sparkctl" / "engine.log"
    (tmp_path / "units" / "engine.service").write_text(textwrap.dedent(f"""\
        [Service]
        Type=simple
        {"LogsDirectory=sparkctl" if with_logs_directory else ""}
        ExecStart=/bin/sh -c 'echo started; exec sleep 30'
        StandardOutput=append:{log}
        StandardError=append:{log}
        """))
    start = _run(env, "systemctl", "start", "engine")
    assert start.returncode == 0, start.stderr  # Type=simple: the fork succeeded, as with systemd
    props = _settled(env, "engine")
    assert props == {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "209", "ExecMainCode": "1"}
    status = _run(env, "systemctl", "status", "engine")
    assert status.returncode == 3
    assert "status=209/STDOUT" in status.stdout
    assert "Failed to set up standard output: No such file or directory" in status.stdout
    assert not log.exists()
    # systemd creates LogsDirectory= only after the streams failed: never reached here.
    assert not log.parent.exists()


def test_simulated_oneshot_into_a_missing_directory_fails_the_job(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    env = _env(tmp_path, node)
    (tmp_path / "units" / "cap.service").write_text(textwrap.dedent(f"""\
        [Service]
        Type=oneshot
        ExecStart=/bin/true
        StandardOutput=append:{node}/nowhere/out.log
        """))
    start = _run(env, "systemctl", "start", "cap")
    assert start.returncode == 1 and "failed because the control process exited with error code" in start.stderr
    assert _props(env, "cap")["ExecMainStatus"] == "209"


def test_simulated_exec_directories_are_made_under_the_node_root(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    env = _env(tmp_path, node)
    (tmp_path / "units" / "dirs.service").write_text(textwrap.dedent("""\
        [Service]
        Type=oneshot
        LogsDirectory=sparkctl
        StateDirectory=sparkctl other/nested
        RuntimeDirectory=sparkctl
        ExecStart=/bin/true
        """))
    assert _run(env, "systemctl", "start", "dirs").returncode == 0
    for d in ("var/log/sparkctl", "var/lib/sparkctl", "var/lib/other/nested", "run/sparkctl"):
        assert (node / d).is_dir(), d
        assert (node / d).stat().st_mode & 0o777 == 0o755
    bad = procshims.parse_unit("bad.service", "bad.service", "[Service]\nLogsDirectory=/var/log/x\n")
    assert bad.exec_directories == [] and "is not valid" in bad.warnings[0]


def test_simulated_rendered_engine_unit_serves_logs_on_a_node_that_never_saw_sparkctl(
        tmp_path: Path, repo: Path) -> None:
    """The real template, rendered for a node whose root is a fresh directory, run by the shim."""
    node = tmp_path / "node"
    for d in ("var/log", "var/lib", "etc", "opt"):  # what a real image has; nothing of sparkctl's
        (node / d).mkdir(parents=True)
    inv = loads_inventory(textwrap.dedent(f"""\
        cluster: {{name: one}}
        nodes:
          - {{name: spark-a, host: 127.0.0.1, prefix: {node}}}
        cables: []
        """), "inv.yaml")
    roots = Roots.make(env={})
    files = render(resolve("llamacpp-1box", roots), inv, roots, secrets={}).files["spark-a"]
    unit = next(f for f in files.values() if f.path.endswith("sparkctl-engine.service"))
    launch = next(f for f in files.values() if f.role == "launch")
    # launch.sh stands in for the engine: the unit, not the engine, is under test here.
    Path(launch.path).parent.mkdir(parents=True)
    Path(launch.path).write_text("echo engine up; echo on stderr >&2; exec sleep 30\n")
    env = _env(tmp_path, node)
    (tmp_path / "units" / "sparkctl-engine.service").write_text(unit.text)
    assert _run(env, "systemctl", "start", "sparkctl-engine").returncode == 0
    log = node / "var" / "log" / "sparkctl" / "engine.log"
    try:
        for _ in range(200):
            if log.exists() and "on stderr" in log.read_text():
                break
            time.sleep(0.05)
        assert _props(env, "sparkctl-engine")["ActiveState"] == "active"
        assert log.read_text() == "engine up\non stderr\n"
        assert (node / "var" / "lib" / "sparkctl").is_dir()  # StateDirectory=sparkctl
    finally:
        assert _run(env, "systemctl", "stop", "sparkctl-engine").returncode == 0
