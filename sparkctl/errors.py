"""One error tree for sparkctl, and the one table of its exit codes.

Every error carries *what* went wrong, *where* (a :class:`Ref`: file, line,
key, node, command) and a *hint* for the fix. Library code and the CLI's
commands raise these; only ``sparkctl.cli.main`` turns them into a message and
an exit code, always a member of :class:`ExitStatus` (httpie's ``status.py``
is the model: one enum, returned by its ``core.py`` alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, unique


@unique
class ExitStatus(IntEnum):
    """Every exit code ``sparkctl`` returns, and what it means (docs/ARCHITECTURE.md and README list the same)."""

    SUCCESS = 0
    ERROR = 1  # a SparkctlError with no more precise class; a click error other than usage
    CONFIG = 2  # bad input: a profile, inventory or command-line value (click's usage errors are 2 too)
    UNREACHABLE = 3  # a node could not be reached, or refused us (host key, ssh)
    CHECK_FAILED = 4  # one or more laws fail (check, the check phase of up, bench's pre-check and --record)
    LIFECYCLE = 5  # up / down / switch / weights did not reach the state asked for
    LOCKED = 6  # the cluster is locked by another operator
    SIM = 7  # the simulated cluster (sparkctl_sim's SimError: it lives there, sparkctl never imports it)
    DEGRADED = 8  # a rolling switch's way back failed part way: some replicas serve, the record says "degraded"
    INTERNAL = 70  # a bug in sparkctl: EX_SOFTWARE of sysexits.h
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, the shell's convention


@dataclass(frozen=True)
class Ref:
    """Where a problem is: a place in a file, and/or a node and command."""

    file: str | None = None
    line: int | None = None
    key: str | None = None
    node: str | None = None
    command: str | None = None

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file:
            parts.append(f"{self.file}:{self.line}" if self.line else self.file)
        if self.key:
            parts.append(_printable(self.key))  # a key is user text: a newline must not forge a line
        if self.node:
            parts.append(f"node {_printable(self.node)}")
        if self.command:  # a command is a label here: a long script (a batched probe) is cut to one short line
            parts.append(f"command '{_printable(self.command, 100)}'")
        return ": ".join(parts)


def _printable(text: str, limit: int = 120) -> str:
    """User text on one line: control characters escaped, long text cut."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[:limit] + "..."


class SparkctlError(Exception):
    """Base of every error sparkctl raises on purpose."""

    exit_code: ExitStatus = ExitStatus.ERROR

    def __init__(self, message: str, ref: Ref | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.ref = ref
        self.hint = hint
        self.phase: str | None = None  # the phase of up/down/switch it happened in, once annotated

    def in_phase(self, op: str, phase: str) -> SparkctlError:
        """The same error (same class, every field kept), its message naming the operation and phase once.

        A copy, not a re-construction: subclasses with other constructor arguments
        (``HostKeyError``, ``SimError``, ...) keep every field they carry.
        """
        if self.phase is not None:
            return self
        # Not copy.copy: an exception copies by calling cls(*args), which a subclass
        # with other constructor arguments refuses. A bare instance, then every field.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.message = f"{op} failed in phase {phase}: {self.message}"
        new.phase = phase
        new.args = (new.message,)
        return new

    def one_line(self) -> str:
        where = f"{self.ref}: " if self.ref and str(self.ref) else ""
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"


class ConfigError(SparkctlError):
    """A profile, inventory or command-line value is wrong."""

    exit_code = ExitStatus.CONFIG


class InventoryError(ConfigError):
    pass


class ProfileError(ConfigError):
    pass


class RenderError(ConfigError):
    pass


class NotFound(ConfigError):
    pass


class TransportError(SparkctlError):
    """A node could not be reached, or refused us."""

    exit_code = ExitStatus.UNREACHABLE


class CheckFailed(SparkctlError):
    """One or more laws failed."""

    exit_code = ExitStatus.CHECK_FAILED


class LifecycleError(SparkctlError):
    """up / down / switch did not reach the state it was asked for."""

    exit_code = ExitStatus.LIFECYCLE


class SwitchDegraded(LifecycleError):
    """A rolling switch failed and its way back failed part way, or a resumed one's replica did not
    come up: what serves was left serving (some replicas the new profile, some the old), the one
    that did not come back is stopped; the same switch again resumes (sparkctl.plan.resumeplan)."""

    exit_code = ExitStatus.DEGRADED


class LockUnavailable(LifecycleError):
    """The head answered, but no lock dir could be made (a full disk, a read-only
    filesystem): nobody holds the lock, and nobody else can take it either."""


class Interrupted(LifecycleError):
    """The operator interrupted sparkctl (SIGINT); what the run started is stopped."""

    exit_code = ExitStatus.INTERRUPTED


class LockHeld(SparkctlError):
    exit_code = ExitStatus.LOCKED
