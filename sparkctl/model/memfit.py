"""Will it fit: a model's memory per rank and per node, from its own headers. Pure arithmetic.

Input: what :mod:`sparkctl.remote.modelhead` read (config.json and the safetensors
headers, or a GGUF's metadata and tensor infos: dtype and shape of every tensor,
grouped by name pattern), the profile (engine, TP size, context, engine args) and a
node's memory (``/proc/meminfo``). Output: :class:`Fit`, the figures and the verdict.
No I/O here: the files are read at the edges (the ``model_files`` fact on a node,
``sparkctl.ops.fit`` from the Hub).

The arithmetic, engine by engine (each figure says where it comes from):

* **Weights per rank**: each tensor's bytes (elements x dtype size; a GGUF block
  type's bytes per block) sharded by tensor parallelism as vLLM's layers shard them:
  column/row-parallel linears, the vocab-parallel embedding and LM head and the
  MoE experts are split TP ways; 1-D tensors (norms, biases, scales) and the MoE
  router are replicated; k/v projections keep ``max(1, kv_heads // tp)`` heads per
  rank (``QKVParallelLinear`` replicates a KV head when there are fewer than ranks).
  :attr:`Fit.replicated` names what is replicated.
* **KV cache per token** = 2 x layers x KV heads per rank x head size x KV dtype
  bytes, KV heads per rank = ``max(1, kv_heads // tp)`` (vLLM 0.11.2
  ``vllm/config/model.py`` ``get_num_kv_heads``, ``vllm/v1/kv_cache_interface.py``
  ``AttentionSpec.page_size_bytes``; SGLang 0.5.4 ``model_runner.py``
  ``profile_max_num_token`` ``cell_size``). MLA models (``kv_lora_rank``) cache one
  latent per layer: layers x (kv_lora_rank + qk_rope_head_dim) x bytes, on every rank
  (``MLAAttentionSpec``; SGLang's MLA ``cell_size``).
* **vLLM** commits ``gpu_memory_utilization x total`` (``gpu_worker.py`` init_device
  ``requested_memory``); its KV pool is that minus weights, peak activation and
  non-torch memory (``determine_available_memory``), in blocks of 16 tokens
  (``get_num_blocks``: ``available // page_size // layers``), and it refuses to start
  when one request of ``max_model_len`` does not fit (``kv_cache_utils.py``
  ``check_enough_kv_cache_memory``). It prints ``GPU KV cache size: N tokens`` and
  ``Maximum concurrency for L tokens per request: X.XXx`` (``_report_kv_cache_config``).
* **SGLang** keeps ``mem_fraction_static x total`` for weights and KV: ``rest =
  available_after_load - total x (1 - mem_fraction_static)``, ``max_num_token = rest
  // cell_size`` (``profile_max_num_token``); its K and V buffers hold ``tokens +
  page_size`` rows per layer (``mem_cache/memory_pool.py`` ``MHATokenToKVPool``).
* **llama.cpp** allocates what it is asked: weights (``-ngl 999``: all on the GPU),
  the KV cache for ``n_ctx`` cells padded to 256 (``src/llama-context.cpp``:
  ``GGML_PAD(n_ctx, 256)``; without ``--kv-unified`` each of ``n_seq`` slots gets
  ``GGML_PAD(n_ctx / n_seq, 256)``), ``n_embd_k_gqa + n_embd_v_gqa`` per layer per
  cell in the cache type (f16 unless ``-ctk``/``-ctv``; ``llama-kv-cache.cpp`` prints
  ``llama_kv_cache: size = X MiB``), and a compute buffer (estimated below).

Over-commit: on GB10 the GPU allocates from the memory the OS runs in; a launch
that takes more than is available livelocks the box with no OOM kill (the field
report's UVM law). The verdict refuses when what the engine will hold exceeds
what the node has available (MemAvailable; MemTotal while an engine runs, as it is
stopped first), plus ``laws.min_free_gib`` for an engine that takes no fraction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

# safetensors dtypes (safetensors docs "Format"; huggingface/safetensors Dtype): bytes per element.
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5, "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}
# ggml types: (elements per block, bytes per block), ggml/src/ggml.c type_traits (the gguf package's
# GGML_QUANT_SIZES; tests/test_memfit.py compares the two).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
GGML_BY_NAME = {name.lower(): (blk, size) for name, blk, size in GGML_TYPES.values()}

# KV cache dtypes by engine flag value -> bytes per element ("auto": the model's dtype).
# vLLM 0.11.2 vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE (fp8* are one byte);
# SGLang 0.5.4 model_runner.py init_memory_pool (fp8_e5m2, fp8_e4m3, bf16).
KV_DTYPE_BYTES: dict[str, float] = {"bfloat16": 2, "bf16": 2, "half": 2, "float16": 2, "float": 4, "float32": 4,
                                    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}
TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

VLLM_BLOCK_TOKENS = 16  # vllm/platforms/cuda.py: block_size defaults to 16 on CUDA
# vLLM 0.11.2 arg_utils.py get_batch_defaults: a device of >= 70 GiB (GB10: ~119.7) that is no A100
# gets max_num_seqs 1024 and max_num_batched_tokens 8192 for the API server.
VLLM_DEFAULT_MAX_NUM_SEQS = 1024
VLLM_DEFAULT_MAX_BATCHED_TOKENS = 8192
LLAMA_CTX_PAD = 256  # src/llama-context.cpp GGML_PAD(n_ctx, 256)
LLAMA_UBATCH = 512  # common/common.h n_ubatch; llama-cpp-python Llama(n_ubatch=512)
# Memory the engine process holds outside its tensors: the CUDA context, cuBLAS/NCCL
# workspaces (vLLM's profile counts them as "non-torch memory"; a few hundred MiB for the
# context, NCCL's buffers per peer on top). An estimate, named as one in every figure.
NON_TORCH_ESTIMATE_BYTES = 1 * GIB
ENGINES_WITH_FRACTION = ("vllm", "sglang", "ds41f", "tensorfold")


class FitError(ValueError):
    """The model's files say too little to compute a figure (a missing config key, an unknown dtype)."""


