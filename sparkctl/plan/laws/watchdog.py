"""The memory_watchdog law: earlyoom installed, enabled, running, with sparkctl's arguments.

Pure: a verdict per node from the ``watchdog`` fact (sparkctl.facts.watchdog)
against :func:`sparkctl.model.watchdog.earlyoom_args` of the profile's limits.
"""

from __future__ import annotations

from sparkctl.model import paths
from sparkctl.model.watchdog import earlyoom_args
from sparkctl.plan.laws.base import FAIL, OK, WARN, Context, Verdict, each

LAW = "memory_watchdog"


def check_memory_watchdog(ctx: Context) -> list[Verdict]:
    """FAIL without the package (only `fabric apply` installs it: it needs apt and the network);
    WARN with other arguments or the unit not running: `up` writes the profile's arguments and
    restarts earlyoom (plan step ``watchdog``), so a node about to serve is not refused for it."""
    want = earlyoom_args(ctx.profile.laws)
    expected = "earlyoom enabled, active, " + " ".join(want[:2])
    install_fix = (f"`sparkctl fabric apply {ctx.profile_name}` installs and configures it "
                   "(on the node: sudo apt-get install earlyoom)")
    configure_fix = (f"`sparkctl up` writes {paths.EARLYOOM_DEFAULT} from laws.min_free_gib and restarts "
                     "earlyoom (or `sparkctl fabric apply PROFILE`)")
    out: list[Verdict] = []
    for node, f in each(ctx, LAW, "watchdog", out):
        w = getattr(f, "watchdog", None)
        if w is None:
            na = getattr(f, "not_available", {}).get("watchdog")
            out.append(Verdict(LAW, node, WARN, f"not read{': ' + na if na else ''}", expected, install_fix))
        elif not w.installed:
            out.append(Verdict(LAW, node, FAIL, "earlyoom not installed: an over-commit hangs the box",
                               expected, install_fix))
        elif w.args != want:
            seen = " ".join(w.args) if w.args is not None else f"no EARLYOOM_ARGS in {paths.EARLYOOM_DEFAULT}"
            out.append(Verdict(LAW, node, WARN, f"earlyoom arguments: {seen[:120]}", " ".join(want)[:120],
                               configure_fix))
        elif w.enabled != "enabled" or w.active != "active":
            out.append(Verdict(LAW, node, WARN, f"earlyoom {w.enabled or '?'}, {w.active or '?'}", expected,
                               configure_fix))
        else:
            out.append(Verdict(LAW, node, OK, f"earlyoom active, {' '.join(want[:2])}", expected))
    return out
