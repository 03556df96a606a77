"""Node-to-node ssh over the fabric: one key, authorized on the peers for one source node.

What this module owns: the one mechanism by which a node reaches its peers by
ssh over the fabric (the supervised switch's runner on the head, ``image sync``'s
``docker save | ssh <fabric address> docker load`` from the source node):

* the key pair, generated once on the operator's side (``id_supervisor`` in the
  cluster's local state) and put on the source node (``SUPERVISOR_KEY``, 0600);
* its public half authorized on each peer (sparkctl's authorized_keys, and the
  login user's ``~/.ssh/authorized_keys`` on a real host) with ``restrict`` and
  ``from=`` the source's fabric addresses: no forwarding, no pty, and only from
  the fabric; the steps that write it are the plans' (the supervised switch's,
  :mod:`sparkctl.plan.supervised`; image sync's, :mod:`sparkctl.plan.imageplan`);
* the peers' host keys, from the operator's own verified connections (no trust
  on first use from the node), in the source's known_hosts
  (``SUPERVISOR_KNOWN_HOSTS``), and :func:`ssh_argv`, the exact ssh command line;
* what was provisioned, remembered on the operator's side (``node-ssh.json`` in
  the cluster's local state, 0600: the public authorized line, the SHA-256 of
  the key and known_hosts put on each source, the peers): :func:`verify_command`
  asks every node, inside a read the caller makes anyway, whether its files are
  still exactly that, and :func:`still_provisioned` judges the answers, so a
  repeated ``image sync`` verifies the grant instead of re-provisioning it
  (reading the peers' host keys costs one SSH handshake per peer). Anything
  missing, changed or unreadable means provisioning again, as on the first run;
  :func:`forget` drops the memory of a source (a copy that failed).

Two keys, one mechanism (:class:`NodeKey`): the supervisor's (``SUPERVISOR``),
whose runner runs any plan step on its peers, and ``image sync``'s
(``IMAGE_SYNC``), whose lines on the peers carry a forced command (the gate,
:mod:`sparkctl.remote`'s ``image_sync_gate.sh``: ``docker load`` and the content digest,
nothing else) and an ``expiry-time``, and are written by the image sync plan's own
steps (:mod:`sparkctl.plan.imageplan`); this module gives that plan the key, the
verified known_hosts and the lines. sshd uses the first line whose key matches
and whose options allow the login (OpenSSH auth2-pubkey.c), so the two must be
different keys: one unrestricted line would open every line of the same key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import LifecycleError, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    IMAGE_SYNC_KEY,
    IMAGE_SYNC_KNOWN_HOSTS,
    NODE_AUTHORIZED_KEYS,
    SUPERVISOR_KEY,
    SUPERVISOR_KNOWN_HOSTS,
)
from sparkctl.ops.localstate import cluster_dir, write_json
from sparkctl.ops.lock import node_path
from sparkctl.plan.imageplan import key_comment
from sparkctl.transport import Transport


@dataclass(frozen=True)
class NodeKey:
    """One node-to-node key: its files on the operator's side and on the source node."""

    purpose: str  # in the key's comment, sparkctl-PURPOSE@CLUSTER, which marks its lines on the peers
    local: str  # the private key's file name in the cluster's local state (the public one: + .pub)
    key: str  # on the source node
    known_hosts: str  # on the source node
    stamps: str  # what was provisioned, in the cluster's local state


SUPERVISOR = NodeKey("supervisor", "id_supervisor", SUPERVISOR_KEY, SUPERVISOR_KNOWN_HOSTS, "node-ssh.json")
IMAGE_SYNC = NodeKey("image-sync", "id_image_sync", IMAGE_SYNC_KEY, IMAGE_SYNC_KNOWN_HOSTS,
                     "node-ssh-image-sync.json")


def fabric_address_from(inv: Inventory, src: str, peer: str) -> str:
    """The address ``src`` reaches ``peer`` at over the fabric: a shared link, else the peer's own."""
    link = inv.link_between(src, peer)
    if link is not None:
        return link.end(peer).address
    addr = inv.primary_address(peer)
    if not addr:
        raise LifecycleError(f"{peer} has no fabric address {src} could reach", Ref(node=peer),
                             hint="node-to-node ssh (supervised switch, image sync) needs a cabled fabric "
                                  "between them: sparkctl fabric apply")
    return addr


