"""What every GB10 tool shim shares: the node state type, the tool result, the
netdev and GPU value types, the RoCE device table and small pure helpers.

Standard library only, and light: every shim call without a rendered view starts a fresh
``python3 -S`` that imports this (so named tuples, not dataclasses, and no typing at run time).
SIMULATION ONLY: nothing on the real-hardware path imports this package.
"""

from __future__ import annotations

import json
import zlib
from collections import namedtuple
from collections.abc import Mapping

from sparkctl_sim.envnames import STATE_ENV  # noqa: F401 - re-exported

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

State = dict[str, "Any"]

TOOLS = (
    "nvidia-smi",
    "ibdev2netdev",
    "show_gids",
    "ethtool",
    "lspci",
    "uname",
    "getconf",
    "apt-mark",
    "ib_write_bw",
    "ps",
    "apt-get",
    "dpkg-query",
    "earlyoom",
)
# the tools whose node-state-only answers are rendered to files (sparkctl_sim.shims.rendered.TABLE)
VIEW_TOOLS = ("uname", "getconf", "apt-mark", "lspci", "ethtool", "dpkg-query")

# RoCE device -> (netdev, PCI function). Order is ibdev2netdev's on spark-5c2d
# (docs/reference/spark-facts.md §2.1); ls(1) in a UTF-8 locale lists /sys/class/infiniband the
# same way.
ROCE_DEVICES: tuple[tuple[str, str, str], ...] = (
    ("rocep1s0f0", "enp1s0f0np0", "0000:01:00.0"),
    ("rocep1s0f1", "enp1s0f1np1", "0000:01:00.1"),
    ("roceP2p1s0f0", "enP2p1s0f0np0", "0002:01:00.0"),
    ("roceP2p1s0f1", "enP2p1s0f1np1", "0002:01:00.1"),
)
NETDEV_OF = {dev: nd for dev, nd, _ in ROCE_DEVICES}
BDF_OF_NETDEV = {nd: bdf for _, nd, bdf in ROCE_DEVICES}
GID_TABLE_LEN = 256  # mlx5 RoCE ports expose 256 GID slots
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SPARK_OUI = (0x4C, 0xBB, 0x47)  # real Spark MACs: enP7s7 4c:bb:47:80:2a:60 (§3.2)


class ToolResult(namedtuple("ToolResult", "stdout stderr exit_code new_state exec_argv",
                            defaults=("", 0, None, None))):
    """What one shim invocation produced: ``stdout``, ``stderr``, ``exit_code``.

    ``new_state`` is the whole state after a mutating command (``-lgc``,
    ``apt-mark hold``), else None. ``exec_argv`` asks main() to hand over to
    a real binary (e.g. ``getconf`` for anything but PAGESIZE).
    """

    __slots__ = ()


class Netdev(namedtuple("Netdev", "name operstate mtu ipv4", defaults=(1500, ()))):
    """Facts about one netdev as the namespace's kernel reports them: ``operstate`` as
    /sys/class/net/<if>/operstate (up, down, lowerlayerdown, unknown, ...), ``ipv4`` as
    (address, prefixlen) pairs in `ip addr` order."""

    __slots__ = ()

    @property
    def link_up(self) -> bool:
        # "unknown" is what carrier-less virtual links (dummy) report while admin up.
        return bool(self.operstate in ("up", "unknown"))

    @property
    def admin_up(self) -> bool:
        return bool(self.operstate != "down")


Netdevs = Mapping[str, Netdev]


class GpuProcess(namedtuple("GpuProcess", "pid name used_mib type", defaults=("C",))):
    __slots__ = ()


class GpuSample(namedtuple("GpuSample", "busy sm_mhz power_w temp_c util_pct pstate reasons")):
    """One instant of the GB10 as nvidia-smi would report it (``reasons``: the
    clocks_event_reasons bitmask, NVML values)."""

    __slots__ = ()


class Gid(namedtuple("Gid", "index gid type netdev ipv4", defaults=(None,))):
    """One GID slot; ``type`` is "IB/RoCE v1" or "RoCE v2", exactly as sysfs gid_attrs/types/N."""

    __slots__ = ()


def _result(out: str = "", err: str = "", rc: int = 0, new_state: State | None = None) -> ToolResult:
    return ToolResult(stdout=out, stderr=err, exit_code=rc, new_state=new_state)


def _jitter(*parts: object) -> float:
    """A deterministic value in [0, 1) from the parts (no RNG, no clock)."""
    return (zlib.crc32(":".join(str(p) for p in parts).encode()) & 0xFFFFFFFF) / 2**32


def _copy_state(state: State) -> State:
    return json.loads(json.dumps(state))

