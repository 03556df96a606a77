"""The GPU clock lock: one owner for its path, its commands, its record and its boot unit. Pure.

The 580 driver does not report a lock set with ``nvidia-smi -lgc`` (the field
report; ``nvidia-smi -q -d CLOCK`` shows no "locked" state on GB10), so sparkctl
records every lock it sets as ``<boot id> <MHz>`` in :data:`paths.CLOCK_LOCK`.
A record from another boot means the lock is gone (a reboot resets it).
``check`` judges the record; ``up``, ``check --fix`` and the boot unit write it
with the commands below, and ``down --reset-clocks`` removes it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkctl.model.paths import CLOCK_LOCK, under

BOOT_ID = "/sys/kernel/random/boot_id"  # under the node's proc root
UNIT_NAME = "sparkctl-clock-cap.service"


class ClockLockParseError(ValueError):
    """The record is not ``<boot id> <MHz>``."""


@dataclass(frozen=True)
class ClockLock:
    boot_id: str
    cap_mhz: int


def record_path(prefix: str = "/") -> str:
    return under(prefix, CLOCK_LOCK)


def _write(cap_mhz: int, prefix: str, boot_id_file: str) -> str:
    rec = record_path(prefix)
    q = shlex.quote
    # temp + rename: a reader never sees half a record
    return (f"mkdir -p {q(rec.rsplit('/', 1)[0])} && printf '%s %s\\n' \"$(cat {q(boot_id_file)})\" {int(cap_mhz)} "
            f"> {q(rec + '.tmp')} && mv {q(rec + '.tmp')} {q(rec)}")


def lock_commands(cap_mhz: int, prefix: str = "/", proc_root: str = "/proc") -> tuple[str, ...]:
    """Lock the clock, then record (boot id, cap) atomically."""
    boot = (proc_root.rstrip("/") or "") + BOOT_ID
    return (f"nvidia-smi -lgc 0,{int(cap_mhz)}", _write(cap_mhz, prefix, boot))


def unit_record_command(cap_mhz: int, prefix: str = "/") -> str:
    """The boot unit's ExecStartPost: the same record, from the real /proc (systemd runs it at boot)."""
    return _write(cap_mhz, prefix, "/proc" + BOOT_ID)


def reset_command(prefix: str = "/") -> str:
    """``nvidia-smi -rgc`` and forget the record."""
    return f"nvidia-smi -rgc && rm -f {shlex.quote(record_path(prefix))}"


def parse(text: str) -> ClockLock:
    """``<boot_id> <cap MHz>``, as written by :func:`lock_commands` and the boot unit."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit() or len(parts[0]) != 36:
        raise ClockLockParseError(f"expected '<boot_id> <MHz>', got {text.strip()[:60]!r}")
    return ClockLock(parts[0], int(parts[1]))