@dataclass(frozen=True)
class TensorGroup:
    pattern: str  # the name with digit runs as '#': model.layers.#.self_attn.k_proj.weight
    dtype: str  # safetensors dtype, or gguf:<ggml type>
    shape: tuple[int, ...]
    count: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    def nbytes(self) -> int:
        """Bytes of one tensor of the group."""
        if self.dtype.startswith("gguf:"):
            t = GGML_TYPES.get(int(self.dtype[5:]))
            if t is None:
                raise FitError(f"{self.pattern}: ggml type {self.dtype[5:]} is not known to sparkctl")
            _, blk, size = t
            return self.elements // blk * size
        b = SAFETENSORS_DTYPE_BYTES.get(self.dtype)
        if b is None:
            raise FitError(f"{self.pattern}: dtype {self.dtype} is not known to sparkctl")
        return int(self.elements * b)


@dataclass(frozen=True)
class ModelShape:
    """What the memory arithmetic needs of a model: its attention shape and its tensors."""

    kind: str  # safetensors | gguf
    layers: int
    heads: int
    kv_heads: int
    head_dim: int  # K head size (V's too, unless v_head_dim says otherwise)
    v_head_dim: int
    hidden: int
    vocab: int
    intermediate: int
    dtype_bytes: float  # the model's own dtype (KV "auto")
    mla_latent: int | None = None  # kv_lora_rank + qk_rope_head_dim (MLA), None otherwise
    tensors: tuple[TensorGroup, ...] = ()
    arch: str = ""

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes() * t.count for t in self.tensors)


