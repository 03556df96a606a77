#!/usr/bin/env python3
"""sparkctl's weights agent: download, hash, serve and pull model weights on one node.

sparkctl pushes this file to ``<prefix>/opt/sparkctl/weights_agent.py`` and runs
it there with ``python3``. It is deliberately self-contained: standard library
only, no sparkctl import, Python 3.8 or newer, so any DGX OS image runs it.

Subcommands (every one prints JSON lines on stdout; the last is ``done`` or
``error``, and the exit code is 0 only after ``done``)::

    fetch    --url URL --dest PATH [--connections N] [--chunk-mb M] [--sha256 HEX]
    manifest --dir DIR [--chunk-mb M]       (a directory or a single file)
    serve    --dir DIR --bind ADDR --port P --ttl-s T [--manifest-json FILE] [--relay]
    pull     --from-url BASE --manifest-json FILE|- --dest DIR [--connections N]
    hub-info --dest DIR                     (stdin: {"url", "token"}; the Hub's revision listing)
    hub-fetch --dest DIR [--connections N]  (stdin: {"token", "files", "manifest"}; a Hub revision, verified)
    tail     --log FILE --offset N [--pid P]  (read a detached job's events)
    stop     --pid P [--pid P2 ...]           (end detached jobs of this agent)

``fetch``, ``manifest``, ``serve`` and ``pull`` take ``--log FILE`` to run
detached: the job double-forks, writes its events to FILE, and the command
returns at once with ``{"event": "started", "pid": ...}`` (``serve`` waits for
``listening`` and returns that event, which carries the port); with
``--linger-s S`` it then also waits up to S seconds for the job's end and
prints its events and a ``tail`` event, as ``tail`` does (one command for a
job that ends at once). A job that
outlives one SSH channel is what lets a multi-hour download survive a dropped
connection; ``tail`` is how sparkctl watches it.

How a download works (the "download laws" of the field report, after
scripts/pget.py): the file is cut into chunks fetched with HTTP ``Range``
requests by N threads, each on its own keep-alive connection, written at their
offsets into ``PATH.part`` (a sparse file). ``PATH.part.json`` lists the chunks
that are complete, and how far a chunk cut short got, so an interrupted
download resumes from the bytes on disk. While
chunks land, a hasher thread follows the contiguous completed prefix and feeds
SHA-256, so verification costs little beyond the transfer. The size (and the
SHA-256 when known) is checked before the atomic rename to PATH; a mismatch
deletes the partial file and nothing appears at PATH. A server that ignores
``Range`` (200 instead of 206) gets one plain stream instead, restarted from
zero when interrupted. The N connections are a budget of the whole job, not
of one file (:class:`Slots`, :func:`each_file`): the next file starts once the
previous one has every chunk on a connection, so a repository of many files
keeps N ranges in flight and a file's hash tail, fsync and rename overlap the
next file's transfer. Each chunk's SHA-256 is hashed from the receive buffer
too and kept in the hash cache, so a manifest after the fetch reads nothing.

Over a network that fails: a body that stops at any byte is asked for again
from that byte (what is on disk is kept); 429/408/5xx answers are waited out
(the Hub's ``RateLimit``, else ``Retry-After`` in seconds or as an HTTP-date,
else 1, 2, 4, 8 s backoff; capped at 300 s; 5 waits in a row per request at
most, renewed while bytes arrive); a storage URL that expires mid-file (401,
403, 410 from the host the Hub redirected to) is resolved again from the
Hub's URL. Every failure ends as an ``error`` event naming the file and
what happened, never a traceback (:func:`main`).

How a pull from a peer works: the manifest carries, besides each file's
SHA-256, the SHA-256 of every chunk (``chunk_bytes``, 32 MiB by default; one
read of the source computes both). Each connection hashes its chunk from the
receive buffer as the bytes arrive and the chunk counts as done only when the
hash matches, so verification overlaps the transfer, is spread over the
connections, and never reads the file back. A file present but different is
repaired chunk by chunk instead of fetched again.

``serve`` binds one address, the node's fabric address, never a wildcard; it
serves files under DIR only (``..`` is refused) and, given a manifest, only the
files it lists; it exits after ``--ttl-s`` seconds without a request. With
``--relay`` it also serves a listed file that is still arriving on its node,
chunk by chunk as its pull verifies them (a request for a later chunk waits):
the node across the ring pulls from a neighbour that is itself still pulling.

A hash cache (``--hash-cache FILE``: path -> size, mtime_ns, sha256, chunk hashes) spares
re-hashing unchanged files on every run; an entry is trusted only while the
file's size and mtime are unchanged, the same quick check rsync makes.
"""

from __future__ import annotations

import argparse
import datetime
import email.utils
import functools
import hashlib
import http.client
import http.server
import ipaddress
import json
import os
import queue
import re
import signal
import socketserver
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any

MIB = 1 << 20
HASH_BLOCK = 8 * MIB  # read size for hashing (the brief's 8 MiB blocks)
RECV_BUF = 1 * MIB  # one receive buffer per connection
# The verification unit of a manifest, and so the transfer unit of a pull and what
# a relay can pass on at once; 8 connections x 32 MiB keep ~256 MiB in flight.
DEFAULT_CHUNK_BYTES = 32 * MIB
RELAY_WAIT_S = 60.0  # how long a relay holds a request for a chunk it has not verified yet
RELAY_POLL_S = 0.02  # how often it looks at the receiving job's sidecar meanwhile
FLUSH_BYTES = 64 * MIB  # write back completed chunks in steps of this much during a download
MAX_REDIRECTS = 8
PART_SUFFIX = ".part"
SIDECAR_SUFFIX = ".part.json"
EXIT_ERROR = 1
EXIT_INTERRUPTED = 3  # stopped on purpose (--max-bytes, SIGTERM); resumable


class AgentError(Exception):
    """A failure reported as an ``error`` event (exit code 1)."""


class Interrupted(AgentError):
    """The job was stopped before it finished; what it wrote is kept for a resume."""


class HttpRefused(AgentError):
    """An HTTP answer that is not the file (401, 403, 404 ...), with the Hub's X-Error-Code when it sent one."""

    def __init__(self, message: str, status: int, code: str | None, server_message: str | None) -> None:
        super().__init__(message)
        self.status, self.code, self.server_message = status, code, server_message


# --------------------------------------------------------------------------- retries

# Answers worth waiting for: huggingface_hub's _DEFAULT_RETRY_ON_STATUS_CODES (utils/_http.py).
# Its http_get retries only 408 and 429 for the bytes, so a 503 from the CDN fails the file there
# (tests/test_hub.py shows it); the agent waits for every one of them, a bounded number of times.
RETRY_STATUSES = frozenset((408, 429, 500, 502, 503, 504))
# A storage URL refused: CloudFront and S3 answer 403 AccessDenied once a signed URL's Expires
# has passed (huggingface_hub issue #4430 quotes cdn-lfs-us-1.hf.co's body); other stores answer
# 401 or 410 Gone. From a host the Hub redirected to, the agent asks the Hub for a fresh URL.
EXPIRED_STATUSES = frozenset((401, 403, 410))
RETRIES = 5  # waits per request before the file fails (huggingface_hub http_backoff: max_retries=5)
BACKOFF_FIRST_S = 1.0  # then doubling (huggingface_hub: base_wait_time=1)
BACKOFF_MAX_S = 8.0  # huggingface_hub: max_wait_time=8
RETRY_AFTER_MAX_S = 300.0  # the Hub counts its rate limits over 5-minute windows (hub docs "rate-limits")
MAX_RESOLVES = 8  # fresh storage URLs per file: a store that refuses each fresh URL is not expiring them
# the Hub's RateLimit header, '"api";r=0;t=55' (huggingface_hub utils/_http.py _RATELIMIT_REGEX)
_RATELIMIT = re.compile(r"\"(?P<kind>\w+)\"\s*;\s*r\s*=\s*(?P<r>\d+)\s*;\s*t\s*=\s*(?P<t>\d+)")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks for, or None when it says nothing readable.

    Both forms of RFC 9110 section 10.2.3: delay-seconds (``120``) and an
    HTTP-date (``Wed, 21 Oct 2015 07:28:00 GMT``; a date past is 0).
    huggingface_hub reads only the first (``_parse_retry_after``); a CDN may send either.
    """
    if value is None or not value.strip():
        return None
    v = value.strip()
    if v.isdigit():
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:  # Python 3.8/3.9 return None for what they cannot read
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def parse_ratelimit_reset(value: str | None) -> float | None:
    """Seconds until the Hub's quota comes back, from its ``RateLimit`` header when nothing remains (``r=0``)."""
    m = _RATELIMIT.search(value or "")
    if m is None or int(m.group("r")) != 0:
        return None
    return float(int(m.group("t")))


def backoff_s(attempt: int) -> float:
    """The wait before try ``attempt + 2`` when the server names none: 1, 2, 4, 8, 8 ... seconds."""
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** min(attempt, 16))))


def wait_before_retry(status: int | None, header: Callable[[str], str | None] | None, attempt: int,
                      now: float | None = None) -> tuple[float, str]:
    """(seconds, basis) to wait before the next try: the server's word, capped, else the backoff.

    A 429 with the Hub's ``RateLimit`` header waits for its reset (as
    huggingface_hub does); else ``Retry-After`` in either form; either capped
    at ``RETRY_AFTER_MAX_S``, so a far date costs one window, not a day.
    """
    if header is not None:
        reset = parse_ratelimit_reset(header("RateLimit")) if status == 429 else None
        if reset is not None:
            return min(reset, RETRY_AFTER_MAX_S), "RateLimit"
        after = parse_retry_after(header("Retry-After"), now)
        if after is not None:
            return min(after, RETRY_AFTER_MAX_S), "Retry-After"
    return backoff_s(attempt), "backoff"


class Patience:
    """The retry budget of one request: ``retries`` waits, renewed whenever bytes arrive.

    A transfer that makes progress between cuts goes on (huggingface_hub's
    ``http_get`` resets its count when data comes in); one that fails
    ``retries + 1`` times in a row without a byte raises :class:`AgentError`
    naming ``what`` and the last failure. The wait is cut short by ``stop``
    (then :class:`Interrupted`), and each wait is an event the operator sees.
    """

    def __init__(self, what: str, stop: threading.Event | StopScope, emit: Emitter | None = None,
                 retries: int = RETRIES, max_total_s: float | None = None, file: str | None = None) -> None:
        self.what, self.stop, self.emit, self.retries = what, stop, emit, retries
        self.file = file or what  # the file the events name (``what`` may add the byte range)
        self.max_total_s = max_total_s  # a step that must answer within a timeout waits no longer than this
        self.tries = 0
        self.waited_s = 0.0

    def wait(self, why: str, status: int | None = None, header: Callable[[str], str | None] | None = None) -> None:
        if self.stop.is_set():
            raise Interrupted("stopped")
        if self.tries >= self.retries:
            raise AgentError(f"{self.what}: {why} (gave up after {self.tries + 1} tries in a row)")
        delay, basis = wait_before_retry(status, header, self.tries)
        if self.max_total_s is not None and self.waited_s + delay > self.max_total_s:
            raise AgentError(f"{self.what}: {why}; the server asks to wait {delay:.0f} s ({basis}), longer than "
                             f"this step waits: run it again later")
        self.tries += 1
        if self.emit is not None:
            self.emit("retry", file=self.file, status=status, wait_s=round(delay, 3), basis=basis, attempt=self.tries,
                      message=f"{self.what}: {why}; trying again in {delay:.1f} s ({basis}, "
                              f"retry {self.tries} of {self.retries})")
        deadline = time.monotonic() + delay
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.1))
        self.waited_s += delay
        if self.stop.is_set():
            raise Interrupted("stopped")

    def progress(self) -> None:
        self.tries = 0


