"""End-to-end on the SIMULATED pair: after a large file copy on the head, the simulated vLLM refuses
to start (vLLM's free-memory check on MemFree), `check` names page_cache, and `up` (its drop-caches
step) starts the vLLM pair."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.sim.helpers import WAIVE, Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "vllm-tp2-fallback"


@pytest.fixture(scope="module")
def sim_pair(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("simpc"), 2)


def test_page_cache_refuses_vllm_until_up_drops_it(sim_pair: Sim) -> None:
    inv = str(sim_pair.inventory)
    head = "spark-a"
    copy = sim_pair.ssh(head, "set -e; d=$(mktemp -d /tmp/pc.XXXXXX); truncate -s 60G $d/src; "
                              "python3 -m sparkctl_sim.pagecache cp $d/src $d/dst; rm -rf $d; "
                              "grep -E '^(MemFree|MemAvailable):' /proc/meminfo", timeout=120)
    assert copy.returncode == 0, copy.stderr
    free_kb = int(next(ln.split()[1] for ln in copy.stdout.splitlines() if ln.startswith("MemFree:")))
    assert free_kb < 10 * 2**20, copy.stdout  # the copy's pages are cached, not free
    # without the remedy: the engine itself refuses, with vLLM's message
    bare = sim_pair.ssh(head, "python3 -m sparkctl_sim.engine vllm serve /srv/models/x "
                              "--gpu-memory-utilization 0.85", timeout=60)
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "Free memory on device (" in bare.stdout + bare.stderr
    assert "is less than desired GPU memory utilization (0.85" in bare.stdout + bare.stderr
    chk = sim_pair.sparkctl("-i", inv, "check", PROFILE, *WAIVE, "--json", timeout=120)
    assert '"page_cache"' in chk.stdout and '"fail"' in chk.stdout, chk.stdout[-2000:]
    # with it: up drops the cache on the head (only there) and the pair serves
    r = sim_pair.sparkctl("-i", inv, "up", PROFILE, *WAIVE, "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    st = json.loads(sim_pair.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    assert all(n["alive"] for n in st["nodes"]), st
    assert sim_pair.sparkctl("-i", inv, "down").returncode == 0
