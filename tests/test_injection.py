"""Hostile strings in every profile and inventory value that reaches a shell or a file name.

For every (hostile string x field) the value is either refused when the profile
or inventory is loaded, with a sparkctl error naming the file, the line and the
key, or it is carried through quoted. "Quoted" is proven by EXECUTING, not by
reading: every rendered file (launch.sh, run-detached.sh, the units' Exec lines,
the env file sourced with ``set -a; .``) and every command string that ``up``,
``check --fix``, ``down --reset-clocks``, ``status``, ``switch --supervise``
(its commands and the supervisor script it writes) and ``weights fetch/sync``
send through a :class:`FakeTransport` is run with bash AND dash in a sandbox
whose PATH holds stubs for the real tools (docker, systemctl, nvidia-smi, ssh,
sudo, curl, ...). A ``touch`` stub logs any call naming the canary; the canary
log must stay empty and no file called CANARY may appear.

Commands whose text is identical to the benign run's are executed once, in the
benign run; a hostile case executes every command and file its value changed.
Each executed text must also parse (``bash -n``): a quoting slip that breaks the
syntax is as much a bug as one that runs a command.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.errors import SparkctlError
from sparkctl.model import paths
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops import executor, readiness, supervise, weights
from sparkctl.ops.check import run_check
from sparkctl.ops.status import cluster_status
from sparkctl.plan.render import render
from sparkctl.transport import Call, put_command

from fakenodes import FakeNodes, fake_for

# --------------------------------------------------------------------------- the hostile strings (the one list)

HOSTILE: list[str] = [
    "$(touch CANARY)",
    "`touch CANARY`",
    "x; touch CANARY",
    "x && touch CANARY",
    "x | touch CANARY",
    "x' ; touch CANARY ; '",
    'x" ; touch CANARY ; "',
    "x'\"$(touch CANARY)\"'",
    "x\ntouch CANARY",
    "x\rtouch CANARY",
    "x\x00touch CANARY",
    "x\n[Service]\nExecStartPre=/bin/touch CANARY",
    "../../etc/x",
    "-x --privileged",
    "--entrypoint=touch",
    "a b",
    "*",
    "x;touch${IFS}CANARY",
    "%n%%$$${HOME}\\",
    "\\'; touch CANARY; echo \\'",
    "A" * 5000,
    "ünïcødé-名前-🚀",
    "",
]
HOSTILE_IDS = [re.sub(r"[^A-Za-z0-9$`;&|'\"*%-]", "_", h)[:24] + f"#{i}" for i, h in enumerate(HOSTILE)]

CANARY = "CANARY"

# --------------------------------------------------------------------------- the fields

Doc = dict[str, Any]
Mutation = Callable[[Doc, Doc, str], None]  # (profile, inventory, hostile) -> None, in place


@dataclass(frozen=True)
class Field:
    name: str  # the key as errors name it
    where: str  # profile | inventory | secret | cli
    mutate: Mutation
    bases: tuple[str, ...] = ("docker",)


def _set(doc: Doc, path: str, value: Any) -> None:
    cur = doc
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = value


def _p(path: str, wrap: Callable[[str], Any] = lambda h: h) -> Mutation:
    return lambda prof, inv, h: _set(prof, path, wrap(h))


def _node(key: str, wrap: Callable[[str], Any] = lambda h: h, index: int = 0) -> Mutation:
    def m(prof: Doc, inv: Doc, h: str) -> None:
        inv["nodes"][index][key] = wrap(h)
    return m


def _defaults(key: str, wrap: Callable[[str], Any] = lambda h: h) -> Mutation:
    def m(prof: Doc, inv: Doc, h: str) -> None:
        inv.setdefault("defaults", {})[key] = wrap(h)
        for n in inv["nodes"]:
            n.pop(key, None)
    return m


def _rename_node(prof: Doc, inv: Doc, h: str) -> None:
    old = inv["nodes"][1]["name"] if len(inv["nodes"]) > 1 else inv["nodes"][0]["name"]
    for n in inv["nodes"]:
        if n["name"] == old:
            n["name"] = h
    inv["cables"] = [[e.replace(f"{old}:", f"{h}:") for e in c] for c in inv.get("cables", [])]


def _cable_end(prof: Doc, inv: Doc, h: str) -> None:
    inv["cables"] = [[h, inv["cables"][0][1]]]


def _ports(i: int, kind: str) -> Mutation:
    def m(prof: Doc, inv: Doc, h: str) -> None:
        ports = {"p0": {"netdevs": ["enp1s0f0np0", "enP2p1s0f0np0"], "rdma": ["rocep1s0f0", "roceP2p1s0f0"]},
                 "p1": {"netdevs": ["enp1s0f1np1", "enP2p1s0f1np1"], "rdma": ["rocep1s0f1", "roceP2p1s0f1"]}}
        ports["p0"][kind][i] = h
        inv["nodes"][0]["ports"] = ports
    return m


def _overlay_arg(prof: Doc, inv: Doc, h: str) -> None:
    prof["nodes"] = {n["name"]: {"engine": {"args": ["--overlay", h]}} for n in inv["nodes"]}


def _under_prefix(key: str, defaults: bool = False) -> Mutation:
    """The hostile text as a path component below the node's own (sandboxed) prefix."""
    def m(prof: Doc, inv: Doc, h: str) -> None:
        value = f"{inv['nodes'][0][key]}/{h}"
        if defaults:
            inv.setdefault("defaults", {})[key] = value
            for n in inv["nodes"]:
                n.pop(key, None)
        else:
            inv["nodes"][0][key] = value
    return m


