"""`fabric apply` and the node's other netplan files; the fabric ports reconfigured without `netplan apply`.

The playbook texts are NVIDIA's (sparkctl_sim.playbook cites the commits); the real
`netplan generate` judges what the merge of the files gives a port.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkctl.errors import ConfigError
from sparkctl.facts.netplanfiles import NETPLAN_FILES, command_for, describe_file, parse_netplan_files
from sparkctl.model.inventory import load_inventory
from sparkctl.model.resources import Roots
from sparkctl.ops.fabric import plan_apply
from sparkctl.plan import fabricplan
from sparkctl_sim import netplansim, playbook

REPO = Path(__file__).resolve().parent.parent
MIXED = """network:
  version: 2
  ethernets:
    enP7s7:
      dhcp4: true
    enp1s0f0np0:
      link-local: [ ipv4 ]
"""


def _inv():  # type: ignore[no-untyped-def]
    return load_inventory(REPO / "inventory.yaml")


def _fact_output(files: dict[str, str], unreadable: tuple[str, ...] = ()) -> str:
    out = []
    for name, text in files.items():
        b64 = base64.encodebytes(text.encode()).decode()
        out += [f"file {name}", b64.rstrip("\n"), "end"]
    out += [f"unreadable {n}" for n in unreadable]
    return "\n".join(out) + "\n"


def test_the_fact_reads_what_each_file_configures() -> None:
    text = _fact_output({"01-network-manager-all.yaml": netplansim.NM_GLOBAL, "40-cx7.yaml": playbook.static(1),
                         "90-NM-x.yaml": netplansim.nm_connection_yaml("x")}, ("50-secret.yaml",))
    got = {f.name: f for f in NETPLAN_FILES.parse(text)}
    assert got["01-network-manager-all.yaml"].interfaces == () and got["01-network-manager-all.yaml"].renderer == \
        "NetworkManager"
    assert got["40-cx7.yaml"].interfaces == ("enp1s0f1np1", "enP2p1s0f1np1")
    assert got["40-cx7.yaml"].sha256 == describe_file("x", playbook.static(1).encode()).sha256
    assert got["90-NM-x.yaml"].interfaces == ("enP7s7",)  # the name it matches; the id NM-x is a label
    assert got["50-secret.yaml"].error and not got["50-secret.yaml"].interfaces
    with pytest.raises(Exception, match="cut off"):
        parse_netplan_files("file a.yaml\nbmV0\n")


def test_the_fact_command_runs_on_a_directory(tmp_path: Path) -> None:
    d = tmp_path / "etc/netplan"
    d.mkdir(parents=True)
    (d / "40-cx7.yaml").write_text(playbook.LINK_LOCAL)
    (d / "notes.txt").write_text("not read")
    r = subprocess.run(["sh", "-c", "have() { command -v \"$1\" >/dev/null 2>&1; }; "
                        + command_for(str(tmp_path))],
                       capture_output=True, text=True, check=True)
    (f,) = parse_netplan_files(r.stdout)
    assert (f.name, f.interfaces) == ("40-cx7.yaml", ("enp1s0f0np0", "enp1s0f1np1"))


def test_a_playbook_file_is_taken_aside_and_nm_s_file_stays() -> None:
    inv = _inv()
    netplan = {"spark-a": (describe_file("40-cx7.yaml", playbook.LINK_LOCAL.encode()),
                           describe_file("90-NM-x.yaml", netplansim.nm_connection_yaml("x").encode()))}
    plan, _ = plan_apply(inv, Roots.make(env={}), None, None, netplan)
    aside = next(s for s in plan.steps if s.id == "netplan-aside")
    assert aside.nodes == ("spark-a",) and "/etc/netplan/40-cx7.yaml" in aside.summary
    assert "90-NM" not in aside.commands["spark-a"]
    apply = next(s for s in plan.steps if s.id == "apply").commands["spark-a"]
    assert "netplan apply" not in apply and "networkctl reconfigure" in apply
    assert apply.index("managed no") < apply.index("ip -4 addr flush") < apply.index("netplan generate")


def test_a_file_that_also_configures_the_management_link_is_refused_by_name() -> None:
    inv = _inv()
    netplan = {"spark-b": (describe_file("50-cloud-init.yaml", MIXED.encode()),)}
    with pytest.raises(ConfigError) as e:
        plan_apply(inv, Roots.make(env={}), None, None, netplan)
    msg = e.value.message
    assert "spark-b: /etc/netplan/50-cloud-init.yaml configures fabric port enp1s0f0np0 and also enP7s7" in msg
    assert e.value.hint and "file of its own" in e.value.hint
    unreadable = {"spark-b": parse_netplan_files("unreadable 40-cx7.yaml\n")}
    with pytest.raises(ConfigError, match="40-cx7.yaml cannot be read"):
        plan_apply(inv, Roots.make(env={}), None, None, unreadable)


NM_ON_A_PORT = """network:
  version: 2
  ethernets:
    NM-0b6e5c0e:
      renderer: NetworkManager
      match:
        name: "enp1s0f0np0"
      link-local: [ ipv4 ]
