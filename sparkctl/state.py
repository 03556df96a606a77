"""sparkctl's own records on the operator's side: written atomically, read safely.

Per cluster (keyed by the inventory's absolute path), under
``$XDG_STATE_HOME/sparkctl/clusters/<name>-<hash>/``: the pending hardware-change
record (the AC-cycle law) and the cached run record. No host is touched here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError, Ref
from .inventory import Inventory


def state_home() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkctl"


def cluster_dir(inv: Inventory) -> Path:
    key = hashlib.sha256(str(Path(inv.file).resolve()).encode()).hexdigest()[:10]
    return state_home() / "clusters" / f"{inv.name}-{key}"


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    """Atomic: temp file in the same directory, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read sparkctl record: {exc}", Ref(file=str(path)),
                          hint="the record is damaged; move it away and re-run") from None


def hw_change_path(inv: Inventory) -> Path:
    return cluster_dir(inv) / "hw-change.json"
