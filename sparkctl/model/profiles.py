"""Profiles: ``extends:`` chains, per-node overlays, ``--set``, and provenance.

A profile is resolved in layers, lowest first: the schema's defaults, each
ancestor named by ``extends:`` (farthest first), the profile itself, the
per-node overlays (``nodes: {NAME: ...}``) for one node, then ``--set KEY=VALUE``
from the command line. Each layer is flattened to dotted keys guided by the
schema, so unknown keys are caught with their file and line before pydantic
sees anything, and every resolved value keeps the chain of places that set it
(``sparkctl explain``).

Pure after loading the YAML files: no SSH, no sockets, no clock.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from sparkctl.errors import ProfileError, Ref, SparkctlError
from sparkctl.model.resources import Roots
from sparkctl.model.schema import (
    MERGED_DICTS,
    NAME_RE,
    PATTERN_HINTS,
    NodeOverlay,
    Profile,
)
from sparkctl.model.yamlsrc import KeyPath, Located, load, pydantic_errors

MAX_EXTENDS_DEPTH = 8


@dataclass(frozen=True)
class Source:
    kind: str  # default | profile | parent | node | cli
    file: str | None = None
    line: int | None = None
    detail: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file and self.line else (self.file or "")
        bits = [self.kind]
        if self.detail:
            bits.append(self.detail)
        if where:
            bits.append(where)
        return " ".join(bits)


@dataclass(frozen=True)
class Setting:
    value: Any
    source: Source


Flat = dict[tuple[str, ...], Setting]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _unwrap(tp: Any) -> Any:
    """``X | None`` -> X for sub-model detection."""
    if get_origin(tp) is not None and type(None) in get_args(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def _flatten(
    model: type[BaseModel], data: Any, path: tuple[str, ...], src: Located | None, srcpath: KeyPath,
    source: Source, out: Flat,
) -> None:
    def ref(p: KeyPath) -> Ref:
        return src.ref(p) if src else Ref(key=".".join(str(x) for x in p))

    if not isinstance(data, dict):
        raise ProfileError(
            f"expected a mapping for {'.'.join(path) or 'the profile'}, got {type(data).__name__}",
            ref(srcpath),
        )
    fields = model.model_fields
    for key, value in data.items():
        kpath = srcpath + (key,)
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            raise ProfileError(
                f"unknown key {key!r}" + (f" in {'.'.join(path)}" if path else ""),
                ref(kpath),
                hint=f"did you mean {close[0]!r}?" if close else f"keys here: {', '.join(fields)}",
            )
        line = src.line(kpath) if src else None
        here = Source(source.kind, source.file, line, source.detail)
        tp = _unwrap(fields[key].annotation)
        full = path + (key,)
        if _is_model(tp) and isinstance(value, dict):
            _flatten(tp, value, full, src, kpath, source, out)
        elif full in MERGED_DICTS and isinstance(value, dict):
            for k, v in value.items():
                line = src.line(kpath + (k,)) if src else None
                out[full + (str(k),)] = Setting(v, Source(source.kind, source.file, line, source.detail))
            if not value:
                out.setdefault(full, Setting({}, here))
        else:
            out[full] = Setting(value, here)


def _defaults(model: type[BaseModel], path: tuple[str, ...], out: Flat) -> None:
    for key, f in model.model_fields.items():
        full = path + (key,)
        tp = _unwrap(f.annotation)
        if f.default is PydanticUndefined and f.default_factory is None:
            if _is_model(tp):
                _defaults(tp, full, out)
            continue
        value = f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            _flatten(type(value), value.model_dump(), full, None, full, Source("default"), out)
        elif full in MERGED_DICTS and isinstance(value, dict):
            for k, v in value.items():
                out[full + (k,)] = Setting(v, Source("default"))
            if not value:
                out[full] = Setting({}, Source("default"))
        else:
            out[full] = Setting(value, Source("default"))


def _unflatten(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path, value in sorted(flat.items(), key=lambda kv: len(kv[0])):
        cur = root
        for p in path[:-1]:
            nxt = cur.setdefault(p, {})
            if not isinstance(nxt, dict):
                nxt = cur[p] = {}
            cur = nxt
        if isinstance(value, dict) and not value and isinstance(cur.get(path[-1]), dict):
            continue
        cur[path[-1]] = value
    return root


def _merge(layers: list[Flat]) -> dict[tuple[str, ...], list[Setting]]:
    chains: dict[tuple[str, ...], list[Setting]] = {}
    for layer in layers:
        for k, s in layer.items():
            # A whole dict replaced at a higher layer hides the per-key entries below.
            chains.setdefault(k, []).append(s)
    return chains


def parse_set(expr: str) -> tuple[tuple[str, ...], Any]:
    """``laws.clock_cap_mhz=2100`` -> (("laws", "clock_cap_mhz"), 2100); values are YAML scalars."""
    if "=" not in expr:
        raise ProfileError(f"--set {expr!r} is not KEY=VALUE", Ref(key="--set"), hint="e.g. --set laws.clock_cap_mhz=2100")
    key, _, raw = expr.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ProfileError(f"--set key {key!r} is empty or malformed", Ref(key="--set"))
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return tuple(key.split(".")), value


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for p in reversed(path[:-1]):
        out = {p: out}
    return out


@dataclass(frozen=True)
class Resolved:
    """A resolved profile: the validated model plus where every value came from."""

    name: str
    files: tuple[str, ...]  # child first
    base_layers: tuple[Flat, ...]  # defaults .. child (lowest first)
    node_layers: dict[str, Flat]  # node name -> overlay layer
    cli_layer: Flat
    profile: Profile  # without node overlays
    _cache: dict[str, Profile] = field(default_factory=dict, compare=False, repr=False)

    def _layers(self, node: str | None) -> list[Flat]:
        layers = list(self.base_layers)
        if node is not None and node in self.node_layers:
            layers.append(self.node_layers[node])
        layers.append(self.cli_layer)
        return layers

    def chains(self, node: str | None = None) -> dict[tuple[str, ...], list[Setting]]:
        return _merge(self._layers(node))

    def explain(self, key: str, node: str | None = None) -> list[Setting]:
        path = tuple(key.split("."))
        chains = self.chains(node)
        if path in chains:
            return chains[path]
        sub = {k: v for k, v in chains.items() if k[: len(path)] == path}
        if not sub:
            known = sorted({".".join(k) for k in chains})
            close = difflib.get_close_matches(key, known, n=1)
            raise ProfileError(
                f"profile {self.name!r} has no key {key!r}", Ref(key=key),
                hint=f"did you mean {close[0]!r}?" if close else "`sparkctl show PROFILE` lists the keys",
            )
        return [s for k in sorted(sub) for s in sub[k]]

    def for_node(self, node: str) -> Profile:
        if node not in self.node_layers:
            return self.profile
        if node not in self._cache:
            self._cache[node] = _validate(self.name, self._layers(node), self.files[0])
        return self._cache[node]

    def to_dict(self, node: str | None = None) -> dict[str, Any]:
        p = self.for_node(node) if node else self.profile
        return p.model_dump(mode="json")

    def digest(self) -> str:
        """What the engines are run from. serve.gateway is left out: the gateway's files are not the
        engines' (sparkctl.plan.gatewayplan), and changing its port must restart no engine. So are
        topology.stack and topology.shared_name: they name the stack (its record, its locks) and
        change no engine's files, so a stack serving before they existed is not restarted by them.
        topology.pp_size counts only when it is not 1: one stage is what every profile ran before it
        existed, so their digests (and the engines serving them) stay as they were."""
        d = self.to_dict()
        if isinstance(d.get("serve"), dict):
            d["serve"] = {k: v for k, v in d["serve"].items() if k != "gateway"}
        if isinstance(d.get("topology"), dict):
            d["topology"] = {k: v for k, v in d["topology"].items() if k not in ("stack", "shared_name")
                             and not (k == "pp_size" and v == 1)}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _validate(name: str, layers: list[Flat], main_file: str) -> Profile:
    chains = _merge(layers)
    winners = {k: v[-1] for k, v in chains.items()}
    data = _unflatten({k: s.value for k, s in winners.items()})
    data.pop("nodes", None)
    data.pop("extends", None)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        rank = {"cli": 4, "node": 3, "profile": 2, "parent": 1, "default": 0}

        def ref_for(loc: tuple[Any, ...]) -> Ref:
            key = ".".join(str(p) for p in loc) or None
            path = tuple(str(p) for p in loc)
            while True:
                # the value that won at or under this key, preferring the highest layer
                under = [w for k, w in winners.items() if k[: len(path)] == path and w.source.kind != "default"]
                if under:
                    s = max(under, key=lambda w: (rank[w.source.kind], -(w.source.line or 0))).source
                    if s.kind == "cli":
                        return Ref(key=f"--set {key}" if key else "--set")
                    return Ref(file=s.file or main_file, line=s.line, key=key)
                if not path:
                    return Ref(file=main_file, line=1, key=key)
                path = path[:-1]

        raise pydantic_errors(exc, ref_for, ProfileError) from None


def resolve(name: str, roots: Roots, sets: list[str] | tuple[str, ...] = ()) -> Resolved:
    """Load ``name`` and its ``extends:`` chain and validate the result."""
    docs: list[tuple[str, Located]] = []
    seen: list[str] = []
    cur: str | None = name
    ref: Ref | None = None
    while cur is not None:
        if cur in seen:
            raise ProfileError(
                f"extends: cycle {' -> '.join(seen + [cur])}", ref, hint="a profile cannot extend itself"
            )
        if len(seen) >= MAX_EXTENDS_DEPTH:
            raise ProfileError(f"extends: chain deeper than {MAX_EXTENDS_DEPTH}", ref)
        seen.append(cur)
        try:
            path = roots.profile_path(cur)
        except SparkctlError as exc:  # point at the `extends:` that named it, when there is one
            raise type(exc)(exc.message, ref or exc.ref, exc.hint) from None
        src = load(path)
        if not isinstance(src.data, dict):
            raise ProfileError("a profile is a mapping of keys", src.ref(()), hint="see docs/profile-schema.md")
        docs.append((cur, src))
        parent = src.data.get("extends")
        if parent is not None and not isinstance(parent, str):
            raise ProfileError("extends: takes one profile name", src.ref(("extends",)))
        ref = src.ref(("extends",))
        cur = parent

    defaults: Flat = {}
    _defaults(Profile, (), defaults)
    layers: list[Flat] = [defaults]
    node_layers: dict[str, Flat] = {}
    for depth, (pname, src) in enumerate(reversed(docs)):
        kind = "profile" if depth == len(docs) - 1 else "parent"
        flat: Flat = {}
        body = {k: v for k, v in src.data.items() if k != "nodes"}
        _flatten(Profile, body, (), src, (), Source(kind, src.file, None, pname), flat)
        layers.append(flat)
        overlays = src.data.get("nodes") or {}
        if not isinstance(overlays, dict):
            raise ProfileError("nodes: maps node names to overlays", src.ref(("nodes",)))
        for node, overlay in overlays.items():
            if not isinstance(node, str) or not re.fullmatch(NAME_RE[1:-1], node):
                raise ProfileError(f"{str(node)[:80]!r} is not a node name", src.ref(("nodes", node)),
                                   hint=f"allowed: {PATTERN_HINTS[NAME_RE]}")
            nflat = node_layers.setdefault(str(node), {})
            if overlay is None:
                continue
            _flatten(NodeOverlay, overlay, (), src, ("nodes", node), Source("node", src.file, None, f"{node} in {pname}"), {})
            _flatten(Profile, overlay, (), src, ("nodes", node), Source("node", src.file, None, f"{node} in {pname}"), nflat)

    cli: Flat = {}
    for expr in sets:
        keys, value = parse_set(expr)
        if keys[0] == "nodes":
            raise ProfileError("--set cannot change per-node overlays", Ref(key=f"--set {'.'.join(keys)}"))
        _flatten(Profile, _nest(keys, value), (), None, (), Source("cli", None, None, f"--set {expr}"), cli)

    main_file = docs[0][1].file
    profile = _validate(name, layers + [cli], main_file)
    resolved = Resolved(
        name=name, files=tuple(s.file for _, s in docs), base_layers=tuple(layers),
        node_layers=node_layers, cli_layer=cli, profile=profile,
    )
    for node in node_layers:
        resolved.for_node(node)  # validate every overlay now, with its file:line
    return resolved


def describe(path: Path) -> str:
    """The one-line description of a profile file, without resolving it."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return str(data.get("description", "")) if isinstance(data, dict) else ""
    except (OSError, yaml.YAMLError):
        return "(unreadable)"
