"""The memory_watchdog law: earlyoom installed, enabled, running, with sparkctl's arguments.

Pure: a verdict per node from the ``watchdog`` fact (sparkctl.facts.watchdog)
against :func:`sparkctl.plan.watchdog.earlyoom_args` of the profile's limits.
"""

from __future__ import annotations

import shlex

from sparkctl.model import paths
from sparkctl.plan.laws.base import OK, WARN, Context, Verdict, each
from sparkctl.plan.watchdog import earlyoom_args, render_default

LAW = "memory_watchdog"
# WARN, not FAIL, until `up` has a step that installs and configures earlyoom
# (sparkctl/plan/planner.py plan_up) and the simulated node runs it: a FAIL here
# would refuse every `up` on a node that sparkctl itself cannot yet fix.
MISSING = WARN


def install_commands(ctx: Context) -> tuple[str, ...]:
    """What a node needs (sudo): the package, sparkctl's arguments, the unit enabled and restarted."""
    text = render_default(ctx.profile.laws)
    return ("apt-get install -y -qq --no-install-recommends earlyoom",
            f"printf '%s' {shlex.quote(text)} > {paths.EARLYOOM_DEFAULT}",
            "systemctl enable earlyoom", "systemctl restart earlyoom")


def check_memory_watchdog(ctx: Context) -> list[Verdict]:
    want = earlyoom_args(ctx.profile.laws)
    expected = "earlyoom enabled, active, " + " ".join(want[:2])
    fix = ("`sparkctl up` installs and configures it (or on the node: "
           + "; ".join(f"sudo {c}" if not c.startswith("printf") else f"write {paths.EARLYOOM_DEFAULT}"
                       for c in install_commands(ctx)) + ")")
    out: list[Verdict] = []
    for node, f in each(ctx, LAW, "watchdog", out):
        w = getattr(f, "watchdog", None)
        if w is None:
            na = getattr(f, "not_available", {}).get("watchdog")
            out.append(Verdict(LAW, node, MISSING, f"not read{': ' + na if na else ''}", expected, fix))
        elif not w.installed:
            out.append(Verdict(LAW, node, MISSING, "earlyoom not installed", expected, fix))
        elif w.args != want:
            seen = " ".join(w.args) if w.args is not None else f"no EARLYOOM_ARGS in {paths.EARLYOOM_DEFAULT}"
            out.append(Verdict(LAW, node, MISSING, f"earlyoom arguments: {seen[:120]}", " ".join(want)[:120], fix))
        elif w.enabled != "enabled" or w.active != "active":
            out.append(Verdict(LAW, node, MISSING, f"earlyoom {w.enabled or '?'}, {w.active or '?'}", expected, fix))
        else:
            out.append(Verdict(LAW, node, OK, f"earlyoom active, {' '.join(want[:2])}", expected))
    return out