def _drain(resp: http.client.HTTPResponse, client: Client) -> None:
    """Read a small answer we do not keep (so the connection can serve the next); drop a large or broken one."""
    try:
        length = int(resp.getheader("Content-Length") or -1)
        if 0 <= length <= 64 * 1024:
            resp.read()
            return
    except (OSError, http.client.HTTPException, ValueError):
        pass
    client.close()


def _request(client: Client, url: str, headers: dict[str, str], patience: Patience,
             method: str = "GET") -> http.client.HTTPResponse:
    """``client.get`` until the answer is not one to wait for: network errors and ``RETRY_STATUSES``, bounded."""
    while True:
        try:
            resp = client.get(url, headers, method)
        except (OSError, http.client.HTTPException) as exc:
            patience.wait(f"network: {exc.__class__.__name__}: {exc}")
            continue
        if resp.status in RETRY_STATUSES:
            _drain(resp, client)
            patience.wait(f"HTTP {resp.status} {resp.reason}", resp.status, resp.getheader)
            continue
        return resp


# --------------------------------------------------------------------------- events


class Emitter:
    """Writes one JSON object per line and flushes, from any thread."""

    def __init__(self, stream=None) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: object) -> None:
        line = json.dumps({"event": event, "t": round(time.time(), 3), **fields}, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class Meter:
    """Bytes moved and when: the numbers progress events report."""

    def __init__(self, emit: Emitter, interval_s: float, **fixed: object) -> None:
        self.emit = emit
        self.interval_s = interval_s
        self.fixed = dict(fixed)
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.session_bytes = 0  # moved by this process
        self.base_bytes = 0  # already present when it started (a resume)
        self.total: int | None = None
        self._last = 0.0

    def add(self, n: int) -> None:
        with self.lock:
            self.session_bytes += n
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self.report()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.start
        return self.session_bytes / elapsed if elapsed > 0 else 0.0

    def report(self, **extra: object) -> None:
        self.emit(
            "progress", bytes_done=self.base_bytes + self.session_bytes, bytes_total=self.total,
            rate_Bps=round(self.rate()), **self.fixed, **extra,
        )


# --------------------------------------------------------------------------- hashing


class HashCache:
    """path -> (size, mtime_ns, sha256[, chunk_bytes, chunk hashes]), trusted while size and mtime are unchanged."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.lock = threading.Lock()
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    self.entries = dict(json.load(f))
            except (OSError, ValueError):
                self.entries = {}  # a damaged cache only costs a re-hash

    def _hit(self, path: str) -> list[Any] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        hit = self.entries.get(os.path.abspath(path))
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit
        return None

    def get(self, path: str) -> str | None:
        hit = self._hit(path)
        return str(hit[2]) if hit else None

    def get_chunks(self, path: str, chunk_bytes: int) -> tuple[str, list[str]] | None:
        """(sha256, chunk hashes) when the entry is fresh and was cut at ``chunk_bytes``."""
        hit = self._hit(path)
        if hit and len(hit) >= 5 and hit[3] == chunk_bytes:
            return str(hit[2]), list(hit[4])
        return None

    def put(self, path: str, sha256: str, chunk_bytes: int | None = None, chunks: list[str] | None = None) -> None:
        st = os.stat(path)
        entry: list[Any] = [st.st_size, st.st_mtime_ns, sha256]
        if chunk_bytes is not None and chunks is not None:
            entry += [chunk_bytes, list(chunks)]
        with self.lock:
            self.entries[os.path.abspath(path)] = entry

    def save(self) -> None:
        if not self.path:
            return
        with self.lock:
            atomic_write_json(self.path, self.entries)


def atomic_write_json(path: str, data: object) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


def sha256_file(path: str, meter: Meter | None = None, cache: HashCache | None = None) -> str:
    """SHA-256 of a file, streamed in 8 MiB blocks (from the cache when it is fresh)."""
    if cache is not None:
        hit = cache.get(path)
        if hit is not None:
            if meter is not None:
                meter.base_bytes += os.path.getsize(path)
            return hit
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(HASH_BLOCK)
            if not block:
                break
            h.update(block)
            if meter is not None:
                meter.add(len(block))
    digest = h.hexdigest()
    if cache is not None:
        cache.put(path, digest)
    return digest


def n_chunks_of(size: int, chunk_bytes: int) -> int:
    return (size + chunk_bytes - 1) // chunk_bytes


def hash_chunks(
    path: str, chunk_bytes: int, *, whole: bool = True, meter: Meter | None = None,
) -> tuple[str | None, list[str]]:
    """The file's SHA-256 (when ``whole``) and the SHA-256 of each ``chunk_bytes`` piece, in one read.

    The two digests run on two threads (hashlib releases the GIL on large
    buffers), so on two cores the chunk hashes cost no extra wall time.
    """
    chunks: list[str] = []
    full = hashlib.sha256() if whole else None
    blocks: queue.Queue[Any] = queue.Queue(maxsize=4)
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            while True:
                block = blocks.get()
                if block is None:
                    return
                full.update(block)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    helper = threading.Thread(target=follow, name="sha256-whole", daemon=True) if whole else None
    if helper is not None:
        helper.start()
    try:
        with open(path, "rb", buffering=0) as f:
            while True:
                piece = hashlib.sha256()
                left = chunk_bytes
                got_any = False
                while left > 0:
                    block = f.read(min(HASH_BLOCK, left))
                    if not block:
                        break
                    got_any = True
                    if helper is not None:
                        blocks.put(block)
                    piece.update(block)
                    left -= len(block)
                    if meter is not None:
                        meter.add(len(block))
                if not got_any:
                    break
                chunks.append(piece.hexdigest())
                if left > 0:
                    break
    finally:
        if helper is not None:
            blocks.put(None)
            helper.join()
    if failure:
        raise failure[0]
    return (full.hexdigest() if full is not None else None), chunks


def file_digests(
    path: str, chunk_bytes: int, meter: Meter | None = None, cache: HashCache | None = None,
) -> tuple[str, list[str]]:
    """(sha256, chunk hashes) of a file, from the cache when it is fresh."""
    if cache is not None:
        hit = cache.get_chunks(path, chunk_bytes)
        if hit is not None:
            if meter is not None:
                meter.base_bytes += os.path.getsize(path)
            return hit
    digest, chunks = hash_chunks(path, chunk_bytes, meter=meter)
    assert digest is not None
    if cache is not None:
        cache.put(path, digest, chunk_bytes, chunks)
    return digest, chunks


# --------------------------------------------------------------------------- HTTP client


class Client:
    """Keep-alive connections (one per scheme/host/port) for one thread; follows redirects."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self.last_url = ""  # where the last answer came from, after redirects

    def _conn(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        key = (scheme, host, port)
        conn = self._conns.get(key)
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=self.timeout_s)
            self._conns[key] = conn
        return conn

    def get(self, url: str, headers: dict[str, str], method: str = "GET") -> http.client.HTTPResponse:
        """The answer to ``url``, redirects followed with the same headers (``Range`` included).

        ``Authorization`` is dropped once a redirect leaves the first host, as
        requests and httpx do (``Session.rebuild_auth``): the Hub's token must not
        reach the storage host its LFS files redirect to.
        """
        origin = urllib.parse.urlsplit(url).netloc
        for _ in range(MAX_REDIRECTS):
            if urllib.parse.urlsplit(url).netloc != origin:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise AgentError(f"not an http(s) URL: {url}")
            port = u.port or (443 if u.scheme == "https" else 80)
            target = (u.path or "/") + (f"?{u.query}" if u.query else "")
            for fresh in (False, True):
                reused = (u.scheme, u.hostname, port) in self._conns
                conn = self._conn(u.scheme, u.hostname, port)
                try:
                    conn.request(method, target, headers={"User-Agent": "sparkctl-weights-agent", **headers})
                    resp = conn.getresponse()
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self.close()
                    if fresh or not reused:
                        raise
                    # a keep-alive connection the server closed while idle: once more on a new one,
                    # as urllib3 does for a pooled connection found dead (not a failure of the server)
                except (OSError, http.client.HTTPException):
                    self.close()  # the caller waits and retries on a fresh connection
                    raise
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                resp.read()
                if not location:
                    raise AgentError(f"redirect without Location from {url}")
                url = urllib.parse.urljoin(url, location)
                continue
            self.last_url = url
            return resp
        raise AgentError(f"more than {MAX_REDIRECTS} redirects from {url}")

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _content_range(resp: http.client.HTTPResponse) -> tuple[int, int, int | None]:
    """(first, last, total) of a 206 answer's Content-Range."""
    value = resp.getheader("Content-Range") or ""
    try:
        unit, rest = value.split(" ", 1)
        span, total = rest.split("/", 1)
        first, last = span.split("-", 1)
        if unit != "bytes":
            raise ValueError(value)
        return int(first), int(last), None if total == "*" else int(total)
    except ValueError:
        raise AgentError(f"unreadable Content-Range {value!r}") from None


# --------------------------------------------------------------------------- download


class _Sidecar:
    """PATH.part.json: which chunks of PATH.part are complete, and how far a chunk cut short got.

    ``partial`` (chunk -> bytes from its start) is what a job that was
    stopped, or gave a chunk up, had written of it: the next run asks for the
    rest only (``Range`` from the bytes on disk). Not kept for verified
    chunks (a pull's): a chunk's hash cannot be resumed, the chunk is fetched whole.
    """

    def __init__(self, path: str, size: int, chunk_bytes: int, key: str, verified: bool = False) -> None:
        self.path = path
        # verified: every chunk listed in "done" matched the manifest's hash (what a relay may serve)
        self.meta: dict[str, Any] = {"version": 1, "size": size, "chunk_bytes": chunk_bytes, "key": key, "verified": verified}
        self.done: set[int] = set()
        self.partial: dict[int, int] = {}
        self.lock = threading.Lock()

    def _write(self) -> None:
        data: dict[str, Any] = {**self.meta, "done": sorted(self.done)}
        if self.partial:
            data["partial"] = {str(i): n for i, n in sorted(self.partial.items())}
        atomic_write_json(self.path, data)

    def load(self) -> bool:
        """Adopt the recorded chunks if the sidecar describes this same download."""
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return False
        if any(data.get(k) != v for k, v in self.meta.items()):
            return False
        self.done = {int(i) for i in data.get("done", [])}
        chunk, size = int(self.meta["chunk_bytes"]), int(self.meta["size"])
        try:
            partial = {int(i): int(n) for i, n in (data.get("partial") or {}).items()}
        except (TypeError, ValueError, AttributeError):
            partial = {}
        self.partial = {} if self.meta["verified"] else {
            i: n for i, n in partial.items()
            if i not in self.done and 0 <= i * chunk < size and 0 < n < min(chunk, size - i * chunk)}
        return True

    def mark(self, index: int) -> None:
        with self.lock:
            self.done.add(index)
            self.partial.pop(index, None)
            self._write()

    def mark_partial(self, index: int, nbytes: int) -> None:
        """Chunk ``index`` has its first ``nbytes`` on disk (it was cut short; the next run continues it)."""
        if self.meta["verified"] or nbytes <= 0:
            return
        with self.lock:
            self.partial[index] = nbytes
            self._write()


class Slots:
    """A job's connection budget, shared by every file in flight: at most N ranged requests at once.

    A file's chunk is taken from its queue only once a slot is free, so when a
    file has no chunk left to take every one of its chunks is on a connection
    and the next file may start: N connections stay busy across file
    boundaries (a repository of 4 GB shards cut in 32 MiB chunks, or of many
    small files), instead of idling through each file's probe, hash tail and fsync.
    """

    def __init__(self, n: int) -> None:
        self._sem = threading.Semaphore(max(1, n))

    def acquire(self, stop: threading.Event | StopScope) -> bool:
        while not stop.is_set():
            if self._sem.acquire(timeout=0.1):
                return True
        return False

    def release(self) -> None:
        self._sem.release()


class StopScope:
    """One file's stop: set by its own failure (the other files go on) or by the job's stop (all of them end)."""

    def __init__(self, parent: threading.Event | StopScope) -> None:
        self.parent = parent
        self._own = threading.Event()

    def is_set(self) -> bool:
        return self._own.is_set() or self.parent.is_set()

    def set(self) -> None:
        self._own.set()


def _discard(*paths: str) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_all(resp: http.client.HTTPResponse, limit: int) -> bytes:
    """A whole (small) body; a body that stops before its Content-Length raises, never returns short.

    ``HTTPResponse.read(amt)`` returns what arrived when the connection ends
    early; ``read()`` raises ``IncompleteRead``: only the latter tells a cut
    answer from a whole one.
    """
    if resp.length is not None:
        if resp.length > limit:
            raise AgentError(f"an answer of {resp.length} bytes, more than the {limit} expected")
        return resp.read()
    return resp.read(limit)


def _body_text(resp: http.client.HTTPResponse, limit: int = 512) -> str:
    """The start of a refusal's body, for the message (a body that breaks off says less, never raises)."""
    try:
        return resp.read(limit).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException):
        return ""


