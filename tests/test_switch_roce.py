"""switch.roce: the lossless RoCE class of the operator's switch, marked on NCCL's traffic (issue 22).

NCCL_IB_TC is the GRH traffic class byte (for RoCE v2 the IP TOS byte: DSCP in its top six bits),
NCCL_IB_SL the service level (the 802.1p priority); NCCL src/transport/net_ib.cc reads both."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.errors import InventoryError
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import render

from helpers import REPO

ROOTS = Roots.make(env={})
ENV = "/etc/sparkctl/engine.env"


def _env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _switch_inventory(tmp_path: Path, roce: str) -> Path:
    lines = (REPO / "inventory-switch.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  mtu_bytes:"))
    text = "\n".join([*lines[:at + 1], f"  roce: {roce}", *lines[at + 1:]]) + "\n"
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return path


def test_the_switch_roce_class_reaches_every_rank_of_a_switched_stack(tmp_path: Path) -> None:
    inv = load_inventory(_switch_inventory(tmp_path, "{dscp: 26, priority: 3}"))
    assert dict(inv.nccl_qos) == {"NCCL_IB_TC": 104, "NCCL_IB_SL": 3}
    rendering = render(resolve("tensorfold-tp4x2-switch", ROOTS), inv, ROOTS, secrets={})
    for node in inv.names:
        env = _env(rendering.files[node][ENV].text)
        assert env["NCCL_IB_TC"] == "104" and env["NCCL_IB_SL"] == "3", node


def test_without_roce_nothing_is_marked_and_a_ring_never_is(tmp_path: Path) -> None:
    plain = render(resolve("tensorfold-tp4x2-switch", ROOTS), load_inventory(REPO / "inventory-switch.yaml"), ROOTS)
    assert "NCCL_IB_TC" not in plain.files["spark-01"][ENV].text
    ring = render(resolve("ds41f-tp4-ring", ROOTS), load_inventory(REPO / "inventory.yaml"), ROOTS)
    assert "NCCL_IB_TC" not in ring.files["spark-b"][ENV].text and "NCCL_IB_SL" not in ring.files["spark-b"][ENV].text
    only_dscp = load_inventory(_switch_inventory(tmp_path, "{dscp: 46}"))
    assert only_dscp.nccl_qos == (("NCCL_IB_TC", 184),)


@pytest.mark.parametrize("roce,key", [("{dscp: 64}", "switch.roce.dscp"), ("{priority: 8}", "switch.roce.priority"),
                                      ("{dscp: 26, pfc: true}", "switch.roce.pfc")])
def test_a_bad_roce_value_names_the_file_line_and_key(tmp_path: Path, roce: str, key: str) -> None:
    path = _switch_inventory(tmp_path, roce)
    with pytest.raises(InventoryError) as exc:
        load_inventory(path)
    err = exc.value
    assert err.ref is not None and err.ref.file == str(path) and err.ref.key == key
    assert err.ref.line == path.read_text().splitlines().index(f"  roce: {roce}") + 1