def _known_hosts_name(addr: str, port: int) -> str:
    return addr if port == 22 else f"[{addr}]:{port}"


def local_key(inv: Inventory, kind: NodeKey = SUPERVISOR) -> tuple[bytes, str]:
    """(private key bytes, public key line) of the cluster's node-to-node key ``kind``, made once here."""
    local = cluster_dir(inv) / kind.local
    local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not local.exists() or not local.with_suffix(".pub").exists():
        local.unlink(missing_ok=True)
        local.with_suffix(".pub").unlink(missing_ok=True)
        r = subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", key_comment(inv.name, kind.purpose),
                            "-f", str(local)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise LifecycleError(f"ssh-keygen failed: {r.stderr.strip()}", hint="is OpenSSH's ssh-keygen installed?")
    os.chmod(local, 0o600)
    return local.read_bytes(), local.with_suffix(".pub").read_text().strip()


def grant_line(inv: Inventory, src: str, pub: str, *, command: str | None = None, expiry: str | None = None) -> str:
    """The authorized_keys line for ``src``'s key on its peers.

    ``command``: the forced command (sshd(8) ``command=``: whatever the client asks
    for is only in SSH_ORIGINAL_COMMAND); ``expiry``: ``expiry-time=`` as
    YYYYMMDDHHMMSSZ (sshd refuses the key after it; OpenSSH >= 7.7, the Z for UTC
    as sshd(8) of OpenSSH 9.x documents it).
    """
    src_addrs = sorted({e.address for e in inv.endpoints(src)})
    # restrict: no forwarding or pty; from=: only the source's fabric addresses may use the key.
    opts = "restrict" + (f',from="{",".join(src_addrs)}"' if src_addrs else "")
    if expiry is not None:
        opts += f',expiry-time="{expiry}"'
    if command is not None:
        if '"' in command or "\\" in command:
            raise LifecycleError(f"a forced command with a quote or backslash: {command}")
        opts += f',command="{command}"'
    return f"{opts} {pub}"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stamp_path(inv: Inventory, kind: NodeKey = SUPERVISOR) -> Path:
    return cluster_dir(inv) / kind.stamps


