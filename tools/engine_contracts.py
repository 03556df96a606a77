"""Regenerate the engine contracts (sparkctl/plan/contracts/*.json) from each release's own source.

For every engine and version a bundled profile pins, this downloads the
release with pip (``pip download --no-deps``, the ordinary client), reads only
the files it needs straight out of the wheel or sdist (nothing is unpacked into
the repo, no third-party code is committed), and extracts by parsing:

* vLLM 0.11.2 (wheel): ``vllm/engine/arg_utils.py`` and
  ``vllm/entrypoints/openai/cli_args.py`` for the ``add_argument`` calls, with
  the types of the config dataclass fields they take their kwargs from
  (``vllm/config/*.py``: ``Literal`` -> choices, ``bool`` ->
  ``BooleanOptionalAction``, as ``arg_utils._compute_kwargs`` does);
  ``api_server.py`` for the routes; ``v1/metrics/loggers.py`` for metric names.
* SGLang 0.5.4 (sdist): ``sglang/srt/server_args.py`` (``add_argument``
  calls; ``choices=`` literal or module-level lists), ``entrypoints/http_server.py``
  (routes; ``/metrics`` only ``if server_args.enable_metrics``),
  ``metrics/collector.py`` (metric names).
* llama.cpp ``llama-server``: ``common/arg.cpp`` (regex over ``common_arg(``
  entries, value-taking from the lambda's signature, ``set_examples``) and
  ``tools/server`` (routes, metric names, the ``--metrics`` gate).
* llama-cpp-python 0.3.x: ``llama_cpp/server/settings.py`` (pydantic fields;
  ``cli.add_args_from_model`` makes every field ``--<name>`` taking a value)
  and ``app.py`` (routes).

llama.cpp b6500 itself is not reachable from here (the repository snapshot is
over the fetch limit and the code index holds a fork); the nearest upstream copy
that is reachable through pip is the one vendored in the llama-cpp-python sdist
installed here (its CHANGELOG names the llama.cpp commit). The contract records
which commit it is, and that it is newer than b6500.

Usage: ``python tools/engine_contracts.py [--work DIR]`` (downloads go to DIR,
default /tmp/sparkctl-contracts-src).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "sparkctl" / "plan" / "contracts"


# --- archives ------------------------------------------------------------------


class Archive:
    """Members of a downloaded wheel or sdist, read in memory, with their sha256."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sources: list[dict[str, str]] = []
        if path.suffix == ".whl":
            z = zipfile.ZipFile(path)
            self._names = z.namelist()
            self._read: Callable[[str], bytes] = z.read
        else:
            t = tarfile.open(path)
            members = {m.name: m for m in t.getmembers() if m.isfile()}
            self._names = list(members)

            def read(name: str) -> bytes:
                f = t.extractfile(members[name])
                assert f is not None
                return f.read()

            self._read = read

    def names(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return sorted(n for n in self._names if rx.search(n))

    def text(self, suffix: str) -> str:
        hits = [n for n in self._names if n.endswith(suffix)]
        if len(hits) != 1:
            raise SystemExit(f"{self.path.name}: expected one member ending {suffix}, found {hits}")
        data = self._read(hits[0])
        rel = hits[0].split("/", 1)[1] if self.path.suffix != ".whl" else hits[0]
        self.sources.append({"archive": self.path.name, "file": rel, "sha256": hashlib.sha256(data).hexdigest()})
        return data.decode()


def pip_download(spec: str, work: Path, binary: bool) -> Path:
    dest = work / spec.replace("==", "-")
    found = sorted(dest.glob("*.whl" if binary else "*.tar.gz"))
    if not found:
        fmt = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *fmt, spec, "-d", str(dest)], check=True)
        found = sorted(dest.glob("*.whl" if binary else "*.tar.gz"))
    return found[0]


# --- python sources: argparse calls and dataclass fields -------------------------