def _overlay_name(prof: Doc, inv: Doc, h: str) -> None:
    prof["nodes"] = {h: {"engine": {"args": ["--x"]}}}


def _env_key(prof: Doc, inv: Doc, h: str) -> None:
    prof.setdefault("engine", {})["env"] = {h: "1"}


def _kernel_deny_key(prof: Doc, inv: Doc, h: str) -> None:
    prof.setdefault("laws", {})["kernels"] = {"bad": {h: "reason"}}


def _secret_name(prof: Doc, inv: Doc, h: str) -> None:
    prof.setdefault("engine", {})["secret_env"] = [h]


def _nothing(prof: Doc, inv: Doc, h: str) -> None:
    pass


BOTH = ("docker", "native")
FIELDS: list[Field] = [
    # profile
    Field("engine.version", "profile", _p("engine.version"), BOTH),
    Field("engine.image", "profile", _p("engine.image")),
    Field("engine.binary", "profile", _p("engine.binary"), BOTH),
    Field("engine.args", "profile", _p("engine.args", lambda h: ["--flag", h, h]), BOTH),
    Field("engine.docker_args", "profile", _p("engine.docker_args", lambda h: [h])),
    Field("engine.env", "profile", _p("engine.env", lambda h: {"EXTRA": h}), BOTH),
    Field("engine.env (name)", "profile", _env_key),
    Field("engine.secret_env", "profile", _secret_name),
    Field("secret value", "secret", _p("engine.secret_env", lambda h: ["HF_TOKEN"]), BOTH),
    Field("model.id", "profile", _p("model.id")),
    Field("model.served_name", "profile", _p("model.served_name"), BOTH),
    Field("model.weights_path", "profile", _p("model.weights_path", lambda h: f"/srv/models/{h}"), BOTH),
    Field("model.weights_format", "profile", _p("model.weights_format")),
    Field("topology.nodes", "profile", _p("topology.nodes", lambda h: [h, "spark-b"])),
    Field("laws.kernels.good", "profile", _p("laws.kernels", lambda h: {"good": [h]})),
    Field("laws.kernels.bad", "profile", _kernel_deny_key),
    Field("laws.kernels.bad (reason)", "profile", _p("laws.kernels", lambda h: {"bad": {"6.17.0-1031-nvidia": h}})),
    Field("laws.kernel_hold_packages", "profile", _p("laws.kernel_hold_packages", lambda h: [h])),
    Field("laws.clock_cap_mhz", "profile", _p("laws.clock_cap_mhz")),
    Field("serve.port", "profile", _p("serve.port")),
    Field("serve.master_port", "profile", _p("serve.master_port")),
    Field("serve.stop_timeout_s", "profile", _p("serve.stop_timeout_s")),
    Field("serve.tokens_metric", "profile", _p("serve.tokens_metric")),
    Field("thinking.request_fields", "profile", _p("thinking.request_fields", lambda h: {"effort": h})),
    Field("bench.suites", "profile", _p("bench.suites", lambda h: [h])),
    Field("description", "profile", _p("description")),
    Field("extends", "profile", _p("extends")),
    Field("nodes (overlay args)", "profile", _overlay_arg, BOTH),
    Field("nodes (overlay name)", "profile", _overlay_name),
    Field("profile name", "cli", _nothing),
    # inventory
    Field("nodes.name", "inventory", _rename_node, BOTH),
    Field("nodes.host", "inventory", _node("host"), BOTH),
    Field("nodes.ssh_user", "inventory", _node("ssh_user"), BOTH),
    Field("nodes.ssh_port", "inventory", _node("ssh_port")),
    Field("nodes.ssh_identity", "inventory", _node("ssh_identity")),
    Field("nodes.known_hosts", "inventory", _node("known_hosts")),
    Field("nodes.prefix", "inventory", _under_prefix("prefix"), BOTH),
    Field("nodes.sysfs_root", "inventory", _under_prefix("sysfs_root")),
    Field("nodes.proc_root", "inventory", _node("proc_root", lambda h: f"/proc/{h}")),
    Field("nodes.mgmt_iface", "inventory", _node("mgmt_iface")),
    Field("nodes.ports.netdevs", "inventory", _ports(0, "netdevs")),
    Field("nodes.ports.rdma", "inventory", _ports(1, "rdma")),
    Field("defaults.ssh_user", "inventory", _defaults("ssh_user")),
    Field("defaults.prefix", "inventory", _under_prefix("prefix", defaults=True)),
    Field("cluster.name", "inventory", lambda prof, inv, h: _set(inv, "cluster.name", h)),
    Field("cluster.fabric_pool", "inventory", lambda prof, inv, h: _set(inv, "cluster.fabric_pool", h)),
    Field("cables", "inventory", _cable_end),
]
FIELD_IDS = [f.name for f in FIELDS]
CASES = [(f, base) for f in FIELDS for base in f.bases]


