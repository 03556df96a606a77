"""Will it fit: the header reader, the arithmetic, its agreement with the engines, the memory_fit law.

The engines are the judges: the tiny GGUF is loaded by the REAL llama.cpp
(llama-cpp-python 0.3.36) and its logged KV cache size must be within 5% of
sparkctl's figure; vLLM's and SGLang's printed figures are reproduced from their
own formulas (vllm 0.11.2 kv_cache_utils.py / gpu_worker.py, sglang 0.5.4
model_runner.py / memory_pool.py) for known configurations; huggingface_hub's
``get_safetensors_metadata`` judges what sparkctl reads from the (local) Hub.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.facts.batch import build_script, parse_batch, remote_command
from sparkctl.facts.modelfiles import reader_source
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.model import memfit
from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws
from sparkctl.plan.laws.memoryfit import check_memory_fit
from sparkctl.remote import modelhead

GIB = 1 << 30
SPARK_TOTAL_KIB = 127_600_816  # docs/reference/spark-facts.md §5.4, a real GB10's MemTotal
SPARK_AVAIL_KIB = 115_669_068


def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sparkctl_sim.tinymodel import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.getbasetemp() / "tiny")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    return tiny_gguf(tmp_path_factory)


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], data: bool = True) -> bytes:
    """A safetensors file (header + zero data when ``data``): the format of the safetensors docs."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + (b"\0" * off if data else b"")


def llama_like(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
               dtype: str = "BF16") -> tuple[dict[str, Any], dict[str, tuple[str, list[int]]]]:
    hd = hidden // heads
    cfg = {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
           "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab, "torch_dtype": "bfloat16"}
    t: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": (dtype, [vocab, hidden]),
                                           "lm_head.weight": (dtype, [vocab, hidden]),
                                           "model.norm.weight": (dtype, [hidden])}
    for i in range(layers):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": (dtype, [heads * hd, hidden]),
              p + "self_attn.k_proj.weight": (dtype, [kv * hd, hidden]),
              p + "self_attn.v_proj.weight": (dtype, [kv * hd, hidden]),
              p + "self_attn.o_proj.weight": (dtype, [hidden, heads * hd]),
              p + "mlp.gate_proj.weight": (dtype, [ffn, hidden]), p + "mlp.up_proj.weight": (dtype, [ffn, hidden]),
              p + "mlp.down_proj.weight": (dtype, [hidden, ffn]),
              p + "input_layernorm.weight": (dtype, [hidden]), p + "post_attention_layernorm.weight": (dtype, [hidden])}
    return cfg, t


