"""The bench client's SSE reading: frames out of the byte stream, and the events they make.

Owns splitting an SSE byte stream into frames (no line-length limit: a 1 MB
frame is just a long frame; ``\\n``, ``\\r\\n`` and ``\\r`` line ends), parsing
one frame by the SSE spec's rules, and turning the frames of one
``/v1/completions`` or ``/v1/chat/completions`` stream into
:class:`~sparkctl.bench.events.Event` rows (``chunk``, ``usage``, ``done``),
deciding ``malformed_sse`` and ``error_mid_stream`` on the way. Both of
:class:`~sparkctl.bench.client.BenchClient`'s paths (httpx and the wire)
feed it the same bytes with the stamps they were received at.

Must not: do I/O, stamp time (the caller passes each frame's stamp), print,
or compute metrics (that is :mod:`sparkctl.bench.metrics`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from sparkctl.bench.events import Event, Status

Endpoint = Literal["completions", "chat"]


# -- SSE framing -----------------------------------------------------------------


class SSESplitter:
    """Split an SSE byte stream into frames (the text between blank lines).

    Accepts ``\\n``, ``\\r\\n`` and ``\\r`` line ends, frames split across reads,
    and frames of any length; the scan resumes where it stopped, so a long
    frame arriving in many reads costs linear time.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan_from = 0
        self._pending_cr = False

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buf and not self._pending_cr and b"\r" not in data:
            # the common read: LF line ends, nothing held over; the same frames as below
            split = data.split(b"\n\n")
            rest = split.pop()
            if rest:
                self._buf += rest
                self._scan_from = len(self._buf)
            return split
        if self._pending_cr:
            data = b"\r" + data
            self._pending_cr = False
        if data.endswith(b"\r"):
            # a CR at the end may be the first half of CRLF: decide with the next read
            data, self._pending_cr = data[:-1], True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._buf += data
        frames: list[bytes] = []
        start = 0
        scan = max(self._scan_from - 1, 0)
        while True:
            i = self._buf.find(b"\n\n", scan)
            if i < 0:
                break
            frames.append(bytes(self._buf[start:i]))
            start = scan = i + 2
        if start:
            del self._buf[:start]
        self._scan_from = len(self._buf)
        return frames

    def flush(self) -> bytes:
        """What is left without a closing blank line (a truncated frame), and reset."""
        rest = bytes(self._buf) + (b"\r" if self._pending_cr else b"")
        self._buf.clear()
        self._scan_from = 0
        self._pending_cr = False
        return rest.strip(b"\r\n")


_SSE_FIELDS = frozenset({"data", "event", "id", "retry"})


@dataclass(frozen=True)
class SSEFrame:
    event: str
    data: str | None  # None: the frame had no data field (comment / keep-alive)
    unknown: tuple[str, ...] = ()
    """Lines that are neither comments nor SSE fields (e.g. JSON sent without ``data:``)."""


def parse_frame(frame: bytes) -> SSEFrame:
    """The ``event`` name and the joined ``data`` lines of one frame (SSE spec rules)."""
    if frame.startswith(b"data: ") and b"\n" not in frame:
        # the common frame, one "data: ..." line: no line splitting
        return SSEFrame("message", frame[6:].decode("utf-8", errors="replace"))
    event = "message"
    data: list[str] = []
    unknown: list[str] = []
    for raw in frame.decode("utf-8", errors="replace").split("\n"):
        if not raw or raw.startswith(":"):
            continue
        name, sep, value = raw.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name not in _SSE_FIELDS:
            unknown.append(raw[:80])
    return SSEFrame(event, "\n".join(data) if data else None, tuple(unknown))


class Malformed(Exception):
    pass


