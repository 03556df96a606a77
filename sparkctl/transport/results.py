"""What commands did, as data: one command's :class:`CommandResult`, a fan-out's :class:`FanOut`.

This module owns the result types every transport returns and the one rule
that turns a fan-out's failures into an error (:meth:`FanOut.raise_for`), so
callers stop carrying their own copies of "the first failure becomes an error".

A command that ran and failed has its exit code; a command that could not run
at all (node unreachable, timed out, login refused, sudo wanting a password,
overall deadline passed) has ``exit_code == -1`` and ``error`` set. Both are
values, not exceptions: a fan-out over four nodes never loses three answers
because the fourth did not reply (fabric's ``GroupResult`` keeps every host's
outcome the same way, fabric/group.py).

What it must not do: run anything, print, or exit. Pure data.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from sparkctl.errors import LifecycleError, Ref, SparkctlError

Command = str | Sequence[str]


@dataclass(frozen=True)
class CommandResult:
    """What one command on one node did.

    ``error`` is set (and ``exit_code`` is -1) when the command could not run
    or did not finish; it starts with a category word: ``unreachable:``,
    ``timeout:``, ``auth:``, ``sudo:``, ``ssh:``, ``hostkey:``, ``deadline:``,
    ``cancelled:``.
    """

    node: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    @property
    def last_line(self) -> str:
        """Why it failed, in one line: the error, else the last stderr (or stdout) line, else the exit code."""
        if self.error:
            return self.error
        tail = self.stderr.strip().splitlines()[-1:] or self.stdout.strip().splitlines()[-1:]
        return tail[0] if tail else f"exit {self.exit_code}"

    def describe(self) -> str:
        """One line for messages: what failed and why (never the stdin)."""
        if self.error:
            return f"node {self.node}: {self.command!r}: {self.error}"
        tail = self.stderr.strip().splitlines()[-1:] or self.stdout.strip().splitlines()[-1:]
        why = f": {tail[0]}" if tail else ""
        return f"node {self.node}: {self.command!r} exited {self.exit_code}{why}"


class FanOut(Mapping[str, CommandResult]):
    """Every node's result of one fan-out step, in the order the nodes were asked.

    A read-only mapping node -> :class:`CommandResult` (so ``res["spark-a"]``,
    ``res.items()`` and ``dict(res)`` work as they did when ``run_all`` returned
    a dict), plus fabric's ``GroupResult`` vocabulary: :attr:`ok`,
    :attr:`succeeded`, :attr:`failed`, and :meth:`raise_for`.
    """

    __slots__ = ("_results",)

    def __init__(self, results: Mapping[str, CommandResult] | None = None) -> None:
        self._results: dict[str, CommandResult] = dict(results or {})

    def __getitem__(self, node: str) -> CommandResult:
        return self._results[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def __repr__(self) -> str:
        return f"FanOut({self._results!r})"

    @property
    def results(self) -> dict[str, CommandResult]:
        """A copy of node -> result."""
        return dict(self._results)

    @property
    def ok(self) -> bool:
        """Every node's command ran and exited 0 (an empty fan-out is ok)."""
        return all(r.ok for r in self._results.values())

    @property
    def succeeded(self) -> dict[str, CommandResult]:
        return {n: r for n, r in self._results.items() if r.ok}

    @property
    def failed(self) -> dict[str, CommandResult]:
        """The nodes whose command failed or could not run, sorted by node name."""
        return {n: self._results[n] for n in sorted(self._results) if not self._results[n].ok}

    def raise_for(self, what: str, error: type[SparkctlError] = LifecycleError, hint: str | None = None) -> FanOut:
        """Raise ``error`` naming every failing node and the first one's last stderr line; else return self.

        ``what`` says what the step was doing ("pushing the rendered files").
        The :class:`~sparkctl.errors.Ref` names the first failing node (by
        name) and its command. Returns ``self`` so a caller can chain it.
        """
        bad = self.failed
        if not bad:
            return self
        node, first = next(iter(bad.items()))
        raise error(f"{what} failed on {', '.join(bad)}: {first.last_line}", Ref(node=node, command=first.command),
                    hint)


def command_line(command: Command) -> str:
    """The shell text for a command: a str as-is (the caller quoted it), a list joined."""
    if isinstance(command, str):
        return command
    return shlex.join(list(command))


def reply(
    stdout: str = "", *, exit_code: int = 0, stderr: str = "", error: str | None = None, duration_s: float = 0.0
) -> CommandResult:
    """A scripted result for :class:`~sparkctl.transport.fake.FakeTransport` (node and command are filled in on use)."""
    return CommandResult("", "", -1 if error else exit_code, stdout, stderr, duration_s, error)


__all__ = ["Command", "CommandResult", "FanOut", "command_line", "reply"]
