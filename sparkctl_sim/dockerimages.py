"""The simulated docker's image store: per-node images with IDs, and the image verbs.

SIMULATION ONLY. A real Spark's dockerd keeps images under /var/lib/docker; the
simulated node keeps ``images.json`` in ``nodes/NODE/docker-images`` (beside its
run dir, so it survives a simulated reboot as /var/lib/docker does). An image is
a config JSON whose SHA-256 is its ID (moby image/image.go: the ID is the digest
of the config), one layer blob of a chosen size (deterministic bytes, so
``docker save`` streams real bytes without storing them), repo tags and repo
digests. Verbs:

* ``docker image inspect [--format T] REF...`` / ``docker inspect --type image``:
  the real JSON shape (Id, RepoTags, RepoDigests, Created, Size, Architecture,
  Os, Config, RootFS); a missing one prints ``Error response from daemon: No such
  image: REF`` and exits 1 (moby daemon/images/image.go ErrImageDoesNotExist
  "No such image: %s", wrapped by the CLI as "Error response from daemon: ...");
* ``docker images`` / ``docker image ls``: REPOSITORY TAG IMAGE ID CREATED SIZE;
* ``docker save IMAGE``: a real tar on stdout (the docker-save layout that
  ``docker load`` reads: manifest.json with Config, RepoTags, Layers; the config
  and layer blobs under blobs/sha256/); refuses a terminal as docker does
  ("cowardly refusing to save to a terminal. Use the -o flag or redirect");
* ``docker load``: reads that tar on stdin, streamed, checks each blob's SHA-256
  against its name, and prints ``Loaded image: name:tag`` per tag (``Loaded
  image ID: sha256:...`` when untagged), as docs.docker.com/reference/cli/docker/
  image/load shows. Like the classic store, a load restores tags, never repo
  digests (digests come from a registry: moby's docker save writes none);
* ``docker pull REF``: only references the simulated registry
  (``registry.json`` in the sim root, ``sparkctl sim image publish``) serves;
  anything else is ``pull access denied`` (the community's locally built images:
  issue #12);
* ``docker tag SRC DST`` and ``docker rmi REF``.

A reference resolves as docker's does: ``name`` means ``name:latest``;
``name@sha256:D`` matches a repo digest; ``sha256:ID`` or an ID prefix of 12+
hex digits matches the ID.

Two image stores, as Docker has (``sparkctl sim set NODE docker_store=containerd``):
the classic store reports the config digest as the image ID (moby image/image.go);
the containerd image store the digest of the manifest the name points to (moby
daemon/containerd/image.go ``GetImage``: ``image.ID(desc.Target.Digest)``; here
a single-platform OCI manifest of the config and the layer), and ``docker info``
names its snapshotter in DriverStatus (``driver-type io.containerd.snapshotter.v1``,
docs.docker.com/engine/storage/containerd/). The stores do not share images:
switching a node's store leaves it with the other store's images out of sight
("images and containers from the classic store are not visible", same page), so
its images are in ``docker-images-containerd`` beside the classic ``docker-images``.
Both show the config's content alike: ``RootFS.Layers`` (the diff IDs) and ``Config``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tarfile is imported by save and load only (every docker call starts a fresh python3 -S)
    import tarfile

from sparkctl_sim.shimbase import ShimError, _locked, _now_iso, _read_json, _run_dir, _write_json_atomic

DEFAULT_LAYER_BYTES = 4 << 20
_BLOCK = 1 << 20


STORE_CLASSIC = "classic"
STORE_CONTAINERD = "containerd"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def store_kind(node_dir: Path) -> str:
    """The node's docker image store: its state's ``docker_store`` (classic unless set)."""
    return kind_of(_read_json(node_dir / "state.json") or {})


def kind_of(state: dict[str, Any]) -> str:
    kind = state.get("docker_store", STORE_CLASSIC)
    return kind if kind in (STORE_CLASSIC, STORE_CONTAINERD) else STORE_CLASSIC


def node_store_dir(node_dir: Path) -> Path:
    return node_dir / ("docker-images" if store_kind(node_dir) == STORE_CLASSIC else "docker-images-containerd")


def store_dir(run_dir: Path) -> Path:
    """``nodes/NODE/docker-images``: beside the run dir (which a simulated boot empties); the
    containerd store's images in ``docker-images-containerd``."""
    return node_store_dir(run_dir.parent)


