"""End-to-end on the SIMULATED pair: SGLang and the vLLM fallback pass readiness with the flags they render.

Readiness asks only for what the engine's contract says it serves with the rendered
flags (issue #12): SGLang's counter only with --enable-metrics (rendered), vLLM's
always. The simulated engines take their flags and endpoints from the same
contracts, so a readiness that waited for a /metrics the real engine would not
serve would time out here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.sim.helpers import WAIVE, Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


@pytest.fixture(scope="module")
def sim_pair(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("simpair"), 2)


@pytest.mark.parametrize("profile,metric", [("sglang-tp2", "sglang:generation_tokens_total"),
                                            ("vllm-tp2-fallback", "vllm:generation_tokens_total")])
def test_pair_engine_up_passes_readiness(sim_pair: Sim, profile: str, metric: str) -> None:

    inv = str(sim_pair.inventory)
    plan = json.loads(sim_pair.sparkctl("-i", inv, "plan", "up", profile, "--assume-fresh", "--json",
                                        check=True).stdout)
    ready = next(s for s in plan["steps"] if s["kind"] == "ready")
    assert ready["params"]["metric"] == metric  # what the contract says the rendered flags serve
    r = sim_pair.sparkctl("-i", inv, "up", profile, *WAIVE, "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    st = json.loads(sim_pair.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    assert all(n["alive"] for n in st["nodes"]), st
    assert sim_pair.sparkctl("-i", inv, "down").returncode == 0