def _probe(client: Client, url: str, headers: dict[str, str], patience: Patience) -> http.client.HTTPResponse:
    """The answer to ``Range: bytes=0-0`` (redirects followed); the body of a 206 or 416 read, any other left.

    A 200 is a server that ignores ranges (the caller streams this very
    answer); a refusal's body is the caller's to quote.
    """
    while True:
        resp = _request(client, url, {**headers, "Range": "bytes=0-0"}, patience)
        if resp.status not in (206, 416):
            return resp
        try:
            _read_all(resp, 64 * 1024)
        except (OSError, http.client.HTTPException) as exc:
            client.close()
            patience.wait(f"network: the answer stopped: {exc.__class__.__name__}: {exc}")
            continue
        return resp


class _Source:
    """Where one file's bytes come from: the URL the Hub redirected to, asked for again when it expires.

    The Hub redirects an LFS file to a signed storage URL that expires
    (cdn-lfs.hf.co's carry ``Expires=``). A file fetched in ranges for longer
    than that gets 403 from the storage host on its next chunk: that chunk's
    connection asks the Hub again (the file's own URL, with the token) for a
    fresh redirect, and every connection of the file takes the new URL on its
    next request. huggingface_hub's ``http_get`` keeps the expired URL and
    fails the file (tests/test_hub.py shows it); huggingface.js refetches
    (huggingface.js issue #1277), as the agent does.
    """

    def __init__(self, origin: str, url: str, headers: dict[str, str], *, label: str, timeout_s: float,
                 stop: threading.Event | StopScope, emit: Emitter, retries: int) -> None:
        self.origin, self.url = origin, url
        self.headers = headers  # the Hub's (with the token; Client drops it on the way to another host)
        self.label, self.timeout_s, self.stop, self.emit, self.retries = label, timeout_s, stop, emit, retries
        self.lock = threading.Lock()
        self.resolves = 0

    @property
    def redirected(self) -> bool:
        return self.url != self.origin

    def progress(self) -> None:
        """Bytes came through a resolved URL: the next refusals count from zero ("in a row")."""
        with self.lock:
            self.resolves = 0

    def refresh(self, seen: str, status: int) -> None:
        """A fresh URL in place of ``seen``, refused with ``status``; raises when the Hub will not give one."""
        with self.lock:
            if self.url != seen:
                return  # another connection of this file resolved it meanwhile
            if self.resolves >= MAX_RESOLVES:
                raise AgentError(f"{self.label}: the storage host refused {MAX_RESOLVES} fresh URLs in a row "
                                 f"(HTTP {status}): not an expiry")
            client = Client(self.timeout_s)
            try:
                resp = _probe(client, self.origin, self.headers, Patience(self.label, self.stop, self.emit,
                                                                          self.retries))
                fresh = client.last_url or self.origin
            finally:
                client.close()
            if resp.status not in (200, 206, 416) or fresh == seen:
                raise HttpRefused(f"{self.label}: the storage URL was refused (HTTP {status}) and the Hub's "
                                  f"answer for a fresh one is HTTP {resp.status} {resp.reason}", resp.status,
                                  resp.getheader("X-Error-Code"), resp.getheader("X-Error-Message"))
            self.resolves += 1
            self.url = fresh
            self.emit("resolved", file=self.label, status=status,
                      message=f"{self.label}: the storage URL expired (HTTP {status}): resolved again from the Hub")


def fetch_file(
    url: str, dest: str, *, emit: Emitter, connections: int = 8, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sha256: str | None = None, size: int | None = None, cache: HashCache | None = None,
    max_bytes: int | None = None, stop: threading.Event | StopScope | None = None, timeout_s: float = 60.0,
    retries: int = RETRIES, interval_s: float = 1.0, label: str | None = None, totals: Meter | None = None,
    chunks: list[str] | None = None, headers: dict[str, str] | None = None, drop_cache: bool = False,
    slots: Slots | None = None, drained: threading.Event | None = None,
) -> dict[str, Any]:
    """Download ``url`` to ``dest`` (ranged, parallel, resumable); return what happened.

    ``size`` and ``sha256``, when given, are what the file must be. ``chunks``
    (a manifest's per-chunk SHA-256, cut at ``chunk_bytes``) switches to the
    verified mode of a pull from a peer: see :func:`_fetch_verified`.
    ``max_bytes`` is a test knob: stop (as if killed) once this process has
    received that many bytes (counted on ``totals`` when given: the whole job).
    ``slots`` is the job's connection budget shared with other files in
    flight; ``drained`` is set once no chunk of this file waits for a
    connection (the caller may then start the next file). Raises :class:`AgentError` on failure,
    :class:`Interrupted` when stopped; the ``.part`` and its sidecar stay for
    the next attempt except after a whole-file checksum mismatch.

    ``headers`` go with every request (a Hub token; dropped by :class:`Client`
    when a redirect leaves the first host). The chunks are requested from
    where the probe's redirects ended (the storage host), so a redirect costs
    one round trip per file, not one per chunk. ``drop_cache``: written pages
    are dropped from the page cache once flushed and hashed
    (``posix_fadvise(DONTNEED)``), so a download beside a loaded engine does
    not eat MemAvailable.
    """
    label = label or os.path.basename(dest)
    hdrs = dict(headers or {})
    sha256 = sha256.lower() if sha256 else None
    stop = stop or threading.Event()
    part, sidecar_path = dest + PART_SUFFIX, dest + SIDECAR_SUFFIX
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    if chunks is not None:
        if sha256 is None or size is None:
            raise AgentError(f"{label}: chunk hashes need the file's size and sha256")
        return _fetch_verified(
            url, dest, emit=emit, connections=connections, chunk_bytes=chunk_bytes, sha256=sha256, size=size,
            chunks=chunks, cache=cache, max_bytes=max_bytes, stop=stop, timeout_s=timeout_s, retries=retries,
            interval_s=interval_s, label=label, totals=totals, slots=slots, drained=drained,
        )
    if os.path.exists(dest) and (size is None or os.path.getsize(dest) == size):
        if sha256 is not None:
            have = sha256_file(dest, cache=cache)
            if have == sha256:
                return {"file": label, "skipped": True, "bytes": 0, "size": size, "sha256": have, "seconds": 0.0}
        elif size is not None:
            return {"file": label, "skipped": True, "bytes": 0, "size": size, "sha256": None, "seconds": 0.0}

    start = time.monotonic()
    meter = Meter(emit, interval_s, file=label)
    probe_client = Client(timeout_s)
    patience = Patience(label, stop, emit, retries)
    resp = _probe(probe_client, url, hdrs, patience)
    final_url = probe_client.last_url or url
    source = _Source(url, final_url, hdrs, label=label, timeout_s=timeout_s, stop=stop, emit=emit, retries=retries)
    if urllib.parse.urlsplit(final_url).netloc != urllib.parse.urlsplit(url).netloc:
        hdrs = {k: v for k, v in hdrs.items() if k.lower() != "authorization"}  # the storage host gets no token
    if resp.status == 206:
        _, _, total = _content_range(resp)
        probe_client.close()
        if total is None:
            raise AgentError(f"{url}: the server did not say the file's size")
        ranged = True
    elif resp.status == 416:  # an empty file has no byte 0
        probe_client.close()
        total, ranged = 0, True
    elif resp.status == 200:
        length = resp.getheader("Content-Length")
        total, ranged = (int(length) if length is not None else None), False
    else:
        body = _body_text(resp)
        probe_client.close()
        raise HttpRefused(f"{label}: HTTP {resp.status} {resp.reason}" + (f": {body[:200]}" if body else ""),
                          resp.status, resp.getheader("X-Error-Code"), resp.getheader("X-Error-Message"))
    if not ranged:
        emit("notice", file=label, no_ranges=True,
             message=f"{label}: the server ignores Range requests: one stream from byte 0 (no parallel chunks, "
                     "an interruption restarts the file)")
    if size is not None and total is not None and total != size:
        if not ranged:
            probe_client.close()
        raise AgentError(f"{url}: the server has {total} bytes, the manifest says {size}")
    meter.total = total
    if sha256 is None and total is not None and os.path.exists(dest) and os.path.getsize(dest) == total:
        if not ranged:
            probe_client.close()
        return {"file": label, "skipped": True, "bytes": 0, "size": total, "sha256": None, "seconds": 0.0}

    # each chunk's SHA-256, hashed from the receive buffer: with the whole file's, what a manifest
    # needs, so a sync after this fetch reads no byte of it again (the hash cache holds both)
    digests: dict[int, str] = {}
    if ranged:
        assert total is not None  # a ranged server names its size (Content-Range)
        digest = _fetch_ranged(
            source, part, sidecar_path, total, emit=emit, meter=meter, connections=connections,
            chunk_bytes=chunk_bytes, key=sha256 or url, max_bytes=max_bytes, stop=stop, timeout_s=timeout_s,
            retries=retries, totals=totals, headers=hdrs, drop_cache=drop_cache, slots=slots, drained=drained,
            chunk_digests=digests,
        )
    else:
        if drained is not None:
            drained.set()  # one stream, already open: the next file may start beside it
        try:
            while True:
                try:
                    digest = _fetch_stream(resp, part, sidecar_path, meter=meter, max_bytes=max_bytes, stop=stop,
                                           totals=totals, drop_cache=drop_cache, total=total)
                    break
                except _StreamCut as cut:
                    # no ranges: what arrived cannot be continued, only fetched again from byte 0
                    probe_client.close()
                    if cut.got:
                        patience.progress()
                    for m in (meter, totals):
                        if m is not None:
                            with m.lock:
                                m.session_bytes -= cut.got
                    patience.wait(f"{cut}; the server ignores Range: from byte 0 again")
                    resp = _request(probe_client, url, hdrs, patience)
                    if resp.status != 200:
                        body = _body_text(resp)
                        raise HttpRefused(f"{label}: HTTP {resp.status} {resp.reason}" + (f": {body[:200]}" if body
                                          else ""), resp.status, resp.getheader("X-Error-Code"),
                                          resp.getheader("X-Error-Message"))
        finally:
            probe_client.close()

    got = os.path.getsize(part)
    if total is not None and got != total:
        _discard(part, sidecar_path)
        raise AgentError(f"{label}: received {got} bytes, expected {total}")
    if sha256 is not None and digest != sha256:
        _discard(part, sidecar_path)
        raise AgentError(f"{label}: sha256 mismatch: got {digest}, expected {sha256} (partial file deleted)")
    _commit(part, dest, sidecar_path, drop_cache=drop_cache)
    if cache is not None and digest is not None:
        n = n_chunks_of(got, chunk_bytes)
        if ranged and len(digests) == n:  # every chunk arrived in this run (a resumed file has gaps)
            cache.put(dest, digest, chunk_bytes, [digests[i] for i in range(n)])
        else:
            cache.put(dest, digest)
    seconds = time.monotonic() - start
    meter.report()
    return {
        "file": label, "skipped": False, "bytes": meter.session_bytes, "resumed_bytes": meter.base_bytes,
        "size": got, "sha256": digest, "seconds": round(seconds, 3), "ranged": ranged,
        "rate_Bps": round(meter.session_bytes / seconds) if seconds > 0 else 0,
    }


