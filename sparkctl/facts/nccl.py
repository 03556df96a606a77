"""The NCCL the profile's engine will load: its version, read inside the image or the engine's interpreter.

What this module owns: the :class:`~sparkctl.facts.registry.Fact` ``nccl`` and
its pure parser. The command asks PyTorch, which reports the NCCL it is linked
against (``torch.cuda.nccl.version()``, a tuple; no GPU needed): for docker a
one-shot ``docker run --rm --entrypoint python3 IMAGE -c ...`` (no network, no
GPU), for a native ``python3 -m MOD`` engine that interpreter. When torch is not
there (a C++ engine in an image), the fallback is the library's file name
``libnccl.so.2.X.Y`` under the usual library directories (``ldconfig -p``
output and ``strings`` are fragile; the file name is what the NCCL packages
install). It must not run anything.

Output: ``torch 2.30.7`` or ``lib 2.30.7``. Exit codes: 3 the image is not on
the node, 4 no NCCL found (neither torch nor the library: the engine does not
use NCCL, or hides it), 127 docker or the interpreter missing.
"""

from __future__ import annotations

import re

from sparkctl.facts.registry import (
    NOT_FOUND,
    ExitCode,
    Fact,
    ProbeParseError,
    ScriptContext,
    one_line,
    q,
)
from sparkctl.model.paths import NCCL_CACHE_DIR, under

NO_IMAGE_RC = 3
NO_NCCL_RC = 4
TORCH_CALL = 'import torch;print(".".join(map(str, torch.cuda.nccl.version())))'
# Debian/Ubuntu's libnccl2 and NVIDIA's CUDA images install libnccl.so.2.X.Y here.
LIB_FIND = ("for f in /usr/lib/*-linux-gnu/libnccl.so.2.*.* /usr/lib/libnccl.so.2.*.* /usr/local/lib/libnccl.so.2.*.* "
            "/usr/local/cuda/lib64/libnccl.so.2.*.* /opt/*/lib/libnccl.so.2.*.*; do "
            '[ -e "$f" ] && { echo "${f##*libnccl.so.}"; exit 0; }; done; exit 1')
VERSION = re.compile(r"(torch|lib) (\d+)\.(\d+)\.(\d+)")


def parse_nccl(text: str) -> tuple[int, int, int]:
    """``torch 2.30.7`` -> (2, 30, 7)."""
    line = one_line("nccl", text, "python3 -c 'import torch ...'")
    m = VERSION.fullmatch(line)
    if not m:
        raise ProbeParseError("nccl", f"not an NCCL version: {line[:80]!r}", "torch.cuda.nccl.version()")
    return int(m.group(2)), int(m.group(3)), int(m.group(4))


def _command(ctx: ScriptContext, _item: str) -> str:
    e = ctx.engine
    assert e is not None
    if e.runtime == "docker":
        img = q(e.ref)
        run = "docker run --rm --network none --entrypoint"
        # An image ID never changes its NCCL: the answer is kept per image ID on the node, so
        # only the first check after a new image pays for a container start (seconds on a Spark).
        cache = q(under(ctx.node.prefix, NCCL_CACHE_DIR))
        keep = (f'mkdir -p {cache} 2>/dev/null && printf "%s\\n" "$a" > {cache}/"$id.tmp" 2>/dev/null && '
                f'mv -f {cache}/"$id.tmp" {cache}/"$id" 2>/dev/null; echo "$a"; exit 0; ')
        return ("have docker || exit 127; "
                f"id=$(docker image inspect --format '{{{{.Id}}}}' {img} 2>/dev/null) || exit {NO_IMAGE_RC}; "
                'id=${id#sha256:}; '
                f'[ -s {cache}/"$id" ] && {{ cat {cache}/"$id"; exit 0; }}; '
                f"v=$({run} python3 {img} -c {q(TORCH_CALL)} 2>/dev/null) && [ -n \"$v\" ] && "
                '{ a="torch $v"; ' + keep + '}; '
                f"v=$({run} sh {img} -c {q(LIB_FIND)} 2>/dev/null) && [ -n \"$v\" ] && "
                '{ a="lib $v"; ' + keep + '}; '
                f"exit {NO_NCCL_RC}")
    py = q(e.ref)
    return (f"command -v {py} >/dev/null || exit 127; "
            f"v=$({py} -c {q(TORCH_CALL)} 2>/dev/null) && [ -n \"$v\" ] && "
            '{ echo "torch $v"; exit 0; }; '
            f"v=$(sh -c {q(LIB_FIND)}) && {{ echo \"lib $v\"; exit 0; }}; exit {NO_NCCL_RC}")


def _wanted(ctx: ScriptContext) -> bool:
    # a native engine that is not `python3 -m MOD` (llama.cpp's server) has no torch to ask
    e = ctx.engine
    return e is not None and (e.runtime == "docker" or bool(e.module))


NCCL = Fact(
    "nccl", "the engine's NCCL (torch.cuda.nccl.version())", _command, parse_nccl,
    exit_codes=(NOT_FOUND,
                ExitCode(NO_IMAGE_RC, "absent", value=None),
                ExitCode(NO_NCCL_RC, "absent", value=()),),
    core=False, when=_wanted,
)