# --------------------------------------------------------------------------- the sandbox

STUB_LOG = '#!/bin/sh\nprintf "%s\\n" "${0##*/} $*" >> "$SANDBOX/calls.log"\n'
STUBS: dict[str, str] = {
    # any call naming the canary is logged; anything else is the real touch
    "touch": '#!/bin/sh\nfor a; do case "$a" in *CANARY*) printf "%s\\n" "touch $*" >> "$CANARY_LOG"; exit 0 ;; '
             "esac; done\nexec /usr/bin/touch \"$@\"\n",
    # an engine (docker, or the native binary): its argv and environment, NUL-separated
    "engine": STUB_LOG + 'printf "%s\\0" "${0##*/}" "$@" > "$SANDBOX/argv"\nenv -0 > "$SANDBOX/env"\n',
    "sudo": '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in --) shift; break ;; -*) shift ;; *) break ;; esac; done\n'
            'exec "$@"\n',
    # the supervisor's ssh to a peer: run the remote command here (the peer's files live under its prefix)
    "ssh": STUB_LOG + 'for a; do last=$a; done\nexec sh -c "$last"\n',
    "curl": STUB_LOG + 'for a; do case "$a" in\n'
            '  */v1/models) printf \'{"data":[{"id":%s}]}\' "$(cat "$SANDBOX/served.json")"; exit 0 ;;\n'
            '  */v1/completions) printf \'{"usage":{"completion_tokens":1}}\'; exit 0 ;;\nesac; done\n',
    "ps": '#!/bin/sh\necho "    PID COMMAND"\n',
    "setsid": STUB_LOG,
    # the watchdog step's test: earlyoom is installed (`fabric apply` would have done it)
    "dpkg-query": STUB_LOG + "printf installed\n",  # detached starts are logged, not run: the scripts they start are run directly
}
STUBBED = ["docker", "systemctl", "nvidia-smi", "ss", "ip", "ethtool", "lspci", "ibdev2netdev", "apt-mark",
           "netplan", "sysctl", "journalctl", "pkill", "killall", "reboot", "shutdown", "mount", "df"]