def drop_pages(fd: int, offset: int = 0, length: int = 0) -> None:
    """Drop clean cached pages of ``fd`` (from ``offset``, ``length`` 0 = to the end); dirty pages stay.

    The field report's download law: a download beside a loaded engine must keep
    the page cache in check; written pages are clean once flushed, and
    ``POSIX_FADV_DONTNEED`` then frees them (posix_fadvise(2)).
    """
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # advice only


def _commit(part: str, dest: str, sidecar_path: str, drop_cache: bool = False) -> None:
    """fsync the complete ``.part``, rename it to ``dest`` atomically, and make the rename durable."""
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop_cache:
            drop_pages(fd)
    finally:
        os.close(fd)
    os.replace(part, dest)
    _discard(sidecar_path)
    _fsync_dir(dest)


def _fetch_verified(
    url: str, dest: str, *, emit: Emitter, connections: int, chunk_bytes: int, sha256: str, size: int,
    chunks: list[str], cache: HashCache | None, max_bytes: int | None, stop: threading.Event | StopScope, timeout_s: float,
    retries: int, interval_s: float, label: str, totals: Meter | None, slots: Slots | None = None,
    drained: threading.Event | None = None,
) -> dict[str, Any]:
    """A pull from a peer that knows the manifest: every chunk is checked as it arrives.

    Each connection hashes its chunk from the receive buffer while writing it
    (the bytes are never read back), and a chunk counts as done, in the sidecar,
    only once its SHA-256 equals the manifest's; a relay serving this file
    before it is complete passes on only such chunks. All chunks verified means
    the file is the source's (the chunk hashes and ``sha256`` come from one
    read of the source file). No probe request: the manifest says the size,
    and every ``Content-Range`` must agree with it.

    A ``dest`` that is present but differs (a cache miss, then a hash per
    chunk) is repaired: it becomes the ``.part`` with its good chunks marked
    done, and only the bad chunks travel.
    """
    n = n_chunks_of(size, chunk_bytes)
    if len(chunks) != n:
        raise AgentError(f"{label}: the manifest lists {len(chunks)} chunk hashes for {n} chunks of {chunk_bytes}")
    part, sidecar_path = dest + PART_SUFFIX, dest + SIDECAR_SUFFIX
    key = f"{sha256}/{chunk_bytes}"
    start = time.monotonic()
    if os.path.exists(dest) and os.path.getsize(dest) == size:
        if cache is not None and cache.get(dest) == sha256:
            return {"file": label, "skipped": True, "bytes": 0, "size": size, "sha256": sha256, "seconds": 0.0}
        _, have = hash_chunks(dest, chunk_bytes, whole=False)
        good = [i for i in range(n) if have[i] == chunks[i]]
        if len(good) == n:
            if cache is not None:
                cache.put(dest, sha256, chunk_bytes, chunks)
            return {"file": label, "skipped": True, "bytes": 0, "size": size, "sha256": sha256,
                    "seconds": round(time.monotonic() - start, 3)}
        emit("repair", file=label, chunks_bad=n - len(good), chunks_total=n)
        os.replace(dest, part)
        atomic_write_json(sidecar_path, {**_Sidecar(sidecar_path, size, chunk_bytes, key, True).meta, "done": good})
    meter = Meter(emit, interval_s, file=label)
    meter.total = size
    _fetch_ranged(
        url, part, sidecar_path, size, emit=emit, meter=meter, connections=connections, chunk_bytes=chunk_bytes,
        key=key, max_bytes=max_bytes, stop=stop, timeout_s=timeout_s, retries=retries, totals=totals,
        chunk_hashes=chunks, slots=slots, drained=drained,
    )
    got = os.path.getsize(part)
    if got != size:
        _discard(part, sidecar_path)
        raise AgentError(f"{label}: received {got} bytes, expected {size}")
    _commit(part, dest, sidecar_path)
    if cache is not None:
        cache.put(dest, sha256, chunk_bytes, chunks)
    seconds = time.monotonic() - start
    meter.report()
    return {
        "file": label, "skipped": False, "bytes": meter.session_bytes, "resumed_bytes": meter.base_bytes,
        "size": got, "sha256": sha256, "seconds": round(seconds, 3), "ranged": True, "chunks_verified": n,
        "rate_Bps": round(meter.session_bytes / seconds) if seconds > 0 else 0,
    }


