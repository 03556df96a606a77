"""The kernel data: releases known bad or good on GB10, with their evidence.

Owns reading sparkctl/plan/laws/kernels.yaml (shipped in the wheel beside this
module) and merging it with what an inventory or a profile adds
(``laws.kernels: {bad: {RELEASE: reason}, good: [RELEASE]}``). Pure: the file is
package data, read once; nothing here touches a host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from sparkctl.model.schema import KERNEL_RE

DATA_FILE = "kernels.yaml"


@dataclass(frozen=True)
class KernelEntry:
    release: str
    reason: str
    sources: tuple[str, ...]  # where the evidence is: a repository file or a public report's URL
    origin: str = "sparkctl"  # sparkctl (the data file) | inventory | profile


@dataclass(frozen=True)
class KernelBook:
    """The effective lists one check judges against."""

    bad: Mapping[str, KernelEntry]
    good: Mapping[str, KernelEntry]

    def verdict(self, release: str) -> str:
        """``bad`` | ``good`` | ``unknown``; bad wins over good."""
        if release in self.bad:
            return "bad"
        return "good" if release in self.good else "unknown"

    def pin(self) -> str | None:
        """The release to suggest: the first good one of the data file, else the first good one."""
        return next(iter(self.good), None)


def parse(text: str, origin: str = "sparkctl") -> KernelBook:
    """The data file's text -> a KernelBook; raises ValueError naming the entry at fault."""
    doc = yaml.safe_load(text) or {}
    out: dict[str, dict[str, KernelEntry]] = {"bad": {}, "good": {}}
    for kind in ("bad", "good"):
        for i, e in enumerate(doc.get(kind) or ()):
            rel = str(e.get("release", ""))
            if not re.fullmatch(KERNEL_RE[1:-1], rel):
                raise ValueError(f"{kind}[{i}]: release {rel!r} is not a kernel release")
            srcs = tuple(str(s.get("source", "")) for s in e.get("sources") or ())
            if not srcs or not all(srcs) or not all(s.get("says") for s in e["sources"]):
                raise ValueError(f"{kind}[{i}] ({rel}): every entry needs sources, each with source and says")
            out[kind][rel] = KernelEntry(rel, " ".join(str(e.get("reason", "")).split()), srcs, origin)
    return KernelBook(out["bad"], out["good"])


@lru_cache(maxsize=1)
def bundled() -> KernelBook:
    """The data file shipped with sparkctl."""
    return parse(resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8"))


def merged(base: KernelBook, *layers: tuple[str, Mapping[str, str], Sequence[str]]) -> KernelBook:
    """``base`` plus each (origin, bad {release: reason}, good [release]) layer, in order."""
    bad, good = dict(base.bad), dict(base.good)
    for origin, lbad, lgood in layers:
        for rel, why in lbad.items():
            bad.setdefault(rel, KernelEntry(rel, why, (), origin))
        for rel in lgood:
            good.setdefault(rel, KernelEntry(rel, f"qualified by the {origin}", (), origin))
    return KernelBook(bad, good)