ENGINES = ["docker", "vllm", "llama-server", "python3", "ds41f", "tensorfold"]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    box = tmp_path_factory.mktemp("sandbox")
    bindir = box / "bin"
    bindir.mkdir()
    for name in STUBBED:
        (bindir / name).write_text(STUB_LOG)
    for name, text in STUBS.items():
        (bindir / name).write_text(text)
    for name in ENGINES:
        (bindir / name).write_text(STUBS["engine"])
    for p in bindir.iterdir():
        p.chmod(0o755)
    (box / "state").mkdir()
    return box


# Every text must parse in both; it runs under bash (`sh` on the nodes is dash: the
# quoting used, shlex.quote, means the same in both, and both parse every text).
SYNTAX_SHELLS = ("bash", "dash")
RUN_SHELL = "bash"


@dataclass
class Executed:
    texts: int = 0
    runs: int = 0
    outputs: dict[str, str] = field(default_factory=dict)


def _env(box: Path, case: Path) -> dict[str, str]:
    return {"PATH": f"{box / 'bin'}:/usr/bin:/bin", "HOME": str(case / "home"), "SANDBOX": str(case),
            "CANARY_LOG": str(case / "canary.log"), "LC_ALL": "C"}


def execute(box: Path, case: Path, texts: list[tuple[str, bytes | None]], tag: str,
            syntax_only: list[str] = ()) -> Executed:  # type: ignore[assignment]
    """Run each shell text with bash (stdin where given); each, and each syntax_only text, must parse first."""
    d = case / f"exec-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    for i, (text, stdin) in enumerate(texts):
        (d / f"{i:04d}.sh").write_text(text)
        if stdin is not None:
            (d / f"{i:04d}.in").write_bytes(stdin)
    for i, text in enumerate(syntax_only):
        (d / f"{i:04d}.syntax-only").write_text(text)
    driver = (
        'for f in "$D"/*.sh "$D"/*.syntax-only; do [ -e "$f" ] || continue\n'
        '  for s in ' + " ".join(SYNTAX_SHELLS) + '; do\n'
        '    "$s" -n "$f" 2>"$f.$s.syntax" || echo "$f" >> "$D/syntax-errors"\n'
        "  done\n"
        '  case "$f" in *.syntax-only) continue ;; esac\n'
        '  b=${f%.sh}; in=$b.in; [ -e "$in" ] || in=/dev/null\n'
        '  ( cd "$CWD" && timeout 20 ' + RUN_SHELL + ' "$f" <"$in" >"$b.out" 2>&1 ); echo $? > "$b.rc"\n'
        "done\n"
    )
    (case / "cwd").mkdir(exist_ok=True)
    (case / "home").mkdir(exist_ok=True)
    env = {**_env(box, case), "D": str(d), "CWD": str(case / "cwd")}
    subprocess.run(["sh", "-c", driver], env=env, check=True, timeout=600)
    bad = (d / "syntax-errors").read_text() if (d / "syntax-errors").exists() else ""
    assert not bad, f"does not parse: {bad}\n" + "\n".join(
        (Path(f).read_text()[:2000] + "\n--> " + Path(f + ".bash.syntax").read_text()
         + Path(f + ".dash.syntax").read_text()) for f in bad.split())
    return Executed(len(texts), len(texts),
                    {p.name: p.read_text(errors="replace") for p in d.glob("*.out")})


