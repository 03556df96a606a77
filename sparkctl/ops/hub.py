"""The Hugging Face Hub as data: what a revision holds, which files a profile wants, what a fetch must do.

Pure: no socket, no transport, no clock. The HTTP requests are made on the one
internet-facing node by the weights agent (``hub-info``, ``hub-fetch``); this
module builds what they ask for and reads what they bring back, the way the
official client does (huggingface_hub 2.4):

* the file list: ``GET {endpoint}/api/models/{id}/revision/{rev}?blobs=true``
  (``HfApi.model_info(files_metadata=True)``): ``sha`` is the commit the
  revision resolved to, each sibling has ``rfilename``, ``size``, ``blobId``
  (git blob id) and, for LFS files, ``lfs.sha256``;
* the bytes: ``{endpoint}/{id}/resolve/{commit}/{path}`` (``hf_hub_url``),
  pinned to the commit so every file comes from the same revision even when
  ``main`` moves during a multi-hour download; LFS files redirect to a storage
  host (the agent follows, keeps ``Range``, drops ``Authorization``);
* patterns: ``fnmatch`` on the repository path, a pattern ending in ``/``
  meaning everything under it (``utils/_paths.py filter_repo_objects``);
* errors: ``X-Error-Code`` ``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``, ``GatedRepo`` and 401/403 (``utils/_http.py hf_raise_for_status``).

The layout is ``hf download --local-dir``'s: every file at its repository path
under the local directory. The manifest (``MANIFEST_REL`` under it) records
the model id, the commit and every file with its size and hashes; ``weights
sync`` refuses a source whose files disagree with it and the weights law
compares its commit across nodes.
"""

from __future__ import annotations

import fnmatch
import posixpath
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import LifecycleError, Ref

DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub constants.ENDPOINT (HF_ENDPOINT overrides it)
MANIFEST_REL = ".sparkctl/hub-manifest.json"  # beside the files, synced with them


class HubError(LifecycleError):
    """The Hub refused or does not have what the profile names (a one-line message and a hint)."""


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    blob_id: str | None
    sha256: str | None  # LFS files only: what the API gives

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass(frozen=True)
class HubRevision:
    repo_id: str
    revision: str
    commit: str
    gated: bool
    private: bool
    files: tuple[HubFile, ...]


@dataclass(frozen=True)
class HubPlan:
    """What a fetch will download into ``local_dir`` on ``node``, and whether the disk holds it."""

    node: str
    endpoint: str
    revision: HubRevision
    files: tuple[HubFile, ...]
    local_dir: str
    free_bytes: int | None
    present_bytes: int  # bytes of selected files already at their full size (verified at the fetch)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def needed_bytes(self) -> int:
        return max(0, self.total_bytes - self.present_bytes)


def revision_url(endpoint: str, repo_id: str, revision: str) -> str:
    return (f"{endpoint.rstrip('/')}/api/models/{_quote_id(repo_id)}/revision/"
            f"{urllib.parse.quote(revision, safe='')}?blobs=true")


