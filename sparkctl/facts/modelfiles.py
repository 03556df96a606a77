"""The model's own headers on a node: config.json and every tensor's dtype and shape, not its weights.

What this module owns: the :class:`~sparkctl.facts.registry.Fact` ``model_files``
and its pure parser. Its command runs :mod:`sparkctl.remote.modelhead` (standard
library only; its code without docstrings: no backslash, as the batch script carries none) as ``python3 -c``
against the profile's weights path under the node's prefix: it reads the 8-byte
length and the JSON header of each safetensors shard, or a GGUF's metadata and
tensor infos, and prints one JSON document (kilobytes, tensors grouped by name
pattern). The memory_fit law and ``sparkctl fit`` compute with it
(:mod:`sparkctl.model.memfit`). It must not run anything.

Exit codes: 3 nothing at the weights path (not fetched yet): absent, None;
4 something there that is not a model this reads: unreadable, with the reader's reason.
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sparkctl.facts.registry import NOT_FOUND, ExitCode, Fact, ProbeParseError, ScriptContext, q
from sparkctl.model.paths import under

TOOL = "python3 -c modelhead.py"


@functools.cache
def reader_source() -> str:
    """The code of sparkctl/remote/modelhead.py as the node runs it: its docstrings and comments
    left out (``ast.unparse``), so prose never reaches the shell."""
    tree = ast.parse(resources.files("sparkctl.remote").joinpath("modelhead.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@dataclass(frozen=True)
class ModelFiles:
    """What ``modelhead.read_path`` printed: kind, path, files, config, meta, grouped tensors."""

    doc: Any  # the JSON document (a dict); kept whole for sparkctl.model.memfit.shape_from_doc

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def disk_bytes(self) -> int:
        return sum(int(size) for _, size in self.doc.get("files", []))


def parse_model_files(text: str) -> ModelFiles:
    if text.startswith("not a model: "):  # the reader's exit 4: something there it cannot read, and why
        raise ProbeParseError("model files", text.strip()[:300], TOOL)
    try:
        doc = json.loads(text.strip())
    except (ValueError, RecursionError):
        raise ProbeParseError("model files", f"not JSON: {text.strip()[:80]!r}", TOOL) from None
    if not isinstance(doc, dict) or doc.get("kind") not in ("safetensors", "gguf") \
            or not isinstance(doc.get("tensors"), list) or not isinstance(doc.get("files"), list):
        raise ProbeParseError("model files", "not a model header document", TOOL)
    return ModelFiles(doc)


def _command(ctx: ScriptContext, _item: str) -> str:
    # nothing at the path (neither a file nor a directory, as read_path tells them): exit 3 as the
    # reader would, without starting an interpreter to learn it
    path = q(under(ctx.node.prefix, ctx.weights_path or "/"))
    return (f"[ -f {path} ] || [ -d {path} ] || exit 3; "
            f"have python3 || exit 127; python3 -S -c {q(reader_source())} {path}")


# 3: nothing at the path (the weights are not there yet); 4: not a model (the reader says why).
MODEL_FILES = Fact(
    "model_files", "the model's headers (config.json, safetensors / GGUF tensor infos)", _command,
    parse_model_files, core=False, when=lambda c: c.weights_path is not None,
    exit_codes=(NOT_FOUND, ExitCode(3, "absent", "nothing at the weights path", value=None)),
)
