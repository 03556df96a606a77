"""The tiny real model the simulated cluster serves with the real llama.cpp engine.

SIMULATION ONLY. ``write_tiny_gguf`` generates a random-weight llama-architecture
GGUF of about 0.6 MB with the ``gguf`` package; nothing is downloaded. The
bytes depend only on the constants below (fixed numpy seed), so the file's
sha256 is stable and can key caches.

The model speaks noise, but through a real tokenizer, a real forward pass and
the real OpenAI-compatible server of llama-cpp-python, so a benchmark against
it measures real token counts and real ``usage`` blocks. Serve it with::

    python3 -m llama_cpp.server --model tiny-llama.gguf --model_alias tiny-llama \\
        --host 127.0.0.1 --port PORT --n_ctx 512

A random model samples its end-of-sequence token early now and then, and
llama-cpp-python may overshoot ``max_tokens`` by a few tokens when the text
ends inside a multi-byte UTF-8 character. To get exactly N completion tokens,
bias EOS (id 2) and the lead-byte tokens ``<0xC0>``..``<0xFF>`` (ids 195..258)
away::

    POST /v1/completions
    {"model": "tiny-llama", "prompt": "hello", "max_tokens": N, "temperature": 0,
     "logit_bias": {"2": -100, "195": -100, ..., "258": -100}}

which answers ``"finish_reason": "length"`` and
``"usage": {"completion_tokens": N, ...}``; ``tiny_completion_request`` builds
that body. The same ``logit_bias`` works for ``/v1/chat/completions``.

What this module must not do: download anything, or import llama_cpp (the
engine is a separate process; only tests start it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

TINY_MODEL_FILENAME = "tiny-llama.gguf"
TINY_MODEL_ALIAS = "tiny-llama"

SEED = 20240611  # any fixed value: the file hash depends on it
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_CTX_TRAIN = 2048
RMS_EPS = 1e-5
WEIGHT_STD = 0.02  # GPT-2 style init: logits stay small, sampling stays near uniform

UNK_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
BYTE_TOKEN_BASE = 3  # <0x00> is token 3, <0xFF> token 258

# Jinja template for llama-cpp-python's chat endpoint (it builds a
# Jinja2ChatFormatter from tokenizer.chat_template when present).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# SentencePiece marks a preceding space with U+2581.
_SP = "\u2581"
_WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which "
    "this be or has had not but their one all been also new can more its first after who "
    "two they other when into time only most some over than about would may between there "
    "so up out these where such many then him year years under three before while used "
    "during them both well while through each model spark node ring cable token engine "
    "server cluster memory clock fabric rank tensor parallel launch serve bench latency "
    "throughput request prompt answer hello world yes no good fast slow data value state"
).split()


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types; every token string is unique (llama.cpp asserts it)."""
    # gguf TokenType values: NORMAL=1, UNKNOWN=2, CONTROL=3, BYTE=6.
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces: list[str] = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces += list(letters) + list(letters.upper()) + list("0123456789.,!?;:'\"-()")
    pieces += [_SP + c for c in letters] + [_SP]
    # Prefixes make SentencePiece's greedy merges reach whole words.
    for word in _WORDS:
        for end in range(2, len(word) + 1):
            pieces.append(_SP + word[:end])
    seen = set(tokens)
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
    # Longer pieces score higher so merges prefer them; specials and bytes score 0.
    scores = [0.0] * (3 + 256) + [float(len(t)) - i * 1e-4 for i, t in enumerate(tokens[259:])]
    return tokens, scores, types


def write_tiny_gguf(path: Path) -> Path:
    """Write the tiny random llama GGUF to ``path`` (overwriting) and return ``path``."""
    import gguf  # heavy import kept local: only callers that build the model pay for it
    import numpy as np

    tokens, scores, types = _vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    def weight(*shape: int) -> Any:
        return (rng.standard_normal(shape) * WEIGHT_STD).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("sparkctl-sim-tiny-llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_TOKEN_ID)
    writer.add_bos_token_id(BOS_TOKEN_ID)
    writer.add_eos_token_id(EOS_TOKEN_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are ggml's ne reversed: (rows, cols) = (out, in).
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(N_EMBD * N_HEAD_KV // N_HEAD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(N_EMBD * N_HEAD_KV // N_HEAD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ensure_tiny_model(cache_dir: Path) -> Path:
    """Return ``cache_dir/tiny-llama.gguf``, writing it once (temp file + rename).

    Concurrent callers may both write; each renames a complete file over the
    same name, and the bytes are identical, so readers never see a torn file.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / TINY_MODEL_FILENAME
    if final.is_file():
        return final
    fd, tmp_name = tempfile.mkstemp(prefix=f".{TINY_MODEL_FILENAME}.", suffix=".tmp",
                                    dir=cache_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write_tiny_gguf(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def exact_length_logit_bias() -> dict[str, float]:
    """The ``logit_bias`` that makes generation stop only at ``max_tokens``.

    Two things end or stretch a random model's output: its EOS token (it stops
    early), and UTF-8 lead-byte tokens ``<0xC0>``..``<0xFF>``: llama-cpp-python
    (0.3.x, ``Llama._create_completion``) holds back an incomplete multi-byte
    character by skipping the ``max_tokens`` check, so ``completion_tokens`` can
    exceed ``max_tokens`` by a few. Biasing both away makes ``usage`` exact.
    """
    bias = {str(EOS_TOKEN_ID): -100.0}
    for byte in range(0xC0, 0x100):
        bias[str(BYTE_TOKEN_BASE + byte)] = -100.0
    return bias


def tiny_completion_request(prompt: str, n_tokens: int, model: str = TINY_MODEL_ALIAS) -> dict[str, Any]:
    """A ``/v1/completions`` body that makes the tiny model produce exactly ``n_tokens``.

    The answer has ``finish_reason == "length"`` and
    ``usage.completion_tokens == n_tokens`` (any temperature; greedy here).
    """
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": n_tokens,
        "temperature": 0.0,
        "logit_bias": exact_length_logit_bias(),
        "stream": False,
    }
