"""The ``image sync`` plan: copy the profile's image from one node to the others over the fabric. Pure.

As the community copies its locally built images (eugr/spark-vllm-docker
build-and-copy.sh ``copy_to_host``: ``docker load`` fed by ssh, then
``get_remote_image_id`` compares ``docker image inspect --format '{{.Id}}'``),
but streamed: ``docker save IMAGE | ssh <fabric address> docker load`` runs on
the source node, so the bytes go node to node over the fabric, never through the
operator's machine or a management address, and no temporary file is written.
Each copy is verified on its receiver inside the same ssh session (the gate:
``docker load``, then the content digest; the source compares what it gets back),
so a copy costs one node-to-node connection and no further round trip. What is
compared is the image's content digest (sparkctl.model.imageid), not its ID: the
ID is the config digest on Docker's classic store and the manifest digest on the
containerd store, so a copy between nodes on different stores has another ID on
arrival.

The node-to-node key is image sync's own, and the plan grants it in its own
steps before the copies (:class:`KeyGrant`): the key and the verified
known_hosts on the source (unless the gather found them in place), the gate
(``sparkctl/remote/image_sync_gate.sh``) on the receivers, and the key's line in
their authorized_keys, with ``from=`` the source's fabric addresses, a forced
command (the gate: the receiver runs ``docker load`` and prints the content digest,
nothing else) and an ``expiry-time`` that every sync renews. :func:`revoke_steps`
takes every node's sparkctl node-to-node keys away (``image revoke``, and
``fabric restore``); a key's lines are the ones whose comment, their last field,
is :func:`key_comment`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from sparkctl.model.imageid import content_script, short
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    IMAGE_SYNC_GATE,
    IMAGE_SYNC_KEY,
    IMAGE_SYNC_KNOWN_HOSTS,
    NODE_AUTHORIZED_KEYS,
    SUPERVISOR_KEY,
    SUPERVISOR_KNOWN_HOSTS,
    under,
)
from sparkctl.plan.steps import FileRef, Plan, Step

# What the receiver's gate accepts, exactly (sparkctl/remote/image_sync_gate.sh).
LOAD_VERB = "sparkctl-image-load"
KEY_PURPOSES = ("supervisor", "image-sync")  # sparkctl.ops.nodessh.SUPERVISOR, IMAGE_SYNC
q = shlex.quote


def key_comment(cluster: str, purpose: str) -> str:
    """The comment of a node-to-node key, the last field of its authorized_keys lines."""
    return f"sparkctl-{purpose}@{cluster}"


GATE_CONTENT = "@CONTENT_DIGEST_OF_REF@"  # the gate's placeholder line (sparkctl/remote/image_sync_gate.sh)


def gate_script() -> bytes:
    """The gate as pushed: its last line prints ``$ref``'s content digest by the one definition
    (sparkctl.model.imageid), which the source compares with its own."""
    text = resources.files("sparkctl.remote").joinpath("image_sync_gate.sh").read_text()
    if GATE_CONTENT not in text:
        raise AssertionError(f"sparkctl/remote/image_sync_gate.sh lost its {GATE_CONTENT} line")
    return text.replace(GATE_CONTENT, content_script('"$ref"')).encode()


@dataclass(frozen=True)
class KeyGrant:
    """What the plan grants before the copies; the bytes go to the executor, never into the plan."""

    comment: str  # marks the key's lines (key_comment)
    lines: Mapping[str, str]  # receiver -> its authorized_keys line (forced command, expiry)
    expiry: str  # as in the lines: YYYYMMDDHHMMSSZ
    gate: Mapping[str, FileRef]  # receiver -> the gate
    auth_files: Mapping[str, str]  # receiver -> sparkctl's authorized_keys (under the node's prefix)
    target_sudo: Mapping[str, bool]
    source_files: tuple[FileRef, ...] = ()  # the key and known_hosts on the source; () when kept


def _rewrite_keys(f: str, comment: str, line: str | None, user_dir: bool = False) -> str:
    """sh: ``f`` without the lines of the key marked ``comment``, plus ``line``; written whole, then renamed."""
    keep = f"awk -v c={q(comment)} '$NF != c' \"$f\""
    if line is None:
        return (f"f={f}; [ -f \"$f\" ] || exit 0; t=$(mktemp \"$f.XXXXXX\") || exit 1; "
                f"{keep} > \"$t\" && chmod 600 \"$t\" && mv -f \"$t\" \"$f\" || {{ rm -f \"$t\"; exit 1; }}")
    mkdir = "mkdir -m 700 -p" if user_dir else "mkdir -p"
    return (f"f={f}; {mkdir} \"$(dirname \"$f\")\" || exit 1; t=$(mktemp \"$f.XXXXXX\") || exit 1; "
            f"{{ if [ -f \"$f\" ]; then {keep}; else true; fi && printf '%s\\n' {q(line)}; }} > \"$t\" "
            f"&& chmod 600 \"$t\" && mv -f \"$t\" \"$f\" || {{ rm -f \"$t\"; exit 1; }}")


# On a real host sshd reads the ssh user's ~/.ssh/authorized_keys; a simulated node
# (SPARKCTL_SIM_NODE in its session) reads sparkctl's file, and its ~ is the host's.
_NOT_SIM = "[ -n \"${SPARKCTL_SIM_NODE:-}\" ] && exit 0; "
_USER_KEYS = "\"$HOME/.ssh/authorized_keys\""


def grant_steps(source: str, targets: Sequence[str], grant: KeyGrant, source_sudo: bool) -> list[Step]:
    steps = []
    if grant.source_files:
        steps.append(Step(
            id="key-source", phase="grant", kind="put", nodes=(source,),
            summary=f"put image sync's node-to-node key and the receivers' verified fabric host keys on {source}",
            changes=f"{source}'s image sync key (0600) and its known_hosts",
            files={source: grant.source_files}, sudo={source: source_sudo}))
    steps.append(Step(
        id="key-gate", phase="grant", kind="put", nodes=tuple(targets),
        summary="put the gate, the key's forced command, on the receivers: it runs "
                f"`docker load` and prints the content digest for `{LOAD_VERB} IMAGE`, and refuses anything else",
        changes="the gate script", files={t: (grant.gate[t],) for t in targets},
        sudo={t: grant.target_sudo[t] for t in targets}))
    cmds = {t: _rewrite_keys(q(grant.auth_files[t]), grant.comment, grant.lines[t]) for t in targets}
    steps.append(Step(
        id="key-authorize", phase="grant", kind="run", nodes=tuple(targets),
        summary=f"authorize {source}'s image sync key on the receivers until {grant.expiry} "
                "(restrict, from= its fabric addresses, command= the gate, expiry-time=; replaces its older line)",
        changes="sparkctl's authorized_keys", commands=cmds, sudo={t: grant.target_sudo[t] for t in targets}))
    user = {t: _NOT_SIM + _rewrite_keys(_USER_KEYS, grant.comment, grant.lines[t], user_dir=True) for t in targets}
    steps.append(Step(
        id="key-authorize-user", phase="grant", kind="run", nodes=tuple(targets),
        summary="the same line in the ssh user's ~/.ssh/authorized_keys (the file sshd reads)",
        changes="~/.ssh/authorized_keys", commands=user, sudo={t: False for t in targets}))
    return steps


def revoke_steps(inv: Inventory, purposes: Sequence[str] = KEY_PURPOSES) -> tuple[Step, ...]:
    """Every node: the lines of sparkctl's node-to-node keys ``purposes`` gone, and the keys and the gate."""
    nodes = tuple(inv.names)
    comments = [key_comment(inv.name, p) for p in purposes]
    files = [IMAGE_SYNC_KEY, IMAGE_SYNC_KNOWN_HOSTS, IMAGE_SYNC_GATE] if "image-sync" in purposes else []
    if "supervisor" in purposes:
        files += [SUPERVISOR_KEY, SUPERVISOR_KNOWN_HOSTS]

    def mine(n: str) -> str:
        auth = q(under(inv.node(n).prefix, NODE_AUTHORIZED_KEYS))
        rm = " ".join(q(under(inv.node(n).prefix, f)) for f in files)
        return "; ".join([*(f"( {_rewrite_keys(auth, c, None)} ) || exit 1" for c in comments), f"rm -f {rm}"])

    def user(_n: str) -> str:
        return _NOT_SIM + "; ".join(f"( {_rewrite_keys(_USER_KEYS, c, None)} ) || exit 1" for c in comments)

    who = " and ".join(comments)
    return (
        Step("revoke-keys", "revoke", "run", nodes, f"remove the node-to-node keys {who} from sparkctl's "
             "authorized_keys, and the keys, known_hosts and gate sparkctl put on the nodes",
             changes="sparkctl's authorized_keys, node-to-node key files", commands={n: mine(n) for n in nodes},
             sudo={n: inv.node(n).sudo for n in nodes}),
        Step("revoke-keys-user", "revoke", "run", nodes, f"remove the lines of {who} from the ssh user's "
             "~/.ssh/authorized_keys", changes="~/.ssh/authorized_keys", commands={n: user(n) for n in nodes},
             sudo={n: False for n in nodes}),
    )


