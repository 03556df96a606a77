"""The bench suites as data: prompts with exact token counts and request plans. PURE.

Owns: the prompt builders (a salt line first, then an instruction, then
filler text cut to an exact length for the simulated tokenizer), the request
plans of every suite (``prefill``, ``decode``, ``concurrency``, ``agent``,
``longctx``, ``warm-prefix``, ``peak``, ``quality``, ``soak``), the two agent
corpora, and the per-engine sampling fields (``ignore_eos``/``min_tokens``
only where the engine has them).

Must not: open a socket or a file, read a clock, draw random numbers, or
import the client. Salts are drawn by the runner and passed in; the quality
scenarios and their scorers live in :mod:`sparkctl.bench.quality`.

Token counting (the simulated engines' tokenizer, ``sparkctl/sim/engines/tokens.py``):
one token per whitespace word; a chat message costs its content's words plus
:data:`CHAT_TOKENS_PER_MESSAGE` template tokens. Real engines count with their
own tokenizer, so the runner always records ``usage.prompt_tokens`` too; the
target lengths here are exact only on the simulator.

Defaults of every suite: streaming, temperature 0, a fixed seed, thinking off,
a fresh salt per prompt (per *session* for multi-turn agent sessions and
warm-prefix pairs, whose point is to share a prefix).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

SUITES: tuple[str, ...] = ("prefill", "decode", "concurrency", "agent", "longctx", "warm-prefix", "peak",
                           "quality", "soak")
DEFAULT_SUITES: tuple[str, ...] = ("prefill", "decode", "concurrency")

CHAT_TOKENS_PER_MESSAGE = 4  # <|start|> role <|sep|> ... <|end|> (sim/engines/tokens.py)
SEED = 0                     # fixed sampling seed of every request
TEMPERATURE = 0.0
MIN_REPEATS = 2              # every point is measured at least twice ...
RECORD_REPEATS = 3           # ... and three times for a record claim (2-node report: medians of 3)

# Defaults when neither the profile nor the command line says (field reports' methods).
DEFAULT_PREFILL_LENGTHS = (2048, 8192, 32768, 131072)
DEFAULT_DECODE_TOKENS = 256          # "a short prompt, 256 tokens out"
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_AGENT_SESSIONS = (1, 4)
DEFAULT_LONGCTX_LENGTHS = (8192, 32768, 131072, 262144, 524288, 1000000)
DEFAULT_NEEDLE_DEPTHS = (0.5,)
DEFAULT_WARM_PREFIX_TOKENS = 22600   # the 2-node report's warm-prefix point
DEFAULT_SOAK_CONCURRENCY = 4

# Engines whose OpenAI API accepts vLLM's sampling extras. TensorFold ignores
# them (with a warning), llama.cpp's OpenAI server does not take them: a
# decode point there ends where the model stops, and short answers are flagged.
ENGINES_WITH_IGNORE_EOS = frozenset({"ds41f", "vllm", "sglang"})

Message = Mapping[str, str]
Corpus = Literal["draftable", "adversarial"]


def words(text: str) -> int:
    """Whitespace words of ``text`` (= tokens on the simulated tokenizer)."""
    return len(text.split())


def sim_prompt_tokens(messages: Sequence[Message]) -> int:
    """Prompt tokens of a chat request on the simulated tokenizer."""
    return sum(words(str(m.get("content") or "")) + CHAT_TOKENS_PER_MESSAGE for m in messages)


# --------------------------------------------------------------------------- text

# Plain technical prose (the author's prefill ran "on source text"). Any words
# would do for the simulator; real tokenizers see ordinary English.
_SOURCE = (
    "A switchless ring joins four small computers with copper cables so that every node talks to two "
    "neighbours and reaches the node across the ring through one of them. Each node holds a quarter of "
    "the weights of the model, computes its share of every layer, and exchanges partial results with its "
    "neighbours after each step. The head node accepts requests over plain HTTP, splits the prompt into "
    "pages, and schedules the prefill of a new request between the decode steps of the requests that are "
    "already streaming. Prefill is bound by compute and grows with the square of the prompt for the "
    "attention layers; decode is bound by memory bandwidth and by the latency of the collective "
    "operations on the ring. Operators cap the graphics clock to keep power and temperature steady, pin "
    "a kernel that is known to survive long runs, and keep enough free memory that the unified memory "
    "driver never has to over commit. When a cable is moved the whole ring is powered off at the wall "
    "because stale link state survives a warm reboot. Logs, counters and a simple health check that asks "
    "for the served model name tell whether the endpoint is really ready."
).split()


def filler(n_words: int, offset: int = 0) -> str:
    """``n_words`` words of source prose starting ``offset`` words into it (cycled)."""
    if n_words <= 0:
        return ""
    n = len(_SOURCE)
    return " ".join(_SOURCE[(offset + i) % n] for i in range(n_words))


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Needle:
    """A sentence to retrieve, placed at a fraction of the prompt."""

    key: str
    code: str
    depth_fraction: float

    @property
    def sentence(self) -> str:
        return f"The secret passphrase for vault {self.key} is {self.code} ."

    @property
    def question(self) -> str:
        return (f"What is the secret passphrase for vault {self.key} mentioned in the text above? "
                "Answer with the passphrase only.")


@dataclass(frozen=True)
class Prompt:
    """A one-message prompt before its salt; see :func:`render_messages`.

    ``target_tokens`` is the whole prompt as the simulated tokenizer counts it
    (salt, template, instruction, needle and question included); ``None``
    means the instruction alone. Filler goes between the salt line and the
    instruction, so the instruction (the question) comes last, as a user
    would ask it after pasting a document.
    """

    instruction: str
    target_tokens: int | None = None
    filler_offset: int = 0
    needle: Needle | None = None


def render_messages(prompt: Prompt, salt: str) -> tuple[dict[str, str], ...]:
    """The chat messages of ``prompt`` with ``salt`` as the first line. Pure.

    Raises ValueError when ``target_tokens`` is too small to hold the fixed parts.
    """
    head = salt if salt.endswith("\n") or not salt else salt + "\n"
    fixed = CHAT_TOKENS_PER_MESSAGE + words(head) + words(prompt.instruction)
    if prompt.needle is not None:
        fixed += words(prompt.needle.sentence) + words(prompt.needle.question)
    if prompt.target_tokens is None:
        n_fill = 0
    else:
        n_fill = prompt.target_tokens - fixed
        if n_fill < 0:
            raise ValueError(f"a {prompt.target_tokens}-token prompt cannot hold its {fixed} fixed tokens")
    if prompt.needle is None:
        body = filler(n_fill, prompt.filler_offset)
        content = head + (body + "\n\n" if body else "") + prompt.instruction
    else:
        before = needle_words_before(prompt, n_fill)
        pre = filler(before, prompt.filler_offset)
        post = filler(n_fill - before, prompt.filler_offset + before)
        content = (head + (pre + "\n" if pre else "") + prompt.needle.sentence + "\n" + (post + "\n\n" if post else "")
                   + prompt.instruction + (" " if prompt.instruction else "") + prompt.needle.question)
    return ({"role": "user", "content": content},)


def needle_words_before(prompt: Prompt, n_fill: int) -> int:
    """Filler words placed before the needle: ``depth_fraction`` of the filler."""
    assert prompt.needle is not None
    return max(0, min(n_fill, round(n_fill * prompt.needle.depth_fraction)))


def needle_prefix_messages(prompt: Prompt, salt: str) -> tuple[dict[str, str], ...]:
    """The conversation cut right before the needle (salt and filler only).

    Its ``usage.prompt_tokens`` is the needle's usage-exact depth; it also
    warms the prefix cache for the full request, so a depth probe costs one
    prefill, not two.
    """
    full = render_messages(prompt, salt)[0]["content"]
    assert prompt.needle is not None
    cut = full.index(prompt.needle.sentence)
    return ({"role": "user", "content": full[:cut]},)


def sim_needle_depth_tokens(prompt: Prompt, salt: str) -> int:
    """The needle's depth on the simulated tokenizer (= the prefix probe's usage count)."""
    return sim_prompt_tokens(needle_prefix_messages(prompt, salt))


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Ask:
    """One request of a plan: a prompt, its length limits and extra body fields."""

    prompt: Prompt
    max_tokens: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    keep_text: bool = False
    expect_tokens: int | None = None
    """Completion tokens asked for; an answer with fewer is flagged ``short``."""


@dataclass(frozen=True)
class Point:
    """One point of a suite, measured ``repeats`` times.

    ``together``: the asks are released behind one gate (a concurrency level);
    otherwise they are sent one after another.
    """

    suite: str
    name: str
    params: Mapping[str, Any]
    asks: tuple[Ask, ...]
    repeats: int
    together: bool = False
    warm: bool = False
    """Send one untimed copy of the first ask before the repeats (the peak ruler: 'warmed')."""


def decode_extras(engine: str | None, n_tokens: int) -> dict[str, Any]:
    """``ignore_eos`` + ``min_tokens`` where the engine has them, else nothing."""
    if engine in ENGINES_WITH_IGNORE_EOS:
        return {"ignore_eos": True, "min_tokens": n_tokens}
    return {}


def context_window(models_entry: Mapping[str, Any] | None, props: Mapping[str, Any] | None,
                   profile_tokens: int | None, slot_tokens: int | None = None) -> tuple[int | None, str | None]:
    """The context window one request may use, and where that figure came from. Pure.

    In order of trust: what the server says applies now (vLLM/SGLang/ds41f
    ``/v1/models`` ``max_model_len``, a ``context_length`` field, llama.cpp's
    ``/props`` ``default_generation_settings.n_ctx``, i.e. the per-slot window,
    or a top-level ``n_ctx``); then ``slot_tokens``, llama-server's per-slot
    window from the rendered flags (:func:`llama_server_slot_ctx`: without
    ``--kv-unified`` a slot gets ``ctx-size / parallel``, less than the
    profile's figure); then the profile's ``model.context_len_tokens``;
    last llama.cpp's ``/v1/models`` ``meta.n_ctx_train`` (the training length:
    an upper bound, the server may run with less). llama-cpp-python's server
    reports none of these.
    """

    def pos_int(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    entry = models_entry or {}
    for key in ("max_model_len", "context_length"):
        if (n := pos_int(entry.get(key))) is not None:
            return n, f"/v1/models {key}"
    if props:
        gen = props.get("default_generation_settings")
        if isinstance(gen, Mapping) and (n := pos_int(gen.get("n_ctx"))) is not None:
            return n, "/props default_generation_settings.n_ctx"
        if (n := pos_int(props.get("n_ctx"))) is not None:
            return n, "/props n_ctx"
    if (n := pos_int(slot_tokens)) is not None:
        return n, "llama-server flags: ctx-size / parallel (no /props)"
    if (n := pos_int(profile_tokens)) is not None:
        return n, "profile model.context_len_tokens"
    meta = entry.get("meta")
    if isinstance(meta, Mapping) and (n := pos_int(meta.get("n_ctx_train"))) is not None:
        return n, "/v1/models meta.n_ctx_train"
    return None, None


def llama_server_slot_ctx(argv: Sequence[str]) -> int | None:
    """The context one request gets from ``llama-server`` started with ``argv``. Pure.

    llama.cpp tools/server/server.cpp ``init()``: ``n_ctx_slot = n_ctx /
    params_base.n_parallel`` (every slot a 1/N share of ``--ctx-size``) unless
    ``--kv-unified``, where the slots share one buffer and a request may use all
    of it. ``--parallel`` absent counts as 1 (common/common.h ``n_parallel``);
    a negative value (an "auto" some builds accept) gives None: ask ``/props``,
    whose ``default_generation_settings.n_ctx`` is the slot's. None when
    ``--ctx-size`` is not given (the model's training length applies) or a value
    is unreadable.
    """
    ctx: int | None = None
    parallel, unified, auto = 1, False, False
    args = list(argv)
    for i, a in enumerate(args):
        key, _, inline = a.partition("=")
        val = inline or (args[i + 1] if i + 1 < len(args) else "")
        try:
            if key in ("-c", "--ctx-size"):
                ctx = int(val)
            elif key in ("-np", "--parallel"):
                parallel = int(val)
                auto = parallel < 0
        except ValueError:
            return None
        if key in ("-kvu", "--kv-unified"):
            unified = True
    if ctx is None or ctx <= 0 or auto or parallel == 0:
        return None
    return ctx if unified else ctx // parallel


# --------------------------------------------------------------------------- fitting the window
#
# The engine refuses a request whose prompt (by ITS tokenizer) plus max_tokens
# exceeds the window, and the bench counts prompts in whitespace words. The
# runner therefore asks the engine (``usage.prompt_tokens`` of max_tokens-1
# probes) for the exact count of each prompt's fixed part (salt, template,
# instruction, needle) and for the filler's tokens per word, and estimates
#   NEED = fixed + ceil(filler_words * tokens_per_word * (1 + FIT_MARGIN_FRACTION))
#          + FIT_MARGIN_TOKENS + max_tokens.

# Filler words cost different token counts at different offsets into the prose:
# on the tiny llama.cpp model's tokenizer (sparkctl_sim.tinymodel) the probe read
# 3.34 tokens a word, and 32-to-120-word spans at 20 other offsets 2.78 to 3.72
# (the widest on the shortest spans, where the fixed 16 tokens below cover the rest).
FIT_MARGIN_FRACTION = 0.10
# A fresh salt (16 random hex digits) tokenizes differently from the probe's salt.
FIT_MARGIN_TOKENS = 16
# Without usage counts from the engine: an assumption about tokens per bench
# token, above English BPE's ~1.3-1.5 tokens per word. Small-vocabulary
# tokenizers count more (tiny-llama: 3 per word of filler), but they report usage.
ASSUMED_TOKENS_PER_WORD = 2.0


@dataclass(frozen=True)
class TokenScale:
    """How many engine tokens a word of filler costs, and where that figure came from."""

    filler_tokens_per_word: float
    source: str

    def need(self, fixed_tokens: int, filler_words: int, max_tokens: int) -> int:
        """Tokens a request needs in the window (see the block comment above). Pure."""
        filler = math.ceil(filler_words * self.filler_tokens_per_word * (1 + FIT_MARGIN_FRACTION))
        return fixed_tokens + filler + FIT_MARGIN_TOKENS + max_tokens


def assumed_tokens(bench_tokens: int) -> int:
    """Engine tokens for ``bench_tokens`` when the engine reports no usage."""
    return math.ceil(bench_tokens * ASSUMED_TOKENS_PER_WORD)


def bare(prompt: Prompt) -> Prompt:
    """``prompt`` without its filler: the part whose count the runner probes."""
    return replace(prompt, target_tokens=None)


def filler_words(prompt: Prompt, salt: str) -> int:
    """Filler words :func:`render_messages` puts into ``prompt`` (0 for a bare prompt)."""
    if prompt.target_tokens is None:
        return 0
    return prompt.target_tokens - sim_prompt_tokens(render_messages(bare(prompt), salt))


def fits_window(prompt_tokens: int, max_tokens: int, window: int | None) -> bool:
    """A prompt of ``prompt_tokens`` plus ``max_tokens`` out fits the window (unknown: assume it does)."""
    return window is None or prompt_tokens + max_tokens <= window


def repeats_for(requested: int | None, record: bool, profile_default: int | None = None) -> int:
    """Repeats per point: at least 2, at least 3 with ``--record``."""
    floor = RECORD_REPEATS if record else MIN_REPEATS
    want = requested if requested is not None else (profile_default or floor)
    return max(want, floor)


PREFILL_INSTRUCTION = "Summarize the text above in one word."
# Short on purpose ("a short prompt, 256 tokens out"): with c requests released
# together, the engine prefills them one after another, and every prompt token
# delays the last stream's first token, which the aggregate window includes.
DECODE_INSTRUCTION = "Write a long, detailed essay about how computer clusters serve language models. Keep writing."


def prefill_plan(lengths: Sequence[int], repeats: int) -> list[Point]:
    """One request per length, ``max_tokens`` 1: prefill = prompt tokens / TTFT."""
    return [Point("prefill", f"prefill/{n}", {"length_tokens": n},
                  (Ask(Prompt(PREFILL_INSTRUCTION, target_tokens=n), max_tokens=1),), repeats)
            for n in lengths]


def decode_plan(decode_tokens: int, repeats: int, engine: str | None) -> list[Point]:
    """A short prompt, ``decode_tokens`` out, one stream."""
    ask = Ask(Prompt(DECODE_INSTRUCTION), max_tokens=decode_tokens, extra_body=decode_extras(engine, decode_tokens),
              expect_tokens=decode_tokens)
    return [Point("decode", "decode/1", {"concurrency": 1, "decode_tokens": decode_tokens}, (ask,), repeats)]


def concurrency_plan(levels: Sequence[int], decode_tokens: int, repeats: int, engine: str | None) -> list[Point]:
    """``c`` decode requests released together per level (each with its own salt)."""
    points = []
    for c in levels:
        ask = Ask(Prompt(DECODE_INSTRUCTION), max_tokens=decode_tokens,
                  extra_body=decode_extras(engine, decode_tokens), expect_tokens=decode_tokens)
        points.append(Point("concurrency", f"concurrency/{c}", {"concurrency": c, "decode_tokens": decode_tokens},
                            (ask,) * c, repeats, together=True))
    return points


# --------------------------------------------------------------------------- peak (community ruler)

# Output a model can predict well (speculative decoding accepts most drafts):
# the "best content" of the community ruler.
PEAK_CONTENT: dict[str, str] = {
    "count": "Count from 1 to 1000 in words, one number per line, without any other text.",
    "code": ("Write a Python module with twenty small, fully typed utility functions for string handling, each with "
             "a docstring and doctests. Output only code."),
    "json": ("Output a JSON array of 200 objects with keys id (1 to 200), name (\"user\" followed by the id), and "
             "active (true). Output only JSON."),
}


def peak_plan(decode_tokens: int, repeats: int, engine: str | None) -> list[Point]:
    """Single stream, warmed, ``ignore_eos``, decode-only rate, per content; best content wins."""
    return [Point("peak", f"peak/{name}", {"content": name, "decode_tokens": decode_tokens, "ruler": "community"},
                  (Ask(Prompt(text), max_tokens=decode_tokens, extra_body=decode_extras(engine, decode_tokens),
                       expect_tokens=decode_tokens),), repeats, warm=True)
            for name, text in PEAK_CONTENT.items()]


# --------------------------------------------------------------------------- warm prefix


WARM_QUESTIONS = ("Which part of the text above is about power? Answer in one sentence.",
                  "Which part of the text above is about cables? Answer in one sentence.")


def warm_prefix_prompts(prefix_tokens: int) -> tuple[Prompt, Prompt]:
    """Two prompts sharing a ``prefix_tokens``-token document, different questions.

    Both are built to the same length, so the filler (the shared prefix) is
    identical word for word as long as the two questions have equal word counts.
    """
    q0, q1 = WARM_QUESTIONS
    assert words(q0) == words(q1)
    n = prefix_tokens + words(q0)
    return Prompt(q0, target_tokens=n), Prompt(q1, target_tokens=n)


# --------------------------------------------------------------------------- long context


def needle_code(i: int) -> tuple[str, str]:
    """A deterministic (vault key, passphrase) pair for ladder step ``i``."""
    colours = ("AMBER", "COBALT", "JADE", "SCARLET", "IVORY", "ONYX", "SAFFRON", "TEAL")
    return f"V{100 + i * 7}", f"{colours[i % len(colours)]}-{(4471 + i * 1319) % 10000:04d}"


def longctx_prompts(lengths: Sequence[int], depths: Sequence[float]) -> list[tuple[int, float, Prompt]]:
    """The needle ladder: one prompt per (total length, depth fraction)."""
    out = []
    i = 0
    for n in lengths:
        for d in depths:
            key, code = needle_code(i)
            out.append((n, d, Prompt("", target_tokens=n, needle=Needle(key, code, d))))
            i += 1
    return out


def needle_found(answer: str | None, needle: Needle) -> bool:
    """The passphrase appears in the answer (case and spacing insensitive)."""
    if not answer:
        return False
    norm = "".join(answer.upper().split())
    return needle.code.upper() in norm


# --------------------------------------------------------------------------- agent sessions

DRAFTABLE_TURNS: tuple[str, ...] = (
    'You can call get_weather(city: string, unit: "celsius" | "fahrenheit"). Reply only with the JSON tool call '
    'for: what is the weather in Oslo in celsius?',
    "Write a SQL query over orders(id, customer_id, total, created_at) returning each customer's total spend in "
    "2026, largest first. Output only SQL.",
    "Write a Python function parse_duration(text) that turns strings like '1h30m' or '45s' into seconds, with "
    "type hints and a docstring. Output only code.",
    "Return a JSON object describing three servers with fields name, ip, role and healthy. Output only JSON.",
    "Call search_tickets(status: string, assignee: string, limit: integer) to find my ten newest open tickets. "
    "Reply only with the JSON tool call.",
    "Refactor the function you wrote before to raise ValueError on bad input and add three doctests. Output only "
    "code.",
    "Write a SQL query joining customers(id, name) and orders(id, customer_id, total) that lists customers with "
    "no orders. Output only SQL.",
    "Convert the last JSON object you wrote into YAML with the same structure. Output only YAML.",
)

ADVERSARIAL_TURNS: tuple[str, ...] = (
    "Tell me a story about a lighthouse keeper who collects the sounds of storms, in your own words.",
    "What would a city planned by octopuses look like? Describe it freely, with surprising details.",
    "Write a letter from a retired cartographer to the river she mapped forty years ago.",
    "Argue both sides of whether memory is more like a library or a garden, then pick one.",
    "Describe the smell of an old bookshop to someone who has never been inside one.",
    "Continue the story, but tell it from the point of view of the storm.",
    "Invent a holiday for an imaginary country and explain its strange customs.",
    "Write a dialogue between a clock and a candle about the meaning of waiting.",
)

CORPORA: dict[str, tuple[str, ...]] = {"draftable": DRAFTABLE_TURNS, "adversarial": ADVERSARIAL_TURNS}
AGENT_SYSTEM = "You are a careful assistant working inside a software team's tools. Answer exactly what is asked."


@dataclass(frozen=True)
class SessionPlan:
    """A closed-loop agent session: its corpus, turn limits, and history budget."""

    corpus: str
    session: int
    max_tokens: int
    history_budget_tokens: int
    start_offset_s: float


def agent_sessions(corpus: str, n_sessions: int, *, max_tokens: int = 256, stagger_s: float = 0.5,
                   history_budget_tokens: int = 16384) -> list[SessionPlan]:
    """``n_sessions`` sessions over ``corpus``, started ``stagger_s`` apart."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; one of {', '.join(CORPORA)}")
    return [SessionPlan(corpus, i, max_tokens, history_budget_tokens, i * stagger_s) for i in range(n_sessions)]


