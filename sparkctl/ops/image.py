"""``sparkctl image sync``: read each node's image content, plan the copy, authorize the source, run the plan.

The stages of every operation: gather (the ``engine`` and ``image`` facts on every node:
``docker image inspect``, the image's content digest, which means the same on Docker's
classic and containerd stores, sparkctl.model.imageid; and in the same round trip whether
the node-to-node key a previous run provisioned is still in place:
:func:`sparkctl.ops.nodessh.verify_command`), plan (:mod:`sparkctl.plan.imageplan`,
pure; ``--dry-run`` stops here), execute (the source's ssh key authorized on the
receivers by the plan's own steps, with image sync's own key from
:mod:`sparkctl.ops.nodessh` (the mechanism of the supervised switch): a forced
command, the gate, and an expiry ``key_hours`` from now that every copy renews;
the key and known_hosts on the source are put again unless the gather vouched
for them; then the plan through :func:`sparkctl.ops.executor.run_plan` under the
lock of every node). ``image revoke`` (:func:`revoke`) takes the key away from every node.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sparkctl.errors import ConfigError, LifecycleError, Ref
from sparkctl.facts.batch import frame, parse_batch, remote_command, split_batch
from sparkctl.facts.engine import ENGINE, IMAGE, EngineProbe, ImageContent
from sparkctl.facts.registry import ScriptContext
from sparkctl.model.imageid import short
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import IMAGE_SYNC_GATE, NODE_AUTHORIZED_KEYS
from sparkctl.model.profiles import Resolved
from sparkctl.ops import nodessh
from sparkctl.ops.executor import Progress, TransportBackend, raise_failure, run_plan, take_lock
from sparkctl.ops.lock import node_path, node_sudo
from sparkctl.plan import lockplan
from sparkctl.plan.imageplan import KeyGrant, gate_script, key_comment, plan_image_revoke, plan_image_sync
from sparkctl.plan.steps import FileRef, Plan
from sparkctl.transport import Transport


@dataclass(frozen=True)
class ImageSyncResult:
    profile: str
    image: str
    source: str
    content: str  # the content digest every node has now (sparkctl.model.imageid)
    copied: tuple[str, ...]
    steps: tuple[dict[str, Any], ...] = ()


KEY_HOURS = 4.0  # image sync's key on the receivers: long enough for a slow copy of a large image, renewed by each sync


def expiry_time(hours: float, now: datetime | None = None) -> str:
    """authorized_keys ``expiry-time`` ``hours`` from now, in UTC (the Z: sshd(8))."""
    when = (now or datetime.now(timezone.utc)) + timedelta(hours=hours)
    return when.astimezone(timezone.utc).strftime("%Y%m%d%H%M%SZ")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_ids(inv: Inventory, transport: Transport, image: str, nodes: tuple[str, ...]) -> dict[str, str]:
    """node -> content digest ("" when the node does not have it); a node that cannot tell is an error."""
    return read_nodes(inv, transport, image, nodes)[0]


def read_nodes(inv: Inventory, transport: Transport, image: str, nodes: tuple[str, ...]
               ) -> tuple[dict[str, str], dict[str, str]]:
    """(node -> content digest, node -> what it says of the node-to-node grant), one round trip per node."""
    probe = EngineProbe("docker", image)
    scripts = {n: remote_command(frame([
        ("engine", ENGINE.command(ScriptContext(inv.node(n), engine=probe), "")),
        ("image", IMAGE.command(ScriptContext(inv.node(n), engine=probe), "")),
        ("nodessh", nodessh.verify_command(inv, n, nodessh.IMAGE_SYNC))])) for n in nodes}
    out: dict[str, str] = {}
    grants: dict[str, str] = {}
    for n, r in transport.run_all(scripts).items():
        if r.error:
            raise LifecycleError(f"{n} did not answer: {r.error}", Ref(node=n))
        f = parse_batch(n, r.stdout)
        if f.engine_found is None:
            why = f.unreadable.get("engine") or f.not_available.get("engine") or "no answer"
            raise LifecycleError(f"cannot read the image ID of {image} on {n}: {why}", Ref(node=n))
        if f.engine_found and not isinstance(f.image, ImageContent):
            why = f.unreadable.get("image") or f.not_available.get("image") or "no answer"
            raise LifecycleError(f"cannot read the content digest of {image} on {n}: {why}", Ref(node=n))
        out[n] = (f.image.content or "") if isinstance(f.image, ImageContent) and f.engine_found else ""
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


def plan(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None = None,
         key_hours: float = KEY_HOURS) -> tuple[Plan, str, str, tuple[str, ...]]:
    """(plan, source, content digest, targets) after reading every node's image content; changes nothing."""
    the_plan, source, image_id, targets, _blobs, _kh = _plan(res, inv, transport, from_node, key_hours)
    return the_plan, source, image_id, targets