def _const_strs(node: ast.AST | None, names: dict[str, list[str]]) -> list[str] | None:
    """A literal list/tuple of strings, or a module-level name bound to one."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return [str(v) for v in vals] if len(vals) == len(node.elts) else None
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    return None


def module_string_lists(tree: ast.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for st in tree.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            vals = _const_strs(st.value, out)
            if vals is not None:
                out[st.targets[0].id] = vals
    return out


def literal_aliases(trees: Iterable[ast.Module]) -> dict[str, ast.AST]:
    """Module-level ``Name = Literal[...]`` (and other type aliases) across files."""
    out: dict[str, ast.AST] = {}
    for tree in trees:
        for st in tree.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                out[st.targets[0].id] = st.value
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                if isinstance(st.annotation, ast.Name) and st.annotation.id == "TypeAlias":
                    out[st.target.id] = st.value
    return out


def class_fields(trees: Iterable[ast.Module]) -> dict[str, dict[str, ast.AST]]:
    out: dict[str, dict[str, ast.AST]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = {st.target.id: st.annotation for st in node.body
                          if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
                out.setdefault(node.name, {}).update(fields)
    return out


def annotation_kind(ann: ast.AST, aliases: dict[str, ast.AST], depth: int = 0) -> tuple[set[str], list[str] | None]:
    """(set of base type names, Literal choices) of an annotation, resolving aliases."""
    if depth > 8:
        return {"?"}, None
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # "forward ref"
        try:
            return annotation_kind(ast.parse(ann.value, mode="eval").body, aliases, depth + 1)
        except SyntaxError:
            return {"?"}, None
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        a, ca = annotation_kind(ann.left, aliases, depth + 1)
        b, cb = annotation_kind(ann.right, aliases, depth + 1)
        return a | b, (ca or []) + (cb or []) if (ca or cb) else None
    if isinstance(ann, ast.Subscript):
        base = ast.unparse(ann.value).split(".")[-1]
        if base == "Literal":
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            return {"Literal"}, [str(e.value) for e in elts if isinstance(e, ast.Constant)]
        if base in ("Optional", "Union", "Annotated"):
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if base == "Annotated":
                elts = elts[:1]
            kinds: set[str] = set()
            choices: list[str] = []
            for e in elts:
                k, c = annotation_kind(e, aliases, depth + 1)
                kinds |= k
                choices += c or []
            return kinds, choices or None
        return {base}, None
    if isinstance(ann, ast.Name):
        if ann.id in aliases:
            return annotation_kind(aliases[ann.id], aliases, depth + 1)
        return {ann.id}, None
    if isinstance(ann, ast.Attribute):
        return {ann.attr}, None
    return {"?"}, None


def _flag(takes_value: bool, choices: list[str] | None, canonical: str, negatable: bool = False,
          nargs: str | None = None) -> dict[str, Any]:
    """One option string: whether it takes a value, its choices, its canonical name, and
    argparse's nargs when it takes several values ("+", "*", "?")."""
    rec: dict[str, Any] = {"takes_value": takes_value, "choices": choices, "canonical": canonical, "negatable": negatable}
    if nargs:
        rec["nargs"] = nargs
    return rec


