"""The simulated `journalctl`: one unit's journal since boot, as the simulated systemd keeps it.

SIMULATION ONLY. The simulated systemd (sparkctl_sim.systemctlshim) writes a unit's
standard output and error, and its own lines about the unit (``TS systemd[1]: NAME: TEXT``),
to ``RUN_DIR/systemd/NAME.journal.log``. Known difference: ``-b`` (this boot only) is
accepted, but the shim prints the whole file, which may hold lines of earlier simulated boots
(raw output lines carry no boot id to tell them apart): a count read from it can only be
higher than the real one, never lower. Only the options
sparkctl uses are simulated, every other one is refused (stricter than the real tool):
``-u/--unit UNIT`` (journalctl(1): a name without a suffix means ``.service``), ``-b``,
``-o cat`` (journalctl(1) "cat": the message alone, no timestamp or identifier),
``--no-pager``, ``-q``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from sparkctl_sim.shimbase import _run_dir

_SYSTEMD_LINE = re.compile(r"\S+ systemd\[1\]: [^:]+: (.*)")


def journalctl_main(args: Sequence[str]) -> int:
    unit, cat, it = None, False, iter(args)
    for a in it:
        if a in ("-u", "--unit"):
            unit = next(it, None)
        elif a.startswith("--unit="):
            unit = a.partition("=")[2]
        elif a == "-o":
            fmt = next(it, None)
            if fmt not in ("cat", "short"):
                print(f"journalctl: output mode not simulated: {fmt}", file=sys.stderr)
                return 64
            cat = fmt == "cat"
        elif a in ("-b", "--no-pager", "-q", "--quiet"):
            continue
        else:
            print(f"journalctl: option not simulated: {a}", file=sys.stderr)
            return 64
    if not unit:
        print("journalctl: SIMULATION: only -u UNIT is simulated", file=sys.stderr)
        return 64
    name = unit if "." in unit else f"{unit}.service"
    path = _run_dir() / "systemd" / f"{name}.journal.log"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0  # a unit that never ran: no entries ("-- No entries --" is suppressed by -q)
    for line in text.splitlines():
        m = _SYSTEMD_LINE.fullmatch(line) if cat else None
        sys.stdout.write((m.group(1) if m else line) + "\n")
    return 0
