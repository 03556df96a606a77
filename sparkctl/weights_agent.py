#!/usr/bin/env python3
"""sparkctl's weights agent: download, hash, serve and pull model weights on one node.

sparkctl pushes this file to ``<prefix>/opt/sparkctl/weights_agent.py`` and runs
it there with ``python3``. It is deliberately self-contained: standard library
only, no sparkctl import, Python 3.8 or newer, so any DGX OS image runs it.

Subcommands (every one prints JSON lines on stdout; the last is ``done`` or
``error``, and the exit code is 0 only after ``done``)::

    fetch    --url URL --dest PATH [--connections N] [--chunk-mb M] [--sha256 HEX]
    manifest --dir DIR                      (a directory or a single file)
    serve    --dir DIR --bind ADDR --port P --ttl-s T [--manifest-json FILE]
    pull     --from-url BASE --manifest-json FILE|- --dest DIR [--connections N]
    tail     --log FILE --offset N [--pid P]  (read a detached job's events)
    stop     --pid P                          (end a detached job of this agent)

``fetch``, ``manifest``, ``serve`` and ``pull`` take ``--log FILE`` to run
detached: the job double-forks, writes its events to FILE, and the command
returns at once with ``{"event": "started", "pid": ...}`` (``serve`` waits for
``listening`` and returns that event, which carries the port). A job that
outlives one SSH channel is what lets a multi-hour download survive a dropped
connection; ``tail`` is how sparkctl watches it.

How a download works (the "download laws" of the field report, after
scripts/pget.py): the file is cut into chunks fetched with HTTP ``Range``
requests by N threads, each on its own keep-alive connection, written at their
offsets into ``PATH.part`` (a sparse file). ``PATH.part.json`` lists the chunks
that are complete, so an interrupted download resumes chunk by chunk. While
chunks land, a hasher thread follows the contiguous completed prefix and feeds
SHA-256, so verification costs little beyond the transfer. The size (and the
SHA-256 when known) is checked before the atomic rename to PATH; a mismatch
deletes the partial file and nothing appears at PATH. A server that ignores
``Range`` (200 instead of 206) gets one plain stream instead, restarted from
zero when interrupted.

``serve`` binds one address, the node's fabric address, never a wildcard; it
serves files under DIR only (``..`` is refused) and, given a manifest, only the
files it lists; it exits after ``--ttl-s`` seconds without a request.

A hash cache (``--hash-cache FILE``: path -> size, mtime_ns, sha256) spares
re-hashing unchanged files on every run; an entry is trusted only while the
file's size and mtime are unchanged, the same quick check rsync makes.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import http.server
import ipaddress
import json
import os
import queue
import signal
import socketserver
import sys
import threading
import time
import urllib.parse

MIB = 1 << 20
HASH_BLOCK = 8 * MIB  # read size for hashing (the brief's 8 MiB blocks)
RECV_BUF = 1 * MIB  # one receive buffer per connection
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
    """path -> (size, mtime_ns, sha256), trusted while size and mtime are unchanged."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.entries: dict[str, list] = {}
        self.lock = threading.Lock()
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    self.entries = dict(json.load(f))
            except (OSError, ValueError):
                self.entries = {}  # a damaged cache only costs a re-hash

    def get(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        hit = self.entries.get(os.path.abspath(path))
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return str(hit[2])
        return None

    def put(self, path: str, sha256: str) -> None:
        st = os.stat(path)
        with self.lock:
            self.entries[os.path.abspath(path)] = [st.st_size, st.st_mtime_ns, sha256]

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


# --------------------------------------------------------------------------- HTTP client


class Client:
    """Keep-alive connections (one per scheme/host/port) for one thread; follows redirects."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}

    def _conn(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        key = (scheme, host, port)
        conn = self._conns.get(key)
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=self.timeout_s)
            self._conns[key] = conn
        return conn

    def get(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        for _ in range(MAX_REDIRECTS):
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise AgentError(f"not an http(s) URL: {url}")
            port = u.port or (443 if u.scheme == "https" else 80)
            conn = self._conn(u.scheme, u.hostname, port)
            target = (u.path or "/") + (f"?{u.query}" if u.query else "")
            try:
                conn.request("GET", target, headers={"User-Agent": "sparkctl-weights-agent", **headers})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                self.close()  # a stale keep-alive connection; the caller retries on a fresh one
                raise
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                resp.read()
                if not location:
                    raise AgentError(f"redirect without Location from {url}")
                url = urllib.parse.urljoin(url, location)
                continue
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
    """PATH.part.json: which chunks of PATH.part are complete."""

    def __init__(self, path: str, size: int, chunk_bytes: int, key: str) -> None:
        self.path = path
        self.meta = {"version": 1, "size": size, "chunk_bytes": chunk_bytes, "key": key}
        self.done: set[int] = set()
        self.lock = threading.Lock()

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
        return True

    def mark(self, index: int) -> None:
        with self.lock:
            self.done.add(index)
            atomic_write_json(self.path, {**self.meta, "done": sorted(self.done)})


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


def fetch_file(
    url: str, dest: str, *, emit: Emitter, connections: int = 8, chunk_bytes: int = 32 * MIB,
    sha256: str | None = None, size: int | None = None, cache: HashCache | None = None,
    max_bytes: int | None = None, stop: threading.Event | None = None, timeout_s: float = 60.0,
    retries: int = 4, interval_s: float = 1.0, label: str | None = None, totals: Meter | None = None,
) -> dict:
    """Download ``url`` to ``dest`` (ranged, parallel, resumable); return what happened.

    ``size`` and ``sha256``, when given, are what the file must be. ``max_bytes``
    is a test knob: stop (as if killed) once this process has received that
    many bytes. Raises :class:`AgentError` on failure, :class:`Interrupted`
    when stopped; the ``.part`` and its sidecar stay for the next attempt
    except after a checksum mismatch.
    """
    label = label or os.path.basename(dest)
    sha256 = sha256.lower() if sha256 else None
    stop = stop or threading.Event()
    part, sidecar_path = dest + PART_SUFFIX, dest + SIDECAR_SUFFIX
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
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
    resp = _with_retries(lambda: probe_client.get(url, {"Range": "bytes=0-0"}), retries, stop)
    if resp.status == 206:
        _, _, total = _content_range(resp)
        resp.read()
        probe_client.close()
        if total is None:
            raise AgentError(f"{url}: the server did not say the file's size")
        ranged = True
    elif resp.status == 416:  # an empty file has no byte 0
        resp.read()
        probe_client.close()
        total, ranged = 0, True
    elif resp.status == 200:
        length = resp.getheader("Content-Length")
        total, ranged = (int(length) if length is not None else None), False
    else:
        body = resp.read(512).decode("utf-8", "replace").strip()
        probe_client.close()
        raise AgentError(f"{url}: HTTP {resp.status} {resp.reason}" + (f": {body}" if body else ""))
    if size is not None and total is not None and total != size:
        if not ranged:
            probe_client.close()
        raise AgentError(f"{url}: the server has {total} bytes, the manifest says {size}")
    meter.total = total
    if sha256 is None and total is not None and os.path.exists(dest) and os.path.getsize(dest) == total:
        if not ranged:
            probe_client.close()
        return {"file": label, "skipped": True, "bytes": 0, "size": total, "sha256": None, "seconds": 0.0}

    if ranged:
        digest = _fetch_ranged(
            url, part, sidecar_path, total, emit=emit, meter=meter, connections=connections,
            chunk_bytes=chunk_bytes, key=sha256 or url, max_bytes=max_bytes, stop=stop, timeout_s=timeout_s,
            retries=retries, totals=totals,
        )
    else:
        try:
            digest = _fetch_stream(resp, part, sidecar_path, meter=meter, max_bytes=max_bytes, stop=stop, totals=totals)
        finally:
            probe_client.close()

    got = os.path.getsize(part)
    if total is not None and got != total:
        _discard(part, sidecar_path)
        raise AgentError(f"{label}: received {got} bytes, expected {total}")
    if sha256 is not None and digest != sha256:
        _discard(part, sidecar_path)
        raise AgentError(f"{label}: sha256 mismatch: got {digest}, expected {sha256} (partial file deleted)")
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(part, dest)
    _discard(sidecar_path)
    _fsync_dir(dest)
    if cache is not None:
        cache.put(dest, digest)
    seconds = time.monotonic() - start
    meter.report()
    return {
        "file": label, "skipped": False, "bytes": meter.session_bytes, "resumed_bytes": meter.base_bytes,
        "size": got, "sha256": digest, "seconds": round(seconds, 3), "ranged": ranged,
        "rate_Bps": round(meter.session_bytes / seconds) if seconds > 0 else 0,
    }


def _with_retries(fn, retries: int, stop: threading.Event):  # type: ignore[no-untyped-def]
    delay = 0.25
    for attempt in range(retries + 1):
        try:
            return fn()
        except (OSError, http.client.HTTPException) as exc:
            if attempt == retries or stop.is_set():
                raise AgentError(f"network: {exc.__class__.__name__}: {exc}") from None
            time.sleep(delay)
            delay = min(delay * 2, 4.0)
    raise AssertionError("unreachable")


def _fetch_ranged(
    url: str, part: str, sidecar_path: str, total: int, *, emit: Emitter, meter: Meter, connections: int,
    chunk_bytes: int, key: str, max_bytes: int | None, stop: threading.Event, timeout_s: float, retries: int,
    totals: Meter | None,
) -> str:
    n_chunks = (total + chunk_bytes - 1) // chunk_bytes
    sidecar = _Sidecar(sidecar_path, total, chunk_bytes, key)
    resumed = os.path.exists(part) and os.path.getsize(part) == total and sidecar.load()
    if not resumed:
        sidecar.done = set()
        with open(part, "wb") as f:
            f.truncate(total)  # sparse: chunks land at their offsets
        atomic_write_json(sidecar_path, {**sidecar.meta, "done": []})
    meter.base_bytes = sum(min(chunk_bytes, total - i * chunk_bytes) for i in sidecar.done)
    if totals is not None:
        totals.base_bytes += meter.base_bytes
    if resumed:
        emit("resume", file=meter.fixed.get("file"), chunks_done=len(sidecar.done), chunks_total=n_chunks)
    todo: queue.Queue[int] = queue.Queue()
    for i in range(n_chunks):
        if i not in sidecar.done:
            todo.put(i)
    fd = os.open(part, os.O_RDWR)
    cond = threading.Condition()
    errors: list[BaseException] = []
    hasher = hashlib.sha256()
    hashed = [0]

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
            flushed = now_done
            if now_done >= n_chunks:
                return

    def worker() -> None:
        client = Client(timeout_s)
        buf = bytearray(RECV_BUF)
        view = memoryview(buf)
        try:
            while not stop.is_set():
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                first = index * chunk_bytes
                last = min(first + chunk_bytes, total) - 1
                _fetch_chunk(client, url, fd, first, last, view, meter, totals, max_bytes, stop, retries)
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
    hash_thread.start()
    flush_thread = threading.Thread(target=_guard(flush_behind, errors, stop, cond), name="flush", daemon=True)
    flush_thread.start()
    threads = [threading.Thread(target=worker, name=f"chunk-{k}", daemon=True) for k in range(max(1, connections))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
        hash_thread.join()
        flush_thread.join()
    finally:
        os.close(fd)
    if errors:
        interrupted = next((e for e in errors if isinstance(e, Interrupted)), None)
        raise interrupted or (errors[0] if isinstance(errors[0], AgentError) else AgentError(repr(errors[0])))
    if stop.is_set():
        raise Interrupted("stopped")
    if len(sidecar.done) != n_chunks or hashed[0] != total:
        raise AgentError(f"{part}: {n_chunks - len(sidecar.done)} chunks missing after the download")
    return hasher.hexdigest()


def _guard(fn, errors: list, stop: threading.Event, cond: threading.Condition):  # type: ignore[no-untyped-def]
    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
            with cond:
                cond.notify_all()

    return run


def _fetch_chunk(
    client: Client, url: str, fd: int, first: int, last: int, view: memoryview, meter: Meter,
    totals: Meter | None, max_bytes: int | None, stop: threading.Event, retries: int,
) -> None:
    delay = 0.25
    for attempt in range(retries + 1):
        pos = first
        try:
            resp = client.get(url, {"Range": f"bytes={first}-{last}"})
            if resp.status != 206:
                resp.read()
                raise AgentError(f"{url}: HTTP {resp.status} for bytes {first}-{last} (expected 206)")
            got_first, got_last, _ = _content_range(resp)
            if (got_first, got_last) != (first, last):
                raise AgentError(f"{url}: asked for bytes {first}-{last}, got {got_first}-{got_last}")
            while pos <= last:
                if stop.is_set():
                    raise Interrupted("stopped")
                n = resp.readinto(view[: min(len(view), last + 1 - pos)])
                if not n:
                    raise http.client.IncompleteRead(b"", last + 1 - pos)
                os.pwrite(fd, view[:n], pos)
                pos += n
                meter.add(n)
                if totals is not None:
                    totals.add(n)
                if max_bytes is not None and meter.session_bytes >= max_bytes:
                    raise Interrupted(f"stopped after {meter.session_bytes} bytes (--max-bytes)")
            return
        except (OSError, http.client.HTTPException) as exc:
            client.close()
            # bytes of a failed attempt are fetched again; do not count them twice
            with meter.lock:
                meter.session_bytes -= pos - first
            if totals is not None:
                with totals.lock:
                    totals.session_bytes -= pos - first
            if attempt == retries or stop.is_set():
                raise AgentError(f"network: bytes {first}-{last}: {exc.__class__.__name__}: {exc}") from None
            time.sleep(delay)
            delay = min(delay * 2, 4.0)


def _fetch_stream(
    resp: http.client.HTTPResponse, part: str, sidecar_path: str, *, meter: Meter, max_bytes: int | None,
    stop: threading.Event, totals: Meter | None,
) -> str:
    """The fallback for servers without Range: one stream from byte 0, hashed in order."""
    _discard(sidecar_path)  # chunk records mean nothing without ranges
    hasher = hashlib.sha256()
    buf = bytearray(RECV_BUF)
    view = memoryview(buf)
    try:
        with open(part, "wb") as f:
            while True:
                if stop.is_set():
                    raise Interrupted("stopped")
                n = resp.readinto(view)
                if not n:
                    break
                f.write(view[:n])
                hasher.update(view[:n])
                meter.add(n)
                if totals is not None:
                    totals.add(n)
                if max_bytes is not None and meter.session_bytes >= max_bytes:
                    raise Interrupted(f"stopped after {meter.session_bytes} bytes (--max-bytes)")
    except (OSError, http.client.HTTPException) as exc:
        raise AgentError(f"network: {exc.__class__.__name__}: {exc}") from None
    return hasher.hexdigest()


# --------------------------------------------------------------------------- manifest


def _skip_name(name: str) -> bool:
    return name.endswith((PART_SUFFIX, SIDECAR_SUFFIX)) or ".tmp." in name


def build_manifest(root: str, *, emit: Emitter, cache: HashCache | None = None, interval_s: float = 1.0) -> dict:
    """{"kind": "dir"|"file", "files": {relpath: {"size", "sha256"}}} for a directory or one file."""
    if os.path.isfile(root):
        paths = {os.path.basename(root): root}
        kind = "file"
    elif os.path.isdir(root):
        kind = "dir"
        paths = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if _skip_name(name) or not os.path.isfile(full):
                    continue
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                paths[rel] = full
    else:
        raise AgentError(f"{root}: no such file or directory")
    meter = Meter(emit, interval_s, phase="hash")
    meter.total = sum(os.path.getsize(p) for p in paths.values())
    files = {}
    for rel in sorted(paths):
        meter.fixed["file"] = rel
        files[rel] = {"size": os.path.getsize(paths[rel]), "sha256": sha256_file(paths[rel], meter, cache)}
    meter.report()
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
    """Serves the files under one root on one address; remembers activity for the idle TTL."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: str, bind: str, port: int, allow: set[str] | None = None,
                 emit: Emitter | None = None) -> None:
        check_bind(bind)
        self.root = os.path.abspath(root)
        self.single = os.path.basename(self.root) if os.path.isfile(self.root) else None
        self.allow = allow
        self.emit = emit
        self.requests: list[tuple[str, str | None, int]] = []  # (path, Range, status), for tests
        self.active = 0
        self.last_activity = time.monotonic()
        self.activity_lock = threading.Lock()
        super().__init__((bind, port), _Handler)

    def resolve(self, url_path: str) -> str | None:
        rel = safe_relpath(url_path)
        if rel is None:
            return None
        if self.allow is not None and rel not in self.allow:
            return None
        if self.single is not None:
            return self.root if rel == self.single else None
        full = os.path.join(self.root, *rel.split("/"))
        if os.path.commonpath([self.root, os.path.normpath(full)]) != self.root:
            return None
        return full if os.path.isfile(full) else None

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
            full = self.server.resolve(self.path)
            if full is None:
                status = 404
                self._refuse(404, "not found")
                return
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                rng = parse_range(self.headers.get("Range"), size)
                if rng == "416":
                    status = 416
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if rng is None:
                    first, last, status = 0, size - 1, 200
                else:
                    first, last = rng  # type: ignore[misc]
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


