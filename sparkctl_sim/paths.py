"""Where the simulated cluster lives on this machine (SIMULATION ONLY)."""

from __future__ import annotations

import os
from pathlib import Path


def sim_root() -> Path:
    env = os.environ.get("SPARKCTL_SIM_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkctl" / "sim"


def default_inventory() -> Path:
    return sim_root() / "inventory.yaml"
