"""The `check` table on an 80-column terminal shows every verdict whole (issue 18, item 12).

Rendered with rich at width 80, as an operator's terminal has it; a cell may
wrap onto several lines (and a long word fold), never be cut. The test reads the
table back column by column (the header gives each column's start), so a
wrapped cell is read as the operator reads it, top to bottom.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest
from rich.console import Console

from sparkctl.cli import base
from sparkctl.plan.laws import Verdict

# long verdicts as the laws word them (sparkctl/plan/laws/: memory, hardware, nccl, images, fabric)
LONG = {
    "memory": ("ok", "MemFree 114.3 GiB (MemAvailable 118.2 GiB)"),
    "pcie_link": ("ok", "CX-7 0000:01:00.0 LnkSta 32GT/s x2 = LnkCap of the root port 0000:00:01.0 (x2)"),
    "nccl_version": ("ok", "NCCL 2.30.7 (loaded: /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2)"),
    "image_identity": ("fail", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
    "fabric": ("warn", "enp1s0f0np0 10.20.0.1/30 GID 3 RoCE v2 and 169.254.12.7/16 from /etc/netplan/40-cx7.yaml"),
    "page_size": ("waived", "4 KiB pages (stock kernel 6.11.0-1016-nvidia), waived: stock 4 KiB kernel"),
}


@dataclass(frozen=True)
class Report:
    nodes: tuple[str, ...]
    verdicts: tuple[Verdict, ...]


def _report(nodes: tuple[str, ...]) -> Report:
    vs = []
    for i, n in enumerate(nodes):
        for law, (status, seen) in LONG.items():
            # each node its own text: a cell that showed its neighbour's would not pass
            vs.append(Verdict(law, n, status, f"{seen} on {n}#{i}", "as the law says", fix=f"fix {law} on {n}"))
    return Report(nodes, tuple(vs))


def _render(report: Report, monkeypatch: pytest.MonkeyPatch) -> str:
    buf = io.StringIO()
    # as the operator's terminal: 80 columns (COLUMNS=80), no colour codes to read around
    monkeypatch.setattr(base, "out", Console(file=buf, width=80, highlight=False, soft_wrap=True,
                                             color_system=None))
    base.print_verdicts(report)
    return buf.getvalue()


def _columns(table: list[str], names: list[str]) -> dict[str, str]:
    """Each column's text, top to bottom, with every blank removed (wrapping and folding undone)."""
    header = table[0]
    starts = [header.index(n) for n in names]
    ends = starts[1:] + [None]
    return {n: "".join("".join(line[a:b].split()) for line in table[1:]) for n, a, b in zip(names, starts, ends)}


def _squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("nodes", [("spark-a", "spark-b"), ("spark-a", "spark-b", "spark-c", "spark-d")],
                         ids=["pair", "ring"])
def test_every_verdict_whole_on_80_columns(nodes: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    report = _report(nodes)
    text = _render(report, monkeypatch)
    lines = text.splitlines()
    table = lines[:lines.index("")] if "" in lines else lines
    assert all(len(line) <= 80 for line in table), [line for line in table if len(line) > 80]
    cols = _columns(table, ["law", *nodes])
    assert all(_squeeze(law) in cols["law"] for law in LONG)
    for v in report.verdicts:
        assert _squeeze(f"{v.status} {v.observed}") in cols[v.node], (v.node, v.observed, text)
    below = " ".join(text.split())  # the list of non-ok verdicts under the table: the terminal wraps its lines
    for v in report.verdicts:
        if v.status != "ok":
            assert f"{v.status} {v.law} {v.node}: {v.observed} (expected {v.expected})" in below
            assert f"fix: {v.fix}" in below
