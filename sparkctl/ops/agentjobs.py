"""Detached weights-agent jobs on nodes: the agent's place, its push, starting, long-polling and stopping jobs.

sparkctl.ops.weights (fetch, sync) and sparkctl.ops.hubfetch run their work
as detached agent jobs (:mod:`sparkctl.remote.weights_agent`) watched with
``tail`` long polls; this module owns that machinery: where the agent and its
job logs live on a node, pushing the agent to every node at once through the
transport's fan-out (``put_all``, one error naming every refusing node), one
command to start a job (optionally also waiting for its end: ``--linger-s``),
one command per node to poll every job, one to stop them.

What it must not do: print, prompt or exit; decide what to transfer.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from sparkctl.errors import LifecycleError, Ref
from sparkctl.facts.registry import WeightsPaths
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import under
from sparkctl.transport import CommandResult, Transport

AGENT_PATH = "/opt/sparkctl/weights_agent.py"  # under each node's prefix
JOB_DIR = "/opt/sparkctl/weights"  # job logs and the hash cache, under each node's prefix
HASH_CACHE = JOB_DIR + "/hash-cache.json"  # path -> size, mtime, sha256, chunk hashes (the agent's HashCache)
START_TIMEOUT_S = 30.0  # a detached job must report within this (the agent waits 20 s itself)
POLL_TIMEOUT_S = 15.0


class WeightsError(LifecycleError):
    """A download or a sync could not be run at all (a failed node is a value in the report)."""



@dataclass(frozen=True)
class Progress:
    """One progress report of one node's job, for the ``progress`` callback."""

    node: str
    phase: str  # fetch | manifest | pull
    file: str | None
    bytes_done: int
    bytes_total: int | None
    rate_Bps: float


ProgressCallback = Callable[[Progress], None]


def agent_path(inv: Inventory, node: str) -> str:
    return under(inv.node(node).prefix, AGENT_PATH)


def hash_cache_path(inv: Inventory, node: str) -> str:
    return under(inv.node(node).prefix, HASH_CACHE)


def probe_paths(inv: Inventory, node: str, weights_path: str) -> WeightsPaths:
    """What the check's probe needs to ask ``node``'s agent about the weights at ``weights_path``."""
    return WeightsPaths(agent_path(inv, node), hash_cache_path(inv, node), under(inv.node(node).prefix, weights_path))


def _job_dir(inv: Inventory, node: str) -> str:
    return under(inv.node(node).prefix, JOB_DIR)


def agent_source() -> bytes:
    return resources.files("sparkctl.remote").joinpath("weights_agent.py").read_bytes()


def push_agent(inv: Inventory, transport: Transport, node: str, *, sudo: bool | None = None) -> None:
    push_agents(inv, transport, [node], sudo=sudo)


def push_agents(inv: Inventory, transport: Transport, nodes: Iterable[str], *, sudo: bool | None = None) -> None:
    """The agent onto every node at once (the transport's fan-out); a node that refuses it is named."""
    src = agent_source()
    targets = list(dict.fromkeys(nodes))
    transport.put_all(
        {n: [(agent_path(inv, n), src, 0o755)] for n in targets},
        sudo={n: inv.node(n).sudo if sudo is None else sudo for n in targets},
    ).raise_for("installing the weights agent", WeightsError,
                hint="the node needs python3 and a writable /opt/sparkctl (or sudo: true)")


def parse_events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


@dataclass
class Job:
    """A detached agent job on one node, watched through ``tail``."""

    node: str
    phase: str
    log: str
    pid: int
    offset: int = 0
    final: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.monotonic)
    last_log: str | None = None  # the last line the job wrote that was not an event (what it said dying)


