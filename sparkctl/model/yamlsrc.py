"""YAML with provenance: plain data plus the line of every key.

PyYAML's composer keeps marks on every node; we walk the node tree ourselves
(with the safe scalar resolver) so each value's key path maps to its line.
Duplicate keys, which PyYAML silently overwrites, are errors here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparkctl.errors import ConfigError, Ref

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Located:
    """Data loaded from one YAML document, with the line of each key path."""

    data: Any
    file: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path`` or of its closest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), None)

    def ref(self, path: KeyPath) -> Ref:
        return Ref(file=self.file, line=self.line(path), key=dotted(path) or None)


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


class _Loader(yaml.SafeLoader):
    pass


def _construct(loader: _Loader, node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise ConfigError(
                    f"mapping keys must be plain scalars, got {type(key).__name__}",
                    Ref(file=file, line=knode.start_mark.line + 1, key=dotted(path) or None),
                )
            key = str(key)
            if key in out:
                raise ConfigError(
                    f"duplicate key {key!r}",
                    Ref(file=file, line=knode.start_mark.line + 1, key=dotted(path + (key,))),
                    hint="YAML keeps only the last one; remove one of them",
                )
            lines[path + (key,)] = knode.start_mark.line + 1
            out[key] = _construct(loader, vnode, path + (key,), lines, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, path + (i,), lines, file) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def loads(text: str, file: str) -> Located:
    """Parse one YAML document; an empty document is an empty mapping."""
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:  # e.g. a control character the reader refuses
        raise ConfigError(f"not valid YAML: {exc}".splitlines()[0], Ref(file=file),
                          hint="the file holds characters YAML does not allow") from None
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise ConfigError(
                f"not valid YAML: {exc.problem or exc.context}",
                Ref(file=file, line=(mark.line + 1) if mark else None),
                hint="check indentation and quoting on that line",
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"not valid YAML: {exc}", Ref(file=file)) from None
        lines: dict[KeyPath, int] = {}
        if node is None:
            return Located({}, file, {(): 1})
        try:
            data = _construct(loader, node, (), lines, file)
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            raise ConfigError(
                f"cannot read value: {exc.problem}",
                Ref(file=file, line=(mark.line + 1) if mark else None),
            ) from None
        return Located(data, file, lines)
    finally:
        loader.dispose()


def load(path: str | Path) -> Located:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"file not found: {p}", Ref(file=str(p))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", Ref(file=str(p))) from None
    if "\x00" in text:
        raise ConfigError("file contains a NUL byte", Ref(file=str(p)), hint="is this a YAML file?")
    return loads(text, str(p))


def pydantic_errors(exc: Any, ref_for: Any, error_cls: type[ConfigError]) -> ConfigError:
    """The first pydantic error as one sparkctl error at the right file:line:key.

    ``ref_for(path)`` maps a key path to a :class:`Ref`.
    """
    import difflib

    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and (p.startswith("function-after") or p == "[key]")))
    msg = err["msg"]
    hint = None
    if err["type"] == "extra_forbidden":
        parent_model = err.get("ctx", {}) or {}
        msg = f"unknown key {loc[-1]!r}"
        hint = "see docs/profile-schema.md for the keys this section accepts"
        del parent_model
    elif err["type"] == "missing":
        msg = f"required key {loc[-1]!r} is missing"
    elif err["type"] == "literal_error":
        msg = f"{msg}, got {err.get('input')!r}"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif err["type"] == "string_pattern_mismatch":
        from sparkctl.model.schema import PATTERN_HINTS

        allowed = PATTERN_HINTS.get(err.get("ctx", {}).get("pattern"), "see docs/profile-schema.md")
        msg = f"{str(err.get('input'))[:80]!r} is not allowed here"
        hint = f"allowed: {allowed}"
    if err["type"] == "extra_forbidden" and "_known" in err.get("ctx", {}):
        close = difflib.get_close_matches(str(loc[-1]), err["ctx"]["_known"], n=1)
        if close:
            hint = f"did you mean {close[0]!r}?"
    return error_cls(msg, ref_for(loc), hint)