def pull(
    base_url: str, manifest: dict, dest: str, *, emit: Emitter, connections: int = 8, chunk_bytes: int = 32 * MIB,
    cache: HashCache | None = None, stop: threading.Event | None = None, interval_s: float = 1.0,
    max_bytes: int | None = None,
) -> dict:
    """Fetch every file of ``manifest`` from ``base_url`` into ``dest``, skipping complete ones."""
    files = manifest.get("files", manifest)
    base = base_url.rstrip("/") + "/"
    totals = Meter(emit, interval_s)
    totals.total = sum(int(v["size"]) for v in files.values())
    start = time.monotonic()
    skipped = fetched = 0
    # biggest first: the shards dominate, small files fill in at the end
    for rel in sorted(files, key=lambda r: (-int(files[r]["size"]), r)):
        if safe_relpath("/" + rel) != rel:
            raise AgentError(f"manifest path {rel!r} leaves the destination")
        entry = files[rel]
        target = os.path.join(dest, *rel.split("/"))
        remaining = None if max_bytes is None else max_bytes - totals.session_bytes
        if remaining is not None and remaining <= 0:
            raise Interrupted("stopped (--max-bytes)")
        result = fetch_file(
            base + urllib.parse.quote(rel), target, emit=emit, connections=connections, chunk_bytes=chunk_bytes,
            sha256=entry["sha256"], size=int(entry["size"]), cache=cache, stop=stop, interval_s=interval_s,
            label=rel, totals=totals, max_bytes=remaining,
        )
        if result["skipped"]:
            skipped += 1
            totals.base_bytes += int(entry["size"])
        else:
            fetched += 1
        emit("file", **result)
    seconds = time.monotonic() - start
    return {
        "files": len(files), "fetched": fetched, "skipped": skipped, "bytes": totals.session_bytes,
        "bytes_total": totals.total, "seconds": round(seconds, 3),
        "rate_Bps": round(totals.session_bytes / seconds) if seconds > 0 else 0, "verified": True,
    }


