"""Pinned wheels on the operator's machine: fetched once with pip, verified by SHA-256.

:func:`fetch_wheel` returns the cached file of a :class:`~sparkctl.model.wheels.PinnedWheel`,
downloading it first with pip (``pip download --no-deps --only-binary=:all:``: the index and
proxy the operator's pip is configured with) when the cache has no file with the pinned hash.
A file whose hash differs is never returned. It changes nothing but its cache directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sparkctl.errors import ConfigError
from sparkctl.model.wheels import PinnedWheel


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl" / "wheels"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_wheel(pin: PinnedWheel, cache_dir: Path) -> Path:
    """The verified wheel file of ``pin`` in ``cache_dir`` (downloaded with pip when missing)."""
    target = cache_dir / pin.filename
    if target.is_file() and _sha256(target) == pin.sha256:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                "-q", "-d", tmp, pin.requirement]
        if pin.platform != "any":
            argv[4:4] = ["--platform", pin.platform]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        got = Path(tmp) / pin.filename
        if r.returncode != 0 or not got.is_file():
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise ConfigError(f"cannot fetch {pin.filename} with pip: {tail}",
                              hint=f"put the file (sha256 {pin.sha256}) into {cache_dir} by hand")
        sha = _sha256(got)
        if sha != pin.sha256:
            raise ConfigError(f"{pin.filename}: sha256 {sha} is not the pinned {pin.sha256}",
                              hint="the index served another file under that name; sparkctl will not push it")
        os.replace(got, target)
    return target
