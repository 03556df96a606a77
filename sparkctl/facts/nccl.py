"""The NCCL the profile's engine will load: the library mapped into the process, and its version.

What this module owns: the :class:`~sparkctl.facts.registry.Fact` ``nccl`` and
its pure parser. It must not run anything.

``torch.cuda.nccl.version()`` is not the answer: it is the NCCL torch was
compiled against, the nccl.h macros (pytorch ``torch/csrc/cuda/nccl.cpp``
``version()``: ``NCCL_MAJOR << 32 | NCCL_MINOR << 16 | NCCL_PATCH``), whatever
library the process loads. The community's sm_121 vLLM image builds NCCL from
source and points torch's ``libnccl.so.2`` at it (eugr/spark-vllm-docker, issue
#18): torch says 2.27, the process runs 2.30. So the command imports torch in the
engine's own Python (which maps the ``libnccl.so.2`` torch links), finds the
library in ``/proc/self/maps`` and asks it with ctypes ``ncclGetVersion`` (NVIDIA/nccl
``src/init.cc``; the code decoded as nccl.h.in ``NCCL_VERSION`` and torch's
``getNcclVersion`` do: ``X*10000+Y*100+Z`` from 2.9). For docker that Python runs
in a one-shot ``docker run --rm --network none --entrypoint python3 IMAGE -c ...``
(no network, no GPU), for a native ``python3 -m MOD`` engine it is that
interpreter. When torch is not there (a C++ engine in an image), the fallback is
the library's file name ``libnccl.so.2.X.Y`` under the usual library directories
(``ldconfig -p`` output and ``strings`` are fragile; the file name is what the
NCCL packages install).

Output: ``torch 2.27.5`` (what torch was built against) then ``loaded 2.30.7
/path/libnccl.so.2.30.7`` for each NCCL library mapped (``loaded unknown PATH``
when it does not answer); ``torch X`` alone when none is mapped (a static NCCL);
``lib 2.30.7`` for the file-name fallback. Exit codes: 3 the image is not on the
node, 4 no NCCL found (neither torch nor the library: the engine does not use
NCCL, or hides it), 127 docker or the interpreter missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.facts.registry import (
    NOT_FOUND,
    ExitCode,
    Fact,
    ProbeParseError,
    ScriptContext,
    lines,
    q,
)
from sparkctl.model.paths import NCCL_CACHE_DIR, under

NO_IMAGE_RC = 3
NO_NCCL_RC = 4
# Runs in the engine's Python: what torch was built against, then every libnccl mapped into the
# process after `import torch`, asked for its version (no backslash: the batch script has none).
TORCH_CALL = """import ctypes, os, torch
print("torch " + ".".join(map(str, torch.cuda.nccl.version())))
seen = []
for ln in open("/proc/self/maps"):
    f = ln.split(None, 5)
    if len(f) == 6 and os.path.basename(f[5].strip()).startswith("libnccl.so") and f[5].strip() not in seen:
        seen.append(f[5].strip())
