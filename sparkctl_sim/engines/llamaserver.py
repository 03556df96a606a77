"""A SIMULATED ``llama-server`` (llama.cpp's HTTP server): its command line, slots and HTTP API.

Not the real engine: it loads no weights and its timing is the one-box figures
of :mod:`sparkctl_sim.perfmodel`. What it keeps of the real one (llama.cpp as
vendored in llama-cpp-python 0.3.36, the copy the contract
``sparkctl/plan/contracts/llamacpp-b6500.json`` was taken from; paths below are
in that tree):

* the command line: exactly the flags of the contract. common/arg.cpp
  ``common_params_parse_ex``: a ``--`` argument has ``_`` replaced by ``-``, an
  unknown one throws ``error: invalid argument: ARG`` (printed alone on stderr,
  exit 1: tools/server/server.cpp ``main``, ``if (!common_params_parse(...))
  return 1``); ``--flag=value`` is not split (it is an unknown argument, as
  there); a value that ``std::stoi`` cannot read is ``error while handling
  argument "ARG": stoi``;
* the model file must exist: ggml/src/gguf.cpp ``gguf_init_from_file_impl:
  failed to open GGUF file`` then server-context.cpp ``failed to load model``
  and server.cpp ``exiting due to model loading error`` (exit 1). STRICTER: the
  file must also begin with the GGUF magic (the real loader reads the header
  and refuses it too, with another message);
* the slots: ``--parallel`` slots (absent or ``-1``: auto, 4 slots and a
  unified KV, server.cpp ``main``), each with ``n_ctx_slot = --ctx-size /
  n_parallel`` unless ``--kv-unified`` (server-context.cpp ``n_ctx_slot()``,
  ``llama_n_ctx_seq``), capped at the model's training length; ``--ctx-size``
  0 or absent = that training length (common/common.h ``n_ctx = 0``);
* a prompt of ``n_ctx_slot`` tokens or more is refused: HTTP 400,
  ``exceed_context_size_error``, ``request (N tokens) exceeds the available
  context size (M tokens), try increasing it`` with ``n_prompt_tokens`` and
  ``n_ctx`` (server-context.cpp ``update_slots``, server-task.cpp
  ``server_task_result_error::to_json``, server-common.cpp
  ``format_error_response``). A prompt that fits but whose ``max_tokens`` do
  not is answered, cut where the slot is full (finish_reason ``length``):
  context shift is off by default (common.h ``ctx_shift = false``;
  server-context.cpp "stopped due to running out of context capacity");
* ``/health`` (503 ``Loading model`` while loading: server-http.cpp
  ``middleware_server_state``), ``/v1/models`` (``owned_by: llamacpp`` and
  ``meta.n_ctx`` = the slot's window: ``get_res_model_info``), ``/props``
  (``default_generation_settings.n_ctx`` = the slot's window and
  ``total_slots``: server-context.cpp ``get_res_props``), ``/slots`` (501
  with ``--no-slots``), ``/metrics`` only with ``--metrics`` (else 501 "This
  server does not support metrics endpoint. Start it with `--metrics`"), with
  the ``llamacpp:*`` names of the contract (types from server-task.cpp
  ``server_task_result_metrics::to_metrics``).

Not modelled: KV space shared by concurrent requests under ``--kv-unified``
(each request may use the whole window here), GPU memory bookkeeping, the
web UI, tokenize/embedding routes. Run: ``python3 -m
sparkctl_sim.engines.llamaserver [llama-server] ARGS`` (the ``llama-server`` wrapper of
:mod:`sparkctl_sim.engines.install`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl.plan import contracts
from sparkctl_sim.engines import tokens as tk
from sparkctl_sim.engines.cli import EngineConfig

CONTRACT = ("llamacpp", "b6500")
BUILD = "b6500 (SIMULATED by sparkctl_sim, not llama.cpp)"
# The training length the simulated model reports (llama_model_n_ctx_train): the
# profile llamacpp-1box's DeepSeek GGUF, model.context_len_tokens.
N_CTX_TRAIN = 131072
GGUF_MAGIC = b"GGUF"
# Timing: the perfmodel's one-box figures (DERIVED from the TP2 table with the
# one-box record; there is no llama.cpp row in perfmodel).
TIMING_ENGINE = "vllm"


class ArgError(Exception):
    """What common_params_parse prints before llama-server exits 1."""


@dataclass(frozen=True)
class LlamaConfig:
    model: str
    alias: str | None
    host: str
    port: int
    ctx_size: int
    n_parallel: int
    kv_unified: bool
    metrics: bool
    slots: bool
    argv: tuple[str, ...] = ()
    flags: Mapping[str, str | bool] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        return self.alias or Path(self.model).name

    @property
    def n_ctx_slot(self) -> int:
        n_ctx = self.ctx_size if self.ctx_size > 0 else N_CTX_TRAIN
        per = n_ctx if self.kv_unified else n_ctx // self.n_parallel
        return min(per, N_CTX_TRAIN)


def parse_args(argv: Sequence[str]) -> LlamaConfig:
    """llama-server's command line, as common/arg.cpp reads it; raises ArgError."""
    c = contracts.load(*CONTRACT)
    assert c is not None, "the llama-server contract is bundled"
    seen: dict[str, str | bool] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        f = c.flags.get(arg)
        if f is None:
            raise ArgError(f"error: invalid argument: {arg}")
        if f.takes_value:
            if i + 1 >= len(args):
                raise ArgError(f"error while handling argument \"{arg}\": expected value for argument\n\n"
                               "to show complete usage, run with -h")
            seen[f.canonical] = args[i + 1]
            i += 2
        else:
            seen[f.canonical] = not (arg.startswith("--no-") and arg != f.canonical)
            i += 1

    def num(flag: str, default: int) -> int:
        v = seen.get(flag)
        if v is None or isinstance(v, bool):
            return default
        try:
            return int(v.strip())  # std::stoi: leading digits; a trailing suffix is not checked here
        except ValueError:
            raise ArgError(f"error while handling argument \"{flag}\": stoi\n\n"
                           "to show complete usage, run with -h") from None

    parallel = num("--parallel", -1)
    if parallel == 0 or parallel < -1:
        raise ArgError("error while handling argument \"--parallel\": error: invalid value for n_parallel\n")
    unified = bool(seen.get("--kv-unified", False))
    if parallel < 0:  # server.cpp main: auto = 4 slots sharing one KV buffer
        parallel, unified = 4, True
    alias = seen.get("--alias")
    host = seen.get("--host")
    return LlamaConfig(
        model=str(seen.get("--model") or ""), alias=str(alias).split(",")[0] if alias else None,
        host=str(host) if isinstance(host, str) else "127.0.0.1", port=num("--port", 8080),
        ctx_size=num("--ctx-size", 0), n_parallel=parallel, kv_unified=unified,
        metrics=bool(seen.get("--metrics", False)), slots=bool(seen.get("--slots", True)),
        argv=tuple(argv), flags=seen,
    )


