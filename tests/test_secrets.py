"""Secrets, host keys and sudo.

* The only secret-bearing values are the ``engine.secret_env`` variables (HF_TOKEN,
  VLLM_API_KEY, ...): read from the operator's environment, written only into the
  0600 env file, never printed. A credential put where it would be printed (a
  secret-looking name in ``engine.env``, ``--api-key`` in ``engine.args``) is refused.
* The secret never appears in ``plan``, ``render``, ``show``, ``explain``,
  ``status --json``, progress lines, logs, commands, the run record, error and
  exception text, or benchmark rows; the one file holding it is mode 0600 from its
  first byte on (the put writes a mktemp file, 0600, then renames).
* Host keys: an unknown or changed key is refused (tests/test_transport.py:
  test_unknown_host_key_names_the_exact_fingerprint, test_changed_host_key_is_a_loud_error);
  here the policy object, the absence of any auto-adding policy, and the
  supervisor's own ssh options.
* sudo is asked for exactly the commands that change root-owned state (SUDO_KINDS).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import paramiko
import pytest

from sparkctl.bench.cluster_hooks import config_from_profile
from sparkctl.bench.results import CSV_COLUMNS, csv_text
from sparkctl.errors import ProfileError, RenderError, SparkctlError
from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops import executor, readiness, supervise, weights
from sparkctl.ops.check import run_check
from sparkctl.ops.lock import read_records_command
from sparkctl.ops.status import cluster_status
from sparkctl.plan import planner
from sparkctl.plan.render import MASK, render
from sparkctl.plan.steps import FileRef
from sparkctl.transport import Call, LocalTransport, reply

from fakenodes import fake_for

SECRET = "hf_S3CRETvalue_0123456789abcdef"
API_KEY = "sk-APIKEYvalue-9876543210"
SECRETS = {"HF_TOKEN": SECRET, "VLLM_API_KEY": API_KEY}


def _root(tmp_path: Path, body: str = "") -> Path:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "profiles" / "sec.yaml").write_text(
        "extends: vllm-tp2-fallback\nengine:\n  secret_env: [HF_TOKEN, VLLM_API_KEY]\n  env: {GREETING: hi}\n" + body)
    return root


def _inv(tmp_path: Path) -> Any:
    nodes = "".join(f"  - {{name: spark-{x}, host: 192.168.1.10{i}, prefix: {tmp_path / 'nodes' / x}}}\n"
                    for i, x in enumerate("ab"))
    return loads_inventory(f"nodes:\n{nodes}cables:\n  - [spark-a:p0, spark-b:p0]\n", str(tmp_path / "inv.yaml"))


def _no_secret(text: str, where: str) -> None:
    assert SECRET not in text and API_KEY not in text, f"a secret appears in {where}"


# --------------------------------------------------------------------------- refused where it would be printed

@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_APIKEY",
                                  "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_AUTH", "X_CREDENTIALS"])
def test_a_credential_in_engine_env_is_refused_with_file_line_key(tmp_path: Path, name: str) -> None:
    root = _root(tmp_path, "")
    (root / "profiles" / "leak.yaml").write_text(f"extends: tiny-llamacpp\nengine:\n  env:\n    {name}: {SECRET}\n")
    with pytest.raises(ProfileError) as exc:
        resolve("leak", Roots.make(root=str(root), env={}))
    line = exc.value.one_line()
    assert f"leak.yaml:4: engine.env.{name}" in line and "secret_env" in line
    _no_secret(line, "the refusal")


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS", "NCCL_IB_HCA", "KEYBOARD", "MONKEY"])
def test_ordinary_names_are_not_mistaken_for_credentials(tmp_path: Path, name: str) -> None:
    root = _root(tmp_path)
    (root / "profiles" / "ok.yaml").write_text(f"extends: tiny-llamacpp\nengine:\n  env:\n    {name}: '1'\n")
    assert resolve("ok", Roots.make(root=str(root), env={})).profile.engine.env == {name: "1"}


@pytest.mark.parametrize("args", [["--api-key", SECRET], [f"--api-key={SECRET}"], ["--hf-token", SECRET]])
def test_a_credential_on_the_engine_command_line_is_refused(tmp_path: Path, args: list[str]) -> None:
    root = _root(tmp_path)
    (root / "profiles" / "leak.yaml").write_text("extends: tiny-llamacpp\nengine:\n  args: " + json.dumps(args) + "\n")
    with pytest.raises(ProfileError) as exc:
        resolve("leak", Roots.make(root=str(root), env={}))
    assert "leak.yaml:3: engine.args" in exc.value.one_line() and "secret_env" in exc.value.one_line()
    _no_secret(exc.value.one_line(), "the refusal")


def test_set_cannot_smuggle_a_credential_into_the_record(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as exc:
        resolve("tiny-llamacpp", Roots.make(env={}), [f"engine.env.HF_TOKEN={SECRET}"])
    assert "--set engine.env" in exc.value.one_line()
    _no_secret(exc.value.one_line(), "the refusal")


def test_a_bad_secret_value_is_refused_without_echoing_it(tmp_path: Path) -> None:
    roots = Roots.make(root=str(_root(tmp_path)), env={})
    with pytest.raises(RenderError) as exc:
        render(resolve("sec", roots), _inv(tmp_path), roots, {"HF_TOKEN": SECRET + "\nX=1", "VLLM_API_KEY": API_KEY})
    assert exc.value.ref is not None and exc.value.ref.key == "HF_TOKEN"
    _no_secret(exc.value.one_line() + str(exc.value), "the refusal")


# --------------------------------------------------------------------------- never printed

def test_cli_outputs_never_show_a_secret(tmp_path: Path, sparkctl, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(tmp_path)
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: spark-a, host: 192.168.1.101}\n  - {name: spark-b, host: 192.168.1.102}\n"
                   "cables:\n  - [spark-a:p0, spark-b:p0]\n")
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    base = ("--root", str(root), "-i", str(inv))
    for cmd in (["plan", "up", "sec", "--assume-fresh"], ["plan", "up", "sec", "--assume-fresh", "--json"],
                ["render", "sec"], ["render", "sec", "--json"],
                ["render", "sec", "--node", "spark-b"], ["show", "sec"], ["show", "sec", "--json"],
                ["show", "sec", "--node", "spark-a"], ["explain", "sec", "engine.secret_env"],
                ["explain", "sec", "engine", "--json"], ["profiles"]):
        r = sparkctl(*base, *cmd)
        assert r.code == 0, (cmd, r.err)
        _no_secret(r.out + r.err, " ".join(cmd))
    r = sparkctl(*base, "render", "sec")
    assert f"HF_TOKEN='{MASK}'" in r.out  # masked, and the mask is there to see
    out = tmp_path / "out"
    assert sparkctl(*base, "render", "sec", "--out", str(out)).code == 0
    for p in out.rglob("*"):
        if p.is_file():
            _no_secret(p.read_text(), str(p))




def _operations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fail_start: bool = False
                ) -> tuple[list[Call], dict[tuple[str, str], tuple[bytes, int]], list[str]]:
    """up, check --fix, status, down, switch --supervise, weights: every call, every file, every message."""
    roots = Roots.make(root=str(_root(tmp_path)), env={})
    res, inv = resolve("sec", roots), _inv(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    serving = lambda *a, **k: (True, "serving")  # noqa: E731
    monkeypatch.setattr(readiness, "probe_endpoint", serving)
    monkeypatch.setattr(executor, "probe_endpoint", serving)  # the operator's plan backend imports its own name
    said: list[str] = []

    def progress(*parts: Any) -> None:
        said.append(" ".join(str(p) for p in parts))

    calls: list[Call] = []
    files: dict[tuple[str, str], tuple[bytes, int]] = {}
    t = fake_for(inv)
    if fail_start:
        t.add("*", "systemctl start sparkctl-engine", reply(stderr="unit failed: see the engine log", exit_code=1))
    try:
        executor.up(res, inv, t, roots, secrets=SECRETS, skip_check=True, progress=progress)
    except SparkctlError as exc:
        said += [exc.one_line(), str(exc), repr(exc)]
    calls += t.calls
    files.update(t.files)
    record = files[("spark-a", str(tmp_path / "nodes/a/var/lib/sparkctl/record.json"))][0].decode()
    for op in (lambda t: run_check(res, inv, t, fix=True, bandwidth_s=0, progress=said.append,  # noqa: B023
                                   fix_runner=executor.plan_runner(inv, t, said.append)),
               lambda t: said.append(json.dumps(cluster_status(inv, t))),  # noqa: B023
               lambda t: executor.down(inv, t, reset_clocks=True, progress=progress),
               lambda t: supervise.switch_supervised(res, inv, t, roots, secrets=SECRETS, skip_check=True,
                                                     progress=progress),
               lambda t: weights.sync(inv, t, res.profile.model.weights_path, "spark-a", poll_s=0)):
        t = fake_for(inv)
        t.add("*", re.compile(r"cat .*record\.json.*"), reply(record))
        t.add("*", read_records_command(inv), reply(f"\n==> sparkctl-record /x/record.json\n{record}"))
        try:
            op(t)
        except SparkctlError as exc:
            said += [exc.one_line(), str(exc)]
        calls += t.calls
        files.update(t.files)
    return calls, files, said


def test_operations_keep_the_secret_in_the_0600_env_file_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    calls, files, said = _operations(tmp_path, monkeypatch)
    for c in calls:
        _no_secret(c.command, f"the command {c.command[:80]!r}")
    holders = {(n, p): mode for (n, p), (data, mode) in files.items() if SECRET.encode() in data}
    assert holders, "the secret never reached a node"
    for (n, p), mode in holders.items():
        assert mode == 0o600, f"{n}:{p} holds the secret with mode {mode:o}"
        assert p.endswith("/etc/sparkctl/engine.env"), p
    # switch --supervise hands the env file to the head inside the 0600 plan file (base64, never in clear)
    plan = [(p, m) for (n, p), (d, m) in files.items() if p.endswith("supervisor-plan.json")]
    assert plan and all(m == 0o600 for _, m in plan), plan
    for (n, p), (data, _mode) in files.items():
        if p.endswith(("record.json", "planrun.py", "endpoint_probe.py", "putfiles.py", "manifest.json", "launch.sh")):
            _no_secret(data.decode(), p)
    _no_secret("\n".join(said), "progress, status or errors")
    _no_secret(caplog.text, "the log")
    for f in (tmp_path / "state").rglob("*"):
        if f.is_file():
            _no_secret(f.read_bytes().decode("utf-8", "replace"), str(f))


def test_a_failed_up_does_not_put_the_secret_in_errors_or_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _calls, files, said = _operations(tmp_path, monkeypatch, fail_start=True)
    assert any("did not" in s or "failed" in s for s in said), said
    rec = [d for (n, p), (d, _m) in files.items() if p.endswith("record.json")]
    assert rec and all(SECRET.encode() not in d for d in rec)
    _no_secret("\n".join(said) + caplog.text, "the failure report")


def test_status_json_never_shows_a_secret(tmp_path: Path, sparkctl, monkeypatch: pytest.MonkeyPatch) -> None:
    _calls, files, _ = _operations(tmp_path, monkeypatch)
    record = next(d for (n, p), (d, _m) in files.items() if p.endswith("record.json")).decode()
    inv = _inv(tmp_path)
    fake = fake_for(inv)
    fake.add("*", re.compile(r"cat .*record\.json.*"), reply(record))
    # every stack's record in one round trip (sparkctl.ops.lock.read_records)
    fake.add("*", read_records_command(inv), reply(f"\n==> sparkctl-record /x/record.json\n{record}"))
    from sparkctl.cli import cluster as cli_cluster

    monkeypatch.setattr(cli_cluster, "make_transport", lambda *a, **k: fake)
    (tmp_path / "inv.yaml").write_text("nodes:\n" + "".join(
        f"  - {{name: spark-{x}, host: 192.168.1.10{i}, prefix: {tmp_path / 'nodes' / x}}}\n" for i, x in enumerate("ab"))
        + "cables:\n  - [spark-a:p0, spark-b:p0]\n")
    r = sparkctl("-i", str(tmp_path / "inv.yaml"), "status", "--json")
    assert r.code == 0, r.err
    st = json.loads(r.out)
    assert st["record"]["profile"] == "sec"
    _no_secret(r.out + r.err, "status --json")


def test_bench_rows_never_hold_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    res = resolve("sec", Roots.make(root=str(_root(tmp_path)), env={}))
    config = config_from_profile(res)
    _no_secret(json.dumps(config), "the bench configuration (JSONL)")
    _no_secret(csv_text([{**config, "suite": "decode"}], CSV_COLUMNS), "a bench CSV row")


# --------------------------------------------------------------------------- 0600 from the first byte

def test_the_put_writes_the_secret_file_0600_even_with_umask_000(tmp_path: Path) -> None:
    roots = Roots.make(root=str(_root(tmp_path)), env={})
    inv = _inv(tmp_path)
    rendering = render(resolve("sec", roots), inv, roots, SECRETS, reveal_secrets=True)
    old = os.umask(0)
    try:
        with LocalTransport(nodes=inv.names, sudo=False) as t:
            files = {"spark-a": [f.to_dict() for f in (FileRef(x.path, x.mode, x.sha256)
                                                         for x in rendering.files["spark-a"].values())]}
            res = executor.TransportBackend(inv, t, lambda *a: None, rendering).put_all(files, {"spark-a": False})
            assert all(r["ok"] for r in res.values()), res
    finally:
        os.umask(old)
    for f in rendering.files["spark-a"].values():
        got = stat.S_IMODE(Path(f.path).stat().st_mode)
        assert got == f.mode, f"{f.path}: {got:o}, want {f.mode:o}"
        assert (SECRET in Path(f.path).read_text()) is (f.role == "env")
    env = Path(rendering.files["spark-a"][str(tmp_path / "nodes/a/etc/sparkctl/engine.env")].path)
    assert stat.S_IMODE(env.stat().st_mode) == 0o600 and SECRET in env.read_text()
    assert not list(env.parent.glob(".sparkctl-put.*")), "a temporary copy of the secret was left behind"


def test_the_put_script_creates_its_temporary_file_with_mktemp() -> None:
    """mktemp makes the temporary file 0600 before a byte is written; chmod comes after the data."""
    from sparkctl.transport.base import PUT_SCRIPT

    lines = PUT_SCRIPT.splitlines()
    i_tmp = next(i for i, ln in enumerate(lines) if "mktemp" in ln)
    i_cat = next(i for i, ln in enumerate(lines) if ln.startswith("head -c"))
    i_mv = next(i for i, ln in enumerate(lines) if ln.startswith("mv "))
    assert i_tmp < i_cat < i_mv


# --------------------------------------------------------------------------- host keys

def test_the_host_key_policy_refuses_unknown_keys() -> None:
    from sparkctl.transport.hostkeys import RejectUnknown, UnknownHostKey

    with pytest.raises(UnknownHostKey):
        RejectUnknown().missing_host_key(paramiko.SSHClient(), "spark-a", paramiko.RSAKey.generate(1024))


def test_no_code_path_adds_host_keys_automatically() -> None:
    src = Path(__file__).resolve().parent.parent / "sparkctl"
    for p in src.rglob("*.py"):
        text = p.read_text()
        for bad in ("AutoAddPolicy", "WarningPolicy", "StrictHostKeyChecking=no", "StrictHostKeyChecking=accept-new",
                    "UserKnownHostsFile=/dev/null"):
            assert bad not in text, f"{p}: {bad}"


def test_the_supervisors_ssh_checks_host_keys_it_got_from_verified_connections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _calls, files, _ = _operations(tmp_path, monkeypatch)
    doc = json.loads(next(d for (n, p), (d, _m) in files.items() if p.endswith("supervisor-plan.json")))
    ssh_lines = [" ".join(doc["nodes"]["spark-b"]["ssh"])]
    assert doc["nodes"]["spark-b"]["ssh"][0] == "ssh", "the supervisor reaches its peer over ssh"
    for ln in ssh_lines:
        assert "StrictHostKeyChecking=yes" in ln and "BatchMode=yes" in ln and "GlobalKnownHostsFile=/dev/null" in ln
        assert f"UserKnownHostsFile={tmp_path}/nodes/a/var/lib/sparkctl/known_hosts" in ln
    known = next(d for (n, p), (d, _m) in files.items() if p.endswith("/var/lib/sparkctl/known_hosts")).decode()
    assert known.split() == ["10.20.0.2", "ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyForTests"]
    key = next((n, p, m) for (n, p), (d, m) in files.items() if p.endswith("/id_supervisor"))
    assert key[2] == 0o600


# --------------------------------------------------------------------------- sudo only where needed

# What each command that runs under sudo does; everything else runs as the login user.
SUDO_KINDS = {
    # the lock steps (sparkctl.plan.lockplan): the holder line or the run's token on stdin
    "lock": r"IFS= read -r (info|run|want) \|\| true.*",  # /var/lib/sparkctl is root's
    "clock-cap": r"(nvidia-smi -lgc 0,\d+ && )?mkdir -p .*clock-lock.*|nvidia-smi -lgc 0,\d+",  # check --fix: two
    "clock-reset": r"nvidia-smi -rgc && rm -f .*clock-lock'?",
    "stop-engines": r"set -u\nunit=.*",  # systemctl stop, docker rm, kill
    "put": r"put /.*",  # /etc, /opt, /var/lib are root's
    "log-rotate": r"f=.*engine\.log.*",
    "daemon-reload": r"systemctl daemon-reload",
    "disable-engine": r"if \[ -e .*sparkctl-engine\.service \] && .*systemctl disable sparkctl-engine\.service .*",
    "start": r"systemctl start sparkctl-engine|sh .*run-detached\.sh' start",
    "authorize-supervisor": r"f=.*/etc/sparkctl/authorized_keys.*",
    "start-supervisor": r"mkdir -p .*/var/log/sparkctl && : > .*supervisor\.jsonl.*",
    # /proc/sys is root's
    "drop-caches": r"sync( && echo 3 > .*drop_caches)?|echo 3 > .*drop_caches|set -- \$\(awk .*meminfo.*drop_caches.*",
    "watchdog": r"set -e\n\[ \"\$\(dpkg-query .*earlyoom.*",  # /etc/default, systemctl enable/restart
    "weights-agent-job": r"python3 -S .*weights_agent\.py (fetch|manifest|serve|pull|stop) .*",
}
NO_SUDO = {
    # every stack's record and laws verdicts, in one round trip (ops.lock.read_records_command)
    "read-record": r"cat .*record\.json.*|for f in .*record\.json .*/stacks/\*\.json; do .*",
    "probe": r"sh -c .*@@sparkctl:.*",
    "boot-id": r"cat .*boot_id.*",
    "meminfo": r"cat .*meminfo.*",
    "status-hashes": r"sha256sum .*",
    "engines-alive": r"ps -eo pid,args .*",
    "tail-logs": r"tail -n .*engine\.log.*",
    "supervisor-events": r"cat .*supervisor\.jsonl.*|\[ -e .*supervisor\.jsonl.*",
    "user-authorized-keys": r"\[ -n \"\$\{SPARKCTL_SIM_NODE.*",
    "weights-agent-tail": r"python3 -S .*weights_agent\.py tail .*",
}


def _kind(cmd: str, table: dict[str, str]) -> str | None:
    return next((k for k, rx in table.items() if re.fullmatch(rx, cmd, re.DOTALL)), None)


def test_sudo_is_used_only_for_commands_that_need_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _files, _ = _operations(tmp_path, monkeypatch)
    from sparkctl.ops.check import record_hw_change

    inv = _inv(tmp_path)
    t = fake_for(inv)
    backend = executor.TransportBackend(inv, t, lambda *a: None)
    backend.run_all({n: planner.tail_command(inv, n, 15) for n in inv.names}, {}, None)  # on a failed start
    backend.run_all({n: planner.ALIVE_COMMAND for n in inv.names}, {}, None)  # before a no-op `up`
    record_hw_change(inv, t, "moved a cable")
    calls += t.calls
    used: dict[str, set[bool]] = {}
    unknown = []
    for c in calls:
        kind = _kind(c.command, SUDO_KINDS) or _kind(c.command, NO_SUDO)
        if kind is None:
            unknown.append(f"(sudo={c.sudo}) {c.command[:200]!r}")
        used.setdefault(kind or "?", set()).add(c.sudo)
    assert not unknown, "commands nobody classified:\n" + "\n".join(unknown)
    wrong_sudo = sorted(k for k, s in used.items() if k in NO_SUDO and True in s)
    missing_sudo = sorted(k for k, s in used.items() if k in SUDO_KINDS and False in s)
    assert not wrong_sudo, f"sudo for read-only commands: {wrong_sudo}"
    assert not missing_sudo, f"no sudo for commands that change root-owned state: {missing_sudo}"
    # every kind of both lists was seen: the lists are the whole story, not a wish
    assert set(used) == set(SUDO_KINDS) | set(NO_SUDO), (set(SUDO_KINDS) | set(NO_SUDO)) ^ set(used)
