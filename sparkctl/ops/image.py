"""``sparkctl image sync``: read each node's image content, plan the copy, authorize the source, run the plan.

The stages of every operation: gather (the ``engine`` and ``image`` facts on every node:
``docker image inspect``, the image's content digest, which means the same on Docker's
classic and containerd stores, sparkctl.model.imageid; and in the same round trip whether
the node-to-node key a previous run provisioned is still in place:
:func:`sparkctl.ops.nodessh.verify_command`), plan (:mod:`sparkctl.plan.imageplan`,
pure; ``--dry-run`` stops here), execute (the source's ssh key authorized on the
receivers by :mod:`sparkctl.ops.nodessh`, the same mechanism as the supervised
switch, unless the gather vouched for it; then the plan through
:func:`sparkctl.ops.executor.run_plan` under the cluster lock).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import ConfigError, LifecycleError, Ref
from sparkctl.facts import probes
from sparkctl.facts.batch import frame, split_batch
from sparkctl.facts.engine import ENGINE, IMAGE, EngineProbe, ImageContent
from sparkctl.facts.registry import ScriptContext
from sparkctl.model.imageid import short
from sparkctl.model.inventory import Inventory
from sparkctl.model.profiles import Resolved
from sparkctl.ops import nodessh
from sparkctl.ops.executor import Progress, TransportBackend, _raise_failure, run_plan
from sparkctl.ops.lock import ClusterLock, node_sudo
from sparkctl.plan.imageplan import plan_image_sync
from sparkctl.plan.steps import Plan
from sparkctl.transport import Transport


@dataclass(frozen=True)
class ImageSyncResult:
    profile: str
    image: str
    source: str
    content: str  # the content digest every node has now (sparkctl.model.imageid)
    copied: tuple[str, ...]
    steps: tuple[dict[str, Any], ...] = ()


def read_ids(inv: Inventory, transport: Transport, image: str, nodes: tuple[str, ...]) -> dict[str, str]:
    """node -> content digest ("" when the node does not have it); a node that cannot tell is an error."""
    return read_nodes(inv, transport, image, nodes)[0]


def read_nodes(inv: Inventory, transport: Transport, image: str, nodes: tuple[str, ...]
               ) -> tuple[dict[str, str], dict[str, str]]:
    """(node -> content digest, node -> what it says of the node-to-node grant), one round trip per node."""
    probe = EngineProbe("docker", image)
    scripts = {n: probes.remote_command(frame([
        ("engine", ENGINE.command(ScriptContext(inv.node(n), engine=probe), "")),
        ("image", IMAGE.command(ScriptContext(inv.node(n), engine=probe), "")),
        ("nodessh", nodessh.verify_command(inv, n))])) for n in nodes}
    out: dict[str, str] = {}
    grants: dict[str, str] = {}
    for n, r in transport.run_all(scripts).items():
        if r.error:
            raise LifecycleError(f"{n} did not answer: {r.error}", Ref(node=n))
        f = probes.parse_batch(n, r.stdout)
        if f.engine_found is None:
            why = f.unreadable.get("engine") or f.not_available.get("engine") or "no answer"
            raise LifecycleError(f"cannot read the image ID of {image} on {n}: {why}", Ref(node=n))
        if f.engine_found and not isinstance(f.image, ImageContent):
            why = f.unreadable.get("image") or f.not_available.get("image") or "no answer"
            raise LifecycleError(f"cannot read the content digest of {image} on {n}: {why}", Ref(node=n))
        out[n] = f.image.content if isinstance(f.image, ImageContent) and f.engine_found else ""
        sec = split_batch(r.stdout)[1].get("nodessh")
        grants[n] = sec.text if sec is not None else ""
    return out, grants


def choose_source(ids: dict[str, str], nodes: tuple[str, ...], from_node: str | None, image: str) -> str:
    if from_node is not None:
        if from_node not in nodes:
            raise ConfigError(f"--from {from_node}: not a node of this inventory", Ref(node=from_node))
        if not ids.get(from_node):
            raise LifecycleError(f"{from_node} does not have {image}", Ref(node=from_node),
                                 hint="build it there (the recipe named in the profile) or name another --from")
        return from_node
    have = {n: i for n, i in ids.items() if i}
    if not have:
        raise LifecycleError(f"no node has {image}", hint="build it on one node with the recipe named in the "
                             "profile (eugr/spark-vllm-docker build-and-copy.sh), or docker pull it")
    counts = Counter(have.values())
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0] == have.get(nodes[0])))[0]  # as image_identity
    return next(n for n in nodes if have.get(n) == best)


def plan(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None = None
         ) -> tuple[Plan, str, str, tuple[str, ...]]:
    """(plan, source, content digest, targets) after reading every node's image content; changes nothing."""
    the_plan, source, image_id, targets, _kept = _plan(res, inv, transport, from_node)
    return the_plan, source, image_id, targets


def _plan(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None
          ) -> tuple[Plan, str, str, tuple[str, ...], bool]:
    """:func:`plan`, and whether the source's node-to-node grant to the targets is still in place."""
    p = res.profile
    if p.runtime != "docker" or not p.engine.image:
        raise ConfigError(f"profile {res.name} runs a native engine: there is no image to sync",
                          Ref(key="runtime"))
    image = p.engine.image
    nodes = tuple(inv.names)
    ids, grants = read_nodes(inv, transport, image, nodes)
    source = choose_source(ids, nodes, from_node, image)
    targets = tuple(n for n in nodes if n != source and ids[n] != ids[source])
    kept = bool(targets) and nodessh.still_provisioned(inv, source, targets, grants)
    if "@sha256:" in image and targets:
        raise LifecycleError(f"{image} is digest-pinned: docker load does not restore repository digests, so a "
                             "copy would not answer to that reference", hint=f"docker pull {image} on "
                             + ", ".join(targets))
    ssh = {t: nodessh.ssh_argv(inv, source, t, nodessh.fabric_address_from(inv, source, t)) for t in targets}
    reads = [f"content digest of {image} on every node: "
             + ", ".join(f"{n} {short(ids[n]) if ids[n] else 'missing'}" for n in nodes)]
    if targets:
        reads.append(f"{source}'s node-to-node key on {', '.join(targets)}: " + (
            "in place as provisioned (kept)" if kept else "to be authorized before the copy"))
    return (plan_image_sync(res.name, image, source, ids[source], targets, ssh, node_sudo(inv, source), reads),
            source, ids[source], targets, kept)


def sync(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None = None, *,
         progress: Progress | None = None) -> ImageSyncResult:
    say = progress or (lambda *_: None)
    the_plan, source, image_id, targets, kept = _plan(res, inv, transport, from_node)
    image = res.profile.engine.image or ""
    if the_plan.noop:
        return ImageSyncResult(res.name, image, source, image_id, ())
    guard = ClusterLock(inv, transport, the_plan.op)
    guard.acquire()
    try:
        if kept:
            say("*", "ssh", f"{source}'s node-to-node key verified in place on {', '.join(targets)} (kept)")
        else:
            nodessh.provision(inv, transport, source, targets)
            say("*", "ssh", f"{source}'s node-to-node key authorized on {', '.join(targets)} (fabric addresses only)")
        state = run_plan(the_plan, TransportBackend(inv, transport, say))
        if state.get("failed") is not None:
            nodessh.forget(inv, source)  # whatever went wrong, the next run provisions afresh
            _raise_failure(state, the_plan.op)
        return ImageSyncResult(res.name, image, source, image_id, targets, tuple(state["outcomes"]))
    finally:
        guard.release()
