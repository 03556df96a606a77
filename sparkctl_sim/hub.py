"""A local Hugging Face Hub: the protocol the official client speaks, for tests, tools and the demo.

SIMULATION ONLY (the product never imports this). Two HTTP servers on one
address: the *hub* (``/api/models/...`` and ``/{repo}/resolve/{rev}/{path}``)
and the *storage* host that LFS downloads are redirected to (``/blobs/{sha256}``),
as huggingface.co redirects to its CDN. What each answer mirrors, from the real
client's source (huggingface_hub 2.4: hf_api.py, file_download.py, utils/_http.py):

* ``GET /api/models/{id}/revision/{rev}`` (``HfApi.model_info``; ``?blobs=true``
  adds ``size``, ``blobId`` and ``lfs {sha256, size, pointerSize}`` to each
  sibling), with ``sha`` (the commit), ``gated`` and ``private``.
* ``GET /api/models/{id}/tree/{rev}?recursive=true`` (``HfApi.list_repo_tree``,
  which ``snapshot_download`` calls after ``repo_info``): entries with ``type``,
  ``oid`` (git blob id), ``size``, ``path`` and ``lfs {oid, size, pointerSize}``.
* ``HEAD|GET /{id}/resolve/{rev}/{path}``: a regular file is answered here
  (``ETag`` = its git blob id, quoted); an LFS file is a 302 to the storage host
  with ``X-Linked-Size`` and ``X-Linked-Etag`` (its sha256), which is how
  ``get_hf_file_metadata`` learns size and etag without following an absolute
  redirect. Every answer carries ``X-Repo-Commit``.
* Errors as ``hf_raise_for_status`` reads them: 404 with ``X-Error-Code``
  ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``; a gated repository
  answers 401 (no token) or 403 (a token without access) with ``GatedRepo``; a
  private one answers 401 ``RepoNotFound`` without a token, as the Hub hides it.
  Stricter than the Hub: the revision API of a gated repository also refuses
  a caller without access (the Hub lists its files to anyone), so a client
  that forgot the token fails before the first byte rather than later.
* Storage: ``Range`` answered with 206 and ``Content-Range``, ``ETag`` and
  ``Accept-Ranges: bytes``; ``no_ranges`` answers 200 with the whole body (a
  mirror that ignores ranges); ``rate_Bps`` shapes all storage traffic to one
  link rate and ``per_conn_Bps`` each connection (a CDN's per-flow limit).

Tokens: ``Authorization: Bearer <token>`` (``build_hf_headers``). The storage
host needs none: its URLs are signed by the Hub, and a client must not send
the Hub token there.

Faults of a real network, as knobs a test sets (each cited where it is set up):

* :meth:`LocalHub.cut_body`: the next answers stop after N bytes of their body
  and the connection closes (a proxy or CDN edge that drops a long transfer;
  huggingface_hub's ``http_get`` catches the ``RemoteProtocolError`` this gives
  and resumes with ``Range`` from the bytes it has);
* :meth:`LocalHub.refuse`: the next answers are 429 or 5xx, with or without
  ``Retry-After`` (in seconds or as an HTTP-date) or the Hub's ``RateLimit``
  header (huggingface_hub ``utils/_http.py`` retries 408/429/5xx and reads both;
  the Hub's limits are counted over 5-minute windows, hub docs "rate-limits");
* ``url_ttl_s``: the storage URL the Hub redirects to is signed and expires
  that many seconds after the redirect, then answers 403 ``AccessDenied`` as
  the CloudFront/S3 edges of cdn-lfs.hf.co do (``Expires=``/``Signature=``
  query; huggingface_hub issue #4430 shows the body). Checked when a request
  starts, as a CDN checks it: a transfer already running is not cut.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import hmac
import http.server
import json
import os
import secrets
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
LFS_MIN_BYTES = 10 * 1024 * 1024  # the Hub's default: files over 10 MB go to LFS (huggingface_hub upload_large_folder)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: sha1 of ``blob <size>\\0`` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def http_date(seconds_from_now: float) -> str:
    """An HTTP-date (IMF-fixdate, RFC 9110 section 5.6.7) this many seconds from now: a Retry-After form."""
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores in place of an LFS file (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class HubFile:
    path: str
    data: bytes
    lfs: bool

    # Computed once: the Hub stores these with the file; hashing the bytes on
    # every /resolve/ and revision request cost the server about a second of CPU
    # per request at 256 MB, serialised by the interpreter lock (the clients
    # measured against it waited for the simulator, not for the shaping).
    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def blob_id(self) -> str:
        """The git blob id: of the pointer for an LFS file, of the bytes otherwise."""
        return git_blob_sha1(lfs_pointer(self.sha256, len(self.data)) if self.lfs else self.data)


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    gated: bool = False
    private: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit

    @property
    def commit(self) -> str:
        """A stable commit id for this tree (what ``main`` resolves to)."""
        h = hashlib.sha1(self.repo_id.encode())
        for p in sorted(self.files):
            h.update(f"{p}\0{self.files[p].blob_id}\n".encode())
        return h.hexdigest()

    def resolve(self, rev: str) -> str | None:
        if rev in ("main", self.commit):
            return self.commit
        return self.refs.get(rev)


def make_repo(repo_id: str, files: Mapping[str, bytes], *, gated: bool = False, private: bool = False,
              lfs: Iterable[str] | None = None) -> HubRepo:
    """A repository of ``files`` (path -> bytes); LFS by suffix and size as the Hub decides, or ``lfs``."""
    chosen = set(lfs) if lfs is not None else {
        p for p, d in files.items() if p.endswith(LFS_SUFFIXES) or len(d) > LFS_MIN_BYTES}
    return HubRepo(repo_id, {p: HubFile(p, bytes(d), p in chosen) for p, d in files.items()}, gated, private)


def repo_from_dir(repo_id: str, root: Path, **kw: object) -> HubRepo:
    files = {str(p.relative_to(root)).replace(os.sep, "/"): p.read_bytes() for p in sorted(root.rglob("*"))
             if p.is_file()}
    return make_repo(repo_id, files, **kw)  # type: ignore[arg-type]


@dataclass
class Fault:
    """What the next ``times`` matching requests get instead of a normal answer."""

    kind: str  # "cut": the body stops after ``cut_at`` bytes; "status": answered ``status``
    server: str  # "hub", "storage" or "any"
    times: int
    cut_at: int = 0
    status: int = 503
    retry_after: str | None = None  # the Retry-After header as sent (seconds or an HTTP-date)
    ratelimit_reset_s: int | None = None  # the Hub's RateLimit header: '"resolvers";r=0;t=N'
    path: str | None = None  # only requests whose path contains this

    def matches(self, kind: str, server: str, path: str, body_bytes: int | None = None) -> bool:
        """Whether this fault answers the request (a cut only a body longer than its cut)."""
        return (self.times > 0 and self.kind == kind and self.server in ("any", server)
                and (self.path is None or self.path in path)
                and (body_bytes is None or self.cut_at < body_bytes))


class _Shaper:
    """A token bucket shared by every storage connection (the link's rate)."""

    def __init__(self, rate_Bps: float | None) -> None:
        self.rate = rate_Bps
        self.lock = threading.Lock()
        self.next_t = time.monotonic()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.next_t = max(self.next_t, now) + n / self.rate
            wait = self.next_t - now - 0.05  # a 50 ms burst is allowed
        if wait > 0:
            time.sleep(wait)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # A real hub or CDN accepts many connections at once; socketserver's default
    # backlog (5) dropped the SYNs of the 6th and later simultaneous connects, which
    # the kernel retried a second later: every client with more than 5 connections
    # (sparkctl's 8 ranges, snapshot_download's 8 workers) lost a second per burst.
    # nginx listens with 511 on Linux (ngx_http_core_module "listen ... backlog").
    request_queue_size = 512
    hub: LocalHub


class LocalHub:
    """Both servers, started on ``host`` (ports chosen by the kernel unless given)."""

    def __init__(self, repos: Iterable[HubRepo], host: str = "127.0.0.1", *, tokens: Mapping[str, Iterable[str]] | None = None,
                 rate_Bps: float | None = None, per_conn_Bps: float | None = None, no_ranges: bool = False,
                 port: int = 0, storage_port: int = 0, url_ttl_s: float | None = None) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = {t: set(ids) for t, ids in (tokens or {}).items()}  # token -> repo ids it may read
        self.shaper = _Shaper(rate_Bps)
        self.per_conn_Bps = per_conn_Bps
        self.no_ranges = no_ranges
        self.requests: list[tuple[str, str, str, str | None, int]] = []  # (server, method, path, Range, status)
        self.blobs: dict[str, HubFile] = {}
        self.storage_saw_token = 0  # requests that brought the Hub token to the storage host (must stay 0)
        self.url_ttl_s = url_ttl_s  # storage URLs expire this long after the redirect (None: after an hour)
        self._key = secrets.token_bytes(16)  # signs storage URLs
        self._faults: list[Fault] = []
        self._fault_lock = threading.Lock()
        self.faults_served: list[tuple[str, str, str]] = []  # (kind, server, path) of every fault answered
        self.expired: list[str] = []  # storage paths refused because their signature had expired
        for r in self.repos.values():
            for f in r.files.values():
                if f.lfs:
                    self.blobs[f.sha256] = f
        self._hub = _Server((host, port), _HubHandler)
        self._storage = _Server((host, storage_port), _StorageHandler)
        self._hub.hub = self._storage.hub = self
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        h, p = self._hub.server_address[:2]
        return f"http://{h}:{p}"

    @property
    def storage(self) -> str:
        h, p = self._storage.server_address[:2]
        return f"http://{h}:{p}"

    def start(self) -> LocalHub:
        for s in (self._hub, self._storage):
            t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for s in (self._hub, self._storage):
            s.shutdown()
            s.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- faults

    def cut_body(self, at_byte: int, times: int = 1, server: str = "storage", path: str | None = None) -> None:
        """The next ``times`` answers with a body longer than ``at_byte`` stop after that many bytes of it.

        The headers promise the whole body (Content-Length), as a transfer cut by
        the network does; the client sees EOF before the promised length. Bytes
        count from the start of the body sent (a ranged answer's first byte is 0).
        """
        self._add(Fault("cut", server, times, cut_at=at_byte, path=path))

    def refuse(self, status: int, times: int = 1, *, retry_after: str | float | None = None,
               ratelimit_reset_s: int | None = None, server: str = "storage", path: str | None = None) -> None:
        """The next ``times`` requests are answered ``status`` (429, 503 ...), with the headers given.

        ``retry_after`` goes out as given: a number of seconds, or an HTTP-date
        (:func:`http_date` makes one) as RFC 9110 section 10.2.3 allows both.
        """
        ra = None if retry_after is None else (str(int(retry_after)) if isinstance(retry_after, (int, float))
                                               else retry_after)
        self._add(Fault("status", server, times, status=status, retry_after=ra, ratelimit_reset_s=ratelimit_reset_s,
                        path=path))

    def clear_faults(self) -> None:
        with self._fault_lock:
            self._faults.clear()

    def _add(self, fault: Fault) -> None:
        with self._fault_lock:
            self._faults.append(fault)

    def _take_fault(self, kind: str, server: str, path: str, before: int | None = None) -> Fault | None:
        """The next fault of ``kind`` for this request (a cut: of a body of ``before`` bytes), used up by one."""
        with self._fault_lock:
            for f in self._faults:
                if f.matches(kind, server, path, before):
                    f.times -= 1
                    self.faults_served.append((f.kind, server, path))
                    return f
        return None

    # ----------------------------------------------------------------- signed storage URLs

    def _signature(self, sha256: str, expires: int) -> str:
        return hmac.new(self._key, f"{sha256}:{expires}".encode(), hashlib.sha256).hexdigest()

    def signed_url(self, sha256: str, repo_id: str) -> str:
        """Where the Hub redirects an LFS file: the storage host, signed, valid for ``url_ttl_s``.

        Whole seconds, as CloudFront's ``Expires`` is: a TTL below one second
        is rounded up, so an expiry test waits at least that long.
        """
        ttl = self.url_ttl_s if self.url_ttl_s is not None else 3600.0
        expires = int(time.time() + ttl + 0.999)
        return (f"{self.storage}/blobs/{sha256}?repo={urllib.parse.quote(repo_id, safe='')}"
                f"&Expires={expires}&Signature={self._signature(sha256, expires)}")

    def check_signature(self, sha256: str, query: Mapping[str, list[str]]) -> str | None:
        """None when the URL is signed and not expired; else why it is refused."""
        try:
            expires = int(query["Expires"][0])
            sig = query["Signature"][0]
        except (KeyError, IndexError, ValueError):
            return "MissingKey"
        if not hmac.compare_digest(sig, self._signature(sha256, expires)):
            return "SignatureDoesNotMatch"
        if time.time() > expires:
            return "Expired"
        return None

    def storage_gets(self, sha256: str) -> list[str | None]:
        """The Range headers of every GET the storage host answered for one blob (for tests)."""
        return [rng for srv, m, p, rng, _ in self.requests
                if srv == "storage" and m == "GET" and urllib.parse.urlsplit(p).path.endswith(sha256)]


class _Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    role = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None,
              head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.server.hub.requests.append((self.role, self.command, self.path, self.headers.get("Range"), status))
        cut = self.server.hub._take_fault("cut", self.role, self.path, before=len(body)) \
            if status == 200 and not head else None
        if cut is not None:  # an API answer cut as a file's can be
            self.wfile.write(body[:cut.cut_at])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif body and not head:
            self.wfile.write(body)

    def _fault_status(self, head: bool) -> bool:
        """Answer the next status fault for this server, if one is set; True when it answered."""
        f = self.server.hub._take_fault("status", self.role, self.path)
        if f is None:
            return False
        h = {"Content-Type": "text/plain"}
        if f.retry_after is not None:
            h["Retry-After"] = f.retry_after
        if f.ratelimit_reset_s is not None:
            # the Hub's form (hub docs "rate-limits"; parsed by huggingface_hub utils/_http.py)
            h["RateLimit"] = f'"resolvers";r=0;t={f.ratelimit_reset_s}'
            h["RateLimit-Policy"] = '"fixed window";"resolvers";q=3000;w=300'
        reason = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
                  503: "Service Unavailable", 504: "Gateway Timeout"}.get(f.status, "Error")
        if f.status >= 500:  # an edge that fails closes the connection (and says so); keep-alive survives a 429
            h["Connection"] = "close"
            self.close_connection = True
        self._send(f.status, f"{f.status} {reason}\n".encode(), h, head)
        return True

    def _error(self, status: int, code: str | None, message: str, head: bool = False) -> None:
        h = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            h["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), h, head)

    def _send_bytes(self, data: bytes, headers: dict[str, str], head: bool, ranges: bool = True) -> None:
        """The bytes, or the one range asked for (206), shaped as the hub is told."""
        size = len(data)
        first, last, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and ranges and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[6:].partition("-")
            try:
                if a == "":
                    first, last = max(0, size - int(b)), size - 1
                else:
                    first, last = int(a), min(int(b) if b else size - 1, size - 1)
            except ValueError:
                first, last = 0, size - 1
            else:
                if first >= size and size > 0:
                    self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head)
                    return
                status = 206
        if ranges:
            headers["Accept-Ranges"] = "bytes"
        if status == 206:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        count = max(0, last - first + 1)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(count))
        self.end_headers()
        self.server.hub.requests.append((self.role, self.command, self.path, rng, status))
        if head:
            return
        hub = self.server.hub
        cut = hub._take_fault("cut", self.role, self.path, before=count)
        end = last if cut is None else first + cut.cut_at - 1
        pos, step = first, 256 * 1024
        t0 = time.monotonic()
        sent = 0
        try:
            while pos <= end:
                n = min(step, end + 1 - pos)
                if self.role == "storage":
                    hub.shaper.take(n)
                    if hub.per_conn_Bps:
                        ahead = sent / hub.per_conn_Bps - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
                self.wfile.write(data[pos:pos + n])
                pos += n
                sent += n
            if cut is not None:
                # the rest of the promised body never comes: the connection ends here
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _HubHandler(_Base):
    role = "hub"

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    def _access(self, repo: HubRepo | None, repo_id: str, head: bool) -> bool:
        """Whether the caller may read ``repo``; answers the error itself when not."""
        hub = self.server.hub
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        allowed = token is not None and repo_id in hub.tokens.get(token, set())
        if repo is None or (repo.private and not allowed):
            if repo is not None and token is None:
                self._error(401, "RepoNotFound", f"Repository Not Found for url: {self.path}. Please make sure you "
                            "specified the correct `repo_id` and `repo_type`. If you are trying to access a private "
                            "or gated repo, make sure you are authenticated.", head)
            else:
                self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.", head)
            return False
        if repo.gated and not allowed:
            if token is None:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                            "and be authenticated to access it. Please log in.", head)
            else:
                self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                            "authorized list. Visit https://huggingface.co/{repo_id} to ask for access.", head)
            return False
        return True

    def _find(self, parts: list[str]) -> tuple[HubRepo | None, str, list[str]]:
        """The repository named by the first one or two path parts (``org/name`` or ``name``)."""
        hub = self.server.hub
        for n in (2, 1):
            rid = "/".join(parts[:n])
            if rid in hub.repos:
                return hub.repos[rid], rid, parts[n:]
        return None, "/".join(parts[:2]), parts[2:]

    def _route(self, head: bool) -> None:
        if self._fault_status(head):
            return
        u = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(u.query)
        parts = [urllib.parse.unquote(p) for p in u.path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            rest = parts[2:]
            for kw in ("revision", "tree"):
                if kw in rest:
                    i = rest.index(kw)
                    rid, tail = "/".join(rest[:i]), rest[i + 1:]
                    repo = self.server.hub.repos.get(rid)
                    if not self._access(repo, rid, head):
                        return
                    assert repo is not None
                    rev = tail[0] if tail else "main"
                    commit = repo.resolve(rev)
                    if commit is None:
                        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                        return
                    body = self._revision(repo, commit, "true" in query.get("blobs", [])) if kw == "revision" \
                        else self._tree(repo, "/".join(tail[1:]))
                    self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
                    return
            self._error(404, None, "Not Found", head)
            return
        if "resolve" in parts:
            i = parts.index("resolve")
            rid = "/".join(parts[:i])
            repo = self.server.hub.repos.get(rid)
            if not self._access(repo, rid, head):
                return
            assert repo is not None
            if len(parts) < i + 3:
                self._error(404, "EntryNotFound", "Entry not found", head)
                return
            rev, path = parts[i + 1], "/".join(parts[i + 2:])
            commit = repo.resolve(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                return
            f = repo.files.get(path)
            if f is None:
                self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", head)
                return
            if f.lfs:
                loc = self.server.hub.signed_url(f.sha256, rid)
                self._send(302, b"", {"Location": loc, "X-Repo-Commit": commit, "X-Linked-Size": str(len(f.data)),
                                      "X-Linked-Etag": f'"{f.sha256}"', "ETag": f'"{f.blob_id}"'}, head)
                return
            self._send_bytes(f.data, {"X-Repo-Commit": commit, "ETag": f'"{f.blob_id}"',
                                      "Content-Type": "application/octet-stream"}, head)
            return
        self._error(404, None, "Not Found", head)

    @staticmethod
    def _revision(repo: HubRepo, commit: str, blobs: bool) -> dict:
        siblings = []
        for p in sorted(repo.files):
            f = repo.files[p]
            s: dict = {"rfilename": p}
            if blobs:
                s.update(size=len(f.data), blobId=f.blob_id)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": len(lfs_pointer(f.sha256, len(f.data)))}
            siblings.append(s)
        return {"_id": commit[:24], "id": repo.repo_id, "modelId": repo.repo_id, "sha": commit,
                "private": repo.private, "gated": "manual" if repo.gated else False, "disabled": False,
                "siblings": siblings, "tags": [], "downloads": 0, "likes": 0}

    @staticmethod
    def _tree(repo: HubRepo, under: str) -> list[dict]:
        out: list[dict] = []
        dirs: set[str] = set()
        for p in sorted(repo.files):
            if under and not p.startswith(under.rstrip("/") + "/"):
                continue
            f = repo.files[p]
            for k in range(1, p.count("/") + 1):
                dirs.add("/".join(p.split("/")[:k]))
            e: dict = {"type": "file", "oid": f.blob_id, "size": len(f.data), "path": p}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": len(lfs_pointer(f.sha256, len(f.data)))}
            out.append(e)
        out += [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                for d in sorted(dirs)]
        return out


class _StorageHandler(_Base):
    role = "storage"

    def do_HEAD(self) -> None:  # noqa: N802
        self._blob(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._blob(head=False)

    def _blob(self, head: bool) -> None:
        hub = self.server.hub
        u = urllib.parse.urlsplit(self.path)
        parts = [p for p in u.path.split("/") if p]
        if self.headers.get("Authorization"):
            hub.storage_saw_token += 1
        if self._fault_status(head):
            return
        f = hub.blobs.get(parts[1]) if len(parts) == 2 and parts[0] == "blobs" else None
        if f is None:
            self._send(404, b"NoSuchKey", {"Content-Type": "text/plain"}, head)
            return
        why = hub.check_signature(f.sha256, urllib.parse.parse_qs(u.query))
        if why is not None:
            # CloudFront's answer to an expired or bad signed URL: 403 with an XML AccessDenied body
            # (huggingface_hub issue #4430 quotes it from cdn-lfs-us-1.hf.co)
            if why == "Expired":
                hub.expired.append(self.path)
            body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>"
                    f"<Message>Access denied ({why})</Message></Error>").encode()
            self._send(403, body, {"Content-Type": "application/xml"}, head)
            return
        self._send_bytes(f.data, {"ETag": f'"{f.sha256}"', "Content-Type": "application/octet-stream"}, head,
                         ranges=not self.server.hub.no_ranges)


def tiny_repo(repo_id: str = "sparkctl/tiny-llama") -> HubRepo:
    """The tiny GGUF (sparkctl_sim.tinymodel) as a repository: the model, its config and a README."""
    import tempfile

    from sparkctl_sim.tinymodel import TINY_MODEL_FILENAME, write_tiny_gguf

    with tempfile.TemporaryDirectory() as d:
        gguf = write_tiny_gguf(Path(d) / TINY_MODEL_FILENAME).read_bytes()
    files = {
        TINY_MODEL_FILENAME: gguf,
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, indent=2).encode(),
        "README.md": b"---\nlicense: mit\n---\n# tiny-llama\nRandom weights generated by sparkctl_sim.tinymodel.\n",
    }
    return make_repo(repo_id, files)


def main(argv: list[str] | None = None) -> int:
    """Serve one directory as a repository in its own process (tools measure clients against it).

    A client measured against a hub in its own process shares no interpreter
    lock with the server, as a client of huggingface.co shares none with the Hub.
    Prints ``{"endpoint", "storage", "commit"}`` on one line, then serves until
    stdin closes or SIGTERM.
    """
    import argparse
    import signal
    import sys

    ap = argparse.ArgumentParser(prog="python -m sparkctl_sim.hub", description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, type=Path, help="the repository's files")
    ap.add_argument("--repo-id", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--per-conn-mbps", type=float, help="MB/s per storage connection (a CDN's per-flow limit)")
    ap.add_argument("--link-mbps", type=float, help="MB/s of all storage connections together")
    args = ap.parse_args(argv)
    repo = repo_from_dir(args.repo_id, args.dir)
    hub = LocalHub([repo], args.host, per_conn_Bps=args.per_conn_mbps * 1e6 if args.per_conn_mbps else None,
                   rate_Bps=args.link_mbps * 1e6 if args.link_mbps else None)
    def _term(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    with hub:
        print(json.dumps({"endpoint": hub.endpoint, "storage": hub.storage, "commit": repo.commit}), flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
