"""What a fact is: a command, a pure parser, and the exit codes that mean "not there".

What this module owns:

* :class:`Fact` -- one read-only fact of a node: the shell body that prints it
  (built from a :class:`ScriptContext`), the pure parser of that output, and
  its :class:`ExitCode` table (codes that are a value, "not available", "the
  thing is gone", or a known failure with a better explanation than "exit 2").
  A fact may be read once per node or once per item (a netdev, a PCIe
  function): its ``key`` then holds ``{}`` where the item goes
  (``net.{}.mtu`` -> section ``net.enp1s0f0np0.mtu``);
* :class:`Registry` -- the ordered facts that the batch script prints and the
  batch parser reads, both by iterating it (``sparkctl.facts.batch``);
* :class:`ProbeParseError`, the one exception a parser raises, and the small
  helpers parsers share (:func:`lines`, :func:`one_line`, :func:`int_in`).

What it must not do: run anything, import a transport, read a clock.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from sparkctl.errors import Ref, SparkctlError

if TYPE_CHECKING:  # the node's exporter imports the facts without pydantic (sparkctl.node.bundle)
    from sparkctl.model.inventory import Node

T = TypeVar("T")

SECTION_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # section names reach the shell unquoted


class ProbeParseError(SparkctlError):
    """A probe's output could not be read: ``what`` names the fact, ``tool`` the
    command whose output it was, ``detail`` what was unexpected. Parsers raise
    it (and nothing else) instead of returning a value they are not sure of."""

    def __init__(self, what: str, detail: str, tool: str | None = None) -> None:
        super().__init__(f"cannot read {what}{f' ({tool} output)' if tool else ''}: {detail}",
                         Ref(command=tool) if tool else None,
                         "the tool printed a format sparkctl does not know; "
                         "tests/fixtures/spark/ holds the formats it reads")
        self.what = what
        self.detail = detail
        self.tool = tool


# --------------------------------------------------------------------------- exit codes

Means = Literal["absent", "not_available", "gone", "unreadable"]


@dataclass(frozen=True)
class ExitCode:
    """What an exit code of a fact's command means.

    ``absent``: the fact is a value (``value``), not an error (no clock-lock
    record yet; sparkctl never fetched weights here). ``not_available``: the
    command does not exist on the node. ``gone``: the item itself does not
    exist (a configured netdev missing): the other facts of the same item are
    not read. ``unreadable``: a known failure, explained by ``detail``.
    ``rc`` None matches every non-zero code; ``silent_only``: only when the
    command printed nothing. ``{}`` in ``detail`` is the item.
    """

    rc: int | None
    means: Means
    detail: str = ""
    value: Any = None
    silent_only: bool = False

    def matches(self, rc: int, text: str) -> bool:
        if (rc != self.rc) if self.rc is not None else rc == 0:
            return False
        return not (self.silent_only and text.strip())


# A shell answers 127 for a command it cannot find (POSIX, "Command Search and
# Execution"); the script's ``have X || exit 127`` does the same.
NOT_FOUND = ExitCode(127, "not_available", "command not found")


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class WeightsPaths:
    """Where on a node the weights agent, its hash cache and the weights are (see
    :func:`sparkctl.ops.weights.probe_paths`, which owns them)."""

    agent: str
    hash_cache: str
    root: str


@dataclass(frozen=True)
class ScriptContext:
    """What a fact's command may depend on: the node and what the caller asked for."""

    node: Node
    weights_path: str | None = None
    endpoint_port: int | None = None
    weights: WeightsPaths | None = None
    engine: Any = None  # sparkctl.facts.engine.EngineProbe: what the engine fact looks for
    endpoint_host: str | None = None  # the address the endpoint listens on (serve.bind); None: 127.0.0.1
    endpoint_key: tuple[str, str] | None = None  # (the 0600 env file, the variable in it) when a key is needed

    @property
    def sysfs(self) -> str:
        return self.node.sysfs_root.rstrip("/") or "/"

    @property
    def proc(self) -> str:
        return self.node.proc_root.rstrip("/") or "/"

    @property
    def netdevs(self) -> list[str]:
        seen: list[str] = []
        for port in self.node.ports.values():
            for nd in port.netdevs:
                if nd not in seen:
                    seen.append(nd)
        return seen


def _always(ctx: ScriptContext) -> bool:
    return True