def argparse_flags(tree: ast.Module, kwargs_of: Callable[[ast.Call], dict[str, Any] | None],
                   lists: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Every ``*.add_argument("--x", ...)`` call of a module -> flag records."""
    flags: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        opts = [o for o in opts if o.startswith("-")]
        if not opts:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        base = kwargs_of(node) or {}
        action = kw.get("action")
        action_s = ast.unparse(action) if action is not None else base.get("action")
        takes_value = base.get("takes_value", True)
        choices = base.get("choices")
        negatable = base.get("negatable", False)
        if action_s is not None:
            a = str(action_s).strip("'\"")
            if a in ("store_true", "store_false", "count", "help", "version") or a.endswith("BooleanOptionalAction"):
                takes_value = False
                negatable = negatable or a.endswith("BooleanOptionalAction")
        if "nargs" in kw and isinstance(kw["nargs"], ast.Constant) and kw["nargs"].value in (0,):
            takes_value = False
        if "choices" in kw:
            choices = _const_strs(kw["choices"], lists)
        nargs = base.get("nargs")
        if "nargs" in kw and isinstance(kw["nargs"], ast.Constant) and kw["nargs"].value in ("+", "*", "?"):
            nargs = kw["nargs"].value
        canonical = next((o for o in opts if o.startswith("--")), opts[0])
        for o in opts:
            flags[o] = _flag(takes_value, choices, canonical, negatable, nargs if takes_value else None)
        if negatable:
            for o in opts:
                if o.startswith("--"):
                    flags["--no-" + o[2:]] = _flag(False, None, canonical)
    return flags


def route_table(tree: ast.Module, decorator_obj: str, gate_of: Callable[[list[ast.AST]], list[str]]) -> dict[str, list[str]]:
    """``@<obj>.get/post/api_route("/path")`` -> the flags that gate it (from enclosing ``if``s)."""
    out: dict[str, list[str]] = {}

    def visit(body: list[ast.stmt], conds: list[ast.AST]) -> None:
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in st.decorator_list:
                    if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                            and ast.unparse(d.func.value) == decorator_obj and d.args
                            and isinstance(d.args[0], ast.Constant)):
                        out.setdefault(str(d.args[0].value), gate_of(conds))
            elif isinstance(st, ast.If):
                visit(st.body, conds + [st.test])
                visit(st.orelse, conds + [ast.UnaryOp(ast.Not(), st.test)])

    visit(tree.body, [])
    return out


def prometheus_names(tree: ast.Module) -> list[str]:
    """``Counter/Gauge/Histogram(name="x")`` -> exported sample names (a counter gains ``_total``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = ast.unparse(node.func).lower()
        kind = "counter" if "counter" in fn else "gauge" if "gauge" in fn else "histogram" if "histogram" in fn else None
        name = next((k.value.value for k in node.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)), None)
        if kind is None or not isinstance(name, str):
            continue
        if kind == "counter":
            # prometheus_client strips a trailing _total from a counter's name and exports <name>_total.
            names.add(name.removesuffix("_total") + "_total")
        elif kind == "histogram":
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return sorted(names)


# --- engines ---------------------------------------------------------------------


def vllm_contract(work: Path) -> dict[str, Any]:
    ar = Archive(pip_download("vllm==0.11.2", work, binary=True))
    cfg_files = [n for n in ar.names(r"^vllm/config/[^/]+\.py$")]
    cfg_trees = [ast.parse(ar.text(n)) for n in cfg_files]
    args_src = ar.text("vllm/engine/arg_utils.py")
    cli_src = ar.text("vllm/entrypoints/openai/cli_args.py")
    args_tree, cli_tree = ast.parse(args_src), ast.parse(cli_src)
    aliases = literal_aliases(cfg_trees + [args_tree, cli_tree])
    fields = class_fields(cfg_trees + [cli_tree])
    # `model_kwargs = get_kwargs(ModelConfig)`: which class each kwargs dict comes from.
    kw_class: dict[str, str] = {}
    for node in ast.walk(args_tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "get_kwargs" and isinstance(node.targets[0], ast.Name)):
            kw_class[node.targets[0].id] = ast.unparse(node.value.args[0])

    def from_field(cls: str, name: str) -> dict[str, Any] | None:
        ann = fields.get(cls, {}).get(name)
        if ann is None:
            return None
        kinds, choices = annotation_kind(ann, aliases)
        if "bool" in kinds:  # arg_utils._compute_kwargs: bool -> BooleanOptionalAction
            return {"takes_value": False, "negatable": True, "action": "BooleanOptionalAction"}
        if "Literal" in kinds and "str" not in kinds and choices:
            # literal_to_kwargs: sorted choices; an Optional literal also accepts "None".
            ch = sorted(set(choices)) + (["None"] if "None" in kinds else [])
            return {"takes_value": True, "choices": ch}
        if kinds & {"list", "set", "List", "Set"}:  # collection_to_kwargs: nargs="+"
            return {"takes_value": True, "nargs": "+"}
        return {"takes_value": True}

    def kwargs_of(call: ast.Call) -> dict[str, Any] | None:
        # `**model_kwargs["x"]`, or `**{**scheduler_kwargs["x"], "default": None}`
        spreads: list[ast.AST] = []
        for k in call.keywords:
            if k.arg is None:
                spreads.append(k.value)
                if isinstance(k.value, ast.Dict):
                    spreads += [v for key, v in zip(k.value.keys, k.value.values) if key is None]
        for v in spreads:
            if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):
                cls = kw_class.get(v.value.id)
                if cls and isinstance(v.slice, ast.Constant):
                    return from_field(cls, str(v.slice.value))
        return None

    flags = argparse_flags(args_tree, kwargs_of, module_string_lists(args_tree))
    flags.update(argparse_flags(cli_tree, kwargs_of, module_string_lists(cli_tree)))
    # cli_args.FrontendArgs.add_cli_args: `for key, value in frontend_kwargs.items():
    # add_argument(f"--{key.replace('_', '-')}", **value)`: every FrontendArgs field.
    for name in fields.get("FrontendArgs", {}):
        rec = from_field("FrontendArgs", name) or {"takes_value": True}
        opt = "--" + name.replace("_", "-")
        flags[opt] = _flag(rec["takes_value"], rec.get("choices"), opt, rec.get("negatable", False), rec.get("nargs"))
        if rec.get("negatable"):
            flags["--no-" + opt[2:]] = _flag(False, None, opt)
    api_tree = ast.parse(ar.text("vllm/entrypoints/openai/api_server.py"))
    routes = route_table(api_tree, "router", lambda conds: [ast.unparse(c) for c in conds])
    # api_server.build_app calls mount_metrics(app) unconditionally: /metrics is always served.
    routes["/metrics"] = []
    metrics = prometheus_names(ast.parse(ar.text("vllm/v1/metrics/loggers.py")))
    chat = ar.text("vllm/entrypoints/openai/serving_chat.py")
    ar.text("vllm/entrypoints/utils.py")  # should_include_usage: the rule below
    return {
        "engine": "vllm", "version": "0.11.2", "program": "vllm serve", "subcommand": "serve",
        "parser": {"kind": "argparse", "abbrev": True, "underscores_as_dashes": True,
                   "error_format": "vllm serve: error: argument {flag}: invalid choice: {value!r} (choose from {choices})",
                   "note": "FlexibleArgumentParser (vllm/utils/argparse_utils.py) turns --a_b into --a-b; "
                           "allow_abbrev is argparse's default (True)"},
        "positionals": ["model_tag"],
        "flags": dict(sorted(flags.items())),
        "endpoints": {p: {"requires": g} for p, g in sorted(routes.items())},
        "metrics": {m: {"requires": []} for m in metrics},
        "stream_usage": {"when": "stream_options.include_usage",
                         "also": "stream_options.continuous_usage_stats adds usage to every chunk",
                         "evidence": "vllm/entrypoints/openai/serving_chat.py: should_include_usage(stream_options, ...)"
                         if "should_include_usage" in chat else None},
        "sources": ar.sources,
    }