def assert_no_canary(case: Path) -> None:
    log = case / "canary.log"
    assert not log.exists(), f"a hostile value ran a command: {log.read_text()}"
    found = [p for p in case.rglob("*") if CANARY in p.name and p.name != "canary.log" and "exec-" not in str(p.parent)]
    assert not found, f"a hostile value created {found}"


# --------------------------------------------------------------------------- building a case

def base_docs(base: str, case: Path) -> tuple[Doc, Doc]:
    if base == "docker":
        prof: Doc = {"extends": "vllm-tp2-fallback", "engine": {"env": {"GREETING": "hello"}},
                     "serve": {"ready_timeout_s": 5}}
        inv: Doc = {"nodes": [{"name": "spark-a", "host": "192.168.1.101"}, {"name": "spark-b", "host": "192.168.1.102"}],
                    "cables": [["spark-a:p0", "spark-b:p0"]]}
    else:
        prof = {"extends": "tiny-llamacpp", "serve": {"ready_timeout_s": 5}}
        inv = {"nodes": [{"name": "spark-a", "host": "192.168.1.101", "ssh_user": "ops", "sudo": False}]}
    for n in inv["nodes"]:
        n["prefix"] = str(case / "nodes" / n["name"])
        n["sysfs_root"] = str(case / "sysfs")
        n["proc_root"] = "/proc"
    return prof, inv


@dataclass
class Loaded:
    res: Any
    inv: Any
    roots: Roots
    secrets: dict[str, str]
    profile_file: Path
    inventory_file: Path


def load_case(base: str, f: Field | None, hostile: str, case: Path) -> Loaded:
    """Write the profile and inventory with the hostile value and load them (may raise)."""
    prof, inv = base_docs(base, case)
    secrets = {"HF_TOKEN": "hf_benign"} if f is not None and f.where == "secret" else {}
    if f is not None:
        f.mutate(prof, inv, hostile)
        if f.where == "secret":
            secrets = {"HF_TOKEN": hostile}
    root = case / "root"
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    pfile, ifile = root / "profiles" / "evil.yaml", case / "inventory.yaml"
    pfile.write_text(yaml.safe_dump(prof, allow_unicode=True, width=10**6))
    ifile.write_text(yaml.safe_dump(inv, allow_unicode=True, width=10**6))
    roots = Roots.make(root=str(root), env={})
    inventory = load_inventory(ifile)
    name = hostile if f is not None and f.where == "cli" else "evil"
    return Loaded(resolve(name, roots), inventory, roots, secrets, pfile, ifile)


def assert_clear_refusal(exc: SparkctlError, f: Field, hostile: str, loaded_files: tuple[Path, Path]) -> None:
    """A refusal names where (file:line: key) and says it on one line, without echoing a secret."""
    line = exc.one_line()
    assert "\n" not in line and "\r" not in line and "\x00" not in line, f"multi-line error: {line!r}"
    assert exc.ref is not None or exc.hint, f"no place and no hint: {line}"
    if f.where in ("profile", "inventory"):
        want = loaded_files[0] if f.where == "profile" else loaded_files[1]
        assert exc.ref is not None and exc.ref.file == str(want), f"{f.name}: error does not name {want}: {line}"
        assert exc.ref.line is not None, f"{f.name}: error has no line: {line}"
        assert exc.ref.key, f"{f.name}: error has no key: {line}"
    if f.where == "secret":
        assert exc.ref is not None and exc.ref.key == "HF_TOKEN"
        if len(hostile) > 3:
            assert hostile not in line, "a secret value was echoed in an error"


# --------------------------------------------------------------------------- the commands sparkctl would send