def agent_turn_messages(plan: SessionPlan, salt: str, history: Sequence[Message], turn: int) -> list[dict[str, str]]:
    """The messages of turn ``turn``: system (salted), the history so far, the next user turn."""
    turns = CORPORA[plan.corpus]
    user = turns[(plan.session + turn) % len(turns)]
    head = salt if salt.endswith("\n") or not salt else salt + "\n"
    return [{"role": "system", "content": head + AGENT_SYSTEM}, *[dict(m) for m in history],
            {"role": "user", "content": user}]


def trim_history(history: Sequence[Message], budget_tokens: int) -> bool:
    """True when the history has outgrown its budget (the session then starts over)."""
    return sim_prompt_tokens(history) > budget_tokens


def agent_turn_index(plan: SessionPlan, turn: int) -> int:
    """Which user turn of the corpus turn ``turn`` of ``plan`` sends."""
    return (plan.session + turn) % len(CORPORA[plan.corpus])


def agent_next_prompt_tokens(prev_prompt_tokens: int, prev_answer_tokens: int, system_tokens: int,
                             fresh_turn_tokens: int) -> int:
    """The next turn's prompt in engine tokens: the previous prompt, its answer, the new user turn. Pure.

    ``fresh_turn_tokens`` is the count of (system, user turn) alone, so the
    system prompt is taken off it once; the answer (the runner passes the
    larger of its count out and its words at the filler's rate) gains a margin
    because it is re-tokenized from text, and an assistant message's template tokens.
    """
    answer = math.ceil(prev_answer_tokens * (1 + FIT_MARGIN_FRACTION)) + CHAT_TOKENS_PER_MESSAGE
    return prev_prompt_tokens + answer + max(0, fresh_turn_tokens - system_tokens)


