"""The real tools judge what sparkctl renders: systemd-analyze, netplan, shellcheck.

Every bundled profile is rendered on its fitting inventory (tests/test_render.py)
and every file of a kind goes through the real Debian tool of that kind:

* units: ``systemd-analyze verify --root=ROOT`` (package ``systemd``; PID 1 is
  not needed). ROOT holds a copy of this machine's /usr/lib/systemd/system (the
  targets the units name) and of every ExecStart binary verify checks for
  existence; a binary a DGX OS image has and this machine lacks (nvidia-smi,
  from NVIDIA's driver utilities) gets an empty executable stand-in, any other
  missing binary fails the test (a unit naming a binary no node has). docker.service, which
  a container engine's unit requires, gets a stand-in unit for the same reason.
* netplan: ``netplan generate --root-dir ROOT`` (package ``netplan.io``), and the
  systemd-networkd files it writes must carry the rendered addresses.
* shell: ``shellcheck`` (package ``shellcheck``) on launch.sh, run-detached.sh
  and supervisor.sh, with every severity: nothing may be left unexplained (an
  unavoidable warning carries a ``# shellcheck disable=`` with its reason).

Any output on stderr counts as a finding (verify and netplan warn on stderr and
still exit 0). A tool that is absent skips its tests, naming the package (CI
installs them: Makefile's APT_PACKAGES). Each checker is also shown a broken
file, so a checker that judges nothing fails too.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
import yaml

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import RenderedFile, render

from helpers import INVENTORY_FOR

REPO = Path(__file__).resolve().parent.parent
# Binaries a DGX OS image ships that a Debian test machine does not (NVIDIA's driver utilities).
DGX_OS_BINARIES = {"/usr/bin/nvidia-smi"}
# Units a DGX OS image has and a Debian test machine may not: docker.service (docker-ce's
# /usr/lib/systemd/system/docker.service), which a container engine's unit requires. The
# stand-in only lets verify resolve Requires=/After=; the real unit is docker's own.
DGX_OS_UNITS = {"docker.service": "[Unit]\nDescription=Docker Application Container Engine (stand-in)\n"
                                  "[Service]\nExecStart=/bin/true\n"}
# Commands named without a path, as systemd resolves them on a DGX OS image (its search path,
# systemd.service(5) "Command lines"; docker-ce installs /usr/bin/docker).
DGX_OS_COMMANDS = {"docker": "/usr/bin/docker"}
EXEC_KEYS = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload")


def _need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian package {package}; `make setup` installs it)")
    return path


# The gateway's files (serve.gateway), rendered for both platforms it is pinned for, keyed.
GATEWAY_SETS = ("serve.gateway.enabled=true", "serve.api_key_env=SPARKCTL_TEST_KEY")


def _gateway_rendered() -> Iterator[tuple[str, str, RenderedFile]]:
    from sparkctl.model.wheels import NodePlatform
    from sparkctl.plan.gatewayplan import render_gateway

    roots = Roots.make(env={})
    res = resolve("tiny-llamacpp", roots, GATEWAY_SETS)
    for plat in (NodePlatform("aarch64", "3.12", "cpython", "2.39"), NodePlatform("x86_64", "3.11", "cpython", "2.36")):
        setup = render_gateway(res, load_inventory(REPO / "inventory.yaml"), roots, {"SPARKCTL_TEST_KEY": "k"}, plat)
        for _, f in sorted(setup.files.items()):
            yield f"gateway-{plat.machine}", setup.node, f


def _rendered() -> Iterator[tuple[str, str, RenderedFile]]:
    roots = Roots.make(env={})
    for profile in sorted(INVENTORY_FOR):
        rendering = render(resolve(profile, roots), load_inventory(REPO / INVENTORY_FOR[profile]), roots, secrets={})
        for node, files in sorted(rendering.files.items()):
            for _, f in sorted(files.items()):
                yield profile, node, f
    yield from _gateway_rendered()


def _files(suffix: str) -> list[tuple[str, str, RenderedFile]]:
    return [(p, n, f) for p, n, f in _rendered() if f.path.endswith(suffix)]


def _units_by_node() -> dict[str, list[RenderedFile]]:
    out: dict[str, list[RenderedFile]] = {}
    for profile, node, f in _files(".service"):
        out.setdefault(f"{profile}/{node}", []).append(f)
    return out


# --------------------------------------------------------------------------- systemd


@pytest.fixture(scope="module")
def systemd_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need("systemd-analyze", "systemd")
    base = tmp_path_factory.mktemp("systemd-root")
    shutil.copytree("/usr/lib/systemd/system", base / "usr/lib/systemd/system", symlinks=True)
    return base


def _exec_binaries(text: str) -> set[str]:
    found = set()
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() in EXEC_KEYS:
            word = shlex.split(value.lstrip("-@:+!"))[0]
            if word.startswith("/"):
                found.add(word)
            elif word not in DGX_OS_COMMANDS:
                pytest.fail(f"{key.strip()}={value}: {word!r} has no path and is not a command a DGX OS image has")
    return found


def _verify(base: Path, units: list[tuple[str, str]], tmp: Path) -> subprocess.CompletedProcess[str]:
    root = tmp / "root"
    shutil.copytree(base, root, symlinks=True)
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for name, text in DGX_OS_UNITS.items():
        dest = root / "usr/lib/systemd/system" / name
        if not dest.exists():
            dest.write_text(text)
    for name, text in units:
        (unit_dir / name).write_text(text)
        for binary in _exec_binaries(text):
            dest = root / binary.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if Path(binary).exists():
                shutil.copy2(binary, dest)
            elif binary in DGX_OS_BINARIES:
                dest.write_text("#!/bin/sh\n")  # verify checks it exists and is executable, nothing more
                dest.chmod(0o755)
            else:
                pytest.fail(f"{name} runs {binary}, which neither this machine nor a DGX OS image has")
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}",
                           *(f"/etc/systemd/system/{name}" for name, _ in units)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", sorted(_units_by_node()))
def test_rendered_units_pass_systemd_analyze_verify(where: str, systemd_base: Path, tmp_path: Path) -> None:
    units = [(Path(f.path).name, f.text) for f in _units_by_node()[where]]
    r = _verify(systemd_base, units, tmp_path)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), f"{where}: systemd-analyze verify:\n{r.stdout}{r.stderr}"


def test_the_relay_forward_unit_passes_systemd_analyze_verify(systemd_base: Path, tmp_path: Path) -> None:
    from sparkctl.plan.fabricplan import render_fabric

    inv = load_inventory(REPO / "inventory.yaml")
    units = [(Path(f.path).name, f.text) for f in render_fabric(inv, Roots.make(env={})).files["spark-b"]
             if f.path.endswith(".service")]
    assert [n for n, _ in units] == ["sparkctl-fabric-forward.service"]
    r = _verify(systemd_base, units, tmp_path)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), f"systemd-analyze verify:\n{r.stdout}{r.stderr}"


def test_systemd_analyze_verify_refuses_a_broken_unit(systemd_base: Path, tmp_path: Path) -> None:
    text = "[Service]\nExecStart=/bin/sh -c true\nStandardOutput=append:relative/engine.log\nNoSuchKey=1\n"
    r = _verify(systemd_base, [("broken.service", text)], tmp_path)
    assert "Unknown key" in r.stderr and "not absolute" in r.stderr


# --------------------------------------------------------------------------- netplan


def _netplan_generate(text: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp / "root"
    conf = root / "etc/netplan/60-sparkctl-fabric.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(text)
    conf.chmod(0o600)  # as rendered; netplan warns about anything wider
    r = subprocess.run(["netplan", "generate", "--root-dir", str(root)], capture_output=True, text=True, timeout=120)
    return r, root


@pytest.mark.parametrize(("profile", "node", "f"), _files(".yaml"), ids=lambda v: v if isinstance(v, str) else "")
def test_rendered_netplan_passes_netplan_generate(profile: str, node: str, f: RenderedFile, tmp_path: Path) -> None:
    _need("netplan", "netplan.io")
    assert f.mode == 0o600
    r, root = _netplan_generate(f.text, tmp_path)
    assert (r.returncode, r.stderr) == (0, ""), f"{profile}/{node}: netplan generate:\n{r.stderr}"
    for ifname, conf in yaml.safe_load(f.text)["network"]["ethernets"].items():
        network = (root / f"run/systemd/network/10-netplan-{ifname}.network").read_text()
        for address in conf["addresses"]:
            assert f"Address={address}" in network, f"{profile}/{node}: {ifname} lost {address}"
        assert f"MTUBytes={conf['mtu']}" in (root / f"run/systemd/network/10-netplan-{ifname}.link").read_text() \
            or f"MTUBytes={conf['mtu']}" in network


def test_netplan_generate_refuses_a_broken_file(tmp_path: Path) -> None:
    _need("netplan", "netplan.io")
    r, _ = _netplan_generate("network:\n  version: 2\n  ethernets:\n    eth9:\n      addresses: [10.0.0.1]\n", tmp_path)
    assert r.returncode != 0 and "missing /prefixlength" in r.stderr


# --------------------------------------------------------------------------- shell


def _shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["shellcheck", "--format=gcc", "--severity=style", str(path)],
                          capture_output=True, text=True, timeout=120)


def _supervisor_script() -> str:
    """supervisor.sh.j2 with every branch taken (ops renders it at switch time; its values are quoted by then)."""
    roots = Roots.make(env={})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(roots.template_dirs()), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    env.filters["shjoin"] = lambda vs: " ".join(shlex.quote(str(v)) for v in vs)
    cmd = "systemctl start sparkctl-engine"
    head = {"name": "spark-a", "head": True, "ssh": "", "stop": cmd, "backup": cmd, "restore": cmd, "install": cmd,
            "start": cmd, "rank": 0}
    peer = {**head, "name": "spark-b", "head": False, "rank": 1,
            "ssh": "ssh -o BatchMode=yes -i /var/lib/sparkctl/supervisor_ed25519 root@10.20.0.2"}
    return env.get_template("supervisor.sh.j2").render(
        version="0", profile="new", prev_profile="old", head="spark-a", head_json='"spark-a"',
        operation_json='"switch --supervise new"', events="/var/lib/sparkctl/supervisor.jsonl",
        pid_file="/var/lib/sparkctl/supervisor.pid", lock_dir="/var/lib/sparkctl/lock.d",
        record_path="/var/lib/sparkctl/record.json", nodes=[head, peer], stop_order=[peer, head],
        start=[[head], [peer]], alive_cmd="true", port=8000, served_name="m", pattern='"id":"m"', body="{}",
        deadline_s=60, new_nodes=["spark-a", "spark-b"], record_json="{}", failed_record_json="{}",
        prev={"profile": "old", "served_name": "m0", "port": 8000, "pattern": '"id":"m0"', "body": "{}",
              "deadline_s": 60, "nodes": ["spark-a", "spark-b"], "start": [[head, peer]], "record_json": "{}"},
    )


def _scripts() -> list[tuple[str, str, str]]:
    out = [(p, n, f.text) for p, n, f in _files(".sh")]
    if (REPO / "templates" / "supervisor.sh.j2").exists():  # rendered by ops at switch time, when shipped
        out.append(("(switch)", "spark-a", _supervisor_script()))
    return out


@pytest.mark.parametrize(("profile", "node", "text"), _scripts(), ids=lambda v: v if len(v) < 40 else "")
def test_rendered_shell_scripts_pass_shellcheck(profile: str, node: str, text: str, tmp_path: Path) -> None:
    _need("shellcheck", "shellcheck")
    path = tmp_path / "script.sh"
    path.write_text(text)
    r = _shellcheck(path)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), f"{profile}/{node}: shellcheck:\n{r.stdout}{r.stderr}"


def test_every_shell_template_is_checked() -> None:
    checked = {Path(f.path).name for _, _, f in _files(".sh")}
    checked |= {"supervisor.sh"} if (REPO / "templates" / "supervisor.sh.j2").exists() else set()
    shipped = {p.name.removesuffix(".j2") for p in (REPO / "templates").glob("*.sh.j2")}
    assert shipped <= checked, f"shell templates no test renders: {sorted(shipped - checked)}"


def test_shellcheck_refuses_a_broken_script(tmp_path: Path) -> None:
    _need("shellcheck", "shellcheck")
    path = tmp_path / "bad.sh"
    path.write_text("#!/bin/sh\nUNUSED=1\nrm -rf $1/*\n")
    r = _shellcheck(path)
    assert r.returncode != 0 and "SC2034" in r.stdout and "SC2086" in r.stdout


# --------------------------------------------------------------------------- apt and the dpkg lock


def _real_apt_on_held_lock(tmp: Path, extra: list[str]) -> subprocess.CompletedProcess[str]:
    """The real apt-get against a dpkg admin dir whose frontend lock this process holds (fcntl)."""
    import fcntl
    import os

    (tmp / "status").touch()
    fd = os.open(tmp / "lock-frontend", os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        return subprocess.run(["apt-get", "-o", f"Dir::State::status={tmp / 'status'}", *extra,
                               "install", "-y", "earlyoom"], capture_output=True, text=True, timeout=60)
    finally:
        os.close(fd)


def test_the_simulated_dpkg_lock_says_what_the_real_apt_get_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    """sparkctl_sim.debpkg's held lock, without and with DPkg::Lock::Timeout, beside the real apt-get's."""
    import os
    import re
    import time

    from sparkctl_sim import debpkg, nodestate

    _need("apt-get", "apt")
    if os.geteuid() != 0:
        pytest.skip("apt-get takes the dpkg lock as root only")
    state = tmp_path / "state.json"
    st = nodestate.default_state("spark-a")
    debpkg.hold_lock_at_first_boot(st, 3600, 100.0, time.time())
    nodestate.create(state, st)

    def norm(text: str, lock: str) -> str:  # the lock's path and its holder differ, nothing else
        return re.sub(r"process \d+ \([^)]*\)", "process PID (NAME)", text.replace(lock, "LOCK"))

    for extra, timeout in (([], 0), (["-o", "DPkg::Lock::Timeout=2"], 2)):
        real = _real_apt_on_held_lock(tmp_path, extra)
        assert debpkg._take_lock(str(state), timeout, quiet=0) is False
        sim = capsys.readouterr()
        assert real.returncode == 100 and "Could not get lock" in real.stderr + real.stdout
        real_lock = str(tmp_path / "lock-frontend")
        assert norm(sim.err, debpkg.LOCK_FRONTEND) == norm(real.stderr, real_lock), (extra, real.stderr)
        assert norm(sim.out, debpkg.LOCK_FRONTEND) == norm(real.stdout, real_lock), (extra, real.stdout)