def sglang_contract(work: Path) -> dict[str, Any]:
    ar = Archive(pip_download("sglang==0.5.4", work, binary=False))
    tree = ast.parse(ar.text("sglang/srt/server_args.py"))
    flags = argparse_flags(tree, lambda c: None, module_string_lists(tree))
    fields = class_fields([tree]).get("ServerArgs", {})
    defaults = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(st.value, ast.Constant):
                    defaults[st.target.id] = st.value.value
    assert "enable_metrics" in fields and defaults.get("enable_metrics") is False, "enable_metrics default changed"
    http = ast.parse(ar.text("sglang/srt/entrypoints/http_server.py"))
    routes = route_table(http, "app", lambda conds: [ast.unparse(c) for c in conds])
    http_src = ast.unparse(http)
    # http_server.py: `if fast_api_app.server_args.enable_metrics: add_prometheus_middleware(app)`
    # (sglang/srt/utils/common.py mounts /metrics there): /metrics only with --enable-metrics.
    assert "server_args.enable_metrics" in http_src and "add_prometheus_middleware(app)" in http_src
    routes["/metrics"] = ["--enable-metrics"]
    metrics = prometheus_names(ast.parse(ar.text("sglang/srt/metrics/collector.py")))
    chat = ar.text("sglang/srt/entrypoints/openai/serving_chat.py")
    return {
        "engine": "sglang", "version": "0.5.4", "program": "python3 -m sglang.launch_server",
        "parser": {"kind": "argparse", "abbrev": True, "underscores_as_dashes": False,
                   "error_format": "launch_server.py: error: argument {flag}: invalid choice: {value!r} (choose from {choices})"},
        "positionals": [],
        "flags": dict(sorted(flags.items())),
        "endpoints": {p: {"requires": g} for p, g in sorted(routes.items())},
        "metrics": {m: {"requires": ["--enable-metrics"]} for m in metrics},
        "stream_usage": {"when": "stream_options.include_usage",
                         "evidence": "sglang/srt/entrypoints/openai/serving_chat.py: "
                                     "request.stream_options.include_usage" if "include_usage" in chat else None},
        "defaults": {"enable_metrics": False},
        "sources": ar.sources,
    }


