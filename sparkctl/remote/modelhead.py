"""Read a model's shape from its own files' headers, never its weights (standard library only).

Runs on a node (the ``model_files`` fact sends this file's code, without its docstrings, as
``python3 -c``: the code has no backslash and no ``>``, as the probe scripts' tests require) and on the operator's machine
(``sparkctl fit --hub`` feeds the same parsers bytes fetched with HTTP Range).

* safetensors (safetensors docs, "Format"): an 8-byte little-endian header length
  N, then N bytes of JSON: ``{name: {dtype, shape, data_offsets}, "__metadata__": ...}``.
  Only those 8 + N bytes are read.
* GGUF (ggml-org/ggml docs/gguf.md, v2/v3): magic ``GGUF``, version u32, tensor count
  u64, metadata count u64, the metadata key/values, then per tensor its name, dims
  (u64 each), ggml type (u32) and offset. Read up to the end of the tensor infos.
* ``config.json`` beside safetensors shards is read whole (kilobytes).

Output (one JSON line): ``{"kind", "path", "files": [[name, size]], "config",
"meta", "tensors": [[pattern, dtype, shape, count]]}`` where ``pattern`` is the
tensor name with each run of digits replaced by ``#`` (layer and expert indices),
so a model of 90,000 tensors prints a few dozen groups. GGUF dtypes are
``gguf:<ggml type number>``; GGUF metadata keeps scalars, strings up to 200
characters and numeric arrays up to 512 items (a tokenizer's arrays become
``{"array": TYPE, "len": N}``).

Exit codes (``main``): 0 read; 3 nothing at the path; 4 not a format this reads.
"""

from __future__ import annotations  # the annotations are never evaluated: valid on a node's Python 3.8

import json
import os
import re
import struct
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2.5 ms of the node's start; mypy reads the name)

if TYPE_CHECKING:  # names for the checker only: the node's python3 -S never imports typing's aliases
    from collections.abc import Callable, Iterable
    from typing import Any, Union

    Read = Callable[[int, int], bytes]  # read(offset, n): up to n bytes at offset (fewer at the end of the file)
    Tensor = tuple[str, str, list[int]]  # (name, dtype, shape)
    Group = list[Union[str, int, list[int]]]  # [pattern, dtype, shape, count]
    Scalar = Union[int, float, bool]
    # a GGUF metadata value: a scalar, a string, an array of values, or what stands for one left out
    Value = Union[Scalar, str, list["Value"], dict[str, Union[int, str]], None]

GGUF_MAGIC = b"GGUF"
SAFETENSORS_MAX_HEADER = 100_000_000  # huggingface_hub refuses more than 25 MB; a guard against garbage
NO_MODEL_RC = 3
NOT_A_MODEL_RC = 4


class NeedMore(Exception):
    """The bytes given end before the header does."""


class NotAModel(Exception):
    """The bytes are not a header this module reads."""


def pattern_of(name: str) -> str:
    return re.sub("[0-9]+", "#", name)


def group(tensors: Iterable[Tensor]) -> list[Group]:
    """[(name, dtype, shape)] -> [[pattern, dtype, shape, count]] in first-seen order."""
    out: dict[tuple[str, str, tuple[int, ...]], int] = {}
    for name, dtype, shape in tensors:
        key = (pattern_of(name), dtype, tuple(shape))
        out[key] = out.get(key, 0) + 1
    return [[p, d, list(s), n] for (p, d, s), n in out.items()]


# ------------------------------------------------------------------ safetensors


def safetensors_header_len(first8: bytes) -> int:
    if len(first8) < 8:
        raise NeedMore()
    n: int = struct.unpack("<Q", first8[:8])[0]
    if n < 2 or SAFETENSORS_MAX_HEADER < n:
        raise NotAModel("safetensors header length %d is not plausible" % n)
    return n


