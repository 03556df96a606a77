"""The vocabulary of the laws: verdicts, waivers, the context a law reads, remedies, the Law object.

Pure data and small helpers shared by every group of laws (sparkctl.plan.laws.*).
Nothing here touches a host.

Magic numbers carry a comment naming their source in ../shared/reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkctl.model.inventory import Inventory
from sparkctl.model.schema import Profile

OK, WARN, FAIL, WAIVED, SKIP = "ok", "warn", "fail", "waived", "skip"

# Healthy 200 Gb/s per cable = two twins of ~100 Gb/s; ethtool reports 200000Mb/s
# per twin on a Spark (docs/reference/spark-facts.md §3.1).
NOMINAL_SPEED_MBPS = 200_000
# ib_write_bw per twin: healthy 92-111 Gb/s, stale 8-25 Gb/s (docs/reference/spark-facts.md §4).
BANDWIDTH_FLOOR_GBPS = 60.0
# A node with no engine that still has this much less available than total has
# memory held by a dead engine (1031 leaked ~80 GiB on engine death).
LEAK_THRESHOLD_GIB = 24.0
# The driver may report a nearby value for a lock: 1976 for 2000 (docs/reference/spark-facts.md §1.5).
CLOCK_LOCK_SLACK_MHZ = 50

AC_CYCLE_FIX = ("shut both ends down, unplug them from AC for at least 60 seconds, then reconnect "
                "without moving the cables (a warm reboot does not clear stale PCIe/link state)")


@dataclass(frozen=True)
class Verdict:
    law: str
    node: str
    status: str  # ok | warn | fail | waived | skip
    observed: str
    expected: str
    fix: str = ""
    subject: str = ""  # a link, a device: what exactly on the node

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Waiver:
    law: str
    reason: str


@dataclass(frozen=True)
class HwChange:
    """A recorded cable/PCIe change (``sparkctl hw-change``)."""

    note: str
    at: str
    boot_ids: Mapping[str, str]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class LinkProbe:
    """Results of the active fabric probes for one twin, seen from one end."""

    node: str
    netdev: str
    peer: str
    peer_address: str
    df_ping_ok: bool | None = None
    bandwidth_gbps: float | None = None


@dataclass(frozen=True)
class Context:
    profile: Profile
    inventory: Inventory
    nodes: tuple[str, ...]
    facts: Mapping[str, Any]  # node -> NodeFacts (None when the node did not answer)
    unreachable: Mapping[str, str] = field(default_factory=dict)  # node -> error
    waivers: Mapping[str, Waiver] = field(default_factory=dict)
    hw_change: HwChange | None = None
    link_probes: Sequence[LinkProbe] = ()
    relay_ok: Mapping[tuple[str, str], bool] = field(default_factory=dict)  # (from, to) -> reached
    endpoint_models: Mapping[str, list[str] | None] = field(default_factory=dict)  # head -> served names
    # "node:netdev" -> the node's boot id when this stale link was first seen (check keeps the history)
    stale_seen: Mapping[str, str] = field(default_factory=dict)
    profile_name: str = "PROFILE"  # for the commands a fix names


@dataclass(frozen=True)
class Remedy:
    law: str
    safe: bool  # --fix applies only safe remedies
    commands: Mapping[str, tuple[str, ...]]  # node -> commands (run with sudo)
    readback: str = ""
    text: str = ""


@dataclass(frozen=True)
class Law:
    id: str
    title: str
    check: Callable[[Context], list[Verdict]]
    remedy: Callable[[Context, list[Verdict]], Remedy | None] | None = None
    # whether its check reads ctx.waivers (a WAIVED verdict): --waive of any other law is refused
    waivable: bool = False


def facts_of(ctx: Context, node: str) -> Any:
    return ctx.facts.get(node)


def unreadable(law: str, node: str, what: str, f: Any) -> Verdict | None:
    if f is None:
        return None
    why = getattr(f, "unreadable", {}).get(what)
    if why:
        return Verdict(law, node, FAIL, "unreadable", what, why)
    return None


def each(ctx: Context, law: str, what: str, out: list[Verdict]) -> Iterator[tuple[str, Any]]:
    """The nodes that answered, with their facts; an unreadable fact becomes a verdict in ``out``."""
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        u = unreadable(law, node, what, f)
        if u:
            out.append(u)
            continue
        yield node, f

