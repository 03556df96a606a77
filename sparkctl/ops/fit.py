"""``sparkctl fit``: the model's memory per node and rank, read from the model's own headers.

The edges of :mod:`sparkctl.model.memfit`: one small probe per node (meminfo, the
engine processes, the ``model_files`` fact: config.json and the safetensors or
GGUF headers at the weights path, never the weights), and, when a node does not
have the files yet (or ``hub=True``), the same headers from the Hugging Face Hub
with HTTP Range requests made from this machine, as huggingface_hub's
``parse_safetensors_file_metadata`` reads them (hf_api.py: ``Range: bytes=0-100000``,
then the rest of the header if it is longer): the revision API for the file list,
``/resolve/{commit}/{path}`` for the bytes, redirects to the storage host followed
without the token (httpx drops ``Authorization`` on a cross-origin redirect).
Only the header bytes are asked for; a server that ignores ``Range`` is read only
as far as the header goes, then the connection is closed.

What it must not do: print, prompt, exit, or change a host.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkctl.errors import Ref
from sparkctl.facts import batch as probes_batch
from sparkctl.facts import modelfiles, services, system
from sparkctl.facts.registry import ScriptContext
from sparkctl.model import memfit
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import bind
from sparkctl.model.profiles import Resolved
from sparkctl.ops import hub
from sparkctl.ops.hub import HubError
from sparkctl.plan.laws.memoryfit import fit_for, node_memory
from sparkctl.remote import modelhead
from sparkctl.transport import Transport

HEADER_FIRST_BYTES = 100_000  # huggingface_hub parse_safetensors_file_metadata: "Fetch first 100kb"
HUB_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class NodeFit:
    node: str
    rank: int
    source: str  # where the headers were read: "spark-a:/srv/models/x" or "hub repo@commit"
    fit: memfit.Fit | None
    error: str = ""


@dataclass(frozen=True)
class FitReport:
    profile: str
    nodes: tuple[NodeFit, ...]
    model: Mapping[str, Any] = field(default_factory=dict)  # the model's shape, for the record

    @property
    def ok(self) -> bool:
        return all(n.fit is not None and n.fit.ok for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "ok": self.ok, "model": dict(self.model),
                "nodes": [{"node": n.node, "rank": n.rank, "source": n.source, "error": n.error,
                           **(memfit.describe(n.fit) if n.fit else {})} for n in self.nodes]}


def _script(inv: Inventory, node: str, weights_path: str) -> str:
    ctx = ScriptContext(inv.node(node), weights_path=weights_path)
    facts = (system.MEMINFO, services.ENGINES, modelfiles.MODEL_FILES)
    return probes_batch.remote_command(probes_batch.frame(
        [(f.section(), f.command(ctx, "")) for f in facts]))


def _shape_summary(m: memfit.ModelShape) -> dict[str, Any]:
    return {"kind": m.kind, "arch": m.arch, "layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "v_head_dim": m.v_head_dim, "mla_latent": m.mla_latent,
            "weight_bytes": m.weight_bytes, "tensor_groups": len(m.tensors)}


def run_fit(res: Resolved, inv: Inventory, transport: Transport, *, use_hub: bool = False,
            endpoint: str = hub.DEFAULT_ENDPOINT, token: str | None = None,
            hub_reader: Callable[..., dict[str, Any]] | None = None) -> FitReport:
    """The figures of every rank of ``res`` on its node; the Hub is read when a node has no files or ``use_hub``."""
    layout = bind(res, inv)
    p = res.profile
    results = transport.run_all({r.node: _script(inv, r.node, p.model.weights_path) for r in layout.ranks})
    hub_doc: dict[str, Any] | None = None
    shape_info: dict[str, Any] = {}
    out: list[NodeFit] = []
    for r in layout.ranks:
        got = results[r.node]
        if got.error:
            out.append(NodeFit(r.node, r.rank, "", None, f"node {r.node} did not answer: {got.error}"))
            continue
        facts = probes_batch.parse_batch(r.node, got.stdout)
        if facts.mem_total_kib is None or facts.mem_available_kib is None:
            out.append(NodeFit(r.node, r.rank, "", None, facts.unreadable.get("meminfo", "meminfo not read")))
            continue
        why = facts.unreadable.get("model_files") or facts.not_available.get("model_files")
        mf = facts.model_files
        if mf is not None and not use_hub:
            doc, source = mf.doc, f"{r.node}:{p.model.weights_path}"
        elif why and not use_hub:
            out.append(NodeFit(r.node, r.rank, f"{r.node}:{p.model.weights_path}", None, why))
            continue
        else:
            if hub_doc is None:
                hub_doc = (hub_reader or read_hub)(p, endpoint=endpoint, token=token)
            doc, source = hub_doc, f"hub {hub_doc['path']}"
        try:
            shape = memfit.shape_from_doc(doc)
            fit = fit_for(res.for_node(r.node), shape, node_memory(facts))
        except memfit.FitError as exc:
            out.append(NodeFit(r.node, r.rank, source, None, f"cannot size the model: {exc}"))
            continue
        shape_info = shape_info or _shape_summary(shape)
        out.append(NodeFit(r.node, r.rank, source, fit))
    return FitReport(res.name, tuple(out), shape_info)


# --------------------------------------------------------------------------- the Hub


def _hub_files(p: Any, rev: hub.HubRevision) -> tuple[str, list[hub.HubFile]]:
    """(kind, files) of the repository the profile serves: the GGUF weights_path names, or its safetensors."""
    m = p.model
    root = hub.local_dir_of(m.weights_path, m.local_dir)
    rel = posixpath.relpath(m.weights_path, root) if m.weights_path.rstrip("/") != root else ""
    chosen = hub.select(rev.files, m.files.include, m.files.exclude)
    if rel.endswith(".gguf"):
        return "gguf", [f for f in rev.files if f.path == rel]
    under = [f for f in chosen if not rel or f.path.startswith(rel.rstrip("/") + "/")]
    st = [f for f in under if f.path.endswith(".safetensors")]
    if st:
        return "safetensors", st
    return "gguf", [f for f in under if f.path.endswith(".gguf")]


def _raise_for(resp: Any, repo_id: str, revision: str, endpoint: str, token: str | None,
               path: str | None = None) -> None:
    if resp.status_code in (200, 206):
        return
    raise hub.http_error(resp.status_code, resp.headers.get("X-Error-Code"), resp.headers.get("X-Error-Message"),
                         repo_id, revision, token_set=bool(token), endpoint=endpoint, path=path)


def read_hub(p: Any, *, endpoint: str, token: str | None, client: Any = None) -> dict[str, Any]:
    """The model header document (as modelhead.read_path makes it) from the Hub, header bytes only."""
    import httpx

    m = p.model
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    c = client or httpx.Client(follow_redirects=True, timeout=HUB_TIMEOUT_S)
    try:
        r = c.get(hub.revision_url(endpoint, m.id, m.revision), headers=headers)
        _raise_for(r, m.id, m.revision, endpoint, token)
        rev = hub.parse_revision(r.json(), m.id, m.revision)
        kind, files = _hub_files(p, rev)
        if not files:
            raise HubError(f"{m.id}@{m.revision}: no .safetensors or .gguf file for {m.weights_path}",
                           Ref(key="model.weights_path"), hint="model.files.include must select the weights")

        def reader(path: str) -> Callable[[int, int], bytes]:
            url = hub.resolve_url(endpoint, m.id, rev.commit, path)

            def read(offset: int, n: int) -> bytes:
                rng = {"Range": f"bytes={offset}-{offset + n - 1}"}
                with c.stream("GET", url, headers={**headers, **rng}) as resp:
                    _raise_for(resp, m.id, m.revision, endpoint, token, path)
                    skip = offset if resp.status_code == 200 else 0  # a server that ignores Range: read up to n
                    buf = bytearray()
                    for chunk in resp.iter_bytes():
                        buf += chunk
                        if len(buf) >= skip + n:
                            break
                    return bytes(buf[skip:skip + n])
            return read

        tensors: list[Any] = []
        meta = None
        for f in files:
            read = reader(f.path)
            if kind == "gguf":
                mt, t = modelhead.read_gguf(read)
                meta = meta or mt
            else:
                first = read(0, HEADER_FIRST_BYTES)
                n = modelhead.safetensors_header_len(first)
                raw = first[8:8 + n] if len(first) >= 8 + n else read(8, n)
                t = modelhead.parse_safetensors_header(raw)
            tensors.extend(t)
        config = None
        if kind == "safetensors":
            cfg = next((f for f in rev.files if posixpath.basename(f.path) == "config.json"
                        and posixpath.dirname(f.path) == posixpath.dirname(files[0].path)), None)
            if cfg is not None:
                resp = c.get(hub.resolve_url(endpoint, m.id, rev.commit, cfg.path), headers=headers)
                _raise_for(resp, m.id, m.revision, endpoint, token, cfg.path)
                try:
                    config = json.loads(resp.content)
                except ValueError as exc:
                    raise modelhead.NotAModel(f"{cfg.path} is not JSON: {exc}") from None
    except modelhead.NotAModel as exc:
        raise HubError(f"{m.id}@{m.revision}: {exc}", Ref(key="model.id"), hint="sparkctl reads safetensors and GGUF")
    except httpx.HTTPError as exc:
        raise HubError(f"{endpoint}: {type(exc).__name__}: {exc}", Ref(key="model.id"),
                       hint="this machine reads the headers from the Hub: it needs HTTPS to it (or HF_ENDPOINT)")
    finally:
        if own:
            c.close()
    return {"kind": kind, "path": f"{m.id}@{rev.commit[:12]}", "files": [[f.path, f.size] for f in files],
            "config": config, "meta": meta, "tensors": modelhead.group(tensors)}