def _grant(inv: Inventory, transport: Transport, source: str, targets: tuple[str, ...], kept: bool,
           key_hours: float) -> tuple[KeyGrant, dict[str, bytes], bytes | None]:
    """The key grant the plan makes, the bytes of its files, and the known_hosts put on the source (None: kept)."""
    if key_hours <= 0:
        raise ConfigError(f"the node-to-node key's lifetime must be positive, not {key_hours} hours",
                          Ref(key="key_hours"))
    kind = nodessh.IMAGE_SYNC
    key, pub = nodessh.local_key(inv, kind)
    gate = gate_script()
    blobs = {_sha(gate): gate}
    expiry = expiry_time(key_hours)
    gates = {t: FileRef(node_path(inv, t, IMAGE_SYNC_GATE), 0o755, _sha(gate)) for t in targets}
    lines = {t: nodessh.grant_line(inv, source, pub, command=gates[t].path, expiry=expiry) for t in targets}
    files: tuple[FileRef, ...] = ()
    known: bytes | None = None
    if not kept:
        known = nodessh.known_hosts(inv, transport, source, targets)
        blobs.update({_sha(key): key, _sha(known): known})
        files = (FileRef(node_path(inv, source, kind.key), 0o600, _sha(key)),
                 FileRef(node_path(inv, source, kind.known_hosts), 0o644, _sha(known)))
    return KeyGrant(key_comment(inv.name, kind.purpose), lines, expiry, gates,
                    {t: node_path(inv, t, NODE_AUTHORIZED_KEYS) for t in targets},
                    {t: node_sudo(inv, t) for t in targets}, files), blobs, known


def _plan(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None, key_hours: float
          ) -> tuple[Plan, str, str, tuple[str, ...], dict[str, bytes], bytes | None]:
    """:func:`plan`, the bytes of the files it puts, and the known_hosts it puts on the source (None: kept)."""
    p = res.profile
    if p.runtime != "docker" or not p.engine.image:
        raise ConfigError(f"profile {res.name} runs a native engine: there is no image to sync",
                          Ref(key="runtime"))
    image = p.engine.image
    nodes = tuple(inv.names)
    ids, grants = read_nodes(inv, transport, image, nodes)
    source = choose_source(ids, nodes, from_node, image)
    targets = tuple(n for n in nodes if n != source and ids[n] != ids[source])
    kept = bool(targets) and nodessh.still_provisioned(inv, source, targets, grants, nodessh.IMAGE_SYNC)
    if "@sha256:" in image and targets:
        raise LifecycleError(f"{image} is digest-pinned: docker load does not restore repository digests, so a "
                             "copy would not answer to that reference", hint=f"docker pull {image} on "
                             + ", ".join(targets))
    ssh = {t: nodessh.ssh_argv(inv, source, t, nodessh.fabric_address_from(inv, source, t), nodessh.IMAGE_SYNC)
           for t in targets}
    reads = [f"content digest of {image} on every node: "
             + ", ".join(f"{n} {short(ids[n]) if ids[n] else 'missing'}" for n in nodes)]
    if targets:
        reads.append(f"{source}'s image sync key and known_hosts: " + (
            "in place as provisioned (kept)" if kept else "to be put before the copy"))
    grant, blobs, known = _grant(inv, transport, source, targets, kept, key_hours) if targets else (None, {}, None)
    return (plan_image_sync(res.name, image, source, ids[source], targets, ssh, node_sudo(inv, source), reads,
                            grant), source, ids[source], targets, blobs, known)


def sync(res: Resolved, inv: Inventory, transport: Transport, from_node: str | None = None, *,
         key_hours: float = KEY_HOURS, progress: Progress | None = None) -> ImageSyncResult:
    say = progress or (lambda *_: None)
    the_plan, source, image_id, targets, blobs, known = _plan(res, inv, transport, from_node, key_hours)
    image = res.profile.engine.image or ""
    if the_plan.noop:
        return ImageSyncResult(res.name, image, source, image_id, ())
    holder = take_lock(inv, transport, the_plan.op, say)
    backend = TransportBackend(inv, transport, say)
    backend.blobs.update(blobs)
    if known is not None:
        nodessh.forget(inv, source, nodessh.IMAGE_SYNC)  # until the files are written, nothing is vouched for
    state = run_plan(lockplan.with_lock(the_plan, inv, holder), backend, done=("lock",))
    if state.failed is not None:
        nodessh.forget(inv, source, nodessh.IMAGE_SYNC)  # whatever went wrong, the next run provisions afresh
        raise_failure(state, the_plan.op)
    if known is not None:
        nodessh.remember(inv, source, targets, known, nodessh.IMAGE_SYNC)
    return ImageSyncResult(res.name, image, source, image_id, targets, tuple(state.outcomes))


def revoke(inv: Inventory, transport: Transport, *, progress: Progress | None = None) -> tuple[str, ...]:
    """``image revoke``: image sync's key, its lines and its gate gone from every node; the nodes."""
    the_plan = plan_image_revoke(inv)
    say = progress or (lambda *_: None)
    holder = take_lock(inv, transport, the_plan.op, say)
    state = run_plan(lockplan.with_lock(the_plan, inv, holder), TransportBackend(inv, transport, say), done=("lock",))
    if state.failed is not None:
        raise_failure(state, the_plan.op)
    nodessh.forget_all(inv, nodessh.IMAGE_SYNC)
    return tuple(inv.names)