AGENT_BACKOFF_BASE_S = 0.25  # first pause after a failed turn; doubles per failure in a row ...
AGENT_BACKOFF_CAP_S = 2.0    # ... up to this (a failing engine sees at most 1 request per 2 s per session)


def agent_backoff_s(consecutive_errors: int) -> float:
    """The pause of a session after its ``consecutive_errors``-th failed turn in a row (0: none). Pure."""
    if consecutive_errors <= 0:
        return 0.0
    return float(min(AGENT_BACKOFF_CAP_S, AGENT_BACKOFF_BASE_S * 2 ** (consecutive_errors - 1)))


# --------------------------------------------------------------------------- soak


SOAK_MIX: tuple[tuple[str, int, int], ...] = (
    # (kind, prompt tokens, max tokens): short chat, a document question, a long answer
    ("chat", 256, 64),
    ("document", 4096, 32),
    ("essay", 64, 256),
)


def soak_ask(i: int, engine: str | None, scale: float = 1.0,
             mix: Sequence[tuple[str, int, int]] = SOAK_MIX) -> tuple[str, Ask]:
    """Request ``i`` of the soak's mixed load (cycling through ``mix``, by default :data:`SOAK_MIX`)."""
    kind, n, m = mix[i % len(mix)]
    n = max(64, int(n * scale))
    instr = DECODE_INSTRUCTION if kind == "essay" else PREFILL_INSTRUCTION
    return kind, Ask(Prompt(instr, target_tokens=max(n, words(instr) + 8), filler_offset=i), max_tokens=m)


# --------------------------------------------------------------------------- thinking


def thinking_modes(request_fields: Mapping[str, Any] | None, default_on: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``[("off", {}), ("on", fields)]``; ``on`` only when the profile has a thinking knob."""
    modes: list[tuple[str, dict[str, Any]]] = [("off", {})]
    if request_fields:
        modes.append(("on", dict(request_fields)))
    if default_on:
        modes.reverse()
    return modes
