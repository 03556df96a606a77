"""The public face of sparkctl's facts: one import for callers (``from sparkctl.facts import probes``).

Nothing is defined here; every name lives in the module that owns it:

* ``registry`` -- what a fact is (command, pure parser, exit codes), ProbeParseError;
* ``batch`` -- the registry of a node's facts, the batched script, its parser, ``gather``;
* ``nodefacts`` -- the values (NodeFacts and its parts);
* parsers grouped by tool: ``system`` (uname, getconf, apt-mark, /proc, df),
  ``gpu`` (nvidia-smi), ``net`` (ibdev2netdev, sysfs, ip, ethtool, GIDs,
  show_gids), ``pci`` (lspci), ``services`` (ps, ss, /v1/models, the weights
  agent), ``perftest`` (ib_write_bw);
* ``fabric`` -- the active fabric probes (pings, ib_write_bw between twins).
"""

from __future__ import annotations

from sparkctl.facts.batch import (
    MARKER_PREFIX,
    PRELUDE,
    REGISTRY,
    Section,
    build_script,
    gather,
    parse_batch,
    remote_command,
    section_title,
    split_batch,
)
from sparkctl.facts.fabric import FabricTarget, build_fabric_script, parse_fabric
from sparkctl.facts.gpu import (
    GPU_QUERY_FIELDS,
    REASON_BITS,
    REASON_LABELS,
    GpuQuery,
    SmiClocks,
    decode_reasons,
    parse_gpu_query,
    parse_smi_csv,
    parse_smi_q_clocks,
    parse_telemetry,
    smi_value,
    telemetry_command,
)
from sparkctl.facts.net import (
    GID_SLOTS,
    Ethtool,
    Gid,
    IbMapping,
    gid_ipv4,
    parse_ethtool,
    parse_gid_dump,
    parse_ibdev2netdev,
    parse_ipv4,
    parse_mtu,
    parse_operstate,
    parse_show_gids,
    rocev2_ipv4_gid_index,
)
from sparkctl.facts.nodefacts import EngineProc, GpuFacts, LinkFacts, NodeFacts, PcieFacts, WeightsSummary
from sparkctl.facts.pci import CX7_FUNCTIONS, parse_lspci_link
from sparkctl.facts.perftest import BwReport, BwRow, parse_bw_report, parse_ib_write_bw
from sparkctl.facts.registry import ExitCode, Fact, ProbeParseError, Registry, ScriptContext, WeightsPaths
from sparkctl.facts.services import (
    ENGINE_PATTERN,
    ENGINE_REGEX,
    MODELS_TIMEOUT_S,
    parse_engines,
    parse_listening_ports,
    parse_models,
    parse_weights_summary,
)
from sparkctl.facts.system import (
    CLOCK_LOCK_FILE,
    DiskFree,
    Meminfo,
    parse_boot_id,
    parse_clock_lock,
    parse_df,
    parse_held_packages,
    parse_hostname,
    parse_kernel,
    parse_meminfo,
    parse_page_size,
    parse_uptime,
)

__all__ = [
    "BwReport", "BwRow", "CLOCK_LOCK_FILE", "CX7_FUNCTIONS", "DiskFree", "ENGINE_PATTERN", "ENGINE_REGEX",
    "EngineProc", "Ethtool", "ExitCode", "FabricTarget", "Fact", "GID_SLOTS", "GPU_QUERY_FIELDS", "Gid",
    "GpuFacts", "GpuQuery", "IbMapping", "LinkFacts", "MARKER_PREFIX", "MODELS_TIMEOUT_S", "Meminfo",
    "NodeFacts", "PRELUDE", "PcieFacts", "ProbeParseError", "REASON_BITS", "REASON_LABELS", "REGISTRY",
    "Registry", "ScriptContext", "Section", "SmiClocks", "WeightsPaths", "WeightsSummary",
    "build_fabric_script", "build_script", "decode_reasons", "gather", "gid_ipv4", "parse_batch",
    "parse_boot_id", "parse_bw_report", "parse_clock_lock", "parse_df", "parse_engines", "parse_ethtool",
    "parse_fabric", "parse_gid_dump", "parse_gpu_query", "parse_held_packages", "parse_hostname",
    "parse_ib_write_bw", "parse_ibdev2netdev", "parse_ipv4", "parse_kernel", "parse_listening_ports",
    "parse_lspci_link", "parse_meminfo", "parse_models", "parse_mtu", "parse_operstate", "parse_page_size",
    "parse_show_gids", "parse_smi_csv", "parse_smi_q_clocks", "parse_telemetry", "parse_uptime",
    "parse_weights_summary", "remote_command", "rocev2_ipv4_gid_index", "section_title", "smi_value",
    "split_batch", "telemetry_command",
]