def resolve_url(endpoint: str, repo_id: str, commit: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/{_quote_id(repo_id)}/resolve/{commit}/{urllib.parse.quote(path)}"


def _quote_id(repo_id: str) -> str:
    return "/".join(urllib.parse.quote(p, safe="") for p in repo_id.split("/"))


def _safe_path(p: object) -> bool:
    if not isinstance(p, str) or not p or p.startswith("/") or "\\" in p or "\x00" in p or "\n" in p:
        return False
    return all(part not in ("", ".", "..") for part in p.split("/"))


def parse_revision(doc: object, repo_id: str, revision: str) -> HubRevision:
    """The revision API's answer as a :class:`HubRevision`; a malformed answer is a :class:`HubError`."""
    ref = Ref(key="model.id")

    def bad(why: str) -> HubError:
        return HubError(f"the Hub's answer for {repo_id}@{revision} is unreadable: {why}", ref,
                        hint="HF_ENDPOINT must name a Hugging Face Hub or a mirror that speaks its API")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    commit = doc.get("sha")
    if not isinstance(commit, str) or not commit:
        raise bad("no commit (sha)")
    siblings = doc.get("siblings")
    if not isinstance(siblings, list):
        raise bad("no siblings list")
    files = []
    for s in siblings:
        if not isinstance(s, dict) or not _safe_path(s.get("rfilename")):
            raise bad(f"a sibling without a safe rfilename: {str(s)[:80]}")
        size = s.get("size")
        lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else None
        if lfs is not None and isinstance(lfs.get("size"), int):
            size = lfs["size"]
        if not isinstance(size, int) or size < 0:
            raise bad(f"{s['rfilename']}: no size (the API needs ?blobs=true)")
        sha = lfs.get("sha256") if lfs else None
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            raise bad(f"{s['rfilename']}: lfs.sha256 is not a SHA-256")
        blob = s.get("blobId") if isinstance(s.get("blobId"), str) else None
        files.append(HubFile(s["rfilename"], size, blob, sha.lower() if sha else None))
    gated = doc.get("gated")
    return HubRevision(repo_id, revision, commit, bool(gated) and gated != "false", bool(doc.get("private")),
                       tuple(sorted(files, key=lambda f: f.path)))


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def select(files: Sequence[HubFile], include: Sequence[str], exclude: Sequence[str]) -> tuple[HubFile, ...]:
    """The files matching any ``include`` pattern and no ``exclude`` pattern (huggingface_hub's semantics)."""
    return tuple(f for f in files if _matches(f.path, include) and not _matches(f.path, exclude))


def http_error(status: int, code: str | None, message: str | None, repo_id: str, revision: str, *,
               token_set: bool, endpoint: str, path: str | None = None, token_from: str = "HF_TOKEN") -> HubError:
    """The one-line error (and hint) for a refusal of the Hub, as ``hf_raise_for_status`` tells them apart.

    ``token_from`` names where the token was found (an environment variable,
    or the token file's path): the message says which token was refused.
    """
    ref = Ref(key="model.id" if code != "RevisionNotFound" else "model.revision")
    who = token_from if token_from.isupper() and "/" not in token_from else f"the token in {token_from}"
    what = f"{repo_id}@{revision}" + (f": {path}" if path else "")
    if code == "RevisionNotFound":
        return HubError(f"revision {revision!r} of {repo_id} not found on {endpoint}", ref,
                        hint="model.revision (or --revision) must be a branch, tag or commit of the repository")
    if code == "EntryNotFound":
        return HubError(f"{what}: file not found on {endpoint}", ref, hint="the revision changed under the fetch: run it again")
    if code == "GatedRepo" or status in (401, 403):
        if not token_set:
            return HubError(f"{what}: the repository is gated or private and no token was given (HTTP {status})", ref,
                            hint="set HF_TOKEN to a token of an account with access, or log in with `hf auth login` "
                                 "(it writes $HF_HOME/token, read as huggingface_hub reads it); it is never printed")
        if code == "GatedRepo" or status == 403:
            return HubError(f"{what}: {who} has no access to this repository (HTTP {status})", ref,
                            hint=f"accept the conditions at {endpoint}/{repo_id} with the token's account, "
                                 "or use a token that has access")
        return HubError(f"{what}: {who} was refused (HTTP {status})", ref,
                        hint="the token is invalid or expired: make a new one (read access)")
    if status == 404 or code == "RepoNotFound":
        hint = "check model.id; a private repository also answers 404 to a token without access"
        return HubError(f"repository {repo_id} not found on {endpoint} (HTTP {status})", ref,
                        hint=hint if token_set else hint + "; if it is private, set HF_TOKEN")
    return HubError(f"{what}: HTTP {status} from {endpoint}" + (f": {message[:200]}" if message else ""), ref,
                    hint="run it again later; complete files are kept")


def local_dir_of(weights_path: str, local_dir: str | None) -> str:
    """Where the repository is laid out: ``model.local_dir`` when the weights path lies under it, else the weights
    path itself (a child profile that moves weights_path elsewhere is not held to its parent's local_dir)."""
    if local_dir and is_within(weights_path, local_dir):
        return local_dir.rstrip("/") or "/"
    return weights_path.rstrip("/") or "/"


def plan(node: str, endpoint: str, rev: HubRevision, include: Sequence[str], exclude: Sequence[str],
         local_dir: str, free_bytes: int | None, present: Mapping[str, int]) -> HubPlan:
    """What to download; refuses an empty selection and a disk that cannot hold it (before any byte moves)."""
    files = select(rev.files, include, exclude)
    if not files:
        raise HubError(f"no file of {rev.repo_id}@{rev.revision} matches the patterns "
                       f"(include {list(include)}, exclude {list(exclude)})", Ref(key="model.files.include"),
                       hint=f"the repository has: {', '.join(f.path for f in rev.files[:8])}"
                            + (" ..." if len(rev.files) > 8 else ""))
    have = sum(f.size for f in files if present.get(f.path) == f.size)
    p = HubPlan(node, endpoint, rev, files, local_dir, free_bytes, have)
    if free_bytes is not None and p.needed_bytes > free_bytes:
        raise HubError(f"{node}: {local_dir} has {_gib(free_bytes)} free, the model needs {_gib(p.needed_bytes)} more "
                       f"({len(files)} files, {_gib(p.total_bytes)} in all)", Ref(node=node, key="model.weights_path"),
                       hint="free space on that disk, point model.local_dir elsewhere, or narrow model.files")
    return p


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def agent_files(p: HubPlan) -> list[dict[str, Any]]:
    """What the agent's ``hub-fetch`` downloads: URL, relative path, size and hashes of each file."""
    return [{"path": f.path, "url": resolve_url(p.endpoint, p.revision.repo_id, p.revision.commit, f.path),
             "size": f.size, "sha256": f.sha256, "blob_id": f.blob_id} for f in p.files]


def manifest(p: HubPlan) -> dict[str, Any]:
    """The manifest written beside the files (the agent fills in each small file's sha256 as it verifies it)."""
    return {"version": 1, "kind": "hub", "repo_id": p.revision.repo_id, "revision": p.revision.revision,
            "commit": p.revision.commit,
            "files": {f.path: {"size": f.size, "sha256": f.sha256, "blob_id": f.blob_id, "lfs": f.lfs}
                      for f in p.files}}


def describe(p: HubPlan) -> list[str]:
    """The dry run: one line per file, then the totals and the free space."""
    lines = [f"{p.revision.repo_id}@{p.revision.revision} = commit {p.revision.commit} "
             f"-> {p.node}:{p.local_dir}"]
    for f in p.files:
        tag = "lfs sha256 " + f.sha256[:12] if f.sha256 else ("blob " + f.blob_id[:12] if f.blob_id else "size only")
        lines.append(f"  {f.size:>15,}  {f.path}  ({tag})")
    free = _gib(p.free_bytes) if p.free_bytes is not None else "unknown"
    lines.append(f"{len(p.files)} files, {_gib(p.total_bytes)} ({p.total_bytes:,} bytes); "
                 f"{_gib(p.present_bytes)} already there; free on {p.node}: {free}")
    return lines


def is_within(path: str, root: str) -> bool:
    return posixpath.commonpath([posixpath.normpath(path), posixpath.normpath(root)]) == posixpath.normpath(root)