# --------------------------------------------------------------------------- detached jobs


def _read_events(path: str, offset: int) -> tuple[list[dict], int]:
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


def detach(log_path: str, wait_for: tuple[str, ...], timeout_s: float = 20.0) -> bool:
    """Fork a detached job writing to ``log_path``. Returns True in the job, False in the caller.

    The caller prints the job's first ``wait_for`` event (or an error) and exits.
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
        for ev in events:
            if ev.get("event") == "started":
                started = ev
            if ev.get("event") in wait_for or ev.get("event") == "error":
                print(json.dumps({**ev, "pid": (started or {}).get("pid"), "log": log_path}), flush=True)
                os._exit(0 if ev.get("event") != "error" else EXIT_ERROR)
        time.sleep(0.05)
    print(json.dumps({"event": "error", "message": f"the detached job did not report within {timeout_s:g} s",
                      "log": log_path}), flush=True)
    os._exit(EXIT_ERROR)


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="weights_agent.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser, detachable: bool = True) -> None:
        sp.add_argument("--interval-s", type=float, default=1.0, help="seconds between progress events")
        if detachable:
            sp.add_argument("--log", help="run detached, writing events to this file")
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
    common(m)

    s = sub.add_parser("serve", help="serve a directory with Range support on one address")
    s.add_argument("--dir", required=True)
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--ttl-s", type=float, default=600.0)
    s.add_argument("--manifest-json", help="serve only the files this manifest lists")
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

    k = sub.add_parser("stop", help="end a detached job of this agent")
    k.add_argument("--pid", type=int, required=True)
    return p


def _load_manifest(arg: str) -> dict:
    text = sys.stdin.read() if arg == "-" else open(arg).read()
    data = json.loads(text)
    return data.get("manifest", data) if isinstance(data, dict) else data


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    emit = Emitter()
    if args.cmd == "tail":
        # liveness first: a job found dead has already written its last line
        alive = _is_agent(args.pid) if args.pid else None
        events, offset = _read_events(args.log, args.offset)
        for ev in events:
            print(json.dumps(ev, separators=(",", ":")))
        emit("tail", offset=offset, alive=alive)
        return 0
    if args.cmd == "stop":
        if not _is_agent(args.pid):
            emit("done", stopped=False, why="not running")
            return 0
        os.kill(args.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while _is_agent(args.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _is_agent(args.pid):
            os.kill(args.pid, signal.SIGKILL)
        emit("done", stopped=True)
        return 0

    # Read stdin and check arguments before detaching, so mistakes reach the caller.
    manifest = _load_manifest(args.manifest_json) if getattr(args, "manifest_json", None) else None
    if args.cmd == "serve":
        try:
            check_bind(args.bind)
        except AgentError as exc:
            emit("error", message=str(exc))
            return EXIT_ERROR
    if args.log and not detach(args.log, ("listening",) if args.cmd == "serve" else ("started",)):
        return 0  # not reached: detach() exits in the caller
    emit = Emitter()  # stdout may now be the log file
    stop = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        stop.set()

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
            result = build_manifest(args.dir, emit=emit, cache=cache, interval_s=args.interval_s)
            emit("done", manifest=result)
        elif args.cmd == "serve":
            allow = set(manifest.get("files", manifest)) if manifest is not None else None
            server = WeightsServer(args.dir, args.bind, args.port, allow, emit)
            serve(server, args.ttl_s, emit, stop)
            emit("done", requests=len(server.requests))
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
    except (AgentError, OSError) as exc:
        emit("error", message=str(exc))
        return EXIT_ERROR
    finally:
        cache.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
