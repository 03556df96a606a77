"""The docker and systemctl shims: real flags, real unit files, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sparkctl_sim import procshims
from tests.sim.helpers import ShimHost, alive, wait_until

ENGINE_FLAGS = ["--network", "host", "--ipc", "host", "--device", "/dev/infiniband",
                "--ulimit", "memlock=-1"]


# --------------------------------------------------------------------------- docker


def test_docker_run_refuses_missing_ipc_host(sim: ShimHost) -> None:
    flags = ["--network", "host", "--device", "/dev/infiniband", "--ulimit", "memlock=-1"]
    res = sim.run("docker", "run", "-d", "--name", "eng", *flags, "img", "sleep", "30")
    assert res.returncode == 125
    assert res.stderr.startswith("docker: Error response from daemon:")
    assert "--ipc host" in res.stderr
    assert "--network host" not in res.stderr  # only what is missing is named
    assert sim.run("docker", "ps", "-a", "-q").stdout == ""


@pytest.mark.parametrize(("flag", "message"), [
    ("--bogus", "unknown flag: --bogus"),
    ("-x", "unknown shorthand flag: 'x' in -x"),
    ("--privileged", "unknown flag: --privileged"),
])
def test_docker_run_refuses_unknown_flags(sim: ShimHost, flag: str, message: str) -> None:
    res = sim.run("docker", "run", flag, *ENGINE_FLAGS, "img", "true")
    assert res.returncode == 125
    assert res.stderr.splitlines()[0] == message


def test_docker_detached_lifecycle(sim: ShimHost) -> None:
    res = sim.run("docker", "run", "-d", "--name", "eng0", *ENGINE_FLAGS, "--gpus", "all",
                  "--runtime", "nvidia", "--cap-add", "IPC_LOCK", "--shm-size", "16g", "--init",
                  "img", "sh", "-c", "echo ready; exec sleep 30")
    assert res.returncode == 0, res.stderr
    cid = res.stdout.strip()
    assert len(cid) == 64 and all(c in "0123456789abcdef" for c in cid)

    names = sim.run("docker", "ps", "--filter", "name=eng0", "--format", "{{.Names}}")
    assert names.stdout == "eng0\n"
    assert sim.run("docker", "inspect", "-f", "{{.State.Running}}", "eng0").stdout == "true\n"
    pid = int(sim.run("docker", "inspect", "-f", "{{.State.Pid}}", "eng0").stdout)
    assert alive(pid) and os.getpgid(pid) == pid  # its own session, like a container
    assert wait_until(lambda: sim.run("docker", "logs", "--tail", "1", "eng0").stdout == "ready\n", 5.0, 0.05)

    started = time.monotonic()
    stop = sim.run("docker", "stop", "-t", "5", "eng0")
    assert stop.returncode == 0 and stop.stdout == "eng0\n"
    assert time.monotonic() - started < 4.0  # SIGTERM was enough
    assert not alive(pid)
    assert sim.run("docker", "ps", "--format", "{{.Names}}").stdout == ""
    assert sim.run("docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}",
                   "eng0").stdout == "false 143\n"
    assert sim.run("docker", "rm", "eng0").returncode == 0
    assert sim.run("docker", "ps", "-a", "-q").stdout == ""
    missing = sim.run("docker", "inspect", "-f", "{{.State.Running}}", "eng0")
    assert missing.returncode == 1 and "No such object: eng0" in missing.stderr


def test_docker_name_conflict_and_force_remove(sim: ShimHost) -> None:
    assert sim.run("docker", "run", "-d", "--name", "eng1", *ENGINE_FLAGS, "img",
                   "sleep", "30").returncode == 0
    again = sim.run("docker", "run", "-d", "--name", "eng1", *ENGINE_FLAGS, "img", "sleep", "30")
    assert again.returncode == 125 and "Conflict" in again.stderr
    refused = sim.run("docker", "rm", "eng1")
    assert refused.returncode == 1 and "container is running" in refused.stderr
    assert sim.run("docker", "rm", "-f", "eng1").returncode == 0
    assert sim.run("docker", "ps", "-a", "-q").stdout == ""


def test_docker_env_file_values_reach_process_exactly(sim: ShimHost) -> None:
    env_file = sim.root / "engine.env"
    env_file.write_text(
        "# rendered by sparkctl\n"
        "SPACES=value with  spaces\n"
        "DOLLAR=$HOME and ${NOPE} $$\n"
        "QUOTES=\"double\" 'single' `tick`\n"
        "TRAILING=x  \n"
        "EMPTY=\n"
        "   INDENTED=yes\n"
        "OVERRIDDEN=from-file\n"
    )
    keys = ["SPACES", "DOLLAR", "QUOTES", "TRAILING", "EMPTY", "INDENTED", "OVERRIDDEN", "CLI"]
    script = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"
    res = sim.run("docker", "run", "--rm", *ENGINE_FLAGS, "--env-file", str(env_file),
                  "-e", "OVERRIDDEN=from -e", "-e", "CLI=a;b|c", "img",
                  sys.executable, "-c", script)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "SPACES": "value with  spaces",
        "DOLLAR": "$HOME and ${NOPE} $$",
        "QUOTES": "\"double\" 'single' `tick`",
        "TRAILING": "x  ",
        "EMPTY": "",
        "INDENTED": "yes",
        "OVERRIDDEN": "from -e",
        "CLI": "a;b|c",
    }
    assert sim.run("docker", "ps", "-a", "-q").stdout == ""  # --rm


def test_docker_foreground_exit_code_and_sigterm(sim: ShimHost) -> None:
    res = sim.run("docker", "run", "--name", "once", *ENGINE_FLAGS, "img",
                  "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "err\n")
    assert sim.run("docker", "inspect", "-f", "{{.State.ExitCode}}", "once").stdout == "7\n"
    # stdout and stderr are two pipes: their order in the shared log is not defined
    assert sorted(sim.run("docker", "logs", "once").stdout.splitlines()) == ["err", "out"]
    sim.run("docker", "rm", "once")

    proc = subprocess.Popen(["docker", "run", "--name", "fg", *ENGINE_FLAGS, "img",
                             "sleep", "30"], env=sim.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: sim.run("docker", "ps", "--format",
                                         "{{.Names}}").stdout == "fg\n", 5.0, 0.05)
        pid = int(sim.run("docker", "inspect", "-f", "{{.State.Pid}}", "fg").stdout)
        proc.send_signal(signal.SIGTERM)  # the CLI forwards it to the container
        assert proc.wait(timeout=5) == 128 + signal.SIGTERM
        assert not alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sim.run("docker", "rm", "-f", "fg")


def test_docker_a_container_outlives_its_sigkilled_cli_and_keeps_its_name(sim: ShimHost) -> None:
    """docker run is a client: SIGKILL cannot be forwarded (--sig-proxy), the container runs
    on under its name, and the next `docker run --name` gets moby's Conflict (exit 125)
    until `docker rm -f` (sparkctl_sim.clusterdocker)."""
    proc = subprocess.Popen(["docker", "run", "--rm", "--name", "eng", *ENGINE_FLAGS, "img", "sleep", "60"],
                            env=sim.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: sim.run("docker", "ps", "--format", "{{.Names}}").stdout == "eng\n", 5.0, 0.05)
    pid = int(sim.run("docker", "inspect", "-f", "{{.State.Pid}}", "eng").stdout)
    cid = sim.run("docker", "inspect", "-f", "{{.Id}}", "eng").stdout.strip()
    proc.kill()
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert alive(pid) and sim.run("docker", "ps", "--format", "{{.Names}}").stdout == "eng\n"
    again = sim.run("docker", "run", "--rm", "--name", "eng", *ENGINE_FLAGS, "img", "true")
    assert again.returncode == 125
    assert again.stderr.strip() == (
        f'docker: Error response from daemon: Conflict. The container name "/eng" is already in use by '
        f'container "{cid}". You have to remove (or rename) that container to be able to reuse that name.')
    # what the engine unit does before each start: clear it, then the name is free
    sim.unit("eng.service", f"""
        [Service]
        Type=oneshot
        ExecStartPre=-docker rm -f eng
        ExecStart=docker run --rm --name eng {' '.join(ENGINE_FLAGS)} img true
    """)
    assert sim.run("systemctl", "start", "eng.service").returncode == 0
    assert not alive(pid)
    assert sim.run("docker", "ps", "-a", "-q").stdout == ""


def test_docker_missing_executable(sim: ShimHost) -> None:
    res = sim.run("docker", "run", "--rm", *ENGINE_FLAGS, "img", "no-such-binary-xyz")
    assert res.returncode == 127
    assert 'exec: "no-such-binary-xyz": executable file not found in $PATH' in res.stderr


# --------------------------------------------------------------------------- systemctl


def test_systemctl_simple_service_lifecycle(sim: ShimHost) -> None:
    env_file = sim.root / "engine.env"
    env_file.write_text('# engine environment\nGREETING="hello  world"\nRAW=a $b\n')
    out = sim.root / "engine.log"
    sim.unit("tiny-engine.service", f"""
        [Unit]
        Description=sparkctl tiny engine
        After=network-online.target

        [Service]
        Type=simple
        User=spark
        EnvironmentFile={env_file}
        EnvironmentFile=-{sim.root}/missing.env
        Environment="LABEL=rank 0" MODE=ring
        ExecStartPre=/bin/echo pre ${{LABEL}}
        ExecStart=/bin/sh -c 'echo "G=${{GREETING}} R=$RAW L=$LABEL M=${{MODE}}"; exec sleep 30'
        StandardOutput=append:{out}
        StandardError=append:{out}
        TimeoutStopSec=5

        [Install]
        WantedBy=multi-user.target
        """)
    assert sim.run("systemctl", "daemon-reload").returncode == 0
    enable = sim.run("systemctl", "enable", "--now", "tiny-engine")
    assert enable.returncode == 0, enable.stderr
    assert "Created symlink" in enable.stderr
    active = sim.run("systemctl", "is-active", "tiny-engine.service")
    assert (active.returncode, active.stdout) == (0, "active\n")
    show = sim.run("systemctl", "show", "-p", "MainPID,ActiveState", "tiny-engine")
    props = dict(line.split("=", 1) for line in show.stdout.splitlines())
    assert props["ActiveState"] == "active"
    pid = int(props["MainPID"])
    assert alive(pid)
    assert wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == 2, 5.0, 0.05)
    # ${VAR} is expanded by systemd; $VAR inside a word is left for sh.
    assert out.read_text() == "pre rank 0\nG=hello  world R=a $b L=rank 0 M=ring\n"
    assert sim.run("systemctl", "status", "tiny-engine").returncode == 0

    stop = sim.run("systemctl", "stop", "tiny-engine")
    assert stop.returncode == 0
    assert not alive(pid)
    inactive = sim.run("systemctl", "is-active", "tiny-engine")
    assert (inactive.returncode, inactive.stdout) == (3, "inactive\n")
    assert sim.run("systemctl", "is-enabled", "tiny-engine").stdout == "enabled\n"
    assert sim.run("systemctl", "disable", "tiny-engine").returncode == 0
    assert sim.run("systemctl", "is-enabled", "tiny-engine").stdout == "disabled\n"


def test_systemctl_oneshot_exit_status_and_shimmed_tool(sim: ShimHost) -> None:
    calls = sim.root / "nvidia-smi.calls"
    fake = sim.root / "bin" / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    sim.unit("clock-cap.service", """
        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=/usr/bin/nvidia-smi -lgc 0,2000
        """)
    assert sim.run("systemctl", "start", "clock-cap").returncode == 0
    assert calls.read_text() == "-lgc 0,2000\n"
    assert sim.run("systemctl", "is-active", "clock-cap").stdout == "active\n"

    sim.unit("broken.service", """
        [Service]
        Type=oneshot
        ExecStart=/bin/sh -c 'exit 4'
        """)
    res = sim.run("systemctl", "start", "broken")
    assert res.returncode == 1
    assert res.stderr.startswith("Job for broken.service failed")
    show = sim.run("systemctl", "show", "-p", "ActiveState,Result,ExecMainStatus", "broken")
    assert show.stdout == "ActiveState=failed\nResult=exit-code\nExecMainStatus=4\n"
    assert sim.run("systemctl", "reset-failed", "broken").returncode == 0
    assert sim.run("systemctl", "is-active", "broken").stdout == "inactive\n"


def test_systemctl_dead_process_is_failed(sim: ShimHost) -> None:
    sim.unit("crashy.service", """
        [Service]
        ExecStart=/bin/sh -c 'sleep 0.2; exit 3'
        Restart=no
        """)
    assert sim.run("systemctl", "start", "crashy").returncode == 0
    assert wait_until(lambda: sim.run("systemctl", "is-active", "crashy").stdout == "failed\n", 5.0, 0.05)
    res = sim.run("systemctl", "is-active", "crashy")
    assert res.returncode == 3
    show = sim.run("systemctl", "show", "-p", "MainPID,Result,ExecMainStatus", "crashy")
    assert show.stdout == "MainPID=0\nResult=exit-code\nExecMainStatus=3\n"


def test_systemctl_uses_loaded_unit_until_daemon_reload(sim: ShimHost) -> None:
    out = sim.root / "which.log"
    body = """
        [Service]
        Type=oneshot
        ExecStart=/bin/sh -c 'echo {v} >> {out}'
        """
    sim.unit("v.service", body.format(v="one", out=out))
    sim.run("systemctl", "daemon-reload")
    sim.unit("v.service", body.format(v="two", out=out))
    stale = sim.run("systemctl", "start", "v")
    assert "Run 'systemctl daemon-reload'" in stale.stderr
    sim.run("systemctl", "daemon-reload")
    sim.run("systemctl", "start", "v")
    assert out.read_text() == "one\ntwo\n"


def test_systemctl_unknown_unit(sim: ShimHost) -> None:
    res = sim.run("systemctl", "start", "nope")
    assert (res.returncode, res.stderr) == (5, "Failed to start nope.service: "
                                               "Unit nope.service not found.\n")
    res = sim.run("systemctl", "is-active", "nope")
    assert (res.returncode, res.stdout) == (3, "inactive\n")


# --------------------------------------------------------------------------- pure parsers


@pytest.mark.parametrize(("line", "words"), [
    ('/bin/echo "a b" c', ["/bin/echo", "a b", "c"]),
    ("/bin/echo 'a \"b\"' \\\"x", ["/bin/echo", 'a "b"', '"x']),
    ('/bin/echo "tab\\there" \\x41', ["/bin/echo", "tab\there", "A"]),
    ('/bin/echo a""b', ["/bin/echo", "ab"]),
])
def test_split_systemd_words(line: str, words: list[str]) -> None:
    assert procshims.split_systemd_words(line) == words


@pytest.mark.parametrize(("words", "expanded"), [
    (["x", "$ARGS"], ["x", "--a", "1"]),
    (["x", "${ARGS}"], ["x", "--a 1"]),
    (["x", "pre${ONE}post"], ["x", "pre1post"]),
    (["x", "a$ONE"], ["x", "a$ONE"]),
    (["x", "$$ONE"], ["x", "$ONE"]),
    (["x", "$UNSET", "${UNSET}"], ["x", ""]),
])
def test_expand_systemd_argv(words: list[str], expanded: list[str]) -> None:
    env = {"ARGS": "--a 1", "ONE": "1"}
    assert procshims.expand_systemd_argv(words, env) == expanded


def test_parse_systemd_env_file() -> None:
    text = ('# c\n; c2\nA=plain  \nB="dq \\"x\\" \\$y"\nC=\'sq $z\'\nD=a\\\nb\n'
            "E = spaced\nnoequals\n1BAD=x\nF=\n")
    assert procshims.parse_systemd_env_file(text) == [
        ("A", "plain"), ("B", 'dq "x" $y'), ("C", "sq $z"), ("D", "ab"), ("E", "spaced"),
        ("F", ""),
    ]


def test_parse_docker_env_file() -> None:
    text = "\ufeff# c\n  A=1 \nB\nC\nD=x=y\n"
    assert procshims.parse_docker_env_file(text, {"B": "host"}, "f") == [
        ("A", "1 "), ("B", "host"), ("D", "x=y")]


def test_timespan() -> None:
    assert procshims.parse_timespan_s("90") == 90
    assert procshims.parse_timespan_s("1min 30s") == 90
    assert procshims.parse_timespan_s("500ms") == 0.5
