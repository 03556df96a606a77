"""The HTTP API of a simulated engine's rank 0 and its token scheduler.

Owns: the OpenAI-compatible routes (``/health``, ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``), ``/sim/info``, and the timing
of every token. ``/metrics`` (the engine's own counter names and latency
histograms) is :mod:`sparkctl_sim.engines.promexport`.

Timing (all durations divided by the speed-up factor):

* prefill: requests queue FIFO for the prefill unit; a request's compute time
  is ``perfmodel.prefill_work_s`` of its uncached tokens, and its first token
  comes at ``max(arrival + base_latency, end of its prefill)``;
* decode: token i of a stream is due at ``anchor + (i - anchor_i) * gap``,
  where ``gap = 1 / per_stream_tok_s(c)`` and c counts the requests currently
  decoding. When c (or the stale flag) changes, the stream re-anchors at the
  due time of its last token, so rates never drift;
* the node state (clock cap, stale link, wedged) is read at most every 0.5 s
  and combined with what the other ranks report in their heartbeats: the
  lowest clock cap and any stale link apply to the whole collective, and one
  wedged rank wedges the engine (``/health`` and ``/v1/models`` still answer
  200, completions send nothing until the client gives up).

Not modelled: prefill stalling other streams' decode, KV-cache capacity.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sparkctl.plan import contracts
from sparkctl_sim import perfmodel
from sparkctl_sim.engines import tokens as tk
from sparkctl_sim.engines.cli import EngineConfig, contract
from sparkctl_sim.engines.logs import EngineLog
from sparkctl_sim.engines.promexport import LatencyHistograms, exposition

REASONING_EFFORTS = ("low", "medium", "high")

@dataclass(frozen=True)
class PerfState:
    clock_cap_mhz: float | None = None
    stale: bool = False
    wedged: bool = False


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


@dataclass
class Request:
    chat: bool
    tokens: list[str]
    answer: tk.Answer
    stream: bool
    include_usage: bool


class Engine:
    """Scheduler, prefix cache and counters of one serving rank 0."""

    def __init__(
        self,
        cfg: EngineConfig,
        log: EngineLog,
        speedup: float,
        perf_state: Callable[[], PerfState],
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.speedup = speedup
        self.perf_state = perf_state
        self.model = perfmodel.model_for(cfg.engine, cfg.tp)
        self.cache = tk.PrefixCache()
        self.created = int(time.time())
        self.decoding = 0
        self.prefill_busy_until = 0.0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.finished: Counter[str] = Counter()
        self.latency = LatencyHistograms(cfg.engine, cfg.served_name)  # the real release's TTFT/ITL histograms
        self.http: Counter[tuple[str, int]] = Counter()
        self._warned: set[str] = set()

    # --- timing -------------------------------------------------------------------
    def gap_s(self, stale: bool) -> float:
        return 1.0 / (self.model.per_stream_tok_s(self.decoding, stale) * self.speedup)

    async def _sleep_until(self, t: float) -> None:
        delay = t - asyncio.get_running_loop().time()
        await asyncio.sleep(delay if delay > 0 else 0)

    async def _while_wedged(self, gone: Callable[[], bool]) -> bool:
        """Hang while the engine is wedged; True if it was. Gives up when the client left."""
        waited = False
        while self.perf_state().wedged:
            if gone():
                raise ConnectionResetError("client went away while the engine was wedged")
            waited = True
            await asyncio.sleep(0.25)
        return waited

    async def run(
        self, req: Request, emit: Callable[[int, str], Any], gone: Callable[[], bool] = lambda: False,
        arrival: float | None = None,
    ) -> int:
        """Prefill then decode ``req``, awaiting ``emit(i, text)`` per token; returns cached tokens.

        ``gone()`` tells whether the client disconnected (raises ConnectionResetError then).
        ``arrival`` (``time.time()``): where the engine's TTFT starts; each token's latency is
        observed into :attr:`latency` just before it is emitted (promexport).
        """
        loop = asyncio.get_running_loop()
        await self._while_wedged(gone)
        st = self.perf_state()
        n = len(req.tokens)
        cached = self.cache.lookup(req.tokens) if self.cfg.prefix_caching else 0
        work = self.model.prefill_work_s(n, n - cached, st.clock_cap_mhz, st.stale) / self.speedup
        now = loop.time()
        start = max(now, self.prefill_busy_until)
        self.prefill_busy_until = start + work
        first_at = max(now + self.model.base_latency_s / self.speedup, start + work)
        self.prompt_tokens += n
        self.cached_tokens += cached
        await self._sleep_until(first_at)
        if self.cfg.prefix_caching:
            self.cache.insert(req.tokens)
        pieces = req.answer.pieces
        if not pieces:
            return cached
        if await self._while_wedged(gone):
            first_at = loop.time()
        self.decoding += 1
        try:
            last = self.latency.first_token(arrival) if arrival is not None else None
            await emit(0, pieces[0])
            self.generation_tokens += 1
            stale = st.stale
            gap = self.gap_s(stale)
            anchor_t, anchor_i, due = first_at, 0, first_at
            for i in range(1, len(pieces)):
                st = self.perf_state()
                if st.wedged:
                    await self._while_wedged(gone)
                    anchor_t, anchor_i = loop.time(), i - 1
                if not req.stream and i % 16 == 0 and gone():
                    raise ConnectionResetError("client went away")
                g = self.gap_s(st.stale)
                if g != gap:
                    anchor_t, anchor_i, gap = due, i - 1, g
                due = anchor_t + (i - anchor_i) * gap
                await self._sleep_until(due)
                if last is not None:
                    last = self.latency.next_tokens(last)
                await emit(i, pieces[i])
                self.generation_tokens += 1
        finally:
            self.decoding -= 1
        return cached

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.log.warn(msg)


# ---------------------------------------------------------------------------
# request parsing
# ---------------------------------------------------------------------------


def _opt_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise HTTPError(400, f"{key} must be an integer >= {minimum}, got {v!r}", param=key)
    return v


def parse_request(engine: Engine, body: Any, chat: bool) -> Request:
    cfg = engine.cfg
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and cfg.engine != "sglang" and model not in cfg.served_names:
        raise HTTPError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")
    try:
        toks = tk.tokenize_chat(body.get("messages")) if chat else tk.tokenize_prompt(body.get("prompt"))
    except tk.PromptError as e:
        raise HTTPError(400, str(e)) from None
    n = len(toks)
    if n == 0:
        raise HTTPError(400, "the prompt is empty")
    max_tokens = _opt_int(body, "max_tokens", 1)
    if chat and max_tokens is None:
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = cfg.max_model_len - n
    if n + max_tokens > cfg.max_model_len or max_tokens < 1:
        raise HTTPError(
            400,
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
            f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    temperature = body.get("temperature", 1.0 if cfg.engine == "vllm" else 0.0)
    if temperature is None:
        temperature = 0.0
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise HTTPError(400, f"temperature must be a number >= 0, got {temperature!r}", param="temperature")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise HTTPError(400, f"seed must be an integer, got {seed!r}", param="seed")
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise HTTPError(400, "stop must be a string or a list of strings", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise HTTPError(400, "stream must be a boolean", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise HTTPError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    ignore_eos = body.get("ignore_eos", False)
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    if cfg.engine == "tensorfold":
        for key in ("ignore_eos", "min_tokens"):
            if body.get(key):
                engine.warn_once(key, f"ignoring unsupported sampling field {key!r}")
        ignore_eos, min_tokens = False, 0
        effort = body.get("reasoning_effort")
        if effort is not None and not isinstance(effort, str):
            raise HTTPError(
                400,
                f"reasoning_effort must be a string (\"low\", \"medium\" or \"high\"), "
                f"got {type(effort).__name__} {effort!r}: the integer form is not supported",
                param="reasoning_effort",
            )
        if isinstance(effort, str) and effort not in REASONING_EFFORTS:
            raise HTTPError(400, f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    elif not isinstance(ignore_eos, bool):
        raise HTTPError(400, "ignore_eos must be a boolean", param="ignore_eos")
    if min_tokens > max_tokens:
        raise HTTPError(400, f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})")
    answer = tk.plan_answer(
        toks,
        max_tokens=max_tokens,
        seed=seed,
        temperature=float(temperature),
        ignore_eos=bool(ignore_eos),
        min_tokens=min_tokens,
        stop=stops,
    )
    return Request(chat, toks, answer, stream, include_usage)


# ---------------------------------------------------------------------------
# aiohttp application
# ---------------------------------------------------------------------------

ENGINE_KEY = web.AppKey("engine", Engine)


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.Response(text=exposition(engine), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type": "text/plain; version=0.0.4"})


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def _error(engine: Engine, e: HTTPError) -> web.Response:
    body = {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}}
    if engine.cfg.engine == "vllm":  # vLLM also repeats the fields at top level
        body.update({"object": "error", "message": e.message, "type": e.kind, "param": e.param, "code": e.status})
    return _json(body, status=e.status)


def _usage(req: Request, cached: int) -> dict[str, Any]:
    n, c = len(req.tokens), len(req.answer.pieces)
    return {
        "prompt_tokens": n,
        "completion_tokens": c,
        "total_tokens": n + c,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return _error(engine, HTTPError(400, "the request body is not valid JSON"))
    arrival = time.time()  # SGLang's created_time: before its tokenizer (tokenizer_manager.py generate_request)
    try:
        req = parse_request(engine, body, chat)
    except HTTPError as e:
        return _error(engine, e)
    if engine.cfg.engine == "vllm":  # vLLM's arrival_time: after the template and tokenizer (processor.py)
        arrival = time.time()

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    name = engine.cfg.served_name
    obj = "chat.completion" if chat else "text_completion"
    last = len(req.answer.pieces) - 1
    finish = req.answer.finish_reason

    def choice(text: str, fin: str | None, first: bool) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta = {"role": "assistant", "content": text}
            return {"index": 0, "delta": delta if fin is None or text else {}, "logprobs": None,
                    "finish_reason": fin}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": fin,
                "stop_reason": req.answer.stop_reason if fin else None}

    def gone() -> bool:
        t = request.transport
        return t is None or t.is_closing()

    if not req.stream:
        async def ignore(i: int, text: str) -> None:
            return None

        try:
            cached = await engine.run(req, ignore, gone, arrival)
        except ConnectionResetError:
            engine.finished["abort"] += 1
            return web.Response(status=499)  # nginx's "client closed request"; nobody reads it
        engine.finished[finish] += 1
        text = req.answer.text
        ch: dict[str, Any]
        if chat:
            ch = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None},
                  "logprobs": None, "finish_reason": finish, "stop_reason": req.answer.stop_reason}
        else:
            ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                  "stop_reason": req.answer.stop_reason}
        return _json({"id": rid, "object": obj, "created": created, "model": name,
                                  "choices": [ch], "usage": _usage(req, cached)})

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    chunk_obj = obj + ".chunk" if chat else obj

    async def send(payload: dict[str, Any]) -> None:
        if req.include_usage and "usage" not in payload:
            payload["usage"] = None
        await resp.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")

    async def emit(i: int, text: str) -> None:
        fin = finish if i == last else None
        await send({"id": rid, "object": chunk_obj, "created": created, "model": name,
                    "choices": [choice(text, fin, i == 0)]})

    try:
        cached = await engine.run(req, emit, gone, arrival)
        engine.finished[finish] += 1
        if req.include_usage:
            await send({"id": rid, "object": chunk_obj, "created": created, "model": name,
                        "choices": [], "usage": _usage(req, cached)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        engine.finished["abort"] += 1
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    cfg = engine.cfg
    data = []
    for name in cfg.served_names:
        entry: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": engine.created,
            "owned_by": cfg.engine,
            "root": cfg.model_path,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        if cfg.engine == "vllm":
            entry["permission"] = [{
                "id": "modelperm-" + uuid.uuid4().hex[:16], "object": "model_permission",
                "created": engine.created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
            }]
        data.append(entry)
    return _json({"object": "list", "data": data})


async def sim_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    cfg = engine.cfg
    st = engine.perf_state()
    return _json({
        "simulated": True,
        "engine": cfg.engine,
        "served_name": cfg.served_name,
        "served_names": list(cfg.served_names),
        "model_path": cfg.model_path,
        "tp": cfg.tp,
        "world_size": cfg.world_size,
        "max_model_len": cfg.max_model_len,
        "mem_gib": cfg.mem_gib,
        "prefix_caching": cfg.prefix_caching,
        "speedup": engine.speedup,
        "clock_cap_mhz": st.clock_cap_mhz,
        "stale": st.stale,
        "wedged": st.wedged,
        "decoding": engine.decoding,
        "tokenizer": "one token per whitespace word; chat: + 4 tokens per message",
        "page_tokens": tk.PAGE_TOKENS,
        "natural_answer_tokens": [tk.NATURAL_MIN_TOKENS, tk.NATURAL_MAX_TOKENS],
        "perf": engine.model.describe(st.clock_cap_mhz, st.stale),
    })


async def version(request: web.Request) -> web.Response:
    from sparkctl_sim.engines.cli import VERSIONS

    return _json({"version": VERSIONS[request.app[ENGINE_KEY].cfg.engine]})


async def get_model_info(request: web.Request) -> web.Response:
    cfg = request.app[ENGINE_KEY].cfg
    return _json({"model_path": cfg.model_path, "tokenizer_path": cfg.model_path,
                              "is_generation": True})


@web.middleware
async def access_log(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    status = 500
    peername = request.transport.get_extra_info("peername") if request.transport else None
    port = peername[1] if isinstance(peername, tuple) and len(peername) > 1 else 0
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        engine.http[(request.path, status)] += 1
        peer = request.remote or "-"
        version = f"{request.version.major}.{request.version.minor}"
        line = f'{peer}:{port} - "{request.method} {request.path_qs} HTTP/{version}" {status}'
        if engine.cfg.engine in ("vllm", "sglang"):
            engine.log.uvicorn(line + (" OK" if status == 200 else ""))
        else:
            engine.log.info(line, src="http")


def api_keys(engine: Engine) -> tuple[str, ...]:
    """The keys the engine accepts: its --api-key flag, else (vLLM) VLLM_API_KEY.

    vLLM 0.11.2 vllm/entrypoints/openai/api_server.py build_app: ``args.api_key or
    [envs.VLLM_API_KEY]``; llama-server reads LLAMA_API_KEY (common/arg.cpp, set_env).
    """
    raw = engine.cfg.extra.get("contract_api_key")
    keys = [raw] if isinstance(raw, str) else [k for k in (raw or []) if isinstance(k, str)]
    if not keys and engine.cfg.engine == "vllm":
        keys = [os.environ.get("VLLM_API_KEY", "")]
    return tuple(k for k in keys if k)


def auth_middleware(keys: tuple[str, ...]) -> Callable[..., Any]:
    """vLLM's AuthenticationMiddleware (vllm/entrypoints/openai/api_server.py, 0.11.2): a request
    under /v1 without ``Authorization: Bearer <key>`` is answered 401 {"error": "Unauthorized"};
    OPTIONS and everything outside /v1 (/health, /metrics) pass. SIMULATION: the same rule for
    every simulated engine, and the other engines' /metrics is protected too (stricter than
    vLLM; SGLang's middleware exempts only its health routes)."""
    wanted = {f"Bearer {k}" for k in keys}

    @web.middleware
    async def authenticate(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        engine = request.app[ENGINE_KEY]
        open_path = request.path == "/health" or (engine.cfg.engine == "vllm" and not request.path.startswith("/v1"))
        if request.method == "OPTIONS" or open_path or request.headers.get("Authorization", "") in wanted:
            return await handler(request)
        return web.json_response({"error": "Unauthorized"}, status=401)

    return authenticate


ROUTES = (
    ("GET", "/health", health),
    ("GET", "/v1/models", models),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("GET", "/metrics", metrics),
    ("GET", "/sim/info", sim_info),
    ("GET", "/version", version),
)


def build_app(engine: Engine) -> web.Application:
    keys = api_keys(engine)
    app = web.Application(middlewares=[access_log, *([auth_middleware(keys)] if keys else [])],
                          client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    c = contract(engine.cfg.engine)
    for method, path, fn in ROUTES:
        # The contract of the release says which of its endpoints the flags enable: SGLang 0.5.4
        # mounts /metrics only with --enable-metrics (http_server.py: `if server_args.enable_metrics:
        # add_prometheus_middleware(app)`); without it the real server answers 404 there.
        if c is not None and path in c.endpoints and not contracts.serves_endpoint(c, path, engine.cfg.argv):
            continue
        if method == "GET":
            app.router.add_get(path, fn)  # GET and HEAD
        else:
            app.router.add_route(method, path, fn)
    if engine.cfg.engine == "sglang":
        app.router.add_get("/get_model_info", get_model_info)
    return app
