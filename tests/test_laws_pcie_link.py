"""The pcie_link law: captured lspci -vv output in, verdicts out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.facts.probes import NodeFacts
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