def llamacpp_arg_cpp(text: str, example: str = "LLAMA_EXAMPLE_SERVER") -> dict[str, dict[str, Any]]:
    """``common_arg({"-c", "--ctx-size"}, "N", help, [](common_params & params, int value) ...)``."""
    flags: dict[str, dict[str, Any]] = {}
    for m in re.finditer(r"add_opt\(common_arg\(", text):
        start = m.end()
        nxt = text.find("add_opt(common_arg(", start)
        body = text[start: nxt if nxt > 0 else len(text)]
        lam = re.search(r"\[\]\s*\(([^)]*)\)", body)
        if not lam:
            continue
        head = body[: lam.start()]
        lists = re.findall(r"\{([^{}]*)\}", head)
        if not lists:
            continue
        opts = re.findall(r'"(-[^"]+)"', lists[0])
        negs = re.findall(r'"(-[^"]+)"', lists[1]) if len(lists) > 1 and '"-' in lists[1] else []
        sig = lam.group(1)
        takes_value = "value" in sig and "bool value" not in sig
        tail = body[lam.end():]
        ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", tail)
        exc = re.search(r"\.set_excludes\(\{([^}]*)\}\)", tail)
        # arg.h: an option is offered to every program when its examples include LLAMA_EXAMPLE_COMMON.
        if ex and example not in ex.group(1) and "LLAMA_EXAMPLE_COMMON" not in ex.group(1):
            continue
        if exc and example in exc.group(1):
            continue
        if not opts:
            continue
        canonical = next((o for o in opts if o.startswith("--")), opts[0])
        for o in opts:
            flags[o] = _flag(takes_value, None, canonical, bool(negs))
        for o in negs:
            flags[o] = _flag(False, None, canonical)
    return flags


