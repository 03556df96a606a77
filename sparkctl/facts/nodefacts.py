"""The values a probe batch yields: what a node is, as frozen dataclasses.

What this module owns: :class:`NodeFacts` (everything one batch read on a
node, with what could not be read and why) and the facts it is made of. Pure
data: no parsing, no commands.

Clock lock (``GpuFacts.clock_lock_max_mhz``): real ``nvidia-smi`` (580
drivers) prints NO field holding the limits set with ``-lgc``; neither
``-q -d CLOCK`` nor any ``--query-gpu`` field reports them, and
``clocks.max.sm`` stays the hardware maximum (3003 MHz on GB10) under a lock.
What the real driver does show is the event reason *Applications Clocks
Setting* (NVML ``0x2``, alias ``UserDefinedClocks``) while a lock holds the
clock down under load. So: ``clock_lock_max_mhz`` is read from an explicit
lock section or key when one is printed (see ``sparkctl.facts.gpu``), and is
``None`` otherwise; ``GpuFacts.user_clock_limit_active`` says whether the
driver reports the user-defined-clocks reason. Whoever applies a lock should
also record what it applied (``NodeFacts.clock_lock_record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # facts.watchdog and facts.modelfiles import the registry; the values stay a leaf at run time
    from sparkctl.facts.modelfiles import ModelFiles
    from sparkctl.facts.watchdog import WatchdogFacts


@dataclass(frozen=True)
class GpuFacts:
    name: str
    compute_cap: str | None  # "12.1"
    driver: str | None
    sm_mhz: int | None
    max_sm_mhz: int | None
    clock_lock_max_mhz: int | None  # see the module docstring
    event_reasons: tuple[str, ...]  # active reasons, REASON_BITS names
    power_w: float | None
    temp_c: int | None

    @property
    def user_clock_limit_active(self) -> bool:
        """The driver reports the clock held by a user setting (``-lgc``/``-ac``)."""
        return "applications_clocks_setting" in self.event_reasons


@dataclass(frozen=True)
class LinkFacts:
    netdev: str
    rdma: str | None
    operstate: str | None  # up | down | ... (sysfs operstate)
    mtu: int | None
    ipv4: str | None  # "10.20.0.1/24", None when the netdev has no address
    speed_mbps: int | None  # None: unknown (ethtool says Unknown!, or prints no Speed line)
    link_detected: bool | None
    gid_index_rocev2_ipv4: int | None


@dataclass(frozen=True)
class PcieFacts:
    """A CX-7 function's link (``LnkCap``/``LnkSta``) and what its slot can give: the
    ``LnkCap`` of the port upstream of it (``slot``: its BDF; None when it was not read).
    ``downgraded``: pciutils' own mark, which compares with the function's LnkCap only."""

    bdf: str
    cap_gts: float
    cap_width: int
    sta_gts: float
    sta_width: int
    downgraded: bool
    slot: str | None = None
    slot_gts: float | None = None
    slot_width: int | None = None


@dataclass(frozen=True)
class EngineProc:
    pid: int
    args: str


@dataclass(frozen=True)
class WeightsSummary:
    """What sparkctl's hash cache vouches for at the weights path (``weights_agent.py summary``).

    ``kind``: ``dir`` or ``file``; ``missing`` (nothing at the path); ``no-agent``
    (sparkctl never fetched or synced here, so nothing is vouched for).
    ``digest`` is equal on two nodes exactly when they hold the same files; it
    is None while any file is unverified (changed since this node hashed it).
    """

    kind: str
    files: int = 0
    bytes: int = 0
    digest: str | None = None
    n_unverified: int = 0
    unverified: tuple[str, ...] = ()
    partial: int = 0
    hub_repo: str | None = None  # from the Hub manifest beside the files (weights fetch), when there is one
    hub_commit: str | None = None
    n_hub_differ: int = 0  # files the manifest lists that this node's cache says differ (or are missing)


@dataclass(frozen=True)
class EngineUnit:
    """``systemctl show`` of the engine unit: what systemd did with it (the record cannot say)."""

    load_state: str  # loaded | not-found | ...
    unit_file_state: str  # enabled | disabled | "" (not loaded)
    active_state: str  # active | failed | activating | inactive
    result: str  # success | exit-code | signal | start-limit-hit | ...
    n_restarts: int


@dataclass(frozen=True)
class NodeFacts:
    """Everything one probe batch read on a node. A fact that could not be read
    is None (or absent from its dict) and explained in ``unreadable`` (output
    present but unreadable, or cut off) or ``not_available`` (the command does
    not exist on the node), both keyed by section name (``kernel``, ``gpu``,
    ``net.enp1s0f0np0.ethtool`` ...)."""

    node: str
    hostname: str | None = None
    kernel: str | None = None
    page_size_bytes: int | None = None
    held_packages: list[str] | None = None
    boot_id: str | None = None
    uptime_s: float | None = None
    mem_total_kib: int | None = None
    mem_available_kib: int | None = None
    mem_free_kib: int | None = None  # MemFree: the page cache is not in it (the page_cache law)
    mem_cached_kib: int | None = None  # Cached: the page cache itself
    disk_free_gib: float | None = None
    gpu: GpuFacts | None = None
    links: dict[str, LinkFacts] = field(default_factory=dict)
    pcie: dict[str, PcieFacts] = field(default_factory=dict)
    engines: list[EngineProc] | None = None
    listening_ports: set[int] | None = None
    served_models: list[str] | None = None
    # the profile's engine: its image ID (docker) or executable path (native); "" not on the node
    engine_found: str | None = None
    # the docker image's content digest and the node's image store (sparkctl.facts.engine.ImageContent)
    image: object | None = None
    # the NCCL the engine loads (the library mapped after `import torch`, else torch's own or the
    # library's file name); () none found; None not read
    nccl_version: tuple[int, ...] | None = None
    nccl_library: str | None = None  # the path of the library that version was read from
    nccl_torch: tuple[int, ...] | None = None  # what torch was built against (torch.cuda.nccl.version())
    watchdog: WatchdogFacts | None = None  # earlyoom's state and arguments
    netplan_files: tuple[object, ...] | None = None  # sparkctl.facts.netplanfiles.NetplanFile, in read order
    clock_lock_record: tuple[str, int] | None = None  # (boot_id, cap MHz) written when sparkctl locked the clock
    weights: WeightsSummary | None = None
    model_files: ModelFiles | None = None  # the model's headers; None: not there
    engine_unit: EngineUnit | None = None  # None: no engine unit file on the node
    unreadable: dict[str, str] = field(default_factory=dict)
    not_available: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.unreadable and not self.not_available
