"""The ``image sync`` plan: copy the profile's image from one node to the others over the fabric. Pure.

As the community copies its locally built images (eugr/spark-vllm-docker
build-and-copy.sh ``copy_to_host``: ``docker load`` fed by ssh, then
``get_remote_image_id`` compares ``docker image inspect --format '{{.Id}}'``),
but streamed: ``docker save IMAGE | ssh <fabric address> docker load`` runs on
the source node, so the bytes go node to node over the fabric, never through the
operator's machine or a management address, and no temporary file is written.
Each copy is verified on its receiver inside the same ssh session (``docker load
&& docker image inspect``; the source compares what it gets back), so a copy
costs one node-to-node connection and no further round trip. What is compared is
the image's content digest (sparkctl.model.imageid), not its ID: the ID is the
config digest on Docker's classic store and the manifest digest on the containerd
store, so a copy between nodes on different stores has another ID on arrival.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from sparkctl.model.imageid import content_command, short
from sparkctl.plan.steps import Plan, Step


def inspect_id_command(image: str) -> str:
    return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}"


def receiver_command(image: str) -> str:
    """What the receiver runs: load the stream (its "Loaded image" lines to stderr), then print the
    content digest it now has (sparkctl.model.imageid)."""
    return "docker load >&2 && " + content_command(image)


def plan_image_sync(profile: str, image: str, source: str, content: str, targets: Sequence[str],
                    ssh: Mapping[str, Sequence[str]], sudo: bool, reads: Sequence[str] = ()) -> Plan:
    """``ssh``: target -> the ssh argv the source runs to reach it over the fabric; ``content``: the
    source's content digest of ``image``."""
    if not targets:
        return Plan(f"image sync {profile}", profile, (), reads=tuple(reads),
                    note=f"every node already has {image} as {short(content)}")
    q = shlex.quote
    steps = []
    on_receiver = q(receiver_command(image))
    image_id = content
    for t in targets:
        remote = " ".join(q(a) for a in ssh[t]) + " " + on_receiver
        got = f"{t} has ${{got:-nothing}} after the load, not {image_id}"
        steps.append(Step(
            id=f"copy-{t}", phase="copy", kind="run", nodes=(source,),
            summary=f"stream {image} from {source} to {t} over the fabric and check {t}'s content digest "
                    "(docker save | ssh | docker load && docker image inspect)",
            changes=f"loads {image} ({short(content)}) into {t}'s docker",
            commands={source: f"got=$(docker save {q(image)} | {remote}) || exit 1; "
                              f"[ \"$got\" = {q(image_id)} ] || {{ echo \"{got}\" >&2; exit 1; }}"},
            sudo={source: sudo}, timeout_s=3600.0))
    return Plan(f"image sync {profile}", profile, tuple(steps), reads=tuple(reads))