def parse_safetensors_header(raw: bytes) -> list[Tensor]:
    """The JSON header's bytes -> [(name, dtype, shape)]."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise NotAModel("safetensors header is not JSON: %s" % exc)
    if not isinstance(doc, dict):
        raise NotAModel("safetensors header is not a JSON object")
    out: list[Tensor] = []
    for name, t in doc.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or not isinstance(t.get("dtype"), str) or not isinstance(t.get("shape"), list):
            raise NotAModel("safetensors tensor %r has no dtype and shape" % name[:80])
        out.append((name, t["dtype"], [int(d) for d in t["shape"]]))
    return out


def read_safetensors(read: Read) -> list[Tensor]:
    """``read(offset, n) -> bytes`` (may return fewer at the end of the file)."""
    n = safetensors_header_len(read(0, 8))
    raw = read(8, n)
    if len(raw) < n:
        raise NotAModel("file ends inside its safetensors header")
    return parse_safetensors_header(raw)


# ------------------------------------------------------------------ GGUF

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
KEEP_STR = 200
KEEP_ARRAY = 512  # per-layer arrays (heads per layer) fit; a tokenizer's do not


class _Cursor:
    def __init__(self, read: Read) -> None:
        self.read, self.pos, self.buf, self.buf_at = read, 0, b"", 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if self.pos < self.buf_at or self.buf_at + len(self.buf) < end:
            want = max(n, 1 << 20, len(self.buf) * 2)
            self.buf, self.buf_at = self.read(self.pos, want), self.pos
            if len(self.buf) < n:
                raise NotAModel("file ends inside its GGUF header (at byte %d)" % self.pos)
        i = self.pos - self.buf_at
        self.pos = end
        return self.buf[i:i + n]

    def scalar(self, fmt: str) -> Scalar:
        v: Scalar = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return v

    def u(self, fmt: str) -> int:
        """An unsigned integer (fmt one of the u32 / u64 formats)."""
        return int(self.scalar(fmt))

    def string(self) -> str:
        n = self.u("<Q")
        if (1 << 30) < n:
            raise NotAModel("a GGUF string of %d bytes" % n)
        return self.take(n).decode("utf-8", "replace")

    def value(self, vtype: int) -> Value:
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            itype, count = self.u("<I"), self.u("<Q")
            keep = itype in _SCALAR and count <= KEEP_ARRAY
            if keep:
                return [self.value(itype) for _ in range(count)]
            self._skip(itype, count)
            return {"array": itype, "len": count}
        raise NotAModel("unknown GGUF value type %d" % vtype)

    def _skip(self, itype: int, count: int) -> None:
        if itype in _SCALAR:
            self.take(struct.calcsize(_SCALAR[itype]) * count)
        else:
            for _ in range(count):
                self.value(itype)


def read_gguf(read: Read) -> tuple[dict[str, Value], list[Tensor]]:
    """-> (metadata, [(name, "gguf:TYPE", dims)]) reading only up to the end of the tensor infos."""
    c = _Cursor(read)
    if c.take(4) != GGUF_MAGIC:
        raise NotAModel("no GGUF magic")
    version = c.u("<I")
    if version not in (2, 3):
        raise NotAModel("GGUF version %d" % version)
    n_tensors, n_kv = c.u("<Q"), c.u("<Q")
    if 10_000_000 < max(n_tensors, n_kv):
        raise NotAModel("implausible GGUF counts")
    meta: dict[str, Value] = {}
    for _ in range(n_kv):
        key = c.string()
        v = c.value(c.u("<I"))
        if isinstance(v, str) and KEEP_STR < len(v):
            v = {"str": len(v)}
        elif isinstance(v, list) and key.startswith("tokenizer."):
            v = {"array": "kept", "len": len(v)}
        meta[key] = v
    tensors: list[Tensor] = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.u("<Q") for _ in range(c.u("<I"))]
        ttype = c.u("<I")
        c.u("<Q")
        tensors.append((name, "gguf:%d" % ttype, dims))
    meta["gguf.version"] = version
    return meta, tensors


# ------------------------------------------------------------------ files on a disk


def _file_reader(path: str) -> Read:
    def read(offset: int, n: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(n)
    return read


def _is_gguf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def read_path(path: str) -> dict[str, Any] | None:
    """The document for a GGUF file, a safetensors file, or a directory of shards (+ config.json)."""
    if os.path.isfile(path):
        files = [path]
        cfg_dir = os.path.dirname(path)
    elif os.path.isdir(path):
        names = sorted(os.listdir(path))
        files = [os.path.join(path, n) for n in names if n.endswith(".safetensors")]
        if not files:
            files = [os.path.join(path, n) for n in names if n.endswith(".gguf")]
        cfg_dir = path
    else:
        return None
    if not files:
        raise NotAModel("no *.safetensors or *.gguf file in %s" % path)
    kind = "gguf" if _is_gguf(files[0]) else "safetensors"
    tensors: list[Tensor] = []
    meta: dict[str, Value] | None = None
    config: Any = None  # config.json as it is: the reader keeps whatever JSON the file holds
    for f in files:
        if kind == "gguf":
            m, t = read_gguf(_file_reader(f))
            meta = meta or m
        else:
            t = read_safetensors(_file_reader(f))
        tensors.extend(t)
    cfg = os.path.join(cfg_dir, "config.json")
    if kind == "safetensors" and os.path.isfile(cfg):
        with open(cfg, "rb") as fh:
            try:
                config = json.loads(fh.read(4_000_000).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise NotAModel("config.json is not JSON: %s" % exc)
    return {"kind": kind, "path": path, "files": [[os.path.basename(f), os.path.getsize(f)] for f in files],
            "config": config, "meta": meta, "tensors": group(tensors)}


def main(argv: list[str]) -> int:
    try:
        doc = read_path(argv[0])
    except NotAModel as exc:
        sys.stdout.write("not a model: %s" % exc)
        return NOT_A_MODEL_RC
    except OSError as exc:
        sys.stdout.write("not a model: %s" % exc)
        return NOT_A_MODEL_RC
    if doc is None:
        return NO_MODEL_RC
    sys.stdout.write(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