def plan_image_revoke(inv: Inventory) -> Plan:
    return Plan("image revoke", None, revoke_steps(inv, ("image-sync",)))


def plan_image_sync(profile: str, image: str, source: str, content: str, targets: Sequence[str],
                    ssh: Mapping[str, Sequence[str]], sudo: bool, reads: Sequence[str] = (),
                    grant: KeyGrant | None = None) -> Plan:
    """``ssh``: target -> the ssh argv the source runs to reach it over the fabric; ``content``: the
    source's content digest of ``image``; ``grant``: the key's."""
    if not targets:
        return Plan(f"image sync {profile}", profile, (), reads=tuple(reads),
                    note=f"every node already has {image} as {short(content)}")
    steps = grant_steps(source, targets, grant, sudo) if grant is not None else []
    # on the receiver, the gate: load (its "Loaded image" lines to stderr), then print the content digest it now has
    on_receiver = q(f"{LOAD_VERB} {image}")
    for t in targets:
        remote = " ".join(q(a) for a in ssh[t]) + " " + on_receiver
        got = f"{t} has ${{got:-nothing}} after the load, not {content}"
        steps.append(Step(
            id=f"copy-{t}", phase="copy", kind="run", nodes=(source,),
            summary=f"stream {image} from {source} to {t} over the fabric and check {t}'s content digest "
                    "(docker save | ssh | the gate: docker load && docker image inspect)",
            changes=f"loads {image} ({short(content)}) into {t}'s docker",
            commands={source: f"got=$(docker save {q(image)} | {remote}) || exit 1; "
                              f"[ \"$got\" = {q(content)} ] || {{ echo \"{got}\" >&2; exit 1; }}"},
            sudo={source: sudo}, timeout_s=3600.0))
    return Plan(f"image sync {profile}", profile, tuple(steps), reads=tuple(reads))
