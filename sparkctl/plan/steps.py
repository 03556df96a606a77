"""Plans as data: the steps ``up``, ``down`` and ``switch`` take, exactly. Pure.

A :class:`Plan` is what ``sparkctl plan`` prints and what the executor runs:
an ordered list of :class:`Step` (each fans out to its nodes and waits for all)
and named branches taken when a step fails (``stop``: stop what this run
started and record it; ``rollback``: bring the previous stack back). The same
plan, as JSON, is what the supervised switch hands to the runner on the head
(``sparkctl/remote/planrun.py``), so there is one switch/rollback logic.

File contents are not in a plan (they may hold secrets): a ``put`` step names
each file by path, mode and SHA-256, and the executor gets the bytes from the
rendering (or, on the head, from the plan file's 0600 blob store).

Every command a step runs is in the step: its ``commands`` (one per node), or
one of the node -> command maps in its ``params`` named in
:data:`PARAM_COMMANDS` (the ready step's look at each rank and its log, the check's
probe scripts, the lock's stale check and break), each with the step's
``sudo`` for that node; every file it writes is in its ``files`` or, for a
``record`` step, is the record at ``params["path"]`` or, for a ``check`` step,
the laws' verdicts at ``params["verdicts"]`` (node, path, that node's sudo).
:func:`calls` lists them all, :func:`describe` prints them, and the
plan-equals-execution test holds a run to exactly them. A step kind is one function in the interpreter
(``planrun.KINDS``); adding one (drain, wait, register ...) adds a name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# What a step does; the interpreter (sparkctl.remote.planrun) knows each kind.
KINDS = ("check", "run", "stop", "put", "ready", "record", "leaks", "lock")
# What a failed step leads to: nothing more ("abort"), the next step ("continue"), or the
# branch of that name (the planner's: "stop", "rollback", "restore-record"). The branch
# "finally" runs after everything else, whatever happened (the lock's release).
ON_FAIL = ("abort", "continue", "stop", "rollback", "restore-record")
FINALLY = "finally"
# The params that hold node -> command maps a step kind runs besides ``commands``.
PARAM_COMMANDS = ("watch", "tail_on_failure", "fabric_probe", "holder_alive", "break_stale",
                  "remove_on_failure")


@dataclass(frozen=True)
class FileRef:
    path: str  # absolute, under the node's prefix
    mode: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "mode": f"{self.mode:o}", "sha256": self.sha256}


@dataclass(frozen=True)
class Step:
    id: str  # unique within its plan
    phase: str  # check | clock | record | stop-stale | push | logs | reload | start | ready | stop | verify ...
    kind: str  # one of KINDS
    nodes: tuple[str, ...]
    summary: str
    changes: str = "nothing"  # what the step changes on the hosts
    commands: Mapping[str, str] = field(default_factory=dict)  # node -> the exact shell command
    sudo: Mapping[str, bool] = field(default_factory=dict)  # node -> through sudo -n
    timeout_s: float | None = None
    files: Mapping[str, tuple[FileRef, ...]] = field(default_factory=dict)  # put: node -> files
    params: Mapping[str, Any] = field(default_factory=dict)  # ready / record / check / leaks parameters
    on_fail: str = "abort"
    # What Ctrl-C during this step runs: "" is branch "stop" when the step has a way out (on_fail is
    # not "abort"), else nothing; a rolling switch names the branch that keeps what serves.
    on_interrupt: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "phase": self.phase, "kind": self.kind, "nodes": list(self.nodes),
                             "summary": self.summary, "changes": self.changes, "on_fail": self.on_fail}
        if self.commands:
            d["commands"] = dict(self.commands)
        if self.commands or self.sudo:
            d["sudo"] = {n: bool(self.sudo.get(n, False)) for n in dict.fromkeys([*self.commands, *self.sudo])}
        if self.timeout_s is not None:
            d["timeout_s"] = self.timeout_s
        if self.files:
            d["files"] = {n: [f.to_dict() for f in fs] for n, fs in self.files.items()}
        if self.params:
            d["params"] = dict(self.params)
        if self.on_interrupt:
            d["on_interrupt"] = self.on_interrupt
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        return cls(id=d["id"], phase=d["phase"], kind=d["kind"], nodes=tuple(d["nodes"]), summary=d["summary"],
                   changes=d.get("changes", "nothing"), commands=dict(d.get("commands", {})),
                   sudo=dict(d.get("sudo", {})), timeout_s=d.get("timeout_s"),
                   files={n: tuple(FileRef(f["path"], int(f["mode"], 8), f["sha256"]) for f in fs)
                          for n, fs in d.get("files", {}).items()},
                   params=dict(d.get("params", {})), on_fail=d.get("on_fail", "abort"),
                   on_interrupt=d.get("on_interrupt", ""))


@dataclass(frozen=True)
class Plan:
    op: str  # up | down | switch | switch --supervise
    profile: str | None
    steps: tuple[Step, ...]
    branches: Mapping[str, tuple[Step, ...]] = field(default_factory=dict)
    reads: tuple[str, ...] = ()  # what planning read from the hosts (it changed nothing)
    note: str = ""  # e.g. why the plan is empty
    # what clients see while it runs (a switch): "none: ..." for a rolling switch, else which
    # requests get what and for about how long (``sparkctl plan switch`` prints it)
    outage: str = ""

    @property
    def noop(self) -> bool:
        """Nothing to do but, at most, take and release the lock."""
        return all(s.kind == "lock" for s in self.steps)

    def all_steps(self) -> list[Step]:
        return [*self.steps, *(s for b in self.branches.values() for s in b)]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "profile": self.profile, "reads": list(self.reads), "note": self.note,
                "steps": [s.to_dict() for s in self.steps],
                "branches": {k: [s.to_dict() for s in v] for k, v in self.branches.items()},
                **({"outage": self.outage} if self.outage else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        return cls(op=d["op"], profile=d.get("profile"), steps=tuple(Step.from_dict(s) for s in d["steps"]),
                   branches={k: tuple(Step.from_dict(s) for s in v) for k, v in d.get("branches", {}).items()},
                   reads=tuple(d.get("reads", ())), note=d.get("note", ""), outage=d.get("outage", ""))


@dataclass(frozen=True)
class Call:
    """One command or file write a step may make on a node."""

    node: str
    kind: str  # run | put
    text: str  # the shell command, or the path a put writes
    sudo: bool
    sha256: str | None = None  # put: the content's hash; None: decided when the step runs (a record, verdicts)
    source: str = "commands"  # where the step lists it: commands, files, or the params key


def calls(step: Step) -> list[Call]:
    """Every command and write ``step`` may make, from the step alone: what the plan promises."""
    out = [Call(n, "run", c, bool(step.sudo.get(n, False))) for n, c in step.commands.items()]
    for n, fs in step.files.items():
        out.extend(Call(n, "put", f.path, bool(step.sudo.get(n, False)), f.sha256 or None, "files") for f in fs)
    if step.kind == "record":
        n = step.nodes[0]
        out.append(Call(n, "put", str(step.params["path"]), bool(step.sudo.get(n, False)), None, "record"))
        m = step.params.get("mirror")  # the copy on the gateway's node (planner.record_step)
        if m:
            out.append(Call(str(m["node"]), "put", str(m["path"]), bool(m.get("sudo")), None, "record"))
    if step.kind == "check" and step.params.get("verdicts"):
        v = step.params["verdicts"]  # the probes' sudo is not the write's: the target carries its own
        out.append(Call(str(v["node"]), "put", str(v["path"]), bool(v.get("sudo")), None, "verdicts"))
    for key in PARAM_COMMANDS:
        for n, c in (step.params.get(key) or {}).items():
            out.append(Call(n, "run", c, bool(step.sudo.get(n, False)), source=key))
    return out


def describe(plan: Plan) -> list[str]:
    """The plan as the lines ``sparkctl plan`` prints: every step, every command."""
    lines = [f"plan {plan.op} {plan.profile or ''}".rstrip()]
    if plan.reads:
        lines.append(f"  read (changed nothing): {'; '.join(plan.reads)}")
    if plan.noop:
        lines.append(f"  nothing to do: {plan.note}")
    elif plan.note:  # e.g. which replicas restart, or how a switch from a degraded record resumes
        lines.append(f"  note: {plan.note}")
    if plan.outage:
        lines.append(f"  outage: {plan.outage}")

    def body(steps: tuple[Step, ...], indent: str) -> None:
        for i, s in enumerate(steps, 1):
            fail = ("" if s.on_fail == "abort" else f"  [on failure: {s.on_fail}]") \
                + (f"  [on Ctrl-C: {s.on_interrupt}]" if s.on_interrupt else "")
            lines.append(f"{indent}{i:2d}. {s.phase:<10} {', '.join(s.nodes)}: {s.summary}{fail}")
            if s.changes != "nothing":
                lines.append(f"{indent}      changes: {s.changes}")
            stdin = s.params.get("stdin") or {}
            for c in calls(s):
                prompt = "#" if c.sudo else "$"  # as root (sudo -n), as the login user
                if c.kind == "put" and c.source == "record":
                    lines.append(f"{indent}      {c.node}{prompt} write {c.text} (644: the run record, its time "
                                 "and steps as they ran)")
                    continue
                if c.kind == "put" and c.source == "verdicts":
                    lines.append(f"{indent}      {c.node}{prompt} write {c.text} (644: the laws' verdicts, as judged)")
                    continue
                if c.kind == "put":
                    f = next(f for f in s.files[c.node] if f.path == c.text)
                    sha = f"sha256 {f.sha256[:12]}" if f.sha256 else "content read when it runs"
                    lines.append(f"{indent}      {c.node}: {f.path} ({f.mode:o}, {sha})")
                    continue
                first, *rest = c.text.splitlines() or [""]
                more = f"  (+{len(rest)} lines)" if rest else ""
                when = "" if c.source == "commands" else f"  [{c.source.replace('_', ' ')}]"
                feed = f"  <<< {stdin[c.node]}" if c.source == "commands" and c.node in stdin else ""
                lines.append(f"{indent}      {c.node}{prompt} {first}{more}{when}{feed}")
    body(plan.steps, "  ")
    for name, steps in plan.branches.items():
        lines.append(f"  branch {name}:")
        body(steps, "    ")
    return lines
