"""Laws about the node itself: kernel pin, page size, memory guard, GPU clock cap.

Pure checks over NodeFacts; remedies as data (commands). Nothing here touches a host.
"""

from __future__ import annotations

from sparkctl.model import clocklock
from sparkctl.plan.laws import kernels
from sparkctl.plan.laws.base import (
    CLOCK_LOCK_SLACK_MHZ,
    FAIL,
    LEAK_THRESHOLD_GIB,
    OK,
    WAIVED,
    WARN,
    Context,
    Remedy,
    Verdict,
    each,
)

# --------------------------------------------------------------------------- kernel pin


def kernel_book(ctx: Context) -> kernels.KernelBook:
    """The bundled kernel data plus the inventory's and the profile's ``laws.kernels``."""
    inv = getattr(ctx.inventory, "kernels", None)
    prof = ctx.profile.laws.kernels
    layers = [("profile", prof.bad, prof.good)]
    if inv is not None:
        layers.insert(0, ("inventory", inv.bad, inv.good))
    return kernels.merged(kernels.bundled(), *layers)


def _seen(e: kernels.KernelEntry) -> str:
    return f" (seen: {', '.join(e.sources)})" if e.sources else f" (from the {e.origin}'s laws.kernels)"


def check_kernel(ctx: Context) -> list[Verdict]:
    law = ctx.profile.laws
    book = kernel_book(ctx)
    pin = book.pin()
    good = " or ".join(book.good) or "a qualified kernel"
    out: list[Verdict] = []
    for node, f in each(ctx, "kernel_pin", "kernel", out):
        k = f.kernel
        state = book.verdict(k)
        if state == "bad":
            e = book.bad[k]
            out.append(Verdict("kernel_pin", node, FAIL, k, f"not {k}",
                               f"{k} is known bad: {e.reason}{_seen(e)}. Boot {pin or 'a known-good kernel'} on "
                               f"{node} and hold the kernel meta-packages (docs/LAWS.md, kernel_pin)"))
            continue
        if state == "unknown":
            out.append(Verdict("kernel_pin", node, FAIL, k, good,
                               f"{k} is not known good: boot {pin} on {node}, or add {k} to "
                               "laws.kernels.good (profile or inventory) once it is qualified"))
            continue
        held = set(getattr(f, "held_packages", ()) or ())
        missing = [p for p in law.kernel_hold_packages if p not in held]
        if missing:
            out.append(Verdict("kernel_pin", node, FAIL, f"{k}; not held: {', '.join(missing)}", "meta-packages held",
                               f"on {node}: sudo apt-mark hold {' '.join(missing)} (an upgrade would pull a new kernel)"))
            continue
        out.append(Verdict("kernel_pin", node, OK, k, good))
    return out


def remedy_kernel(ctx: Context, verdicts: list[Verdict]) -> Remedy | None:
    bad = [v for v in verdicts if v.failed]
    if not bad:
        return None
    law = ctx.profile.laws
    pin = kernel_book(ctx).pin() or "<known-good>"
    steps = (
        f"sudo apt-mark hold {' '.join(law.kernel_hold_packages)}",
        f"sudo grub-set-default 'Advanced options for DGX OS>DGX OS, with Linux {pin}'  "
        "# or the matching entry in /boot/grub/grub.cfg (GRUB_DEFAULT=saved)",
        "sudo reboot",
    )
    return Remedy("kernel_pin", False, {v.node: steps for v in bad},
                  text="sparkctl never upgrades or installs kernels; these are the steps to run yourself")


# --------------------------------------------------------------------------- page size


def check_page_size(ctx: Context) -> list[Verdict]:
    want = ctx.profile.laws.page_size_kib
    out: list[Verdict] = []
    for node, f in each(ctx, "page_size", "page_size", out):
        have = (f.page_size_bytes or 0) // 1024
        if want is None or have == want:
            out.append(Verdict("page_size", node, OK, f"{have} KiB", f"{want} KiB" if want else "any"))
            continue
        w = ctx.waivers.get("page_size")
        if w:
            out.append(Verdict("page_size", node, WAIVED, f"{have} KiB", f"{want} KiB",
                               f"waived: {w.reason} (an unqualified configuration, recorded in every bench row)"))
        else:
            out.append(Verdict("page_size", node, FAIL, f"{have} KiB", f"{want} KiB",
                               f"the profile asks for a {want} KiB-page kernel; boot one on {node}, or run it "
                               "unqualified with --waive page_size --reason \"...\""))
    return out