def sparkctl_commands(ld: Loaded, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Call], dict[tuple[str, str], tuple[bytes, int]]]:
    """Every command the operations send, through fake transports (each operation tolerated to fail)."""
    monkeypatch.setattr(readiness, "probe_endpoint", lambda *a, **k: (True, "serving"))
    calls: list[Call] = []
    files: dict[tuple[str, str], tuple[bytes, int]] = {}
    ops: list[Callable[[FakeNodes], Any]] = [
        lambda t: executor.up(ld.res, ld.inv, t, ld.roots, secrets=ld.secrets, skip_check=True),
        lambda t: run_check(ld.res, ld.inv, t, fix=True, bandwidth_s=0,
                            fix_runner=executor.plan_runner(ld.inv, t, lambda _m: None)),
        lambda t: executor.down(ld.inv, t, reset_clocks=True),
        lambda t: cluster_status(ld.inv, t),
        lambda t: supervise.switch_supervised(ld.res, ld.inv, t, ld.roots, secrets=ld.secrets, skip_check=True),
        lambda t: weights.fetch(ld.inv, t, ld.inv.names[0], "https://example.invalid/m.gguf",
                                ld.res.profile.model.weights_path, poll_s=0),
        lambda t: weights.sync(ld.inv, t, ld.res.profile.model.weights_path, ld.inv.names[0], poll_s=0),
    ]
    for op in ops:
        t = fake_for(ld.inv)
        try:
            op(t)
        except SparkctlError:
            pass
        calls += t.calls
        files.update(t.files)
    return calls, files


def command_texts(calls: list[Call], files: dict[tuple[str, str], tuple[bytes, int]]) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    for c in calls:
        if c.command.startswith("put "):
            path = c.command[4:]
            mode = files.get((c.node, path), (b"", 0o644))[1]
            out.append((shlex.join(put_command([(path, mode, len(c.stdin or b""))])), c.stdin))
        else:
            out.append((c.command, c.stdin))
    return out


# --------------------------------------------------------------------------- the rendered files

def _gid_sysfs(sysfs: Path, rendering: Any, inv: Any) -> None:
    """Each node's fabric GIDs, as the launch script looks them up (its own address per device).

    The nodes of a case share one sysfs root, so node k's GIDs sit at index 3 + k on every device:
    within a node one index for every device, as NCCL needs."""
    for k, r in enumerate(rendering.layout.ranks):
        for dev in r.hca:
            addr = next(lk.end(r.node).address for lk in inv.node_links(r.node) if lk.end(r.node).rdma == dev)
            o = [int(x) for x in addr.split(".")]
            port = sysfs / "class/infiniband" / dev / "ports/1"
            (port / "gid_attrs/types").mkdir(parents=True, exist_ok=True)
            (port / "gids").mkdir(parents=True, exist_ok=True)
            (port / f"gid_attrs/types/{3 + k}").write_text("RoCE v2\n")
            (port / f"gids/{3 + k}").write_text("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n" % tuple(o))


