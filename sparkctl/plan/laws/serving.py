"""Laws about what is served: the served model name, and the weights (disk, same files everywhere).

Pure checks. Nothing here touches a host.
"""

from __future__ import annotations

from typing import Any

from sparkctl.plan.laws.base import FAIL, OK, SKIP, WARN, Context, Verdict, facts_of


def check_served_model(ctx: Context) -> list[Verdict]:
    want = ctx.profile.model.served_name
    out = []
    for head, models in ctx.endpoint_models.items():
        if models is None:
            out.append(Verdict("served_model", head, SKIP, "no endpoint running", want))
        elif want in models:
            out.append(Verdict("served_model", head, OK, ", ".join(models), want))
        else:
            out.append(Verdict("served_model", head, FAIL, ", ".join(models) or "no models", want,
                               f"port {ctx.profile.serve.port} on {head} serves another model: stop it "
                               f"(`sparkctl down`) or switch to its profile; a port answering is not health"))
    return out


def check_weights(ctx: Context) -> list[Verdict]:
    """Free disk on every node, and the same files on every node (as sparkctl's hash caches say).

    The files part reads what each node's hash cache vouches for (the probe
    hashes nothing): nodes whose digests differ hold different files, so
    their ranks would load different weights: FAIL, naming the odd nodes
    against the largest group. A file changed since the node hashed it, or a
    transfer left partial, is a WARN (``weights sync`` re-verifies and
    resumes). Nothing at the path is a WARN (the engine would not start),
    and a node sparkctl never fetched or synced on is skipped: its weights
    may be managed some other way.
    """
    out = []
    path = ctx.profile.model.weights_path
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        free = getattr(f, "disk_free_gib", None)
        if free is None:
            out.append(Verdict("weights", node, WARN, "free disk unknown", ">= 10 GiB free",
                               f"cannot read free disk space for {path} on {node}"))
        elif free < 10:
            out.append(Verdict("weights", node, FAIL, f"{free:.1f} GiB free", ">= 10 GiB free",
                               f"free disk space on {node}"))
        else:
            out.append(Verdict("weights", node, OK, f"{free:.0f} GiB free", ">= 10 GiB free"))
    return out + _same_weights(ctx, path)


def _same_weights(ctx: Context, path: str) -> list[Verdict]:
    out: list[Verdict] = []
    want = "the same files on every node"
    sync = f"sparkctl weights sync {ctx.profile_name}"
    verified: dict[str, Any] = {}  # node -> its WeightsSummary, every file vouched for
    for node in ctx.nodes:
        f = facts_of(ctx, node)
        if f is None:
            continue
        why = getattr(f, "unreadable", {}).get("weights")
        w = getattr(f, "weights", None)
        if why:
            out.append(Verdict("weights", node, WARN, "unreadable", want, why, subject="files"))
        elif w is None or w.kind == "no-agent":
            out.append(Verdict("weights", node, SKIP, "not fetched or synced by sparkctl here", want,
                               subject="files"))
        elif w.kind == "missing":
            out.append(Verdict("weights", node, WARN, f"nothing at {path}", want,
                               f"`sparkctl weights fetch {ctx.profile_name} --node NODE` on one node, "
                               f"then `{sync}`", subject="files"))
        elif getattr(w, "n_hub_differ", 0):
            out.append(Verdict("weights", node, FAIL, f"{w.n_hub_differ} files differ from the Hub manifest "
                               f"(commit {str(w.hub_commit)[:12]})", want,
                               f"`sparkctl weights fetch {ctx.profile_name}` fetches them again", subject="files"))
        elif w.partial or w.n_unverified or w.digest is None:
            seen = []
            if w.n_unverified:
                named = ", ".join(w.unverified[:3]) + (" ..." if w.n_unverified > 3 else "")
                seen.append(f"{w.n_unverified} of {w.files} files changed since verified ({named})")
            if w.partial:
                seen.append(f"{w.partial} partial files of an interrupted transfer")
            out.append(Verdict("weights", node, WARN, "; ".join(seen) or "not verified", want,
                               f"`{sync}` verifies every file, repairs what differs and resumes what is partial",
                               subject="files"))
        else:
            verified[node] = w
    groups: dict[str, list[str]] = {}
    for node, w in verified.items():
        groups.setdefault(w.digest, []).append(node)
    # the largest group is the reference; on a tie, the one with the first node in profile order
    order = {n: i for i, n in enumerate(ctx.nodes)}
    ref_digest, ref_nodes = min(groups.items(), key=lambda kv: (-len(kv[1]), order[kv[1][0]])) \
        if groups else ("", [])
    for node, w in verified.items():
        size = f"{w.files} files, {w.bytes / 2**30:.2f} GiB, digest {w.digest[:12]}"
        if getattr(w, "hub_commit", None):  # the manifest is one of the files: same digest, same commit
            size += f", {w.hub_repo}@{w.hub_commit[:12]}"
        if w.digest == ref_digest:
            others = len(ref_nodes) - 1
            out.append(Verdict("weights", node, OK, size + (f", as on {others} other nodes" if others else ""),
                               want, subject="files"))
        else:
            out.append(Verdict("weights", node, FAIL, size, f"digest {ref_digest[:12]} as on {', '.join(ref_nodes)}",
                               f"the ranks would load different weights: `{sync} --from {ref_nodes[0]}` "
                               f"(only the chunks that differ travel)", subject="files"))
    return out

