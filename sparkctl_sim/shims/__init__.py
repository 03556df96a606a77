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
This module only re-exports the tools' public names, lazily (PEP 562): a shim
that runs ``nvidia-smi`` imports the nvidia-smi modules only.
"""

# ruff: noqa: F401 - the names are re-exported lazily: __all__ is built from _FROM, which ruff cannot read
from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:  # what a type checker sees; at run time __getattr__ imports on first use
    from sparkctl_sim.shims.common import (
        BDF_OF_NETDEV,
        GID_TABLE_LEN,
        NETDEV_OF,
        ROCE_DEVICES,
        SPARK_OUI,
        STATE_ENV,
        TOOLS,
        ZERO_GID,
        Gid,
        GpuProcess,
        GpuSample,
        Netdev,
        Netdevs,
        State,
        ToolResult,
    )
    from sparkctl_sim.shims.dispatch import (
        filter_ps,
        install_shims,
        main,
        ps_this_node,
        read_netdevs,
        read_process_names,
    )
    from sparkctl_sim.shims.ethtool import (
        CX7_LINK_MODES,
        ethtool,
    )
    from sparkctl_sim.shims.gb10 import (
        BOOST_SM_MHZ,
        CAP_POWER_W,
        IDLE_POWER_W,
        IDLE_SM_MHZ,
        PEAK_POWER_W,
        REASON_APP_CLOCKS,
        REASON_IDLE,
        REASON_SW_POWER_CAP,
        REASONS_LAYOUT,
        gpu_processes,
        gpu_sample,
    )
    from sparkctl_sim.shims.ibdev import (
        fabric_gid_index,
        gid_shift,
        gid_table,
        ibdev2netdev,
        is_ipv4_link_local,
        netdev_mac,
        render_sysfs_infiniband,
        roce_v2_ipv4_gid_index,
        show_gids,
        write_sysfs_infiniband,
    )
    from sparkctl_sim.shims.lspci import (
        LSPCI_NAME,
        lspci,
    )
    from sparkctl_sim.shims.nvidia_smi import (
        QUERY_SECTIONS,
        nvidia_smi,
        render_smi_q,
        render_smi_table,
        smi_lock_clocks,
        smi_query_apps,
        smi_query_gpu,
        smi_reset_clocks,
    )
    from sparkctl_sim.shims.perftest import (
        ib_write_bw,
        rail_bandwidth_gbps,
    )
    from sparkctl_sim.shims.run import run_tool
    from sparkctl_sim.shims.system import (
        apt_mark,
        getconf,
        uname,
    )

_FROM: dict[str, str] = {
    **dict.fromkeys((
        'BDF_OF_NETDEV', 'GID_TABLE_LEN', 'Gid', 'GpuProcess', 'GpuSample', 'NETDEV_OF', 'Netdev',
        'Netdevs', 'ROCE_DEVICES', 'SPARK_OUI', 'STATE_ENV', 'State', 'TOOLS', 'ToolResult',
        'ZERO_GID',
    ), 'common'),
    **dict.fromkeys((
        'filter_ps', 'install_shims', 'main', 'ps_this_node', 'read_netdevs', 'read_process_names',
    ), 'dispatch'),
    'run_tool': 'run',
    **dict.fromkeys((
        'CX7_LINK_MODES', 'ethtool',
    ), 'ethtool'),
    **dict.fromkeys((
        'BOOST_SM_MHZ', 'CAP_POWER_W', 'IDLE_POWER_W', 'IDLE_SM_MHZ', 'PEAK_POWER_W',
        'REASONS_LAYOUT', 'REASON_APP_CLOCKS', 'REASON_IDLE', 'REASON_SW_POWER_CAP',
        'gpu_processes', 'gpu_sample',
    ), 'gb10'),
    **dict.fromkeys((
        'fabric_gid_index', 'gid_shift', 'gid_table', 'ibdev2netdev', 'is_ipv4_link_local',
        'netdev_mac', 'render_sysfs_infiniband', 'roce_v2_ipv4_gid_index', 'show_gids',
        'write_sysfs_infiniband',
    ), 'ibdev'),
    **dict.fromkeys((
        'LSPCI_NAME', 'lspci',
    ), 'lspci'),
    **dict.fromkeys((
        'QUERY_SECTIONS', 'nvidia_smi', 'render_smi_q', 'render_smi_table', 'smi_lock_clocks',
        'smi_query_apps', 'smi_query_gpu', 'smi_reset_clocks',
    ), 'nvidia_smi'),
    **dict.fromkeys((
        'ib_write_bw', 'rail_bandwidth_gbps',
    ), 'perftest'),
    **dict.fromkeys((
        'apt_mark', 'getconf', 'uname',
    ), 'system'),
}

__all__ = sorted(_FROM)

# Three tools share their module's name: importing the module (as dispatch does) would bind the
# package attribute to the module, so their functions are bound here, eagerly (pure and light).
from sparkctl_sim.shims.ethtool import ethtool  # noqa: E402
from sparkctl_sim.shims.lspci import lspci  # noqa: E402
from sparkctl_sim.shims.nvidia_smi import nvidia_smi  # noqa: E402


def __getattr__(name: str) -> object:
    """``shims.X``: the submodule ``X``, or the public name ``X`` from the module that defines it."""
    mod = _FROM.get(name)
    if mod is None:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