def unit_directives(text: str) -> list[str]:
    return [ln.split("=", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]


def unit_exec_texts(text: str) -> list[str]:
    """ExecStart*/ExecStartPost lines as systemd would run them, as shell texts (via the sim's unit parser)."""
    from sparkctl_sim.procshims import expand_systemd_argv, split_systemd_words

    out = []
    for ln in text.splitlines():
        key, _, value = ln.partition("=")
        if key in ("ExecStart", "ExecStartPost"):
            argv = [w.replace("%%", "%") for w in expand_systemd_argv(split_systemd_words(value), {})]
            if argv[0] == "/bin/sh":
                out.append(shlex.join(argv))
    return out


def files_texts(ld: Loaded, case: Path) -> tuple[list[tuple[str, bytes | None]], dict[str, Any]]:
    """Write every node's files in place (under its prefix); the shell texts they contain; structure facts."""
    rendering = render(ld.res, ld.inv, ld.roots, ld.secrets, reveal_secrets=True)
    _gid_sysfs(case / "sysfs", rendering, ld.inv)
    texts: list[tuple[str, bytes | None]] = []
    facts: dict[str, Any] = {"units": {}, "netplan": {}, "env_files": []}
    for node, nf in rendering.files.items():
        for f in nf.values():
            p = Path(f.path)
            assert str(p).startswith(str(case)), f"a file escaped the node's prefix: {p}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f.text)
            p.chmod(f.mode)
            if f.role in ("launch", "supervisor") and f.path.endswith(".sh"):
                arg = " start" if f.path.endswith("run-detached.sh") else ""
                texts.append((f"sh {shlex.quote(f.path)}{arg}", None))
            elif f.path.endswith(".service"):
                facts["units"][f"{node}:{p.name}"] = unit_directives(f.text)
                texts += [(t, None) for t in unit_exec_texts(f.text)]
            elif f.role == "env":
                facts["env_files"].append(f.path)
                texts.append((f"set -a; . {shlex.quote(f.path)}; set +a; env -0 > \"$SANDBOX/sourced.env\"", None))
            elif f.path.endswith(".yaml"):
                facts["netplan"][node] = sorted(yaml.safe_load(f.text)["network"]["ethernets"])
    facts["shell_files"] = [f.text for nf in rendering.files.values() for f in nf.values() if f.path.endswith(".sh")]
    facts["file_texts"] = [f.text for nf in rendering.files.values() for f in nf.values()]
    return texts, facts


# --------------------------------------------------------------------------- one case, end to end

# Hashes (profile digest, file sha256, job ids) and timestamps differ from run to run; a
# text equal to a benign one up to these is the benign text, already executed. (No
# hostile string holds 12 lower-case hex digits in a row or a timestamp.)
_NOISE = re.compile(r"[0-9a-f]{12,64}|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?")


def norm(text: str) -> str:
    return _NOISE.sub("#", text)


@dataclass
class Outcome:
    refused: bool
    executed: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    commands: set[str] = field(default_factory=set)  # normalized
    files: set[str] = field(default_factory=set)  # normalized texts of the rendered files and the supervisor
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


_BASELINE: dict[str, Outcome] = {}


def _read_nul(p: Path) -> list[str]:
    return p.read_bytes().decode("utf-8", "replace").split("\0")[:-1] if p.exists() else []


def run_case(box: Path, base: str, f: Field | None, hostile: str, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    # One fixed directory per base, emptied for each case: the node prefixes (and so every
    # path in every command) are the same as in the benign run unless the value changed them.
    case = box / f"run-{base}"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    try:
        ld = load_case(base, f, hostile, case)
        ftexts, facts = files_texts(ld, case)
    except SparkctlError as exc:
        assert f is not None, f"the benign {base} case was refused: {exc.one_line()}"
        assert_clear_refusal(exc, f, hostile, (case / "root/profiles/evil.yaml", case / "inventory.yaml"))
        return Outcome(refused=True)
    (case / "served.json").write_text(json.dumps(ld.res.profile.model.served_name))
    monkeypatch.setenv("XDG_STATE_HOME", str(box / "state"))  # the supervisor's key pair, made once
    calls, files = sparkctl_commands(ld, monkeypatch)
    ctexts = command_texts(calls, files)
    base_out = _BASELINE[base] if f is not None else Outcome(False)
    new = [(t, s) for t, s in ctexts if norm(t) not in base_out.commands]
    # the plan the supervisor runs on the head: run its commands too (stop, start, ... as the runner would)
    sup: list[tuple[str, str]] = []
    for (_n, p), (d, _m) in files.items():
        if p.endswith(paths.SUPERVISOR_PLAN.rsplit("/", 1)[-1]):
            plan = json.loads(bytes(d))["plan"]
            for step in plan["steps"] + [s for b in plan["branches"].values() for s in b]:
                for cmd in step.get("commands", {}).values():
                    if norm(cmd) not in base_out.commands:
                        new.append((cmd, None))
    file_texts = {norm(t) for t in facts.pop("file_texts")}
    runs, argv, env = 0, [], {}
    if not file_texts <= base_out.files:
        # launch first: the engine stub's argv and environment are those of the launch run
        runs += execute(box, case, ftexts, "files", syntax_only=facts["shell_files"] + [t for t, _ in sup]).runs
        argv = _read_nul(case / "argv")
        env = {**dict(x.split("=", 1) for x in _read_nul(case / "sourced.env") if "=" in x),
               **dict(x.split("=", 1) for x in _read_nul(case / "env") if "=" in x)}
    if new:
        runs += execute(box, case, new, "commands").runs
    assert_no_canary(case)
    return Outcome(False, runs, facts, {norm(t) for t, _ in ctexts}, file_texts, argv, env)


@pytest.fixture
def baseline(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Outcome]:
    for base in ("docker", "native"):
        if base not in _BASELINE:
            _BASELINE[base] = run_case(sandbox, base, None, "", monkeypatch)
    return _BASELINE


@pytest.mark.parametrize("hostile", HOSTILE, ids=HOSTILE_IDS)
@pytest.mark.parametrize("f,base", CASES, ids=[f"{f.name}-{b}" for f, b in CASES])
def test_hostile_value_is_refused_or_inert(f: Field, base: str, hostile: str, sandbox: Path,
                                           baseline: dict[str, Outcome], monkeypatch: pytest.MonkeyPatch) -> None:
    out = run_case(sandbox, base, f, hostile, monkeypatch)
    if out.refused:
        return
    want = baseline[base]
    # nothing was injected into the structure of a unit file or the netplan file
    assert out.facts["units"] == want.facts["units"], "a value added or removed a unit directive"
    assert out.facts["netplan"] == want.facts["netplan"], "a value changed the fabric interfaces"
    # values that are carried arrive byte for byte: as one engine argument, or as one variable
    if f.name in ("engine.args", "nodes (overlay args)") and hostile:
        assert hostile in out.argv, f"{hostile!r} did not arrive as one argument: {out.argv}"
    if f.name == "engine.docker_args" and hostile:
        assert hostile in out.argv
    if f.name == "engine.env":
        assert out.env.get("EXTRA") == hostile, f"EXTRA={out.env.get('EXTRA')!r}, want {hostile!r}"
    if f.name == "secret value":
        assert out.env.get("HF_TOKEN") == hostile
    if f.name == "model.weights_path":
        assert any(a.endswith(f"/srv/models/{hostile}") for a in out.argv), out.argv


def test_the_benign_runs_execute_every_operation(baseline: dict[str, Outcome]) -> None:
    """The harness itself: the benign runs reach the engine and send every kind of command."""
    for base, out in baseline.items():
        assert not out.refused and out.executed > 40, base
        assert out.env.get("SPARKCTL_NODE") and out.argv, base
        kinds = {"systemctl start sparkctl-engine" if base == "docker" else "run-detached.sh",
                 "echo acquired", "nvidia-smi -rgc", "weights_agent.py", "@@sparkctl:"}
        if base == "docker":
            kinds |= {"nvidia-smi -lgc", "systemctl daemon-reload"}
        joined = "\n".join(out.commands)
        assert all(k in joined for k in kinds), [k for k in kinds if k not in joined]
    assert baseline["docker"].argv[0] == "docker" and "GREETING" in baseline["docker"].env
    assert baseline["native"].argv[0] == "python3"


# --------------------------------------------------------------------------- random strings, too

SHELLY = "$`'\"\\;&|<>(){}[]*?!~#=%^ \t-./:,@+_" + "aZ09" + "é名"
EXECUTED_FIELDS = ["engine.args", "engine.env", "model.weights_path", "secret value", "engine.docker_args"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(text=st.text(alphabet=SHELLY, min_size=1, max_size=40), which=st.sampled_from(EXECUTED_FIELDS))
def test_random_shell_text_is_refused_or_inert(text: str, which: str, sandbox: Path, baseline: dict[str, Outcome],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    f = next(x for x in FIELDS if x.name == which)
    out = run_case(sandbox, "docker", f, "x" + text, monkeypatch)  # "x": a value that is not an option
    if not out.refused and which in ("engine.args", "engine.docker_args"):
        assert "x" + text in out.argv
    if not out.refused and which == "engine.env":
        assert out.env.get("EXTRA") == "x" + text
