"""Rendering: golden files, quoting of hostile values, secrets, and purity."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkctl.errors import ProfileError
from sparkctl.model.inventory import load_inventory, loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import MASK, render

from helpers import INVENTORY_FOR

GOLDEN = Path(__file__).parent / "golden"
FIX = Path(__file__).parent / "fixtures"


def test_every_bundled_profile_has_a_golden_inventory() -> None:
    assert set(Roots.make(env={}).all_profiles()) == set(INVENTORY_FOR)


@pytest.mark.parametrize("profile", sorted(INVENTORY_FOR))
def test_rendering_matches_golden_files(profile: str, repo: Path, update_golden: bool) -> None:
    roots = Roots.make(env={})
    inv = load_inventory(repo / INVENTORY_FOR[profile])
    inv = type(inv)(**{**inv.__dict__, "file": INVENTORY_FOR[profile]})  # stable text in goldens
    rendering = render(resolve(profile, roots), inv, roots, secrets={})
    got = {f"{node}{path}": f.text for node, files in rendering.files.items() for path, f in files.items()}
    base = GOLDEN / profile
    if update_golden:
        shutil.rmtree(base, ignore_errors=True)
        for rel, text in got.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    want = {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want), "file set changed: rerun with --update-golden and review the diff"
    for rel in got:
        assert got[rel] == want[rel], f"{profile}: {rel} differs from its golden file (pytest --update-golden)"


def test_ring_env_has_ring_nccl_settings_and_both_twins(repo: Path) -> None:
    roots = Roots.make(env={})
    rendering = render(resolve("ds41f-tp4-ring", roots), load_inventory(repo / "inventory.yaml"), roots)
    env = dict(line.split("=", 1) for line in rendering.files["spark-b"]["/etc/sparkctl/engine.env"].text.splitlines()
               if line and not line.startswith("#"))
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_IB_MERGE_NICS"] == "0" and env["NCCL_NET_PLUGIN"] == "none"
    assert env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    assert set(env["NCCL_IB_HCA"].lstrip("=").split(",")) == {"rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"}
    assert env["NODE_RANK"] == "1" and env["WORLD_SIZE"] == "4" and env["MASTER_ADDR"] == "10.20.0.1"
    assert env["VLLM_HOST_IP"] == "10.20.2.2"  # spark-b's own p0 twin-0 address
    assert "NCCL_IB_GID_INDEX" not in env  # resolved per node at launch, never a literal
    pair = render(resolve("vllm-tp2-fallback", roots), load_inventory(FIX / "inv-pair.yaml"), roots)
    penv = pair.files["spark-b"]["/etc/sparkctl/engine.env"].text
    assert "NCCL_IB_MERGE_NICS=1" in penv and "NCCL_ALGO" not in penv
    assert "--headless" in pair.files["spark-b"]["/opt/sparkctl/launch.sh"].text
    assert "--headless" not in pair.files["spark-a"]["/opt/sparkctl/launch.sh"].text


def test_modes_and_hash_stability(repo: Path) -> None:
    roots = Roots.make(env={})
    inv = load_inventory(repo / "inventory.yaml")
    a = render(resolve("ds41f-tp4-ring", roots), inv, roots)
    b = render(resolve("ds41f-tp4-ring", roots), inv, roots)
    assert a.node_hash("spark-a") == b.node_hash("spark-a")
    assert a.files["spark-a"]["/etc/sparkctl/engine.env"].mode == 0o600
    assert a.files["spark-a"]["/opt/sparkctl/launch.sh"].mode == 0o755
    c = render(resolve("ds41f-tp4-ring", roots, ["laws.clock_cap_mhz=2100"]), inv, roots)
    assert c.node_hash("spark-a") != a.node_hash("spark-a")


HOSTILE = ["$(touch CANARY)", "; touch CANARY", "`touch CANARY`", "a'b\"c\\d", "x\ny && touch CANARY", "../../etc/passwd"]


def _hostile_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    args = "".join(f"\n    - {json_str(a)}" for a in HOSTILE)
    (root / "profiles" / "evil.yaml").write_text(textwrap.dedent("""\
        extends: tiny-llamacpp
        engine:
          binary: "sh -c 'for a; do printf \\"<%s>\\\\n\\" \\"$a\\"; done; printf \\"EVIL=<%s>\\\\n\\" \\"$EVIL\\"' argv0"
          env:
            EVIL: "$(touch CANARY); `touch CANARY`"
          args:""") + args + "\n" + textwrap.dedent("""\
        model:
          weights_path: "/srv/$(touch CANARY)/m.gguf"
        """))
    return root


def json_str(s: str) -> str:
    import json

    return json.dumps(s)


def test_hostile_profile_values_come_out_inert(tmp_path: Path) -> None:
    root = _hostile_root(tmp_path)
    node_root = tmp_path / "node"
    inv = loads_inventory(f"nodes: [{{name: spark-a, host: h, prefix: {node_root}}}]\n", "inv.yaml")
    roots = Roots.make(root=str(root), env={})
    rendering = render(resolve("evil", roots), inv, roots)
    for f in rendering.files["spark-a"].values():
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_text(f.text)
    launch = next(f.path for f in rendering.files["spark-a"].values() if f.role == "launch")
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run(["sh", launch], cwd=work, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.rglob("CANARY")), "a hostile value ran a command"
    for a in HOSTILE:
        assert f"<{a}>" in r.stdout  # every argument arrives byte for byte
    assert "EVIL=<$(touch CANARY); `touch CANARY`>" in r.stdout
    assert f"<{node_root}/srv/$(touch CANARY)/m.gguf>" in r.stdout


def test_newline_in_env_value_is_refused(tmp_path: Path) -> None:
    from sparkctl.errors import ProfileError

    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "nl.yaml").write_text('extends: tiny-llamacpp\nengine:\n  env: {X: "a\\nB=1"}\n')
    roots = Roots.make(root=str(root), env={})
    with pytest.raises(ProfileError, match="newlines") as exc:
        render(resolve("nl", roots), loads_inventory("nodes: [{name: spark-a, host: h}]\n"), roots)
    assert exc.value.ref.line == 3


def _ipv4_gid(ip: str) -> str:
    o = [int(x) for x in ip.split(".")]
    return f"0000:0000:0000:0000:0000:ffff:{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"


def _gid_sysfs(base: Path, devs: dict[str, int], addr: dict[str, str], link_local: bool = False) -> None:
    """A GID table per device: 0/1 IPv6 link-local, the fabric address's v1/v2 at idx-1/idx, and
    with ``link_local`` an IPv4 link-local 169.254.x.y pair at 2/3 (acquired before the fabric one)."""
    for dev, idx in devs.items():
        port = base / "class/infiniband" / dev / "ports/1"
        (port / "gids").mkdir(parents=True)
        (port / "gid_attrs/types").mkdir(parents=True)
        for n in range(8):
            (port / "gids" / str(n)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
        (port / "gids/0").write_text("fe80:0000:0000:0000:4ebb:47ff:fee8:9f39\n")
        (port / "gid_attrs/types/0").write_text("IB/RoCE v1\n")
        (port / "gid_attrs/types/1").write_text("RoCE v2\n")
        (port / "gids/1").write_text("fe80:0000:0000:0000:4ebb:47ff:fee8:9f39\n")
        if link_local:
            for n, kind in ((2, "IB/RoCE v1"), (3, "RoCE v2")):
                (port / "gids" / str(n)).write_text(_ipv4_gid("169.254.23.7") + "\n")
                (port / "gid_attrs/types" / str(n)).write_text(kind + "\n")
        (port / "gids" / str(idx - 1)).write_text(_ipv4_gid(addr[dev]) + "\n")
        (port / "gid_attrs/types" / str(idx - 1)).write_text("IB/RoCE v1\n")
        (port / "gids" / str(idx)).write_text(_ipv4_gid(addr[dev]) + "\n")
        (port / "gid_attrs/types" / str(idx)).write_text("RoCE v2\n")


ALL4 = ("rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1")
NO_WAIT = ("serve.fabric_wait_s=0",)


@pytest.mark.parametrize("gids,link_local,code", [
    (dict.fromkeys(ALL4, 3), False, 0),
    (dict.fromkeys(ALL4, 4), False, 0),
    (dict.fromkeys(ALL4, 5), True, 0),  # a link-local IPv4 GID at 3 (v2) before the fabric one: 5, not 3
    ({"rocep1s0f0": 3, "roceP2p1s0f0": 4, "rocep1s0f1": 3, "roceP2p1s0f1": 3}, False, 78),
    ({"rocep1s0f0": 3, "roceP2p1s0f0": 3}, False, 78),
])
def test_launch_resolves_the_gid_index_per_node(tmp_path: Path, repo: Path, gids: dict[str, int],
                                                link_local: bool, code: int) -> None:
    text = (repo / "inventory.yaml").read_text().replace(
        "{name: spark-b, host: 192.168.1.102}",
        f"{{name: spark-b, host: 192.168.1.102, prefix: {tmp_path}/node, sysfs_root: {tmp_path}/sys}}")
    inv = loads_inventory(text, "inv.yaml")
    roots = Roots.make(env={})
    # no wait: a GID missing here stays missing (the wait has its own tests below)
    rendering = render(resolve("ds41f-tp4-ring", roots, NO_WAIT), inv, roots)
    for f in rendering.files["spark-b"].values():
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_text(f.text)
    addr = {e.rdma: e.address for e in inv.endpoints("spark-b")}
    _gid_sysfs(tmp_path / "sys", gids, addr, link_local)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"  # a stand-in that shows what the real docker would be given
    docker.write_text('#!/bin/sh\necho "GID=$NCCL_IB_GID_INDEX"\nfor a; do echo "arg=$a"; done\n')
    docker.chmod(0o755)
    launch = f"{tmp_path}/node/opt/sparkctl/launch.sh"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    r = subprocess.run(["sh", launch], capture_output=True, text=True, env=env, timeout=20)
    assert r.returncode == code, r.stderr
    if code == 0:
        want = str(next(iter(gids.values())))
        assert f"GID={want}" in r.stdout
        for flag in ("--network", "--ipc", "--device", "/dev/infiniband", "--ulimit", "memlock=-1"):
            assert f"arg={flag}" in r.stdout
    else:
        assert "sparkctl:" in r.stderr


def test_launch_refuses_a_port_whose_only_ipv4_gid_is_another_address(tmp_path: Path, repo: Path) -> None:
    """The old rule (first RoCE v2 IPv4-mapped GID) took any address; the fabric's own is required."""
    text = (repo / "inventory.yaml").read_text().replace(
        "{name: spark-b, host: 192.168.1.102}",
        f"{{name: spark-b, host: 192.168.1.102, prefix: {tmp_path}/node, sysfs_root: {tmp_path}/sys}}")
    inv = loads_inventory(text, "inv.yaml")
    roots = Roots.make(env={})
    for f in render(resolve("ds41f-tp4-ring", roots, NO_WAIT), inv, roots).files["spark-b"].values():
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_text(f.text)
    _gid_sysfs(tmp_path / "sys", dict.fromkeys(ALL4, 3), dict.fromkeys(ALL4, "169.254.9.9"))
    r = subprocess.run(["sh", f"{tmp_path}/node/opt/sparkctl/launch.sh"], capture_output=True, text=True,
                       timeout=20, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.returncode == 78
    assert "no RoCEv2 GID for the fabric address 10.20." in r.stderr


def _launch_on_b(tmp_path: Path, repo: Path, wait_s: int) -> tuple[str, dict[str, str], dict[str, str]]:
    """spark-b's rendered files under tmp_path, a docker stand-in on PATH: (launch, env, addresses)."""
    text = (repo / "inventory.yaml").read_text().replace(
        "{name: spark-b, host: 192.168.1.102}",
        f"{{name: spark-b, host: 192.168.1.102, prefix: {tmp_path}/node, sysfs_root: {tmp_path}/sys}}")
    inv = loads_inventory(text, "inv.yaml")
    roots = Roots.make(env={})
    sets = ("serve.persist=true", "serve.restart_interval_s=86400", f"serve.fabric_wait_s={wait_s}")
    for f in render(resolve("ds41f-tp4-ring", roots, sets), inv, roots
                    ).files["spark-b"].values():
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_text(f.text)
    (tmp_path / "bin").mkdir()
    docker = tmp_path / "bin" / "docker"
    docker.write_text('#!/bin/sh\necho "GID=$NCCL_IB_GID_INDEX"\n')
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}
    return f"{tmp_path}/node/opt/sparkctl/launch.sh", env, {e.rdma: e.address for e in inv.endpoints("spark-b")}


