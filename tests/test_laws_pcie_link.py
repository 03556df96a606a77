"""The pcie_link law: captured lspci -vv output in, verdicts out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.facts.pci import parse_lspci_link
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "spark"
INV = load_inventory(REPO / "inventory.yaml")
DS = resolve("ds41f-tp4-ring", Roots.make(env={})).profile


def pcie_verdicts(f: NodeFacts) -> list[laws.Verdict]:
    c = laws.Context(profile=DS, inventory=INV, nodes=(f.node,), facts={f.node: f})
    law = laws.by_id("pcie_link")
    assert law is not None
    return law.check(c)


@pytest.mark.parametrize("fixture,status", [
    ("lspci-vvv-lnk-healthy.txt", "ok"),
    ("lspci-vv-degraded-tabs-other-machine.txt", "fail"),
    ("lspci-vv-degraded-block-other-machine.txt", "fail"),
])
def test_captured_links_are_judged_against_their_maximum(fixture: str, status: str) -> None:
    link = parse_lspci_link((FIX / fixture).read_text(), "0000:01:00.0")
    (v,) = pcie_verdicts(NodeFacts(node="spark-a", pcie={"0000:01:00.0": link}))
    assert v.status == status and v.subject == "0000:01:00.0"
    if status == "fail":
        assert "AC" in v.fix


def test_an_unreadable_link_fails_and_no_link_read_is_skipped() -> None:
    (bad,) = pcie_verdicts(NodeFacts(node="spark-a", unreadable={"pcie.0000:01:00.0": "no LnkSta line"}))
    assert bad.status == "fail" and bad.subject == "0000:01:00.0"
    (none,) = pcie_verdicts(NodeFacts(node="spark-a"))
    assert none.status == "skip"


# --- what the slot can give (issue #18 item 5: the GX10's two-lane root port) -------------------

GX10_CX7 = (FIX / "lspci-vv-gx10-cx7-x2-constructed.txt").read_text()
GX10_ROOT = (FIX / "lspci-vv-gx10-rootport-x2-constructed.txt").read_text()
SPARK_ROOT = (FIX / "lspci-vv-spark-rootport-x4-constructed.txt").read_text()


def with_upstream(endpoint: str, upstream_bdf: str, upstream: str) -> str:
    """The pcie fact's section: the function's block, then ``upstream BDF`` and the port's block."""
    return endpoint + f"upstream {upstream_bdf}\n" + upstream


def test_a_function_behind_a_two_lane_root_port_passes_and_the_verdict_names_the_port() -> None:
    link = parse_lspci_link(with_upstream(GX10_CX7, "0002:00:00.0", GX10_ROOT), "0002:01:00.0")
    assert (link.slot, link.slot_gts, link.slot_width, link.downgraded) == ("0002:00:00.0", 32.0, 2, True)
    (v,) = pcie_verdicts(NodeFacts(node="spark-c", pcie={"0002:01:00.0": link}))
    assert v.status == "ok", v
    assert v.observed == "32 GT/s x2" and "0002:00:00.0" in v.expected and "x2" in v.expected, v


def test_the_same_downgrade_under_a_four_lane_port_still_fails() -> None:
    link = parse_lspci_link(with_upstream(GX10_CX7, "0000:00:00.0", SPARK_ROOT), "0002:01:00.0")
    assert link.slot_width == 4
    (v,) = pcie_verdicts(NodeFacts(node="spark-a", pcie={"0002:01:00.0": link}))
    assert v.status == "fail" and v.observed == "32 GT/s x2" and v.expected.startswith("32 GT/s x4"), v
    assert "AC" in v.fix


@pytest.mark.parametrize("upstream", ["", "upstream 0002:00:00.0\n\tCapabilities: <access denied>\n"])
def test_without_the_slot_a_downgrade_is_judged_against_the_functions_own_lnkcap(upstream: str) -> None:
    link = parse_lspci_link(GX10_CX7 + upstream, "0002:01:00.0")
    assert link.slot is None
    (v,) = pcie_verdicts(NodeFacts(node="spark-c", pcie={"0002:01:00.0": link}))
    assert v.status == "fail" and "upstream port was not read" in v.fix, v


def test_the_facts_command_finds_the_upstream_port_with_real_sh(tmp_path: Path) -> None:
    """The fact's shell (POSIX sh, the prelude's `have`) against an lspci that answers from the fixtures."""
    import subprocess

    from sparkctl.facts import pci
    from sparkctl.facts.batch import PRELUDE
    from sparkctl.facts.registry import ScriptContext

    answers = {("-PP", "-D", "-s", "0002:01:00.0"): FIX / "lspci-PP-D-gx10-cx7-constructed.txt",
               ("-vv", "-s", "0002:01:00.0"): FIX / "lspci-vv-gx10-cx7-x2-constructed.txt",
               ("-vv", "-s", "0002:00:00.0"): FIX / "lspci-vv-gx10-rootport-x2-constructed.txt"}
    fake = tmp_path / "lspci"
    fake.write_text("#!/bin/sh\ncase \"$*\" in\n" + "".join(
        f"  '{' '.join(k)}') cat '{v}';;\n" for k, v in answers.items()) + "  *) exit 1;;\nesac\n")
    fake.chmod(0o755)
    cmd = pci.PCIE.command(ScriptContext(INV.nodes[0]), "0002:01:00.0")
    r = subprocess.run(["sh", "-c", PRELUDE + cmd], capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    link = parse_lspci_link(r.stdout, "0002:01:00.0")
    assert (link.slot, link.slot_width, link.sta_width) == ("0002:00:00.0", 2, 2)
    (v,) = pcie_verdicts(NodeFacts(node="spark-c", pcie={"0002:01:00.0": link}))
    assert v.status == "ok", v


@pytest.mark.parametrize("gbps,status", [(55.2, "ok"), (13.4, "fail")])
def test_ac_cycle_expects_of_a_two_lane_slot_only_what_it_can_carry(gbps: float, status: str) -> None:
    """The GX10's x2 function measures about half a Spark FE's (thread 367853): not a stale link; 13 Gb/s is."""
    link = parse_lspci_link(with_upstream(GX10_CX7, "0002:00:00.0", GX10_ROOT), "0002:01:00.0")
    lk = next(lk for lk in INV.links if lk.a.netdev.startswith("enP2p1s0f0"))
    node, peer = lk.a.node, lk.b.node
    facts = {node: NodeFacts(node=node, pcie={"0002:01:00.0": link}), peer: NodeFacts(node=peer)}
    probe = laws.LinkProbe(node, lk.a.netdev, peer, lk.b.address, True, gbps)
    c = laws.Context(profile=DS, inventory=INV, nodes=(node, peer), facts=facts, link_probes=(probe,))
    law = laws.by_id("ac_cycle")
    assert law is not None
    v = {x.node: x for x in law.check(c)}
    assert v[node].status == status and v[peer].status == status, v
    if status == "fail":
        assert "what its PCIe slot allows" in v[node].observed
    # a full slot keeps the 60 Gb/s floor
    full = dict(facts, **{node: NodeFacts(node=node)})
    c = laws.Context(profile=DS, inventory=INV, nodes=(node, peer), facts=full, link_probes=(probe,))
    assert {x.status for x in law.check(c)} == {"fail"}
