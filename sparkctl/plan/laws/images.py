"""Laws about the engine's bits on the nodes: ``engine_present`` and ``image_identity``.

Pure checks over NodeFacts.engine_found (the ``engine`` fact, sparkctl.facts.engine:
the image ID from ``docker image inspect --format '{{.Id}}'``, or the path
``command -v`` finds) and NodeFacts.image (the ``image`` fact: the content digest,
which means the same on Docker's classic and containerd image stores, and the
store; sparkctl.model.imageid). :func:`engine_target` says what that fact looks for, from
the profile alone. Nothing here touches a host.
"""

from __future__ import annotations

import shlex
from collections import Counter

from sparkctl.model.imageid import CONTENT_PREFIX, short
from sparkctl.model.schema import Profile
from sparkctl.plan.laws.base import FAIL, OK, SKIP, Context, Verdict, facts_of
from sparkctl.plan.render import DEFAULT_BINARY

# The recipe that builds the vLLM image locally (profiles/vllm-tp2-fallback.yaml):
# build on one Spark, then copy with docker save | ssh docker load (build-and-copy.sh).
BUILD_RECIPE = "eugr/spark-vllm-docker build-and-copy.sh"


def engine_target(p: Profile) -> tuple[str, str, str | None]:
    """(runtime, what to look for, python module or None): the image, or the executable."""
    if p.runtime == "docker":
        assert p.engine.image is not None  # the schema requires it for docker
        return "docker", p.engine.image, None
    words = shlex.split(p.engine.binary or DEFAULT_BINARY[p.engine.name])
    module = words[2] if len(words) >= 3 and words[1] == "-m" else None
    return "native", words[0], module


def _missing_fix(ctx: Context, node: str) -> str:
    runtime, ref, module = engine_target(ctx.profile)
    if runtime == "docker":
        others = [n for n in ctx.nodes if n != node and getattr(facts_of(ctx, n), "engine_found", None)]
        copy = (f"copy it from {others[0]} over the fabric: sparkctl image sync {ctx.profile_name} --from {others[0]}"
                if others else "")
        return (f"image {ref} is not on {node}: " + (copy + "; or " if copy else "")
                + f"build it locally with the recipe named in the profile ({BUILD_RECIPE}) or docker pull {ref} "
                "if a registry serves it")
    if ctx.profile.engine.name == "llamacpp" and module is None:
        return (f"{ref} is not on {node}'s PATH: llama-server is not packaged by Debian or DGX OS: build llama.cpp "
                f"(ggml-org/llama.cpp, tag {ctx.profile.engine.version}, cmake -DGGML_CUDA=ON) and install "
                "build/bin/llama-server on the PATH, or set engine.binary to its absolute path")
    what = f"python module {module} (run by {ref})" if module else f"{ref} on the PATH"
    return f"{what} not found on {node}: install engine {ctx.profile.engine.name} {ctx.profile.engine.version} there"


def check_engine_present(ctx: Context) -> list[Verdict]:
    """The engine image (docker) or executable (native) the profile names is on every node."""
    runtime, ref, module = engine_target(ctx.profile)
    want = f"image {ref} present" if runtime == "docker" else f"{ref}{' -m ' + module if module else ''} on the PATH"
    out: list[Verdict] = []
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        if "engine" in f.unreadable:
            out.append(Verdict("engine_present", node, FAIL, "unreadable", want, f.unreadable["engine"]))
        elif "engine" in f.not_available:
            out.append(Verdict("engine_present", node, FAIL, "docker not installed", want,
                               f"{f.not_available['engine']}: install Docker (DGX OS ships it) on {node}"))
        elif f.engine_found is None:
            out.append(Verdict("engine_present", node, SKIP, "not read", want))
        elif f.engine_found == "":
            out.append(Verdict("engine_present", node, FAIL, "missing", want, _missing_fix(ctx, node)))
        else:
            out.append(Verdict("engine_present", node, OK, f.engine_found[:19], want))
    return out


def _identities(ctx: Context) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(node -> what identifies its build, node -> its docker image store, node -> why it has no content
    digest) for the nodes that have the image: the content digest where it was read (it means the same
    on both docker image stores, sparkctl.model.imageid), the image ID where it was not."""
    keys: dict[str, str] = {}
    stores: dict[str, str] = {}
    unread: dict[str, str] = {}
    for n in ctx.nodes:
        f = facts_of(ctx, n)
        if f is None or not getattr(f, "engine_found", None):
            continue
        img = getattr(f, "image", None)
        stores[n] = getattr(img, "store", None) or "unknown"
        content = getattr(img, "content", None)
        if content:
            keys[n] = content
            continue
        keys[n] = f.engine_found
        unread[n] = ("docker could not print it" if img is not None else
                     getattr(f, "unreadable", {}).get("image") or getattr(f, "not_available", {}).get("image")
                     or "not read")
    return keys, stores, unread


def check_image_identity(ctx: Context) -> list[Verdict]:
    """Every node that has the profile's image has the same build of it (docker only): the same
    content digest, whichever docker image store each node uses."""
    runtime, ref, _ = engine_target(ctx.profile)
    if runtime != "docker":
        return []
    ids, stores, unread = _identities(ctx)
    if not ids:
        return []
    known = {s for s in stores.values() if s != "unknown"}
    # An image ID is not comparable with a content digest, nor with an ID from the other store.
    if unread and len(ids) > 1 and (len(unread) < len(ids) or len(known) > 1):
        # Image IDs from different stores are different numbers for the same build: refuse to compare them.
        named = ", ".join(f"{n} ({stores[n]} store)" for n in ids)
        why = "; ".join(f"{n}: {w}" for n, w in unread.items())
        return [Verdict("image_identity", n, FAIL, f"{stores[n]} store", "one build on every node",
                        f"cannot compare the builds of {ref} on {named}: the image ID is the config digest on "
                        "Docker's classic store and the manifest digest on the containerd store, and the content "
                        f"digest was not read ({why}); put the nodes on one image store, or fix what the "
                        "content read reports", ref) for n in ids]
    counts = Counter(ids.values())
    head = ctx.nodes[0]
    # The reference build: the one most nodes have; on a tie, the first node's.
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0] == ids.get(head)))[0]
    source = next(n for n in ctx.nodes if ids.get(n) == best)
    pinned = "@sha256:" in ref
    mixed = len(known) > 1

    def show(n: str) -> str:
        v = ids[n]
        return (short(v) if v.startswith(CONTENT_PREFIX) else v[:19]) + (f" ({stores[n]} store)" if mixed else "")

    out = []
    for node, iid in ids.items():
        if iid == best:
            out.append(Verdict("image_identity", node, OK, show(node), f"{show(source)} on every node", subject=ref))
            continue
        fix = (f"{node} has a different build of {ref} than {source}: "
               + (f"docker pull {ref} on {node}" if pinned else
                  f"sparkctl image sync {ctx.profile_name} --from {source} (copies it over the fabric, verified by "
                  "its content digest); pin engine.image as name@sha256:<digest> so a moving tag cannot differ again"))
        out.append(Verdict("image_identity", node, FAIL, show(node), f"{show(source)} (as on {source})", fix, ref))
    return out