def _stamps(inv: Inventory, kind: NodeKey = SUPERVISOR) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(_stamp_path(inv, kind).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def forget(inv: Inventory, src: str, kind: NodeKey = SUPERVISOR) -> None:
    """Drop what is remembered of ``src``'s grant: the next run provisions it again."""
    stamps = _stamps(inv, kind)
    if stamps.pop(src, None) is not None:
        write_json(_stamp_path(inv, kind), stamps)


def forget_all(inv: Inventory, kind: NodeKey) -> None:
    """Drop what is remembered of every source's grant of ``kind`` (it was revoked)."""
    if _stamps(inv, kind):
        write_json(_stamp_path(inv, kind), {})


def remember(inv: Inventory, src: str, peers: Sequence[str], known_hosts: bytes, kind: NodeKey,
             line: str | None = None) -> None:
    """What was put on ``src`` (and, with ``line``, authorized on ``peers``): what the next run verifies."""
    stamps = _stamps(inv, kind)
    stamps[src] = {"line": line, "peers": sorted(peers), "known_hosts_sha256": _sha(known_hosts)}
    write_json(_stamp_path(inv, kind), stamps)


def verify_command(inv: Inventory, node: str, kind: NodeKey = SUPERVISOR) -> str:
    """A read-only sh body for ``node`` (no sudo): which remembered sources it authorizes, and its own grant.

    Prints ``auth SRC`` for each remembered source whose line is in the
    authorized_keys that this node's sshd reads (the ssh user's
    ``~/.ssh/authorized_keys`` on a real host; sparkctl's file on a simulated
    node, see :mod:`sparkctl.plan.supervised`); when the node is a remembered source, ``key
    SHA256 MODE`` (``keymode MODE SIZE`` when the key is root's and unreadable to
    the ssh user) and ``kh SHA256`` of its known_hosts (0644). A grant remembered
    without a line (image sync's: its plan authorizes the line every run) asks the
    peers nothing.
    """
    q = shlex.quote
    stamps = _stamps(inv, kind)
    auth = q(node_path(inv, node, NODE_AUTHORIZED_KEYS))
    sshd_reads = f'if [ -n "${{SPARKCTL_SIM_NODE:-}}" ]; then f={auth}; else f="$HOME/.ssh/authorized_keys"; fi'
    out = []
    for src, st in sorted(stamps.items()):
        line = st.get("line")
        if src == node or not isinstance(line, str) or node not in (st.get("peers") or ()):  # type: ignore[operator]
            continue
        out.append(f'grep -qxF {q(line)} "$f" 2>/dev/null && echo auth {q(src)}')
    if node in stamps:
        key, kh = q(node_path(inv, node, kind.key)), q(node_path(inv, node, kind.known_hosts))
        out.append(f'if k=$(sha256sum {key} 2>/dev/null); then echo key "${{k%% *}}" "$(stat -c %a {key})"; '
                   f'else stat -c "keymode %a %s" {key} 2>/dev/null; fi')
        out.append(f'k=$(sha256sum {kh} 2>/dev/null) && echo kh "${{k%% *}}"')
    return "; ".join([sshd_reads] + out + ["true"]) if out else "true"


def still_provisioned(inv: Inventory, src: str, peers: Sequence[str], answers: Mapping[str, str],
                      kind: NodeKey = SUPERVISOR) -> bool:
    """Whether ``src``'s grant to ``peers`` is exactly what was provisioned (``answers``: node -> its
    :func:`verify_command` output). Pure apart from reading the operator's own key and memory.

    A key the ssh user may not read is judged by its mode (600) and size: a wrong key
    there fails the copy's ssh (BatchMode, no password), and a failed copy forgets the grant.
    """
    st = _stamps(inv, kind).get(src)
    local = cluster_dir(inv) / kind.local
    if not st or not local.exists() or not local.with_suffix(".pub").exists():
        return False
    pub = local.with_suffix(".pub").read_text().strip()
    if not set(peers) <= set(st.get("peers") or ()):  # type: ignore[call-overload]
        return False
    if st.get("line") is not None and (st.get("line") != grant_line(inv, src, pub) or any(
            f"auth {src}" not in answers.get(p, "").splitlines() for p in peers)):
        return False
    mine = answers.get(src, "").splitlines()
    key = local.read_bytes()
    key_ok = f"key {_sha(key)} 600" in mine or f"keymode 600 {len(key)}" in mine
    return key_ok and f"kh {st.get('known_hosts_sha256')}" in mine


def known_hosts(inv: Inventory, transport: Transport, src: str, peers: Sequence[str]) -> bytes:
    """The known_hosts ``src`` needs for ``peers`` at their fabric addresses, from verified sessions.

    The key of the session sparkctl itself verified against known_hosts, never one read
    unverified: the source will trust whatever is written into its known_hosts. One SSH
    handshake per peer (a read: it changes nothing).
    """
    fetch = getattr(transport, "verified_host_key", None)
    if fetch is None:
        raise LifecycleError("node-to-node ssh needs the SSH transport (to read the peers' host keys)")
    known: list[str] = []
    for n in peers:
        try:
            ktype, _fp, blob = fetch(n)
        except Exception as exc:  # noqa: BLE001 - a transport error names the node
            raise LifecycleError(f"cannot read the host key of {n}: {exc}", Ref(node=n)) from None
        known.append(f"{_known_hosts_name(fabric_address_from(inv, src, n), inv.node(n).ssh_port)} {ktype} {blob}")
    return ("\n".join(known) + "\n").encode()


def ssh_argv(inv: Inventory, src: str, peer: str, addr: str, kind: NodeKey = SUPERVISOR) -> list[str]:
    """The ssh command line ``src`` runs to reach ``peer`` at ``addr`` (batch mode, the key, strict host keys)."""
    n = inv.node(peer)
    # no -n: a put or a docker load reads its bytes from stdin
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={node_path(inv, src, kind.known_hosts)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-i", node_path(inv, src, kind.key), "-p", str(n.ssh_port), f"{n.ssh_user}@{addr}"]
