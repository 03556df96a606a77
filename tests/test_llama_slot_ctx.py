"""llama-server's per-slot context (tools/server/server.cpp: n_ctx_slot = n_ctx / n_parallel unless --kv-unified)."""

from __future__ import annotations

import pytest

from sparkctl.bench import workloads as wl


@pytest.mark.parametrize("argv,want", [
    (["--ctx-size", "131072", "--parallel", "8"], 16384),  # the llamacpp-1box before --kv-unified
    (["--ctx-size", "131072", "--parallel", "8", "--kv-unified"], 131072),
    (["-c", "32768", "-np", "4"], 8192),
    (["--ctx-size=65536", "--parallel=2", "-kvu"], 65536),
    (["--ctx-size", "4096"], 4096),
    (["--parallel", "8"], None),  # no --ctx-size: the model's length, ask /props
    (["--ctx-size", "4096", "--parallel", "-1"], None),  # auto: ask /props
    (["--ctx-size", "many"], None),
])
def test_llama_server_slot_ctx(argv: list[str], want: int | None) -> None:
    assert wl.llama_server_slot_ctx(argv) == want


def test_a_32k_prompt_does_not_fit_a_16k_slot() -> None:
    slot = wl.llama_server_slot_ctx(["--ctx-size", "131072", "--parallel", "8"])
    assert not wl.fits_window(32768, 256, slot)
    assert wl.fits_window(32768, 256, wl.llama_server_slot_ctx(["--ctx-size", "131072", "--parallel", "8",
                                                                 "--kv-unified"]))
