"""Engine facts: is the profile's engine on the node, and which image ID its image is.

What this module owns: :class:`EngineProbe` (what to look for: a container
image, or a native executable and, for ``python3 -m MOD``, its module), the
:class:`~sparkctl.facts.registry.Fact` ``engine`` and its pure parser. The
commands are the community's own: ``docker image inspect --format '{{.Id}}'``
(eugr/spark-vllm-docker build-and-copy.sh get_remote_image_id compares nodes
with it) and POSIX ``command -v``. It must not run anything.

Exit codes of the command: 0 prints the image ID (``sha256:<64 hex>``) or the
executable's path; 3 means "not on this node" (docker's "No such image", or
``command -v`` finding nothing); 127 means docker itself is missing.

The fact ``image`` (docker only): the image's content digest and the node's
image store (sparkctl.model.imageid: the image ID means different things on
Docker's classic and containerd stores; the content digest means the same).
Output ``content:sha256:<hex>`` (``content unreadable`` when docker could not
print it) then ``store classic|containerd|unknown``; exit 3 when the image is not
there, 127 without docker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.facts.registry import NOT_FOUND, ExitCode, Fact, ProbeParseError, ScriptContext, lines, one_line, q
from sparkctl.model.imageid import CONTENT_PREFIX, content_command, store_command

IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
ABSENT_RC = 3


@dataclass(frozen=True)
class EngineProbe:
    """What ``engine`` looks for: ``runtime`` docker (``ref`` an image reference) or
    native (``ref`` the executable; ``module`` for ``python3 -m MOD``)."""

    runtime: str
    ref: str
    module: str | None = None


def parse_engine(text: str) -> str:
    """The image ID (``sha256:...``) or the executable's absolute path."""
    line = one_line("engine", text, "docker image inspect / command -v")
    if IMAGE_ID.fullmatch(line) or line.startswith("/"):
        return line
    raise ProbeParseError("engine", f"neither an image ID nor a path: {line[:80]!r}", "docker image inspect")


def _command(ctx: ScriptContext, _item: str) -> str:
    e = ctx.engine
    assert e is not None
    if e.runtime == "docker":
        # docker prints "Error response from daemon: No such image: REF" and exits 1 for a
        # missing image (moby ErrImageDoesNotExist); any other failure (no daemon) keeps its text.
        return ("have docker || exit 127; "
                f"out=$(docker image inspect --format '{{{{.Id}}}}' {q(e.ref)} 2>&1); rc=$?; "
                f'case "$out" in *"No such image"*) exit {ABSENT_RC};; esac; '
                'printf \'%s\\n\' "$out"; exit $rc')
    check = f"command -v {q(e.ref)} || exit {ABSENT_RC}"
    if e.module:  # python3 -m MOD: the interpreter and the module
        check += (f"; {q(e.ref)} -c {q('import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)')}"
                  f" {q(e.module)} >/dev/null 2>&1 || exit {ABSENT_RC}")
    return check


ENGINE = Fact(
    "engine", "the engine image or binary", _command, parse_engine,
    exit_codes=(NOT_FOUND, ExitCode(ABSENT_RC, "absent", value="")),
    core=False, when=lambda c: c.engine is not None,
)


@dataclass(frozen=True)
class ImageContent:
    """The profile's image on a node: its content digest and the node's docker image store."""

    content: str | None  # content:sha256:<hex> (sparkctl.model.imageid); None: docker could not print it
    store: str  # classic | containerd | unknown


CONTENT = re.compile(re.escape(CONTENT_PREFIX) + r"[0-9a-f]{64}")
STORE = re.compile(r"store (classic|containerd|unknown)")
UNREADABLE = "content unreadable"


def parse_image(text: str) -> ImageContent:
    """``content:sha256:<hex>`` and ``store WORD`` -> ImageContent."""
    got = [ln.strip() for ln in lines(text)]
    if (len(got) != 2 or not (CONTENT.fullmatch(got[0]) or got[0] == UNREADABLE)
            or not (m := STORE.fullmatch(got[1]))):
        raise ProbeParseError("image", f"not a content digest and a store: {text.strip()[:120]!r}",
                              "docker image inspect / docker info")
    return ImageContent(None if got[0] == UNREADABLE else got[0], m.group(1))


def _image_command(ctx: ScriptContext, _item: str) -> str:
    e = ctx.engine
    assert e is not None
    return ("have docker || exit 127; "
            f"docker image inspect --format '{{{{.Id}}}}' {q(e.ref)} >/dev/null 2>&1 || exit {ABSENT_RC}; "
            f"c=$({content_command(e.ref)}) || c={q(UNREADABLE)}; echo \"$c\"; {store_command()}")


IMAGE = Fact(
    "image", "the engine image's content and the docker image store", _image_command, parse_image,
    exit_codes=(NOT_FOUND, ExitCode(ABSENT_RC, "absent", value=None)),
    core=False, when=lambda c: c.engine is not None and c.engine.runtime == "docker",
)