def model_refusal(path: str) -> list[str]:
    """The log lines of a model that cannot be loaded, [] when it can."""
    if not path:
        return ["srv    load_model: failed to load model, ''"]
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        return [f"gguf_init_from_file_impl: failed to open GGUF file '{path}' ({e.strerror})",
                f"llama_model_load: error loading model: llama_model_loader: failed to load model from {path}",
                f"srv    load_model: failed to load model, '{path}'"]
    if magic != GGUF_MAGIC:
        return [f"gguf_init_from_file_impl: invalid magic characters: '{magic!r}', expected 'GGUF'",
                f"srv    load_model: failed to load model, '{path}'"]
    return []


class Log:
    """llama.cpp-looking lines on stderr (llama.cpp logs there), flushed one by one."""

    def line(self, msg: str) -> None:
        try:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def error_body(message: str, kind: str, code: int, **extra: Any) -> dict[str, Any]:
    """server-common.cpp format_error_response, wrapped as server-context.cpp's res->error does."""
    return {"error": {"code": code, "message": message, "type": kind, **extra}}


@dataclass
class Slots:
    """The server's slots: who is busy, and the counters /metrics reports."""

    n: int
    busy: set[int] = field(default_factory=set)
    prompt_tokens: int = 0          # excluding cached tokens (server-task.cpp prompt_tokens_total)
    cached_tokens: int = 0
    predicted_tokens: int = 0
    prompt_s: float = 0.0
    predict_s: float = 0.0
    n_tokens_max: int = 0


