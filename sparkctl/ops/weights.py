"""Model weights onto the nodes: one download from the internet, the rest over the fabric.

The download laws of the field report: one box downloads from the internet (an
ISP cap of 3 TB was hit when every box did), the others receive the files over
the DAC cables. This module owns that distribution:

* :func:`fetch` runs the one internet download, on one node.
* :func:`plan_sync` (pure) decides who sends to whom, over the fabric only.
* :func:`sync` executes that plan: manifest on the source, per-link HTTP
  servers, parallel ranged pulls, verification against the manifest.

The work on a node is done by :mod:`sparkctl.remote.weights_agent`, a standard-library
script pushed with :meth:`Transport.put` and run as detached jobs that this
module watches with short ``tail`` commands; a multi-hour download thus never
depends on one SSH channel staying up, and re-running resumes where it
stopped (per chunk, and skipping complete files).

What it must not do: print, prompt or exit (progress goes to the ``progress``
callback, results come back as frozen dataclasses), import paramiko, or move a
byte over a management address.

Why a chain through the ring and not the relay. On the 4-node ring the node
across from the source (C for source A) is not cabled to it. Two ways exist:
pull from A through a neighbour's kernel forwarding (A -> B -> C over the
static routes), or wait until a neighbour holds the files and pull from it
(A -> B, then B -> C). We take the chain: relayed bytes would share the A-B
cable with B's own pull (both finish at half speed, C no sooner than with the
chain), and every relayed byte costs the relay node's CPU in software
forwarding, the node that is also writing and hashing its own copy. The chain
keeps each transfer on one otherwise idle cable between two directly cabled
nodes and depends on no route being up. The kernel relay is used only when a
receiver has no receiving neighbour at all (a profile that uses A and C alone).

The chain is pipelined, not store-and-forward: C starts pulling from B as soon
as B's pull has started, and B's server hands C each chunk once B has
verified it against the manifest (``serve --relay``), holding a request for a
chunk B does not have yet. C thus trails B by about ``connections x chunk``
bytes instead of by the whole model, and the 4-node ring takes little longer
than the pair. A pipelined pull that fails (B restarted under it, or B
failed) goes once more after B is done, or from another verified neighbour.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sparkctl.errors import ConfigError, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import under
from sparkctl.ops.agentjobs import (  # the agent's jobs; the public names are re-exported
    AGENT_PATH,
    HASH_CACHE,
    JOB_DIR,
    POLL_TIMEOUT_S,
    START_TIMEOUT_S,
    Agent,
    Job,
    Pace,
    Progress,
    ProgressCallback,
    WeightsError,
    agent_path,
    agent_source,
    hash_cache_path,
    probe_paths,
    push_agent,
    push_agents,
    report_progress,
    wait_job,
)
from sparkctl.transport import Transport

__all__ = [
    "AGENT_PATH", "HASH_CACHE", "JOB_DIR", "POLL_TIMEOUT_S", "START_TIMEOUT_S", "FetchReport", "NodeSync", "Progress",
    "ProgressCallback", "SyncReport", "Transfer", "WeightsError", "agent_path", "agent_source", "describe_plan", "fetch",
    "hash_cache_path", "plan_sync", "probe_paths", "push_agent", "push_agents", "sync",
]

# A manifest start waits this long on the node for the job's end (agent --linger-s): from a
# warm hash cache the manifest is ready in milliseconds, and start + first poll + last poll
# become one command. A cold manifest reports its end at the polls that follow.
MANIFEST_LINGER_S = 2.0




@dataclass(frozen=True)
class Transfer:
    """One receiver pulling the whole manifest from one sender at one fabric address.

    ``via`` names the neighbour whose kernel forwards the bytes when the sender is
    not cabled to the receiver (only when no chain exists).
    """

    receiver: str
    sender: str
    sender_address: str
    via: str | None = None


@dataclass(frozen=True)
class FetchReport:
    node: str
    url: str
    dest: str
    bytes: int
    seconds: float
    rate_Bps: float
    sha256: str | None
    skipped: bool


@dataclass(frozen=True)
class NodeSync:
    """What one receiver got: bytes moved this run, time, rate, and whether it verified."""

    node: str
    sender: str | None
    address: str | None
    bytes: int
    seconds: float
    rate_Bps: float
    verified: bool
    files: int = 0
    skipped_files: int = 0
    error: str | None = None


@dataclass(frozen=True)
class SyncReport:
    source: str
    weights_path: str
    files: int
    total_bytes: int
    plan: tuple[tuple[Transfer, ...], ...]
    nodes: Mapping[str, NodeSync] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(n.verified for n in self.nodes.values())



# --------------------------------------------------------------------------- plan (pure)


def plan_sync(inv: Inventory, from_node: str, nodes: Iterable[str] | None = None) -> list[list[Transfer]]:
    """Stages of transfers that bring every node in ``nodes`` the source's files, fabric only.

    Stage 0: the source's cabled neighbours pull from it in parallel, each on its
    own cable. Stage k: nodes k+1 hops away pull from a node of stage k-1 that is
    cabled to them (ring order breaks ties, so the plan is stable). Addresses
    are always the sender's end of twin 0 of the cable between the two nodes.
    A receiver with no receiving node on any path pulls from the source through
    a neighbour's forwarding (``via``). Switch topologies pull from the source
    in one stage, on the shared subnet.
    """
    names = inv.names
    if from_node not in names:
        raise ConfigError(f"unknown source node {from_node!r}", Ref(node=from_node), hint=f"nodes: {', '.join(names)}")
    wanted = list(dict.fromkeys(nodes if nodes is not None else names))
    for n in wanted:
        if n not in names:
            raise ConfigError(f"unknown node {n!r}", Ref(node=n), hint=f"nodes: {', '.join(names)}")
    receivers = [n for n in wanted if n != from_node]
    if not receivers:
        return []
    if inv.topology == "switch":
        addr = _switch_address(inv, from_node)
        return [[Transfer(r, from_node, addr) for r in _ring_sorted(inv, receivers)]]

    # Breadth-first over cables, walking only through nodes that take part.
    members = set(receivers) | {from_node}
    depth: dict[str, int] = {from_node: 0}
    parent: dict[str, str] = {}
    frontier = [from_node]
    while frontier:
        nxt: list[str] = []
        for sender in frontier:
            for peer in inv.neighbours(sender):
                if peer in members and peer not in depth:
                    depth[peer] = depth[sender] + 1
                    parent[peer] = sender
                    nxt.append(peer)
        frontier = _ring_sorted(inv, nxt)
    stages: dict[int, list[Transfer]] = {}
    for r in _ring_sorted(inv, receivers):
        if r in parent:
            stages.setdefault(depth[r] - 1, []).append(Transfer(r, parent[r], _address(inv, parent[r], r)))
            continue
        relay = _first_hop(inv, from_node, r)
        stages.setdefault(0, []).append(Transfer(r, from_node, _address(inv, from_node, relay), via=relay))
    return [stages[k] for k in sorted(stages)]


def _ring_sorted(inv: Inventory, names: Iterable[str]) -> list[str]:
    order = {n: i for i, n in enumerate(inv.ring_order)}
    return sorted(names, key=lambda n: order.get(n, len(order)))


def _address(inv: Inventory, sender: str, receiver: str) -> str:
    link = inv.link_between(sender, receiver, twin=0)
    if link is None:
        raise ConfigError(f"no cable between {sender} and {receiver}", Ref(node=receiver))
    return link.end(sender).address


def _switch_address(inv: Inventory, node: str) -> str:
    eps = sorted(inv.endpoints(node), key=lambda e: (e.port, e.netdev))
    if not eps:
        raise ConfigError(f"node {node} has no fabric address", Ref(node=node))
    return eps[0].address


def _first_hop(inv: Inventory, src: str, dst: str) -> str:
    """The neighbour of ``src`` on a shortest cable path to ``dst`` (what the static routes use)."""
    prev: dict[str, str] = {src: src}
    frontier = [src]
    while frontier and dst not in prev:
        nxt = []
        for n in frontier:
            for peer in inv.neighbours(n):
                if peer not in prev:
                    prev[peer] = n
                    nxt.append(peer)
        frontier = nxt
    if dst not in prev:
        raise ConfigError(f"no fabric path from {src} to {dst}", Ref(node=dst))
    hop = dst
    while prev[hop] != src:
        hop = prev[hop]
    return hop


def describe_plan(plan: Sequence[Sequence[Transfer]]) -> list[str]:
    """One line per transfer, for a dry run."""
    lines = []
    for k, stage in enumerate(plan):
        for t in stage:
            via = f" via {t.via}" if t.via else ""
            lines.append(f"stage {k}: {t.receiver} <- {t.sender} @ {t.sender_address}{via}")
    return lines


# --------------------------------------------------------------------------- fetch


def fetch(
    inv: Inventory, transport: Transport, node: str, url: str, dest: str, *, connections: int = 8,
    chunk_mb: float = 32.0, sha256: str | None = None, progress: ProgressCallback | None = None,
    poll_s: float = 1.0, sudo: bool | None = None,
) -> FetchReport:
    """Download ``url`` to ``dest`` (under the node's prefix) on the ONE node that faces the internet.

    Resumable: running it again after an interruption fetches only the missing chunks.
    """
    inv.node(node)
    push_agent(inv, transport, node, sudo=sudo)
    agent = Agent(inv, transport, sudo)
    path = under(inv.node(node).prefix, dest)
    args = ["fetch", "--url", url, "--dest", path, "--connections", str(connections), "--chunk-mb", f"{chunk_mb:g}",
            "--hash-cache", hash_cache_path(inv, node)]
    if sha256:
        args += ["--sha256", sha256]
    job, _ = agent.start(node, "fetch", args)
    final = wait_job(agent, job, progress, poll_s)
    if final.get("event") != "done":
        raise WeightsError(f"download failed: {final.get('message')}", Ref(node=node),
                           hint="run it again to resume; completed chunks are kept" if final.get("resumable") else None)
    return FetchReport(node, url, path, int(final.get("bytes", 0)), float(final.get("seconds", 0.0)),
                       float(final.get("rate_Bps", 0.0)), final.get("sha256"), bool(final.get("skipped")))


# --------------------------------------------------------------------------- sync


def sync(
    inv: Inventory, transport: Transport, weights_path: str, from_node: str, *,
    nodes: Iterable[str] | None = None, progress: ProgressCallback | None = None, connections: int = 8,
    chunk_mb: float = 32.0, port: int = 0, serve_ttl_s: float = 600.0, poll_s: float = 1.0,
    sudo: bool | None = None, pipeline: bool = True,
) -> SyncReport:
    """Copy ``weights_path`` from ``from_node`` to the other nodes over the fabric, verified.

    Every receiver ends with the source's files, each chunk (``chunk_mb``)
    checked against the source's manifest as it arrives. With ``pipeline`` a
    later stage starts as soon as its sender's own pull has started: the sender
    relays each chunk once it has verified it. Without, it waits until the
    sender holds every file (store and forward). A receiver whose transfer
    fails is reported (``verified=False``, ``error``) and the others go on; a
    pipelined pull that fails is tried once more after its sender finished,
    and a node whose sender failed pulls from another verified neighbour when
    it has one.
    """
    plan = plan_sync(inv, from_node, nodes)
    transfers = [t for stage in plan for t in stage]
    agent = Agent(inv, transport, sudo)
    push_agents(inv, transport, [from_node, *(t.receiver for t in transfers)], sudo=sudo)

    src_path = under(inv.node(from_node).prefix, weights_path)
    job, _ = agent.start(from_node, "manifest", ["manifest", "--dir", src_path, "--chunk-mb", f"{chunk_mb:g}",
                                                 "--hash-cache", hash_cache_path(inv, from_node)],
                         linger_s=MANIFEST_LINGER_S)
    final = wait_job(agent, job, progress, poll_s)
    if final.get("event") != "done":
        raise WeightsError(f"no manifest of {src_path}: {final.get('message')}", Ref(node=from_node))
    manifest = final["manifest"]
    files = manifest["files"]
    total = sum(int(v["size"]) for v in files.values())
    manifest_json = json.dumps(manifest, separators=(",", ":"))
    single = manifest.get("kind") == "file"

    def dest_of(node: str) -> str:
        p = under(inv.node(node).prefix, weights_path)
        return (p.rsplit("/", 1)[0] or "/") if single else p

    servers: dict[tuple[str, str], tuple[int, int]] = {}  # (node, address) -> (pid, port)

    def server_for(sender: str, address: str) -> int:
        if (sender, address) not in servers:
            serve_dir = under(inv.node(sender).prefix, weights_path)
            sjob, ev = agent.start(sender, "serve", [
                "serve", "--dir", serve_dir, "--bind", address, "--port", str(port), "--ttl-s", f"{serve_ttl_s:g}",
                "--manifest-json", "-", "--relay",
            ], stdin=manifest_json)
            servers[(sender, address)] = (sjob.pid, int(ev["port"]))
        return servers[(sender, address)][1]

    verified: set[str] = {from_node}
    pipelined: set[str] = set()  # receivers whose pull started before their sender was verified
    retried: set[str] = set()
    failed: dict[str, str] = {}
    reports: dict[str, NodeSync] = {}
    pending = list(transfers)
    active: dict[str, tuple[Job, Transfer]] = {}
    pace = Pace(poll_s)
    try:
        while pending or active:
            for t in list(pending):
                if t.sender in verified:
                    chosen: Transfer | None = t
                elif pipeline and t.via is None and t.sender in active and t.receiver not in pipelined:
                    chosen = t
                    pipelined.add(t.receiver)
                elif t.sender in failed:
                    chosen = _alternative(inv, t, verified)
                    if chosen is None and not any(a.receiver == t.sender for _, a in active.values()):
                        pending.remove(t)
                        failed[t.receiver] = f"its sender {t.sender} failed: {failed[t.sender]}"
                        reports[t.receiver] = NodeSync(t.receiver, t.sender, t.sender_address, 0, 0.0, 0.0, False,
                                                       error=failed[t.receiver])
                        continue
                else:
                    chosen = None
                if chosen is None:
                    continue
                pending.remove(t)
                try:
                    p = server_for(chosen.sender, chosen.sender_address)
                    url = f"http://{chosen.sender_address}:{p}/"
                    pjob, _ = agent.start(chosen.receiver, "pull", [
                        "pull", "--from-url", url, "--manifest-json", "-", "--dest", dest_of(chosen.receiver),
                        "--connections", str(connections), "--chunk-mb", f"{chunk_mb:g}",
                        "--hash-cache", hash_cache_path(inv, chosen.receiver),
                    ], stdin=manifest_json)
                    active[chosen.receiver] = (pjob, chosen)
                except WeightsError as exc:
                    failed[chosen.receiver] = exc.one_line()
                    reports[chosen.receiver] = NodeSync(chosen.receiver, chosen.sender, chosen.sender_address, 0,
                                                        0.0, 0.0, False, error=exc.one_line())
            if not active:
                if pending and not any(t.sender in verified | set(failed) for t in pending):
                    raise WeightsError("the sync plan is stuck (a sender never takes part)", Ref(node=from_node))
                continue
            news = agent.poll([j for j, _ in active.values()], wait_s=pace.take())
            for node, (pjob, t) in list(active.items()):
                report_progress(progress, node, "pull", news.get(node, []))
                if pjob.final is None:
                    continue
                pace.reset()
                del active[node]
                fin = pjob.final
                elapsed = time.monotonic() - pjob.started_at
                if fin.get("event") == "done" and fin.get("verified"):
                    verified.add(node)
                    reports[node] = NodeSync(
                        node, t.sender, t.sender_address, int(fin.get("bytes", 0)), float(fin.get("seconds", elapsed)),
                        float(fin.get("rate_Bps", 0.0)), True, int(fin.get("files", 0)), int(fin.get("skipped", 0)),
                    )
                elif node in pipelined and node not in retried:
                    retried.add(node)
                    # it followed a sender that was still receiving; once that sender is
                    # verified (or has failed, then from another neighbour) it goes again
                    pending.append(t)
                else:
                    failed[node] = str(fin.get("message", "failed"))
                    reports[node] = NodeSync(node, t.sender, t.sender_address, 0, elapsed, 0.0, False,
                                             error=failed[node])
    finally:
        pids: dict[str, list[int]] = {}
        for (sender, _addr), (pid, _port) in servers.items():
            pids.setdefault(sender, []).append(pid)
        for pjob, _t in active.values():  # only on an exception: do not leave pulls running
            pids.setdefault(pjob.node, []).append(pjob.pid)
        agent.stop_all(pids)
    return SyncReport(from_node, weights_path, len(files), total, tuple(tuple(s) for s in plan),
                      {t.receiver: reports[t.receiver] for t in transfers if t.receiver in reports})


def _alternative(inv: Inventory, t: Transfer, verified: set[str]) -> Transfer | None:
    """Another verified node cabled to the receiver, when its planned sender failed."""
    for peer in inv.neighbours(t.receiver):
        if peer in verified:
            return Transfer(t.receiver, peer, _address(inv, peer, t.receiver))
    return None
