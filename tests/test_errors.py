"""Every error class survives phase annotation with all its fields (issue: `up` once turned an
error with more constructor arguments into `internal error: TypeError`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import sparkctl
import sparkctl_sim
from sparkctl.errors import Ref, SparkctlError


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
