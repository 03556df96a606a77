"""The page_cache law: captured /proc/meminfo files in, verdicts and the remedy out; up's drop-caches step."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.facts.nodefacts import EngineProc, NodeFacts
from sparkctl.facts.system import parse_meminfo
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws
from sparkctl.plan.laws.memory import drop_caches_if_short_command

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "spark"
INV = load_inventory(REPO / "inventory.yaml")
ROOTS = Roots.make(env={})


def facts_from(fixture: str, node: str = "spark-a") -> NodeFacts:
    m = parse_meminfo((FIX / fixture).read_text())
    return NodeFacts(node=node, mem_total_kib=m.total_kib, mem_available_kib=m.available_kib,
                     mem_free_kib=m.free_kib, engines=[])


def verdicts(profile: str, f: NodeFacts) -> list[laws.Verdict]:
    p = resolve(profile, ROOTS).profile
    c = laws.Context(profile=p, inventory=INV, nodes=(f.node,), facts={f.node: f})
    return [v for v in laws.judge(c) if v.law == "page_cache"]


@pytest.mark.parametrize("fixture,status", [
    ("meminfo-head.txt", "fail"),          # MemFree 3.0 GiB, MemAvailable 38 GiB: the cache holds the rest
    ("meminfo-head-3-lines.txt", "fail"),  # MemFree 43 GiB, MemAvailable 110 GiB: 0.88 x 121.7 GiB not free
])
def test_captured_meminfo_with_a_full_page_cache_fails(fixture: str, status: str) -> None:
    (v,) = verdicts("ds41f-tp4-ring", facts_from(fixture))
    assert v.status == status and "MemFree" in v.observed and "drop_caches" in v.fix


def test_enough_free_memory_passes_and_a_running_engine_or_llamacpp_is_skipped() -> None:
    f = facts_from("meminfo-head-3-lines.txt")
    (ok,) = verdicts("ds41f-tp4-ring", replace(f, mem_free_kib=f.mem_total_kib - 1000))
    assert ok.status == "ok"
    (busy,) = verdicts("ds41f-tp4-ring", replace(f, engines=[EngineProc(1, "vllm serve")]))
    assert busy.status == "skip"
    (native,) = verdicts("llamacpp-1box", f)
    assert native.status == "skip"


def test_the_remedy_syncs_then_drops_all_caches_through_the_nodes_proc() -> None:
    p = resolve("ds41f-tp4-ring", ROOTS).profile
    f = facts_from("meminfo-head.txt")
    c = laws.Context(profile=p, inventory=INV, nodes=("spark-a",), facts={"spark-a": f})
    law = laws.by_id("page_cache")
    assert law is not None and law.remedy is not None
    r = law.remedy(c, law.check(c))
    assert r is not None and r.safe
    assert r.commands["spark-a"] == ("sync", "echo 3 > /proc/sys/vm/drop_caches")


@pytest.mark.parametrize("free_kib,dropped", [(3_139_656, True), (120_000_000, False)])
def test_ups_step_drops_only_where_memfree_is_short(tmp_path: Path, free_kib: int, dropped: bool) -> None:
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    text = (FIX / "meminfo-head.txt").read_text()
    text = "\n".join(f"MemFree:        {free_kib} kB" if ln.startswith("MemFree:") else ln for ln in text.splitlines())
    (proc / "meminfo").write_text(text + "\n")
    out = subprocess.run(["sh", "-c", drop_caches_if_short_command(0.85, str(proc))], capture_output=True,
                         text=True, check=True).stdout
    assert (proc / "sys" / "vm" / "drop_caches").exists() == dropped
    assert ("dropped caches" in out) == dropped


def test_plan_up_drops_caches_after_the_stale_stack_stops_and_before_the_first_start() -> None:
    from sparkctl.plan import planner
    from sparkctl.plan.render import render

    res = resolve("ds41f-tp4-ring", ROOTS)
    plan = planner.plan_up(res, INV, render(res, INV, ROOTS, secrets={}), planner.UpFacts())
    ids = [s.id for s in plan.steps]
    assert ids.index("stop-stale") < ids.index("drop-caches") < ids.index("start-1")
    check = next(s for s in plan.steps if s.id == "check")
    assert "page_cache" in check.params["ignore"]  # up applies the remedy itself
    step = next(s for s in plan.steps if s.id == "drop-caches")
    assert all(step.sudo.values()) and step.on_fail == "continue"
