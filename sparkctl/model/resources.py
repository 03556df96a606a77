"""Where profiles and templates are found.

Search order, first match wins: ``--root DIR`` (or ``SPARKCTL_ROOT``), the
directory holding the inventory, then the bundled ones (inside the installed
wheel as ``sparkctl/_bundled``, or the source checkout's top directory).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import NotFound
from sparkctl.model.schema import NAME_RE

_PKG = Path(__file__).resolve().parent.parent  # the sparkctl package


def bundled_root() -> Path:
    installed = _PKG / "_bundled"
    if (installed / "profiles").is_dir():
        return installed
    return _PKG.parent  # a source checkout: profiles/ and templates/ beside the package


@dataclass(frozen=True)
class Roots:
    """Ordered search roots (highest precedence first)."""

    dirs: tuple[Path, ...]

    @classmethod
    def make(cls, root: str | None = None, inventory: str | None = None, env: dict[str, str] | None = None) -> "Roots":
        env = dict(os.environ) if env is None else env
        dirs: list[Path] = []
        user = root or env.get("SPARKCTL_ROOT")
        if user:
            dirs.append(Path(user).expanduser())
        if inventory:
            dirs.append(Path(inventory).expanduser().resolve().parent)
        dirs.append(bundled_root())
        uniq: list[Path] = []
        for d in dirs:
            if d.resolve() not in [u.resolve() for u in uniq]:
                uniq.append(d)
        return cls(tuple(uniq))

    def template_dirs(self) -> list[str]:
        return [str(d / "templates") for d in self.dirs if (d / "templates").is_dir()]

    def profile_path(self, name: str) -> Path:
        if not re.fullmatch(NAME_RE[1:-1], name):  # not re.match: '$' lets a trailing newline in
            raise NotFound(f"profile name {name!r} is not valid", hint="names use letters, digits, '.', '_', '-'")
        for d in self.dirs:
            p = d / "profiles" / f"{name}.yaml"
            if p.is_file():
                return p
        raise NotFound(
            f"no profile named {name!r}",
            hint=f"`sparkctl profiles` lists them; searched {', '.join(str(d / 'profiles') for d in self.dirs)}",
        )

    def all_profiles(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for d in reversed(self.dirs):  # lower precedence first, overwritten by higher
            pd = d / "profiles"
            if pd.is_dir():
                for p in sorted(pd.glob("*.yaml")):
                    found[p.stem] = p
        return dict(sorted(found.items()))
