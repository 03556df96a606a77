"""GB10 vendor-tool shims for the simulated DGX Spark cluster, one module per tool.

Each simulated node runs these instead of ``nvidia-smi`` (:mod:`.nvidia_smi`,
with the GB10 clock/power model in :mod:`.gb10`), ``ibdev2netdev`` and
``show_gids`` and the sysfs GID table (:mod:`.ibdev`), ``ethtool``
(:mod:`.ethtool`), ``lspci`` (:mod:`.lspci`), ``uname``, ``getconf``,
``apt-mark`` (:mod:`.system`) and ``ib_write_bw``
(:mod:`.perftest`). The output formats copy the real tools as captured on real
Sparks (docs: docs/reference/spark-facts.md; verbatim copies under
tests/fixtures/spark/), so that sparkctl's probes parse the simulation exactly
as they parse the hardware.

What this package owns:

* pure formatters ``tool(state, args, ...) -> ToolResult`` (no I/O, no clock,
  no uid lookups: the clock, the euid, the netdev facts and the GPU process
  list are arguments), shared types in :mod:`.common`;
* the edges, all in :mod:`.dispatch`: :func:`read_netdevs` (the REAL kernel of
  the namespace the shim runs in), :func:`install_shims` and :func:`main`
  (``python3 -m sparkctl_sim.shims TOOL``), the only function that reads the
  state file, ``/sys``, ``/proc`` or the clock, writes state, prints or exits;
  :func:`write_sysfs_infiniband` (in :mod:`.ibdev`) writes the sysfs tree.

What it must not do: import anything outside the standard library (every shim
call starts a fresh interpreter, ``python3 -S``), or send traffic anywhere (``ib_write_bw`` is
a model, not a benchmark).

SIMULATION ONLY: nothing on the real-hardware path imports this package.
This module only re-exports the tools' public names, lazily (PEP 562: ``shims.X`` is
``X`` of the first tool module that has it): a shim that runs ``nvidia-smi`` imports
the nvidia-smi modules only.
"""

from __future__ import annotations

import importlib

# where shims.X is looked up, in order (the modules' own names; nothing imports them until asked)
_MODULES = ("common", "dispatch", "run", "ethtool", "gb10", "ibdev", "lspci", "nvidia_smi", "perftest", "system")

# Three tools share their module's name: importing the module (as dispatch does) would bind the
# package attribute to the module, so their functions are bound here, eagerly (pure and light).
from sparkctl_sim.shims.ethtool import ethtool  # noqa: E402, F401
from sparkctl_sim.shims.lspci import lspci  # noqa: E402, F401
from sparkctl_sim.shims.nvidia_smi import nvidia_smi  # noqa: E402, F401


def __getattr__(name: str) -> object:
    """``shims.X``: the submodule ``X``, or the public name ``X`` of the first of :data:`_MODULES` that has it."""
    if not name.startswith("_"):
        if name in _MODULES:
            return importlib.import_module(f"{__name__}.{name}")
        for mod in _MODULES:
            value = getattr(importlib.import_module(f"{__name__}.{mod}"), name, _MISSING)
            if value is not _MISSING:
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MISSING = object()
