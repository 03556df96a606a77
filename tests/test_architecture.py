"""The tree shows the layers: what may import what, and how big a module may grow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = REPO / "sparkctl"
# Files pushed to nodes as one file, standard library only; exempt from the size rule.
ONE_FILE = {"sparkctl/remote/weights_agent.py"}
MAX_LINES = 600


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_product_never_imports_the_simulator() -> None:
    bad = {str(p.relative_to(REPO)): sorted(m for m in _imports(p) if m.split(".")[0] == "sparkctl_sim")
           for p in _modules(PRODUCT)}
    assert not {k: v for k, v in bad.items() if v}


def test_remote_files_use_the_standard_library_only() -> None:
    """... and each other: a file pushed with a sibling imports it as ``sparkctl.remote.X`` in the
    package and as ``X`` beside it on a node (planrun.py, endpoint_probe.py and putfiles.py)."""
    siblings = {p.stem for p in _modules(PRODUCT / "remote")}
    for p in _modules(PRODUCT / "remote"):
        mods = {m for m in _imports(p) if m != "sparkctl.remote" and m not in siblings}
        third = {m.split(".")[0] for m in mods} - set(sys.stdlib_module_names) - {"__future__"}
        assert not third, (p, third)


def test_pure_packages_import_no_transport_click_or_socket() -> None:
    pure = [*_modules(PRODUCT / "model"), *_modules(PRODUCT / "plan")]
    for p in pure:
        mods = _imports(p)
        bad = {m for m in mods if m.split(".")[0] in ("click", "socket", "paramiko", "fabric", "httpx", "rich")
               or m.startswith(("sparkctl.transport", "sparkctl.ops", "sparkctl.cli"))}
        assert not bad, (p, bad)


@pytest.mark.parametrize("path", [p for p in _modules(PRODUCT) if str(p.relative_to(REPO)) not in ONE_FILE],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_product_module_over_600_lines(path: Path) -> None:
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)}: {n} lines; split it by responsibility"


def test_no_executor_function_over_80_lines() -> None:
    for name in ("executor.py", "supervise.py"):
        tree = ast.parse((PRODUCT / "ops" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                assert n <= 80, f"ops/{name}: {node.name} is {n} lines"


def test_sim_without_its_extra_names_the_extra(tmp_path: Path) -> None:
    """`pip install sparkctl` without [sim]: `sparkctl sim ...` says what to install (not ModuleNotFoundError)."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass _Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('gguf', 'numpy', 'llama_cpp'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n")
    env = {"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"}
    for args in (["sim", "up"], ["demo"]):
        r = subprocess.run([sys.executable, "-m", "sparkctl.cli", *args], capture_output=True, text=True, env=env,
                           timeout=60, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "needs the sim extra: pip install 'sparkctl[sim]'" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


ALLOWED = {  # a layer may import itself, these, and sparkctl.errors / sparkctl (the version)
    "model": {"model"},
    "plan": {"model", "plan"},
    "facts": {"model", "facts", "transport"},
    "transport": {"model", "transport", "remote"},  # remote/putfiles.py: the head's runner writes as it does
    "remote": set(),
}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downwards(layer: str) -> None:
    bad = {}
    for p in _modules(PRODUCT / layer):
        for m in _imports(p):
            parts = m.split(".")
            if parts[0] == "sparkctl" and len(parts) > 1 and parts[1] not in ("errors", "__version__"):
                if parts[1] != layer and parts[1] not in ALLOWED[layer]:
                    bad.setdefault(str(p.relative_to(REPO)), []).append(m)
    assert not bad, bad


# --------------------------------------------------------------------------- import cycles


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it stands: at the top, under ``if TYPE_CHECKING:``
    or late, inside a function. A cycle hides exactly there (``# late: shims imports this module``), and
    it is still a cycle: the modules cannot be understood, typed or split one without the other."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph(roots: list[Path]) -> dict[str, set[str]]:
    """module -> the modules of ``roots`` it imports (``from pkg import sub`` names ``pkg.sub``; a parent
    package is not counted: Python runs its ``__init__`` first, and an ``__init__`` importing its own
    submodules is no cycle)."""
    paths = {_module_name(p): p for root in roots for p in _modules(root)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _every_import(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            subs = {f"{module}.{a.name}" for a in node.names} & paths.keys()
            deps |= subs or {module}
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_product_or_the_simulator() -> None:
    """A cycle works only in the import order it was tested in; cut it (a leaf module, a protocol).
    Cut (issue 19): bench.{fitting,runner,suites} (RunOptions in bench/options.py),
    sparkctl_sim.{nodestate,shims,debpkg,earlyoomsim} (sparkctl_sim/envnames.py, the /proc views in nodestate),
    bench.{refserver,leanserver} (their command line in bench/refserve.py) and sparkctl_sim.{clusterinit,netplansim}
    (refresh_gids in netplansim, which applies the addresses the GIDs follow), and nodestate -> shims.rendered
    (a state write drops the tools' views, the first reader renders them again: nodestate.ensure_views)."""
    assert cycles(import_graph([PRODUCT, REPO / "sparkctl_sim"])) == []
