"""The operational laws: pure verdicts over node facts and a profile.

Each law is one object: an ``id`` that matches a heading in docs/LAWS.md, a
pure ``check(ctx) -> list[Verdict]`` (one verdict per node, or per link), and,
where one exists, a remedy described as data (the commands to run). Nothing here
touches a host: ``sparkctl.ops.check`` gathers the facts and applies the remedies.

The package: ``base`` (Verdict, Waiver, Context, Remedy, Law), one module per
group of laws (``host``, ``fabric``, ``serving``, ...), and ``registry`` (the
ordered ``LAWS`` and ``judge``). This facade keeps ``from sparkctl.plan import
laws; laws.LAWS, laws.Waiver, laws.judge`` working.
"""

from __future__ import annotations

from sparkctl.plan.laws.base import (
    AC_CYCLE_FIX,
    BANDWIDTH_FLOOR_GBPS,
    CLOCK_LOCK_SLACK_MHZ,
    FAIL,
    LEAK_THRESHOLD_GIB,
    NOMINAL_SPEED_MBPS,
    OK,
    SKIP,
    WAIVED,
    WARN,
    Context,
    HwChange,
    Law,
    LinkProbe,
    Remedy,
    Verdict,
    Waiver,
)
from sparkctl.plan.laws.fabric import check_ac_cycle, check_fabric, stale_links
from sparkctl.plan.laws.host import (
    check_clock,
    check_kernel,
    check_memory,
    check_page_size,
    remedy_clock,
    remedy_kernel,
)
from sparkctl.plan.laws.registry import LAWS, by_id, judge
from sparkctl.plan.laws.serving import check_served_model, check_weights

__all__ = [
    "AC_CYCLE_FIX", "BANDWIDTH_FLOOR_GBPS", "CLOCK_LOCK_SLACK_MHZ", "FAIL", "LAWS", "LEAK_THRESHOLD_GIB",
    "NOMINAL_SPEED_MBPS", "OK", "SKIP", "WAIVED", "WARN", "Context", "HwChange", "Law", "LinkProbe", "Remedy",
    "Verdict", "Waiver", "by_id", "check_ac_cycle", "check_clock", "check_fabric", "check_kernel", "check_memory",
    "check_page_size", "check_served_model", "check_weights", "judge", "remedy_clock",
    "remedy_kernel", "stale_links",
]
