"""The memory watchdog's fact: is earlyoom installed, enabled, running, and with which arguments.

What this module owns: the :class:`~sparkctl.facts.registry.Fact` ``watchdog``
and its pure parser. The command: ``dpkg-query -W --showformat='${db:Status-Status}' earlyoom``
(dpkg-query(1): prints ``installed`` for an installed package, exit 1 and "no packages
found matching" for one dpkg never knew; the package, not a binary on PATH, because a
binary copied by hand has no unit and no /etc/default file), ``systemctl
show -p UnitFileState,ActiveState earlyoom`` (systemctl(1); the words ``is-enabled`` and
``is-active`` print, e.g. ``enabled``/``disabled``, ``active``/``inactive``/``failed``, in
one call instead of two), and the
``EARLYOOM_ARGS=`` line of Debian's /etc/default/earlyoom. It must not run anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.facts.registry import NOT_FOUND, Fact, ProbeParseError, ScriptContext, q
from sparkctl.model import paths
from sparkctl.model.watchdog import INSTALLED_TEST


@dataclass(frozen=True)
class WatchdogFacts:
    installed: bool
    enabled: str  # systemctl is-enabled's word ("" when it printed nothing)
    active: str  # systemctl is-active's word
    args: tuple[str, ...] | None  # EARLYOOM_ARGS split as systemd splits it; None: no file or no line


def parse_args_line(text: str) -> tuple[str, ...] | None:
    """EARLYOOM_ARGS of a /etc/default/earlyoom text, split as systemd splits it; None when absent."""
    value = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("EARLYOOM_ARGS="):
            value = line.partition("=")[2]
    if value is None:
        return None
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return tuple(value.split())


def parse_watchdog(text: str) -> WatchdogFacts:
    got: dict[str, str] = {}
    args_line = ""
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if key in ("installed", "enabled", "active") and eq:
            got[key] = value.strip()
        elif key == "EARLYOOM_ARGS":
            args_line = line
    if "installed" not in got:
        raise ProbeParseError("watchdog", "no installed= line", "systemctl is-active earlyoom")
    return WatchdogFacts(got["installed"] == "yes", got.get("enabled", ""), got.get("active", ""),
                         parse_args_line(args_line) if args_line else None)


def _command(ctx: ScriptContext, _item: str) -> str:
    conf = q(paths.under(ctx.node.prefix, paths.EARLYOOM_DEFAULT))
    return ("have systemctl || exit 127; "
            f"if {INSTALLED_TEST}; then echo installed=yes; else echo installed=no; fi; "
            # one systemctl for both words (systemctl(1) show -p: UnitFileState=, ActiveState=)
            "systemctl show -p UnitFileState,ActiveState earlyoom 2>/dev/null "
            "| sed -n 's/^UnitFileState=/enabled=/p; s/^ActiveState=/active=/p'; "
            f"[ -r {conf} ] && grep '^EARLYOOM_ARGS=' {conf} | tail -n 1; exit 0")


WATCHDOG = Fact("watchdog", "earlyoom (dpkg-query, systemctl is-active/is-enabled, /etc/default/earlyoom)",
                _command, parse_watchdog, exit_codes=(NOT_FOUND,), core=False)


def parse_kills(text: str) -> int:
    """The count ``grep -c`` printed: earlyoom's ``sending SIGTERM|SIGKILL to process ...`` lines
    (rfjakob/earlyoom v1.7 kill.c ``kill_process``), one per signal sent."""
    s = text.strip()
    if not s.isdigit():
        raise ProbeParseError("earlyoom kills", f"not a count: {s[:40]!r}", "journalctl -u earlyoom")
    return int(s)


# Not in the batch (status does not read it): the exporter adds it to its script. earlyoom
# writes its messages to stderr, which systemd sends to the journal (Debian's unit).
KILLS = Fact("watchdog.kills", "earlyoom's kills this boot (journalctl -b -u earlyoom)",
             lambda c, _: ("have journalctl || exit 127; journalctl -b -u earlyoom -o cat --no-pager -q 2>/dev/null "
                           "| grep -c '^sending SIG'; exit 0"), parse_kills, core=False)
