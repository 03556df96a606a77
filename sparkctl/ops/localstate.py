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

from sparkctl.errors import ConfigError, Ref
from sparkctl.model.inventory import Inventory


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


def _registered_inventory_file() -> Path:
    return state_home() / "default-inventory"


def register_inventory(path: Path | None) -> None:
    """Make ``path`` the inventory used when none is given (``None`` forgets it).

    The simulated cluster registers its inventory here at ``sim up``; the
    product only reads this pointer and never imports the simulator.
    """
    f = _registered_inventory_file()
    if path is None:
        f.unlink(missing_ok=True)
        return
    f.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    tmp.write_text(str(Path(path).resolve()) + "\n")
    os.replace(tmp, f)


def registered_inventory() -> Path | None:
    try:
        text = _registered_inventory_file().read_text().strip()
    except OSError:
        return None
    p = Path(text) if text else None
    return p if p is not None and p.is_file() else None
