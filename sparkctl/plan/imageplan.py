"""The ``image sync`` plan: copy the profile's image from one node to the others over the fabric. Pure.

As the community copies its locally built images (eugr/spark-vllm-docker
build-and-copy.sh ``copy_to_host``: ``docker load`` fed by ssh, then
``get_remote_image_id`` compares ``docker image inspect --format '{{.Id}}'``),
but streamed: ``docker save IMAGE | ssh <fabric address> docker load`` runs on
the source node, so the bytes go node to node over the fabric, never through the
operator's machine or a management address, and no temporary file is written.
Each copy is then verified on its receiver by image ID.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from sparkctl.plan.steps import Plan, Step


def inspect_id_command(image: str) -> str:
    return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}"


def plan_image_sync(profile: str, image: str, source: str, image_id: str, targets: Sequence[str],
                    ssh: Mapping[str, Sequence[str]], sudo: bool, reads: Sequence[str] = ()) -> Plan:
    """``ssh``: target -> the ssh argv the source runs to reach it over the fabric."""
    if not targets:
        return Plan(f"image sync {profile}", profile, (), reads=tuple(reads),
                    note=f"every node already has {image} as {image_id[:19]}")
    q = shlex.quote
    steps = []
    for t in targets:
        remote = " ".join(q(a) for a in ssh[t]) + " " + q("docker load")
        steps.append(Step(
            id=f"copy-{t}", phase="copy", kind="run", nodes=(source,),
            summary=f"stream {image} from {source} to {t} over the fabric (docker save | ssh | docker load)",
            changes=f"loads {image} ({image_id[:19]}) into {t}'s docker",
            commands={source: f"docker save {q(image)} | {remote}"}, sudo={source: sudo}, timeout_s=3600.0))
    verify = f'test "$({inspect_id_command(image)})" = {q(image_id)}'
    steps.append(Step(id="verify", phase="verify", kind="run", nodes=tuple(targets),
                      summary=f"each receiver has {image} as {image_id[:19]} (docker image inspect)",
                      commands={t: verify for t in targets}, sudo={t: sudo for t in targets}, timeout_s=60.0))
    return Plan(f"image sync {profile}", profile, tuple(steps), reads=tuple(reads))