def write_model(root: Path, cfg: dict[str, Any], tensors: dict[str, tuple[str, list[int]]]) -> Path:
    """config.json + one safetensors shard holding only its header, the file extended to its full size
    (sparse): the reader must never need the data."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    full = safetensors_bytes(tensors, data=False)
    (n,) = struct.unpack("<Q", full[:8])
    data = sum(memfit.SAFETENSORS_DTYPE_BYTES[d] * _prod(s) for d, s in tensors.values())
    with open(root / "model.safetensors", "wb") as f:
        f.write(full)
        f.truncate(8 + n + int(data))
    return root


def _prod(s: list[int]) -> int:
    out = 1
    for d in s:
        out *= d
    return out


# ---------------------------------------------------------------- the reader


def test_the_ggml_type_table_is_ggmls_own() -> None:
    gguf = pytest.importorskip("gguf")
    theirs = {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}
    for num, (name, blk, size) in memfit.GGML_TYPES.items():
        assert theirs[num] == (blk, size), name
        assert gguf.GGMLQuantizationType(num).name == name


def test_the_tiny_gguf_reads_as_llama_cpp_sees_it(tiny: Path) -> None:
    gguf = pytest.importorskip("gguf")
    doc = modelhead.read_path(str(tiny))
    assert doc["kind"] == "gguf" and doc["meta"]["llama.block_count"] == 2
    m = memfit.shape_from_doc(doc)
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.vocab) == (2, 4, 4, 16, 647)
    reader = gguf.GGUFReader(str(tiny))
    assert m.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors)  # gguf's own reader is the judge


def test_the_node_side_reader_has_no_backslash_nor_prose_and_reads_only_headers(tmp_path: Path) -> None:
    src = reader_source()
    assert "\\" not in src and " > " not in src and '"""' not in src
    cfg, t = llama_like(4, 256, 8, 2, 512, 1000)
    root = write_model(tmp_path / "m", cfg, t)
    size = (root / "model.safetensors").stat().st_size
    r = subprocess.run([sys.executable, "-S", "-c", src, str(root)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["files"] == [["model.safetensors", size]] and doc["config"] == cfg
    groups = {g[0]: g for g in doc["tensors"]}
    assert groups["model.layers.#.self_attn.k_proj.weight"] == ["model.layers.#.self_attn.k_proj.weight", "BF16",
                                                                [64, 256], 4]
    assert subprocess.run([sys.executable, "-S", "-c", src, str(tmp_path / "none")], timeout=30).returncode == 3
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.safetensors").write_bytes(b"\xff" * 16)
    r = subprocess.run([sys.executable, "-S", "-c", src, str(tmp_path / "junk")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 4 and r.stdout.startswith("not a model: ")


def test_the_model_files_section_answers_nothing_there_without_starting_python(tmp_path: Path) -> None:
    """The section's exit 3 for an empty weights path comes from sh, as the reader would give it: a
    PATH whose python3 fails if started proves no interpreter ran; a model there still reaches it."""
    from sparkctl.facts.batch import PRELUDE
    from sparkctl.facts.modelfiles import MODEL_FILES
    from sparkctl.facts.registry import ScriptContext

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\necho started >&2\nexec {sys.executable} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    cfg, t = llama_like(2, 64, 4, 2, 128, 100)
    model = write_model(tmp_path / "m", cfg, t)
    node = loads_inventory(ONE).node("spark-a")
    for path, rc, started in ((tmp_path / "none", 3, ""), (model, 0, "started\n"),
                              (model / "model.safetensors", 0, "started\n")):
        body = MODEL_FILES.command(ScriptContext(node, str(path)), "")
        r = subprocess.run(["sh", "-c", PRELUDE + body], capture_output=True, text=True, timeout=30,
                           env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        assert (r.returncode, r.stderr) == (rc, started), (path, r.stdout[:200], r.stderr)


def _spark_node(prefix: Path) -> Any:
    inv = loads_inventory(f"nodes:\n  - {{name: spark-a, host: 192.0.2.1, prefix: {prefix}, proc_root: {prefix}/proc}}\n")
    return inv.node("spark-a")


def test_the_probe_batch_reads_the_model_files_fact(tmp_path: Path) -> None:
    cfg, t = llama_like(2, 128, 4, 4, 256, 100)
    write_model(tmp_path / "srv" / "m", cfg, t)
    script = build_script(_spark_node(tmp_path), "/srv/m")
    r = subprocess.run(remote_command(script), shell=True, capture_output=True, text=True, timeout=60)
    f = parse_batch("spark-a", r.stdout)
    assert "model_files" not in f.unreadable, f.unreadable.get("model_files")
    assert f.model_files is not None and f.model_files.doc["config"] == cfg
    absent = parse_batch("spark-a", subprocess.run(
        remote_command(build_script(_spark_node(tmp_path), "/srv/none")), shell=True,
        capture_output=True, text=True, timeout=60).stdout)
    assert absent.model_files is None and "model_files" not in absent.unreadable


# ---------------------------------------------------------------- the arithmetic


def test_sharding_splits_kv_heads_down_to_one_and_names_what_is_replicated() -> None:
    cfg, t = llama_like(2, 1024, 16, 2, 2048, 1000)
    doc = {"kind": "safetensors", "config": cfg, "tensors": modelhead.group(
        (n, d, s) for n, (d, s) in t.items())}
    m = memfit.shape_from_doc(doc)
    k = next(g for g in m.tensors if g.pattern.endswith("k_proj.weight"))
    assert memfit.shard_fraction(k, m, 2) == 0.5
    assert memfit.shard_fraction(k, m, 4) == 0.5  # 2 KV heads on 4 ranks: one head each (replicated pairs)
    w4 = memfit.rank_weights(m, 4)
    assert set(w4.replicated) == {"model.norm.weight", "model.layers.#.input_layernorm.weight",
                                  "model.layers.#.post_attention_layernorm.weight"}
    assert memfit.kv_bytes_per_token(m, 1, 2) == 2 * 2 * 2 * 64 * 2
    assert memfit.kv_bytes_per_token(m, 4, 2) == memfit.kv_bytes_per_token(m, 2, 2)  # at least one head per rank


def _shape(layers: int = 32, kv: int = 8, hd: int = 128, heads: int = 32) -> memfit.ModelShape:
    return memfit.ModelShape("safetensors", layers, heads, kv, hd, hd, heads * hd, 128_256, 14_336, 2,
                             tensors=(memfit.TensorGroup("model.layers.#.mlp.up_proj.weight", "BF16",
                                                         (14_336, heads * hd), layers),))


@settings(max_examples=60, deadline=None)
@given(ctx=st.integers(1, 1 << 20), more=st.integers(1, 1 << 18), tp=st.sampled_from([1, 2, 4, 8]))
def test_more_context_never_needs_less_and_more_ranks_never_need_more(ctx: int, more: int, tp: int) -> None:
    m = _shape()
    node = memfit.NodeMemory(SPARK_TOTAL_KIB * 1024, SPARK_AVAIL_KIB * 1024)

    def holds(c: int, engine: str = "llamacpp", t: int = 1) -> int:
        return memfit.fit(m, engine=engine, tp=t, context_tokens=c, args=[], utilization=0.85, min_free_gib=12,
                          node=node).committed_bytes

    assert holds(ctx) <= holds(ctx + more)
    assert memfit.kv_bytes_per_token(m, tp * 2, 2) <= memfit.kv_bytes_per_token(m, tp, 2)
    assert memfit.rank_weights(m, tp * 2).bytes <= memfit.rank_weights(m, tp).bytes
    # a fraction engine holds its fraction whatever the context: more context only shrinks its concurrency
    a = memfit.fit(m, engine="vllm", tp=tp, context_tokens=ctx, args=[], utilization=0.85, min_free_gib=12, node=node)
    b = memfit.fit(m, engine="vllm", tp=tp, context_tokens=ctx + more, args=[], utilization=0.85, min_free_gib=12,
                   node=node)
    assert a.committed_bytes == b.committed_bytes and b.max_concurrency <= a.max_concurrency


def test_vllm_kv_blocks_tokens_and_concurrency_as_its_source_prints_them() -> None:
    # Llama-3-8B shape (32 layers, 8 KV heads of 128, bf16), TP1, block 16: AttentionSpec.page_size_bytes =
    # 2 x 16 x 8 x 128 x 2 = 65,536 per layer; get_num_blocks(10 GiB) = 10 GiB // 65,536 // 32 = 5,120;
    # "GPU KV cache size: 81,920 tokens"; "Maximum concurrency for 8,192 tokens per request: 10.00x".
    m = _shape()
    per_tok = memfit.kv_bytes_per_token(m, 1, 2)
    page = int(per_tok / m.layers * memfit.VLLM_BLOCK_TOKENS)
    assert page == 65_536
    blocks = memfit.vllm_num_blocks(10 * GIB, page, m.layers)
    assert blocks == 5_120 and memfit.vllm_kv_tokens(blocks) == 81_920
    assert f"{memfit.vllm_max_concurrency(blocks, 8192):.2f}x" == "10.00x"
    # MLA (DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers), fp8 KV: MLAAttentionSpec page =
    # 16 x 1 x 576 x 1 = 9,216 per layer, on every rank whatever the TP
    mla = memfit.ModelShape("safetensors", 61, 128, 128, 192, 128, 7168, 129_280, 18_432, 2, mla_latent=576)
    assert memfit.kv_bytes_per_token(mla, 8, 1) == memfit.kv_bytes_per_token(mla, 1, 1) == 61 * 576
    assert int(memfit.kv_bytes_per_token(mla, 8, 1) / 61 * 16) == 9_216


def test_vllm_refuses_a_max_model_len_its_pool_cannot_hold() -> None:
    m = _shape()
    node = memfit.NodeMemory(SPARK_TOTAL_KIB * 1024, SPARK_AVAIL_KIB * 1024)
    ok = memfit.fit(m, engine="vllm", tp=2, context_tokens=131_072, args=["--max-num-seqs", "8"], utilization=0.85,
                    min_free_gib=12, node=node)
    assert ok.ok and ok.budget_bytes == int(0.85 * SPARK_TOTAL_KIB * 1024)
    huge = memfit.fit(m, engine="vllm", tp=2, context_tokens=4_194_304 * 4, args=[], utilization=0.85,
                      min_free_gib=12, node=node)
    assert not huge.ok and "the engine refuses to start" in huge.problems[0]


def test_sglang_max_num_token_and_kv_size_as_its_source_prints_them() -> None:
    # Qwen2-7B shape (28 layers, 4 KV heads of 128, bf16) at TP2: cell_size = 2 x 28 x 128 x 2 x 2 = 28,672 B.
    m = _shape(layers=28, kv=4, hd=128, heads=28)
    cell = memfit.kv_bytes_per_token(m, 2, 2)
    assert cell == 28_672
    total, avail = 120 * GIB, 110 * GIB  # after the weights loaded
    n = memfit.sglang_max_num_token(avail, total, 0.85, cell)
    assert n == int((avail - total * 0.15) // cell) == 3_445_321  # (110 - 18) GiB // 28,672
    k, v = memfit.sglang_kv_size_bytes(n, 28, 2, 128, 2)
    # "KV Cache is allocated. #tokens: 3445321, K size: 46.00 GB, V size: 46.00 GB" (28 x 3445322 x 2 x 128 x 2)
    assert f"K size: {k / GIB:.2f} GB, V size: {v / GIB:.2f} GB" == "K size: 46.00 GB, V size: 46.00 GB"


# ---------------------------------------------------------------- the real llama.cpp

# One load per process: llama.cpp logs to the C stderr, which the process hands back whole.
LLAMA_PROBE = """
import json, sys
import llama_cpp
n_ctx, type_k, fa = json.loads(sys.argv[2])
kw = {} if type_k is None else {"type_k": type_k}
llama_cpp.Llama(model_path=sys.argv[1], n_ctx=n_ctx, flash_attn=fa, verbose=True, **kw)
"""


def test_the_kv_cache_agrees_with_the_real_llama_cpp_within_5_percent(tiny: Path) -> None:
    pytest.importorskip("llama_cpp")
    # type_k 0: an f32 K beside the f16 V (a block type such as q8_0 needs a head size the tiny model lacks)
    cases = [(512, None, False), (3000, None, False), (8192, None, True), (8192, 0, True)]
    logs = []
    for case in cases:
        r = subprocess.run([sys.executable, "-c", LLAMA_PROBE, str(tiny), json.dumps(case)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        logs.append(r.stderr)
    m = memfit.shape_from_doc(modelhead.read_path(str(tiny)))
    node = memfit.NodeMemory(SPARK_TOTAL_KIB * 1024, SPARK_AVAIL_KIB * 1024)
    for (n_ctx, type_k, fa), log in zip(cases, logs):
        kv = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB \( *([0-9]+) cells", log)
        comp = re.search(r"compute buffer size = +([0-9.]+) MiB", log)
        model = re.search(r"model buffer size = +([0-9.]+) MiB", log)
        assert kv and comp and model, log[-2000:]
        args = ["--interrupt_requests", "False"] + (["--type_k", str(type_k)] if type_k is not None else []) \
            + ["--flash_attn", "true" if fa else "false"]
        f = memfit.fit(m, engine="llamacpp", tp=1, context_tokens=n_ctx, args=args, utilization=0.85,
                       min_free_gib=12, node=node, binary="python3 -m llama_cpp.server")
        assert f.kv_tokens == int(kv.group(2))  # the cells: n_ctx padded to 256, as llama-context.cpp pads it
        theirs = float(kv.group(1)) * memfit.MIB
        assert abs(f.kv_cache_bytes - theirs) <= 0.05 * theirs, (n_ctx, type_k, f.kv_cache_bytes, theirs)
        assert abs(f.weights_bytes - float(model.group(1)) * memfit.MIB) <= 0.05 * float(model.group(1)) * memfit.MIB
        # the compute buffer is an estimate: never below llama.cpp's own, at most a third above it
        c = float(comp.group(1)) * memfit.MIB
        assert 0.95 * c <= f.overhead_bytes <= 1.35 * c, (n_ctx, fa, f.overhead_bytes / memfit.MIB, c / memfit.MIB)


def test_llama_server_pads_each_slot_without_kv_unified() -> None:
    assert memfit.llama_n_ctx(131_072, 8, True) == 131_072
    assert memfit.llama_n_ctx(1000, 3, False) == 3 * 512  # pad(1024 / 3 = 341, 256) = 512 per slot
    assert memfit.llama_n_ctx(3000, 1, False) == 3072


# ---------------------------------------------------------------- the law

ONE = ("nodes:\n  - {name: spark-a, host: 192.0.2.1}\n")


def _ctx(tmp_path: Path, profile: str, sets: dict[str, Any], doc: Any, avail_kib: int = SPARK_AVAIL_KIB,
         engines: Any = None) -> laws.Context:
    from sparkctl.facts.modelfiles import ModelFiles

    res = resolve(profile, Roots.make(None, None), sets=[f"{k}={v}" for k, v in sets.items()])
    inv = loads_inventory(ONE)
    f = NodeFacts(node="spark-a", mem_total_kib=SPARK_TOTAL_KIB, mem_available_kib=avail_kib,
                  mem_free_kib=avail_kib, engines=engines or [],
                  model_files=ModelFiles(doc) if doc is not None else None)
    return laws.Context(profile=res.profile, inventory=inv, nodes=("spark-a",), facts={"spark-a": f},
                        profile_name=profile)


def test_the_law_passes_the_tiny_model_and_refuses_a_context_that_overcommits(tiny: Path, tmp_path: Path) -> None:
    doc = modelhead.read_path(str(tiny))
    (v,) = check_memory_fit(_ctx(tmp_path, "tiny-llamacpp", {}, doc))
    assert v.status == "ok" and "KV 256.00 KiB" not in v.observed and "holds" in v.observed
    # 4M tokens of context on a node with 20 GiB available: KV 2 GiB, but the compute buffer without
    # flash attention (llama-cpp-python's default) is 4M x 512 x 5 x 4 bytes = 40 GiB
    (v,) = check_memory_fit(_ctx(tmp_path, "tiny-llamacpp", {"model.context_len_tokens": 4_194_304}, doc,
                                 avail_kib=20 * 1024 * 1024))
    assert v.status == "fail", v
    assert "over-commit" in v.observed and "laws.min_free_gib" in v.observed and "MemAvailable" in v.observed
    assert "4,194,304 tokens" in v.observed and "fit tiny-llamacpp" in v.fix
    (v,) = check_memory_fit(_ctx(tmp_path, "tiny-llamacpp", {}, None))
    assert v.status == "skip" and "--hub" in v.fix


def test_a_vllm_model_is_refused_where_vllm_would_refuse_it_naming_the_figures(tmp_path: Path) -> None:
    cfg, t = llama_like(80, 8192, 64, 8, 28_672, 128_256)  # a 70B-class bf16 model: ~141 GB of weights
    doc = modelhead.read_path(str(write_model(tmp_path / "m70", cfg, t)))
    # the profile's 1M-token context at TP2: 80 KiB of KV per token per rank, 80 GiB for one request, in a
    # pool of 0.85 x 121.7 GiB - 65.7 GiB of weights - the overhead (vLLM: check_enough_kv_cache_memory)
    (v,) = check_memory_fit(_ctx(tmp_path, "vllm-tp2-fallback", {}, doc))
    assert v.status == "fail", v
    assert "weights 65.71 GiB/rank (TP2)" in v.observed and "81,920 B/token" in v.observed
    assert "one request of 1,048,576 tokens needs 80.00 GiB of KV cache" in v.observed
    assert "the engine refuses to start" in v.observed
    (v,) = check_memory_fit(_ctx(tmp_path, "vllm-tp2-fallback", {"model.context_len_tokens": 131_072}, doc))
    assert v.status == "ok", v
    big = llama_like(120, 12_288, 96, 8, 40_960, 128_256)  # ~230 GB: 115 GB a rank does not fit in 103 GiB
    doc = modelhead.read_path(str(write_model(tmp_path / "m230", *big)))
    (v,) = check_memory_fit(_ctx(tmp_path, "vllm-tp2-fallback", {"model.context_len_tokens": 8192}, doc))
    assert v.status == "fail" and "the engine cannot load" in v.observed, v


def test_up_of_an_overcommitting_profile_fails_in_phase_check_with_the_figures(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkctl.errors import CheckFailed
    from sparkctl.ops import check, executor
    from tests.fakenodes import fake_for

    doc = modelhead.read_path(str(tiny))
    ctx = _ctx(tmp_path, "tiny-llamacpp", {"model.context_len_tokens": 4_194_304}, doc, avail_kib=20 * 1024 * 1024)

    def judged(res: Any, inv: Any, transport: Any, **kw: Any) -> check.CheckReport:
        return check.CheckReport(res.name, ctx.nodes, tuple(check_memory_fit(ctx)), {})

    monkeypatch.setattr(executor, "run_check", judged)  # the check step's own (sparkctl.ops.executor.check_step)
    res = resolve("tiny-llamacpp", Roots.make(None, None), sets=["model.context_len_tokens=4194304"])
    inv = loads_inventory(ONE)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(CheckFailed) as err:
        executor.up(res, inv, fake_for(inv), Roots.make(None, None))
    e = err.value
    assert e.phase == "check", e.one_line()
    line = e.one_line()
    assert "in phase check" in line and "memory_fit on spark-a" in line and "over-commit" in line, line
    assert "GiB" in line


# ---------------------------------------------------------------- the Hub (the local one; huggingface_hub judges)


def test_the_hub_headers_are_read_with_ranges_only_and_agree_with_huggingface_hub(tmp_path: Path) -> None:
    hf = pytest.importorskip("huggingface_hub")
    from sparkctl.ops.fit import read_hub
    from sparkctl_sim.hub import LocalHub, make_repo

    # 3,000 tensors: a header over the 100,000 bytes asked first, so the second Range request is needed
    cfg, t = llama_like(300, 64, 4, 2, 128, 512)
    blob = safetensors_bytes(t)
    (hlen,) = struct.unpack("<Q", blob[:8])
    assert hlen > 100_000 and len(blob) > 4 * hlen
    files = {"config.json": json.dumps(cfg).encode(), "model.safetensors": blob, "README.md": b"x\n"}
    res = resolve("vllm-tp2-fallback", Roots.make(None, None),
                  sets=["model.id=org/wide", "model.weights_path=/srv/models/wide"])
    with LocalHub([make_repo("org/wide", files)]) as h:
        doc = read_hub(res.profile, endpoint=h.endpoint, token=None)
        storage = [(path, rng) for server, method, path, rng, status in h.requests if server == "storage"]
        meta = hf.HfApi(endpoint=h.endpoint).get_safetensors_metadata("org/wide")
    assert storage and all(rng and rng.startswith("bytes=") for _, rng in storage), storage
    asked = sum(int(b) - int(a) + 1 for _, rng in storage for a, b in [rng[6:].split("-")])
    assert asked < 8 + hlen + 100_001 < len(blob)  # the header and the first 100 kB, never the tensors
    ours = {(g[0], g[1], tuple(g[2])): g[3] for g in doc["tensors"]}
    theirs = modelhead.group((n, i.dtype, i.shape) for n, i in meta.files_metadata["model.safetensors"].tensors.items())
    assert ours == {(g[0], g[1], tuple(g[2])): g[3] for g in theirs}
    assert doc["config"] == cfg
    m = memfit.shape_from_doc(doc)
    assert m.weight_bytes == sum(meta.parameter_count.values()) * 2  # bf16: two bytes a parameter
    local = modelhead.read_path(str(write_model(tmp_path / "wide", cfg, t)))
    assert local["tensors"] == doc["tensors"]


# ---------------------------------------------------------------- the command


def test_fit_prints_the_figures_and_exits_4_when_it_refuses(sparkctl, tiny: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from sparkctl.cli import fit as fit_cli
    from sparkctl.ops import fit as fit_ops
    from sparkctl.transport import FakeTransport, reply

    doc = modelhead.read_path(str(tiny))
    meminfo = "MemTotal: 127600816 kB\nMemFree: 20000000 kB\nMemAvailable: 20971520 kB\n"
    batch = ("@@sparkctl:manifest:meminfo engines model_files@@\n"
             f"@@sparkctl:section:meminfo@@\n{meminfo}\n@@sparkctl:rc:meminfo:0@@\n"
             "@@sparkctl:section:engines@@\n  PID ARGS\n\n@@sparkctl:rc:engines:0@@\n"
             f"@@sparkctl:section:model_files@@\n{json.dumps(doc)}\n@@sparkctl:rc:model_files:0@@\n"
             "@@sparkctl:done@@\n")

    def transport(inv: Any, *a: Any) -> Any:
        return contextlib.nullcontext(FakeTransport({("*", re.compile(r"sh -c .*", re.DOTALL)): reply(batch)},
                                                    nodes=inv.names))

    monkeypatch.setattr(fit_cli, "make_transport", transport)
    pair = str(Path(__file__).parent / "fixtures" / "inv-pair.yaml")
    r = sparkctl("-i", pair, "fit", "tiny-llamacpp", "--json")
    assert r.code == 0, r.err
    (node,) = json.loads(r.out)["nodes"]
    assert node["ok"] and node["kv_tokens"] == 512 and node["kv_bytes_per_token"] == 512
    r = sparkctl("-i", pair, "fit", "tiny-llamacpp", "--set", "model.context_len_tokens=4194304")
    assert r.code == 4, r.out + r.err
    assert "refused" in r.out and "over-commit" in r.out and "error: fit tiny-llamacpp: refused on spark-a" in r.err
    assert fit_ops.run_fit is not None
