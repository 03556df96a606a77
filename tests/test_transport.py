"""sparkctl.transport: results, the fake, the local runner, and SSH (fabric) against a real sshd on 127.0.0.1."""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fabric
import pytest

from sparkctl.errors import LifecycleError, TransportError
from sparkctl.transport import (
    Call,
    Cancel,
    CommandResult,
    FakeTransport,
    FanOut,
    HostKeyError,
    LocalTransport,
    SSHTransport,
    Transport,
    TransportSettings,
    command_line,
    fetch_host_key,
    fingerprint_sha256,
    known_hosts_name,
    put_command,
    reply,
    trust,
)
from sparkctl.transport.connection import open_tcp

from sshd_fixture import (
    SshdHandle,
    fingerprint_of,
    free_port,
    keygen,
    sshd_available,
    start_sshd,
)

FAST = TransportSettings(connect_timeout_s=1.0, command_timeout_s=10.0, deadline_s=20.0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False


def _wait_dead(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- pure bits


def test_command_line_joins_lists_and_keeps_strings() -> None:
    assert command_line(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert command_line("echo $HOME | wc -c") == "echo $HOME | wc -c"


def test_fingerprint_format_matches_openssh(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k")
    blob = __import__("base64").b64decode((tmp_path / "k.pub").read_text().split()[1])
    assert fingerprint_sha256(blob) == fingerprint_of(key.with_name("k.pub"))


def test_known_hosts_name() -> None:
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_wire_command_is_one_plain_word_list() -> None:
    from sparkctl.transport.base import wire_command as _wire_command

    cmd = "echo $HOME; rm -f '/tmp/x y'"
    assert _wire_command(cmd, sudo=False, timeout_s=0) == "sh -c " + shlex.quote(cmd)
    assert _wire_command(cmd, sudo=True, timeout_s=10) == (
        "sudo -n -- timeout -k 1 10.5 sh -c " + shlex.quote(cmd)
    )
    assert shlex.split(_wire_command(cmd, sudo=True, timeout_s=10))[-1] == cmd


def test_every_transport_fits_the_protocol(tmp_path: Path) -> None:
    ssh = SSHTransport([], ssh_config=tmp_path / "none")
    for t in (FakeTransport({}), LocalTransport(), ssh):
        assert isinstance(t, Transport)
    with pytest.raises(TransportError, match="no node 'x'"):
        ssh.run_all({"x": "true"})


SSH_LIBRARIES = ("fabric", "paramiko", "invoke")


def ssh_library_imports(source: str, filename: str = "<src>") -> list[str]:
    """``line: module`` for every import of fabric/paramiko/invoke in ``source`` (inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        found += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in SSH_LIBRARIES]
    return found


def test_the_import_check_sees_every_form_of_import() -> None:
    src = ("import os\ndef f():\n    from paramiko import SSHClient\n    import fabric.connection as c\n"
           "    importlib.import_module('invoke')\nfrom sparkctl.transport import SSHTransport\n")
    assert ssh_library_imports(src) == ["3: paramiko", "4: fabric.connection", "5: invoke"]


def test_fabric_and_paramiko_are_imported_by_the_transport_package_only() -> None:
    """Every module of sparkctl/ outside sparkctl/transport, walked by its AST."""
    root = Path(__file__).resolve().parent.parent / "sparkctl"
    assert ssh_library_imports((root / "transport" / "connection.py").read_text())  # the package does use them
    offenders, walked = [], 0
    for path in sorted(root.rglob("*.py")):
        if (root / "transport") in path.parents:
            continue
        walked += 1
        offenders += [f"{path.relative_to(root)}:{hit}" for hit in ssh_library_imports(path.read_text(), str(path))]
    assert walked > 30  # the walk really covered the package
    assert offenders == []


def test_a_node_connection_is_fabric_with_the_refusing_policy(tmp_path: Path) -> None:
    from sparkctl.transport.connection import NodeConnection
    from sparkctl.transport.endpoints import Endpoint
    from sparkctl.transport.hostkeys import RejectUnknown

    ep = Endpoint("node a", "127.0.0.1", 2222, "nvidia", ("/k",), True, "spark-a")
    conn = NodeConnection(ep, "a", [tmp_path / "none"], 0.5)
    assert isinstance(conn, fabric.Connection)
    # fabric's Connection() installs an auto-adding policy (fabric/connection.py); ours must replace it
    assert type(conn.client._policy) is RejectUnknown
    assert (conn.host, conn.port, conn.user, conn.gateway) == ("spark-a", 2222, "nvidia", False)
    assert conn.connect_kwargs["timeout"] == 0.5 and conn.connect_kwargs["key_filename"] == ["/k"]
    assert conn.connect_kwargs["allow_agent"] is False and conn.connect_kwargs["look_for_keys"] is False
    jumped = NodeConnection(ep, "a", [], 0.5, gateway=conn)
    assert jumped.gateway is conn


def test_fan_out_is_a_mapping_that_keeps_every_result_and_raises_for_failures() -> None:
    res = FanOut({
        "b": CommandResult("b", "x", 2, "", "first\nlast words\n", 0.1),
        "a": CommandResult("a", "x", 0, "fine\n", "", 0.1),
        "c": CommandResult("c", "x", -1, "", "", 1.0, "unreachable: connection refused by c:22"),
    })
    assert list(res) == ["b", "a", "c"] and len(res) == 3 and res["a"].stdout == "fine\n"
    assert dict(res) == res.results and res == dict(res)
    assert not res.ok and list(res.failed) == ["b", "c"] and list(res.succeeded) == ["a"]
    with pytest.raises(LifecycleError) as info:
        res.raise_for("starting the engine")
    err = info.value
    assert err.message == "starting the engine failed on b, c: last words"
    assert err.ref is not None and err.ref.node == "b" and err.exit_code == 5
    with pytest.raises(TransportError, match="failed on b, c"):
        res.raise_for("reading the boot id", TransportError)
    good = FanOut({"a": res["a"]})
    assert good.ok and good.raise_for("anything") is good
    assert FanOut().ok and FanOut() == {}
    only_exit = FanOut({"a": CommandResult("a", "x", 7, "", "", 0.1)})
    with pytest.raises(LifecycleError, match="x failed on a: exit 7"):
        only_exit.raise_for("x")


def test_result_ok_and_describe() -> None:
    good = CommandResult("a", "true", 0, "", "", 0.1)
    bad = CommandResult("a", "false", 1, "", "boom\n", 0.1)
    gone = CommandResult("a", "true", -1, "", "", 1.0, "unreachable: connection refused by x:22")
    assert good.ok and not bad.ok and not gone.ok
    assert bad.describe() == "node a: 'false' exited 1: boom"
    assert "unreachable" in gone.describe()


# --------------------------------------------------------------------------- fake


def test_fake_refuses_unscripted_commands_and_names_them() -> None:
    fake = FakeTransport({("a", "uname -r"): reply("6.8.0\n")})
    assert fake.run("a", "uname -r").stdout == "6.8.0\n"
    with pytest.raises(AssertionError, match=r"unscripted command on node 'a': 'rm -rf /'"):
        fake.run("a", "rm -rf /")
    with pytest.raises(AssertionError, match="node 'b'"):
        fake.run("b", "uname -r")
    assert fake.commands() == ["uname -r", "rm -rf /", "uname -r"]


def test_fake_regex_wildcard_callable_and_lists() -> None:
    seen: list[Call] = []

    def answer(call: Call) -> CommandResult:
        seen.append(call)
        return reply(f"{call.node}:{(call.stdin or b'').decode()}")

    fake = FakeTransport({
        ("*", re.compile(r"cat /sys/class/net/\S+/mtu")): reply("9000\n"),
        ("b", "hostname"): answer,
        ("*", "ip -j link"): reply(error="unreachable: test", exit_code=0),
    })
    assert fake.run("a", ["cat", "/sys/class/net/enp1s0f0np0/mtu"]).stdout == "9000\n"
    r = fake.run("b", "hostname", stdin="x", sudo=True)
    assert (r.node, r.command, r.stdout) == ("b", "hostname", "b:x")
    assert seen[0].sudo is True and seen[0].stdin == b"x"
    gone = fake.run("c", "ip -j link")
    assert gone.exit_code == -1 and gone.error and not gone.ok
    assert isinstance(fake, Transport)


def test_a_responder_that_returns_none_gives_way_to_the_refusal() -> None:
    fake = FakeTransport({("*", re.compile(".*")): lambda call: reply("ok") if call.command == "known" else None})
    assert fake.run("a", "known").stdout == "ok"
    with pytest.raises(AssertionError, match="unscripted command on node 'a': 'other'"):
        fake.run("a", "other")
    with pytest.raises(AssertionError, match="unscripted"):
        fake.run_all({"a": "known", "b": "other"})
    fake = FakeTransport({("*", re.compile(".*")): lambda call: None}, accept_puts=True)
    assert fake.put("a", "/etc/x", b"x", 0o600).ok  # accepted puts stay accepted


def test_fake_puts_are_refused_unless_scripted_or_accepted() -> None:
    fake = FakeTransport({})
    with pytest.raises(AssertionError, match="put /etc/x.conf"):
        fake.put("a", "/etc/x.conf", b"secret", 0o600)
    fake = FakeTransport({}, accept_puts=True)
    assert fake.put("a", "/etc/x.conf", b"secret", 0o600, sudo=True).ok
    assert fake.files[("a", "/etc/x.conf")] == (b"secret", 0o600)
    assert fake.calls[-1] == Call("a", "put /etc/x.conf", True, TransportSettings().command_timeout_s, b"secret")


def test_fake_run_all_uses_the_same_fan_out() -> None:
    def slow(call: Call) -> CommandResult:
        time.sleep(8)
        return reply("late")

    fake = FakeTransport({("a", "x"): reply("ok"), ("b", "x"): slow, ("c", "x"): reply("no", exit_code=2)})
    t0 = time.monotonic()
    res = fake.run_all({"a": "x", "b": "x", "c": "x"}, deadline_s=0.3)
    assert time.monotonic() - t0 < 5  # the deadline ended the step, not the 8 s straggler
    assert isinstance(res, FanOut) and list(res.failed) == ["b", "c"]
    assert res["a"].ok and res["c"].exit_code == 2
    assert res["b"].error and res["b"].error.startswith("deadline")


def test_fake_run_all_surfaces_unscripted_commands() -> None:
    fake = FakeTransport({("a", "x"): reply("ok")})
    with pytest.raises(AssertionError, match="'y'"):
        fake.run_all({"a": "x", "b": "y"})


# --------------------------------------------------------------------------- local


def test_local_runs_with_sh_and_keeps_streams_apart() -> None:
    t = LocalTransport()
    r = t.run("local", "echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.error) == (3, "out\n", "err\n", None)
    assert t.run("local", ["printf", "%s|", "a b", "$(touch canary)", "'"]).stdout == "a b|$(touch canary)|'|"
    assert t.run("local", "cat", stdin="hello").stdout == "hello"
    assert t.run("local", "cat").stdout == ""  # stdin is closed: no hang


def test_local_timeout_kills_the_command_tree(tmp_path: Path) -> None:
    t = LocalTransport()
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    r = t.run("local", f"sh -c 'echo $$ > {pidfile}; exec sleep 30' & wait", timeout_s=0.5)
    took = time.monotonic() - t0
    assert took < 15, took  # the timeout ended it, not the 30 s sleep (no tighter bound: a shared machine)
    assert r.exit_code == -1 and r.error and r.error.startswith("timeout:") and "0.5 s" in r.error
    assert _wait_dead(int(pidfile.read_text()), 2.0)


def test_local_run_all_keeps_other_results_when_one_fails() -> None:
    t = LocalTransport(nodes=("a", "b", "c"))
    t0 = time.monotonic()
    res = t.run_all({"a": "echo A", "b": "echo B >&2; exit 7", "c": "sleep 30"}, timeout_s=0.5)
    assert time.monotonic() - t0 < 15
    assert res["a"].ok and res["a"].stdout == "A\n"
    assert (res["b"].exit_code, res["b"].stderr) == (7, "B\n")
    assert res["c"].error and res["c"].error.startswith("timeout")


def test_local_run_all_deadline_reports_stragglers_and_cancels_them(tmp_path: Path) -> None:
    t = LocalTransport(nodes=("a", "b"), settings=TransportSettings(command_timeout_s=30, deadline_s=0.5))
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    res = t.run_all({"a": "echo fast", "b": f"echo $$ > {pidfile}; exec sleep 30"})
    assert time.monotonic() - t0 < 15
    assert res["a"].ok and res["a"].stdout == "fast\n"
    assert res["b"].exit_code == -1 and res["b"].error and res["b"].error.startswith("deadline")
    assert _wait_dead(int(pidfile.read_text()), 2.0)


def _ctrl_c_after(seconds: float) -> threading.Timer:
    """SIGINT to the main thread (where Ctrl-C's KeyboardInterrupt is raised) after ``seconds``."""
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_in_a_fan_out_sends_nothing_more_and_lets_what_was_sent_end(tmp_path: Path) -> None:
    """Ctrl-C while a fan-out waits: the command node a already runs goes on to its end before
    KeyboardInterrupt leaves the fan-out, and node b, whose connection was still opening, never
    sends its command. Before, the fan-out cut its commands at once and returned: a command on an
    SSH host runs on when its channel closes, so the run's Ctrl-C branch (a stop on the same node)
    ran beside a start that landed after it, and an engine was left running."""

    class SlowToSend(LocalTransport):
        def _run(self, node: str, cmd: str, *, cancel: Cancel | None, **kw: Any) -> CommandResult:
            if node == "b":  # b's session opens only after the Ctrl-C
                end = time.monotonic() + 10
                while cancel is not None and not cancel.held() and time.monotonic() < end:
                    time.sleep(0.01)
            return super()._run(node, cmd, cancel=cancel, **kw)

    t = SlowToSend(nodes=("a", "b"), settings=TransportSettings(command_timeout_s=30, deadline_s=30))
    a, b = tmp_path / "a-ended", tmp_path / "b-ran"
    timer = _ctrl_c_after(0.3)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        t.run_all({"a": f"sleep 1.5; touch {a}", "b": f"touch {b}"})
    took = time.monotonic() - t0
    timer.join()
    assert a.exists(), "the command already sent was cut, not waited for"
    assert took >= 1.4, took
    assert not b.exists(), "a command not yet sent was sent after Ctrl-C"


def test_a_second_ctrl_c_cuts_the_commands_a_fan_out_waits_for(tmp_path: Path) -> None:
    t = LocalTransport(nodes=("a",), settings=TransportSettings(command_timeout_s=60, deadline_s=60))
    pidfile = tmp_path / "pid"
    timers = [_ctrl_c_after(0.5), _ctrl_c_after(1.0)]
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        t.run_all({"a": f"echo $$ > {pidfile}; exec sleep 30"})
    assert time.monotonic() - t0 < 15
    for timer in timers:
        timer.cancel()  # a fan-out that gave up at the first Ctrl-C must not leave a SIGINT for pytest
        timer.join()
    assert _wait_dead(int(pidfile.read_text()), 3.0), "the second Ctrl-C did not cut the command"


def test_local_unknown_node_is_an_error() -> None:
    with pytest.raises(TransportError, match="no node 'x'"):
        LocalTransport().run("x", "true")


def test_local_sudo_password_needed_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sudo = tmp_path / "bin" / "sudo"
    fake_sudo.parent.mkdir()
    fake_sudo.write_text("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    fake_sudo.chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    t = LocalTransport(env={**os.environ, "PATH": f"{fake_sudo.parent}:{os.environ['PATH']}"})
    r = t.run("local", "systemctl restart x", sudo=True)
    assert r.exit_code == -1 and r.error and "sudo needs a password on local" in r.error
    assert t.run("local", "echo plain").stdout == "plain\n"  # no sudo asked, none used


def test_local_put_is_atomic_and_safe_with_hostile_paths(tmp_path: Path) -> None:
    t = LocalTransport()
    target = tmp_path / "a dir" / "$(touch canary)" / "conf; rm -rf x'\".env"
    data = b"TOKEN=$(touch canary2)\n'\"\\\n" + bytes(range(256))
    r = t.put("local", str(target), data, 0o640)
    assert r.ok, r
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not list(tmp_path.rglob("canary*")) and not Path("canary").exists()
    assert os.listdir(target.parent) == [target.name]  # no temp file left behind
    # overwrite in place: new content and mode, still no leftovers
    assert t.put("local", str(target), b"v2", 0o600).ok
    assert target.read_bytes() == b"v2" and stat.S_IMODE(target.stat().st_mode) == 0o600
    # a failed put leaves the old file intact
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("old")
    bad = t.put("local", str(tmp_path / "ro" / "f" / "sub"), b"new", 0o644)
    assert not bad.ok and (tmp_path / "ro" / "f").read_text() == "old"


def test_put_all_writes_a_nodes_files_in_one_session_each_with_its_own_bytes(tmp_path: Path) -> None:
    """One command per node carries every file; each takes exactly its own bytes (empty ones too)."""
    t = LocalTransport()
    sent: list[str] = []
    inner = t._run

    def run(node: str, cmd: str, **kw: Any) -> Any:
        sent.append(cmd)
        return inner(node, cmd, **kw)

    t._run = run  # type: ignore[method-assign]
    files = [(str(tmp_path / "etc" / "a.env"), b"K=1\n" * 5000, 0o600), (str(tmp_path / "empty"), b"", 0o644),
             (str(tmp_path / "b c" / "$(touch canary)"), bytes(range(256)), 0o755)]
    res = t.put_all({"local": files})
    assert res["local"].ok and res["local"].command == "put 3 files", res["local"]
    assert len(sent) == 1
    for path, data, mode in files:
        assert Path(path).read_bytes() == data and stat.S_IMODE(Path(path).stat().st_mode) == mode
    assert not list(tmp_path.rglob(".sparkctl-put.*")) and not list(tmp_path.rglob("canary"))


def test_a_put_whose_bytes_arrive_short_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A stream cut mid-file (the connection dropped): cat would install what came; the put refuses."""
    target = tmp_path / "engine.env"
    target.write_bytes(b"old\n")
    cmd = shlex.join(put_command([(str(target), 0o600, 100)]))
    r = LocalTransport().run("local", cmd, stdin=b"only forty bytes of the hundred promised.")
    assert not r.ok and "41 of 100 bytes arrived" in r.stderr and f"stopped at {target}" in r.stderr, r
    assert target.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["engine.env"]


def test_put_all_stops_a_node_at_its_first_failed_file_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file, not a directory")
    first, blocked, last = tmp_path / "one", tmp_path / "f" / "two", tmp_path / "three"
    res = LocalTransport().put_all({"local": [(str(first), b"1", 0o644), (str(blocked), b"2", 0o644),
                                              (str(last), b"3", 0o644)]})
    r = res["local"]
    assert not r.ok and f"sparkctl-put: stopped at {blocked}" in r.stderr, r
    assert first.read_bytes() == b"1" and not last.exists()
    assert sorted(os.listdir(tmp_path)) == ["f", "one"]


def test_put_refuses_directories_and_newlines() -> None:
    with pytest.raises(ValueError):
        LocalTransport().put("local", "/tmp/dir/", b"", 0o644)
    with pytest.raises(ValueError):
        LocalTransport().put("local", "/tmp/a\nb", b"", 0o644)


# --------------------------------------------------------------------------- ssh (real sshd)

needs_sshd = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd/ssh-keygen not installed")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdHandle]:
    if not sshd_available():
        pytest.skip("OpenSSH sshd/ssh-keygen not installed")
    handle = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield handle
    handle.stop()


@pytest.fixture
def no_ssh_config(tmp_path: Path) -> Path:
    return tmp_path / "no-ssh-config"  # keeps the developer's ~/.ssh/config out of the tests


@pytest.mark.e2e
@needs_sshd
def test_unknown_host_key_names_the_exact_fingerprint(sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path) -> None:
    node = sshd.node("spark-a", known_hosts=str(tmp_path / "empty_known_hosts"))
    expected = fingerprint_of(sshd.hostkey_pub)
    with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t:
        with pytest.raises(HostKeyError) as info:
            t.run("spark-a", "true")
        assert t.connections_opened == {}
    err = info.value
    assert isinstance(err, TransportError) and not err.changed
    assert err.fingerprint == expected and expected in err.message
    assert "spark-a" in err.one_line()
    assert err.hint and err.hint.startswith("run `sparkctl trust spark-a` after checking the fingerprint")
    assert not (tmp_path / "empty_known_hosts").exists()  # never auto-added
    assert fetch_host_key(node, FAST, ssh_config=no_ssh_config) == (
        "ssh-ed25519", expected, sshd.hostkey_pub.read_text().split()[1]
    )
    # what sparkctl vouches for to another node comes from a verified session only
    with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t:
        with pytest.raises(HostKeyError):
            t.verified_host_key("spark-a")


def test_open_tcp_turns_nagle_off() -> None:
    """Every SSH connection goes out with TCP_NODELAY: with Nagle on, each channel open waited
    for the node's delayed ACK (about 40 ms a command)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        sock = open_tcp("127.0.0.1", server.getsockname()[1], 5.0)
        with sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.e2e
@needs_sshd
def test_verified_host_key_is_the_key_the_session_checked(
    sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path
) -> None:
    kh = tmp_path / "known_hosts"
    node = sshd.node("spark-a", known_hosts=str(kh))
    trust(node, kh, expected_fingerprint=sshd.fingerprint, settings=FAST, ssh_config=no_ssh_config)
    with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t:
        assert t.verified_host_key("spark-a") == ("ssh-ed25519", sshd.fingerprint,
                                                  sshd.hostkey_pub.read_text().split()[1])
        assert t.run("spark-a", "true").ok and t.connections_opened == {"spark-a": 1}  # the same session


@pytest.mark.e2e
@needs_sshd
def test_trust_then_one_connection_serves_many_commands(
    sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path
) -> None:
    kh = tmp_path / "fresh" / ".ssh" / "known_hosts"
    node = sshd.node("spark-a", known_hosts=str(kh))
    with pytest.raises(TransportError, match="not the checked"):
        trust(node, kh, expected_fingerprint="SHA256:not-it", settings=FAST, ssh_config=no_ssh_config)
    assert not kh.exists()
    ktype, fp, b64 = trust(node, kh, expected_fingerprint=sshd.fingerprint, settings=FAST, ssh_config=no_ssh_config)
    assert kh.read_text() == f"[{sshd.host}]:{sshd.port} {ktype} {b64}\n"
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600 and stat.S_IMODE(kh.parent.stat().st_mode) == 0o700
    assert trust(node, kh, settings=FAST, ssh_config=no_ssh_config) == (ktype, fp, b64)  # idempotent
    assert kh.read_text().count("\n") == 1
    # OpenSSH itself accepts the line we wrote
    check = subprocess.run(["ssh-keygen", "-F", f"[{sshd.host}]:{sshd.port}", "-f", str(kh)], capture_output=True)
    assert check.returncode == 0

    logins_before = sshd.log().count("Accepted publickey")
    with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t:
        results = [t.run("spark-a", ["echo", f"n{i}", "$HOME"]) for i in range(20)]
        assert [r.stdout for r in results] == [f"n{i} $HOME\n" for i in range(20)]
        assert all(r.ok for r in results)
        assert t.connections_opened == {"spark-a": 1}
        # parallel use of the one connection is safe too
        threads = [threading.Thread(target=lambda: results.append(t.run("spark-a", "echo par"))) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(r.ok for r in results[20:]) and len(results) == 28
        assert t.connections_opened == {"spark-a": 1}
    # sshd's own count: 28 commands, one login (one fabric Connection)
    assert sshd.log().count("Accepted publickey") - logins_before == 1


@pytest.mark.e2e
@needs_sshd
def test_changed_host_key_is_a_loud_error(sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{sshd.host}]:{sshd.port} {' '.join(other.with_name('other_host_key.pub').read_text().split()[:2])}\n")
    node = sshd.node("spark-b", known_hosts=str(kh))
    with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t, pytest.raises(HostKeyError) as info:
        t.run("spark-b", "true")
    err = info.value
    assert err.changed and err.fingerprint == sshd.fingerprint
    assert err.expected_fingerprint == fingerprint_of(other.with_name("other_host_key.pub"))
    assert "HOST KEY CHANGED" in err.message and "man-in-the-middle" in err.message
    with pytest.raises(TransportError, match="already records a different"):
        trust(node, kh, settings=FAST, ssh_config=no_ssh_config)
    # in a fan-out the error is a value that keeps its text, and does not hide the others
    good = sshd.node("spark-a")
    with SSHTransport([node, good], FAST, ssh_config=no_ssh_config) as t:
        res = t.run_all({"spark-a": "echo fine", "spark-b": "echo no"})
    assert res["spark-a"].stdout == "fine\n"
    assert res["spark-b"].error and res["spark-b"].error.startswith("hostkey:")
    assert sshd.fingerprint in res["spark-b"].error


@pytest.mark.e2e
@needs_sshd
def test_ssh_streams_stdin_exit_codes_and_big_output(sshd: SshdHandle, no_ssh_config: Path) -> None:
    with SSHTransport([sshd.node("a")], FAST, ssh_config=no_ssh_config) as t:
        r = t.run("a", "cat; echo err >&2; exit 3", stdin="hello\n")
        assert (r.exit_code, r.stdout, r.stderr, r.error) == (3, "hello\n", "err\n", None)
        big = t.run("a", "head -c 3000000 /dev/zero | tr '\\0' o; head -c 2500000 /dev/zero | tr '\\0' e >&2")
        assert big.ok and len(big.stdout) == 3_000_000 and len(big.stderr) == 2_500_000
        # sh -c semantics, not the login shell's
        assert t.run("a", "echo $0").stdout == "sh\n"
        # a background child holding stdout does not turn success into a timeout
        t0 = time.monotonic()
        bg = t.run("a", "sleep 30 & echo started")
        assert bg.ok and bg.stdout == "started\n" and time.monotonic() - t0 < 15


@pytest.mark.e2e
@needs_sshd
def test_ssh_command_timeout_kills_the_remote_command(sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path) -> None:
    pidfile = tmp_path / "remote.pid"
    with SSHTransport([sshd.node("a")], FAST, ssh_config=no_ssh_config) as t:
        t.run("a", "true")  # connect first: measure the command timeout alone
        t0 = time.monotonic()
        r = t.run("a", f"echo $$ > {pidfile}; exec sleep 30", timeout_s=0.5)
        took = time.monotonic() - t0
        assert took < 15, took  # the 0.5 s timeout, not the 30 s sleep
        assert r.exit_code == -1 and r.error == "timeout: command did not finish within 0.5 s (killed)"
        assert _wait_dead(int(pidfile.read_text()), 3.0), "remote command survived its timeout"
        assert t.run("a", "echo still-usable").stdout == "still-usable\n"
        assert t.connections_opened == {"a": 1}


@pytest.mark.e2e
@needs_sshd
def test_ssh_put_is_atomic_sets_mode_and_resists_hostile_input(
    sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path
) -> None:
    target = tmp_path / "with space" / "$(touch canary)" / "x`touch canary3`; y'\"z.conf"
    data = b"API_KEY=$(touch canary2) `id`\n" + bytes(range(256)) * 100
    with SSHTransport([sshd.node("a")], FAST, ssh_config=no_ssh_config) as t:
        r = t.put("a", str(target), data, 0o640, sudo=True)  # sudo is skipped for root logins
        assert r.ok, r
        assert r.command == f"put {target}"
        assert target.read_bytes() == data and stat.S_IMODE(target.stat().st_mode) == 0o640
        assert os.listdir(target.parent) == [target.name]
        assert not list(tmp_path.rglob("canary*")) and not Path.home().joinpath("canary").exists()
        assert t.put("a", str(target), b"two", 0o600).ok
        assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.e2e
@needs_sshd
def test_run_all_with_one_node_down(tmp_path: Path, no_ssh_config: Path) -> None:
    up = start_sshd(tmp_path / "up")
    down = start_sshd(tmp_path / "down")
    down.stop()
    try:
        nodes = [up.node("up"), down.node("down")]
        with SSHTransport(nodes, FAST, ssh_config=no_ssh_config) as t:
            t0 = time.monotonic()
            res = t.run_all({"up": ["echo", "alive"], "down": ["echo", "alive"]})
            assert time.monotonic() - t0 < 15  # the refused node did not hold the others up
        assert res["up"].ok and res["up"].stdout == "alive\n"
        assert res["down"].exit_code == -1 and res["down"].error
        assert res["down"].error.startswith("unreachable: connection refused by 127.0.0.1:")
    finally:
        up.stop()


@pytest.mark.e2e
def test_silent_server_times_out_within_the_connect_timeout(tmp_path: Path, no_ssh_config: Path) -> None:
    """A port that accepts TCP but never sends an SSH banner (a hung sshd, a wrong service)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    from sparkctl.model.inventory import Node
    from sparkctl.model.schema import default_ports

    node = Node(
        name="mute", index=0, host="127.0.0.1", ssh_user="nvidia", ssh_port=listener.getsockname()[1],
        ssh_identity=None, sudo=True, known_hosts=str(tmp_path / "kh"), prefix="/", sysfs_root="/sys",
        proc_root="/proc", mgmt_iface="enP7s7", ports=default_ports(),
    )
    try:
        with SSHTransport([node], FAST, ssh_config=no_ssh_config) as t:
            t0 = time.monotonic()
            r = t.run("mute", "true")
            took = time.monotonic() - t0
        assert took < 15, took  # the connect timeout fired; a mute server does not hang us
        assert r.exit_code == -1 and r.error and r.error.startswith("timeout:"), r
        assert "did not speak SSH within 1 s" in r.error
    finally:
        stop.set()
        th.join()
        listener.close()
        for s in accepted:
            s.close()


@pytest.mark.e2e
@needs_sshd
def test_wrong_key_is_an_auth_error(sshd: SshdHandle, tmp_path: Path, no_ssh_config: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    with SSHTransport([sshd.node("a", ssh_identity=str(stranger))], FAST, ssh_config=no_ssh_config) as t:
        r = t.run("a", "true")
    assert r.exit_code == -1 and r.error and r.error.startswith(f"auth: {sshd.user}@127.0.0.1:{sshd.port}")
    assert str(stranger) in r.error


@pytest.mark.e2e
@needs_sshd
def test_ssh_config_hostname_identity_and_proxyjump(sshd: SshdHandle, tmp_path: Path) -> None:
    """HostName/IdentityFile/ProxyJump come from ssh_config; the inventory's identity wins over it."""
    target = start_sshd(tmp_path / "target")
    try:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(
            "Host jumpbox\n"
            f"  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.key_path}\n"
            "Host spark-behind\n"
            f"  HostName {target.host}\n  ProxyJump jumpbox\n  IdentityFile {tmp_path}/does-not-exist\n"
        )
        kh = tmp_path / "kh"
        kh.write_text(sshd.known_hosts.read_text() + target.known_hosts.read_text())
        node = target.node("behind", host="spark-behind", known_hosts=str(kh))
        with SSHTransport([node], FAST, ssh_config=cfg) as t:
            assert t.run("behind", "echo via-jump").stdout == "via-jump\n"
            assert t.run("behind", "echo again").ok
            assert t.connections_opened == {"behind": 1}
            assert sum(t.jumps_opened.values()) == 1
        # the jump really carries the traffic: with the jump host gone, the node is unreachable
        closed = free_port()
        cfg.write_text(cfg.read_text().replace(f"Port {sshd.port}", f"Port {closed}"))
        with SSHTransport([node], FAST, ssh_config=cfg) as t:
            r = t.run("behind", "true")
        assert r.exit_code == -1 and r.error, r
        assert r.error.startswith(
            f"unreachable: jump host jumpbox (for node behind): connection refused by 127.0.0.1:{closed}"
        )
    finally:
        target.stop()


@pytest.mark.e2e
@needs_sshd
def test_reconnects_when_the_cached_connection_died(tmp_path: Path, no_ssh_config: Path) -> None:
    h = start_sshd(tmp_path / "flaky")
    try:
        with SSHTransport([h.node("a")], FAST, ssh_config=no_ssh_config) as t:
            assert t.run("a", "true").ok
            h.kill_sessions()
            h.start()
            time.sleep(0.1)
            r = t.run("a", "echo back")
            assert r.stdout == "back\n", r
            assert t.connections_opened == {"a": 2}
    finally:
        h.stop()


def test_the_fake_nodes_of_the_sweeps_refuse_what_sparkctl_does_not_send() -> None:
    from sparkctl.model.inventory import load_inventory

    from fakenodes import fake_for

    inv = load_inventory(Path(__file__).resolve().parent / "fixtures" / "inv-single.yaml")
    t = fake_for(inv)
    assert t.run("spark-a", "cat /proc/meminfo").ok
    with pytest.raises(AssertionError, match="unscripted command on node 'spark-a': 'curl http://evil'"):
        t.run("spark-a", "curl http://evil")
    assert t.put("spark-a", "/etc/sparkctl/x.env", b"K=v", 0o600).ok  # puts land in the fake's files
    assert t.files[("spark-a", "/etc/sparkctl/x.env")] == (b"K=v", 0o600)