"""


def test_a_definition_that_matches_a_port_by_name_is_that_port_not_its_id() -> None:
    """NetworkManager's own netplan files (90-NM-<uuid>.yaml) match the device by name: such a file on a
    CX-7 port configures that port only, so it is taken aside, not refused for an interface "NM-..."."""
    plan, _ = plan_apply(_inv(), Roots.make(env={}), None, None,
                         {"spark-a": (describe_file("90-NM-0b6e5c0e.yaml", NM_ON_A_PORT.encode()),)})
    aside = next(s for s in plan.steps if s.id == "netplan-aside")
    assert "/etc/netplan/90-NM-0b6e5c0e.yaml" in aside.summary


@pytest.mark.parametrize("match, why", [
    ('name: "enp1s0f*"', 'enp1s0f*'),                 # a glob: it takes the port, and may take more
    ("driver: mlx5_core", "match:driver=mlx5_core"),  # every CX-7 port, by its driver
    ("driver: mlx5*", "match:driver=mlx5*"),
])
def test_a_definition_that_may_match_more_than_the_ports_is_refused_by_name(match: str, why: str) -> None:
    text = f"network:\n  version: 2\n  ethernets:\n    cx7:\n      match:\n        {match}\n      dhcp4: true\n"
    with pytest.raises(ConfigError) as e:
        plan_apply(_inv(), Roots.make(env={}), None, None, {"spark-a": (describe_file("70-cx7.yaml", text.encode()),)})
    assert "spark-a: /etc/netplan/70-cx7.yaml configures fabric port" in e.value.message
    assert f"and also {why}" in e.value.message


def test_a_definition_matched_by_another_driver_is_not_a_fabric_file() -> None:
    text = "network:\n  version: 2\n  ethernets:\n    lan:\n      match:\n        driver: r8169\n      dhcp4: true\n"
    netplan = {"spark-a": (describe_file("50-lan.yaml", text.encode()),)}
    plan, _ = plan_apply(_inv(), Roots.make(env={}), None, None, netplan)
    assert not any(s.id == "netplan-aside" for s in plan.steps)


def test_restore_reconfigures_the_ports_and_hands_them_back_to_network_manager() -> None:
    cmd = next(s for s in fabricplan.plan_fabric_restore(_inv()).steps if s.id == "restore").commands["spark-a"]
    assert "netplan apply" not in cmd and "networkctl reconfigure" in cmd and "managed yes" in cmd


# --------------------------------------------------------------------------- the real netplan generate


def _generate(tmp: Path, files: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    d = tmp / "etc/netplan"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text)
        (d / name).chmod(0o600)
    return subprocess.run(["netplan", "generate", "--root-dir", str(tmp)], capture_output=True, text=True,
                          timeout=120), tmp


def _fabric_file(node: str = "spark-a") -> str:
    inv = _inv()
    (f,) = [x for x in fabricplan.render_fabric(inv, Roots.make(env={})).files[node] if x.path.endswith(".yaml")]
    return f.text


@pytest.fixture
def real_netplan() -> None:
    if shutil.which("netplan") is None:
        pytest.skip("netplan (package netplan.io) is not installed")


def test_real_netplan_fabric_ports_are_optional_and_networkd_under_a_global_nm_renderer(
        real_netplan: None, tmp_path: Path) -> None:
    r, root = _generate(tmp_path, {"01-network-manager-all.yaml": netplansim.NM_GLOBAL,
                                   "60-sparkctl-fabric.yaml": _fabric_file()})
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    nets = sorted((root / "run/systemd/network").glob("*.network"))
    ports = yaml.safe_load(_fabric_file())["network"]["ethernets"]
    assert len(ports) == 4 and len(nets) == 4  # spark-a's cabled twins, networkd's despite the global renderer
    for n in nets:
        assert "RequiredForOnline=no" in n.read_text()  # optional: true: wait-online does not wait for it
    assert not list((root / "run/NetworkManager/system-connections").glob("*enp1s0f*"))


def test_real_netplan_merges_the_playbook_file_into_sparkctl_s_port(real_netplan: None, tmp_path: Path) -> None:
    """Why the playbook's file must go: the merge gives the port IPv4LL beside sparkctl's address."""
    r, root = _generate(tmp_path, {"40-cx7.yaml": playbook.LINK_LOCAL, "60-sparkctl-fabric.yaml": _fabric_file()})
    assert r.returncode == 0, r.stderr
    text = (root / "run/systemd/network/10-netplan-enp1s0f0np0.network").read_text()
    assert "LinkLocalAddressing=ipv4" in text and "Address=10.20." in text


def test_read_netplan_runs_the_fact_through_a_transport(tmp_path: Path) -> None:
    from dataclasses import replace

    from sparkctl.ops.fabric import read_netplan
    from sparkctl.transport.fake import LocalTransport

    inv = _inv()
    inv = type(inv)(**{**inv.__dict__, "nodes": tuple(replace(n, prefix=str(tmp_path / n.name), sudo=False)
                                                      for n in inv.nodes)})
    d = tmp_path / "spark-b/etc/netplan"
    d.mkdir(parents=True)
    (d / "40-cx7.yaml").write_text(playbook.static(1))
    with LocalTransport(inv.names, sudo=False) as tr:
        got = read_netplan(inv, tr)
    assert got["spark-a"] == () and [f.name for f in got["spark-b"]] == ["40-cx7.yaml"]
    plan, _ = plan_apply(inv, Roots.make(env={}), None, None, got)
    assert next(s for s in plan.steps if s.id == "netplan-aside").nodes == ("spark-b",)