def build_app(cfg: LlamaConfig, speedup: float, log: Log, loaded: asyncio.Event) -> Any:
    from aiohttp import web

    from sparkctl_sim.engines.logs import EngineLog
    from sparkctl_sim.engines.server import Engine, PerfState

    c = contracts.load(*CONTRACT)
    assert c is not None
    timing_cfg = EngineConfig(TIMING_ENGINE, cfg.model, (cfg.served_name,), 1, 1, 0, None, None, cfg.host,
                              cfg.port, cfg.n_ctx_slot, 0.9)
    engine = Engine(timing_cfg, EngineLog(TIMING_ENGINE, 0), speedup, lambda: PerfState())
    slots = Slots(cfg.n_parallel)
    free = asyncio.Semaphore(cfg.n_parallel)
    created = int(time.time())

    def js(body: Any, status: int = 200) -> web.Response:
        return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, separators=(",", ":")))

    @web.middleware
    async def loading(request: web.Request, handler: Any) -> web.StreamResponse:
        if not loaded.is_set():
            return js(error_body("Loading model", "unavailable_error", 503), 503)
        return await handler(request)

    async def health(_r: web.Request) -> web.Response:
        return js({"status": "ok"})

    async def models(_r: web.Request) -> web.Response:
        entry = {"id": cfg.served_name, "object": "model", "created": created, "owned_by": "llamacpp",
                 "meta": {"n_ctx": cfg.n_ctx_slot, "n_ctx_train": N_CTX_TRAIN, "simulated": True}}
        return js({"models": [{"name": cfg.served_name, "model": cfg.served_name}], "object": "list",
                   "data": [entry]})

    async def props(_r: web.Request) -> web.Response:
        return js({"default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8},
                                                   "n_ctx": cfg.n_ctx_slot},
                   "total_slots": cfg.n_parallel, "model_alias": cfg.served_name, "model_path": cfg.model,
                   "endpoint_slots": cfg.slots, "endpoint_props": False, "endpoint_metrics": cfg.metrics,
                   "build_info": BUILD, "is_sleeping": False})

    async def get_slots(_r: web.Request) -> web.Response:
        if not cfg.slots:
            return js(error_body("This server does not support slots endpoint. Start it with `--slots`",
                                 "not_supported_error", 501), 501)
        return js([{"id": i, "n_ctx": cfg.n_ctx_slot, "speculative": False, "is_processing": i in slots.busy}
                   for i in range(cfg.n_parallel)])

    async def metrics(_r: web.Request) -> web.Response:
        if not cfg.metrics:
            return js(error_body("This server does not support metrics endpoint. Start it with `--metrics`",
                                 "not_supported_error", 501), 501)
        values = {
            "prompt_tokens_total": ("counter", slots.prompt_tokens),
            "prompt_tokens_cached_total": ("counter", slots.cached_tokens),
            "prompt_seconds_total": ("counter", slots.prompt_s),
            "tokens_predicted_total": ("counter", slots.predicted_tokens),
            "tokens_predicted_seconds_total": ("counter", slots.predict_s),
            "n_decode_total": ("counter", slots.predicted_tokens),
            "n_tokens_max": ("counter", slots.n_tokens_max),
            "spec_decode_num_draft_tokens_total": ("counter", 0),
            "spec_decode_num_accepted_tokens_total": ("counter", 0),
            "spec_decode_num_drafts_total": ("counter", 0),
            "prompt_tokens_seconds": ("gauge", 0.0),
            "predicted_tokens_seconds": ("gauge", 0.0),
            "n_busy_slots_per_decode": ("gauge", float(len(slots.busy))),
        }
        lines: list[str] = []
        for name, (kind, v) in values.items():
            full = "llamacpp:" + name
            if full not in c.metrics:  # only what the release exports
                continue
            lines += [f"# HELP {full} SIMULATED", f"# TYPE {full} {kind}", f"{full} {float(v)}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return js(error_body("Failed to parse JSON", "invalid_request_error", 400), 400)
        if not isinstance(body, dict):
            return js(error_body("the request body must be a JSON object", "invalid_request_error", 400), 400)
        try:
            toks = tk.tokenize_chat(body.get("messages")) if chat else tk.tokenize_prompt(body.get("prompt"))
        except tk.PromptError as e:
            return js(error_body(str(e), "invalid_request_error", 400), 400)
        n = len(toks)
        if n >= cfg.n_ctx_slot:
            msg = (f"request ({n} tokens) exceeds the available context size ({cfg.n_ctx_slot} tokens), "
                   "try increasing it")
            log.line(f"srv    send_error: task id = 0, error: {msg}")
            return js(error_body(msg, "exceed_context_size_error", 400, n_prompt_tokens=n,
                                 n_ctx=cfg.n_ctx_slot), 400)
        mt = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict", -1)))
        room = cfg.n_ctx_slot - n  # context shift off: generation stops where the slot is full
        limit = room if not isinstance(mt, int) or isinstance(mt, bool) or mt < 0 else min(mt, room)
        answer = tk.plan_answer(toks, max_tokens=max(1, limit), seed=body.get("seed")
                                if isinstance(body.get("seed"), int) else None, temperature=0.0,
                                ignore_eos=bool(body.get("ignore_eos", False)))
        if isinstance(mt, int) and mt >= 0 and limit < mt and answer.finish_reason == "length":
            log.line(f"slot process_toke: stopped due to running out of context capacity, n_ctx = {cfg.n_ctx_slot}")
        req = _Req(chat, toks, answer, bool(body.get("stream", False)),
                   bool((body.get("stream_options") or {}).get("include_usage")))
        return await _respond(request, engine, req, slots, free, cfg.served_name, chat, speedup)

    async def completions(r: web.Request) -> web.StreamResponse:
        return await generate(r, chat=False)

    async def chat_completions(r: web.Request) -> web.StreamResponse:
        return await generate(r, chat=True)

    app = web.Application(middlewares=[loading], client_max_size=64 * 1024 * 1024)
    for path, fn in (("/health", health), ("/v1/health", health), ("/v1/models", models), ("/models", models),
                     ("/props", props), ("/slots", get_slots), ("/metrics", metrics)):
        app.router.add_get(path, fn)
    for path, fn in (("/v1/completions", completions), ("/completions", completions),
                     ("/v1/chat/completions", chat_completions), ("/chat/completions", chat_completions)):
        app.router.add_post(path, fn)
    return app


@dataclass
class _Req:
    chat: bool
    tokens: list[str]
    answer: tk.Answer
    stream: bool
    include_usage: bool


async def _respond(request: Any, engine: Any, req: _Req, slots: Slots, free: asyncio.Semaphore, name: str,
                   chat: bool, speedup: float) -> Any:
    """Wait for a free slot, run the request through the perfmodel scheduler, answer as OpenAI does."""
    from aiohttp import web

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    obj = "chat.completion" if chat else "text_completion"
    pieces = req.answer.pieces
    last = len(pieces) - 1
    fin = req.answer.finish_reason

    def usage(cached: int) -> dict[str, Any]:
        return {"prompt_tokens": len(req.tokens), "completion_tokens": len(pieces),
                "total_tokens": len(req.tokens) + len(pieces), "prompt_tokens_details": {"cached_tokens": cached}}

    def gone() -> bool:
        t = request.transport
        return t is None or t.is_closing()

    resp: Any = None

    async def emit(i: int, text: str) -> None:
        if resp is None:
            return
        ch: dict[str, Any] = ({"index": 0, "delta": {"content": text}, "finish_reason": fin if i == last else None}
                              if chat else {"index": 0, "text": text, "finish_reason": fin if i == last else None})
        await resp.write(b"data: " + json.dumps({"id": rid, "object": obj + (".chunk" if chat else ""),
                                                  "model": name, "choices": [ch]}).encode() + b"\n\n")

    async with free:
        slot = min(set(range(slots.n)) - slots.busy)
        slots.busy.add(slot)
        try:
            if req.stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
            t0 = time.monotonic()
            cached = await engine.run(req, emit, gone)
            took = (time.monotonic() - t0) * speedup
        except (ConnectionResetError, ConnectionError):
            return resp or web.Response(status=499)
        finally:
            slots.busy.discard(slot)
    slots.prompt_tokens += len(req.tokens) - cached
    slots.cached_tokens += cached
    slots.predicted_tokens += len(pieces)
    slots.predict_s += took
    slots.n_tokens_max = max(slots.n_tokens_max, len(req.tokens) + len(pieces))
    if req.stream:
        if req.include_usage:  # server-task.cpp: a last chunk with empty choices
            await resp.write(b"data: " + json.dumps({"id": rid, "object": obj + ".chunk", "model": name,
                                                      "choices": [], "usage": usage(cached)}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    text = req.answer.text
    ch = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": fin} if chat
          else {"index": 0, "text": text, "finish_reason": fin})
    return web.json_response({"id": rid, "object": obj, "created": int(time.time()), "model": name,
                              "choices": [ch], "usage": usage(cached)})


async def serve(cfg: LlamaConfig, env: Mapping[str, str], log: Log) -> int:
    from aiohttp import web

    speedup = float(env.get("SPARKCTL_SIM_SPEEDUP") or 1.0)
    load_s = float(env.get("SPARKCTL_SIM_LOAD_S") or 2.0)
    loaded = asyncio.Event()
    runner = web.AppRunner(build_app(cfg, speedup, log, loaded), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True).start()
    except OSError as e:
        log.line(f"srv    start: couldn't bind HTTP server socket, hostname: {cfg.host}, port: {cfg.port} ({e})")
        await runner.cleanup()
        return 1
    log.line(f"main: HTTP server is listening, hostname: {cfg.host}, port: {cfg.port}, http threads: 4")
    log.line("main: loading model")
    log.line(f"srv    load_model: loading model '{cfg.model}'")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        await asyncio.sleep(load_s / speedup)
        refusal = model_refusal(cfg.model)
        if refusal:
            for line in refusal:
                log.line(line)
            log.line("srv    operator(): exiting due to model loading error")
            return 1
        log.line(f"srv          init: initializing, n_slots = {cfg.n_parallel}, n_ctx_slot = {cfg.n_ctx_slot}, "
                 f"kv_unified = '{'true' if cfg.kv_unified else 'false'}'")
        loaded.set()
        log.line("main: model loaded")
        log.line(f"main: server is listening on http://{cfg.host}:{cfg.port}")
        log.line("srv  update_slots: all slots are idle")
        await stop.wait()
        log.line("srv    operator(): operator(): cleaning up before exit...")
        return 0
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["llama-server"]:  # the program name the wrapper keeps visible (install.py)
        args = args[1:]
    env = dict(os.environ if env is None else env)
    log = Log()
    if any(a in ("-h", "--help", "--usage") for a in args):
        print("usage: llama-server [options]  (SIMULATED by sparkctl_sim; flags: the llama-server contract)")
        return 0
    if "--version" in args:
        log.line(f"version: {BUILD}")
        return 0
    log.line(f"build: {BUILD}")
    log.line("system info: SIMULATED llama-server (sparkctl_sim): no weights are loaded, timing from perfmodel")
    try:
        cfg = parse_args(args)
    except ArgError as e:
        log.line(str(e))
        return 1
    try:
        return asyncio.run(serve(cfg, env, log))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