def llamacpp_contracts(work: Path) -> list[dict[str, Any]]:
    ar = Archive(pip_download("llama-cpp-python==0.3.36", work, binary=False))
    changelog = ar.text("CHANGELOG.md")
    commit = re.search(r"## \[0\.3\.36\].*?ggml-org/llama\.cpp@([0-9a-f]+)", changelog, re.S)
    arg = ar.text("vendor/llama.cpp/common/arg.cpp")
    server_flags = llamacpp_arg_cpp(arg)
    srv = ar.text("vendor/llama.cpp/tools/server/server.cpp")
    task = ar.text("vendor/llama.cpp/tools/server/server-task.cpp")
    ctxs = ar.text("vendor/llama.cpp/tools/server/server-context.cpp")
    routes = sorted(set(re.findall(r'ctx_http\.(?:get|post)\s*\(\s*"([^"]+)"', srv)))
    assert "This server does not support metrics endpoint. Start it with `--metrics`" in ctxs
    # server-task.cpp prints `llamacpp:<name>` for each {"name", "<name>"} item of the metrics list.
    names = sorted(set(re.findall(r'\{\s*"name"\s*,\s*"([a-z_]+)"\s*\}', task)) |
                   set(re.findall(r'^\s*"([a-z_]+_total|[a-z_]+_seconds|[a-z_]+_per_second|n_[a-z_]+)",\s*$', task, re.M)))
    llama_sources = list(ar.sources)
    server = {
        "engine": "llamacpp", "version": "b6500", "program": "llama-server",
        "upstream": {"wanted": "b6500", "used": f"ggml-org/llama.cpp@{commit.group(1) if commit else '?'}",
                     "via": "vendor/llama.cpp of llama-cpp-python 0.3.36 (sdist)",
                     "why": "b6500 is not reachable here: the repository snapshot exceeds the fetch limit and "
                            "the code index holds a fork; this copy is NEWER than b6500"},
        "parser": {"kind": "llama.cpp", "abbrev": False, "underscores_as_dashes": False,
                   "error_format": "error: invalid argument: {flag}"},
        "positionals": [],
        "flags": dict(sorted(server_flags.items())),
        "endpoints": {p: {"requires": ["--metrics"] if p == "/metrics" else []} for p in routes},
        "metrics": {f"llamacpp:{n}": {"requires": ["--metrics"]} for n in names},
        "stream_usage": {"when": "stream_options.include_usage",
                         "evidence": "tools/server/server-task.cpp: `if (include_usage)` adds a last chunk "
                                     "with empty choices" if "include_usage" in task else None},
        "sources": llama_sources,
    }
    ar.sources = []
    settings = ast.parse(ar.text("llama_cpp/server/settings.py"))
    ar.text("llama_cpp/server/cli.py")
    fields: dict[str, dict[str, Any]] = {}
    for cls in ("ModelSettings", "ServerSettings"):
        for name, ann in class_fields([settings]).get(cls, {}).items():
            # cli.add_args_from_model: every field is `--<name>` (underscores kept) taking a value
            # (nargs="*" for lists); bools are parsed by _parse_bool_arg from "True"/"False".
            kinds, _ = annotation_kind(ann, {})
            nargs = "*" if kinds & {"List", "list"} else None
            fields["--" + name] = _flag(True, None, "--" + name, nargs=nargs)
    app = ast.parse(ar.text("llama_cpp/server/app.py"))
    app_routes: set[str] = set()
    for node in ast.walk(app):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "post")
                and ast.unparse(node.func.value) == "router" and node.args and isinstance(node.args[0], ast.Constant)):
            app_routes.add(str(node.args[0].value))
    py = {
        "engine": "llamacpp", "version": "llama-cpp-python-0.3", "program": "python3 -m llama_cpp.server",
        "upstream": {"wanted": "0.3.x", "used": "llama-cpp-python 0.3.36 (the version installed here)"},
        "parser": {"kind": "argparse", "abbrev": True, "underscores_as_dashes": False,
                   "error_format": "__main__.py: error: unrecognized arguments: {flag}"},
        "positionals": [],
        "flags": dict(sorted(fields.items())),
        "endpoints": {p: {"requires": []} for p in sorted(app_routes)},
        "metrics": {},
        "stream_usage": {"when": None, "evidence": "llama_cpp/server/app.py has no stream_options handling"},
        "sources": ar.sources,
    }
    return [server, py]


def write(contract: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{contract['engine']}-{contract['version']}.json"
    path.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/sparkctl-contracts-src"))
    ap.add_argument("--only", choices=["vllm", "sglang", "llamacpp"], action="append")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    makers: dict[str, Callable[[Path], Any]] = {"vllm": vllm_contract, "sglang": sglang_contract,
                                                "llamacpp": llamacpp_contracts}
    for name in a.only or list(makers):
        got = makers[name](a.work)
        for c in got if isinstance(got, list) else [got]:
            p = write(c)
            print(f"{p.relative_to(OUT.parent.parent.parent)}: {len(c['flags'])} flags, {len(c['endpoints'])} endpoints, "
                  f"{len(c['metrics'])} metrics")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
