"""The simulated page cache: file copies fill it (MemFree falls, MemAvailable does not), drop_caches
empties it, and the simulated vLLM refuses to start on MemFree with vLLM's own message. No namespaces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sparkctl.facts.system import parse_meminfo
from sparkctl.plan.laws.memory import drop_caches_if_short_command
from sparkctl_sim import nodestate
from sparkctl_sim.engines.runtime import free_memory_refusal


def _node(tmp: Path) -> Path:
    state = tmp / "node" / "state.json"
    nodestate.create(state, nodestate.default_state("spark-a"))
    return state


def _meminfo(state: Path):
    return parse_meminfo((state.parent / "meminfo").read_text())


def test_a_large_copy_fills_the_cache_the_vllm_check_refuses_and_drop_caches_lets_it_start(tmp_path: Path) -> None:
    state = _node(tmp_path)
    before = _meminfo(state)
    assert free_memory_refusal("vllm", str(state), 0.85) == ""
    src = tmp_path / "weights.bin"
    with open(src, "wb") as fh:
        fh.truncate(30 << 30)  # sparse: 30 GiB read and 30 GiB written stay cached
    env = dict(os.environ, SPARKCTL_SIM_STATE=str(state))
    subprocess.run([sys.executable, "-m", "sparkctl_sim.pagecache", "cp", str(src), str(tmp_path / "copy.bin")],
                   env=env, check=True)
    after = _meminfo(state)
    assert after.available_kib == before.available_kib
    assert before.free_kib - after.free_kib > 55 * 2**20  # ~60 GiB left MemFree
    refusal = free_memory_refusal("vllm", str(state), 0.85)
    assert refusal.startswith("ValueError: Free memory on device (")
    assert "is less than desired GPU memory utilization (0.85," in refusal
    assert free_memory_refusal("sglang", str(state), 0.85) == ""  # only vLLM's check is simulated
    # up's step, on a proc root whose drop_caches is the node's file, then the next edit absorbs it
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "meminfo").write_text((state.parent / "meminfo").read_text())
    (proc / "sys" / "vm" / "drop_caches").symlink_to(state.parent / "drop_caches")
    subprocess.run(["sh", "-c", drop_caches_if_short_command(0.85, str(proc))], check=True, capture_output=True)
    assert free_memory_refusal("vllm", str(state), 0.85) == ""
    assert _meminfo(state).free_kib == before.free_kib


def test_drop_caches_2_frees_slab_only_and_keeps_the_page_cache(tmp_path: Path) -> None:
    state = _node(tmp_path)
    with nodestate.edit(state) as s:
        nodestate.fill_page_cache(s, 80 << 30)
    (state.parent / "drop_caches").write_text("2\n")
    with nodestate.edit(state) as s:
        assert s["page_cache_kib"] > 0
    (state.parent / "drop_caches").write_text("3\n")
    with nodestate.edit(state) as s:
        assert s["page_cache_kib"] == 0
