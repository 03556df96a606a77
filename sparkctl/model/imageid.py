"""What "the same image" means on two nodes, whatever docker image store each one uses.

What this module owns: the one definition of an image's content digest (the
``image`` fact reads it, ``image sync`` verifies each copy by it) and the word
for a node's image store. Pure: command strings and their meaning, nothing runs.

Why not the image ID: Docker's classic store reports the digest of the image's
config as its ID (moby image/image.go), the containerd image store the digest of
the manifest or index the image's name points to (moby daemon/containerd/image.go
``GetImage``: ``image.ID(desc.Target.Digest)``). The same build on two nodes with
different stores never has the same ID, and neither store shows the other's
number: the containerd store's ``docker image inspect`` has no config digest
(moby api/types/image/image_inspect.go: ``Descriptor`` is the target's).

What both stores show alike is the config's content: ``RootFS.Layers`` are the
config's ``rootfs.diff_ids`` (the uncompressed layer digests; containerd store:
``dockerOciImageToDockerImagePartial`` copies them, the classic store keeps them
in the config it hashes), and ``Config`` is the config's run configuration. The
content digest is the SHA-256 of those, printed by one ``docker image inspect
--format`` on the node: equal on two nodes exactly when they hold the same layers
with the same environment, entrypoint, command, working directory, user and
platform. Two builds that differ in those differ here too; two builds that are
the same bits but were built at different times (only ``created`` and the history
differ) count as the same image, which is what the ranks care about.
"""

from __future__ import annotations

import shlex

# Fields of `docker image inspect` that come from the image config on both stores.
CONTENT_FORMAT = ("{{json .RootFS.Layers}} {{json .Config.Env}} {{json .Config.Entrypoint}} "
                  "{{json .Config.Cmd}} {{json .Config.WorkingDir}} {{json .Config.User}} "
                  "{{json .Os}} {{json .Architecture}}")
CONTENT_PREFIX = "content:sha256:"

# `docker info`: the containerd image store names its snapshotter in DriverStatus
# ("driver-type io.containerd.snapshotter.v1", docs.docker.com/engine/storage/containerd/).
CONTAINERD_DRIVER_TYPE = "io.containerd.snapshotter.v1"
STORE_CLASSIC = "classic"
STORE_CONTAINERD = "containerd"


def content_command(image: str) -> str:
    """POSIX sh that prints ``content:sha256:<hex>`` for ``image`` (exit 1 when docker cannot inspect it)."""
    return content_script(shlex.quote(image))


def content_script(image_word: str) -> str:
    """:func:`content_command` for a shell word already quoted (``"$ref"`` in the image sync gate)."""
    return (f"c=$(docker image inspect --format {shlex.quote(CONTENT_FORMAT)} {image_word}) || exit 1; "
            f"h=$(printf '%s' \"$c\" | sha256sum) || exit 1; echo \"{CONTENT_PREFIX}${{h%% *}}\"")


def store_command() -> str:
    """POSIX sh that prints ``store classic`` or ``store containerd`` (``store unknown``: docker info failed)."""
    return ("d=$(docker info --format '{{json .DriverStatus}}' 2>/dev/null) || { echo 'store unknown'; exit 0; }; "
            f'case "$d" in *{CONTAINERD_DRIVER_TYPE}*) echo \'store {STORE_CONTAINERD}\';; '
            f"*) echo 'store {STORE_CLASSIC}';; esac")


def short(content: str) -> str:
    """``content:sha256:abcdef...`` -> ``content:abcdef123456`` for tables."""
    return "content:" + content.removeprefix(CONTENT_PREFIX)[:12]