@dataclass(frozen=True, eq=False)  # identity: a fact is a registry entry, not a value
class Fact(Generic[T]):
    """One read-only fact: command, pure parser, exit-code table.

    ``key``: the section name, with ``{}`` where the item goes for a per-item
    fact (then ``items`` lists the items of a node). ``title``: the human name
    in messages (also with ``{}``), naming the tool. ``command(ctx, item)``: a
    POSIX sh body; every value in it must be shlex-quoted. ``core``: expected
    in every batch, so reported missing even when the manifest was lost.
    ``when``: whether the script asks for it at all (weights, models).
    """

    key: str
    title: str
    command: Callable[[ScriptContext, str], str]
    parse: Callable[[str], T]
    exit_codes: tuple[ExitCode, ...] = (NOT_FOUND,)
    items: Callable[[ScriptContext], Sequence[str]] | None = None
    core: bool = True
    when: Callable[[ScriptContext], bool] = _always
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.items is None) == ("{}" in self.key):
            raise ValueError(f"fact {self.key!r}: a per-item key needs items, and only then")
        head, _, tail = self.key.partition("{}")
        object.__setattr__(self, "_pattern", re.compile(re.escape(head) + ("(.+)" if self.items else "")
                                                        + re.escape(tail)))

    def section(self, item: str = "") -> str:
        return self.key.replace("{}", item)

    def title_of(self, item: str = "") -> str:
        return self.title.replace("{}", item)

    def match(self, section: str) -> str | None:
        """The item of ``section`` when it is this fact's (``""`` for a single fact)."""
        m = self._pattern.fullmatch(section)
        return None if m is None else (m.group(1) if self.items else "")

    def sections(self, ctx: ScriptContext) -> list[tuple[str, str]]:
        """(item, section name) for every section this fact adds to ``ctx``'s script."""
        if not self.when(ctx):
            return []
        return [(i, self.section(i)) for i in (self.items(ctx) if self.items else [""])]


class Registry:
    """The ordered facts of a probe batch. The order is the script's, and the
    parser reads in the same order (an item's ``gone`` fact comes first)."""

    def __init__(self, facts: Sequence[Fact[Any]]) -> None:
        keys = [f.key for f in facts]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate fact keys")
        self.facts = tuple(facts)

    def __iter__(self) -> Iterator[Fact[Any]]:
        return iter(self.facts)

    def resolve(self, section: str) -> tuple[Fact[Any], str] | None:
        """(fact, item) that prints ``section``; a single fact's exact key wins
        over a per-item pattern."""
        hits = [(f, item) for f in self.facts if (item := f.match(section)) is not None]
        hits.sort(key=lambda h: h[0].items is not None)
        return hits[0] if hits else None

    def order(self, fact: Fact[Any]) -> int:
        return self.facts.index(fact)


# --------------------------------------------------------------------------- helpers for commands


def q(value: object) -> str:
    return shlex.quote(str(value))


def tool(cmd: str, *args: str) -> str:
    """Run ``cmd`` when the node has it, else exit 127 (``have`` is the prelude's)."""
    return f"have {q(cmd)} || exit 127; {q(cmd)} {' '.join(args)}".rstrip()


def cat(path: str) -> str:
    return f"cat {q(path)}"


def small_file(path: str) -> str:
    """A small text file that reads whole or not at all (a sysfs attribute such as operstate or
    mtu, /proc's boot_id and uptime, sparkctl's own records), printed by the prelude's ``show``:
    shell builtins, no process per file (a probe reads a dozen of them, the node's exporter at
    every scrape); a file ``show`` cannot open goes to ``cat`` for its message and exit code."""
    return f"show {q(path)}"


# --------------------------------------------------------------------------- helpers for parsers


def lines(text: str) -> list[str]:
    """The non-blank lines, right-stripped."""
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def one_line(what: str, text: str, tool: str | None = None) -> str:
    found = lines(text)
    if not found:
        raise ProbeParseError(what, "no output", tool)
    if len(found) > 1:
        raise ProbeParseError(what, f"expected one line, got {len(found)}", tool)
    return found[0].strip()


def int_in(what: str, s: str, lo: int | None = None, hi: int | None = None, tool: str | None = None) -> int:
    if not re.fullmatch(r"[0-9]+", s):
        raise ProbeParseError(what, f"not a number: {s[:40]!r}", tool)
    v = int(s)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ProbeParseError(what, f"{v} is out of range", tool)
    return v