# --------------------------------------------------------------------------- memory guard


def check_memory(ctx: Context) -> list[Verdict]:
    law = ctx.profile.laws
    out: list[Verdict] = []
    for node, f in each(ctx, "memory_guard", "meminfo", out):
        avail = f.mem_available_kib / 1024 / 1024
        total = f.mem_total_kib / 1024 / 1024
        running = bool(getattr(f, "engines", ()))
        if law.gpu_memory_utilization > 0.92:
            out.append(Verdict("memory_guard", node, FAIL, f"utilization {law.gpu_memory_utilization}", "<= 0.92",
                               "lower laws.gpu_memory_utilization: UVM over-commit livelocks the box"))
            continue
        if not running and total - avail > LEAK_THRESHOLD_GIB:
            out.append(Verdict("memory_guard", node, FAIL, f"{total - avail:.1f} GiB held, no engine running",
                               f"< {LEAK_THRESHOLD_GIB:.0f} GiB held when idle",
                               f"memory held after an engine died (a leak): reboot {node} to give it back"))
            continue
        if running and avail < law.min_free_gib:
            out.append(Verdict("memory_guard", node, FAIL, f"MemAvailable {avail:.1f} GiB",
                               f">= {law.min_free_gib:g} GiB",
                               f"lower laws.gpu_memory_utilization or stop what else runs on {node}"))
            continue
        out.append(Verdict("memory_guard", node, OK, f"{avail:.1f} of {total:.1f} GiB available",
                           f">= {law.min_free_gib:g} GiB, utilization <= 0.92"))
    return out


# --------------------------------------------------------------------------- clock cap


def check_clock(ctx: Context) -> list[Verdict]:
    """The 580 driver does not report an applied ``-lgc`` lock, so the lock is
    judged from sparkctl's record (boot id + cap, written when it locked the
    clock, by the remedy or by sparkctl-clock-cap.service at boot) against the
    node's current boot id, and from evidence: a busy GPU above the cap."""
    cap = ctx.profile.laws.clock_cap_mhz
    out: list[Verdict] = []
    for node, f in each(ctx, "clock_cap", "gpu", out):
        rec = getattr(f, "clock_lock_record", None)
        in_force = rec is not None and rec[0] == f.boot_id
        locked_cap = rec[1] if rec is not None and in_force else None
        sm = f.gpu.sm_mhz if f.gpu else None
        if cap is None:
            out.append(Verdict("clock_cap", node, WARN if locked_cap else OK,
                               f"lock 0,{locked_cap} MHz" if locked_cap else "no lock", "uncapped",
                               f"sudo nvidia-smi -rgc on {node}" if locked_cap else ""))
            continue
        fix = (f"`sparkctl check --fix` runs nvidia-smi -lgc 0,{cap} on {node} "
               "(and enable sparkctl-clock-cap.service so it comes back after a reboot)")
        if rec is not None and not in_force:
            out.append(Verdict("clock_cap", node, FAIL, "lock lost: the node rebooted since it was applied",
                               f"0,{cap} MHz", "the lock does not survive a reboot: " + fix))
        elif locked_cap is None:
            out.append(Verdict("clock_cap", node, FAIL, "no clock lock applied", f"0,{cap} MHz", fix))
        elif locked_cap != cap:
            out.append(Verdict("clock_cap", node, FAIL, f"lock 0,{locked_cap} MHz", f"0,{cap} MHz", fix))
        elif sm is not None and sm > cap + CLOCK_LOCK_SLACK_MHZ:
            out.append(Verdict("clock_cap", node, FAIL, f"SM clock {sm} MHz above the lock", f"<= {cap} MHz", fix))
        else:
            out.append(Verdict("clock_cap", node, OK, f"lock 0,{cap} MHz (SM {sm} MHz)", f"0,{cap} MHz"))
    return out


def remedy_clock(ctx: Context, verdicts: list[Verdict]) -> Remedy | None:
    cap = ctx.profile.laws.clock_cap_mhz
    bad = [v for v in verdicts if v.failed]
    if cap is None or not bad:
        return None
    inv = ctx.inventory
    cmds = {v.node: clocklock.lock_commands(cap, inv.node(v.node).prefix, inv.node(v.node).proc_root) for v in bad}
    return Remedy("clock_cap", True, cmds,
                  readback="nvidia-smi --query-gpu=clocks.sm,clocks_event_reasons.active --format=csv,noheader",
                  text=f"lock the GPU clock at 0,{cap} MHz, record it for this boot, read it back")