def _first(cfg: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _need_int(cfg: Mapping[str, Any], what: str, *keys: str) -> int:
    v = _first(cfg, *keys)
    if not isinstance(v, int) or v <= 0:
        raise FitError(f"config.json has no {what} ({' / '.join(keys)})")
    return v


def tensors_of(doc: Mapping[str, Any]) -> tuple[TensorGroup, ...]:
    try:
        return tuple(TensorGroup(str(p), str(d), tuple(int(x) for x in s), int(n)) for p, d, s, n in doc["tensors"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FitError(f"the model header document is malformed: {exc}") from None


def shape_from_doc(doc: Mapping[str, Any]) -> ModelShape:
    """The document of :func:`sparkctl.remote.modelhead.read_path` (or its Hub twin) as a ModelShape."""
    tensors = tensors_of(doc)
    if doc.get("kind") == "gguf":
        return _shape_from_gguf(doc.get("meta") or {}, tensors)
    cfg = doc.get("config")
    if not isinstance(cfg, dict):
        raise FitError("no config.json beside the safetensors files (the KV cache needs layers and heads)")
    return _shape_from_config(cfg, tensors)


def _shape_from_config(config: Mapping[str, Any], tensors: tuple[TensorGroup, ...]) -> ModelShape:
    # multimodal checkpoints keep the language model's keys under text_config (vLLM hf_text_config)
    text_config = config.get("text_config")
    cfg: Mapping[str, Any] = text_config if isinstance(text_config, dict) else config
    layers = _need_int(cfg, "layer count", "num_hidden_layers", "n_layer", "num_layers")
    heads = _need_int(cfg, "attention heads", "num_attention_heads", "n_head")
    if cfg.get("multi_query"):
        kv = 1
    else:
        kv = _first(cfg, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num") or heads
    hidden = _need_int(cfg, "hidden size", "hidden_size", "n_embd", "d_model")
    head_dim = _first(cfg, "head_dim", "hidden_size_per_head") or hidden // heads
    mla = None
    if isinstance(cfg.get("kv_lora_rank"), int):
        mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
    dtype = str(_first(cfg, "torch_dtype", "dtype") or _first(config, "torch_dtype", "dtype") or "bfloat16")
    return ModelShape(
        kind="safetensors", layers=layers, heads=heads, kv_heads=int(kv), head_dim=int(head_dim),
        v_head_dim=int(cfg.get("v_head_dim") or head_dim), hidden=hidden,
        vocab=int(cfg.get("vocab_size") or config.get("vocab_size") or 0),
        intermediate=int(_first(cfg, "moe_intermediate_size", "intermediate_size", "ffn_dim") or 4 * hidden),
        dtype_bytes=TORCH_DTYPE_BYTES.get(dtype, 2), mla_latent=mla, tensors=tensors,
        arch=str(cfg.get("model_type") or ""))


def _shape_from_gguf(meta: Mapping[str, Any], tensors: tuple[TensorGroup, ...]) -> ModelShape:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise FitError("the GGUF has no general.architecture")

    def key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    layers = key("block_count")
    heads = key("attention.head_count")
    hidden = key("embedding_length")
    if not all(isinstance(v, int) and v > 0 for v in (layers, hidden)):
        raise FitError(f"the GGUF lacks {arch}.block_count / {arch}.embedding_length")
    # per-layer arrays (some architectures vary heads by layer): the largest, as the KV cache sizes each layer
    heads = max(heads) if isinstance(heads, list) else heads
    kv = key("attention.head_count_kv")
    kv = max(kv) if isinstance(kv, list) else (kv if isinstance(kv, int) else heads)
    if not isinstance(heads, int) or heads <= 0:
        raise FitError(f"the GGUF lacks {arch}.attention.head_count")
    k_len = key("attention.key_length") or hidden // heads  # llama-hparams: n_embd_head_k defaults to n_embd / n_head
    v_len = key("attention.value_length") or k_len
    tok = meta.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (tok.get("len") if isinstance(tok, dict) else 0)
    return ModelShape(kind="gguf", layers=layers, heads=heads, kv_heads=int(kv), head_dim=int(k_len),
                      v_head_dim=int(v_len), hidden=hidden, vocab=int(vocab or 0),
                      intermediate=int(key("feed_forward_length") or 4 * hidden) if not isinstance(
                          key("feed_forward_length"), list) else max(key("feed_forward_length")),
                      dtype_bytes=2, tensors=tensors, arch=arch)


# --------------------------------------------------------------------------- sharding

_ROUTER = ("mlp.gate.weight", "block_sparse_moe.gate.weight", ".router.", "ffn_gate_inp", "shared_expert_gate")
_REPLICATED_LINEAR = ("kv_a_proj_with_mqa", "q_a_proj", "attn_kv_a_mqa", "attn_q_a.")  # vLLM deepseek_v2: disable_tp
_KV_PROJ = ("k_proj.", "v_proj.", "attn_k.", "attn_v.")
_QKV_FUSED = ("qkv_proj.", "query_key_value.", "attn_qkv.", "c_attn.")


def shard_fraction(t: TensorGroup, m: ModelShape, tp: int) -> float:
    """The share of one tensor of ``t`` a rank holds under TP ``tp`` (1.0: replicated)."""
    if tp <= 1:
        return 1.0
    p = t.pattern
    if len(t.shape) <= 1 or any(r in p for r in _ROUTER) or any(r in p for r in _REPLICATED_LINEAR):
        return 1.0
    kv_rank = max(1, m.kv_heads // tp)
    if any(k in p for k in _KV_PROJ):
        return kv_rank / m.kv_heads
    if any(k in p for k in _QKV_FUSED):
        q = m.heads * m.head_dim
        kvw = m.kv_heads * (m.head_dim + m.v_head_dim)
        return (q / tp + kvw * kv_rank / m.kv_heads) / (q + kvw)
    return 1.0 / tp


@dataclass(frozen=True)
class RankWeights:
    bytes: int
    replicated_bytes: int  # per rank, of tensors every rank holds whole
    replicated: tuple[str, ...]  # their patterns


def rank_weights(m: ModelShape, tp: int) -> RankWeights:
    total = 0.0
    rep = 0
    names: list[str] = []
    for t in m.tensors:
        f = shard_fraction(t, m, tp)
        b = t.nbytes() * t.count
        total += b * f
        if f == 1.0 and tp > 1:
            rep += b
            names.append(t.pattern)
    return RankWeights(int(total), rep, tuple(names))


# --------------------------------------------------------------------------- KV cache


def kv_bytes_per_token(m: ModelShape, tp: int, kv_bytes: float, engine: str = "vllm") -> float:
    """Bytes of KV cache one token takes on one rank."""
    if m.mla_latent and engine in ("vllm", "sglang"):
        return m.layers * m.mla_latent * kv_bytes
    kv_rank = max(1, m.kv_heads // tp)
    return m.layers * kv_rank * (m.head_dim + m.v_head_dim) * kv_bytes


def arg_value(args: Sequence[str], *flags: str) -> str | None:
    """The value of the last of ``flags`` in an argv (``--flag value`` or ``--flag=value``)."""
    found = None
    for i, a in enumerate(args):
        for f in flags:
            if a == f and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(f + "="):
                found = a.split("=", 1)[1]
    return found


def kv_dtype_bytes(engine: str, args: Sequence[str], m: ModelShape) -> tuple[float, str]:
    """(bytes per KV element, how it was chosen) from the engine's flags."""
    if engine == "llamacpp":
        k = arg_value(args, "--cache-type-k", "-ctk") or "f16"
        v = arg_value(args, "--cache-type-v", "-ctv") or "f16"
        for flag in ("--type_k", "--type_v"):  # llama-cpp-python's server: a ggml type number
            n = arg_value(args, flag)
            if n is not None and n.isdigit() and int(n) in GGML_TYPES:
                k, v = (GGML_TYPES[int(n)][0].lower(), v) if flag == "--type_k" else (k, GGML_TYPES[int(n)][0].lower())
        sizes = []
        for name in (k, v):
            blk, size = GGML_BY_NAME.get(name.lower(), (1, 2))
            sizes.append(size / blk)
        return (sizes[0] + sizes[1]) / 2, f"K {k}, V {v}"
    flag = arg_value(args, "--kv-cache-dtype") or "auto"
    if flag == "auto":
        return m.dtype_bytes, f"auto (the model's {m.dtype_bytes:g}-byte dtype)"
    return KV_DTYPE_BYTES.get(flag, 2), flag


def llama_n_ctx(ctx: int, n_seq: int, unified: bool) -> int:
    """The cells llama.cpp allocates (src/llama-context.cpp)."""
    n = -(-ctx // LLAMA_CTX_PAD) * LLAMA_CTX_PAD
    if unified or n_seq <= 1:
        return n
    per = -(-(n // n_seq) // LLAMA_CTX_PAD) * LLAMA_CTX_PAD
    return per * n_seq


def llama_compute_bytes(m: ModelShape, n_ctx: int, flash_attn: bool) -> int:
    """An estimate of llama.cpp's compute buffer for one ubatch of 512 tokens: the attention scores
    (f32, one per head per cell, plus the mask) unless flash attention, else the f16 mask; logits and
    the widest activations. Measured against llama.cpp's own `compute buffer size` in tests."""
    attn = LLAMA_UBATCH * n_ctx * (2 if flash_attn else (m.heads + 1) * 4)
    rest = LLAMA_UBATCH * (m.vocab + 4 * m.hidden + 2 * m.intermediate) * 4
    return attn + rest


def vllm_activation_bytes(m: ModelShape, tp: int, batched_tokens: int, max_num_seqs: int) -> int:
    """An estimate of vLLM's profiled peak activation: ``profile_run`` pushes max_num_batched_tokens
    through the model (hidden states, the rank's MLP intermediate, in the model dtype) and the sampler
    warm-up holds max_num_seqs rows of f32 logits."""
    act = batched_tokens * (4 * m.hidden + 2 * m.intermediate // max(1, tp)) * m.dtype_bytes
    logits = max_num_seqs * (m.vocab // max(1, tp) if tp > 1 else m.vocab) * 4
    return int(act + logits)


def vllm_num_blocks(available_bytes: int, page_bytes_per_layer: int, layers: int) -> int:
    """vllm/v1/core/kv_cache_utils.py get_num_blocks: available // page_size // num_layers."""
    return max(int(available_bytes // page_bytes_per_layer // layers), 0)


def vllm_kv_tokens(num_blocks: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> int:
    """_report_kv_cache_config's "GPU KV cache size: N tokens" for one KV cache group."""
    return num_blocks * block_tokens


def vllm_max_concurrency(num_blocks: int, max_model_len: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> float:
    """get_max_concurrency_for_kv_cache_config for one full-attention group: blocks / blocks per request."""
    return num_blocks / -(-max_model_len // block_tokens)


def sglang_max_num_token(available_after_load: int, total: int, mem_fraction_static: float, cell_size: float) -> int:
    """model_runner.py profile_max_num_token: (available - total x (1 - frac)) // cell_size (bytes here)."""
    rest = available_after_load - total * (1 - mem_fraction_static)
    return int(rest // cell_size)


def sglang_kv_size_bytes(num_tokens: int, layers: int, kv_heads_rank: int, head_dim: int, elem_bytes: float,
                         page_size: int = 1) -> tuple[int, int]:
    """memory_pool.py MHATokenToKVPool: K and V buffers of (size + page_size) x heads x head_dim per layer."""
    one = int(layers * (num_tokens + page_size) * kv_heads_rank * head_dim * elem_bytes)
    return one, one


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class NodeMemory:
    total_bytes: int
    available_bytes: int
    engine_running: bool = False


@dataclass(frozen=True)
class Fit:
    """One rank on one node: the figures and the verdict."""

    engine: str
    tp: int
    context_tokens: int
    concurrency: int  # sequences the engine runs at once (max-num-seqs, --parallel)
    concurrency_source: str
    weights_bytes: int
    replicated_bytes: int
    replicated: tuple[str, ...]
    kv_dtype: str
    kv_bytes_per_token: float
    kv_cache_bytes: int  # what the engine holds for KV (llama.cpp: n_ctx cells; fraction engines: its pool)
    kv_one_request_bytes: int  # one request of context_tokens
    overhead_bytes: int  # activations / compute buffer / non-torch: estimates
    overhead_note: str
    committed_bytes: int  # what the engine process will hold on the node
    budget_bytes: int | None  # fraction engines: utilization x total
    node: NodeMemory
    min_free_bytes: int
    kv_tokens: int  # tokens the KV cache holds
    max_concurrency: float  # kv_tokens / context_tokens (vLLM's "Maximum concurrency")
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def headroom_bytes(self) -> int:
        """What stays free beyond what the law asks (negative: short by that much)."""
        base = self.node.total_bytes if self.node.engine_running else self.node.available_bytes
        return base - self.committed_bytes - (0 if self.budget_bytes is not None else self.min_free_bytes)


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= 64 * MIB else f"{n / MIB:.2f} MiB"


def fit(m: ModelShape, *, engine: str, tp: int, context_tokens: int, args: Sequence[str],
        utilization: float, min_free_gib: float, node: NodeMemory, binary: str = "") -> Fit:
    """The figures of one rank of ``m`` on ``node`` and what is wrong with them (``problems``)."""
    w = rank_weights(m, tp)
    kvb, kv_note = kv_dtype_bytes(engine, args, m)
    per_tok = kv_bytes_per_token(m, tp, kvb, engine)
    one = int(per_tok * context_tokens)
    min_free = int(min_free_gib * GIB)
    problems: list[str] = []
    budget: int | None = None
    if engine == "llamacpp":
        py = "llama_cpp.server" in binary
        par = arg_value(args, "--parallel", "-np")
        n_seq = int(par) if par and par.lstrip("-").isdigit() and int(par) > 0 else 1
        unified = "--kv-unified" in args or "-kvu" in args or py
        cells = llama_n_ctx(context_tokens, 1 if py else n_seq, unified)
        kv_cache = int(per_tok * cells)
        fa_flag = arg_value(args, "--flash-attn", "-fa", "--flash_attn")
        flash = (fa_flag or ("off" if py else "auto")).lower() in ("on", "auto", "true", "1")
        overhead = llama_compute_bytes(m, cells, flash)
        note = (f"compute buffer estimate ({'flash attention' if flash else 'no flash attention'}, "
                f"ubatch {LLAMA_UBATCH})")
        committed = w.bytes + kv_cache + overhead
        conc, conc_src = (1, "llama-cpp-python: one sequence") if py else (
            n_seq, f"--parallel {n_seq}, {'one KV buffer shared (--kv-unified)' if unified else 'ctx split per slot'}")
        kv_tokens = cells
    else:
        budget = int(utilization * node.total_bytes)
        if engine == "vllm":
            seqs = arg_value(args, "--max-num-seqs")
            conc = int(seqs) if seqs and seqs.isdigit() else VLLM_DEFAULT_MAX_NUM_SEQS
            conc_src = "--max-num-seqs" if seqs else "vLLM's default on a >= 70 GiB device"
            bt = arg_value(args, "--max-num-batched-tokens")
            overhead = vllm_activation_bytes(m, tp, int(bt) if bt and bt.isdigit() else VLLM_DEFAULT_MAX_BATCHED_TOKENS,
                                             conc) + NON_TORCH_ESTIMATE_BYTES
            note = "peak activation + non-torch memory estimate (vLLM profiles them at start)"
        else:
            mr = arg_value(args, "--max-running-requests")
            conc = int(mr) if mr and mr.isdigit() else 0
            conc_src = "--max-running-requests" if mr else "derived by the engine from its pool"
            overhead = NON_TORCH_ESTIMATE_BYTES
            note = "non-torch memory estimate (CUDA context, NCCL)"
        pool = budget - w.bytes - overhead
        kv_cache = max(0, pool)
        if engine == "vllm":
            layers = m.layers
            page = max(1, int(per_tok / layers * VLLM_BLOCK_TOKENS))
            blocks = vllm_num_blocks(kv_cache, page, layers)
            kv_tokens = vllm_kv_tokens(blocks)
        else:
            kv_tokens = int(kv_cache // per_tok) if per_tok else 0
        committed = budget
        if engine == "sglang":
            committed = budget + overhead  # activations and CUDA graphs live outside the static fraction
        if w.bytes + overhead >= budget:
            problems.append(f"weights {gib(w.bytes)} per rank + {gib(overhead)} overhead exceed "
                            f"{utilization:g} x {gib(node.total_bytes)} = {gib(budget)}: the engine cannot load")
        elif one > kv_cache:
            problems.append(f"one request of {context_tokens:,} tokens needs {gib(one)} of KV cache, the pool "
                            f"holds {gib(kv_cache)} ({kv_tokens:,} tokens): the engine refuses to start")
    base = node.total_bytes if node.engine_running else node.available_bytes
    what = "MemTotal (an engine runs now; its memory is counted free)" if node.engine_running else "MemAvailable"
    # An engine that asks for a fraction is held to it (memory_guard caps the fraction at 0.92, the field
    # report's rule, which leaves less than laws.min_free_gib beside it on a 121.7 GiB box): the fraction
    # must be available. An engine without one (llama.cpp) takes what it needs: that plus the floor.
    floor = 0 if budget is not None else min_free
    if committed + floor > base:
        kept = f" and {gib(min_free)} must stay free (laws.min_free_gib)" if floor else ""
        problems.append(f"over-commit: the engine would hold {gib(committed)}{kept}, {what} is {gib(base)}: "
                        f"short by {gib(committed + floor - base)}; on GB10 that livelocks the box with no OOM kill")
    return Fit(engine=engine, tp=tp, context_tokens=context_tokens, concurrency=conc, concurrency_source=conc_src,
               weights_bytes=w.bytes, replicated_bytes=w.replicated_bytes, replicated=w.replicated,
               kv_dtype=kv_note, kv_bytes_per_token=per_tok, kv_cache_bytes=kv_cache, kv_one_request_bytes=one,
               overhead_bytes=overhead, overhead_note=note, committed_bytes=committed, budget_bytes=budget,
               node=node, min_free_bytes=min_free, kv_tokens=kv_tokens,
               max_concurrency=kv_tokens / context_tokens if context_tokens else 0.0, problems=tuple(problems))


def describe(f: Fit) -> dict[str, Any]:
    """The figures as data (``sparkctl fit --json``), bytes as integers."""
    return {
        "engine": f.engine, "tp": f.tp, "context_tokens": f.context_tokens, "concurrency": f.concurrency,
        "concurrency_source": f.concurrency_source, "weights_bytes": f.weights_bytes,
        "replicated_bytes": f.replicated_bytes, "replicated": list(f.replicated), "kv_dtype": f.kv_dtype,
        "kv_bytes_per_token": f.kv_bytes_per_token, "kv_cache_bytes": f.kv_cache_bytes,
        "kv_one_request_bytes": f.kv_one_request_bytes, "kv_tokens": f.kv_tokens,
        "max_concurrency": round(f.max_concurrency, 2), "overhead_bytes": f.overhead_bytes,
        "overhead_note": f.overhead_note, "committed_bytes": f.committed_bytes, "budget_bytes": f.budget_bytes,
        "mem_total_bytes": f.node.total_bytes, "mem_available_bytes": f.node.available_bytes,
        "engine_running": f.node.engine_running, "min_free_bytes": f.min_free_bytes,
        "headroom_bytes": f.headroom_bytes, "ok": f.ok, "problems": list(f.problems),
    }


def summary(f: Fit) -> str:
    """One line of figures (a verdict's observed value)."""
    budget = f" of {gib(f.budget_bytes)} ({f.engine} fraction)" if f.budget_bytes else ""
    return (f"weights {gib(f.weights_bytes)}/rank (TP{f.tp}), KV {gib(f.kv_cache_bytes)} "
            f"({f.kv_tokens:,} tokens at {f.kv_bytes_per_token:,.0f} B/token), overhead {gib(f.overhead_bytes)}"
            f"{budget}: holds {gib(f.committed_bytes)}")
