"""Probes: real captured output beside the value it must parse to.

The fixtures under tests/fixtures/spark/ are byte-exact copies of captures in
docs/reference/spark-facts.md (tests/fixtures/spark/SOURCES.md says where each came from).
Formats with no real capture are tested with small inline samples, marked
FORMAT SAMPLE. Then: truncated and garbled captures never crash a parser or
parse_batch, and the batched script runs under ``sh`` against a fake
sysfs/proc tree and stub tools in ONE invocation.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkctl.facts.batch import (
    PRELUDE,
    REGISTRY,
    build_script,
    gather,
    parse_batch,
    remote_command,
    section_title,
    split_batch,
)
from sparkctl.facts.batch import frame as batch_frame
from sparkctl.facts.fabric import FabricTarget, build_fabric_script, parse_fabric
from sparkctl.facts.gpu import SmiClocks, decode_reasons, parse_gpu_query, parse_smi_csv, parse_smi_q_clocks
from sparkctl.facts.net import (
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
from sparkctl.facts.perftest import parse_bw_report, parse_ib_write_bw
from sparkctl.facts.registry import ProbeParseError, WeightsPaths
from sparkctl.facts.services import parse_engines, parse_listening_ports, parse_models, parse_weights_summary
from sparkctl.facts.system import (
    DiskFree,
    Meminfo,
    parse_boot_id,
    parse_df,
    parse_held_packages,
    parse_hostname,
    parse_kernel,
    parse_meminfo,
    parse_page_size,
    parse_uptime,
)
from sparkctl.model.inventory import Node
from sparkctl.model.schema import default_ports

FIX = Path(__file__).parent / "fixtures" / "spark"


def fx(name: str) -> str:
    return (FIX / name).read_text()


def spark_node(sysfs: str = "/sys", proc: str = "/proc", name: str = "spark-a", sudo: bool = False) -> Node:
    return Node(name=name, index=0, host="192.0.2.1", ssh_user="nvidia", ssh_port=22, ssh_identity=None,
                sudo=sudo, known_hosts=None, prefix="/opt/sparkctl", sysfs_root=sysfs, proc_root=proc,
                mgmt_iface="enP7s7", ports=default_ports())


def csv(fields: str) -> Callable[[str], Any]:
    return lambda text: parse_smi_csv(text, fields.split(","))


UP, DOWN = True, False
IB_5C2D = {
    "enp1s0f0np0": IbMapping("rocep1s0f0", 1, "enp1s0f0np0", UP),
    "enp1s0f1np1": IbMapping("rocep1s0f1", 1, "enp1s0f1np1", DOWN),
    "enP2p1s0f0np0": IbMapping("roceP2p1s0f0", 1, "enP2p1s0f0np0", UP),
    "enP2p1s0f1np1": IbMapping("roceP2p1s0f1", 1, "enP2p1s0f1np1", DOWN),
}
IB_PORT1 = {k: IbMapping(v.rdma, 1, k, not v.up) for k, v in IB_5C2D.items()}

# ---------------------------------------------------------------- real captures -> values
# (fixture file, parser, the value it must parse to)
REAL: list[tuple[str, Callable[[str], Any], Any]] = [
    # §2.1 both orderings, (Up)/(Down)
    ("ibdev2netdev-spark-5c2d.txt", parse_ibdev2netdev, IB_5C2D),
    ("ibdev2netdev-roceP2-first.txt", parse_ibdev2netdev, IB_5C2D),
    ("ibdev2netdev-port1.txt", parse_ibdev2netdev, IB_PORT1),
    # §1.3 csv: header / noheader, units / nounits, [N/A]
    ("nvidia-smi-csv-name-cc-driver.txt", csv("name,compute_cap,driver_version"),
     [{"name": "NVIDIA GB10", "compute_cap": "12.1", "driver_version": "580.159.03"}]),
    ("nvidia-smi-csv-memory-header.txt", csv("index,name,memory.total,memory.free"),
     [{"index": "0", "name": "NVIDIA GB10", "memory.total": None, "memory.free": None}]),
    ("nvidia-smi-csv-memory-nounits.txt", csv("index,name,memory.total,memory.used,memory.free"),
     [{"index": "0", "name": "NVIDIA GB10", "memory.total": None, "memory.used": None, "memory.free": None}]),
    ("nvidia-smi-csv-clocks-header-units.txt",
     csv("name,clocks.current.graphics,clocks.max.graphics,temperature.gpu,power.draw"),
     [{"name": "NVIDIA GB10", "clocks.current.graphics": "2522", "clocks.max.graphics": "3003",
       "temperature.gpu": "50", "power.draw": "15.57"}]),
    *[(f, csv("index,name,driver_version,clocks.sm,clocks.max.sm,clocks.applications.graphics,"
              "clocks_event_reasons.active,persistence_mode,utilization.gpu"),
       [{"index": "0", "name": "NVIDIA GB10", "driver_version": "580.159.03", "clocks.sm": "2190",
         "clocks.max.sm": "3003", "clocks.applications.graphics": "2418",
         "clocks_event_reasons.active": "0x0000000000000000", "persistence_mode": "Enabled",
         "utilization.gpu": "97"}])
      for f in ("nvidia-smi-csv-clocks-noheader-units.txt", "nvidia-smi-csv-clocks-noheader-nounits.txt")],
    ("nvidia-smi-csv-name-cc-driver-pm-maxsm.txt", csv("name,compute_cap,driver_version,persistence_mode,clocks.max.sm"),
     [{"name": "NVIDIA GB10", "compute_cap": "12.1", "driver_version": "580.173.02", "persistence_mode": "Enabled",
       "clocks.max.sm": "3003"}]),
    ("nvidia-smi-csv-sm-maxsm.txt", csv("clocks.sm,clocks.max.sm"), [{"clocks.sm": "2405", "clocks.max.sm": "3003"}]),
    # §1.2 the real -q excerpt: the Clocks title was cut by the author, no lock field exists
    ("nvidia-smi-q-clock-event-reasons-node0.txt", parse_smi_q_clocks,
     SmiClocks(sm_mhz=2398, max_sm_mhz=3003, applications_mhz=2418, default_applications_mhz=2418,
               lock_max_mhz=None, event_reasons=())),
    # §3.1 ethtool (grepped, tabs or spaces; full layout from another machine)
    ("ethtool-grep-speed-link-200g.txt", parse_ethtool, Ethtool(200000, True)),
    ("ethtool-grep-speed-100g.txt", parse_ethtool, Ethtool(100000, None)),
    ("ethtool-grep-mgmt-enP7s7.txt", parse_ethtool, Ethtool(10000, True)),
    ("ethtool-full-cx4lx-other-machine.txt", parse_ethtool, Ethtool(25000, True)),
    # §3.4 lspci LnkCap/LnkSta: healthy Spark, degraded (spaces, (ok)/(downgraded)), tabs
    ("lspci-vvv-lnk-healthy.txt", parse_lspci_link, PcieFacts("", 32.0, 4, 32.0, 4, False)),
    ("lspci-vv-degraded-block-other-machine.txt", parse_lspci_link, PcieFacts("", 5.0, 4, 2.5, 4, True)),
    ("lspci-vv-degraded-tabs-other-machine.txt", parse_lspci_link, PcieFacts("", 16.0, 8, 2.5, 4, True)),
    # §5.4 meminfo
    ("meminfo-head.txt", parse_meminfo, Meminfo(127600816, 40174336, 3139656, 37694160)),
    ("meminfo-head-3-lines.txt", parse_meminfo, Meminfo(127601452, 115669068, 45557560)),
    # §5.3 (modelled fixture: no real capture exists)
    ("apt-mark-showhold-modelled-fixture.txt", parse_held_packages, [
        "linux-headers-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04",
        "linux-modules-nvidia-580-open-nvidia-hwe-24.04", "linux-modules-nvidia-fs-nvidia-hwe-24.04",
        "linux-nvidia-hwe-24.04", "linux-tools-nvidia-hwe-24.04"]),
    # §6.4 /v1/models
    ("v1-models-vllm.json", parse_models, ["swiss-ai/Apertus-8B-Instruct-2509"]),
    ("v1-models-sglang-wrapped.json", parse_models, ["deepseek-v4.1-flash"]),
    ("v1-models-sglang.json", parse_models, ["glm-5.2-fp8"]),
    ("v1-models-llamacpp.json", parse_models, ["qwen3-8b"]),
    # sparkctl's own agent: what the hash cache vouches for under the weights path
    ("weights-summary-agent-verified.json", parse_weights_summary, WeightsSummary(
        "dir", 2, 3000017, "afa1aaa17f47826da4b1dd55b801aa10f01fc968013ed996ab718782b1eefcce", 0, (), 1)),
    ("weights-summary-agent-unverified.json", parse_weights_summary, WeightsSummary(
        "dir", 2, 3000022, None, 1, ("config.json",), 1)),
    # §2.2 show_gids (Spark rows; the full table layout is from another Mellanox box)
    ("show_gids-spark-rows.txt", parse_show_gids, {"rocep1s0f0": {
        1: Gid(1, "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39", "RoCE v2", "enp1s0f0np0"),
        3: Gid(3, "0000:0000:0000:0000:0000:ffff:c0a8:640a", "RoCE v2", "enp1s0f0np0")}}),
    # the same rows and the full table as pasted from a terminal: tabs became spaces
    ("show_gids-spark-rows-pasted-spaces.txt", parse_show_gids, {"rocep1s0f0": {
        1: Gid(1, "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39", "RoCE v2", "enp1s0f0np0"),
        3: Gid(3, "0000:0000:0000:0000:0000:ffff:c0a8:640a", "RoCE v2", "enp1s0f0np0")}}),
    *[(f, parse_show_gids, {"mlx5_0": {
        0: Gid(0, "fe80:0000:0000:0000:0ac0:ebff:fe21:03da", "IB/RoCE v1", "rdma0"),
        1: Gid(1, "fe80:0000:0000:0000:0ac0:ebff:fe21:03da", "RoCE v2", "rdma0"),
        2: Gid(2, "0000:0000:0000:0000:0000:ffff:c0a8:d3f2", "IB/RoCE v1", "rdma0"),
        3: Gid(3, "0000:0000:0000:0000:0000:ffff:c0a8:d3f2", "RoCE v2", "rdma0")}})
      for f in ("show_gids-mlx5-full.txt", "show_gids-mlx5-full-pasted-spaces.txt")],
    # ethtool with no Speed line at all (no link-modes reply): unknown, not 0
    ("ethtool-lo-no-speed-line-this-machine.txt", parse_ethtool, Ethtool(None, True)),
    # §4.1 ib_write_bw: BW average in Gb/s whatever unit the header gives
    ("ib_write_bw-rdma-cm.txt", parse_ib_write_bw, 111.71),
    ("ib_write_bw-run-infinitely.txt", parse_ib_write_bw, 92.57),  # two rows of one size: their mean
    ("ib_write_bw-mb-sec-constructed.txt", parse_ib_write_bw, 111.71),  # 13316.87 x 2^20 B/s
    ("ib_write_bw-mib-sec-constructed.txt", parse_ib_write_bw, 111.71),
    ("ib_write_bw-cpu-util-constructed.txt", parse_ib_write_bw, 109.17),
]


@pytest.mark.parametrize("name,parser,expected", REAL, ids=[r[0] for r in REAL])
def test_real_capture_parses(name: str, parser: Callable[[str], Any], expected: Any) -> None:
    assert parser(fx(name)) == expected


@pytest.mark.parametrize("name,parser,expected", REAL, ids=[r[0] for r in REAL])
def test_real_capture_tolerates_trailing_whitespace_and_crlf_free_variants(
        name: str, parser: Callable[[str], Any], expected: Any) -> None:
    text = fx(name)
    assert parser("\n".join(line + "  " for line in text.split("\n"))) == expected
    assert parser(text.rstrip("\n")) == expected


# Real single values quoted inline in docs/reference/spark-facts.md (§5.1, §5.2, §5.5, §2.4, §3.1).
REAL_INLINE: list[tuple[str, Callable[[str], Any], Any]] = [
    *[(f"{k}\n", parse_kernel, k) for k in (
        "6.17.0-1021-nvidia", "6.17.0-1014-nvidia", "6.17.0-1008-nvidia", "6.17.0-1032-nvidia",
        "7.0.0-1019-nvidia", "6.11.0-1016-nvidia", "6.8.0-49-generic")],
    ("4096\n", parse_page_size, 4096),  # expected value; no Spark capture exists
    ("13dc5579-455c-45c8-8e4d-d09c457fa826\n", parse_boot_id, "13dc5579-455c-45c8-8e4d-d09c457fa826"),
    ("f50a1be6-7626-4a2f-90f0-08c77b16c9f1\n", parse_boot_id, "f50a1be6-7626-4a2f-90f0-08c77b16c9f1"),
    ("spark-2a60\n", parse_hostname, "spark-2a60"),
    ("aitopatom-9ab9\n", parse_hostname, "aitopatom-9ab9"),
    # link down, assembled from the three strings quoted in §3.1
    ("\tSpeed: Unknown!\n\tDuplex: Unknown! (255)\n\tLink detected: no\n", parse_ethtool, Ethtool(None, False)),
    # §3.2 ip -br addr line (redacted address as captured)
    ("enp1s0f0np0      UP             192.0.2.10/24 \n", parse_ipv4, "192.0.2.10/24"),
]


@pytest.mark.parametrize("text,parser,expected", REAL_INLINE)
def test_real_inline_values(text: str, parser: Callable[[str], Any], expected: Any) -> None:
    assert parser(text) == expected


# FORMAT SAMPLES: no capture exists in docs/reference/spark-facts.md; the layout is the tool's documented one.
FORMAT_SAMPLES: list[tuple[str, Callable[[str], Any], Any]] = [
    ("Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
     "/dev/nvme0n1p2  3844640564 123456789 3525355500       4% /\n", parse_df,
     DiskFree(3525355500, "/")),
    ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
     "map auto_home 0 0 0 100% /System/Volumes/Data/home\n", parse_df,
     DiskFree(0, "/System/Volumes/Data/home")),
    ("1163.51 1405.68\n", parse_uptime, 1163.51),
    ("    PID COMMAND\n 400721 python3 -m vllm.entrypoints.openai.api_server --port 8000\n"
     "   8812 sh -c echo @@sparkctl:manifest:x@@ ; ps -eo pid,args | grep -iE [v]llm\n"
     "   9001 /usr/bin/llama-server -m /models/q.gguf\n", parse_engines,
     [EngineProc(400721, "python3 -m vllm.entrypoints.openai.api_server --port 8000"),
      EngineProc(9001, "/usr/bin/llama-server -m /models/q.gguf")]),
    ("    PID COMMAND\n", parse_engines, []),
    ('LISTEN 0      4096         0.0.0.0:8000      0.0.0.0:*    users:(("python3",pid=1,fd=3))\n'
     "LISTEN 0      128             [::]:22           [::]:*\n"
     "LISTEN 0      4096   127.0.0.53%lo:53        0.0.0.0:*\n", parse_listening_ports, {8000, 22, 53}),
    ("State  Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n", parse_listening_ports, set()),
    ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
     "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0\n"
     "   1: 0100007F:A1B2 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1\n",
     parse_listening_ports, {8000}),
    ("5: enp1s0f0np0    inet 192.168.100.10/24 brd 192.168.100.255 scope global enp1s0f0np0\\"
     "       valid_lft forever preferred_lft forever\n", parse_ipv4, "192.168.100.10/24"),
    ("", parse_ipv4, None),
    ("", parse_held_packages, []),
    ("up\n", parse_operstate, "up"),
    ("9000\n", parse_mtu, 9000),
    # the gids section the script prints (values: the real drifted table of §2.4)
    ("rocep1s0f0|0|fe80:0000:0000:0000:4ebb:47ff:fee8:9f39|enp1s0f0np0|IB/RoCE v1\n"
     "rocep1s0f0|3|0000:0000:0000:0000:0000:0000:0000:0000||\n"
     "rocep1s0f0|4|0000:0000:0000:0000:0000:ffff:c0a8:640a|enp1s0f0np0|RoCE v2\n", parse_gid_dump,
     {"rocep1s0f0": {0: Gid(0, "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39", "IB/RoCE v1", "enp1s0f0np0"),
                     3: Gid(3, "0000:0000:0000:0000:0000:0000:0000:0000", None, None),
                     4: Gid(4, "0000:0000:0000:0000:0000:ffff:c0a8:640a", "RoCE v2", "enp1s0f0np0")}}),
]


@pytest.mark.parametrize("text,parser,expected", FORMAT_SAMPLES)
def test_format_samples(text: str, parser: Callable[[str], Any], expected: Any) -> None:
    assert parser(text) == expected


def test_gpu_query_line_composed_from_real_pieces() -> None:
    # §1.3: the exact eight-field line was never captured; its cells are real.
    for line in ("NVIDIA GB10, 12.1, 580.159.03, 2190, 3003, 0x0000000000000000, 5.30, 47",
                 "NVIDIA GB10, 12.1, 580.159.03, 2190 MHz, 3003 MHz, 0x0000000000000000, 5.30 W, 47"):
        q = parse_gpu_query(line + "\n")
        assert (q.name, q.compute_cap, q.driver, q.sm_mhz, q.max_sm_mhz, q.event_reasons_mask, q.power_w, q.temp_c) \
            == ("NVIDIA GB10", "12.1", "580.159.03", 2190, 3003, 0, 5.30, 47)
    q = parse_gpu_query("NVIDIA GB10, 12.1, 580.173.02, [N/A], 3003, [Not Supported], [N/A], 39\n")
    assert (q.sm_mhz, q.event_reasons_mask, q.power_w) == (None, None, None)
    assert decode_reasons(0x3) == ("gpu_idle", "applications_clocks_setting")
    assert decode_reasons(0x400) == ("reason_0x400",)


def test_rocev2_gid_index_follows_the_drift() -> None:
    drifted = parse_gid_dump(FORMAT_SAMPLES[-1][0])["rocep1s0f0"]
    assert rocev2_ipv4_gid_index(drifted, "enp1s0f0np0", "192.168.100.10/24") == 4
    assert rocev2_ipv4_gid_index(drifted, "enp1s0f0np0", "192.168.100.11/24") is None  # stale GID
    assert rocev2_ipv4_gid_index(drifted, "enP2p1s0f0np0") is None  # another netdev's GID
    spark = parse_show_gids(fx("show_gids-spark-rows.txt"))["rocep1s0f0"]
    assert rocev2_ipv4_gid_index(spark, "enp1s0f0np0", "192.168.100.10/24") == 3
    mlx = parse_show_gids(fx("show_gids-mlx5-full.txt"))["mlx5_0"]
    assert rocev2_ipv4_gid_index(mlx, "rdma0", "192.168.211.242/24") == 3
    assert gid_ipv4("0000:0000:0000:0000:0000:ffff:c0a8:640a") == "192.168.100.10"


# Clock lock: no real driver output carries it (see probes' docstring); these are
# the ASSUMED spellings a driver or the simulator may print, and their absence.
LOCK_CASES = [
    ("    Locked Clocks\n        Graphics Min : 0 MHz\n        Graphics Max : 1976 MHz\n", 1976),
    ("    GPU Locked Clocks\n        Min : 0 MHz\n        Max : 2200 MHz\n", 2200),
    ("    Clocks\n        SM : 1976 MHz\n        Locked Graphics Clock Max : 2000 MHz\n", 2000),
    ("    Locked Clocks\n        Graphics Max : N/A\n", None),
    (fx("nvidia-smi-q-clock-event-reasons-node0.txt"), None),
]


@pytest.mark.parametrize("text,lock", LOCK_CASES)
def test_clock_lock_reading(text: str, lock: int | None) -> None:
    assert parse_smi_q_clocks(text).lock_max_mhz == lock


def test_applications_clocks_reason_from_q() -> None:
    text = fx("nvidia-smi-q-clock-event-reasons-node0.txt").replace(
        "Applications Clocks Setting                    : Not Active",
        "Applications Clocks Setting                    : Active")
    assert parse_smi_q_clocks(text).event_reasons == ("applications_clocks_setting",)


GARBAGE: list[tuple[Callable[[str], Any], str]] = [
    (parse_ibdev2netdev, "rocep1s0f0 port one ==> x\n"),
    (parse_ibdev2netdev, ""),
    (parse_meminfo, "MemTotal: 10 kB\n"),
    (parse_meminfo, "MemTotal: lots\n"),
    (parse_page_size, "4095\n"),
    (parse_page_size, "4096\n4096\n"),
    (parse_kernel, "uname: command not found\n"),
    (parse_boot_id, "13dc5579-455c\n"),
    (parse_uptime, "abc\n"),
    (parse_df, "df: /x: No such file or directory\n"),
    (parse_gpu_query, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"),
    (parse_gpu_query, "NVIDIA GB10, 12.1\n"),
    (parse_smi_q_clocks, ""),
    (parse_smi_q_clocks, "    Clocks Event Reasons\n        Idle : maybe\n"),
    (parse_ethtool, "Settings for enp1s0f0np0:\n"),
    (parse_ethtool, "\tSpeed: fast\n"),
    (parse_lspci_link, ""),
    (parse_lspci_link, "0000:01:00.0 Ethernet controller: Mellanox\n\tCapabilities: <access denied>\n"),
    (parse_engines, "400721 vllm\n"),
    (parse_listening_ports, "garbage here\n"),
    (parse_models, ""),
    (parse_models, '{"detail":"Not Found"}'),
    (parse_models, "[" * 100000),
    (parse_operstate, "sideways\n"),
    (parse_mtu, "12\n"),
    (parse_ipv4, "inet 999.1.1.1/24\n"),
    (parse_gid_dump, ""),
    (parse_held_packages, "E: Could not open lock file\n"),
    (parse_weights_summary, ""),
    (parse_weights_summary, "Traceback (most recent call last):\n"),
    (parse_weights_summary, '{"event":"error","message":"permission denied"}\n'),
    (parse_weights_summary, '{"event":"summary","kind":"dir","files":-1}\n'),
    (parse_weights_summary, '{"event":"summary","kind":"dir","digest":"xyz"}\n'),
    (parse_weights_summary, '{"event":"summary","kind":"sideways"}\n'),
    # units checked against the header or the tool's one format, never stripped and trusted
    (csv("clocks.sm,clocks.max.sm"), "clocks.sm [GHz], clocks.max.sm [GHz]\n2.40 GHz, 3.00 GHz\n"),
    (csv("clocks.sm,clocks.max.sm"), "2405 W, 3003 MHz\n"),
    (parse_gpu_query, "NVIDIA GB10, 12.1, 580.159.03, 2190 MHz, 3003 MHz, 0x0, 5.30 MHz, 47\n"),
    (parse_ethtool, "\tSpeed: 200Gb/s\n\tLink detected: yes\n"),
    (parse_ethtool, "\tSpeed: 200000Mb/s\n\tSpeed: 100000Mb/s\n"),  # two interfaces pasted
    (parse_lspci_link, "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x4\n\t\tLnkSta:\tSpeed unknown, Width x0\n"),
    (parse_lspci_link, fx("lspci-vvv-lnk-healthy.txt") * 2),  # two devices
    (parse_df, "Filesystem     1K-blocks      Used Available Use% Mounted on\n/dev/x 10 5 5 50% /\n"),
    (parse_meminfo, "MemTotal:       127600816\nMemAvailable:   40174336\n"),  # no kB
    # show_gids: cells read by content, so a misaligned paste is refused, not shifted
    (parse_show_gids, "mlx5_0  1  3  0000:0000:0000:0000:0000:ffff:c0a8:d3f2  192.168.9.9  v2  rdma0\n"),
    (parse_show_gids, "mlx5_0  1  3  0000:0000:0000:0000:0000:ffff:c0a8:d3f2  192.168.211.242  rdma0\n"),
    (parse_show_gids, fx("show_gids-mlx5-full.txt").replace("n_gids_found=4", "n_gids_found=5")),
    (parse_show_gids, "mlx5_0  1  3  0000:0000:0000:0000:0000:ffff:c0a8:d3f2  v2  rdma0  extra\n"),
    # ib_write_bw: the known failure (header, no row, exit 0), unknown units and columns
    (parse_ib_write_bw, fx("ib_write_bw-rdma-cm.txt").split(" 65536")[0]),
    (parse_ib_write_bw, fx("ib_write_bw-rdma-cm.txt").replace("[Gb/sec]", "[KB/sec]")),
    (parse_ib_write_bw, fx("ib_write_bw-rdma-cm.txt").replace("BW peak[Gb/sec]", "BW peak[MB/sec]")),
    (parse_ib_write_bw, fx("ib_write_bw-rdma-cm.txt").replace("MsgRate[Mpps]", "MsgRate[Mpps]  Extra[x]")),
    (parse_ib_write_bw, fx("ib_write_bw-cpu-util-constructed.txt").replace("    CPU_Util[%]", "")),
    (parse_ib_write_bw, fx("ib_write_bw-rdma-cm.txt").replace(" #bytes", " #octets")),
    (parse_ib_write_bw, "************************************\n* Waiting for client to connect... *\n"),
]


@pytest.mark.parametrize("parser,text", GARBAGE)
def test_garbage_raises_probe_parse_error(parser: Callable[[str], Any], text: str) -> None:
    with pytest.raises(ProbeParseError) as exc:
        parser(text)
    assert exc.value.what and exc.value.detail


def test_lspci_access_denied_gets_a_hint() -> None:
    with pytest.raises(ProbeParseError, match="root"):
        parse_lspci_link("\tCapabilities: <access denied>\n")


# ---------------------------------------------------------------- fuzz: parsers

def _mutate(data: st.DataObject, text: str) -> str:
    raw = bytearray(text.encode())
    how = data.draw(st.sampled_from(["cut", "flip", "insert", "empty", "dup"]))
    if how == "empty" or not raw:
        return ""
    i = data.draw(st.integers(0, len(raw) - 1))
    if how == "cut":
        return raw[:i].decode(errors="replace")
    if how == "flip":
        raw[i] = data.draw(st.integers(0, 255))
    elif how == "insert":
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        raw[i:i] = raw[: data.draw(st.integers(0, len(raw)))]
    return raw.decode(errors="replace")


@given(st.data())
def test_mutated_captures_give_a_value_or_probe_parse_error(data: st.DataObject) -> None:
    name, parser, _ = data.draw(st.sampled_from(REAL))
    text = _mutate(data, fx(name))
    try:
        parser(text)
    except ProbeParseError:
        pass


# ---------------------------------------------------------------- the batch

def frame(sections: list[tuple[str, str, int]]) -> str:
    """What the script prints for these (name, stdout, exit code) sections."""
    names = " ".join(n for n, _, _ in sections)
    out = [f"@@sparkctl:manifest:{names}@@\n"]
    for name, text, rc in sections:
        out.append(f"@@sparkctl:section:{name}@@\n{text}\n@@sparkctl:rc:{name}:{rc}@@\n")
    out.append("@@sparkctl:done@@\n")
    return "".join(out)


GPU_LINE = "NVIDIA GB10, 12.1, 580.159.03, 2190, 3003, 0x0000000000000002, 34.50, 52\n"  # composed (§1.3)
GIDS = ("rocep1s0f0|1|fe80:0000:0000:0000:4ebb:47ff:fee8:9f39|enp1s0f0np0|RoCE v2\n"
        "rocep1s0f0|3|0000:0000:0000:0000:0000:ffff:c0a8:640a|enp1s0f0np0|RoCE v2\n")
BATCH_SECTIONS: list[tuple[str, str, int]] = [
    ("hostname", "spark-5c2d\n", 0),
    ("kernel", "6.17.0-1021-nvidia\n", 0),
    ("page_size", "4096\n", 0),
    ("held_packages", fx("apt-mark-showhold-modelled-fixture.txt"), 0),
    ("boot_id", "13dc5579-455c-45c8-8e4d-d09c457fa826\n", 0),
    ("uptime", "1163.51 1405.68\n", 0),
    ("meminfo", fx("meminfo-head.txt"), 0),
    ("disk", FORMAT_SAMPLES[0][0], 0),
    ("weights", fx("weights-summary-agent-verified.json"), 0),
    ("gpu", GPU_LINE, 0),
    ("gpu_clocks", fx("nvidia-smi-q-clock-event-reasons-node0.txt"), 0),
    ("ibdev2netdev", fx("ibdev2netdev-spark-5c2d.txt"), 0),
    ("net.enp1s0f0np0.operstate", "up\n", 0),
    ("net.enp1s0f0np0.mtu", "9000\n", 0),
    ("net.enp1s0f0np0.ipv4", "5: enp1s0f0np0    inet 192.168.100.10/24 brd 192.168.100.255 scope global enp1s0f0np0\n", 0),
    ("net.enp1s0f0np0.ethtool", fx("ethtool-grep-speed-link-200g.txt"), 0),
    ("gids", GIDS, 0),
    ("pcie.0000:01:00.0", fx("lspci-vvv-lnk-healthy.txt"), 0),
    ("pcie.0002:01:00.1", fx("lspci-vv-degraded-tabs-other-machine.txt"), 0),
    ("engines", "    PID COMMAND\n 400721 VLLM::EngineCore\n", 0),
    ("ports", FORMAT_SAMPLES[5][0], 0),
    ("models", fx("v1-models-llamacpp.json"), 0),
]
BATCH = frame(BATCH_SECTIONS)
EMPTY_OK = {"held_packages", "ports", "net.enp1s0f0np0.ipv4"}


def test_parse_batch_reads_every_fact() -> None:
    f = parse_batch("spark-a", BATCH)
    assert f.unreadable == {} and f.not_available == {}
    assert (f.hostname, f.kernel, f.page_size_bytes, f.boot_id, f.uptime_s) == (
        "spark-5c2d", "6.17.0-1021-nvidia", 4096, "13dc5579-455c-45c8-8e4d-d09c457fa826", 1163.51)
    assert len(f.held_packages or []) == 6
    assert (f.mem_total_kib, f.mem_available_kib) == (127600816, 40174336)
    assert f.disk_free_gib == round(3525355500 / 2**20, 3)
    assert f.gpu == GpuFacts("NVIDIA GB10", "12.1", "580.159.03", 2190, 3003, None,
                             ("applications_clocks_setting",), 34.5, 52)
    assert f.gpu.user_clock_limit_active
    assert f.links == {"enp1s0f0np0": LinkFacts(
        "enp1s0f0np0", "rocep1s0f0", "up", 9000, "192.168.100.10/24", 200000, True, 3)}
    assert f.pcie["0000:01:00.0"].downgraded is False and f.pcie["0002:01:00.1"].downgraded is True
    assert f.engines == [EngineProc(400721, "VLLM::EngineCore")]
    assert f.listening_ports == {8000, 22, 53}
    assert f.served_models == ["qwen3-8b"]
    assert f.weights is not None and f.weights.digest is not None and f.weights.files == 2


def test_missing_tool_is_not_available_and_failures_are_unreadable() -> None:
    secs = [(n, "", 127) if n in ("gpu", "gpu_clocks") else (n, t, rc) for n, t, rc in BATCH_SECTIONS]
    secs = [(n, "", 7) if n == "models" else (n, t, rc) for n, t, rc in secs]
    f = parse_batch("spark-b", frame(secs))
    assert f.gpu is None and set(f.not_available) == {"gpu", "gpu_clocks"}
    assert "not available on node spark-b" in f.not_available["gpu"]
    assert f.unreadable == {"models": "cannot read served models (/v1/models) on node spark-b: "
                                      "connection refused (nothing listening on the endpoint port?)"}


def test_output_without_trailing_newline_is_kept_exact() -> None:
    _, secs, done = split_batch(frame([("models", '{"data":[]}', 0), ("hostname", "x\n", 0)]))
    assert done and secs["models"].text == '{"data":[]}' and secs["hostname"].text == "x\n"


def test_the_batch_prints_in_one_piece_and_what_ran_before_a_timeout_stopped_it(tmp_path: Path) -> None:
    """The sections' output leaves in one write at the end (one SSH packet instead of about 150):
    a reader sees nothing while a section still runs. When `timeout` stops the batch (as the
    transport's wire command does), the sections that finished are still printed, and the one it
    stopped reads as cut off."""
    go = tmp_path / "go"  # the reader makes it once it has read a first line
    wait = (f"i=0; while [ ! -e {go} ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i + 1)); done; "
            f"[ -e {go} ] && echo streamed || echo one-piece")
    reader = "IFS= read -r first; touch " + str(go) + "; cat"
    got = subprocess.run(["sh", "-c", remote_command(batch_frame([("hostname", "echo a"), ("kernel", wait)]))
                          + " | { " + reader + "; }"], capture_output=True, text=True, timeout=30).stdout
    assert split_batch("@@sparkctl:manifest:hostname kernel@@\n" + got)[1]["kernel"].text == "one-piece\n"
    script = batch_frame([("hostname", "echo spark-a"), ("kernel", "sleep 30"), ("page_size", "echo 4096")])
    cut = subprocess.run(["timeout", "-k", "1", "1", "sh", "-c", remote_command(script)],
                         capture_output=True, text=True, timeout=30)
    assert cut.returncode == 124
    _, secs, done = split_batch(cut.stdout)
    assert secs["hostname"].text == "spark-a\n" and secs["hostname"].rc == 0
    assert secs["kernel"].rc is None and "page_size" not in secs and not done
    facts = parse_batch("spark-a", cut.stdout)
    assert facts.hostname == "spark-a" and "kernel" in facts.unreadable


@given(st.integers(0, len(BATCH) - 1))
def test_truncated_batch_names_the_cut_facts(cut: int) -> None:
    out = BATCH[:cut]
    f = parse_batch("spark-a", out)
    if "@@sparkctl:done@@" not in out:
        assert "batch" in f.unreadable and "spark-a" in f.unreadable["batch"]
    manifest_seen = BATCH.split("\n", 1)[0] in out
    for name, _, _ in BATCH_SECTIONS:
        if f"@@sparkctl:rc:{name}:0@@" in out:
            assert name not in f.unreadable
            continue
        # without the manifest only the core sections are known to be missing
        if manifest_seen or not name.startswith(("net.", "pcie.", "models", "weights")):
            assert f.unreadable[name].startswith(f"cannot read {section_title(name)} on node spark-a: ")


@given(st.data())
def test_garbled_section_is_a_value_or_an_unreadable_entry(data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(BATCH_SECTIONS) - 1))
    name, text, rc = BATCH_SECTIONS[i]
    bad = _mutate(data, text)
    secs = list(BATCH_SECTIONS)
    secs[i] = (name, bad, rc)
    f = parse_batch("spark-a", frame(secs))
    for other, _, _ in BATCH_SECTIONS:
        if other != name:
            assert other not in f.unreadable, f.unreadable
    if name in f.unreadable:
        assert f.unreadable[name].startswith(f"cannot read {section_title(name)} on node spark-a: ")
    if bad.strip() == "" and name not in EMPTY_OK:
        assert name in f.unreadable


@given(st.text(max_size=300))
def test_parse_batch_never_raises_on_noise(noise: str) -> None:
    f = parse_batch("spark-a", noise)
    assert "batch" in f.unreadable
    f = parse_batch("spark-a", BATCH.replace("@@sparkctl:done@@\n", noise))
    assert isinstance(f, NodeFacts)


# ---------------------------------------------------------------- the script


def test_script_quotes_values_and_has_no_backslash(tmp_path: Path) -> None:
    evil = f"{tmp_path}/w'; touch {tmp_path}/pwned; echo '"
    node = spark_node(sysfs=f"{tmp_path}/sys $(touch {tmp_path}/pwned2)")
    script = build_script(node, evil, 8000)
    assert "\\" not in script
    assert remote_command(script).startswith("sh -c '")
    subprocess.run(remote_command(script), shell=True, capture_output=True, timeout=30)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    # read-only: nothing that changes a host
    for word in ("-lgc", "-rgc", " hold", "modprobe", "rm ", "ip link set", "ip addr add", "sysctl", " > "):
        assert word not in script, word


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


def _fake_node_tree(tmp: Path) -> tuple[Path, Path]:
    sysfs, proc = tmp / "sys", tmp / "proc"
    links = {"enp1s0f0np0": ("up", "9000"), "enP2p1s0f0np0": ("up", "9000"),
             "enp1s0f1np1": ("down", "1500"), "enP2p1s0f1np1": ("down", "1500")}
    for nd, (state, mtu) in links.items():
        (sysfs / "class/net" / nd).mkdir(parents=True)
        (sysfs / "class/net" / nd / "operstate").write_text(state + "\n")
        (sysfs / "class/net" / nd / "mtu").write_text(mtu + "\n")
    ll = "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39"  # §2.2
    v4 = "0000:0000:0000:0000:0000:ffff:c0a8:640a"  # 192.168.100.10, §2.2
    v4b = "0000:0000:0000:0000:0000:ffff:c0a8:c80d"  # 192.168.200.13 (§4.1 ib_write_bw GID)
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    tables = {  # rocep1s0f0: the drifted table of §2.4 (index 3 empty, RoCEv2 IPv4 at 4)
        ("rocep1s0f0", "enp1s0f0np0"): {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2"), 2: (v4, "IB/RoCE v1"),
                                        3: (zero, None), 4: (v4, "RoCE v2")},
        ("roceP2p1s0f0", "enP2p1s0f0np0"): {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2"), 2: (v4b, "IB/RoCE v1"),
                                            3: (v4b, "RoCE v2")},
        ("rocep1s0f1", "enp1s0f1np1"): {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2")},
        ("roceP2p1s0f1", "enP2p1s0f1np1"): {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2")},
    }
    for (dev, nd), table in tables.items():
        port = sysfs / "class/infiniband" / dev / "ports/1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True)
        for n in range(8):
            gid, typ = table.get(n, (zero, None))
            (port / "gids" / str(n)).write_text(gid + "\n")
            if typ:  # empty slots have no attrs: the real kernel fails those reads
                (port / "gid_attrs/types" / str(n)).write_text(typ + "\n")
                (port / "gid_attrs/ndevs" / str(n)).write_text(nd + "\n")
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("13dc5579-455c-45c8-8e4d-d09c457fa826\n")
    (proc / "meminfo").write_text(fx("meminfo-head.txt"))
    (proc / "uptime").write_text("1163.51 1405.68\n")
    return sysfs, proc


def _stubs(tmp: Path) -> Path:
    bin_ = tmp / "bin"
    bin_.mkdir()
    q = shlex.quote
    _exe(bin_ / "nvidia-smi", (
        'case "$*" in\n'
        f'  *--query-gpu=*) printf %s {q(GPU_LINE)} ;;\n'
        f'  *-q*) cat {q(str(FIX / "nvidia-smi-q-clock-event-reasons-node0.txt"))} ;;\n'
        '  *) exit 2 ;;\nesac\n'))
    _exe(bin_ / "ibdev2netdev", f'cat {q(str(FIX / "ibdev2netdev-roceP2-first.txt"))}\n')
    _exe(bin_ / "ethtool", (
        'case "$1" in\n'
        f'  enp1s0f0np0|enP2p1s0f0np0) cat {q(str(FIX / "ethtool-grep-speed-link-200g.txt"))} ;;\n'
        '  *) printf "\\tSpeed: Unknown!\\n\\tDuplex: Unknown! (255)\\n\\tLink detected: no\\n" ;;\nesac\n'))
    _exe(bin_ / "lspci", (
        'case "$*" in\n'
        f'  *0002:01:00.1*) cat {q(str(FIX / "lspci-vv-degraded-tabs-other-machine.txt"))} ;;\n'
        f'  *) cat {q(str(FIX / "lspci-vvv-lnk-healthy.txt"))} ;;\nesac\n'))
    _exe(bin_ / "apt-mark", f'cat {q(str(FIX / "apt-mark-showhold-modelled-fixture.txt"))}\n')
    _exe(bin_ / "curl", f'cat {q(str(FIX / "v1-models-llamacpp.json"))}\n')
    _exe(bin_ / "ip", (  # FORMAT SAMPLE of `ip -4 -o addr show dev IF`
        'case "$*" in\n'
        '  *enp1s0f0np0*) echo "5: enp1s0f0np0    inet 192.168.100.10/24 brd 192.168.100.255 scope global '
        'enp1s0f0np0\\       valid_lft forever preferred_lft forever" ;;\n'
        '  *enP2p1s0f0np0*) echo "7: enP2p1s0f0np0    inet 192.168.200.13/24 brd 192.168.200.255 scope global '
        'enP2p1s0f0np0\\       valid_lft forever preferred_lft forever" ;;\n'
        'esac\n'))
    _exe(bin_ / "ss", 'echo "LISTEN 0      4096         0.0.0.0:8000      0.0.0.0:*"\n')  # FORMAT SAMPLE
    return bin_


def test_script_round_trip_in_one_invocation(tmp_path: Path) -> None:
    sysfs, proc = _fake_node_tree(tmp_path)
    bin_ = _stubs(tmp_path)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vllm", "serve", "fake-model"])
    calls: list[str] = []

    def run(command: str) -> tuple[int, str, str]:
        calls.append(command)
        p = subprocess.run(command, shell=True, capture_output=True, text=True, env=env, timeout=60)
        return p.returncode, p.stdout, p.stderr

    try:
        node = spark_node(sysfs=str(sysfs), proc=str(proc))
        f = gather(run, node, weights_path=str(tmp_path / "models" / "not-yet-downloaded"), endpoint_port=8000)
    finally:
        engine.kill()
        engine.wait()
    assert len(calls) == 1 and calls[0].startswith("sh -c ")
    assert f.unreadable == {} and f.not_available == {}, (f.unreadable, f.not_available)
    assert f.boot_id == "13dc5579-455c-45c8-8e4d-d09c457fa826" and f.uptime_s == 1163.51
    assert (f.mem_total_kib, f.mem_available_kib) == (127600816, 40174336)
    assert f.held_packages and len(f.held_packages) == 6
    assert f.disk_free_gib is not None and f.disk_free_gib >= 0
    assert f.gpu == GpuFacts("NVIDIA GB10", "12.1", "580.159.03", 2190, 3003, None,
                             ("applications_clocks_setting",), 34.5, 52)
    assert f.links["enp1s0f0np0"] == LinkFacts(
        "enp1s0f0np0", "rocep1s0f0", "up", 9000, "192.168.100.10/24", 200000, True, 4)  # drifted: index 4
    assert f.links["enP2p1s0f0np0"].gid_index_rocev2_ipv4 == 3
    assert f.links["enp1s0f1np1"] == LinkFacts(
        "enp1s0f1np1", "rocep1s0f1", "down", 1500, None, None, False, None)
    assert sorted(f.pcie) == list(CX7_FUNCTIONS)
    assert [b for b, p in f.pcie.items() if p.downgraded] == ["0002:01:00.1"]
    assert any(e.pid == engine.pid and e.args.endswith("vllm serve fake-model") for e in f.engines or [])
    assert not any("@@sparkctl" in e.args for e in f.engines or [])
    assert f.listening_ports == {8000}
    assert f.served_models == ["qwen3-8b"]


def test_script_on_a_node_without_the_vendor_tools(tmp_path: Path) -> None:
    # A node without nvidia-smi, ibdev2netdev, ethtool or lspci: they must come
    # back "not available", the rest of the batch intact. Stand-ins that answer
    # as a shell does for a missing command (exit 127) go first on PATH, so the
    # test does not depend on what this machine has installed.
    sysfs, proc = _fake_node_tree(tmp_path)
    bindir = tmp_path / "missing-bin"
    bindir.mkdir()
    for tool in ("nvidia-smi", "ibdev2netdev", "ethtool", "lspci"):
        (bindir / tool).write_text(f"#!/bin/sh\necho 'sh: 1: {tool}: not found' >&2\nexit 127\n")
        (bindir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def run(command: str) -> tuple[int, str, str]:
        p = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60, env=env)
        return p.returncode, p.stdout, p.stderr

    f = gather(run, spark_node(sysfs=str(sysfs), proc=str(proc)))
    assert f.gpu is None and {"gpu", "gpu_clocks", "ibdev2netdev"} <= set(f.not_available)
    assert all(k.startswith(("net.", "pcie.")) for k in set(f.not_available) - {"gpu", "gpu_clocks", "ibdev2netdev"})
    assert f.boot_id == "13dc5579-455c-45c8-8e4d-d09c457fa826" and f.links["enp1s0f0np0"].mtu == 9000
    assert f.links["enp1s0f0np0"].gid_index_rocev2_ipv4 is None or f.links["enp1s0f0np0"].ipv4 is None
    assert f.served_models is None and "models" not in f.unreadable  # no endpoint asked for
    assert not {k for k in f.unreadable if not re.match(r"net\.\w+\.ipv4$", k)}, f.unreadable


def test_script_uses_sudo_for_lspci_only_when_the_node_allows() -> None:
    assert "sudo" not in build_script(spark_node())
    s = build_script(spark_node(sudo=True))
    # lspci: each function and its upstream port
    assert s.count("sudo -n lspci") == 8 and s.count("sudo -n base64") == 1 and s.count("sudo") == 18


# ---------------------------------------------------------------- perftest report variants
# (fixture, unit as printed, rows, BW average Gb/s of the first row, CPU_Util %)
BW_VARIANTS: list[tuple[str, str, int, float, float | None]] = [
    ("ib_write_bw-rdma-cm.txt", "Gb/sec", 1, 111.71, None),
    ("ib_write_bw-run-infinitely.txt", "Gb/sec", 2, 92.57, None),
    ("ib_write_bw-mb-sec-constructed.txt", "MB/sec", 1, 111.71, None),
    ("ib_write_bw-mib-sec-constructed.txt", "MiB/sec", 1, 111.71, None),
    ("ib_write_bw-cpu-util-constructed.txt", "Gb/sec", 1, 109.17, 48.21),
]


@pytest.mark.parametrize("name,unit,n_rows,gbps,cpu", BW_VARIANTS, ids=[v[0] for v in BW_VARIANTS])
def test_bw_report_reads_units_and_columns_from_the_header(
        name: str, unit: str, n_rows: int, gbps: float, cpu: float | None) -> None:
    rep = parse_bw_report(fx(name))
    assert (rep.unit, len(rep.rows), rep.rows[0].cpu_util_pct) == (unit, n_rows, cpu)
    assert rep.rows[0].bw_average_gbps == pytest.approx(gbps, abs=0.005)
    assert rep.rows[0].size_bytes == 65536


def test_bw_report_per_port_and_six_decimal_rows() -> None:
    # FORMAT SAMPLES built from perftest's RESULT_FMT_G_PER_PORT / REPORT_FMT_PER_PORT
    # and REPORT_FMT_EXT (an average below 0.1 Gb/s gets 6 decimals); not captures.
    per_port = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]   BW Port1[Gb/sec]"
                "   MsgRate Port1[Mpps]   BW Port2[Gb/sec]   MsgRate Port2[Mpps]\n"
                " 65536      10000          0.00               189.85\t\t   0.362100        92.57            "
                "0.176554              97.28            0.185548\n")
    assert parse_ib_write_bw(per_port) == 189.85
    slow = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            " 2          5000           0.051234            0.050011            3.125688\n")
    assert parse_ib_write_bw(slow) == 0.05


def test_bw_of_several_sizes_is_the_largest_size() -> None:
    rows = (" #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
            " 2          5000             9.53               9.50                 4.982\n"
            " 65536      5000             13318.06           13316.87             0.213070\n")
    assert parse_ib_write_bw(rows) == pytest.approx(111.71, abs=0.005)


def test_fabric_client_reads_mb_sec_and_refuses_a_report_without_rows() -> None:
    t = FabricTarget("bw-client", "enp1s0f0np0", "spark-b", "192.168.100.11", "rocep1s0f0", 18515)
    ok = frame([("fab0", fx("ib_write_bw-mb-sec-constructed.txt"), 0)])
    [(_, reached, bw)] = parse_fabric([t], ok)
    assert reached is True and bw == pytest.approx(111.71, abs=0.005)
    no_row = frame([("fab0", fx("ib_write_bw-rdma-cm.txt").split(" 65536")[0], 0)])
    assert parse_fabric([t], no_row) == [(t, False, None)]


FAKE_PING = """#!/bin/sh
# the last argument is the address; 10.0.0.1 and 10.0.0.2 each wait for the other to have started
log={log}
for a; do addr=$a; done
echo "$addr" >> "$log/calls"
case "$addr" in
  10.0.0.1|10.0.0.2)
    touch "$log/started-$addr"
    other=10.0.0.$((3 - ${{addr##*.}}))
    i=0; while [ ! -e "$log/started-$other" ]; do i=$((i + 1)); [ $i -gt 100 ] && exit 1; sleep 0.05; done
    exit 0 ;;
  10.0.0.3) [ -e "$log/lost-once" ] && exit 0; touch "$log/lost-once"; exit 1 ;;
  *) exit 1 ;;
esac
"""


def test_the_fabric_script_pings_at_once_sends_a_lost_ping_again_and_names_the_silent(tmp_path: Path) -> None:
    """Run under sh with a stand-in ping: two pings that each need the other under way pass only
    when the pings run at once; a ping lost once is answered by the second; one never answered
    fails after its second try, and the bandwidth pair still runs after the pings."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ping").write_text(FAKE_PING.format(log=shlex.quote(str(tmp_path))))
    (bin_dir / "ib_write_bw").write_text("#!/bin/sh\necho ib_write_bw \"$@\" >> " + shlex.quote(str(tmp_path / "calls")) + "\n")
    for tool in ("ping", "ib_write_bw"):
        (bin_dir / tool).chmod(0o755)
    targets = [FabricTarget("df", "enp1s0f0np0", "spark-b", "10.0.0.1"),
               FabricTarget("df", "enp1s0f1np1", "spark-c", "10.0.0.2"),
               FabricTarget("relay", "", "spark-d", "10.0.0.3"),
               FabricTarget("df", "enp1s0f1np1", "spark-e", "10.0.0.4"),
               FabricTarget("bw-server", "enp1s0f0np0", "spark-b", "", "rocep1s0f0", 18515)]
    script = build_fabric_script(targets, 9000, bandwidth_s=1)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    got = parse_fabric(targets, out.stdout)
    assert [reached for _, reached, _ in got] == [True, True, True, False]
    calls = (tmp_path / "calls").read_text().split("\n")
    assert calls.count("10.0.0.3") == 2 and calls.count("10.0.0.4") == 2 and calls.count("10.0.0.1") == 1
    assert calls[-2].startswith("ib_write_bw -d rocep1s0f0 -p 18515"), "the bandwidth pair after every ping"


# ---------------------------------------------------------------- the simulator's tools read back


def test_shim_outputs_parse_to_the_state_they_model() -> None:
    # the simulator imports sparkctl, never the reverse; tests may import both
    from sparkctl_sim import nodestate, shims

    state = nodestate.default_state("spark-5c2d")
    nds = {"enp1s0f0np0": shims.Netdev("enp1s0f0np0", "up", 9000, (("192.168.100.10", 24),)),
           "enp1s0f1np1": shims.Netdev("enp1s0f1np1", "down")}
    want = shims.rail_bandwidth_gbps(state, "rocep1s0f0")
    for unit_flag in (["--report_gbits"], []):
        out = shims.ib_write_bw(state, ["-d", "rocep1s0f0", *unit_flag, "192.168.100.11"], nds).stdout
        assert parse_ib_write_bw(out) == pytest.approx(want, abs=0.006), unit_flag
    gids = parse_show_gids(shims.show_gids(state, [], nds).stdout)
    assert rocev2_ipv4_gid_index(gids["rocep1s0f0"], "enp1s0f0np0", "192.168.100.10/24") == \
        shims.roce_v2_ipv4_gid_index(state, "rocep1s0f0", nds)
    assert parse_ethtool(shims.ethtool(state, ["enp1s0f0np0"], nds, euid=0).stdout) == Ethtool(200000, True)
    assert parse_ethtool(shims.ethtool(state, ["enp1s0f1np1"], nds, euid=1000).stdout) == Ethtool(None, False)


# ---------------------------------------------------------------- the registry


def test_every_script_section_resolves_to_one_registered_fact(tmp_path: Path) -> None:
    node = spark_node()
    weights = WeightsPaths("/opt/sparkctl/weights_agent.py", "/var/cache/h", "/models/x")
    script = build_script(node, "/models/x", 8000, weights=weights)
    manifest = re.search(r"@@sparkctl:manifest:([^@]*)@@", script)
    assert manifest is not None
    names = manifest.group(1).split()
    # single facts (the engine unit, the watchdog, the netplan files among them), 4 per netdev, 4 functions,
    # +3 asked (models, weights, model_files)
    assert len(names) == len(set(names)) == 18 + 4 * 4 + 4 + 3
    for name in names:
        hit = REGISTRY.resolve(name)
        assert hit is not None and hit[0].section(hit[1]) == name, name
        assert f"sec {name}; " in script
    assert REGISTRY.resolve("net.eth0.100.mtu") == (REGISTRY.resolve("net.x.mtu")[0], "eth0.100")
    assert REGISTRY.resolve("nonsense") is None
    assert section_title("pcie.0000:01:00.0") == "PCIe link of 0000:01:00.0"


def test_absent_codes_are_values_and_a_gone_netdev_skips_its_other_facts() -> None:
    secs = [(n, t, rc) for n, t, rc in BATCH_SECTIONS if n != "weights"]
    secs += [("weights", "", 3), ("clock_lock", "", 3)]
    secs = [(n, "", 1) if n == "net.enp1s0f0np0.operstate" else (n, "", 1) if n.startswith("net.") else (n, t, rc)
            for n, t, rc in secs]
    f = parse_batch("spark-a", frame(secs))
    assert f.weights == WeightsSummary("no-agent") and f.clock_lock_record is None
    assert f.links == {}
    assert f.unreadable == {"net.enp1s0f0np0.operstate": "cannot read link state of enp1s0f0np0 on node spark-a: "
                                                         "no such netdev (class/net/enp1s0f0np0 is missing)"}
    eth75 = [(n, "No data available\n", 75) if n.endswith(".ethtool") else (n, t, rc) for n, t, rc in BATCH_SECTIONS]
    f = parse_batch("spark-a", frame(eth75))
    assert f.links["enp1s0f0np0"].speed_mbps is None and f.links["enp1s0f0np0"].mtu == 9000
    assert "exit code 75" in f.unreadable["net.enp1s0f0np0.ethtool"]


def test_probe_parse_error_names_the_tool_and_is_a_sparkctl_error() -> None:
    from sparkctl.errors import SparkctlError

    with pytest.raises(ProbeParseError) as exc:
        parse_ib_write_bw(fx("ib_write_bw-rdma-cm.txt").replace("[Gb/sec]", "[KB/sec]"))
    assert isinstance(exc.value, SparkctlError) and exc.value.tool == "ib_write_bw"
    assert "KB/sec" in exc.value.detail and "ib_write_bw" in exc.value.one_line()


def test_the_gid_dump_reads_with_the_shells_own_read_and_prints_what_cat_did(tmp_path: Path) -> None:
    """The gids section reads ~400 sysfs files per probe: with ``read`` (no process per file), the
    same lines as the ``$(cat ...)`` loop it replaced, unreadable slots skipped, a file without its
    trailing newline kept (the reference: the old loop, run on the same tree)."""
    from types import SimpleNamespace

    from sparkctl.facts.net import _gids

    port = tmp_path / "class/infiniband/rocep1s0f0/ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    (port / "gids/0").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    (port / "gid_attrs/types/0").write_text("IB/RoCE v1\n")
    (port / "gid_attrs/ndevs/0").write_text("enp1s0f0np0\n")
    (port / "gids/1").write_text("0000:0000:0000:0000:0000:ffff:0a14:0001")  # no trailing newline
    (port / "gid_attrs/types/1").write_text("RoCE v2\n")  # ndevs/1 unreadable: an empty cell
    (port / "gids/2").mkdir()  # a read error: skipped, as cat's failure was
    new = _gids(SimpleNamespace(sysfs=str(tmp_path)), "")  # type: ignore[arg-type]
    old = new.replace('g=; { IFS= read -r g || [ -n "$g" ]; } 2>/dev/null <"$p/gids/$n" || continue; ',
                      'g=$(cat "$p/gids/$n" 2>/dev/null) || continue; ') \
        .replace('t=; { IFS= read -r t || :; } 2>/dev/null <"$p/gid_attrs/types/$n"; ',
                 't=$(cat "$p/gid_attrs/types/$n" 2>/dev/null); ') \
        .replace('v=; { IFS= read -r v || :; } 2>/dev/null <"$p/gid_attrs/ndevs/$n"; ',
                 'v=$(cat "$p/gid_attrs/ndevs/$n" 2>/dev/null); ')
    assert old != new
    runs = {k: subprocess.run(["sh", "-c", s], capture_output=True, text=True) for k, s in (("new", new), ("old", old))}
    assert runs["new"].stdout == runs["old"].stdout and runs["new"].stderr == "", runs
    assert runs["new"].stdout.splitlines() == [
        "rocep1s0f0|0|fe80:0000:0000:0000:0000:0000:0000:0001|enp1s0f0np0|IB/RoCE v1",
        "rocep1s0f0|1|0000:0000:0000:0000:0000:ffff:0a14:0001||RoCE v2"]


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"),
                        max_size=30), max_size=4), st.booleans())