def _fetch_ranged(
    url: str | _Source, part: str, sidecar_path: str, total: int, *, emit: Emitter, meter: Meter, connections: int,
    chunk_bytes: int, key: str, max_bytes: int | None, stop: threading.Event | StopScope, timeout_s: float, retries: int,
    totals: Meter | None, chunk_hashes: list[str] | None = None, headers: dict[str, str] | None = None,
    drop_cache: bool = False, slots: Slots | None = None, drained: threading.Event | None = None,
    chunk_digests: dict[int, str] | None = None,
) -> str | None:
    """Chunks into ``part`` over N connections; the whole-file SHA-256, or None with ``chunk_hashes``.

    Without chunk hashes a hasher thread follows the contiguous completed
    prefix (reading it back from the page cache). With them each chunk is
    verified by the connection that receives it, and the sidecar records only
    verified chunks.
    """
    n_chunks = n_chunks_of(total, chunk_bytes)
    verified = chunk_hashes is not None
    sidecar = _Sidecar(sidecar_path, total, chunk_bytes, key, verified)
    resumed = os.path.exists(part) and os.path.getsize(part) == total and sidecar.load()
    if not resumed:
        sidecar.done = set()
        with open(part, "wb") as f:
            f.truncate(total)  # sparse: chunks land at their offsets
        atomic_write_json(sidecar_path, {**sidecar.meta, "done": []})
    if not resumed:
        sidecar.partial = {}
    meter.base_bytes = sum(min(chunk_bytes, total - i * chunk_bytes) for i in sidecar.done) + \
        sum(sidecar.partial.values())
    if totals is not None:
        totals.base_bytes += meter.base_bytes
    if resumed:
        emit("resume", file=meter.fixed.get("file"), chunks_done=len(sidecar.done), chunks_total=n_chunks,
             partial_bytes=sum(sidecar.partial.values()))
    todo: queue.Queue[int] = queue.Queue()
    for i in range(n_chunks):
        if i not in sidecar.done:
            todo.put(i)
    n_todo = todo.qsize()
    if n_todo == 0 and drained is not None:
        drained.set()
    fd = os.open(part, os.O_RDWR)
    cond = threading.Condition()
    errors: list[BaseException] = []
    hasher = hashlib.sha256()
    hashed = [0]
    hashed_so_far = [0]  # what the hasher has read back: pages before it may be dropped once flushed

    def contiguous_bytes() -> int:
        i = 0
        while i in sidecar.done:
            i += 1
        return min(i * chunk_bytes, total)

    def hash_behind() -> None:
        # Follows the completed prefix so the checksum is ready when the last chunk lands.
        pos = 0
        while pos < total:
            with cond:
                while not stop.is_set() and contiguous_bytes() <= pos:
                    cond.wait(0.5)
                if stop.is_set():
                    return
                end = contiguous_bytes()
            while pos < end:
                block = os.pread(fd, min(HASH_BLOCK, end - pos), pos)
                if not block:
                    raise AgentError(f"short read at {pos} while hashing {part}")
                hasher.update(block)
                pos += len(block)
                hashed_so_far[0] = pos
        hashed[0] = pos

    def flush_behind() -> None:
        # Writes back completed data while the transfer runs, so the fsync before
        # the rename has little left to do (the disk works in parallel with the network).
        flushed = len(sidecar.done)
        while True:
            with cond:
                while not stop.is_set() and len(sidecar.done) < n_chunks and (
                    (len(sidecar.done) - flushed) * chunk_bytes < FLUSH_BYTES
                ):
                    cond.wait(0.5)
                if stop.is_set():
                    return
                now_done = len(sidecar.done)
            os.fdatasync(fd)
            if drop_cache:
                drop_pages(fd, 0, total if verified else hashed_so_far[0])
            flushed = now_done
            if now_done >= n_chunks:
                return

    def worker() -> None:
        client = Client(timeout_s)
        buf = bytearray(RECV_BUF)
        view = memoryview(buf)
        try:
            while not stop.is_set():
                if slots is not None and not slots.acquire(stop):
                    return
                try:
                    try:
                        index = todo.get_nowait()
                    except queue.Empty:
                        return
                    if drained is not None and todo.empty():
                        drained.set()  # every chunk of this file is on a connection
                    first = index * chunk_bytes
                    last = min(first + chunk_bytes, total) - 1
                    kept = sidecar.partial.get(index, 0)
                    _fetch_chunk(client, url, fd, first, last, view, meter, totals, max_bytes, stop, retries,
                                 total, chunk_hashes[index] if chunk_hashes is not None else None, headers,
                                 # a chunk continued from an earlier run has no digest of its own
                                 record=None if chunk_digests is None or kept else (chunk_digests, index), emit=emit,
                                 label=str(meter.fixed.get("file") or os.path.basename(part)), resume_at=kept,
                                 keep=functools.partial(sidecar.mark_partial, index))
                finally:
                    if slots is not None:
                        slots.release()
                with cond:
                    sidecar.mark(index)
                    cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
            stop.set()
            with cond:
                cond.notify_all()
        finally:
            client.close()

    hash_thread = threading.Thread(target=_guard(hash_behind, errors, stop, cond), name="hash", daemon=True)
    if not verified:
        hash_thread.start()
    flush_thread = threading.Thread(target=_guard(flush_behind, errors, stop, cond), name="flush", daemon=True)
    flush_thread.start()
    threads = [threading.Thread(target=worker, name=f"chunk-{k}", daemon=True)
               for k in range(max(1, min(connections, n_todo)))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
        if not verified:
            hash_thread.join()
        flush_thread.join()
    finally:
        os.close(fd)
    if errors:
        interrupted = next((e for e in errors if isinstance(e, Interrupted)), None)
        raise interrupted or (errors[0] if isinstance(errors[0], AgentError) else AgentError(repr(errors[0])))
    if stop.is_set():
        raise Interrupted("stopped")
    if len(sidecar.done) != n_chunks or (not verified and hashed[0] != total):
        raise AgentError(f"{part}: {n_chunks - len(sidecar.done)} chunks missing after the download")
    return None if verified else hasher.hexdigest()


def _guard(fn, errors: list[Any], stop: threading.Event | StopScope, cond: threading.Condition):  # type: ignore[no-untyped-def]
    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
            with cond:
                cond.notify_all()

    return run


class ChunkMismatch(AgentError):
    """A chunk whose SHA-256 differs from the manifest's (fetched again, then fatal)."""


def _fetch_chunk(
    client: Client, url: str | _Source, fd: int, first: int, last: int, view: memoryview, meter: Meter,
    totals: Meter | None, max_bytes: int | None, stop: threading.Event | StopScope, retries: int, total: int | None = None,
    expect: str | None = None, headers: dict[str, str] | None = None,
    record: tuple[dict[int, str], int] | None = None, emit: Emitter | None = None, label: str | None = None,
    resume_at: int = 0, keep: Callable[[int], None] | None = None,
) -> None:
    """Bytes ``first``..``last`` into ``fd`` at their offset; with ``expect``, hashed on the way and checked.

    A body that stops at any byte is asked for again from that byte (``Range:
    bytes=pos-last``: what is on disk stays and is not counted twice); 429
    and 5xx answers are waited out (:class:`Patience`: Retry-After honoured,
    bounded); a refusal (401/403/410) from the storage host the Hub redirected
    to has the URL resolved again (:class:`_Source`). ``record`` (digests,
    index): the chunk's SHA-256, hashed on the way too, is stored at
    ``digests[index]`` once the chunk is complete. ``resume_at``: the chunk's
    first bytes already on disk from an earlier run (not with ``expect`` or
    ``record``: their hash would miss them); ``keep(n)`` hears how many bytes
    of the chunk are on disk when it ends unfinished (stopped, or given up).
    """
    source = url if isinstance(url, _Source) else None
    what = f"{label or 'download'}: bytes {first}-{last}"
    patience = Patience(what, stop, emit, retries, file=label)
    pos = first + max(0, resume_at)
    h = hashlib.sha256() if expect is not None or record is not None else None
    if h is not None and pos != first:
        raise AgentError(f"{what}: a hashed chunk cannot resume from byte {pos}")
    mismatches = 0

    def uncount(n: int) -> None:
        for m in (meter, totals):
            if m is not None:
                with m.lock:
                    m.session_bytes -= n

    try:
        while True:
            if stop.is_set():
                raise Interrupted("stopped")
            src = source.url if source is not None else str(url)
            resp = _request(client, src, {**(headers or {}), "Range": f"bytes={pos}-{last}"}, patience)
            if resp.status in EXPIRED_STATUSES and source is not None and source.redirected:
                _drain(resp, client)
                source.refresh(src, resp.status)
                continue
            if resp.status != 206:
                body = _body_text(resp, 200)
                client.close()
                raise AgentError(f"{what}: HTTP {resp.status} {resp.reason} (expected 206)"
                                 + (f": {body}" if body else ""))
            got_first, got_last, got_total = _content_range(resp)
            if (got_first, got_last) != (pos, last):
                client.close()
                raise AgentError(f"{what}: asked for bytes {pos}-{last}, got {got_first}-{got_last}")
            if total is not None and got_total is not None and got_total != total:
                client.close()
                raise AgentError(f"{what}: the server has {got_total} bytes, expected {total}")
            began = pos
            cut: str | None = None
            while pos <= last:
                if stop.is_set():
                    raise Interrupted("stopped")
                try:
                    n = resp.readinto(view[: min(len(view), last + 1 - pos)])
                except (OSError, http.client.HTTPException) as exc:
                    cut = f"{exc.__class__.__name__}: {exc}"
                    break
                if not n:
                    cut = "the connection closed"
                    break
                os.pwrite(fd, view[:n], pos)
                if h is not None:
                    h.update(view[:n])  # from the receive buffer: the bytes are never read back
                pos += n
                meter.add(n)
                if totals is not None:
                    totals.add(n)
                counted = totals if totals is not None else meter
                if max_bytes is not None and counted.session_bytes >= max_bytes:
                    raise Interrupted(f"stopped after {counted.session_bytes} bytes (--max-bytes)")
            if cut is not None:
                client.close()
                if pos > began:
                    patience.progress()  # bytes came: the budget starts again (huggingface_hub http_get does too)
                    if source is not None:
                        source.progress()
                patience.wait(f"network: the body stopped at byte {pos} ({cut}); resuming from there")
                continue
            if source is not None:
                source.progress()  # the chunk came whole through the URL it has now
            digest = h.hexdigest() if h is not None else None
            if expect is not None and digest != expect:
                # a mismatch is fetched again twice at most: a relay may have served a chunk of a
                # download that restarted under it; a source with bad bytes will not improve
                mismatches += 1
                client.close()
                message = (f"{label or 'download'}: sha256 mismatch in bytes {first}-{last}: got {digest}, "
                           f"expected {expect}")
                if mismatches > 2:
                    raise ChunkMismatch(message)
                uncount(pos - first)
                pos, h = first, hashlib.sha256()
                patience.wait(message + "; fetching the chunk again")
                continue
            if record is not None and digest is not None:
                record[0][record[1]] = digest
            return
    except AgentError:
        if keep is not None and pos > first:
            keep(pos - first)  # what is on disk of this chunk: the next run asks for the rest only
        raise


class _StreamCut(AgentError):
    """A stream without ranges that stopped after ``got`` bytes."""

    def __init__(self, message: str, got: int) -> None:
        super().__init__(message)
        self.got = got


def _fetch_stream(
    resp: http.client.HTTPResponse, part: str, sidecar_path: str, *, meter: Meter, max_bytes: int | None,
    stop: threading.Event | StopScope, totals: Meter | None, drop_cache: bool = False, total: int | None = None,
) -> str:
    """The fallback for servers without Range: one stream from byte 0, hashed in order.

    A stream that stops early (an error, or the end before ``total`` bytes)
    raises :class:`_StreamCut`; the caller asks again from byte 0.
    """
    _discard(sidecar_path)  # chunk records mean nothing without ranges
    hasher = hashlib.sha256()
    buf = bytearray(RECV_BUF)
    view = memoryview(buf)
    got = 0
    with open(part, "wb") as f:
        while True:
            if stop.is_set():
                raise Interrupted("stopped")
            try:
                n = resp.readinto(view)
            except (OSError, http.client.HTTPException) as exc:
                raise _StreamCut(f"network: the stream stopped at byte {got}: {exc.__class__.__name__}: {exc}",
                                 got) from None
            if not n:
                if total is not None and got < total:
                    raise _StreamCut(f"network: the stream stopped at byte {got} of {total}", got)
                break
            got += n
            f.write(view[:n])
            hasher.update(view[:n])
            meter.add(n)
            if drop_cache and meter.session_bytes % FLUSH_BYTES < n:  # about every FLUSH_BYTES
                f.flush()
                os.fdatasync(f.fileno())
                drop_pages(f.fileno())
            if totals is not None:
                totals.add(n)
            counted = totals if totals is not None else meter
            if max_bytes is not None and counted.session_bytes >= max_bytes:
                raise Interrupted(f"stopped after {counted.session_bytes} bytes (--max-bytes)")
    return hasher.hexdigest()


# --------------------------------------------------------------------------- manifest


def _skip_name(name: str) -> bool:
    return name.endswith((PART_SUFFIX, SIDECAR_SUFFIX)) or ".tmp." in name


def _list_files(root: str) -> tuple[str, dict[str, str], int]:
    """(kind "dir"|"file", relpath -> path, partial files) of a model under ``root``."""
    if os.path.isfile(root):
        return "file", {os.path.basename(root): root}, 0
    if not os.path.isdir(root):
        raise AgentError(f"{root}: no such file or directory")
    paths: dict[str, str] = {}
    partial = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if _skip_name(name):
                partial += name.endswith(PART_SUFFIX)
                continue
            if os.path.isfile(full):
                paths[os.path.relpath(full, root).replace(os.sep, "/")] = full
    return "dir", paths, partial


def cached_summary(root: str, cache: HashCache, *, listed: int = 10) -> dict[str, Any]:
    """What the hash cache vouches for under ``root``, without reading a byte of the files.

    A file counts as verified while its size and mtime are those it had when
    this node last hashed it (a fetch, a pull or a manifest here). ``digest``
    is the SHA-256 of the sorted ``relpath TAB size TAB sha256`` lines, so two
    nodes hold the same files exactly when their digests are equal; it is None
    while any file is unverified (the first ``listed`` are named). Read-only:
    the check's probe runs it.
    """
    if not os.path.exists(root):
        return {"kind": "missing", "root": root}
    kind, paths, partial = _list_files(root)
    lines, unverified, total = [], [], 0
    for rel in sorted(paths):
        size = os.path.getsize(paths[rel])
        total += size
        sha = cache.get(paths[rel])
        if sha is None:
            unverified.append(rel)
        lines.append(f"{rel}\t{size}\t{sha}\n")
    digest = hashlib.sha256("".join(lines).encode()).hexdigest() if paths and not unverified else None
    out = {"kind": kind, "root": root, "files": len(paths), "bytes": total, "digest": digest,
           "n_unverified": len(unverified), "unverified": unverified[:listed], "partial": partial}
    hub = _old_hub_manifest(root) if kind == "dir" else {}
    if hub:
        # what the Hub said against what this node's cache vouches for (no byte read)
        differ = [rel for rel, want in sorted((hub.get("files") or {}).items())
                  if rel not in paths or os.path.getsize(paths[rel]) != want.get("size")
                  or (want.get("sha256") and cache.get(paths[rel]) not in (None, want["sha256"]))]
        out.update(hub_repo=hub.get("repo_id"), hub_commit=hub.get("commit"), hub_differ=differ[:listed],
                   n_hub_differ=len(differ))
    return out


def build_manifest(
    root: str, *, emit: Emitter, cache: HashCache | None = None, interval_s: float = 1.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, Any]:
    """{"kind": "dir"|"file", "files": {relpath: {"size", "sha256", "chunk_bytes", "chunks"}}}.

    ``chunks`` holds the SHA-256 of each ``chunk_bytes`` piece of the file: a
    receiver verifies every chunk as it arrives (no second pass over the file,
    and a relay may pass on a chunk as soon as it is verified); the whole-file
    ``sha256`` is what the hash cache and other tools compare.
    """
    kind, paths, _ = _list_files(root)
    meter = Meter(emit, interval_s, phase="hash")
    meter.total = sum(os.path.getsize(p) for p in paths.values())
    files = {}
    for rel in sorted(paths):
        meter.fixed["file"] = rel
        digest, chunks = file_digests(paths[rel], chunk_bytes, meter, cache)
        files[rel] = {"size": os.path.getsize(paths[rel]), "sha256": digest, "chunk_bytes": chunk_bytes,
                      "chunks": chunks}
    meter.report()
    if kind == "dir":
        check_hub_manifest(root, files)
    return {"kind": kind, "files": files}


# --------------------------------------------------------------------------- serve


def safe_relpath(url_path: str) -> str | None:
    """The relative path a request names, or None when it tries to leave the served root."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path)
    if not path.startswith("/") or "\x00" in path or "\\" in path:
        return None
    parts = [p for p in path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return None
    return "/".join(parts)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(first, last) for one satisfiable byte range; None for no/ignored Range; "416" when unsatisfiable."""
    if not header:
        return None
    header = header.strip()
    if not header.startswith("bytes=") or "," in header:
        return None  # multi-range or another unit: send the whole file (RFC 9110 allows it)
    spec = header[len("bytes="):].strip()
    first_s, sep, last_s = spec.partition("-")
    if not sep:
        return None
    try:
        if first_s == "":
            n = int(last_s)
            if n <= 0:
                return "416"
            return max(0, size - n), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else size - 1
    except ValueError:
        return None
    if first < 0:
        return None
    if first >= size:
        return "416"
    if first > last:
        return None
    return first, min(last, size - 1)


class WeightsServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Serves the files under one root on one address; remembers activity for the idle TTL.

    ``files`` (a manifest's entries) limits what is served. With ``relay`` a
    listed file that is still arriving on this node is served too, but only
    from chunks its pull has verified (the pull's sidecar says which); a
    request for a chunk not there yet is held until it is, for up to
    ``relay_wait_s`` (then 503). That is what lets the node across the ring pull
    from a neighbour while the neighbour is still pulling from the source.
    """

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: the 6th and later of a pull's N
    # simultaneous connects had their SYN dropped and retried by the kernel one
    # second later (the initial RTO, RFC 6298), which cost a pull of 8 connections
    # about 3/8 s. nginx listens with 511 on Linux (ngx_http_core_module "listen
    # ... backlog"); the kernel caps it at net.core.somaxconn.
    request_queue_size = 512

    def __init__(self, root: str, bind: str, port: int, allow: set[str] | None = None,
                 emit: Emitter | None = None, *, files: dict[str, Any] | None = None, single: bool | None = None,
                 relay: bool = False, relay_wait_s: float = RELAY_WAIT_S) -> None:
        check_bind(bind)
        self.root = os.path.abspath(root)
        if single is None:
            single = os.path.isfile(self.root)
        self.single = os.path.basename(self.root) if single else None
        self.files = files
        self.allow = allow if allow is not None else (set(files) if files is not None else None)
        self.relay = relay and files is not None
        self.relay_wait_s = relay_wait_s
        self.emit = emit
        self.requests: list[tuple[str, str | None, int]] = []  # (path, Range, status), for tests
        self.active = 0
        self.last_activity = time.monotonic()
        self.activity_lock = threading.Lock()
        self._sidecars: dict[str, tuple[tuple[int, int], set[int]]] = {}  # path -> ((mtime_ns, size), done)
        super().__init__((bind, port), _Handler)

    def resolve(self, url_path: str) -> tuple[str, str] | None:
        """(relative path, full path) of what a request names; the file may still be arriving (relay)."""
        rel = safe_relpath(url_path)
        if rel is None:
            return None
        if self.allow is not None and rel not in self.allow:
            return None
        if self.single is not None:
            full = self.root if rel == self.single else None
        else:
            full = os.path.join(self.root, *rel.split("/"))
            if os.path.commonpath([self.root, os.path.normpath(full)]) != self.root:
                return None
        if full is None:
            return None
        if os.path.isfile(full) or (self.relay and rel in (self.files or {})):
            return rel, full
        return None

    def verified_chunks(self, full: str, entry: dict[str, Any]) -> set[int]:
        """Chunks of ``full`` that its pull on this node has verified against the same manifest."""
        side = full + SIDECAR_SUFFIX
        try:
            st = os.stat(side)
        except OSError:
            return set()
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._sidecars.get(side)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            with open(side) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return set()  # replaced while read: the next look sees the new one
        chunk_bytes = int(entry.get("chunk_bytes") or 0)
        same = (data.get("verified") is True and data.get("size") == int(entry["size"])
                and data.get("chunk_bytes") == chunk_bytes and data.get("key") == f"{entry['sha256']}/{chunk_bytes}")
        done = {int(i) for i in data.get("done", [])} if same else set()
        self._sidecars[side] = (stamp, done)
        return done

    def open_ready(self, rel: str, full: str, range_header: str | None):  # type: ignore[no-untyped-def]
        """(file, size, range) once the bytes asked for can be served; None when a relay gave up waiting."""
        deadline = time.monotonic() + self.relay_wait_s
        while True:
            try:
                f = open(full, "rb")  # noqa: SIM115 - handed to the caller, who closes it
            except FileNotFoundError:
                if not self.relay:
                    raise
            else:
                size = os.fstat(f.fileno()).st_size
                return f, size, parse_range(range_header, size)
            entry = (self.files or {})[rel]
            size = int(entry["size"])
            rng = parse_range(range_header, size)
            if isinstance(rng, str):  # "416"
                return None, size, rng
            first, last = (0, size - 1) if rng is None else rng
            chunk_bytes = int(entry.get("chunk_bytes") or 0)
            if chunk_bytes > 0 and size > 0:
                need = set(range(first // chunk_bytes, last // chunk_bytes + 1))
                if need <= self.verified_chunks(full, entry):
                    try:
                        return open(full + PART_SUFFIX, "rb"), size, rng
                    except FileNotFoundError:
                        continue  # renamed to ``full`` meanwhile
            if time.monotonic() >= deadline:
                return None
            time.sleep(RELAY_POLL_S)

    def touch(self, delta: int) -> None:
        with self.activity_lock:
            self.active += delta
            self.last_activity = time.monotonic()

    def idle_s(self) -> float:
        with self.activity_lock:
            return 0.0 if self.active else time.monotonic() - self.last_activity


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many chunks
    server: WeightsServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _refuse(self, status: int, why: str) -> None:
        body = (why + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, body: bool) -> None:
        self.server.touch(+1)
        status = 500
        try:
            found = self.server.resolve(self.path)
            if found is None:
                status = 404
                self._refuse(404, "not found")
                return
            ready = self.server.open_ready(found[0], found[1], self.headers.get("Range"))
            if ready is None:
                status = 503
                self._refuse(503, "not received here yet")
                return
            f, size, rng = ready
            if rng == "416":
                if f is not None:
                    f.close()
                status = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with f:
                if rng is None:
                    first, last, status = 0, size - 1, 200
                else:
                    assert not isinstance(rng, str)  # "416" was answered above
                    first, last = rng
                    status = 206
                count = last - first + 1
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(count))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
                self.end_headers()
                if body and count > 0:
                    self.connection.sendfile(f, first, count)  # zero-copy from the page cache
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.server.requests.append((self.path, self.headers.get("Range"), status))
            self.server.touch(-1)


def check_bind(bind: str) -> None:
    try:
        addr = ipaddress.ip_address(bind)
    except ValueError:
        raise AgentError(f"--bind needs one IP address (the fabric address), got {bind!r}") from None
    if addr.is_unspecified:
        raise AgentError(f"--bind {bind} would listen on every interface; give the node's fabric address")


def serve(server: WeightsServer, ttl_s: float, emit: Emitter, stop: threading.Event | None = None) -> None:
    """Run until ``ttl_s`` seconds pass without a request, or ``stop`` is set."""
    stop = stop or threading.Event()

    def watchdog() -> None:
        while not stop.wait(0.2):
            if server.idle_s() >= ttl_s:
                break
        server.shutdown()

    threading.Thread(target=watchdog, name="ttl", daemon=True).start()
    emit("listening", address=server.server_address[0], port=server.server_address[1], pid=os.getpid())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stop.set()
        server.server_close()


# --------------------------------------------------------------------------- pull


def each_file(starts: Iterable[Callable[[StopScope, threading.Event], None]], stop: threading.Event | StopScope,
              connections: int) -> None:
    """Run one file's download per thread, the next starting once the previous has all its chunks on a connection.

    With a shared :class:`Slots` budget this keeps ``connections`` ranged
    requests in flight across file boundaries; a file's hash tail, fsync and
    rename overlap the next file's transfer. ``starts`` is consumed lazily in
    this thread (what it checks before a file, it checks when that file is
    due). A file that raises stops the others (their partial files stay for a
    resume) and its exception is raised here, the first one first; a per-file
    failure that must not stop the others is the file function's to catch.
    """
    job = StopScope(stop)
    fatal: list[BaseException] = []
    running: list[threading.Thread] = []

    def run(fn: Callable[[StopScope, threading.Event], None], drained: threading.Event) -> None:
        try:
            fn(StopScope(job), drained)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            fatal.append(exc)
            job.set()
        finally:
            drained.set()

    try:
        for fn in starts:
            if job.is_set():
                break
            drained = threading.Event()
            t = threading.Thread(target=run, args=(fn, drained), name="file", daemon=True)
            t.start()
            running.append(t)
            while not drained.wait(0.05) and not job.is_set():
                pass
            # a bound on threads: small files drain at once, and each holds a thread until it is renamed
            while len(running) > max(1, connections) and not job.is_set():
                running[0].join(0.05)
                running = [r for r in running if r.is_alive()]
            running = [r for r in running if r.is_alive()]
    except BaseException:
        job.set()
        raise
    finally:
        for t in running:
            t.join()
    if fatal:
        raise fatal[0]  # the cause: the others were stopped by it
    if stop.is_set():
        raise Interrupted("stopped")


def pull(
    base_url: str, manifest: dict[str, Any], dest: str, *, emit: Emitter, connections: int = 8,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, cache: HashCache | None = None, stop: threading.Event | None = None,
    interval_s: float = 1.0, max_bytes: int | None = None,
) -> dict[str, Any]:
    """Fetch every file of ``manifest`` from ``base_url`` into ``dest``, skipping complete ones."""
    files = manifest.get("files", manifest)
    base = base_url.rstrip("/") + "/"
    totals = Meter(emit, interval_s)
    totals.total = sum(int(v["size"]) for v in files.values())
    start = time.monotonic()
    counts = {"fetched": 0, "skipped": 0}
    lock = threading.Lock()

    def one(rel: str, scope: StopScope, drained: threading.Event) -> None:
        entry = files[rel]
        result = fetch_file(
            base + urllib.parse.quote(rel), os.path.join(dest, *rel.split("/")), emit=emit, connections=connections,
            chunk_bytes=int(entry.get("chunk_bytes") or chunk_bytes), sha256=entry["sha256"], size=int(entry["size"]),
            cache=cache, stop=scope, interval_s=interval_s, label=rel, totals=totals, max_bytes=max_bytes,
            chunks=entry.get("chunks"), slots=slots, drained=drained,
        )
        with lock:
            counts["skipped" if result["skipped"] else "fetched"] += 1
            if result["skipped"]:
                totals.base_bytes += int(entry["size"])
        emit("file", **result)

    def starts() -> Iterator[Callable[[StopScope, threading.Event], None]]:
        # biggest first: the shards dominate, small files fill in at the end
        for rel in sorted(files, key=lambda r: (-int(files[r]["size"]), r)):
            if safe_relpath("/" + rel) != rel:
                raise AgentError(f"manifest path {rel!r} leaves the destination")
            if max_bytes is not None and totals.session_bytes >= max_bytes:
                raise Interrupted(f"stopped after {totals.session_bytes} bytes (--max-bytes)")
            yield functools.partial(one, rel)

    slots = Slots(connections)
    each_file(starts(), stop or threading.Event(), connections)
    fetched, skipped = counts["fetched"], counts["skipped"]
    seconds = time.monotonic() - start
    return {
        "files": len(files), "fetched": fetched, "skipped": skipped, "bytes": totals.session_bytes,
        "bytes_total": totals.total, "seconds": round(seconds, 3),
        "rate_Bps": round(totals.session_bytes / seconds) if seconds > 0 else 0, "verified": True,
    }


# --------------------------------------------------------------------------- hub


HUB_MANIFEST = ".sparkctl/hub-manifest.json"  # sparkctl.ops.hub.MANIFEST_REL: beside the files, synced with them
API_MAX_BYTES = 64 * MIB  # a revision listing of a huge repository is a few MB
INFO_WAIT_MAX_S = 30.0  # hub-info's waits in all (sparkctl.ops.hubfetch gives the command 60 s)


class HubFailed(AgentError):
    """Some files failed verification or transfer (deleted and named); the others are complete."""

    def __init__(self, message: str, failed: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.failed = failed


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def free_bytes(path: str) -> int | None:
    """Bytes free to an unprivileged writer on the filesystem that will hold ``path``."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != "/":
        p = os.path.dirname(p)
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def git_blob_sha1_file(path: str) -> tuple[str, str]:
    """(git blob id, sha256) of a file in one read: the blob id is sha1 of ``blob <size>\\0`` and the bytes."""
    size = os.path.getsize(path)
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(HASH_BLOCK)
            if not block:
                break
            sha1.update(block)
            sha256.update(block)
    return sha1.hexdigest(), sha256.hexdigest()


def hub_info(url: str, token: str | None, dest: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The Hub's answer to the revision API (status, error code, JSON), the free space and what is at ``dest``."""
    client = Client(timeout_s)
    # sparkctl waits INFO_TIMEOUT_S (60 s) for this one command: the waits stay well inside it
    patience = Patience("the Hub's revision listing", threading.Event(), max_total_s=INFO_WAIT_MAX_S)
    try:
        while True:
            resp = _request(client, url, {**_auth(token), "Accept": "application/json"}, patience)
            try:
                body = _read_all(resp, API_MAX_BYTES)
                break
            except (OSError, http.client.HTTPException) as exc:
                client.close()
                patience.wait(f"network: the answer stopped: {exc.__class__.__name__}: {exc}")
    finally:
        client.close()
    doc = None
    if resp.status == 200:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
    present: dict[str, int] = {}
    if os.path.isdir(dest):
        _, paths, _ = _list_files(dest)
        present = {rel: os.path.getsize(full) for rel, full in paths.items()}
    return {"status": resp.status, "error_code": resp.getheader("X-Error-Code"),
            "error_message": resp.getheader("X-Error-Message"), "doc": doc, "free_bytes": free_bytes(dest),
            "present": present}


def _old_hub_manifest(dest: str) -> dict[str, Any]:
    try:
        with open(os.path.join(dest, *HUB_MANIFEST.split("/"))) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _complete(target: str, entry: dict[str, Any], old: dict[str, Any], cache: HashCache) -> tuple[bool, str | None, str]:
    """(complete, sha256, why not) of a file already at ``target``: by the hash cache when it can."""
    size = int(entry["size"])
    if os.path.getsize(target) != size:
        return False, None, f"{os.path.getsize(target)} bytes, the Hub says {size}"
    if entry.get("sha256"):
        have = sha256_file(target, cache=cache)  # a fresh cache entry: no byte is read
        return have == entry["sha256"], have, f"sha256 {have[:12]}, the Hub says {entry['sha256'][:12]}"
    prev = (old.get("files") or {}).get(entry["path"]) or {}
    if prev.get("sha256") and prev.get("blob_id") == entry.get("blob_id") and cache.get(target) == prev["sha256"]:
        return True, prev["sha256"], ""
    if entry.get("blob_id"):
        blob, sha = git_blob_sha1_file(target)
        if blob == entry["blob_id"]:
            cache.put(target, sha)
        return blob == entry["blob_id"], sha, f"git blob {blob[:12]}, the Hub says {entry['blob_id'][:12]}"
    return True, sha256_file(target, cache=cache), ""


def hub_fetch(
    spec: dict[str, Any], dest: str, *, emit: Emitter, token: str | None, connections: int = 8,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, cache: HashCache, stop: threading.Event | None = None,
    interval_s: float = 1.0, max_bytes: int | None = None,
) -> dict[str, Any]:
    """Every file of ``spec["files"]`` into ``dest`` at its repository path, verified; then the manifest.

    LFS files are verified by SHA-256, the others by size and git blob id. A
    file already complete is skipped (by the hash cache, without reading it);
    one that differs is named (``corrupt``), deleted and fetched again. A file
    that fails is deleted and named and the others go on; the manifest is
    written only when every file is complete. 401/403/404 end the job at once
    (they would refuse every file).
    """
    stop = stop or threading.Event()
    files = list(spec["files"])
    manifest = json.loads(json.dumps(spec["manifest"]))
    old = _old_hub_manifest(dest)
    headers = _auth(token)
    totals = Meter(emit, interval_s)
    totals.total = sum(int(e["size"]) for e in files)
    start = time.monotonic()
    failed: list[dict[str, Any]] = []
    counts = {"fetched": 0, "skipped": 0}
    lock = threading.Lock()
    slots = Slots(connections)

    def one(entry: dict[str, Any], target: str, scope: StopScope, drained: threading.Event) -> None:
        rel = entry["path"]
        try:
            result = fetch_file(
                entry["url"], target, emit=emit, connections=connections, chunk_bytes=chunk_bytes,
                sha256=entry.get("sha256"), size=int(entry["size"]), cache=cache, stop=scope, interval_s=interval_s,
                label=rel, totals=totals, max_bytes=max_bytes, headers=headers, drop_cache=True, slots=slots,
                drained=drained,
            )
            if not entry.get("sha256") and entry.get("blob_id"):
                blob, _ = git_blob_sha1_file(target)
                if blob != entry["blob_id"]:
                    _discard(target)
                    raise AgentError(f"{rel}: git blob id {blob[:12]}, the Hub says {entry['blob_id'][:12]} "
                                     "(file deleted)")
        except Interrupted:
            raise
        except HttpRefused as exc:
            if exc.status in (401, 403, 404):
                raise  # every other file would be refused alike: the job ends
            with lock:
                failed.append({"file": rel, "message": str(exc)})
            emit("failed", file=rel, message=str(exc))
            return
        except (AgentError, OSError, http.client.HTTPException, ValueError) as exc:
            # any failure of one file is a result naming it; the other files go on
            message = str(exc) if isinstance(exc, AgentError) else f"{rel}: {exc.__class__.__name__}: {exc}"
            _discard(target)
            with lock:
                failed.append({"file": rel, "message": message})
            emit("failed", file=rel, message=message)
            return
        with lock:
            counts["fetched"] += 1
            manifest["files"][rel]["sha256"] = result["sha256"]
        emit("file", **result)

    def starts() -> Iterator[Callable[[StopScope, threading.Event], None]]:
        for entry in sorted(files, key=lambda e: (-int(e["size"]), e["path"])):
            rel = entry["path"]
            if safe_relpath("/" + rel) != rel:
                raise AgentError(f"repository path {rel!r} leaves the destination")
            target = os.path.join(dest, *rel.split("/"))
            if os.path.isfile(target):
                ok, sha, why = _complete(target, entry, old, cache)
                if ok:
                    with lock:
                        counts["skipped"] += 1
                        totals.base_bytes += int(entry["size"])
                        manifest["files"][rel]["sha256"] = sha
                    emit("file", file=rel, skipped=True, bytes=0, size=int(entry["size"]), sha256=sha)
                    continue
                emit("corrupt", file=rel, message=f"{rel}: {why}: deleted, fetched again")
                _discard(target)
            if max_bytes is not None and totals.session_bytes >= max_bytes:
                raise Interrupted(f"stopped after {totals.session_bytes} bytes (--max-bytes)")
            yield functools.partial(one, entry, target)

    each_file(starts(), stop, connections)
    fetched, skipped = counts["fetched"], counts["skipped"]
    if failed:
        why = "; ".join(f["message"] for f in failed[:3]) + (f"; and {len(failed) - 3} more" if len(failed) > 3 else "")
        raise HubFailed(f"{len(failed)} of {len(files)} files failed: {why}", failed)
    mpath = os.path.join(dest, *HUB_MANIFEST.split("/"))
    os.makedirs(os.path.dirname(mpath), exist_ok=True)
    tmp = f"{mpath}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, mpath)
    sha256_file(mpath, cache=cache)  # vouched for by this node's cache, as every file is
    seconds = time.monotonic() - start
    return {"files": len(files), "fetched": fetched, "skipped": skipped, "bytes": totals.session_bytes,
            "bytes_total": totals.total, "seconds": round(seconds, 3), "commit": manifest.get("commit"),
            "rate_Bps": round(totals.session_bytes / seconds) if seconds > 0 else 0, "manifest": mpath}


def check_hub_manifest(root: str, files: dict[str, Any]) -> None:
    """A tree fetched from the Hub must still be what its manifest says before it is sent anywhere."""
    hub = _old_hub_manifest(root)
    if not hub:
        return
    bad = []
    for rel, want in (hub.get("files") or {}).items():
        have = files.get(rel)
        if have is None:
            bad.append(f"{rel} (missing)")
        elif int(have["size"]) != int(want.get("size", -1)) or (want.get("sha256") and have["sha256"] != want["sha256"]):
            bad.append(rel)
    if bad:
        raise AgentError(f"{root}: {len(bad)} files differ from the Hub manifest (commit {hub.get('commit')}): "
                         + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
                         + "; `sparkctl weights fetch` fetches them again")


# --------------------------------------------------------------------------- detached jobs


def _read_events(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # complete lines only
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            events.append({"event": "log", "text": line.decode("utf-8", "replace")})
    return events, offset + end


def _is_agent(pid: int) -> bool:
    """Whether ``pid`` runs this agent (and is not a zombie): guards against pid reuse."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"weights_agent" in cmdline and state not in ("Z", "X")


def detach(log_path: str, wait_for: tuple[str, ...], timeout_s: float = 20.0, linger_s: float = 0.0) -> bool:
    """Fork a detached job writing to ``log_path``. Returns True in the job, False in the caller.

    The caller prints the job's first ``wait_for`` event (or an error) and exits.
    With ``linger_s`` it then waits up to that long for the job's end, printing
    the events that follow and a last ``tail`` event (offset, alive) as
    ``tail`` does: a start and a first long poll in one command, so a job that
    ends at once (a manifest from the hash cache) costs one round trip, not three.
    """
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    open(log_path, "wb").close()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = sys.stdout
        Emitter()("started", pid=os.getpid(), log=log_path)
        return True
    os.waitpid(pid, 0)
    deadline = time.monotonic() + timeout_s
    offset = 0
    started = None
    while time.monotonic() < deadline:
        events, offset = _read_events(log_path, offset)
        for i, ev in enumerate(events):
            if ev.get("event") == "started":
                started = ev
            if ev.get("event") in wait_for or ev.get("event") == "error":
                job_pid = (started or {}).get("pid")
                print(json.dumps({**ev, "pid": job_pid, "log": log_path}), flush=True)
                if ev.get("event") == "error":
                    os._exit(EXIT_ERROR)
                if linger_s > 0:
                    rest = events[i + 1:]  # read with it: printed before any later event
                    for later in rest:
                        print(json.dumps(later, separators=(",", ":")))
                    ended = any(e.get("event") in ("done", "error") for e in rest)
                    _linger(log_path, offset, int(job_pid or 0), min(linger_s, 10.0), ended)
                os._exit(0)
        time.sleep(0.01)
    print(json.dumps({"event": "error", "message": f"the detached job did not report within {timeout_s:g} s",
                      "log": log_path}), flush=True)
    os._exit(EXIT_ERROR)


# --------------------------------------------------------------------------- command line


def _linger(log_path: str, offset: int, pid: int, wait_s: float, ended: bool) -> None:
    """The events after ``offset`` until the job ends or ``wait_s`` passes, then a ``tail`` event."""
    deadline = time.monotonic() + wait_s
    alive: bool | None = None
    while not ended:
        alive = _is_agent(pid) if pid else None  # liveness first: a job found dead wrote its last line
        events, offset = _read_events(log_path, offset)
        for ev in events:
            print(json.dumps(ev, separators=(",", ":")))
            ended = ended or ev.get("event") in ("done", "error")
        if ended or alive is False or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    print(json.dumps({"event": "tail", "offset": offset, "alive": None if ended else alive}), flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="weights_agent.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser, detachable: bool = True) -> None:
        sp.add_argument("--interval-s", type=float, default=1.0, help="seconds between progress events")
        if detachable:
            sp.add_argument("--log", help="run detached, writing events to this file")
            sp.add_argument("--linger-s", type=float, default=0.0,
                            help="detached: wait up to this long (at most 10 s) for the job's end, printing its events")
            sp.add_argument("--hash-cache", help="path -> (size, mtime, sha256) cache file")

    f = sub.add_parser("fetch", help="download one URL (ranged, parallel, resumable)")
    f.add_argument("--url", required=True)
    f.add_argument("--dest", required=True)
    f.add_argument("--connections", type=int, default=8)
    f.add_argument("--chunk-mb", type=float, default=32.0)
    f.add_argument("--sha256")
    f.add_argument("--max-bytes", type=int, help=argparse.SUPPRESS)  # test knob: stop as if killed
    common(f)

    m = sub.add_parser("manifest", help="size and sha256 of every file under a directory (or of one file)")
    m.add_argument("--dir", required=True)
    m.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_BYTES / MIB,
                   help="the unit of the per-chunk hashes (what a pull verifies at once)")
    common(m)

    s = sub.add_parser("serve", help="serve a directory with Range support on one address")
    s.add_argument("--dir", required=True)
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--ttl-s", type=float, default=600.0)
    s.add_argument("--manifest-json", help="serve only the files this manifest lists")
    s.add_argument("--relay", action="store_true",
                   help="also serve listed files still arriving here, from their verified chunks (needs the manifest)")
    s.add_argument("--relay-wait-s", type=float, default=RELAY_WAIT_S,
                   help="how long to hold a request for a chunk not verified here yet")
    common(s)

    u = sub.add_parser("pull", help="fetch every file of a manifest from a peer")
    u.add_argument("--from-url", required=True)
    u.add_argument("--manifest-json", required=True, help="a file, or - for stdin")
    u.add_argument("--dest", required=True)
    u.add_argument("--connections", type=int, default=8)
    u.add_argument("--chunk-mb", type=float, default=32.0)
    u.add_argument("--max-bytes", type=int, help=argparse.SUPPRESS)
    common(u)

    t = sub.add_parser("tail", help="events of a detached job from a byte offset")
    t.add_argument("--log", required=True)
    t.add_argument("--offset", type=int, default=0)
    t.add_argument("--pid", type=int)
    t.add_argument("--wait-s", type=float, default=0.0,
                   help="wait up to this long (at most 10 s) for a new event or the job's end")

    hi = sub.add_parser("hub-info", help="a Hub revision listing, the free space and what is at DEST (stdin: url, token)")
    hi.add_argument("--dest", required=True)

    hf = sub.add_parser("hub-fetch", help="download a Hub revision's files into DEST, verified (stdin: token, files)")
    hf.add_argument("--dest", required=True)
    hf.add_argument("--connections", type=int, default=8)
    hf.add_argument("--chunk-mb", type=float, default=32.0)
    hf.add_argument("--max-bytes", type=int, help=argparse.SUPPRESS)
    common(hf)

    c = sub.add_parser("summary", help="what the hash cache vouches for under a directory (hashes nothing)")
    c.add_argument("--dir", required=True)
    c.add_argument("--hash-cache", required=True)

    k = sub.add_parser("stop", help="end detached jobs of this agent")
    k.add_argument("--pid", type=int, required=True, action="append", help="repeat for several jobs")
    return p


def _load_manifest(arg: str) -> dict[str, Any]:
    text = sys.stdin.read() if arg == "-" else open(arg).read()
    data = json.loads(text)
    manifest: dict[str, Any] = data.get("manifest", data) if isinstance(data, dict) else data
    return manifest


def main(argv: list[str] | None = None) -> int:
    """The command line; every failure is an ``error`` event, never a traceback.

    A failure the code did not foresee is still reported as one event naming
    what raised (the operator reads it in sparkctl's message), and a thread's
    uncaught exception becomes a ``warning`` event instead of a printout.
    """
    def thread_failed(args: threading.ExceptHookArgs) -> None:
        Emitter()("warning", message=f"thread {args.thread.name if args.thread else '?'}: "
                                      f"{getattr(args.exc_type, '__name__', args.exc_type)}: {args.exc_value}")

    threading.excepthook = thread_failed
    try:
        return _main(argv)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the last line of defence: a result, not a traceback
        Emitter()("error", message=f"weights agent: unexpected {exc.__class__.__name__}: {exc}")
        return EXIT_ERROR


def _main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    emit = Emitter()
    if args.cmd == "tail":
        # A long poll: the watcher learns of a new event (a job's end above all)
        # when it happens, not at its next poll.
        deadline = time.monotonic() + min(max(args.wait_s, 0.0), 10.0)
        while True:
            # liveness first: a job found dead has already written its last line
            alive = _is_agent(args.pid) if args.pid else None
            events, offset = _read_events(args.log, args.offset)
            if events or alive is False or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        for ev in events:
            print(json.dumps(ev, separators=(",", ":")))
        emit("tail", offset=offset, alive=alive)
        return 0
    if args.cmd == "summary":
        try:
            emit("summary", **cached_summary(args.dir, HashCache(args.hash_cache)))
        except (AgentError, OSError) as exc:
            emit("error", message=str(exc))
            return EXIT_ERROR
        return 0
    if args.cmd == "stop":
        running = [pid for pid in args.pid if _is_agent(pid)]
        for pid in running:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while any(_is_agent(pid) for pid in running) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in running:
            if _is_agent(pid):
                os.kill(pid, signal.SIGKILL)
        emit("done", stopped=bool(running), pids=running)
        return 0

    if args.cmd == "hub-info":
        try:
            req = json.loads(sys.stdin.read())
            emit("hub-info", **hub_info(req["url"], req.get("token"), args.dest))
        except (AgentError, OSError, ValueError, KeyError) as exc:
            emit("error", message=str(exc))
            return EXIT_ERROR
        return 0

    # Read stdin and check arguments before detaching, so mistakes reach the caller.
    # The Hub token comes on stdin too: never on a command line (ps), never in a file.
    hub_spec = json.loads(sys.stdin.read()) if args.cmd == "hub-fetch" else None
    manifest = _load_manifest(args.manifest_json) if getattr(args, "manifest_json", None) else None
    if args.cmd == "serve":
        try:
            check_bind(args.bind)
        except AgentError as exc:
            emit("error", message=str(exc))
            return EXIT_ERROR
    if args.log and not detach(args.log, ("listening",) if args.cmd == "serve" else ("started",),
                               linger_s=args.linger_s):
        return 0  # not reached: detach() exits in the caller
    emit = Emitter()  # stdout may now be the log file
    stop = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        if args.cmd == "serve":
            # A server has nothing to save: it ends at once rather than at its loop's next poll,
            # so `stop` (which waits for the exit) returns in milliseconds. os.write, not the
            # Emitter: its lock may be held by the thread this handler interrupted.
            line = {"event": "done", "t": round(time.time(), 3), "stopped": True}
            os.write(1, (json.dumps(line, separators=(",", ":")) + "\n").encode())
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    cache = HashCache(getattr(args, "hash_cache", None))
    try:
        if args.cmd == "fetch":
            result = fetch_file(
                args.url, args.dest, emit=emit, connections=args.connections,
                chunk_bytes=max(1, int(args.chunk_mb * MIB)), sha256=args.sha256, cache=cache,
                max_bytes=args.max_bytes, stop=stop, interval_s=args.interval_s,
            )
            emit("done", **result)
        elif args.cmd == "manifest":
            result = build_manifest(args.dir, emit=emit, cache=cache, interval_s=args.interval_s,
                                    chunk_bytes=max(1, int(args.chunk_mb * MIB)))
            emit("done", manifest=result)
        elif args.cmd == "serve":
            files = manifest.get("files", manifest) if manifest is not None else None
            single = manifest.get("kind") == "file" if manifest is not None and "kind" in manifest else None
            server = WeightsServer(args.dir, args.bind, args.port, emit=emit, files=files, single=single,
                                   relay=args.relay, relay_wait_s=args.relay_wait_s)
            serve(server, args.ttl_s, emit, stop)
            emit("done", requests=len(server.requests))
        elif args.cmd == "hub-fetch":
            assert hub_spec is not None
            result = hub_fetch(
                hub_spec, args.dest, emit=emit, token=hub_spec.pop("token", None), connections=args.connections,
                chunk_bytes=max(1, int(args.chunk_mb * MIB)), cache=cache, stop=stop, interval_s=args.interval_s,
                max_bytes=args.max_bytes,
            )
            emit("done", **result)
        elif args.cmd == "pull":
            assert manifest is not None
            result = pull(
                args.from_url, manifest, args.dest, emit=emit, connections=args.connections,
                chunk_bytes=max(1, int(args.chunk_mb * MIB)), cache=cache, stop=stop,
                interval_s=args.interval_s, max_bytes=args.max_bytes,
            )
            emit("done", **result)
    except Interrupted as exc:
        emit("error", message=str(exc), interrupted=True, resumable=True)
        return EXIT_INTERRUPTED
    except HttpRefused as exc:
        emit("error", message=str(exc), status=exc.status, error_code=exc.code, server_message=exc.server_message)
        return EXIT_ERROR
    except HubFailed as exc:
        emit("error", message=str(exc), failed=exc.failed, resumable=True)
        return EXIT_ERROR
    except (AgentError, OSError) as exc:
        emit("error", message=str(exc))
        return EXIT_ERROR
    finally:
        cache.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
