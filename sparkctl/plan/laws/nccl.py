"""The nccl_version law: on a ring, the NCCL the engine loads knows subnet-aware routing.

The rendered ring environment (templates/engine.env.j2) sets
NCCL_IB_SUBNET_AWARE_ROUTING=1; the variable exists from NCCL 2.30.7 (NCCL
release notes, https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-30-7.html;
issue #13). An older NCCL ignores an unknown NCCL_* variable silently (NCCL reads
its parameters by name with ncclGetEnv: nothing enumerates or rejects the
environment), and the ring's collectives time out across non-neighbour subnets.
Pure: a verdict from the ``nccl`` fact (sparkctl.facts.nccl): the version of the
library mapped into the engine's process, named in the verdict with what torch
was built against (``torch.cuda.nccl.version()`` is only the latter, pytorch
torch/csrc/cuda/nccl.cpp).
"""

from __future__ import annotations

from sparkctl.plan.laws.base import FAIL, OK, SKIP, WAIVED, WARN, Context, Verdict, each
from sparkctl.plan.laws.images import engine_target

MIN_RING_NCCL = (2, 30, 7)
LAW = "nccl_version"


def _v(t: tuple[int, ...]) -> str:
    return ".".join(map(str, t))


def _seen(f: object, v: tuple[int, ...]) -> str:
    """``NCCL 2.30.7 (loaded /usr/lib/.../libnccl.so.2.30.7; torch built against 2.27.5)``."""
    lib = getattr(f, "nccl_library", None)
    torch = getattr(f, "nccl_torch", None)
    if lib:
        return f"NCCL {_v(v)} (loaded {lib}" + (f"; torch built against {_v(torch)})" if torch else ")")
    if torch:
        return f"NCCL {_v(v)} (torch's own: no libnccl mapped into the process)"
    return f"NCCL {_v(v)}"


def check_nccl_version(ctx: Context) -> list[Verdict]:
    p = ctx.profile
    want = f">= {_v(MIN_RING_NCCL)}"
    if ctx.inventory.topology == "switch":  # ring-only: a switch puts every rank on one subnet per port group
        return [Verdict(LAW, n, SKIP, f"switched cluster ({ctx.inventory.switch_name})",
                        "ring only: behind a switch every rank is on each port group's subnet, no relay, "
                        "no subnet-aware routing") for n in ctx.nodes]
    if p.topology.layout != "ring":
        return [Verdict(LAW, n, OK, f"layout {p.topology.layout}", "any (subnet-aware routing is a ring setting)")
                for n in ctx.nodes]
    runtime, _ref, module = engine_target(p)
    if runtime == "native" and not module:  # a C++ server (llama.cpp): no interpreter to ask
        return [Verdict(LAW, n, OK, "native executable: not read", want) for n in ctx.nodes]
    out: list[Verdict] = []
    for node, f in each(ctx, LAW, "nccl", out):
        v = getattr(f, "nccl_version", None)
        if "nccl" in getattr(f, "not_available", {}):
            out.append(Verdict(LAW, node, WARN, "cannot ask: " + f.not_available["nccl"], want,
                               "install docker / the engine's interpreter on " + node))
        elif v is None:
            out.append(Verdict(LAW, node, WARN, "not read (the image or interpreter is not on the node)", want,
                               "see engine_present; check again once the image is there"))
        elif v == ():
            out.append(Verdict(LAW, node, WARN, "no NCCL found (neither torch nor libnccl.so.2.X.Y)", want,
                               "cannot confirm the ring's NCCL: check the engine's log for 'NCCL version'"))
        elif tuple(v) < MIN_RING_NCCL and LAW in ctx.waivers:
            out.append(Verdict(LAW, node, WAIVED, _seen(f, v), want,
                               f"waived: {ctx.waivers[LAW].reason} (expect the ring's first collective to time out)"))
        elif tuple(v) < MIN_RING_NCCL:
            out.append(Verdict(
                LAW, node, FAIL, _seen(f, v), want,
                f"NCCL {_v(v)}{' (' + f.nccl_library + ')' if getattr(f, 'nccl_library', None) else ''} ignores "
                "NCCL_IB_SUBNET_AWARE_ROUTING silently and the ring's collectives time out: "
                f"use an image (or environment) whose NCCL is {want}, e.g. `pip install 'nvidia-nccl-cu13>={_v(MIN_RING_NCCL)}'` "
                "in the image, then `sparkctl image sync`"))
        else:
            out.append(Verdict(LAW, node, OK, _seen(f, v), want))
    return out