def manifest_digest(rec: dict[str, Any]) -> str:
    """The digest of the OCI manifest that points at the image's config and layer (containerd store ID)."""
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": rec["Id"],
                           "size": len(rec["config_json"].encode())},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": rec["layer"],
                            "size": rec["layer_bytes"]}]}
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def shown_id(rec: dict[str, Any], kind: str) -> str:
    """The image ID docker reports: the config digest (classic) or the manifest digest (containerd)."""
    return rec["Id"] if kind == STORE_CLASSIC else manifest_digest(rec)


def registry_path(run_dir: Path) -> Path:
    """The simulated registry of pullable images: ``<sim root>/registry.json``."""
    return run_dir.parent.parent.parent / "registry.json"


def normalize(ref: str) -> str:
    """``name`` -> ``name:latest``; digests and tags are kept (distribution/reference's rule)."""
    if "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else f"{ref}:latest"


def layer_chunks(seed: str, size: int) -> Iterator[bytes]:
    """The layer's bytes: a 1 MiB block from ``seed``, repeated, cut at ``size``."""
    block = b"".join(hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(_BLOCK // 32))
    left = size
    while left > 0:
        n = min(left, _BLOCK)
        yield block[:n]
        left -= n


def make_image(ref: str, variant: str = "", layer_bytes: int = DEFAULT_LAYER_BYTES,
               config: dict[str, Any] | None = None, sim: dict[str, Any] | None = None) -> dict[str, Any]:
    """An image record as `docker build` would leave it (no repo digest: nothing was pushed).
    ``sim``: what the simulated image's file system holds (sparkctl_sim/imagefs.py: its NCCL)."""
    seed = f"{normalize(ref)}#{variant}"
    h = hashlib.sha256()
    for chunk in layer_chunks(seed, layer_bytes):
        h.update(chunk)
    layer = "sha256:" + h.hexdigest()
    cfg = {"architecture": "arm64", "os": "linux", "created": "2025-11-01T00:00:00Z",
           "config": {"Env": [], "Entrypoint": None, "Cmd": None, "WorkingDir": "", **(config or {})},
           "rootfs": {"type": "layers", "diff_ids": [layer]}, "sparkctl_sim": {"seed": seed, **(sim or {})}}
    raw = json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
    return {"Id": "sha256:" + hashlib.sha256(raw).hexdigest(), "config_json": raw.decode(),
            "RepoTags": [normalize(ref)] if "@" not in ref else [], "RepoDigests": [],
            "Created": cfg["created"], "Size": layer_bytes, "layer": layer, "seed": seed,
            "layer_bytes": layer_bytes}


class Images:
    """One node's image store (``images.json``: config digest -> record), under an flock."""

    def __init__(self, root: Path, kind: str = STORE_CLASSIC) -> None:
        self.root = root
        self.kind = kind
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = root / "images.json"

    def shown_id(self, rec: dict[str, Any]) -> str:
        return shown_id(rec, self.kind)

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return _locked(self.root / ".lock")

    def all(self) -> dict[str, dict[str, Any]]:
        return dict((_read_json(self.path) or {}).get("images", {}))

    def _save(self, images: dict[str, dict[str, Any]]) -> None:
        _write_json_atomic(self.path, {"images": images})
        # the node's `docker image inspect` views read this store (sparkctl_sim.shims.rendered)
        from sparkctl_sim import nodestate

        nodestate.drop_views(self.root.parent / "state.json")

    def find(self, ref: str) -> dict[str, Any] | None:
        images = self.all()
        want = normalize(ref)
        for rec in images.values():
            if want in rec["RepoTags"] or ref in rec["RepoDigests"]:
                return rec
        hexid = ref.removeprefix("sha256:")
        if len(hexid) >= 12 and all(c in "0123456789abcdef" for c in hexid):
            # only the ID this store reports resolves (the containerd store matches target digests)
            hits = [r for r in images.values() if self.shown_id(r).removeprefix("sha256:").startswith(hexid)]
            if len(hits) == 1:
                return hits[0]
        return None

    def add(self, rec: dict[str, Any], tags: Sequence[str] = (), digests: Sequence[str] = ()) -> dict[str, Any]:
        """Store ``rec``; a tag moves to it from whichever image had it (as `docker build -t` / load do)."""
        with self.lock():
            images = self.all()
            tags = [normalize(t) for t in tags] or list(rec["RepoTags"])
            for other in images.values():
                other["RepoTags"] = [t for t in other["RepoTags"] if t not in tags]
            cur = images.get(rec["Id"], dict(rec, RepoTags=[], RepoDigests=[]))
            cur["RepoTags"] = sorted(set(cur["RepoTags"]) | set(tags))
            cur["RepoDigests"] = sorted(set(cur["RepoDigests"]) | set(digests))
            images[rec["Id"]] = cur
            self._save(images)
            return cur

    def remove(self, ref: str) -> dict[str, Any] | None:
        with self.lock():
            rec = self.find(ref)
            if rec is None:
                return None
            images = self.all()
            want = normalize(ref)
            cur = images[rec["Id"]]
            if want in cur["RepoTags"] and len(cur["RepoTags"]) > 1:
                cur["RepoTags"].remove(want)
            else:
                del images[rec["Id"]]
            self._save(images)
            return rec


def node_images() -> Images:
    run = _run_dir()
    return Images(store_dir(run), store_kind(run.parent))


def _no_such_image(ref: str) -> ShimError:
    return ShimError(f"Error response from daemon: No such image: {ref}", 1)


# Config is a struct in docker's inspect (moby api/types/image/image_inspect.go, DockerOCIImageConfig):
# a template reaches every field of it, set or not.
_CONFIG_FIELDS: dict[str, Any] = {"User": "", "ExposedPorts": None, "Env": None, "Entrypoint": None, "Cmd": None,
                                  "Volumes": None, "WorkingDir": "", "Labels": None, "StopSignal": ""}


def inspect_view(rec: dict[str, Any], kind: str = STORE_CLASSIC) -> dict[str, Any]:
    cfg = json.loads(rec["config_json"])
    view = {"Id": shown_id(rec, kind), "RepoTags": rec["RepoTags"], "RepoDigests": rec["RepoDigests"], "Parent": "",
            "Comment": "", "Created": rec["Created"], "DockerVersion": "", "Author": "",
            "Config": {**_CONFIG_FIELDS, **cfg["config"]}, "Architecture": cfg["architecture"], "Os": cfg["os"],
            "Size": rec["Size"], "RootFS": {"Type": "layers", "Layers": cfg["rootfs"]["diff_ids"]},
            "Metadata": {"LastTagTime": rec.get("tagged_at", "")}}
    if kind == STORE_CONTAINERD:  # the target's OCI descriptor (only a multi-platform store sets it)
        view["Descriptor"] = {"mediaType": OCI_MANIFEST, "digest": view["Id"]}
    return view


def run_config(ref: str) -> dict[str, Any] | None:
    """What ``docker run`` needs of an image (entrypoint, cmd, env, workdir), None when absent."""
    rec = node_images().find(ref)
    if rec is None:
        return None
    full = json.loads(rec["config_json"])
    c = full["config"]
    env = dict(e.partition("=")[::2] for e in c.get("Env") or [])
    return {"entrypoint": c.get("Entrypoint") or [], "cmd": c.get("Cmd") or [], "env": env,
            "workdir": c.get("WorkingDir") or None, "id": node_images().shown_id(rec),
            "config_digest": rec["Id"], "sim": full.get("sparkctl_sim") or {}}


def repository(ref: str) -> str:
    """``host:5000/org/name:tag@sha256:...`` -> ``host:5000/org/name``."""
    name = ref.split("@")[0]
    head, _, last = name.rpartition("/")
    return (f"{head}/" if head else "") + last.split(":")[0]


def pull_error(ref: str) -> str:
    # the daemon's text for a repository the registry will not serve (moby
    # distribution/errors.go: "pull access denied for %s, repository does not exist
    # or may require 'docker login'")
    return (f"Error response from daemon: pull access denied for {repository(ref)}, "
            "repository does not exist or may require 'docker login'")


def docker_image_inspect(refs: Sequence[str], fmt: str | None, render: Any) -> int:
    store = node_images()
    views, code = [], 0
    for ref in refs:
        rec = store.find(ref)
        if rec is None:
            print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
            code = 1
            continue
        views.append(inspect_view(rec, store.kind))
    if fmt is not None:
        for v in views:
            print(render(fmt, v))
    else:
        print(json.dumps(views, indent=4))
    return code


def _human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n}B"


def docker_images(args: Sequence[str]) -> int:
    quiet = "-q" in args or "--quiet" in args
    rows = []
    store = node_images()
    for rec in store.all().values():
        for tag in rec["RepoTags"] or ["<none>:<none>"]:
            repo, _, t = tag.rpartition(":")
            rows.append((repo, t, store.shown_id(rec).removeprefix("sha256:")[:12], rec["Created"],
                         _human_size(rec["Size"])))
    if quiet:
        for r in rows:
            print(r[2])
        return 0
    print(f"{'REPOSITORY':<40} {'TAG':<20} {'IMAGE ID':<14} {'CREATED':<22} SIZE")
    for r in sorted(rows):
        print(f"{r[0]:<40} {r[1]:<20} {r[2]:<14} {r[3]:<22} {r[4]}")
    return 0


class _Stream(io.RawIOBase):
    """A file object over an iterator of byte chunks (tarfile's addfile reads it)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._it, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def docker_save(args: Sequence[str]) -> int:
    import tarfile

    refs = [a for a in args if not a.startswith("-")]
    if any(a.startswith("-") for a in args):
        raise ShimError("sparkctl sim: docker save here writes to stdout only (no -o)", 125)
    if not refs:
        raise ShimError("\"docker save\" requires at least 1 argument.\nSee 'docker save --help'.", 1)
    if os.isatty(1):
        raise ShimError("cowardly refusing to save to a terminal. Use the -o flag or redirect", 1)
    store = node_images()
    recs = []
    for ref in refs:
        rec = store.find(ref)
        if rec is None:
            raise _no_such_image(ref)
        recs.append((ref, rec))
    out = os.fdopen(os.dup(1), "wb", buffering=_BLOCK)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        manifest = []
        for ref, rec in recs:
            cfg = rec["config_json"].encode()
            cname = "blobs/sha256/" + rec["Id"].removeprefix("sha256:")
            lname = "blobs/sha256/" + rec["layer"].removeprefix("sha256:")
            _add(tar, cname, io.BytesIO(cfg), len(cfg))
            _add(tar, lname, _Stream(layer_chunks(rec["seed"], rec["layer_bytes"])), rec["layer_bytes"])
            tags = [normalize(ref)] if normalize(ref) in rec["RepoTags"] else list(rec["RepoTags"])
            manifest.append({"Config": cname, "RepoTags": tags, "Layers": [lname]})
        data = json.dumps(manifest).encode()
        _add(tar, "manifest.json", io.BytesIO(data), len(data))
    out.close()
    return 0


def _add(tar: tarfile.TarFile, name: str, fh: Any, size: int) -> None:
    import tarfile

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    tar.addfile(info, fh)


def docker_load(args: Sequence[str]) -> int:
    import tarfile

    # -q hides the progress bar only; the loaded names are printed either way (docker load --help)
    if any(a not in ("-q", "--quiet") for a in args):
        raise ShimError("sparkctl sim: docker load here reads stdin only (no -i)", 125)
    if os.isatty(0):
        raise ShimError("requested load from stdin, but stdin is empty", 1)
    blobs: dict[str, bytes] = {}  # configs only: layers are hashed as they stream by, then dropped
    layers: dict[str, int] = {}
    manifest: list[dict[str, Any]] | None = None
    inp = os.fdopen(os.dup(0), "rb", buffering=_BLOCK)
    try:
        with tarfile.open(fileobj=inp, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                fh = tar.extractfile(member)
                assert fh is not None
                if member.name == "manifest.json":
                    manifest = json.loads(fh.read())
                    continue
                h, kept, n = hashlib.sha256(), [], 0
                while chunk := fh.read(_BLOCK):
                    h.update(chunk)
                    n += len(chunk)
                    if member.size <= 1 << 20:
                        kept.append(chunk)
                digest = h.hexdigest()
                if member.name.startswith("blobs/sha256/") and member.name.rsplit("/", 1)[1] != digest:
                    raise ShimError(f"Error response from daemon: invalid diffID for layer: expected "
                                    f"\"sha256:{member.name.rsplit('/', 1)[1]}\", got \"sha256:{digest}\"", 1)
                layers[member.name] = n
                if kept:
                    blobs[member.name] = b"".join(kept)
    except tarfile.TarError as exc:
        raise ShimError(f"Error response from daemon: unexpected EOF ({exc})", 1) from None
    finally:
        inp.close()
    if manifest is None:
        raise ShimError("Error response from daemon: open /var/lib/docker/tmp/docker-import/manifest.json: "
                        "no such file or directory", 1)
    store = node_images()
    for entry in manifest:
        raw = blobs.get(entry["Config"])
        if raw is None:
            raise ShimError(f"Error response from daemon: config {entry['Config']} missing from the archive", 1)
        cfg = json.loads(raw)
        for lname in entry["Layers"]:
            if lname not in layers:
                raise ShimError(f"Error response from daemon: layer {lname} missing from the archive", 1)
        lname = entry["Layers"][0]
        rec = {"Id": "sha256:" + hashlib.sha256(raw).hexdigest(), "config_json": raw.decode(), "RepoTags": [],
               "RepoDigests": [], "Created": cfg.get("created", _now_iso()), "Size": layers[lname],
               "layer": "sha256:" + lname.rsplit("/", 1)[1], "seed": cfg["sparkctl_sim"]["seed"],
               "layer_bytes": layers[lname]}
        store.add(rec, entry.get("RepoTags") or [])
        for tag in entry.get("RepoTags") or []:
            print(f"Loaded image: {tag}")
        if not entry.get("RepoTags"):
            print(f"Loaded image ID: {store.shown_id(rec)}")
    return 0


def published() -> dict[str, dict[str, Any]]:
    return dict((_read_json(registry_path(_run_dir())) or {}).get("images", {}))


def docker_pull(args: Sequence[str]) -> int:
    refs = [a for a in args if not a.startswith("-")]
    if len(refs) != 1:
        raise ShimError("\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.", 1)
    ref = refs[0]
    reg = published()
    if "@" in ref:  # by digest: the published tag of that repository with that digest
        hits = [(k, v) for k, v in reg.items() if repository(k) == repository(ref) and v["digest"] == ref.split("@")[1]]
        name, entry = hits[0] if hits else (ref, None)
    else:
        name = normalize(ref)
        entry = reg.get(name)
    if entry is None:
        raise ShimError(pull_error(ref), 1)
    rec = make_image(name, entry.get("variant", ""), entry.get("layer_bytes", DEFAULT_LAYER_BYTES))
    repo = repository(name)
    node_images().add(rec, [name] if "@" not in ref else [], [f"{repo}@{entry['digest']}"])
    print(f"{name.rsplit(':', 1)[1] if '@' not in ref else ref.split('@')[1]}: Pulling from {repo}")
    print(f"Digest: {entry['digest']}")
    print(f"Status: Downloaded newer image for {ref}")
    print(ref if "@" in ref else name)
    return 0


def publish(root: Path, ref: str, variant: str = "", layer_bytes: int = DEFAULT_LAYER_BYTES) -> str:
    """Make ``ref`` pullable from the simulated registry; returns its manifest digest."""
    name = normalize(ref)
    rec = make_image(name, variant, layer_bytes)
    digest = "sha256:" + hashlib.sha256(f"manifest:{rec['Id']}".encode()).hexdigest()
    path = root / "registry.json"
    data = _read_json(path) or {"images": {}}
    data["images"][name] = {"digest": digest, "variant": variant, "layer_bytes": layer_bytes, "id": rec["Id"]}
    _write_json_atomic(path, data)
    return digest


# plain X.Y.Z: what the simulated torch and engine parse (sparkctl_sim/engines/runtime.py image_nccl)
NCCL_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")
DEFAULT_NCCL = "2.30.7"  # sparkctl_sim/imagefs.py DEFAULT_NCCL


def nccl_config(nccl: str | None) -> dict[str, Any] | None:
    """The image config of a build whose NCCL is ``nccl`` (None: the image sets no NCCL_VERSION).

    NVIDIA's CUDA and NGC images record their NCCL as ``ENV NCCL_VERSION=2.X.Y``
    (gitlab.com/nvidia/container-images/cuda ``dist/12.0.0/ubuntu2204/runtime/Dockerfile``:
    ``ENV NCCL_VERSION 2.16.2-1``, the package revision after the dash). A different
    NCCL is a different config, hence a different image ID (moby image/image.go).
    """
    if nccl is None:
        return None
    _check_version(nccl)
    return {"Env": [f"NCCL_VERSION={nccl}"]}


def _check_version(v: str) -> None:
    if not NCCL_VERSION_RE.fullmatch(v):
        raise ValueError(f"not an NCCL version: {v!r} (want X.Y.Z, e.g. 2.28.9)")


def nccl_sim(nccl: str | None, torch_nccl: str | None) -> dict[str, Any] | None:
    """The image file system's NCCL (sparkctl_sim/imagefs.py): the library it loads and the one
    its torch was built against; None: the defaults (torch and library alike)."""
    if nccl is None and torch_nccl is None:
        return None
    for v in (nccl, torch_nccl):
        if v is not None:
            _check_version(v)
    lib = nccl or DEFAULT_NCCL
    return {"nccl": lib, "torch_nccl": torch_nccl or lib}


def load_on_node(root: Path, node: str, ref: str, variant: str = "", layer_bytes: int = DEFAULT_LAYER_BYTES,
                 nccl: str | None = None, torch_nccl: str | None = None) -> dict[str, Any]:
    """Stand-in for "the operator built it on this node" (`sparkctl sim image load [--nccl L] [--torch-nccl T]`).

    ``--nccl`` alone: a build whose torch and library are both L, recorded as NVIDIA's images do
    (``ENV NCCL_VERSION``). With ``--torch-nccl``: torch built against T loading the library L, the
    community's source-built NCCL (sparkctl_sim/imagefs.py), with no NCCL_VERSION recorded."""
    config = nccl_config(nccl) if torch_nccl is None else None
    rec = make_image(ref, variant, layer_bytes, config=config, sim=nccl_sim(nccl, torch_nccl))
    node_dir = root / "nodes" / node
    return Images(node_store_dir(node_dir), store_kind(node_dir)).add(rec)


def docker_tag(args: Sequence[str]) -> int:
    if len(args) != 2:
        raise ShimError("\"docker tag\" requires exactly 2 arguments.\nSee 'docker tag --help'.", 1)
    store = node_images()
    rec = store.find(args[0])
    if rec is None:
        raise _no_such_image(args[0])
    store.add(rec, [args[1]])
    return 0


def docker_rmi(args: Sequence[str]) -> int:
    code = 0
    for ref in (a for a in args if not a.startswith("-")):
        rec = node_images().remove(ref)
        if rec is None:
            print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
            code = 1
        else:
            print(f"Untagged: {normalize(ref)}")
    return code