def test_launch_waits_for_a_gid_that_appears_when_the_neighbour_comes_up(tmp_path: Path, repo: Path) -> None:
    """Two ports have their GIDs, two do not yet (their neighbour boots later): the launch says what
    it waits for, and goes on once the GIDs appear, within serve.fabric_wait_s."""
    launch, env, addr = _launch_on_b(tmp_path, repo, 600)
    early = dict.fromkeys(ALL4[:2], 3)
    _gid_sysfs(tmp_path / "sys", early, addr)
    proc = subprocess.Popen(["sh", launch], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the launch reports its wait
        assert "waiting for the RoCEv2 GID of the fabric address" in first, first
        _gid_sysfs(tmp_path / "sys", dict.fromkeys(ALL4[2:], 3), addr)  # the neighbour's end has carrier now
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "GID=3" in out


def test_launch_stops_waiting_after_fabric_wait_s_and_exits_78(tmp_path: Path, repo: Path) -> None:
    launch, env, addr = _launch_on_b(tmp_path, repo, 4)
    _gid_sysfs(tmp_path / "sys", dict.fromkeys(ALL4[:3], 3), addr)
    r = subprocess.run(["sh", launch], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 78, r.stderr
    assert "waiting for the RoCEv2 GID" in r.stdout and "on roceP2p1s0f1" in r.stdout
    assert "after waiting 4 s (serve.fabric_wait_s=4)" in r.stderr, r.stderr
    assert "GID=" not in r.stdout  # docker never ran


def test_a_persisted_ring_whose_wait_outlasts_the_start_window_is_refused(repo: Path) -> None:
    roots = Roots.make(env={})
    inv = load_inventory(repo / "inventory.yaml")
    sets = ("serve.persist=true", "serve.restart_interval_s=600", "serve.restart_delay_s=1")
    render(resolve("ds41f-tp4-ring", roots, (*sets, "serve.fabric_wait_s=190")), inv, roots)  # 3 x 191 < 600
    with pytest.raises(ProfileError, match="restart forever") as exc:
        render(resolve("ds41f-tp4-ring", roots, (*sets, "serve.fabric_wait_s=200")), inv, roots)
    assert exc.value.ref is not None and exc.value.ref.key == "serve.fabric_wait_s"
    # one box: no fabric, no wait, no refusal
    render(resolve("llamacpp-1box", roots, (*sets, "serve.fabric_wait_s=600")),
           load_inventory(repo / INVENTORY_FOR["llamacpp-1box"]), roots)


def test_secrets_only_in_0600_files_and_masked_unless_revealed(repo: Path, tmp_path: Path, sparkctl,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "sec.yaml").write_text("extends: tiny-llamacpp\nengine: {secret_env: [HF_TOKEN]}\n")
    roots = Roots.make(root=str(root), env={})
    inv = load_inventory(repo / "inventory.yaml")
    secret = "hf_SECRETVALUE123"
    shown = render(resolve("sec", roots), inv, roots, secrets={"HF_TOKEN": secret})
    real = render(resolve("sec", roots), inv, roots, secrets={"HF_TOKEN": secret}, reveal_secrets=True)
    for files, visible in ((shown, False), (real, True)):
        for f in files.files["spark-a"].values():
            if secret in f.text or f"HF_TOKEN={MASK}" in f.text:
                assert f.mode == 0o600 and f.role == "env"
        assert (secret in files.files["spark-a"]["/etc/sparkctl/engine.env"].text) is visible
    monkeypatch.setenv("HF_TOKEN", secret)
    for cmd in (["render", "sec"], ["plan", "up", "sec", "--assume-fresh"], ["render", "sec", "--json"], ["show", "sec"]):
        r = sparkctl("--root", str(root), "-i", str(repo / "inventory.yaml"), *cmd)
        assert r.code == 0, r.err
        assert secret not in r.out + r.err
    out = tmp_path / "out"
    r = sparkctl("--root", str(root), "-i", str(repo / "inventory.yaml"), "render", "sec", "--out", str(out))
    env_file = out / "spark-a" / "etc/sparkctl/engine.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and secret not in env_file.read_text()
    monkeypatch.delenv("HF_TOKEN")
    r = sparkctl("--root", str(root), "-i", str(repo / "inventory.yaml"), "render", "sec")
    assert r.code == 2 and "HF_TOKEN is not set" in r.err


def test_tp_size_and_ring_subsets_are_checked(repo: Path, tmp_path: Path, sparkctl) -> None:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "tp3.yaml").write_text("extends: ds41f-tp4-ring\ntopology:\n  tp_size: 3\n")
    (root / "profiles" / "across.yaml").write_text("extends: vllm-tp2-fallback\ntopology:\n  nodes: [spark-a, spark-c]\n")
    (root / "profiles" / "adjacent.yaml").write_text("extends: vllm-tp2-fallback\ntopology:\n  nodes: [spark-b, spark-c]\n")
    (root / "profiles" / "halves.yaml").write_text("extends: vllm-tp2-fallback\ntopology:\n  replicas: 2\n")
    inv = str(repo / "inventory.yaml")
    r = sparkctl("--root", str(root), "plan", "up", "tp3", "--assume-fresh", "-i", inv)
    assert r.code == 2 and f"{root}/profiles/tp3.yaml:3: topology.tp_size:" in r.err and "needs 3 nodes" in r.err
    r = sparkctl("--root", str(root), "plan", "up", "across", "--assume-fresh", "-i", inv)
    assert r.code == 2 and "breaks the ring" in r.err and "across.yaml:3: topology.nodes" in r.err
    r = sparkctl("--root", str(root), "plan", "up", "adjacent", "--assume-fresh", "-i", inv)
    assert r.code == 0 and "spark-b=rank 0" in r.out and "spark-c=rank 1" in r.out
    r = sparkctl("--root", str(root), "plan", "up", "halves", "--assume-fresh", "-i", inv, "--json")
    assert r.code == 0
    import json

    ranks = json.loads(r.out)["ranks"]
    assert [(x["node"], x["replica"], x["rank"]) for x in ranks] == [
        ("spark-a", 0, 0), ("spark-b", 0, 1), ("spark-c", 1, 0), ("spark-d", 1, 1)]
    assert ranks[3]["master_addr"] == "10.20.4.3"


def test_plan_cli_orders_ranks_by_the_ring(repo: Path, sparkctl) -> None:
    r = sparkctl("plan", "up", "ds41f-tp4-ring", "--assume-fresh", "-i", str(repo / "inventory.yaml"))
    assert r.code == 0
    assert "spark-a=rank 0" in r.out and "spark-d=rank 3" in r.out
    main = r.out.split("  branch ")[0]  # the steps, not the failure branches
    phases = [m.group(1) for m in re.finditer(r"^\s+\d+\. (\S+)", main, re.M)]
    assert phases[:5] == ["lock", "check", "clock", "record-start", "stop-stale"]
    assert phases[-3:] == ["ready", "persist", "record"]
    starts = [line for line in main.splitlines() if re.match(r"\s+\d+\. start ", line)]
    assert "spark-b" in starts[0] and "head" in starts[1]  # workers first for ds41f


def test_pure_modules_import_no_ssh_library() -> None:
    code = ("import sys, sparkctl.plan.render, sparkctl.model.profiles, sparkctl.model.inventory, sparkctl.model.layout,"
            " sparkctl.plan.planner, sparkctl.facts.batch, sparkctl.facts.fabric, sparkctl.plan.laws;"
            "bad = [m for m in ('paramiko', 'fabric', 'invoke', 'socket_ssh') if m in sys.modules];"
            "print(','.join(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == ""
