"""The memory_fit law: the profile's model, context and concurrency fit each node's memory before anything starts.

Pure: reads the ``model_files`` fact (the model's own headers, read on the node)
and ``meminfo``, computes with :mod:`sparkctl.model.memfit`. Nothing here touches
a host. ``sparkctl fit PROFILE`` prints the same figures (and can read the headers
from the Hub when the node does not have the files yet).
"""

from __future__ import annotations

from typing import Any

from sparkctl.model import memfit
from sparkctl.model.schema import Profile
from sparkctl.plan.laws.base import FAIL, OK, SKIP, WARN, Context, Verdict, each

LAW = "memory_fit"
EXPECTED = "what the engine holds (+ laws.min_free_gib without a fraction) <= MemAvailable"


def engine_args(p: Profile) -> list[str]:
    """The engine flags the arithmetic reads: the profile's args plus what render always adds
    (llama-server: --kv-unified, sparkctl.plan.render.engine_argv)."""
    args = list(p.engine.args)
    if p.engine.name == "llamacpp" and "llama_cpp.server" not in (p.engine.binary or ""):
        args.append("--kv-unified")
    return args


def fit_for(p: Profile, shape: memfit.ModelShape, node: memfit.NodeMemory) -> memfit.Fit:
    # a pipeline stage holds about 1/pp_size of the layers: its weights and KV cache per rank shrink
    # with pp as with tp (an approximation: KV heads fewer than tp x pp count as replicated)
    ranks = p.topology.tp_size * p.topology.pp_size
    return memfit.fit(shape, engine=p.engine.name, tp=ranks, context_tokens=p.model.context_len_tokens,
                      args=engine_args(p), utilization=p.laws.gpu_memory_utilization,
                      min_free_gib=p.laws.min_free_gib, node=node, binary=p.engine.binary or "")


def node_memory(f: Any) -> memfit.NodeMemory:
    return memfit.NodeMemory(f.mem_total_kib * 1024, f.mem_available_kib * 1024, bool(getattr(f, "engines", None)))


def remedy_text(p: Profile, fit: memfit.Fit) -> str:
    per_tok = memfit.gib(fit.kv_bytes_per_token * 1024)
    more = "more ranks (topology.tp_size)" if p.engine.name != "llamacpp" else "a smaller quantization"
    return (f"lower model.context_len_tokens (KV {per_tok} per 1024 tokens per rank), the concurrency "
            f"({fit.concurrency_source}), or laws.gpu_memory_utilization; or use {more}. "
            f"`sparkctl fit {{profile}}` prints every figure")


def check_memory_fit(ctx: Context) -> list[Verdict]:
    p = ctx.profile
    out: list[Verdict] = []
    for node, f in each(ctx, LAW, "meminfo", out):
        why = getattr(f, "unreadable", {}).get("model_files") or getattr(f, "not_available", {}).get("model_files")
        if why:
            out.append(Verdict(LAW, node, WARN, "model headers unreadable", EXPECTED, why))
            continue
        mf = getattr(f, "model_files", None)
        if mf is None:
            out.append(Verdict(LAW, node, SKIP, f"nothing at {p.model.weights_path}", EXPECTED,
                               f"`sparkctl fit {ctx.profile_name} --hub` reads the model's headers from the Hub"))
            continue
        if f.mem_total_kib is None or f.mem_available_kib is None:
            out.append(Verdict(LAW, node, SKIP, "MemTotal/MemAvailable not read", EXPECTED))
            continue
        try:
            fit = fit_for(p, memfit.shape_from_doc(mf.doc), node_memory(f))
        except memfit.FitError as exc:
            out.append(Verdict(LAW, node, WARN, f"cannot size the model: {exc}", EXPECTED,
                               "sparkctl reads config.json and the safetensors or GGUF headers"))
            continue
        seen = memfit.summary(fit)
        floor = f" + {memfit.gib(fit.min_free_bytes)} free" if fit.budget_bytes is None else ""
        want = (f"{memfit.gib(fit.committed_bytes)}{floor} <= "
                + ("MemTotal " if fit.node.engine_running else "MemAvailable ")
                + memfit.gib(fit.node.total_bytes if fit.node.engine_running else fit.node.available_bytes))
        if fit.ok:
            out.append(Verdict(LAW, node, OK, seen, want))
        else:
            out.append(Verdict(LAW, node, FAIL, f"{seen}; " + "; ".join(fit.problems), want,
                               remedy_text(p, fit).replace("{profile}", ctx.profile_name)))
    return out
