"""The simulated tokenizer, chat template, prefix cache and generated text.

Pure (no clock, no I/O). The rules, which tests and benches may rely on:

* Tokenizer: one token per whitespace-separated word. A completions prompt
  may be a string, a list holding one string, or a list of token ids (one token
  per id).
* Chat template: each message costs 4 template tokens (``<|start|>``, the
  role, ``<|sep|>`` before the content and ``<|end|>`` after it) plus the words
  of its content (a string, or the ``text`` of each ``{"type": "text"}`` part).
  So prompt_tokens = sum(words of every content) + 4 * number of messages.
* Prefix cache: prompts are cut into 256-token pages; each full page is keyed
  by a hash chained over all pages before it, kept in an LRU of
  ``PrefixCache.capacity_pages`` pages. A request whose first k full pages are
  cached reports ``cached_tokens = k * 256``. As in vLLM, the last prompt
  token is always computed, so at most ``(n - 1) // 256`` pages can hit. Only
  prompt pages are cached (not generated tokens).
* Generated text: deterministic words drawn from a small vocabulary by a
  generator seeded from the prompt tokens and the request ``seed`` (or from
  fresh randomness when temperature > 0 and no seed is given). The natural
  answer length, used unless ``ignore_eos``/``min_tokens`` say otherwise, is
  120-220 tokens from the same seed.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PAGE_TOKENS = 256
CHAT_TOKENS_PER_MESSAGE = 4
NATURAL_MIN_TOKENS = 120
NATURAL_MAX_TOKENS = 220

_VOCAB = (
    "the ring carries every token across four nodes while each rank holds a "
    "quarter of the weights and the head streams answers back to the client "
    "over a plain socket so latency stays low and throughput scales with the "
    "batch until memory bandwidth becomes the limit of decode speed for this "
    "model on unified memory boxes linked by copper cables in a loop"
).split()


class PromptError(ValueError):
    """A request whose prompt or messages cannot be tokenized (HTTP 400)."""


def tokenize_prompt(prompt: Any) -> list[str]:
    """Tokens of a /v1/completions ``prompt``."""
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list):
        if not prompt:
            raise PromptError("prompt must not be empty")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [f"<{t}>" for t in prompt]
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0].split()
        if all(isinstance(p, str) for p in prompt):
            raise PromptError("batched prompts (a list of several strings) are not supported")
    raise PromptError("prompt must be a string, a list of one string, or a list of token ids")


def _content_words(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):
        words: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise PromptError("message content parts must be objects")
            if part.get("type") == "text":
                text = part.get("text", "")
                if not isinstance(text, str):
                    raise PromptError("text part must carry a string 'text'")
                words.extend(text.split())
        return words
    raise PromptError("message content must be a string or a list of parts")


def tokenize_chat(messages: Any) -> list[str]:
    """Tokens of a /v1/chat/completions ``messages`` list, template included."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list")
    tokens: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise PromptError("each message needs a string 'role'")
        tokens += ["<|start|>", m["role"], "<|sep|>", *_content_words(m.get("content")), "<|end|>"]
    return tokens


def page_hashes(tokens: Sequence[str], page_tokens: int = PAGE_TOKENS) -> list[bytes]:
    """Chained hashes of every full page of ``tokens``."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update("\x00".join(tokens[start : start + page_tokens]).encode())
        prev = h.digest()
        out.append(prev)
    return out


class PrefixCache:
    """LRU of prompt pages; see the module docstring for the rules."""

    def __init__(self, capacity_pages: int = 4096, page_tokens: int = PAGE_TOKENS) -> None:
        self.capacity_pages = capacity_pages
        self.page_tokens = page_tokens
        self._pages: OrderedDict[bytes, None] = OrderedDict()

    def lookup(self, tokens: Sequence[str]) -> int:
        """Number of cached prompt tokens (a multiple of the page size)."""
        usable = max(0, len(tokens) - 1) // self.page_tokens
        hits = 0
        for h in page_hashes(tokens[: usable * self.page_tokens], self.page_tokens):
            if h not in self._pages:
                break
            self._pages.move_to_end(h)
            hits += 1
        return hits * self.page_tokens

    def insert(self, tokens: Sequence[str]) -> None:
        for h in page_hashes(tokens, self.page_tokens):
            self._pages[h] = None
            self._pages.move_to_end(h)
        while len(self._pages) > self.capacity_pages:
            self._pages.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pages)


@dataclass(frozen=True)
class Answer:
    """The tokens a request will produce and why it stops."""

    pieces: tuple[str, ...]  # text of each generated token, in order
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None  # the matched stop string, if any

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _seed_of(tokens: Sequence[str], seed: int | None, temperature: float) -> int:
    if seed is None and temperature > 0:
        return int.from_bytes(os.urandom(8), "big")
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(seed).encode())
    h.update(b"\x01")
    h.update("\x00".join(tokens).encode())
    return int.from_bytes(h.digest(), "big")


def natural_length(tokens: Sequence[str], seed: int | None = None) -> int:
    """Where the answer ends on its own (the simulated EOS), 120-220 tokens."""
    rng = random.Random(_seed_of(tokens, seed, 0.0))
    return rng.randint(NATURAL_MIN_TOKENS, NATURAL_MAX_TOKENS)


def plan_answer(
    tokens: Sequence[str],
    *,
    max_tokens: int,
    seed: int | None = None,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    stop: Sequence[str] = (),
) -> Answer:
    """The full deterministic answer of a request."""
    natural = natural_length(tokens, seed)
    if ignore_eos:
        n, reason = max_tokens, "length"
    else:
        end = max(natural, min_tokens)
        n, reason = (end, "stop") if end < max_tokens else (max_tokens, "length")
    rng = random.Random(_seed_of(tokens, seed, temperature))
    words = [rng.choice(_VOCAB) for _ in range(n)]
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    for i in range(11, n, 12):  # a sentence every dozen words
        pieces[i] += "."
    stops = [x for x in stop if x]
    if stops:
        text = ""
        for i, piece in enumerate(pieces):
            before = len(text)
            text += piece
            if i + 1 < min_tokens:  # vLLM checks stop strings only after min_tokens
                continue
            found = [
                (j, x)
                for x in stops
                if (j := text.find(x, max(0, before - len(x) + 1) if i + 1 > min_tokens else 0)) >= 0
            ]
            if found:
                j, which = min(found)
                return Answer(_cut(pieces[: i + 1], j), "stop", which)
    return Answer(tuple(pieces), reason, None)


def _cut(pieces: Sequence[str], length: int) -> tuple[str, ...]:
    """``pieces`` with their joined text truncated to ``length`` characters."""
    out: list[str] = []
    used = 0
    for p in pieces:
        keep = max(0, min(len(p), length - used))
        out.append(p[:keep])
        used += keep
    return tuple(out)