class Agent:
    """Runs agent subcommands on nodes through the transport."""

    def __init__(self, inv: Inventory, transport: Transport, sudo: bool | None) -> None:
        self.inv, self.transport, self.sudo = inv, transport, sudo

    def _sudo(self, node: str) -> bool:
        return self.inv.node(node).sudo if self.sudo is None else self.sudo

    def argv(self, node: str, *args: str) -> list[str]:
        # -S: the agent needs the standard library only; no site-packages (nothing there can
        # shadow a stdlib module) and a faster start on every job and poll
        return ["python3", "-S", agent_path(self.inv, node), *args]

    def start(self, node: str, phase: str, args: Sequence[str], stdin: str | None = None,
              linger_s: float = 0.0) -> tuple[Job, dict[str, Any]]:
        """Start a detached job; with ``linger_s`` the same command also waits that long for its end
        (the events it prints are the first poll's: ``job.final`` is set when the job ended)."""
        log = f"{_job_dir(self.inv, node)}/{phase}-{uuid.uuid4().hex[:12]}.jsonl"
        linger = ("--linger-s", f"{linger_s:g}") if linger_s > 0 else ()
        cmd = self.argv(node, *args, "--log", log, *linger)
        res = self.transport.run(node, cmd, sudo=self._sudo(node), timeout_s=START_TIMEOUT_S + linger_s, stdin=stdin)
        evs = parse_events(res.stdout)
        first = evs[0] if evs else {}  # the event the start waited for (with the pid), or the error
        if not res.ok or first.get("event") == "error" or not first.get("pid"):
            why = first.get("message") or res.describe()
            raise WeightsError(f"{phase} did not start: {why}", Ref(node=node, command=shlex.join(cmd)))
        job = Job(node, phase, log, int(first["pid"]))
        if linger:
            absorb(job, evs[1:])
        return job, first

    def poll(self, jobs: Sequence[Job], wait_s: float = 0.0) -> dict[str, list[dict[str, Any]]]:
        """New events of each job (one tail per node, all nodes at once).

        ``wait_s``: each node's tail waits up to this long for a new event or
        its job's end (a long poll), so an ending job is seen when it ends.
        """
        wait = ("--wait-s", f"{wait_s:.3f}") if wait_s > 0 else ()
        cmds = {
            j.node: self.argv(j.node, "tail", "--log", j.log, "--offset", str(j.offset), "--pid", str(j.pid), *wait)
            for j in jobs
        }
        results = self.transport.run_all(cmds, sudo=False, timeout_s=POLL_TIMEOUT_S + wait_s)
        out: dict[str, list[dict[str, Any]]] = {}
        unanswered = False
        for j in jobs:
            res: CommandResult = results[j.node]
            evs = absorb(j, parse_events(res.stdout) if res.ok else [])
            unanswered = unanswered or evs is None  # an unanswered poll is retried next round
            out[j.node] = evs or []
        if unanswered:
            time.sleep(wait_s)  # the node did not wait for us: do not retry at once
        return out

    def stop(self, node: str, pid: int) -> None:
        self.stop_all({node: [pid]})

    def stop_all(self, pids: Mapping[str, Sequence[int]]) -> None:
        """End these jobs, all nodes at once (one command per node; each waits until its jobs exited)."""
        by_sudo: dict[bool, dict[str, list[str]]] = {}
        for node, ps in pids.items():
            if ps:
                args = [a for pid in ps for a in ("--pid", str(pid))]
                by_sudo.setdefault(self._sudo(node), {})[node] = self.argv(node, "stop", *args)
        for sudo, cmds in by_sudo.items():
            self.transport.run_all(cmds, sudo=sudo, timeout_s=POLL_TIMEOUT_S)


def absorb(job: Job, evs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """A poll's events for ``job`` (its offset and end taken from them); None when no ``tail`` closed them."""
    tail = evs.pop() if evs and evs[-1].get("event") == "tail" else None
    if tail is None:
        return None
    job.offset = int(tail["offset"])
    for ev in evs:
        if ev.get("event") in ("done", "error"):
            job.final = ev
        elif ev.get("event") == "log" and str(ev.get("text") or "").strip():
            job.last_log = str(ev["text"]).strip()[:300]
    if job.final is None and tail.get("alive") is False:
        said = f"; its last words: {job.last_log}" if job.last_log else ""
        job.final = {"event": "error", "message": f"the {job.phase} job (pid {job.pid}) ended without a result{said}"}
    return evs


def report_progress(progress: ProgressCallback | None, node: str, phase: str, evs: Iterable[dict[str, Any]]) -> None:
    if progress is None:
        return
    for ev in evs:
        if ev.get("event") != "progress":
            continue
        progress(Progress(node, phase, ev.get("file"), int(ev.get("bytes_done") or 0),
                          ev.get("bytes_total"), float(ev.get("rate_Bps") or 0.0)))


class Pace:
    """Poll waits: 50 ms at first, doubling up to ``poll_s``; back to 50 ms after a change.

    Each wait is spent on the node (``tail --wait-s``, a long poll), which
    answers as soon as a job writes an event or ends: a job's end is seen when
    it happens, and a quiet long job costs one poll per ``poll_s``.
    """

    FIRST_S = 0.05

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self.delay = min(self.FIRST_S, poll_s)

    def take(self) -> float:
        """The next wait (then the one after it doubles)."""
        d = self.delay
        self.delay = min(self.delay * 2, self.poll_s)
        return d

    def reset(self) -> None:
        self.delay = min(self.FIRST_S, self.poll_s)


def wait_job(agent: Agent, job: Job, progress: ProgressCallback | None, poll_s: float) -> dict[str, Any]:
    pace = Pace(poll_s)
    while job.final is None:
        report_progress(progress, job.node, job.phase, agent.poll([job], wait_s=pace.take()).get(job.node, []))
    return job.final
