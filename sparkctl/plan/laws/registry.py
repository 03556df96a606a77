"""The registry of laws: the one ordered tuple ``LAWS`` that ``check`` and ``up`` judge, and ``judge``.

Every law is one :class:`~sparkctl.plan.laws.base.Law` whose id is a heading in
docs/LAWS.md (tests/test_docs.py holds them together). A new law is written in
the module of its group and listed here; nothing else iterates laws by name.
"""

from __future__ import annotations

from sparkctl.plan.laws.base import FAIL, Context, Law, Verdict
from sparkctl.plan.laws.fabric import check_ac_cycle, check_fabric
from sparkctl.plan.laws.hardware import check_pcie_link
from sparkctl.plan.laws.host import (
    check_clock,
    check_kernel,
    check_memory,
    check_page_size,
    remedy_clock,
    remedy_kernel,
)
from sparkctl.plan.laws.images import check_engine_present, check_image_identity
from sparkctl.plan.laws.memory import check_page_cache, remedy_page_cache
from sparkctl.plan.laws.memoryfit import check_memory_fit
from sparkctl.plan.laws.nccl import check_nccl_version
from sparkctl.plan.laws.serving import check_served_model, check_weights
from sparkctl.plan.laws.switch import check_switch_subnet
from sparkctl.plan.laws.watchdog import check_memory_watchdog

LAWS: tuple[Law, ...] = (
    Law("kernel_pin", "Kernel pin", check_kernel, remedy_kernel),
    Law("page_size", "Page size", check_page_size, waivable=True),
    Law("memory_guard", "Memory guard", check_memory),
    Law("page_cache", "Page cache before start", check_page_cache, remedy_page_cache),
    Law("memory_fit", "The model fits each node's memory", check_memory_fit),
    Law("memory_watchdog", "Memory watchdog (earlyoom) while serving", check_memory_watchdog),
    Law("clock_cap", "GPU clock cap", check_clock, remedy_clock),
    Law("ac_cycle", "AC power cycle after a hardware change", check_ac_cycle),
    Law("fabric", "Fabric", check_fabric),
    Law("switch_subnet", "Every port on a switch subnet answers at jumbo MTU", check_switch_subnet),
    Law("pcie_link", "CX-7 PCIe link at its maximum", check_pcie_link),
    Law("engine_present", "Engine image or binary present", check_engine_present),
    Law("image_identity", "Same image on every node", check_image_identity),
    Law("nccl_version", "NCCL new enough for the ring", check_nccl_version, waivable=True),
    Law("served_model", "Served model name", check_served_model),
    Law("weights", "Weights and disk", check_weights),
)


def by_id(law_id: str) -> Law | None:
    return next((law for law in LAWS if law.id == law_id), None)


def judge(ctx: Context) -> list[Verdict]:
    """Every law's verdicts, plus one per node that did not answer."""
    out = [Verdict("reach", n, FAIL, err, "answers over ssh", f"node {n} did not answer: {err}")
           for n, err in ctx.unreachable.items()]
    for law in LAWS:
        out.extend(law.check(ctx))
    return out
