"""End-to-end on the SIMULATED single node: `sparkctl fit`, the memory_fit law, and the REAL llama.cpp.

The tiny GGUF is served by the real engine (llama-cpp-python); the KV cache size
it logs at load (`llama_kv_cache: size = X MiB`) must be within 5% of what `fit`
computed from the file's header on the node. A GGUF whose header declares a 70 GB
model (the file is sparse: its header, then a hole) with a 128K context is refused
by `fit` with the figures, and `up` of it fails in phase check before anything
starts: the engine never sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim.helpers import Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tiny-llamacpp"
BIG = "/srv/models/big/big.gguf"
BIG_SETS = ("--set", f"model.weights_path={BIG}", "--set", "model.local_dir=/srv/models/big",
            "--set", "model.context_len_tokens=131072")


@pytest.fixture(scope="module")
def sim_one(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("simfit"), 1)


def write_big_gguf(path: Path) -> int:
    """A llama GGUF header for 80 layers of 8192 (64 heads, 8 KV heads) in Q8_0, the file extended
    to its full size as a hole: ~70 GB declared, a few kB on disk."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(131072)
    w.add_embedding_length(8192)
    w.add_block_count(80)
    w.add_feed_forward_length(28672)
    w.add_head_count(64)
    w.add_head_count_kv(8)
    w.add_vocab_size(128256)
    q8 = gguf.GGMLQuantizationType.Q8_0
    total = 0

    def t(name: str, *shape: int) -> None:
        nonlocal total
        n = 1
        for d in shape:
            n *= d
        nbytes = n // 32 * 34
        total += nbytes
        # numpy order (rows, cols), the row in bytes for a block type; gguf stores ne reversed
        w.add_tensor_info(name, (shape[0], shape[1] // 32 * 34), np.dtype(np.uint8), nbytes, raw_dtype=q8)

    t("token_embd.weight", 128256, 8192)
    for i in range(80):
        t(f"blk.{i}.attn_q.weight", 8192, 8192)
        t(f"blk.{i}.attn_k.weight", 1024, 8192)
        t(f"blk.{i}.attn_v.weight", 1024, 8192)
        t(f"blk.{i}.attn_output.weight", 8192, 8192)
        t(f"blk.{i}.ffn_gate.weight", 28672, 8192)
        t(f"blk.{i}.ffn_up.weight", 28672, 8192)
        t(f"blk.{i}.ffn_down.weight", 8192, 28672)
    t("output.weight", 128256, 8192)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + total)
    return total


def test_fit_agrees_with_the_real_llama_cpp_and_refuses_an_overcommit_before_up_starts_anything(sim_one: Sim) -> None:
    inv = str(sim_one.inventory)
    (node_dir,) = sorted((sim_one.root / "nodes").iterdir())
    node = node_dir.name
    r = sim_one.sparkctl("-i", inv, "fit", PROFILE, "--json", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (fit,) = json.loads(r.stdout)["nodes"]
    assert fit["ok"] and fit["source"] == f"{node}:/srv/models/tiny-llama/tiny-llama.gguf", fit
    r = sim_one.sparkctl("-i", inv, "up", PROFILE, "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    try:
        log = sim_one.ssh(node, "cat /var/log/sparkctl/engine.log").stdout
        m = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB \( *([0-9]+) cells", log)
        assert m, log[-3000:]
        theirs = float(m.group(1)) * 2**20
        assert int(m.group(2)) == fit["kv_tokens"]
        assert abs(fit["kv_cache_bytes"] - theirs) <= 0.05 * theirs, (fit["kv_cache_bytes"], theirs)
    finally:
        assert sim_one.sparkctl("-i", inv, "down", timeout=120).returncode == 0

    declared = write_big_gguf(node_dir / "fs" / BIG.lstrip("/"))
    assert declared > 60 * 2**30
    r = sim_one.sparkctl("-i", inv, "fit", PROFILE, *BIG_SETS, timeout=120)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert "refused" in r.stdout and "over-commit" in r.stdout and "laws.min_free_gib" in r.stdout, r.stdout
    assert f"error: fit {PROFILE}: refused on {node}" in r.stderr, r.stderr
    r = sim_one.sparkctl("-i", inv, "up", PROFILE, *BIG_SETS, timeout=300)
    assert r.returncode == 4, r.stdout[-3000:] + r.stderr[-3000:]
    assert "in phase check" in r.stderr and f"memory_fit on {node}" in r.stderr and "over-commit" in r.stderr, \
        r.stderr
    assert "GiB" in r.stderr
    ps = sim_one.ssh(node, "ps -eo args").stdout
    assert "big.gguf" not in ps  # refused before start: no engine was given the model