class StreamState:
    """Turns frames into events; decides ``malformed_sse`` and ``error_mid_stream``."""

    def __init__(self, endpoint: Endpoint, events: list[Event], keep_text: bool = False) -> None:
        self.endpoint = endpoint
        self.events = events
        self.texts: list[str] | None = [] if keep_text else None
        self.done = False
        self.finish_seen = False
        self.error: tuple[Status, str] | None = None
        self._last_usage_completion: int | None = None

    def frame(self, frame: bytes, t: float) -> None:
        if frame.startswith(b"data: {") and b"\n" not in frame:
            # the common frame, one "data: {...}" line: JSON straight from the bytes
            try:
                obj = json.loads(frame[6:])
            except ValueError:
                pass  # the general path below says what is wrong with it
            else:
                self._object(obj, "message", frame, t)
                return
        f = parse_frame(frame)
        if f.data is None:
            if f.unknown:
                # the SSE spec ignores unknown fields, but a stream of them (JSON without
                # "data:") would otherwise end "ok" with nothing counted
                raise Malformed(f"frame without a data field: {f.unknown[0]!r}")
            return
        if f.data.strip() == "[DONE]":
            self.events.append(Event(t, "done", raw_len=len(frame)))
            self.done = True
            return
        try:
            obj = json.loads(f.data)
        except ValueError as exc:
            raise Malformed(f"data is not JSON ({exc}): {f.data[:80]!r}") from None
        self._object(obj, f.event, frame, t)

    def _object(self, obj: Any, event: str, frame: bytes, t: float) -> None:
        """One frame's parsed JSON data (``event``: the frame's event name)."""
        if not isinstance(obj, dict):
            raise Malformed(f"data is not a JSON object: {_data_snip(frame)!r}")
        if event == "error" or "error" in obj:
            err = obj.get("error", obj)
            msg = err.get("message", "") if isinstance(err, dict) else str(err)
            self.error = ("error_mid_stream", f"server error in stream: {str(msg)[:200]}")
            return
        choices = obj.get("choices")
        usage = obj.get("usage")
        if choices is None and usage is None:
            raise Malformed(f"chunk has neither choices nor usage: {_data_snip(frame)!r}")
        if choices is not None and not isinstance(choices, list):
            raise Malformed("choices is not a list")
        if usage is not None and not isinstance(usage, dict):
            raise Malformed("usage is not an object")
        usage_completion = _int_or_none(usage.get("completion_tokens")) if usage else None
        details = usage.get("prompt_tokens_details") if usage else None
        cached = _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
        if choices:
            c0 = choices[0]
            if not isinstance(c0, dict):
                raise Malformed("choice is not an object")
            text = self._text(c0)
            if self.texts is not None:
                self.texts.append(self._content(c0))
            hint = _logprob_count(c0)
            if hint == 0 and usage_completion is not None and text:
                # per-chunk ("continuous") usage: the growth is what this chunk carried
                hint = usage_completion - (self._last_usage_completion or 0)
                hint = max(hint, 0)
            if c0.get("finish_reason"):
                self.finish_seen = True
            self.events.append(Event(t, "chunk", n_text_chars=len(text), n_content_tokens_hint=hint, raw_len=len(frame)))
        if usage:
            self.events.append(
                Event(
                    t,
                    "usage",
                    raw_len=len(frame) if not choices else 0,
                    prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
                    completion_tokens=usage_completion,
                    cached_tokens=cached,
                )
            )
            if usage_completion is not None:
                self._last_usage_completion = usage_completion

    def _content(self, choice: dict[str, Any]) -> str:
        """The answer text of a chunk, without reasoning text (already validated by _text)."""
        if self.endpoint == "completions":
            return choice.get("text") or ""
        return (choice.get("delta") or {}).get("content") or ""

    def _text(self, choice: dict[str, Any]) -> str:
        if self.endpoint == "completions":
            text = choice.get("text") or ""
        else:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise Malformed("delta is not an object")
            # reasoning text is generated text too (it is in usage.completion_tokens)
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
        if not isinstance(text, str):
            raise Malformed("text is not a string")
        return text


def _data_snip(frame: bytes) -> str:
    """The first 80 characters of a frame's data, for a message."""
    data = parse_frame(frame).data
    return (data or "")[:80]


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _logprob_count(choice: dict[str, Any]) -> int:
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        for key in ("content", "tokens"):
            seq = lp.get(key)
            if isinstance(seq, list):
                return len(seq)
    return 0