def test_show_prints_a_small_file_as_cat_does_with_builtins_only(rows: list[str], last_newline: bool) -> None:
    """The prelude's ``show`` (sparkctl.facts.registry.small_file): the same bytes as cat for a text
    file (backslashes, leading blanks, a last line without its newline gets one, as the batch adds
    one anyway), and for a file it cannot open cat's own message and exit code."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "operstate"
        body = "\n".join(rows) + ("\n" if last_newline and rows else "")
        f.write_bytes(body.encode())
        script = PRELUDE + f"show {shlex.quote(str(f))}; echo rc=$?"
        got = subprocess.run(["sh", "-c", script], capture_output=True, timeout=30)
        want = body if body.endswith("\n") or not body else body + "\n"
        assert got.stdout.decode() == want + "rc=0\n" and got.stderr == b""
    missing = str(Path(d) / "gone" / "mtu")
    got = subprocess.run(["sh", "-c", PRELUDE + f"show {shlex.quote(missing)}"], capture_output=True, text=True)
    cat = subprocess.run(["cat", missing], capture_output=True, text=True)
    assert (got.returncode, got.stdout, got.stderr) == (cat.returncode, cat.stdout, cat.stderr) != (0, "", "")


def test_show_starts_no_process() -> None:
    """What small_file saves: reading sysfs lines without a cat per file (a PATH with no cat
    proves it; the exporter reads a dozen per scrape)."""
    script = PRELUDE + "PATH=/nonexistent; show /proc/sys/kernel/random/boot_id"
    got = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and re.fullmatch(r"[0-9a-f-]{36}\n", got.stdout), got


def test_a_lone_show_runs_without_a_subshell_and_every_other_section_in_its_own() -> None:
    script = build_script(spark_node())
    assert "sec net.enp1s0f0np0.mtu; show /sys/class/net/enp1s0f0np0/mtu; end net.enp1s0f0np0.mtu $?" in script
    assert "sec boot_id; show /proc/sys/kernel/random/boot_id; end boot_id $?" in script
    # a body that may exit keeps its subshell, so the exit ends the section, not the batch
    assert re.search(r"sec clock_lock; \( \[ -e \S+ \] \|\| exit 3; show \S+ \); end clock_lock", script)
    assert re.search(r"sec kernel; \( have uname", script)
