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
call starts a fresh interpreter), or send traffic anywhere (``ib_write_bw`` is
a model, not a benchmark).

SIMULATION ONLY: nothing on the real-hardware path imports this package.
This module only re-exports the tools' public names.
"""

from __future__ import annotations

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
    run_tool,
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
from sparkctl_sim.shims.system import (
    apt_mark,
    getconf,
    uname,
)

__all__ = [
    "BDF_OF_NETDEV",
    "BOOST_SM_MHZ",
    "CAP_POWER_W",
    "CX7_LINK_MODES",
    "GID_TABLE_LEN",
    "IDLE_POWER_W",
    "IDLE_SM_MHZ",
    "LSPCI_NAME",
    "NETDEV_OF",
    "PEAK_POWER_W",
    "QUERY_SECTIONS",
    "REASONS_LAYOUT",
    "REASON_APP_CLOCKS",
    "REASON_IDLE",
    "REASON_SW_POWER_CAP",
    "ROCE_DEVICES",
    "SPARK_OUI",
    "STATE_ENV",
    "TOOLS",
    "ZERO_GID",
    "Gid",
    "GpuProcess",
    "GpuSample",
    "Netdev",
    "Netdevs",
    "State",
    "ToolResult",
    "apt_mark",
    "ethtool",
    "fabric_gid_index",
    "filter_ps",
    "getconf",
    "gid_shift",
    "gid_table",
    "gpu_processes",
    "gpu_sample",
    "ib_write_bw",
    "ibdev2netdev",
    "install_shims",
    "is_ipv4_link_local",
    "lspci",
    "main",
    "netdev_mac",
    "nvidia_smi",
    "ps_this_node",
    "rail_bandwidth_gbps",
    "read_netdevs",
    "read_process_names",
    "render_smi_q",
    "render_smi_table",
    "render_sysfs_infiniband",
    "roce_v2_ipv4_gid_index",
    "run_tool",
    "show_gids",
    "smi_lock_clocks",
    "smi_query_apps",
    "smi_query_gpu",
    "smi_reset_clocks",
    "uname",
    "write_sysfs_infiniband",
]
