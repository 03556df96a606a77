"""The per-request event log and the outcome of one request: data only.

Owns the :class:`Event` record the client writes for every thing it observes
on a streamed request, the :class:`RequestResult` that closes a request with
one status, and their JSON-lines form. No I/O, no clock: the client stamps the
times, the caller writes the lines, :mod:`sparkctl.bench.metrics` reads them.

Times (``t_s``) are ``time.perf_counter()`` seconds taken by the client the
moment a read returned, before the bytes were parsed. Only differences mean
anything; :func:`result_to_jsonl` can subtract an origin chosen by the caller.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

EventKind = Literal["sent", "headers", "first_byte", "chunk", "usage", "done", "error"]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)

Status = Literal["ok", "http_error", "malformed_sse", "error_mid_stream", "disconnected", "timeout"]
STATUSES: tuple[str, ...] = get_args(Status)


@dataclass(frozen=True, slots=True)
class Event:
    """One observation on a streamed request.

    * ``sent``: the request body was handed to the socket (``detail="written"``);
      if it never was (connect failed), the time the client released it
      (``detail="not written"``). ``raw_len`` = body bytes.
    * ``headers``: response status line and headers received.
    * ``first_byte``: the first read of the response body returned; ``raw_len`` = bytes in that read.
    * ``chunk``: one SSE ``data:`` frame with a choice; ``n_text_chars`` = generated text
      in it (0 for a role-only or finish-only chunk), ``raw_len`` = frame bytes.
    * ``usage``: a ``usage`` object arrived; ``prompt_tokens``/``completion_tokens`` carry it.
    * ``done``: the ``data: [DONE]`` sentinel.
    * ``error``: the request ended abnormally; ``detail`` says how.

    ``n_content_tokens_hint`` is the number of tokens a chunk carries when the
    server says so (logprobs entries, or the growth of a per-chunk usage
    object); 0 means the server did not say.
    """

    t_s: float
    kind: EventKind
    n_text_chars: int = 0
    n_content_tokens_hint: int = 0
    raw_len: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    detail: str = ""
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens`` when the server reports it."""

    def to_dict(self, t_origin_s: float = 0.0) -> dict[str, Any]:
        d = asdict(self)
        d["t_s"] = self.t_s - t_origin_s
        return {k: v for k, v in d.items() if v not in (None, "") or k in ("t_s", "kind")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        if d.get("kind") not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {d.get('kind')!r}")
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class RequestResult:
    """How one request ended, with its full event log.

    ``status`` is one of :data:`STATUSES`; ``http_status`` is set whenever a
    status line was received (so ``http_error`` always has it). ``salt`` is the
    random line put at the start of the prompt ("" when salting was off), so a
    caller can recount the prompt that was really sent.
    """

    request_id: str
    status: Status
    events: tuple[Event, ...]
    http_status: int | None = None
    detail: str = ""
    salt: str = ""
    endpoint: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    t_release_s: float | None = None
    """When the client released the request (before any of its bytes were
    written); ``sent - t_release_s`` is the client's own queueing delay."""
    text: str | None = None
    """The generated content text, kept only when the request asked for it
    (``RequestSpec.keep_text``: quality scoring, needle retrieval); reasoning
    text is not included."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def t_sent_s(self) -> float | None:
        return next((e.t_s for e in self.events if e.kind == "sent"), None)


def result_to_jsonl(result: RequestResult, t_origin_s: float = 0.0) -> str:
    """The request as JSON lines: one header line, then one line per event.

    Pure; the caller decides where the text goes.
    """
    head = {
        "request_id": result.request_id,
        "status": result.status,
        "http_status": result.http_status,
        "detail": result.detail,
        "salt": result.salt,
        "endpoint": result.endpoint,
        "labels": result.labels,
        "t_release_s": None if result.t_release_s is None else result.t_release_s - t_origin_s,
        "n_events": len(result.events),
    }
    if result.text is not None:
        head["text"] = result.text
    lines = [json.dumps({"request": head}, sort_keys=True)]
    for e in result.events:
        lines.append(json.dumps({"request_id": result.request_id, **e.to_dict(t_origin_s)}, sort_keys=True))
    return "\n".join(lines) + "\n"


def events_from_jsonl(text: str, request_id: str | None = None) -> list[Event]:
    """Read back the event lines written by :func:`result_to_jsonl` (header lines skipped)."""
    out: list[Event] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if "request" in d:
            continue
        rid = d.pop("request_id", None)
        if request_id is not None and rid != request_id:
            continue
        out.append(Event.from_dict(d))
    return out