for p in seen:
    try:
        v = ctypes.c_int(0)
        rc = ctypes.CDLL(p).ncclGetVersion(ctypes.byref(v))
        c = v.value
        d = 10000 if c >= 10000 else 1000
        print("loaded %d.%d.%d %s" % (c // d, (c % d) // 100, c % 100, p) if rc == 0 else "loaded unknown " + p)
    except (OSError, AttributeError):
        print("loaded unknown " + p)
"""
# Debian/Ubuntu's libnccl2 and NVIDIA's CUDA images install libnccl.so.2.X.Y here.
LIB_FIND = ("for f in /usr/lib/*-linux-gnu/libnccl.so.2.*.* /usr/lib/libnccl.so.2.*.* /usr/local/lib/libnccl.so.2.*.* "
            "/usr/local/cuda/lib64/libnccl.so.2.*.* /opt/*/lib/libnccl.so.2.*.*; do "
            '[ -e "$f" ] && { echo "${f##*libnccl.so.}"; exit 0; }; done; exit 1')
_TORCH = re.compile(r"torch (\d+)\.(\d+)\.(\d+)")
_LIB = re.compile(r"lib (\d+)\.(\d+)\.(\d+)")
_LOADED = re.compile(r"loaded (?:(\d+)\.(\d+)\.(\d+)|unknown) (/\S.*)")


@dataclass(frozen=True)
class NcclReading:
    """What the engine's process runs: ``version`` (the loaded library's, else torch's own, else the
    file name's), ``library`` (the path of the library it was read from; None: no library answered),
    ``torch`` (what torch was built against; None: no torch), ``how`` (loaded | torch | lib)."""

    version: tuple[int, int, int]
    library: str | None = None
    torch: tuple[int, int, int] | None = None
    how: str = "loaded"


def _t(m: re.Match[str]) -> tuple[int, int, int]:
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def parse_nccl(text: str) -> NcclReading:
    """``torch 2.27.5`` + ``loaded 2.30.7 /path`` lines -> the loaded library's version (the lowest
    when several are mapped); ``torch X`` alone -> torch's; ``lib X`` -> the file name's."""
    got = [ln.strip() for ln in lines(text)]
    tool = "python3 -c 'import torch ...' (/proc/self/maps, ncclGetVersion)"
    if not got:
        raise ProbeParseError("nccl", "no output", tool)
    if len(got) == 1 and (m := _LIB.fullmatch(got[0])):
        return NcclReading(_t(m), how="lib")
    m = _TORCH.fullmatch(got[0])
    if not m:
        raise ProbeParseError("nccl", f"not an NCCL version: {got[0][:80]!r}", "torch.cuda.nccl.version()")
    torch = _t(m)
    loaded: list[tuple[tuple[int, int, int], str]] = []
    unknown: list[str] = []
    for ln in got[1:]:
        lm = _LOADED.fullmatch(ln)
        if not lm:
            raise ProbeParseError("nccl", f"not a loaded library: {ln[:80]!r}", tool)
        if lm.group(1) is None:
            unknown.append(lm.group(4))
        else:
            loaded.append((_t(lm), lm.group(4)))
    if loaded:
        v, path = min(loaded)
        return NcclReading(v, path, torch, "loaded")
    if unknown:
        raise ProbeParseError("nccl", f"{unknown[0]} is mapped but does not answer ncclGetVersion", tool)
    return NcclReading(torch, None, torch, "torch")


def _command(ctx: ScriptContext, _item: str) -> str:
    e = ctx.engine
    assert e is not None
    if e.runtime == "docker":
        img = q(e.ref)
        run = "docker run --rm --network none --entrypoint"
        # An image ID never changes its NCCL: the answer is kept per image ID on the node, so
        # only the first check after a new image pays for a container start (seconds on a Spark).
        # `ID.loaded`: answers that name the loaded library (a bare `ID` held torch's compiled-in
        # version only, from before, and is not trusted).
        cache = q(under(ctx.node.prefix, NCCL_CACHE_DIR))
        keep = (f'mkdir -p {cache} 2>/dev/null && printf "%s\\n" "$a" > {cache}/"$id.tmp" 2>/dev/null && '
                f'mv -f {cache}/"$id.tmp" {cache}/"$id.loaded" 2>/dev/null; echo "$a"; exit 0; ')
        return ("have docker || exit 127; "
                f"id=$(docker image inspect --format '{{{{.Id}}}}' {img} 2>/dev/null) || exit {NO_IMAGE_RC}; "
                'id=${id#sha256:}; '
                f'[ -s {cache}/"$id.loaded" ] && {{ cat {cache}/"$id.loaded"; exit 0; }}; '
                f"v=$({run} python3 {img} -c {q(TORCH_CALL)} 2>/dev/null) && [ -n \"$v\" ] && "
                '{ a="$v"; ' + keep + '}; '
                f"v=$({run} sh {img} -c {q(LIB_FIND)} 2>/dev/null) && [ -n \"$v\" ] && "
                '{ a="lib $v"; ' + keep + '}; '
                f"exit {NO_NCCL_RC}")
    py = q(e.ref)
    return (f"command -v {py} >/dev/null || exit 127; "
            f"v=$({py} -c {q(TORCH_CALL)} 2>/dev/null) && [ -n \"$v\" ] && "
            '{ echo "$v"; exit 0; }; '
            f"v=$(sh -c {q(LIB_FIND)}) && {{ echo \"lib $v\"; exit 0; }}; exit {NO_NCCL_RC}")


def _wanted(ctx: ScriptContext) -> bool:
    # a native engine that is not `python3 -m MOD` (llama.cpp's server) has no torch to ask
    e = ctx.engine
    return e is not None and (e.runtime == "docker" or bool(e.module))


NCCL = Fact(
    "nccl", "the engine's NCCL (the libnccl mapped after import torch)", _command, parse_nccl,
    exit_codes=(NOT_FOUND,
                ExitCode(NO_IMAGE_RC, "absent", value=None),
                ExitCode(NO_NCCL_RC, "absent", value=()),),
    core=False, when=_wanted,
)
