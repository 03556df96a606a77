"""Every error class survives phase annotation with all its fields (issue: `up` once turned an
error with more constructor arguments into `internal error: TypeError`), every error names its
exit code in the one table (``ExitStatus``), and only ``cli/main.py`` turns one into an exit code."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest

import sparkctl
import sparkctl_sim
from sparkctl.errors import ExitStatus, Ref, SparkctlError


def _all_modules() -> None:
    for pkg in (sparkctl, sparkctl_sim):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if m.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(m.name)
            except ImportError:  # an optional extra missing here: its errors are not reachable either
                pass


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


_all_modules()
CLASSES = sorted({c for c in _subclasses(SparkctlError)} | {SparkctlError}, key=lambda c: f"{c.__module__}.{c.__name__}")


def _value(name: str, annotation: Any) -> Any:
    text = str(annotation)
    if "Ref" in text:
        return Ref(file="f.yaml", line=3, key="engine.args", node="spark-b", command="x")
    if "bool" in text:
        return True
    if "int" in text and "str" not in text:
        return 42
    if "float" in text:
        return 1.5
    if "tuple" in text or "list" in text or "Sequence" in text:
        return ("a", "b")
    if "dict" in text or "Mapping" in text:
        return {"k": "v"}
    return f"<{name}>"


def build(cls: type) -> SparkctlError:
    sig = inspect.signature(cls.__init__)
    args, kwargs = [], {}
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        v = _value(p.name, p.annotation)
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = v
        else:
            args.append(v)
    return cls(*args, **kwargs)


def test_the_error_tree_was_found() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"HostKeyError", "CheckFailed", "LifecycleError", "LockHeld", "SimError", "ProbeParseError"} <= names, names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_annotation_keeps_every_field(cls: type) -> None:
    exc = build(cls)
    before = {k: v for k, v in vars(exc).items() if k not in ("message", "phase")}
    new = exc.in_phase("up tiny", "check")
    assert type(new) is cls
    after = {k: v for k, v in vars(new).items() if k not in ("message", "phase")}
    assert after == before
    assert new.phase == "check" and new.exit_code == exc.exit_code
    assert new.message == f"up tiny failed in phase check: {exc.message}"
    assert "in phase check" in new.one_line()
    assert new.in_phase("up tiny", "push") is new  # annotated once
    assert exc.phase is None  # the original is untouched


# --------------------------------------------------------------------------- the one table of exit codes

REPO = Path(__file__).resolve().parent.parent
PAIR = str(REPO / "tests" / "fixtures" / "inv-pair.yaml")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_names_its_code_in_the_one_table(cls: type) -> None:
    """SimError included: the simulator's code is a row of the product's table, not a number of its own."""
    assert isinstance(cls.exit_code, ExitStatus), (cls, cls.exit_code)


def _exits(tree: ast.AST) -> list[ast.Call]:
    """Every ``SystemExit(...)`` / ``sys.exit(...)`` / ``exit(...)`` call, save ``sys.exit(main(...))`` under
    ``if __name__ == "__main__"`` or in a ``__main__`` module (the interpreter's entry, not a decision)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            guarded |= {id(n) for n in ast.walk(node)}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or ast.unparse(node.func) not in ("SystemExit", "sys.exit", "exit"):
            continue
        entry = len(node.args) == 1 and isinstance(node.args[0], ast.Call) and ast.unparse(node.args[0].func) == "main"
        if not (entry and id(node) in guarded):
            calls.append(node)
    return calls


def test_only_main_decides_an_exit_code() -> None:
    """No command or library module of sparkctl exits with a number of its own: it raises an error of the tree.

    ``remote/`` is left out: its scripts run on the nodes as their own processes, with their own codes.
    ``cli/__main__.py`` is the interpreter's entry (``sys.exit(main())``).
    """
    found = []
    for path in sorted((REPO / "sparkctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("sparkctl/remote/") or rel == "sparkctl/cli/__main__.py":
            continue
        found += [f"{rel}:{c.lineno}: {ast.unparse(c)}" for c in _exits(ast.parse(path.read_text(), rel))]
    assert not found, found


def test_the_exit_scan_sees_a_planted_exit() -> None:
    planted = "import sys\ndef f():\n    raise SystemExit(4)\ndef g():\n    sys.exit(5)\n" \
              "if __name__ == '__main__':\n    sys.exit(main())\n"
    assert [ast.unparse(c) for c in _exits(ast.parse(planted))] == ["SystemExit(4)", "sys.exit(5)"]


def _report(failing: bool) -> Any:
    from sparkctl.ops.check import CheckReport
    from sparkctl.plan.laws import Verdict

    status = "fail" if failing else "ok"
    return CheckReport("tiny-llamacpp", ("spark-a",), (Verdict("kernel_pin", "spark-a", status, "6.11", "6.17"),), {})


@pytest.mark.parametrize("failing", [True, False])
def test_check_exits_4_when_a_law_fails_with_an_error_line(sparkctl, monkeypatch: pytest.MonkeyPatch,
                                                           failing: bool) -> None:
    from sparkctl.cli import cluster
    from sparkctl.ops import check

    monkeypatch.setattr(cluster, "make_transport", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(check, "run_check", lambda *a, **k: _report(failing))
    monkeypatch.setattr(check, "clear_hw_change_if_done", lambda *a, **k: False)
    r = sparkctl("-i", PAIR, "check", "tiny-llamacpp", "--json")
    assert r.code == (ExitStatus.CHECK_FAILED if failing else ExitStatus.SUCCESS) == (4 if failing else 0), r.err
    assert json.loads(r.out)["ok"] is not failing  # stdout stays the JSON document alone
    if failing:
        assert "error: check tiny-llamacpp: 1 law(s) fail; first: kernel_pin on spark-a" in r.err, r.err


def test_a_rolled_back_switch_exits_5(sparkctl, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkctl.cli import cluster
    from sparkctl.ops import executor

    monkeypatch.setattr(cluster, "make_transport", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(executor, "switch", lambda *a, **k: executor.SwitchResult(
        "tensorfold-tp2", switched=False, rolled_back=True, downtime_s=1.0, error="not ready"))
    r = sparkctl("-i", PAIR, "switch", "tiny-llamacpp", "--json")
    assert r.code == ExitStatus.LIFECYCLE == 5, r.err
    assert json.loads(r.out)["rolled_back"] is True
    assert "error: switch to tiny-llamacpp failed; tensorfold-tp2 serves again" in r.err, r.err


def test_an_unverified_weights_sync_exits_5(sparkctl, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkctl.cli import weights as cli_weights
    from sparkctl.ops import weights

    def sync(*a: Any, **k: Any) -> weights.SyncReport:
        bad = weights.NodeSync("spark-b", "spark-a", None, 0, 0.0, 0.0, verified=False, error="sha256 differs")
        return weights.SyncReport("spark-a", "/w", 1, 1, (), {"spark-b": bad})

    monkeypatch.setattr(cli_weights, "make_transport", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(weights, "sync", sync)
    r = sparkctl("-i", PAIR, "weights", "sync", "tiny-llamacpp")
    assert r.code == ExitStatus.LIFECYCLE == 5, r.err
    assert "error: weights sync from spark-a: not verified on spark-b" in r.err, r.err


def test_usage_errors_and_help_keep_clicks_codes(sparkctl) -> None:
    assert sparkctl("--help").code == ExitStatus.SUCCESS
    assert sparkctl("no-such-command").code == ExitStatus.CONFIG == 2


def test_a_long_command_in_a_ref_is_cut_to_one_short_line() -> None:
    """A batched probe script is the command of its step: an error naming it stays one readable line."""
    from sparkctl.errors import Ref

    text = str(Ref(node="spark-a", command="sh -c 'echo one\n" + "sec x; ( cat /sys/class/net/y ); end x $?\n" * 50))
    assert text.startswith("node spark-a: command ") and "\n" not in text and len(text) < 160, text
