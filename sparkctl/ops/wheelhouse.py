"""Fetch a pinned wheel into the operator's local cache, verified by its SHA-256.

The operator's machine has the package index; the nodes need not. ``fetch_wheel``
asks pip for exactly the pinned file for the node's platform (``pip download
--no-deps --only-binary :all: --platform P --implementation cp --abi A``), keeps
it only if its SHA-256 is the pinned one, and returns the cached path; a cached
file that matches is used without asking the index again. Nothing on a node
changes here: pushing and unpacking are plan steps (``sparkctl.plan.gatewayplan``).

Default cache: ``$XDG_CACHE_HOME/sparkctl/wheels`` (``~/.cache``);
``SPARKCTL_WHEEL_CACHE`` names another.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sparkctl.errors import ConfigError, Ref
from sparkctl.model.wheels import PinnedWheel


def default_cache() -> Path:
    if os.environ.get("SPARKCTL_WHEEL_CACHE"):
        return Path(os.environ["SPARKCTL_WHEEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl" / "wheels"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached(pin: PinnedWheel, cache_dir: Path) -> Path | None:
    path = cache_dir / pin.filename
    return path if path.is_file() and sha256_file(path) == pin.sha256 else None


def pip_download_argv(pin: PinnedWheel, dest: Path) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--platform", pin.pip_platform, "--implementation", "cp", "--abi", pin.abi,
            "--disable-pip-version-check", "-q", "-d", str(dest)]
    if pin.python:
        argv += ["--python-version", pin.python]
    else:
        argv += ["--python-version", pin.min_python]
    return [*argv, pin.spec]


def fetch_wheel(pin: PinnedWheel, cache_dir: Path | None = None) -> Path:
    """The pinned wheel in ``cache_dir`` (fetched when missing), its SHA-256 verified."""
    cache_dir = cache_dir or default_cache()
    hit = cached(pin, cache_dir)
    if hit:
        return hit
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as tmp:
        try:
            p = subprocess.run(pip_download_argv(pin, Path(tmp)), capture_output=True, text=True, timeout=600,
                               check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot fetch {pin.filename}: {exc}", Ref(key=pin.spec),
                              hint="the operator's machine fetches the wheel from the package index") from None
        got = Path(tmp) / pin.filename
        if p.returncode != 0 or not got.is_file():
            last = (p.stderr.strip().splitlines() or [f"pip exit {p.returncode}"])[-1]
            raise ConfigError(f"cannot fetch {pin.filename}: {last}", Ref(key=pin.spec),
                              hint=f"or place the file in {cache_dir} (SPARKCTL_WHEEL_CACHE)")
        digest = sha256_file(got)
        if digest != pin.sha256:
            raise ConfigError(f"{pin.filename}: SHA-256 {digest[:16]}... is not the pinned {pin.sha256[:16]}...",
                              Ref(key=pin.spec), hint="the index served other bytes than the ones sparkctl pins; "
                              "nothing was installed")
        dest = cache_dir / pin.filename
        shutil.move(str(got), dest)
        return dest
