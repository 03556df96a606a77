"""End-to-end on the SIMULATED single node: up llamacpp-1box runs the simulated llama-server and passes readiness.

Then the bench learns the per-request window from the server's /props (the
profile renders --kv-unified: one slot may use all of --ctx-size) and flags,
without sending it, a point that does not fit. The profile's GGUF is not on a
fresh simulated node: the test places the tiny GGUF under that name first,
since the simulated llama-server, like the real one, refuses a missing model.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.bench.results import load_run
from tests.sim.helpers import WAIVE, Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "llamacpp-1box"
WEIGHTS = "DeepSeek-V4-Flash-0731-Q2_K.gguf"   # profiles/llamacpp-1box.yaml model.weights_path


@pytest.fixture(scope="module")
def sim_one(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("simone"), 1)


def test_llamacpp_1box_up_passes_readiness_and_the_bench_flags_what_does_not_fit(sim_one: Sim, tmp_path: Path
                                                                                 ) -> None:
    inv = str(sim_one.inventory)
    (node_dir,) = sorted((sim_one.root / "nodes").iterdir())
    r = sim_one.sparkctl("-i", inv, "up", PROFILE, *WAIVE, "--json", timeout=300)
    assert r.returncode != 0  # no model file yet: llama-server exits 1, readiness never passes
    log = sim_one.ssh(node_dir.name, "cat /var/log/sparkctl/engine.log").stdout
    assert "failed to open GGUF file" in log and "exiting due to model loading error" in log, log[-2000:]
    sim_one.sparkctl("-i", inv, "down", timeout=120)
    models = node_dir / "fs" / "srv" / "models"
    shutil.copyfile(models / "tiny-llama" / "tiny-llama.gguf", models / WEIGHTS)
    r = sim_one.sparkctl("-i", inv, "up", PROFILE, *WAIVE, "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = sim_one.ssh(node_dir.name, "cat /var/log/sparkctl/engine.log").stdout
    assert "SIMULATED llama-server" in log and "n_slots = 8, n_ctx_slot = 131072, kv_unified = 'true'" in log
    try:
        out = tmp_path / "bench"
        r = sim_one.sparkctl("-i", inv, "bench", PROFILE, "--suite", "prefill", "--lengths", "256,200000",
                             "--repeats", "2", "--out", str(out), "--force", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        rows = {row["point"]: row for row in load_run(out).rows}
        assert {row["context_window_source"] for row in rows.values()} == {"/props default_generation_settings.n_ctx"}
        assert {row["context_window_tokens"] for row in rows.values()} == {"131072"}
        assert rows["prefill/200000"]["flags"].startswith("not_run:exceeds_context_window:")
        assert rows["prefill/200000"]["n_requests"] == "0"
        assert rows["prefill/256"]["n_ok"] == "1" and rows["prefill/256"]["valid"] == "1"
        assert load_run(out).meta["config"]["engine_argv"][-5:] == ["--kv-unified", "--parallel", "8",
                                                                    "--n-gpu-layers", "999"]
    finally:
        assert sim_one.sparkctl("-i", inv, "down", timeout=120).returncode == 0
